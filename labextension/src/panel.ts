/**
 * The vGPU sidebar panel: allocation card, topology diagram, live charts and the
 * request form. Plain DOM (no framework); the numbers and words come from the pure
 * modules (format, series, topology, request).
 */

import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { bar, h, s } from './dom';
import {
  allocationFractions,
  describeCards,
  describeIsolation,
  describeSliceSize,
  describeModels,
  describeShare,
  formatMib,
  formatPercent,
  formatUsedOf
} from './format';
import { VgpuModel } from './model';
import { describeRequest, validateRequestForm } from './request';
import { WaitingView } from './waiting';
import { chartGeometry, formatWindow } from './series';
import { describeLevel, describeOccupancy, layoutTopology } from './topology';
import { Allocation, Topology, UsagePoint } from './types';

const CHART_WIDTH = 300;
const CHART_HEIGHT = 70;

/** The panel's overall state, also exposed as `data-vgpu-state` for styling and tests. */
export type PanelState = 'loading' | 'none' | 'unreachable' | 'allocated';

export class VgpuPanel extends Widget {
  private _state = h('div', { class: 'jp-vgpu-state', role: 'status', 'aria-live': 'polite' });
  private _allocation = h('section', { class: 'jp-vgpu-section jp-vgpu-allocation', 'aria-label': 'Your allocation' });
  private _topology = h('section', { class: 'jp-vgpu-section jp-vgpu-topology', 'aria-label': 'GPU topology of the node' });
  private _usage = h('section', { class: 'jp-vgpu-section jp-vgpu-usage', 'aria-label': 'Live usage' });
  private _request: HTMLElement;
  private _cores: HTMLInputElement;
  private _memory: HTMLInputElement;
  private _submit: HTMLButtonElement;
  private _release: HTMLButtonElement;
  private _formError = h('div', { class: 'jp-vgpu-form-error', role: 'alert', id: 'jp-vgpu-form-error' });
  private _progress = h('div', { class: 'jp-vgpu-request-progress', role: 'status', 'aria-live': 'polite' });
  private _renderedTopology: Topology | null | undefined = undefined;
  private _tick: ReturnType<typeof setInterval> | null = null;
  private _waiting: WaitingView;

  constructor(readonly model: VgpuModel) {
    super();
    this._waiting = new WaitingView(request => model.adopt(request));
    this.id = 'jp-vgpu-panel';
    this.addClass('jp-vgpu-panel');
    this.title.caption = 'vGPU: your GPU share';
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-label', 'vGPU');

    this._cores = h('input', {
      id: 'jp-vgpu-cores',
      class: 'jp-mod-styled jp-vgpu-input',
      type: 'text',
      inputmode: 'numeric',
      placeholder: '25',
      'aria-describedby': 'jp-vgpu-cores-help jp-vgpu-form-error'
    });
    this._memory = h('input', {
      id: 'jp-vgpu-memory',
      class: 'jp-mod-styled jp-vgpu-input',
      type: 'text',
      placeholder: '4GiB',
      'aria-describedby': 'jp-vgpu-memory-help jp-vgpu-form-error'
    });
    this._submit = h('button', { type: 'submit', class: 'jp-mod-styled jp-mod-accept jp-vgpu-submit' }, 'Request');
    this._release = h(
      'button',
      { type: 'button', class: 'jp-mod-styled jp-mod-warn jp-vgpu-release', title: 'Give the GPU back (asks for no GPU)' },
      'Release GPU'
    );
    const form = h(
      'form',
      { class: 'jp-vgpu-form', 'aria-label': 'Request a different GPU share', novalidate: true },
      h(
        'div',
        { class: 'jp-vgpu-field' },
        h('label', { for: 'jp-vgpu-cores' }, 'Compute'),
        this._cores,
        h('small', { id: 'jp-vgpu-cores-help' }, '1-99 % of one card, or 100 per whole card')
      ),
      h(
        'div',
        { class: 'jp-vgpu-field' },
        h('label', { for: 'jp-vgpu-memory' }, 'Memory'),
        this._memory,
        h('small', { id: 'jp-vgpu-memory-help' }, 'e.g. 4GiB or 4096MiB; optional for whole cards')
      ),
      this._formError,
      h('div', { class: 'jp-vgpu-form-buttons' }, this._submit, this._release)
    );
    form.addEventListener('submit', event => {
      event.preventDefault();
      this._send(this._cores.value, this._memory.value);
    });
    this._release.addEventListener('click', () => this._send('0', ''));
    for (const input of [this._cores, this._memory]) {
      input.addEventListener('input', () => this._clearFormError());
    }
    this._request = h(
      'section',
      { class: 'jp-vgpu-section jp-vgpu-request', 'aria-labelledby': 'jp-vgpu-request-title' },
      h('h3', { id: 'jp-vgpu-request-title' }, 'Request a different share'),
      form,
      this._progress,
      this._waiting.node
    );

    this.node.append(
      h('header', { class: 'jp-vgpu-header' }, h('h2', {}, 'vGPU')),
      this._state,
      this._allocation,
      this._topology,
      this._usage,
      this._request
    );
    model.changed.connect(this._render, this);
    this._render();
  }

