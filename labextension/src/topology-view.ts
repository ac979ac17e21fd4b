/**
 * The node's GPU topology as nested boxes (a group per link level, a box per card), drawn the
 * same in the lab panel and the notebook widgets. HTML, not a fixed-size drawing: the cards
 * wrap onto more rows in a narrow view, so the text keeps its size and nothing scrolls sideways.
 */

import { h } from './dom';
import { describeCards } from './format';
import {
  describeLevel,
  describeOccupancy,
  describeSlice,
  LeafGpu,
  layoutSlices,
  TopologyCard,
  TopologyGroup,
  topologyTree
} from './topology';
import { Topology } from './types';

export function renderTopology(topology: Topology): HTMLElement[] {
  const mine = topology.gpus.filter(g => g.mine).map(g => g.index);
  return [
    h('h3', {}, 'Topology'),
    h(
      'div',
      {
        class: 'jp-vgpu-topo',
        role: 'group',
        'aria-label':
          `GPU topology of node ${topology.node}: ${topology.gpus.length} cards` +
          (mine.length ? `; yours: ${describeCards(mine)}` : '')
      },
      group(topologyTree(topology))
    )
  ];
}

function group(node: TopologyGroup): HTMLElement {
  return h(
    'div',
    { class: `jp-vgpu-topo-group${node.mine ? ' jp-vgpu-mine' : ''}`, 'data-level': node.level },
    h(
      'div',
      {
        class: 'jp-vgpu-topo-level',
        title: `${describeCards(node.gpus)} linked through ${describeLevel(node.level)}`
      },
      node.label
    ),
    h(
      'div',
      {
        // cards alone: a grid, so every card is as wide as the others, a lone one on the last row too
        class: `jp-vgpu-topo-children${node.children.every(child => child.kind !== 'group') ? ' jp-vgpu-topo-cards' : ''}`
      },
      ...node.children.map(child => (child.kind === 'group' ? group(child) : card(child)))
    )
  );
}

/**
 * A card: its name, everyone's allocation as a bar (yours on top) with its words and number; a
 * card in MIG mode shows its slices instead (a bar segment each, as wide as its part of the card,
 * and a line each: "2g.10gb · yours").
 */
function card(node: TopologyCard): HTMLElement {
  const gpu = node.gpu;
  const words = describeOccupancy(gpu);
  const [who, ...rest] = words.split(' · ');
  const allocated = percent(gpu.allocatedCores ?? 0);
  const own = node.mine ? percent(gpu.myCores ?? gpu.allocatedCores ?? 0) : 0;
  const classes = ['jp-vgpu-topo-gpu'];
  if (node.mine) {
    classes.push('jp-vgpu-mine');
  }
  if (gpu.healthy === false) {
    classes.push('jp-vgpu-unhealthy');
  }
  const mig = !!gpu.migSlices?.length;
  return h(
    'div',
    {
      class: classes.join(' '),
      'data-gpu': gpu.index,
      title: `GPU ${gpu.index}${gpu.model ? ` (${gpu.model})` : ''}: ${words}`
    },
    h('div', { class: 'jp-vgpu-topo-label' }, `GPU ${gpu.index}`),
    h(
      'div',
      {
        class: 'jp-vgpu-topo-bar',
        role: 'progressbar',
        'aria-label': `GPU ${gpu.index}: ${words}`,
        'aria-valuemin': 0,
        'aria-valuemax': 100,
        'aria-valuenow': allocated
      },
      ...(mig ? sliceBar(gpu) : allocatedBar(allocated, own))
    ),
    h('div', { class: 'jp-vgpu-topo-who' }, who),
    rest.length ? h('div', { class: 'jp-vgpu-topo-allocated' }, rest.join(' · ')) : null,
    mig
      ? h(
          'ul',
          { class: 'jp-vgpu-topo-slices' },
          ...(gpu.migSlices ?? []).map(slice =>
            h('li', { class: slice.state === 'mine' ? 'jp-vgpu-mine' : '', 'data-state': slice.state }, describeSlice(slice))
          )
        )
      : null,
    gpu.numa !== undefined && gpu.numa !== null ? h('div', { class: 'jp-vgpu-topo-numa' }, `NUMA ${gpu.numa}`) : null
  );
}

/** Everyone's allocation, with yours on top of it. */
function allocatedBar(allocated: number, own: number): HTMLElement[] {
  const others = h('div', { class: 'jp-vgpu-topo-fill' });
  others.style.width = `${allocated}%`;
  const yours = h('div', { class: 'jp-vgpu-topo-fill-mine' });
  yours.style.width = `${own}%`;
  return [others, yours];
}

/** A MIG card's slices along the bar, in GPU instance order. */
function sliceBar(gpu: LeafGpu): HTMLElement[] {
  return layoutSlices(gpu).map(segment => {
    const part = h('div', {
      class: `jp-vgpu-topo-slice jp-vgpu-topo-slice-${segment.slice.state}`,
      'data-profile': segment.slice.profile,
      'data-state': segment.slice.state,
      title: segment.words
    });
    part.style.left = `${round(segment.x * 100)}%`;
    part.style.width = `${round(segment.width * 100)}%`;
    return part;
  });
}

function round(value: number): number {
  return Math.round(value * 100) / 100;
}

function percent(cores: number): number {
  return Math.round(Math.min(100, Math.max(0, cores)));
}
