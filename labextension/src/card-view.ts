/**
 * The allocation card and the state line, drawn the same in the lab panel and the notebook
 * widgets (both call these through FactsView). DOM only; the words come from format.ts.
 */

import { bar, h } from './dom';
import {
  allocationFractions,
  describeCards,
  describeEnforcement,
  describeIsolation,
  describeModels,
  describeShare,
  describeSliceSize,
  formatMib
} from './format';
import { Allocation } from './types';

/** What a view of the facts shows overall, also exposed as `data-vgpu-state`. */
export type FactsState = 'loading' | 'none' | 'unreachable' | 'allocated';

/** The state line's title ('' when allocated: the card says it all). */
export function stateTitle(state: FactsState, noneHint: string): string {
  switch (state) {
    case 'loading':
      return 'Loading your GPU allocation…';
    case 'none':
      return `No vGPU: this session has no GPU share.${noneHint ? ` ${noneHint}` : ''}`;
    case 'unreachable':
      return 'Metrics unreachable: cannot read your GPU allocation right now.';
    default:
      return '';
  }
}

/** The card's children: model, MIG slice, where, the compute and memory bars, enforcement. */
export function renderAllocation(allocation: Allocation): HTMLElement[] {
  const fractions = allocationFractions(allocation);
  const cards = allocation.cards.map(c => c.index);
  const totalMemory = allocation.cards.reduce((sum, c) => sum + (c.memoryTotalMib ?? 0), 0);
  return [
    h('h3', {}, 'Your GPU'),
    h(
      'div',
      { class: 'jp-vgpu-card' },
      h('div', { class: 'jp-vgpu-card-model' }, describeModels(allocation)),
      ...isolation(allocation),
      h(
        'div',
        { class: 'jp-vgpu-card-where' },
        `${describeCards(cards)} on node `,
        h('strong', { class: 'jp-vgpu-card-node' }, allocation.node)
      ),
      bar('Compute', fractions.compute, describeShare(allocation.cores), 'jp-vgpu-bar-compute'),
      bar(
        'Memory',
        fractions.memory,
        totalMemory ? `${formatMib(allocation.memoryMib)} of ${formatMib(totalMemory)}` : formatMib(allocation.memoryMib),
        'jp-vgpu-bar-memory'
      ),
      allocation.enforcement
        ? h('div', { class: 'jp-vgpu-card-enforcement' }, describeEnforcement(allocation.enforcement))
        : null
    )
  ];
}

/**
 * The "MIG 2g.10gb on GPU 0 (isolated)" line of the allocation card, with the slice's real size,
 * when the share is a MIG slice.
 */
function isolation(allocation: Allocation): HTMLElement[] {
  const text = describeIsolation(allocation);
  const size = describeSliceSize(allocation);
  return text
    ? [h('div', { class: 'jp-vgpu-card-mig' }, text, size ? h('span', { class: 'jp-vgpu-card-mig-size' }, ` · ${size}`) : null)]
    : [];
}
