/**
 * The waiting view under the request form: while this server's pending share request
 * cannot be placed, why (the scheduler extender's words), its place in the queue, what
 * would start now, and one button that switches the request to that share.
 * Talks only to `vgpu/api/requests/<id>/waiting` and `.../switch` (docs/server-api.yaml);
 * the server answers about this request's own pod, never naming anyone else's.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type { components } from './server-api';
import type { ShareRequest } from './types';
import { describeRequest, MEMORY_UNIT_MIB } from './request';

export type Waiting = components['schemas']['Waiting'];
export type WaitingAlternative = components['schemas']['WaitingAlternative'];

/** "Position 3 of 7 waiting for a GPU." */
export function positionText(waiting: Waiting): string {
  return `Position ${waiting.position} of ${waiting.waiting} waiting for a GPU.`;
}

/** "Why: no card on any node has 50 % and 20 GiB free." */
export function whyText(waiting: Waiting): string {
  return `Why: ${waiting.why}.`;
}

/** What would start now, or that nothing smaller would. */
export function alternativeText(waiting: Waiting): string {
  return waiting.alternative
    ? `What would start now: ${waiting.alternative.text}.`
    : 'Nothing smaller would start now either; your request keeps its place.';
}

/** The body of `POST requests/<id>/switch` for the alternative: its cores and memory units. */
export function switchBody(alternative: WaitingAlternative): { cores: number; memory: number } {
  return { cores: alternative.cores, memory: Math.floor(alternative.memoryMib / MEMORY_UNIT_MIB) };
}

/** The button's label: "Switch to 25 % of one card with 8 GiB". */
export function switchLabel(alternative: WaitingAlternative): string {
  const body = switchBody(alternative);
  return `Switch to ${describeRequest(body.cores, body.memory)}`;
}

export class WaitingView {
  readonly node: HTMLDivElement;
  private _position: HTMLDivElement;
  private _why: HTMLDivElement;
  private _alternative: HTMLDivElement;
  private _switch: HTMLButtonElement;
  private _error: HTMLDivElement;
  private _requestId: string | null = null;
  private _waiting: Waiting | null = null;
  private _timer: number | null = null;

  /** `onSwitched` gets the new request, for the panel to follow instead of the withdrawn one. */
  constructor(
    private readonly onSwitched: (request: ShareRequest) => void,
    private readonly settings: ServerConnection.ISettings = ServerConnection.makeSettings(),
    private readonly pollSeconds = 2
  ) {
    this.node = document.createElement('div');
    this.node.className = 'jp-vgpu-waiting';
    this.node.setAttribute('role', 'status');
    this.node.setAttribute('aria-live', 'polite');
    this.node.hidden = true;
    const line = (name: string) => {
      const div = document.createElement('div');
      div.className = name;
      return div;
    };
    this._position = line('jp-vgpu-waiting-position');
    this._why = line('jp-vgpu-waiting-why');
    this._alternative = line('jp-vgpu-waiting-alternative');
    this._error = line('jp-vgpu-waiting-error');
    this._switch = document.createElement('button');
    this._switch.className = 'jp-vgpu-waiting-switch jp-mod-styled jp-mod-accept';
    this._switch.addEventListener('click', () => void this.switchNow());
    this.node.append(this._position, this._why, this._alternative, this._switch, this._error);
  }

  /** Follow this pending request (null: none pending; the view hides). */
  follow(requestId: string | null): void {
    if (requestId === this._requestId) {
      return;
    }
    this._stop();
    this._requestId = requestId;
    this._waiting = null;
    this._error.textContent = '';
    this.render();
    if (requestId !== null) {
      void this.refresh();
      this._timer = window.setInterval(() => void this.refresh(), this.pollSeconds * 1000);
    }
  }

  dispose(): void {
    this._stop();
  }

  private _stop(): void {
    if (this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    }
  }

  async refresh(): Promise<void> {
    const id = this._requestId;
    if (id === null) {
      return;
    }
    try {
      const url = URLExt.join(this.settings.baseUrl, 'vgpu/api/requests', encodeURIComponent(id), 'waiting');
      const response = await ServerConnection.makeRequest(url, {}, this.settings);
      if (id !== this._requestId) {
        return;
      }
      this._waiting = response.status === 200 ? ((await response.json()) as Waiting) : null;
    } catch {
      this._waiting = null; // the server is not answering: the panel says so elsewhere
    }
    this.render();
  }

  async switchNow(): Promise<void> {
    const id = this._requestId;
    const alternative = this._waiting?.alternative;
    if (id === null || !alternative) {
      return;
    }
    this._switch.disabled = true;
    try {
      const url = URLExt.join(this.settings.baseUrl, 'vgpu/api/requests', encodeURIComponent(id), 'switch');
      const response = await ServerConnection.makeRequest(
        url,
        { method: 'POST', body: JSON.stringify(switchBody(alternative)) },
        this.settings
      );
      const body = await response.json();
      if (!response.ok) {
        throw new Error(body?.message ?? `${response.status}`);
      }
      this.follow(null);
      this.onSwitched(body as ShareRequest);
    } catch (error) {
      this._error.textContent = `Could not switch: ${(error as Error).message}`;
    } finally {
      this._switch.disabled = false;
    }
  }

  render(): void {
    const waiting = this._requestId === null ? null : this._waiting;
    this.node.hidden = waiting === null && !this._error.textContent;
    if (waiting === null) {
      return;
    }
    this._position.textContent = positionText(waiting);
    this._why.textContent = whyText(waiting);
    this._alternative.textContent = alternativeText(waiting);
    this._switch.hidden = !waiting.alternative;
    this._switch.textContent = waiting.alternative ? switchLabel(waiting.alternative) : '';
  }
}
