/**
 * The panel's and the status bar's shared state, and the loops that keep it fresh.
 *
 * Two speeds: "live" (the panel is visible: a sample about every second, from the
 * websocket stream or by polling) and "idle" (only the status bar: a cheap poll every
 * `idleSeconds`). Nothing runs while the browser tab is hidden.
 */

import { ISignal, Signal } from '@lumino/signaling';

import type { VgpuClient } from './api';
import { ApiError } from './errors';
import { UsageSeries } from './series';
import {
  AllocationReply,
  Limits,
  ShareRequest,
  ShareRequestBody,
  TopologyReply,
  UsageCurrent,
  UsageReply,
  UsageState
} from './types';

/** The calls the model makes (VgpuClient's surface). */
export type VgpuClientLike = Pick<
  VgpuClient,
  'getAllocation' | 'getTopology' | 'getUsage' | 'submitRequest' | 'getRequest' | 'latestRequest' | 'openUsageStream'
>;

export interface VgpuSettings {
  /** Seconds between samples while the panel is visible (polling; the stream sets its own pace). */
  refreshSeconds: number;
  /** Seconds of history the charts show. */
  chartWindowSeconds: number;
  /** Seconds between status-bar refreshes while the panel is hidden. */
  idleSeconds: number;
  /** Use the websocket stream while the panel is visible (falls back to polling). */
  useStream: boolean;
}

export const DEFAULT_SETTINGS: VgpuSettings = {
  refreshSeconds: 1,
  chartWindowSeconds: 120,
  idleSeconds: 10,
  useStream: true
};

export interface UsageView {
  state: UsageState;
  message: string | null;
  limits: Limits | null;
  current: UsageCurrent | null;
}

export interface RequestView {
  /** The request as the server last reported it; null before any. */
  request: ShareRequest | null;
  /** Set while a submission is on its way or pending, with when it started. */
  startedAt: number | null;
  /** A submission that the server refused outright (400) or could not take. */
  error: string | null;
}

export class VgpuModel {
  readonly series: UsageSeries;
  allocation: AllocationReply | null = null;
  topology: TopologyReply | null = null;
  usage: UsageView | null = null;
  requestView: RequestView = { request: null, startedAt: null, error: null };
  /** How samples arrive right now: 'stream', 'poll' or 'paused'. */
  transport: 'stream' | 'poll' | 'paused' = 'paused';

  private _settings: VgpuSettings = { ...DEFAULT_SETTINGS };
  private _changed = new Signal<this, void>(this);
  private _live = false;
  private _timer: ReturnType<typeof setTimeout> | null = null;
  private _socket: WebSocket | null = null;
  private _streamFailed = false;
  private _requestTimer: ReturnType<typeof setTimeout> | null = null;
  private _generation = 0;
  private _disposed = false;

