/**
 * The vGPU sidebar panel: the facts (allocation card, topology, live charts — drawn by
 * FactsView, the renderer the notebook widgets share) and the request form. Plain DOM.
 */

import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { h } from './dom';
import { describeCards } from './format';
import { FactsState, FactsView, factsState } from './facts-view';
import { VgpuModel } from './model';
import { describeRequest, suggestedShare, validateRequestForm } from './request';
import { WaitingView } from './waiting';

/** The panel's overall state, also exposed as `data-vgpu-state` for styling and tests. */
export type PanelState = FactsState;

export class VgpuPanel extends Widget {
  /** The state line, allocation card, topology and charts: the renderer the widgets use too. */
  readonly facts = new FactsView({ noneHint: 'Ask for one below.' });
  private _request: HTMLElement;
  private _cores: HTMLInputElement;
  private _memory: HTMLInputElement;
  private _submit: HTMLButtonElement;
  private _release: HTMLButtonElement;
  private _formError = h('div', { class: 'jp-vgpu-form-error', role: 'alert', id: 'jp-vgpu-form-error' });
  private _progress = h('div', { class: 'jp-vgpu-request-progress', role: 'status', 'aria-live': 'polite' });
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
      this.facts.node,
      this._request
    );
    model.changed.connect(this._render, this);
    this._render();
  }

  get state(): PanelState {
    return factsState(this.model.allocation);
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
    const model = this.model;
    const state = this.facts.render({
      allocation: model.allocation,
      topology: model.topology,
      usage: model.usage,
      points: model.series.points,
      windowSeconds: model.settings.chartWindowSeconds
    });
    this.node.dataset.vgpuState = state;
    this.node.dataset.vgpuTransport = model.transport;
    // the form suggests the share held now (after a move, on a slice: that one), not a fixed one
    const suggestion = suggestedShare(state === 'allocated' ? (model.allocation?.allocation ?? null) : null);
    this._cores.placeholder = suggestion.cores;
    this._memory.placeholder = suggestion.memory;
    this._renderRequest();
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
