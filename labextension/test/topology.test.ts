import { describeLevel, describeOccupancy, TopologyGroup, TopologyItem, topologyTree } from '../src/topology';
import { Topology, TreeNode } from '../src/types';

const leaf = (i: number): TreeNode => ({ level: 'GPU', gpus: [i], children: [] });

/** Two NVLink pairs under one PCIe switch each, joined across NUMA nodes (a DGX-like box). */
const topology: Topology = {
  node: 'gpu-node-a',
  links: [],
  tree: {
    level: 'ROOT',
    gpus: [0, 1, 2, 3],
    children: [
      {
        level: 'SYS',
        gpus: [0, 1, 2, 3],
        children: [
          { level: 'NV12', gpus: [2, 3], children: [leaf(3), leaf(2)] },
          { level: 'NV12', gpus: [0, 1], children: [leaf(0), leaf(1)] }
        ]
      }
    ]
  },
  gpus: [
    { index: 0, uuid: 'GPU-0', model: 'A100', memoryMib: 40960, numa: 0, allocatedMemoryMib: 0, mine: false, allocatedCores: 0, tenants: 0, healthy: true },
    { index: 1, uuid: 'GPU-1', model: 'A100', memoryMib: 40960, numa: 0, allocatedMemoryMib: 0, mine: true, myCores: 25, allocatedCores: 75, tenants: 2, healthy: true },
    { index: 2, uuid: 'GPU-2', model: 'A100', memoryMib: 40960, numa: 0, allocatedMemoryMib: 0, mine: false, allocatedCores: 100, tenants: 1, healthy: true },
    { index: 3, uuid: 'GPU-3', model: 'A100', memoryMib: 40960, numa: 0, allocatedMemoryMib: 0, mine: false, allocatedCores: 0, tenants: 0, healthy: false }
  ]
};

describe('topologyTree', () => {
  const tree = topologyTree(topology);
  const cards = (node: TopologyItem): number[] =>
    node.kind === 'card' ? [node.gpu.index] : node.children.flatMap(cards);

  it('keeps the cards in index order, each group sorted by its first card', () => {
    expect(cards(tree)).toEqual([0, 1, 2, 3]);
    expect(tree.children.map(c => (c.kind === 'group' ? c.gpus : []))).toEqual([
      [0, 1],
      [2, 3]
    ]);
  });

  it('merges the root with a level that holds the same cards', () => {
    expect(tree.label).toBe('gpu-node-a · SYS');
    expect(tree.level).toBe('SYS');
    expect(tree.children.map(c => (c.kind === 'group' ? c.label : ''))).toEqual(['NV12', 'NV12']);
  });

  it("marks the path to the user's card", () => {
    const [first, second] = tree.children as TopologyGroup[];
    expect([tree.mine, first.mine, second.mine]).toEqual([true, true, false]);
    expect(first.children.map(c => (c.kind === 'card' ? [c.gpu.index, c.mine] : null))).toEqual([
      [0, false],
      [1, true]
    ]);
  });

  it('draws a flat tree when the server sent none', () => {
    const flat = topologyTree({ ...topology, tree: null });
    expect(flat.label).toBe('gpu-node-a');
    expect(flat.children.map(c => c.kind)).toEqual(['card', 'card', 'card', 'card']);
  });
});

describe('occupancy words', () => {
  it('names the user and counts everyone else', () => {
    expect(describeOccupancy(topology.gpus[1])).toBe('yours + 2 others · 75 % allocated');
    expect(describeOccupancy({ index: 1, mine: true, allocatedCores: 25, tenants: 0 })).toBe('yours · 25 % allocated');
    expect(describeOccupancy(topology.gpus[2])).toBe('1 tenant · 100 % allocated');
    expect(describeOccupancy(topology.gpus[0])).toBe('free');
    expect(describeOccupancy(topology.gpus[3])).toBe('unhealthy');
  });

  it('explains link levels', () => {
    expect(describeLevel('NV12')).toBe('NVLink (12 links)');
    expect(describeLevel('NV1')).toBe('NVLink (1 link)');
    expect(describeLevel('SYS')).toBe('across NUMA nodes');
  });
});
