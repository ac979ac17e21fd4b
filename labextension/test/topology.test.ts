import { describeLevel, describeOccupancy, layoutTopology } from '../src/topology';
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

describe('layoutTopology', () => {
  const layout = layoutTopology(topology);

  it('puts the cards in index order on the bottom row', () => {
    const leaves = layout.nodes.filter(n => n.gpu);
    expect(leaves.map(n => [n.label, n.x, n.y])).toEqual([
      ['GPU 0', 0.5, 2],
      ['GPU 1', 1.5, 2],
      ['GPU 2', 2.5, 2],
      ['GPU 3', 3.5, 2]
    ]);
    expect(layout.width).toBe(4);
    expect(layout.depth).toBe(3);
  });

  it('merges the root with a level that holds the same cards', () => {
    const root = layout.nodes.find(n => n.y === 0)!;
    expect(root.label).toBe('gpu-node-a · SYS');
    expect(root.x).toBe(2);
    expect(layout.nodes.filter(n => !n.gpu).map(n => n.label).sort()).toEqual(['NV12', 'NV12', 'gpu-node-a · SYS']);
  });

  it("marks the path to the user's card", () => {
    const mine = layout.nodes.filter(n => n.mine).map(n => n.label);
    expect(mine).toEqual(['GPU 1', 'NV12', 'gpu-node-a · SYS']);
    const mineEdges = layout.edges.filter(e => e.mine);
    expect(mineEdges).toHaveLength(2);
    expect(mineEdges.map(e => e.to)).toContain('gpu-1');
  });

  it('draws a flat tree when the server sent none', () => {
    const flat = layoutTopology({ ...topology, tree: null });
    expect(flat.depth).toBe(2);
    expect(flat.edges).toHaveLength(4);
    expect(flat.nodes.find(n => n.y === 0)!.label).toBe('gpu-node-a');
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
