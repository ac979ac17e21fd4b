/**
 * The node's GPU topology tree as the views draw it (nested groups, cards as leaves). Pure: no DOM.
 *
 * The tree comes from core.topology (root level 'ROOT', leaves level 'GPU', each inner
 * node a group of cards linked at that level or better). Chains of groups holding the
 * same cards are merged so the drawing shows only real branching.
 */

import { count, fill, GLOSSARY } from './glossary';
import { Topology, TopologyGpu, TreeNode } from './types';

/** What each link level means, for tooltips and the legend. */
export function describeLevel(level: string): string {
  const nvlink = /^NV(\d+)$/.exec(level);
  if (nvlink) {
    return `NVLink (${nvlink[1]} link${nvlink[1] === '1' ? '' : 's'})`;
  }
  switch (level) {
    case 'PIX':
      return 'one PCIe switch';
    case 'PXB':
      return 'several PCIe switches';
    case 'PHB':
      return 'a PCIe host bridge';
    case 'NODE':
      return 'host bridges within a NUMA node';
    case 'SYS':
      return 'across NUMA nodes';
    case 'ROOT':
      return 'the node';
    default:
      return level;
  }
}

export type LeafGpu = Pick<TopologyGpu, 'index' | 'mine'> & Partial<TopologyGpu>;

/**
 * The tree to draw, nested: groups of cards linked at a level (chains of groups holding the
 * same cards merged into one, labelled with all their levels), cards as leaves in index order.
 */
export interface TopologyGroup {
  kind: 'group';
  /** The merged levels ('SYS', 'NV12'); the root's is the node name first. */
  label: string;
  /** The best (last) level of the merged chain, for the tooltip. */
  level: string;
  gpus: number[];
  /** This subtree holds one of the user's cards. */
  mine: boolean;
  children: TopologyItem[];
}

export interface TopologyCard {
  kind: 'card';
  /** The server's facts (only index and mine for a card the tree names but the server did not list). */
  gpu: LeafGpu;
  mine: boolean;
}

export type TopologyItem = TopologyGroup | TopologyCard;

/** The tree to draw: the server's, or a flat one (node -> cards) when it sent none. */
function treeOf(topology: Topology): TreeNode {
  if (topology.tree && Array.isArray(topology.tree.children)) {
    return topology.tree;
  }
  const indices = topology.gpus.map(g => g.index).sort((a, b) => a - b);
  return {
    level: 'ROOT',
    gpus: indices,
    children: indices.map(i => ({ level: 'GPU', gpus: [i], children: [] }))
  };
}

function sameSet(a: number[], b: number[]): boolean {
  return a.length === b.length && a.every(v => b.includes(v));
}

/** Merge an inner node with a single child holding the same cards. */
function simplify(node: TreeNode): { node: TreeNode; levels: string[] } {
  const levels = [node.level];
  let current = node;
  while (
    current.children.length === 1 &&
    current.children[0].level !== 'GPU' &&
    sameSet(current.children[0].gpus, current.gpus)
  ) {
    current = current.children[0];
    levels.push(current.level);
  }
  return { node: current, levels };
}

export function topologyTree(topology: Topology): TopologyGroup {
  const byIndex = new Map(topology.gpus.map(g => [g.index, g]));
  const mineSet = new Set(topology.gpus.filter(g => g.mine).map(g => g.index));

  const visit = (raw: TreeNode): TopologyItem => {
    if (raw.level === 'GPU' || raw.children.length === 0) {
      const index = raw.gpus[0];
      return { kind: 'card', gpu: byIndex.get(index) ?? { index, mine: false }, mine: mineSet.has(index) };
    }
    const { node, levels } = simplify(raw);
    const shown = levels.filter(l => l !== 'ROOT');
    const name = topology.node ?? 'this node';
    const label = levels[0] === 'ROOT' ? [name, ...shown].join(' · ') : shown.join(' / ');
    const children = [...node.children].sort((a, b) => Math.min(...a.gpus) - Math.min(...b.gpus)).map(visit);
    return {
      kind: 'group',
      label,
      level: levels[levels.length - 1],
      gpus: [...node.gpus],
      mine: node.gpus.some(g => mineSet.has(g)),
      children
    };
  };

  const root = visit(treeOf(topology));
  // a tree that is one card still gets its node around it
  return root.kind === 'group'
    ? root
    : { kind: 'group', label: topology.node ?? 'this node', level: 'ROOT', gpus: [root.gpu.index], mine: root.mine, children: [root] };
}

/**
 * One card's occupancy in words (glossary.json), anonymous for other people's shares: the
 * user's own share is named, everyone else is a count. `allocatedCores` is the card's
 * total held by all tenants: allocated, which is not what they use.
 */
export function describeOccupancy(gpu: LeafGpu): string {
  const words = GLOSSARY.occupancy;
  if (gpu.healthy === false) {
    return words.unhealthy;
  }
  if (gpu.migSlices?.length) {
    return describeMigCard(gpu.migSlices);
  }
  const tenants = gpu.tenants ?? 0;
  const allocated = gpu.allocatedCores ?? 0;
  if (gpu.mine) {
    // `tenants` counts the other holders of the card, never the caller
    return tenants
      ? fill(words.mineWithOthers, { others: count('others', tenants), allocated })
      : fill(words.mine, { allocated });
  }
  if (tenants === 0 && allocated === 0) {
    return words.free;
  }
  return fill(words.others, { tenants: count('tenants', tenants), allocated });
}

/** One MIG slice of a card in MIG mode, as the node API reports it. */
export type SliceView = NonNullable<TopologyGpu['migSlices']>[number];

/** A MIG card in words: the user's slice named, the others counted ("MIG · 2 of 4 slices held"). */
function describeMigCard(slices: SliceView[]): string {
  const words = GLOSSARY.mig;
  const held = slices.filter(s => s.state === 'mine' || s.state === 'held').length;
  const total = count('slices', slices.length);
  const mine = slices.find(s => s.state === 'mine');
  if (mine) {
    return fill(words.mine, { profile: mine.profile, held, slices: total });
  }
  return held ? fill(words.others, { held, slices: total }) : fill(words.free, { slices: total });
}

/** One slice in words: "2g.10gb · yours", "1g.5gb · free". */
export function describeSlice(slice: SliceView): string {
  return fill(GLOSSARY.mig.slice, { profile: slice.profile, state: GLOSSARY.mig.states[slice.state] });
}

export interface SliceSegment {
  /** Left edge and width as fractions of the card's bar (its compute slices, in GPU instance order). */
  x: number;
  width: number;
  slice: SliceView;
  words: string;
}

/** A MIG card's bar: one segment per slice, as wide as its part of the card's compute. */
export function layoutSlices(gpu: LeafGpu): SliceSegment[] {
  let at = 0;
  return (gpu.migSlices ?? []).map(slice => {
    const width = Math.min(slice.slices / Math.max(slice.cardSlices, 1), 1 - at);
    const segment = { x: at, width, slice, words: describeSlice(slice) };
    at += width;
    return segment;
  });
}
