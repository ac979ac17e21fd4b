/**
 * THE renderer of the notebook's GPU facts: the state line, the allocation card, the topology
 * and the usage charts. The lab panel (panel.ts) and the notebook widgets (widget.ts, bundled
 * for anywidget) both draw through it, from the same REST-shaped facts
 * (docs/server-api.yaml), so their words, colours and layout cannot drift apart.
 */

import { h } from './dom';
import { FactsState, renderAllocation, stateTitle } from './card-view';
import { renderTopology } from './topology-view';
import { renderUsage } from './usage-view';
import { AllocationReply, Topology, TopologyReply, UsagePoint, UsageReply } from './types';

export type { FactsState } from './card-view';

/** The usage answer without its history (the samples are `Facts.points`). */
export type UsageFacts = Pick<UsageReply, 'state' | 'message' | 'limits' | 'current'>;

/** What is drawn: the server's answers, and the usage samples inside the chart window. */
export interface Facts {
  allocation: AllocationReply | null;
  topology: TopologyReply | null;
  usage: UsageFacts | null;
  points: readonly UsagePoint[];
  windowSeconds: number;
}

export type FactsPart = 'allocation' | 'topology' | 'usage';

export const ALL_PARTS: readonly FactsPart[] = ['allocation', 'topology', 'usage'];

export interface FactsViewOptions {
  /** The sections to draw (the widgets draw one or all; the panel all). */
  parts?: readonly FactsPart[];
  /** Where to ask for a GPU, after "No vGPU: …" (the panel's form, or `%vgpu request`). */
  noneHint: string;
}

/** 'allocated' only with an allocation; an answer without one is 'none' or 'unreachable'. */
export function factsState(allocation: AllocationReply | null): FactsState {
  if (!allocation) {
    return 'loading';
  }
  if (allocation.state === 'allocated' && allocation.allocation) {
    return 'allocated';
  }
  return allocation.state === 'none' ? 'none' : 'unreachable';
}

export class FactsView {
  readonly node = h('div', { class: 'jp-vgpu-facts' });
  private _state = h('div', { class: 'jp-vgpu-state', role: 'status', 'aria-live': 'polite' });
  private _allocation = h('section', { class: 'jp-vgpu-section jp-vgpu-allocation', 'aria-label': 'Your allocation' });
  private _topology = h('section', { class: 'jp-vgpu-section jp-vgpu-topology', 'aria-label': 'GPU topology of the node' });
  private _usage = h('section', { class: 'jp-vgpu-section jp-vgpu-usage', 'aria-label': 'Live usage' });
  private _parts: ReadonlySet<FactsPart>;
  private _renderedTopology: Topology | null | undefined = undefined;

  constructor(private readonly _options: FactsViewOptions) {
    this._parts = new Set(_options.parts ?? ALL_PARTS);
    this.node.append(this._state, this._allocation, this._topology, this._usage);
  }

  render(facts: Facts): FactsState {
    const state = factsState(facts.allocation);
    this.node.dataset.vgpuState = state;
    this._renderState(state, facts.allocation?.message ?? null);
    this._renderAllocation(state, facts);
    this._renderTopology(state, facts);
    this._renderUsage(state, facts);
    return state;
  }

  private _shows(part: FactsPart, state: FactsState): boolean {
    return this._parts.has(part) && state === 'allocated';
  }

  private _renderState(state: FactsState, message: string | null): void {
    const text = stateTitle(state, this._options.noneHint);
    this._state.replaceChildren(
      ...(text ? [h('p', { class: 'jp-vgpu-state-title' }, text)] : []),
      ...(text && message ? [h('p', { class: 'jp-vgpu-state-detail' }, message)] : [])
    );
    this._state.hidden = !text;
    this._state.className = `jp-vgpu-state jp-vgpu-state-${state}`;
  }

  private _renderAllocation(state: FactsState, facts: Facts): void {
    const allocation = facts.allocation?.allocation;
    const shown = this._shows('allocation', state) && !!allocation;
    this._allocation.hidden = !shown;
    this._allocation.replaceChildren(...(shown && allocation ? renderAllocation(allocation) : []));
  }

  private _renderTopology(state: FactsState, facts: Facts): void {
    const topology = facts.topology?.topology ?? null;
    if (!this._shows('topology', state) || !topology || !topology.gpus.length) {
      this._topology.hidden = true;
      this._renderedTopology = null;
      this._topology.replaceChildren();
      return;
    }
    this._topology.hidden = false;
    if (topology !== this._renderedTopology) {
      this._renderedTopology = topology;
      this._topology.replaceChildren(...renderTopology(topology));
    }
  }

  private _renderUsage(state: FactsState, facts: Facts): void {
    const shown = this._shows('usage', state);
    this._usage.hidden = !shown;
    this._usage.replaceChildren(...(shown ? renderUsage(facts.usage, facts.points, facts.windowSeconds) : []));
  }
}
