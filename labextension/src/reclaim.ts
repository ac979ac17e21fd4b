/**
 * The GPU reclaimer's banner at the top of the panel: when this server's share is warned
 * (idle or hoarding), the deadline counting down and a "Keep my GPU" button; after a
 * reclaim restarted or shrank the server, what happened and how to ask for a GPU again.
 * Talks only to `vgpu/api/reclaim` and `vgpu/api/reclaim/keep` (docs/server-api.yaml).
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type { components } from './server-api';

export type ReclaimReply = components['schemas']['ReclaimReply'];
export type ReclaimView = components['schemas']['ReclaimView'];

const DONE: Record<string, string> = {
  cpu: 'restarted without a GPU',
  shrink: 'restarted on a smaller share',
  stop: 'stopped'
};

/** "12:05" for 725 seconds; "0:00" never below. */
export function countdown(seconds: number): string {
  const total = Math.max(0, Math.floor(seconds));
  const minutes = Math.floor(total / 60);
  return `${minutes}:${String(total % 60).padStart(2, '0')}`;
}

/** The banner's text for an answer, or null when there is nothing to show. */
export function bannerText(reply: ReclaimReply, secondsLeft: number | null): string | null {
  const view = reply.reclaim;
  if (reply.state !== 'watched' || !view || view.dryRun) {
    return null;
  }
  if (view.phase === 'warned' && secondsLeft !== null) {
    const minutes = Math.round((view.quietSeconds ?? 0) / 60);
    return (
      `This GPU share has been ${view.reason} for ${minutes} min. ` +
      `The server will be ${DONE[view.action] ?? 'reclaimed'} in ${countdown(secondsLeft)} ` +
      'unless it computes again (your files stay).'
    );
  }
  if (view.lastReclaim) {
    return `${view.lastReclaim.message}. Ask for a GPU again below when you need one.`;
  }
  return null;
}

export class ReclaimBanner {
  readonly node: HTMLDivElement;
  private _text: HTMLSpanElement;
  private _keep: HTMLButtonElement;
  private _reply: ReclaimReply | null = null;
  private _fetchedAt = 0;
  private _timers: number[] = [];

  constructor(
    private readonly settings: ServerConnection.ISettings = ServerConnection.makeSettings(),
    private readonly pollSeconds = 30
  ) {
    this.node = document.createElement('div');
    this.node.className = 'jp-vgpu-reclaim-banner';
    this.node.setAttribute('role', 'alert');
    this.node.hidden = true;
    this._text = document.createElement('span');
    this._text.className = 'jp-vgpu-reclaim-text';
    this._keep = document.createElement('button');
    this._keep.className = 'jp-vgpu-reclaim-keep jp-mod-styled jp-mod-accept';
    this._keep.textContent = 'Keep my GPU';
    this._keep.addEventListener('click', () => void this.keep());
    this.node.append(this._text, this._keep);
  }

  start(): void {
    void this.refresh();
    this._timers.push(window.setInterval(() => void this.refresh(), this.pollSeconds * 1000));
    this._timers.push(window.setInterval(() => this.render(), 1000));
  }

  dispose(): void {
    this._timers.forEach(timer => window.clearInterval(timer));
    this._timers = [];
  }

  private async _call(path: string, init: RequestInit = {}): Promise<ReclaimReply> {
    const url = URLExt.join(this.settings.baseUrl, 'vgpu/api', path);
    const response = await ServerConnection.makeRequest(url, init, this.settings);
    const body = await response.json();
    if (!response.ok) {
      throw new Error(body?.message ?? `${response.status}`);
    }
    return body as ReclaimReply;
  }

  async refresh(): Promise<void> {
    try {
      this.apply(await this._call('reclaim'));
    } catch {
      // the server itself is not answering: the panel says so elsewhere
    }
  }

  async keep(): Promise<void> {
    this._keep.disabled = true;
    try {
      // the answer decides the button: disabled once no postpone is left
      this.apply(await this._call('reclaim/keep', { method: 'POST', body: '{}' }));
    } catch (error) {
      this._text.textContent = `Could not keep the GPU: ${(error as Error).message}`;
      this._keep.disabled = false;
    }
  }

  apply(reply: ReclaimReply): void {
    this._reply = reply;
    this._fetchedAt = Date.now();
    this.render();
  }

  /** Seconds left now: the reclaimer's count at the last answer, minus the time since. */
  secondsLeft(): number | null {
    const left = this._reply?.reclaim?.secondsLeft;
    return left === null || left === undefined ? null : left - (Date.now() - this._fetchedAt) / 1000;
  }

  render(): void {
    const reply = this._reply;
    const text = reply ? bannerText(reply, this.secondsLeft()) : null;
    this.node.hidden = text === null;
    this._text.textContent = text ?? '';
    const view = reply?.reclaim;
    const warned = view?.phase === 'warned';
    this._keep.hidden = !warned;
    this._keep.disabled = !warned || (view?.postponesLeft ?? 0) <= 0;
    this._keep.title = warned ? `${view?.postponesLeft ?? 0} postpone(s) left` : '';
    this.node.classList.toggle('jp-vgpu-mod-warned', warned);
  }
}
