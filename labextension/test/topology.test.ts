import { describeLevel, describeOccupancy, describeSlice, layoutSlices, SliceView, TopologyGroup, TopologyItem, topologyTree } from '../src/topology';
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

describe('a card in MIG mode', () => {
  const slice = (profile: string, slices: number, state: SliceView['state']): SliceView => ({
    profile,
    slices,
    cardSlices: 7,
    cores: Math.floor((100 * slices) / 7),
    memoryMib: slices * 5120,
    state
  });
  // the fixture node's GPU 0: 3 x 2g.10gb + 1g.5gb; the user holds the first, someone the second
  const mig = {
    ...topology.gpus[0],
    mine: true,
    migSlices: [slice('2g.10gb', 2, 'mine'), slice('2g.10gb', 2, 'held'), slice('2g.10gb', 2, 'free'), slice('1g.5gb', 1, 'free')]
  };

  it('lays its slices along the bar, each as wide as its sevenths of the card', () => {
    const segments = layoutSlices(mig);
    expect(segments.map(s => [s.slice.profile, s.slice.state])).toEqual([
      ['2g.10gb', 'mine'],
      ['2g.10gb', 'held'],
      ['2g.10gb', 'free'],
      ['1g.5gb', 'free']
    ]);
    expect(segments.map(s => s.x)).toEqual([0, 2 / 7, 4 / 7, 6 / 7]);
    expect(segments.map(s => s.width)).toEqual([2 / 7, 2 / 7, 2 / 7, 1 / 7]);
    expect(segments[0].words).toBe('2g.10gb · yours');
    expect(segments[3].words).toBe('1g.5gb · free');
  });

  it('never draws past the end of the card', () => {
    const odd = layoutSlices({ index: 0, mine: false, migSlices: [slice('4g.20gb', 4, 'held'), slice('4g.20gb', 4, 'free')] });
    expect(odd[1].x + odd[1].width).toBe(1);
  });

  it('is worded by its slices, the user\'s named and the rest counted', () => {
    expect(describeOccupancy(mig)).toBe('yours: MIG 2g.10gb · 2 of 4 slices held');
    expect(describeOccupancy({ ...mig, mine: false, migSlices: mig.migSlices.slice(1) })).toBe('MIG · 1 of 3 slices held');
    expect(describeSlice(slice('1g.5gb', 1, 'unavailable'))).toBe('1g.5gb · unavailable');
  });

  it('leaves a card without slices as before', () => {
    expect(layoutSlices(topology.gpus[1])).toEqual([]);
    expect(describeOccupancy({ ...topology.gpus[1], migSlices: [] })).toBe('yours + 2 others · 75 % allocated');
  });
});
