/**
 * The REST and websocket client for `{base_url}vgpu/api/`. Every URL is built from the
 * server connection settings, so token/XSRF handling and JupyterHub base URLs
 * (`/user/<name>/`) work as they do for the rest of JupyterLab.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import {
  AllocationReply,
  ShareRequest,
  ShareRequestBody,
  TopologyReply,
  UsageReply,
  UsageStreamMessage
} from './types';
import { ApiError } from './errors';

export { ApiError };

export const API_PATH = 'vgpu/api';

export class VgpuClient {
  constructor(readonly settings: ServerConnection.ISettings = ServerConnection.makeSettings()) {}

  url(...parts: string[]): string {
    return URLExt.join(this.settings.baseUrl, API_PATH, ...parts);
  }

  getAllocation(): Promise<AllocationReply> {
    return this._json<AllocationReply>('allocation');
  }

  getTopology(): Promise<TopologyReply> {
    return this._json<TopologyReply>('topology');
  }

  /** Current usage, with up to `historySeconds` of history when asked. */
  getUsage(historySeconds = 0): Promise<UsageReply> {
    const query = historySeconds > 0 ? URLExt.objectToQueryString({ history: String(Math.round(historySeconds)) }) : '';
    return this._json<UsageReply>('usage' + query);
  }

  submitRequest(body: ShareRequestBody): Promise<ShareRequest> {
    return this._json<ShareRequest>('requests', { method: 'POST', body: JSON.stringify(body) });
  }

  getRequest(id: string): Promise<ShareRequest> {
    return this._json<ShareRequest>(`requests/${encodeURIComponent(id)}`);
  }

  /** The latest request, or null when there has been none (the server answers 204, no body). */
  async latestRequest(): Promise<ShareRequest | null> {
    return (await this._json<ShareRequest | null>('requests')) ?? null;
  }

  /**
   * Open `WS usage/stream`. `onMessage` gets each parsed sample; `onClose` is called once
   * when the socket closes or fails, with whether it ever delivered a message.
   */
  openUsageStream(
    onMessage: (message: UsageStreamMessage) => void,
    onClose: (delivered: boolean) => void
  ): WebSocket {
    let url = URLExt.join(this.settings.wsUrl, API_PATH, 'usage', 'stream');
    const token = this.settings.token;
    if (this.settings.appendToken && token) {
      url += `?token=${encodeURIComponent(token)}`;
    }
    const socket = new this.settings.WebSocket(url);
    let delivered = false;
    let closed = false;
    const close = () => {
      if (!closed) {
        closed = true;
        onClose(delivered);
      }
    };
    socket.onmessage = event => {
      try {
        const message = JSON.parse(String(event.data)) as UsageStreamMessage;
        delivered = true;
        onMessage(message);
      } catch {
        // a frame that is not JSON is not a sample; ignore it
      }
    };
    socket.onerror = close;
    socket.onclose = close;
    return socket;
  }

  private async _json<T>(path: string, init: RequestInit = {}): Promise<T> {
    const url = this.url(path);
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(url, init, this.settings);
    } catch (error) {
      throw new ApiError(`cannot reach the Jupyter server: ${(error as Error).message}`, null);
    }
    const text = await response.text();
    let data: unknown = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch {
        data = null;
      }
    }
    if (!response.ok) {
      const message =
        (data && typeof data === 'object' && 'message' in data && (data as { message?: string }).message) ||
        (data && typeof data === 'object' && 'reason' in data && (data as { reason?: string }).reason) ||
        `${response.status} ${response.statusText}`.trim();
      throw new ApiError(String(message), response.status);
    }
    return data as T;
  }
}