  /** `client` is a VgpuClient; only its methods are used, so tests can pass a fake server. */
  constructor(readonly client: VgpuClientLike) {
    this.series = new UsageSeries(this._settings.chartWindowSeconds);
    if (typeof document !== 'undefined') {
      document.addEventListener('visibilitychange', this._onVisibility);
    }
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get settings(): VgpuSettings {
    return this._settings;
  }

  set settings(value: VgpuSettings) {
    const windowChanged = value.chartWindowSeconds !== this._settings.chartWindowSeconds;
    this._settings = { ...value };
    this.series.windowSeconds = value.chartWindowSeconds;
    this._restart(windowChanged);
  }

  get live(): boolean {
    return this._live;
  }

  /** Start: fetch what the session has, then keep the status bar fresh. */
  async start(): Promise<void> {
    await Promise.all([this.refreshAllocation(), this._resumeLatestRequest()]);
    this._restart(false);
  }

  /** The panel became visible (true) or hidden (false). */
  setLive(live: boolean): void {
    if (live === this._live) {
      return;
    }
    this._live = live;
    if (live) {
      // a fresh look: allocation and topology may have changed since last time
      void this.refreshAllocation();
      this._streamFailed = false;
    }
    this._restart(live);
  }

  async refreshAllocation(): Promise<void> {
    const [allocation, topology] = await Promise.all([
      this.client.getAllocation().catch(error => unreachableReply(error)),
      this.client.getTopology().catch(error => ({ ...unreachableReply(error), topology: null }))
    ]);
    this.allocation = allocation as AllocationReply;
    this.topology = topology as TopologyReply;
    this._emit();
  }

  /** Submit a request and follow it until it is scheduled or failed. */
  async submit(body: ShareRequestBody): Promise<void> {
    this._stopRequestPoll();
    this.requestView = { request: null, startedAt: Date.now(), error: null };
    this._emit();
    try {
      const request = await this.client.submitRequest(body);
      this.requestView = { ...this.requestView, request };
      this._emit();
      this._followRequest(request);
    } catch (error) {
      this.requestView = { request: null, startedAt: null, error: (error as Error).message };
      this._emit();
    }
  }

  /** Follow a request started elsewhere (the waiting view's switch) instead of the current one. */
  adopt(request: ShareRequest): void {
    this._stopRequestPoll();
    this.requestView = { request, startedAt: request.state === 'pending' ? Date.now() : null, error: null };
    this._emit();
    this._followRequest(request);
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._stopLoops();
    this._stopRequestPoll();
    if (typeof document !== 'undefined') {
      document.removeEventListener('visibilitychange', this._onVisibility);
    }
    Signal.clearData(this);
  }

  // --- the sample loops ---------------------------------------------------------------

  private _restart(reseed: boolean): void {
    this._stopLoops();
    if (this._disposed || (typeof document !== 'undefined' && document.hidden)) {
      this.transport = 'paused';
      this._emit();
      return;
    }
    const generation = ++this._generation;
    if (this._live) {
      void this._seed(generation, reseed).then(() => {
        if (generation !== this._generation) {
          return;
        }
        if (this._settings.useStream && !this._streamFailed) {
          this._openStream(generation);
        } else {
          // the seed was this round's sample
          this._schedulePoll(generation, this._settings.refreshSeconds);
        }
      });
    } else {
      this._schedulePoll(generation, 0);
    }
  }

  private _stopLoops(): void {
    this._generation += 1;
    if (this._timer !== null) {
      clearTimeout(this._timer);
      this._timer = null;
    }
    if (this._socket) {
      const socket = this._socket;
      this._socket = null;
      socket.onclose = null;
      socket.onerror = null;
      socket.onmessage = null;
      socket.close();
    }
    this.transport = 'paused';
  }

  /** Fill the chart with the server's history so it does not start empty. */
  private async _seed(generation: number, reseed: boolean): Promise<void> {
    try {
      const reply = await this.client.getUsage(this._settings.chartWindowSeconds);
      if (generation !== this._generation) {
        return;
      }
      if (reseed) {
        this.series.clear();
      }
      this._applyUsage(reply);
    } catch (error) {
      if (generation === this._generation) {
        this._applyError(error);
      }
    }
  }

  private _openStream(generation: number): void {
    this.transport = 'stream';
    this._emit();
    this._socket = this.client.openUsageStream(
      message => {
        if (generation === this._generation) {
          this._applyUsage(message);
        }
      },
      () => {
        if (generation !== this._generation) {
          return;
        }
        // the stream is gone (not served, proxy refused websockets, server restart): poll instead
        this._socket = null;
        this._streamFailed = true;
        this._schedulePoll(generation, this._settings.refreshSeconds);
      }
    );
  }

  private _schedulePoll(generation: number, delaySeconds: number): void {
    this.transport = 'poll';
    this._timer = setTimeout(async () => {
      this._timer = null;
      try {
        const reply = await this.client.getUsage();
        if (generation === this._generation) {
          this._applyUsage(reply);
        }
      } catch (error) {
        if (generation === this._generation) {
          this._applyError(error);
        }
      }
      if (generation === this._generation) {
        const seconds = this._live ? this._settings.refreshSeconds : this._settings.idleSeconds;
        this._schedulePoll(generation, seconds);
      }
    }, delaySeconds * 1000);
  }

  /** A usage reply, or a stream message (the same fields without the history). */
  private _applyUsage(
    reply: Pick<UsageReply, 'state' | 'message' | 'limits' | 'current'> & Partial<Pick<UsageReply, 'history'>>
  ): void {
    this.usage = {
      state: reply.state,
      message: reply.message ?? null,
      limits: reply.limits ?? this.usage?.limits ?? null,
      current: reply.current ?? null
    };
    if (reply.history) {
      this.series.addMany(reply.history);
    }
    if (reply.current) {
      this.series.add(reply.current);
    }
    this._emit();
  }

  private _applyError(error: unknown): void {
    this.usage = {
      state: 'unreachable',
      message: (error as Error).message,
      limits: this.usage?.limits ?? null,
      current: null
    };
    this._emit();
  }

  private _onVisibility = (): void => {
    this._restart(false);
  };

  // --- following a request ------------------------------------------------------------

  private async _resumeLatestRequest(): Promise<void> {
    try {
      const request = await this.client.latestRequest();
      if (request && request.id) {
        this.requestView = { request, startedAt: request.state === 'pending' ? Date.now() : null, error: null };
        this._emit();
        this._followRequest(request);
      }
    } catch {
      // no request API (yet) is not a reason to hide the rest of the panel
    }
  }

  private _followRequest(request: ShareRequest, delaySeconds = 1): void {
    if (request.state !== 'pending') {
      this.requestView = { ...this.requestView, request, startedAt: null };
      this._emit();
      void this.refreshAllocation();
      return;
    }
    this._requestTimer = setTimeout(async () => {
      this._requestTimer = null;
      try {
        const next = await this.client.getRequest(request.id);
        this.requestView = { ...this.requestView, request: next, error: null };
        this._emit();
        this._followRequest(next);
      } catch (error) {
        const lost = error instanceof ApiError && error.status === 404;
        if (lost) {
          this.requestView = { request, startedAt: null, error: 'The server no longer knows this request.' };
          this._emit();
          return;
        }
        // a blip (or this server restarting onto the new share): keep following, less often
        this._followRequest(request, Math.min(10, delaySeconds * 2));
      }
    }, delaySeconds * 1000);
  }

  private _stopRequestPoll(): void {
    if (this._requestTimer !== null) {
      clearTimeout(this._requestTimer);
      this._requestTimer = null;
    }
  }

  private _emit(): void {
    if (!this._disposed) {
      this._changed.emit();
    }
  }
}

function unreachableReply(error: unknown): AllocationReply {
  return {
    state: 'unreachable',
    source: 'none',
    message: (error as Error).message,
    allocation: null
  };
}