  get state(): PanelState {
    const allocation = this.model.allocation;
    if (!allocation) {
      return 'loading';
    }
    if (allocation.state === 'allocated' && allocation.allocation) {
      return 'allocated';
    }
    return allocation.state === 'none' ? 'none' : 'unreachable';
  }

  dispose(): void {
    this._stopTick();
    this._waiting.dispose();
    this.model.changed.disconnect(this._render, this);
    super.dispose();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this.model.setLive(this.isVisible);
  }

  protected onBeforeDetach(msg: Message): void {
    this.model.setLive(false);
    super.onBeforeDetach(msg);
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.model.setLive(true);
  }

  protected onAfterHide(msg: Message): void {
    this.model.setLive(false);
    super.onAfterHide(msg);
  }

  // --- rendering --------------------------------------------------------------------------

  private _render(): void {
    const state = this.state;
    this.node.dataset.vgpuState = state;
    this.node.dataset.vgpuTransport = this.model.transport;
    this._renderState(state);
    this._renderAllocation(state);
    this._renderTopology(state);
    this._renderUsage(state);
    this._renderRequest();
  }

  private _renderState(state: PanelState): void {
    const message = this.model.allocation?.message;
    let text = '';
    if (state === 'loading') {
      text = 'Loading your GPU allocation…';
    } else if (state === 'none') {
      text = 'No vGPU: this session has no GPU share. Ask for one below.';
    } else if (state === 'unreachable') {
      text = 'Metrics unreachable: cannot read your GPU allocation right now.';
    }
    this._state.replaceChildren(
      ...(text ? [h('p', { class: 'jp-vgpu-state-title' }, text)] : []),
      ...(text && message ? [h('p', { class: 'jp-vgpu-state-detail' }, message)] : [])
    );
    this._state.hidden = !text;
    this._state.className = `jp-vgpu-state jp-vgpu-state-${state}`;
  }

  private _renderAllocation(state: PanelState): void {
    const allocation = this.model.allocation?.allocation;
    if (state !== 'allocated' || !allocation) {
      this._allocation.hidden = true;
      this._allocation.replaceChildren();
      return;
    }
    this._allocation.hidden = false;
    const fractions = allocationFractions(allocation);
    const cards = allocation.cards.map(c => c.index);
    const totalMemory = allocation.cards.reduce((sum, c) => sum + (c.memoryTotalMib ?? 0), 0);
    this._allocation.replaceChildren(
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
          ? h('div', { class: 'jp-vgpu-card-enforcement' }, `Limits enforced by: ${allocation.enforcement}`)
          : null
      )
    );
  }

  private _renderTopology(state: PanelState): void {
    const topology = this.model.topology?.topology ?? null;
    if (state !== 'allocated' || !topology || !topology.gpus.length) {
      this._topology.hidden = true;
      this._renderedTopology = null;
      this._topology.replaceChildren();
      return;
    }
    this._topology.hidden = false;
    if (topology === this._renderedTopology) {
      return;
    }
    this._renderedTopology = topology;
    const layout = layoutTopology(topology);
    const slot = 64;
    const row = 52;
    const width = layout.width * slot;
    const height = layout.depth * row;
    const xy = (x: number, y: number) => [x * slot, y * row + 20];
    const byId = new Map(layout.nodes.map(n => [n.id, n]));
    const mine = topology.gpus.filter(g => g.mine).map(g => g.index);
    const svg = s('svg', {
      class: 'jp-vgpu-topology-svg',
      viewBox: `0 0 ${width} ${height}`,
      // its natural size, so the text stays 10-11 px in a 250 px sidebar (the section scrolls sideways)
      width,
      height,
      role: 'img',
      'aria-label':
        `GPU topology of node ${topology.node}: ${topology.gpus.length} cards` +
        (mine.length ? `; yours: ${describeCards(mine)}` : '')
    });
    for (const edge of layout.edges) {
      const from = byId.get(edge.from)!;
      const to = byId.get(edge.to)!;
      const [x1, y1] = xy(from.x, from.y);
      const [x2, y2] = xy(to.x, to.y);
      const midY = (y1 + y2) / 2;
      svg.append(
        s('path', {
          class: `jp-vgpu-topo-edge${edge.mine ? ' jp-vgpu-mine' : ''}`,
          d: `M${x1},${y1} V${midY} H${x2} V${y2}`
        })
      );
    }
    for (const node of layout.nodes) {
      const [x, y] = xy(node.x, node.y);
      if (node.gpu) {
        const gpu = node.gpu;
        const occupancy = describeOccupancy(gpu);
        const used = Math.min(1, Math.max(0, (gpu.allocatedCores ?? 0) / 100));
        const classes = ['jp-vgpu-topo-gpu'];
        if (node.mine) {
          classes.push('jp-vgpu-mine');
        }
        if (gpu.healthy === false) {
          classes.push('jp-vgpu-unhealthy');
        }
        const group = s(
          'g',
          { class: classes.join(' '), 'data-gpu': gpu.index, transform: `translate(${x - 28},${y - 16})` },
          s('title', {}, `GPU ${gpu.index}${gpu.model ? ` (${gpu.model})` : ''}: ${occupancy}`),
          s('rect', { class: 'jp-vgpu-topo-box', width: 56, height: 34, rx: 4 }),
          s('text', { class: 'jp-vgpu-topo-label', x: 28, y: 13, 'text-anchor': 'middle' }, node.label),
          s('rect', { class: 'jp-vgpu-topo-track', x: 6, y: 20, width: 44, height: 5, rx: 2 }),
          s('rect', { class: 'jp-vgpu-topo-fill', x: 6, y: 20, width: Math.round(44 * used * 10) / 10, height: 5, rx: 2 }),
          node.mine ? s('text', { class: 'jp-vgpu-topo-you', x: 28, y: 47, 'text-anchor': 'middle' }, 'you') : null
        );
        svg.append(group);
      } else {
        svg.append(
          s(
            'g',
            { class: `jp-vgpu-topo-group${node.mine ? ' jp-vgpu-mine' : ''}` },
            s('title', {}, `${node.label}: cards ${node.gpus.join(', ')} linked through ${describeLevel(node.level)}`),
            s('circle', { class: 'jp-vgpu-topo-dot', cx: x, cy: y, r: 4 }),
            s('text', { class: 'jp-vgpu-topo-level', x: x + 7, y: y - 6 }, node.label)
          )
        );
      }
    }
    const legend = h(
      'ul',
      { class: 'jp-vgpu-topo-legend' },
      ...topology.gpus
        .slice()
        .sort((a, b) => a.index - b.index)
        .map(g =>
          h(
            'li',
            { class: g.mine ? 'jp-vgpu-mine' : '', 'data-gpu': g.index },
            h('strong', {}, `GPU ${g.index}`),
            ` ${describeOccupancy(g)}`,
            g.numa !== undefined && g.numa !== null ? ` · NUMA ${g.numa}` : ''
          )
        )
    );
    this._topology.replaceChildren(h('h3', {}, 'Topology'), h('div', { class: 'jp-vgpu-topology-scroll' }, svg), legend);
  }

  private _renderUsage(state: PanelState): void {
    if (state !== 'allocated') {
      this._usage.hidden = true;
      return;
    }
    this._usage.hidden = false;
    const usage = this.model.usage;
    const points = this.model.series.points;
    const limits = usage?.limits ?? null;
    const window = this.model.settings.chartWindowSeconds;
    const status =
      usage === null
        ? 'Waiting for the first sample…'
        : usage.state === 'unreachable'
          ? `Metrics unreachable${usage.message ? `: ${usage.message}` : ''}`
          : usage.state === 'stale'
            ? `Stale: the node has not sampled recently${usage.message ? ` (${usage.message})` : ''}`
            : usage.state === 'none'
              ? usage.message || 'No usage data'
              : '';
    const current = usage?.current ?? null;
    this._usage.replaceChildren(
      ...present(
      h('h3', {}, 'Usage'),
      status ? h('p', { class: `jp-vgpu-usage-status jp-vgpu-usage-${usage?.state ?? 'loading'}`, role: 'status' }, status) : null,
      this._chart(
        'memory',
        'Memory',
        points,
        p => p.memoryUsedMib,
        limits?.memoryMib ?? null,
        current && limits ? formatUsedOf(current.memoryUsedMib, limits.memoryMib) : current ? formatMib(current.memoryUsedMib) : '–',
        window
      ),
      this._chart(
        'utilization',
        'Compute',
        points,
        p => p.utilizationPercent,
        limits?.cores ?? null,
        current ? `${formatPercent(current.utilizationPercent)}${limits ? ` of ${formatPercent(limits.cores)}` : ''}` : '–',
        window
      )
      )
    );
  }

  private _chart(
    kind: string,
    title: string,
    points: readonly UsagePoint[],
    value: (p: UsagePoint) => number,
    limit: number | null,
    now: string,
    window: number
  ): HTMLElement {
    const geometry = chartGeometry(points, value, { windowSeconds: window, width: CHART_WIDTH, height: CHART_HEIGHT, limit });
    const svg = s(
      'svg',
      {
        class: 'jp-vgpu-chart-svg',
        viewBox: `0 0 ${CHART_WIDTH} ${CHART_HEIGHT}`,
        preserveAspectRatio: 'none',
        role: 'img',
        'aria-label': `${title} over the last ${formatWindow(window)}: now ${now}`
      },
      s('rect', { class: 'jp-vgpu-chart-bg', width: CHART_WIDTH, height: CHART_HEIGHT }),
      geometry.limitY !== null
        ? s('line', { class: 'jp-vgpu-chart-limit', x1: 0, x2: CHART_WIDTH, y1: geometry.limitY, y2: geometry.limitY })
        : null,
      s('path', { class: 'jp-vgpu-chart-line', d: geometry.path, 'data-points': points.length })
    );
    const scale = kind === 'memory' ? formatMib(geometry.yMax) : formatPercent(geometry.yMax);
    return h(
      'figure',
      { class: `jp-vgpu-chart jp-vgpu-chart-${kind}` },
      h(
        'figcaption',
        {},
        h('span', { class: 'jp-vgpu-chart-title' }, title),
        h('span', { class: 'jp-vgpu-chart-now' }, now)
      ),
      svg,
      h(
        'div',
        { class: 'jp-vgpu-chart-axis' },
        h('span', {}, `−${formatWindow(window)}`),
        h('span', {}, `top ${scale}${limit !== null ? ' · dashed: limit' : ''}`),
        h('span', {}, 'now')
      )
    );
  }

  private _renderRequest(): void {
    const view = this.model.requestView;
    const pending = view.startedAt !== null && (view.request === null || view.request.state === 'pending');
    this._waiting.follow(pending && view.request && !view.request.handed_over ? view.request.id : null);
    this._submit.disabled = pending;
    this._release.disabled = pending || this.state !== 'allocated';
    this._progress.className = 'jp-vgpu-request-progress';
    if (pending) {
      this._startTick();
      const seconds = Math.max(0, Math.round((Date.now() - (view.startedAt ?? Date.now())) / 1000));
      const what = view.request ? describeRequest(view.request.cores, view.request.memoryUnits) : 'your request';
      this._progress.classList.add('jp-vgpu-request-pending');
      this._progress.replaceChildren(
        h('div', { class: 'jp-vgpu-spinner', 'aria-hidden': 'true' }),
        h(
          'span',
          {},
          `Request pending (${seconds} s): ${what}`,
          view.request?.message ? ` — ${view.request.message}` : ''
        )
      );
      return;
    }
    this._stopTick();
    if (view.error) {
      this._progress.classList.add('jp-vgpu-request-failed');
      this._progress.replaceChildren(h('strong', {}, 'Request not taken: '), view.error);
      return;
    }
    const request = view.request;
    if (!request) {
      this._progress.replaceChildren();
      return;
    }
    const what = describeRequest(request.cores, request.memoryUnits);
    if (request.state === 'scheduled') {
      this._progress.classList.add('jp-vgpu-request-scheduled');
      const cards = (request.cards ?? []).map(c => c.index);
      const where =
        request.node && cards.length
          ? ` on node ${request.node}, ${describeCards(cards)}`
          : request.node
            ? ` on node ${request.node}`
            : '';
      this._progress.replaceChildren(
        ...present(
          h('strong', {}, 'Scheduled: '),
          `${what}${where}.`,
          request.message ? h('div', { class: 'jp-vgpu-request-message' }, request.message) : null
        )
      );
    } else if (request.state === 'failed') {
      this._progress.classList.add('jp-vgpu-request-failed');
      this._progress.replaceChildren(
        ...present(
          h('strong', {}, 'Failed: '),
          `${what}.`,
          request.message ? h('div', { class: 'jp-vgpu-request-message' }, request.message) : null
        )
      );
    } else {
      this._progress.replaceChildren(`Last request: ${what} (${request.state}).`);
    }
  }

  private _send(coresText: string, memoryText: string): void {
    const result = validateRequestForm(coresText, memoryText);
    if (!result.ok) {
      this._formError.textContent = result.message;
      const field = result.field === 'cores' ? this._cores : this._memory;
      field.setAttribute('aria-invalid', 'true');
      field.focus();
      return;
    }
    this._clearFormError();
    void this.model.submit(result.body);
  }

  private _clearFormError(): void {
    this._formError.textContent = '';
    this._cores.removeAttribute('aria-invalid');
    this._memory.removeAttribute('aria-invalid');
  }

  private _startTick(): void {
    if (this._tick === null) {
      this._tick = setInterval(() => this._renderRequest(), 1000);
    }
  }

  private _stopTick(): void {
    if (this._tick !== null) {
      clearInterval(this._tick);
      this._tick = null;
    }
  }
}

/** The children that are there (drops null). */
function present(...children: (Node | string | null)[]): (Node | string)[] {
  return children.filter((c): c is Node | string => c !== null);
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
