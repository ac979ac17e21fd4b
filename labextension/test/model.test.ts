/**
 * The model's loops against a fake server extension: what it fetches when, how it moves
 * between the live stream, polling and idle, and how it follows a request.
 */

import { ApiError } from '../src/errors';
import { VgpuClientLike, VgpuModel } from '../src/model';
import { AllocationReply, ShareRequest, TopologyReply, UsageReply, UsageStreamMessage } from '../src/types';

class FakeSocket {
  closed = false;
  onmessage: ((event: { data: string }) => void) | null = null;
  onclose: (() => void) | null = null;
  onerror: (() => void) | null = null;
  close(): void {
    this.closed = true;
  }
}

class FakeServer implements VgpuClientLike {
  calls: string[] = [];
  t = 1000;
  usageFails = false;
  requests: ShareRequest[] = [];
  polls = 0;
  sockets: { socket: FakeSocket; onMessage: (m: UsageStreamMessage) => void; onClose: (d: boolean) => void }[] = [];

  allocation: AllocationReply = {
    state: 'allocated',
    source: 'node-api',
    message: null,
    allocation: {
      node: 'n1',
      namespace: 'jupyter',
      pod: 'jupyter-alice',
      podUid: 'uid-1',
      container: 'notebook',
      cores: 25,
      memoryMib: 4096,
      enforcement: 'hami-core',
      cards: [{ index: 1, uuid: 'GPU-1', model: 'A100', cores: 25, memoryMib: 4096, memoryTotalMib: 40960 }]
    }
  };

  async getAllocation(): Promise<AllocationReply> {
    this.calls.push('allocation');
    return this.allocation;
  }

  async getTopology(): Promise<TopologyReply> {
    this.calls.push('topology');
    return { state: 'available', source: 'node-api', message: null, topology: { node: 'n1', links: [], tree: null, gpus: [] } };
  }

  async getUsage(history = 0): Promise<UsageReply> {
    this.calls.push(`usage?history=${history}`);
    if (this.usageFails) {
      throw new ApiError('cannot reach the Jupyter server: Failed to fetch', null);
    }
    this.t += 1;
    return {
      state: 'live',
      source: 'node-api',
      message: null,
      periodSeconds: 1,
      limits: { cores: 25, memoryMib: 4096 },
      current: { t: this.t, memoryUsedMib: 100 + this.t, utilizationPercent: 10, cards: [] },
      history: history ? [{ t: this.t - 2, memoryUsedMib: 1, utilizationPercent: 1 }] : []
    };
  }

  async submitRequest(body: { cores: number; memory: string | number }): Promise<ShareRequest> {
    this.calls.push(`POST ${JSON.stringify(body)}`);
    if (body.cores === 1) {
      throw new ApiError('request r1 is still pending; wait for its outcome first', 400);
    }
    const request: ShareRequest = {
      id: 'r2',
      state: 'pending',
      message: 'asking',
      cores: body.cores,
      memoryUnits: 16,
      node: null,
      cards: [],
      progress: ['asking'],
      handed_over: false,
      created: 1,
      updated: 1
    };
    this.requests.push(request);
    return request;
  }

  requestDown = false;

  async getRequest(id: string): Promise<ShareRequest> {
    this.calls.push(`request ${id}`);
    if (this.requestDown) {
      throw new ApiError('cannot reach the Jupyter server: Failed to fetch', null);
    }
    this.polls += 1;
    const state = this.polls >= 3 ? 'scheduled' : 'pending';
    return { ...this.requests[0], state, message: state === 'scheduled' ? 'on n1, card 2' : 'waiting', node: 'n1' };
  }

  async latestRequest(): Promise<ShareRequest | null> {
    this.calls.push('latest');
    return null;
  }

  openUsageStream(onMessage: (m: UsageStreamMessage) => void, onClose: (d: boolean) => void): WebSocket {
    this.calls.push('stream');
    const socket = new FakeSocket();
    this.sockets.push({ socket, onMessage, onClose });
    return socket as unknown as WebSocket;
  }

  push(t: number): void {
    const live = this.sockets[this.sockets.length - 1];
    live.onMessage({
      state: 'live',
      source: 'node-api',
      message: null,
      limits: { cores: 25, memoryMib: 4096 },
      current: { t, memoryUsedMib: t, utilizationPercent: 5, cards: [] }
    });
  }

  count(prefix: string): number {
    return this.calls.filter(c => c.startsWith(prefix)).length;
  }
}

describe('VgpuModel', () => {
  let server: FakeServer;
  let model: VgpuModel;

  beforeEach(() => {
    jest.useFakeTimers();
    server = new FakeServer();
    model = new VgpuModel(server);
  });

  afterEach(() => {
    model.dispose();
    jest.useRealTimers();
  });

  it('fetches the allocation, then only polls slowly while the panel is hidden', async () => {
    await model.start();
    expect(server.calls.slice(0, 3).sort()).toEqual(['allocation', 'latest', 'topology']);
    await jest.advanceTimersByTimeAsync(25_000);
    // at 0 s, 10 s and 20 s with the default idle interval
    expect(server.count('usage?history=0')).toBe(3);
    expect(server.count('stream')).toBe(0);
    expect(model.transport).toBe('poll');
    expect(model.usage?.state).toBe('live');
  });

  it('seeds the chart with history and follows the stream while visible', async () => {
    await model.start();
    model.setLive(true);
    await jest.advanceTimersByTimeAsync(0);
    expect(server.calls).toContain('usage?history=120');
    expect(model.transport).toBe('stream');
    const seeded = model.series.points.length;
    expect(seeded).toBe(2); // one history point + the current sample
    server.push(1010);
    server.push(1011);
    server.push(1011); // a replay is not a new sample
    expect(model.series.points.length).toBe(seeded + 2);
    expect(model.usage?.current?.memoryUsedMib).toBe(1011);
    await jest.advanceTimersByTimeAsync(30_000);
    expect(server.count('usage?history=0')).toBe(0); // no polling while the stream delivers
  });

  it('falls back to polling at the refresh rate when the stream closes', async () => {
    await model.start();
    model.setLive(true);
    await jest.advanceTimersByTimeAsync(0);
    const before = server.count('usage?history=0');
    server.sockets[0].onClose(false);
    await jest.advanceTimersByTimeAsync(5_500);
    expect(server.count('usage?history=0') - before).toBe(5);
    expect(model.transport).toBe('poll');
  });

  it('closes the stream when the panel is hidden and goes back to the idle rate', async () => {
    await model.start();
    model.setLive(true);
    await jest.advanceTimersByTimeAsync(0);
    model.setLive(false);
    expect(server.sockets[0].socket.closed).toBe(true);
    const before = server.count('usage?history=0');
    await jest.advanceTimersByTimeAsync(15_000);
    expect(server.count('usage?history=0') - before).toBe(2); // now and after 10 s
  });

  it('applies new settings: window and refresh rate', async () => {
    await model.start();
    model.settings = { refreshSeconds: 2, chartWindowSeconds: 30, idleSeconds: 10, useStream: false };
    model.setLive(true);
    await jest.advanceTimersByTimeAsync(0);
    expect(server.calls).toContain('usage?history=30');
    const before = server.count('usage?history=0');
    await jest.advanceTimersByTimeAsync(6_500);
    expect(server.count('usage?history=0') - before).toBe(3); // at 2, 4 and 6 s (the seed was the first)
    expect(server.count('stream')).toBe(0);
    expect(model.series.windowSeconds).toBe(30);
  });

  it('reports an unreachable server and keeps the last limits', async () => {
    await model.start();
    await jest.advanceTimersByTimeAsync(0);
    server.usageFails = true;
    await jest.advanceTimersByTimeAsync(10_000);
    expect(model.usage).toMatchObject({
      state: 'unreachable',
      message: 'cannot reach the Jupyter server: Failed to fetch',
      limits: { cores: 25, memoryMib: 4096 },
      current: null
    });
  });

  it('follows a request until its outcome, then re-reads the allocation', async () => {
    await model.start();
    const changes: string[] = [];
    model.changed.connect(() => changes.push(model.requestView.request?.state ?? 'none'));
    await model.submit({ cores: 50, memory: 32 });
    expect(model.requestView.request?.state).toBe('pending');
    expect(model.requestView.startedAt).not.toBeNull();
    const allocations = server.count('allocation');
    await jest.advanceTimersByTimeAsync(3_000);
    expect(server.count('request r2')).toBe(3);
    expect(model.requestView.request).toMatchObject({ state: 'scheduled', message: 'on n1, card 2' });
    expect(model.requestView.startedAt).toBeNull();
    expect(server.count('allocation')).toBe(allocations + 1);
    await jest.advanceTimersByTimeAsync(5_000);
    expect(server.count('request r2')).toBe(3); // no polling after the outcome
    expect(changes).toContain('scheduled');
  });

  it('keeps following a request through an outage, backing off to 10 s', async () => {
    await model.start();
    await model.submit({ cores: 50, memory: 32 });
    server.requestDown = true;
    await jest.advanceTimersByTimeAsync(60_000);
    // after 1, 3, 7, 15, 25, 35, 45, 55 s
    expect(server.count('request r2')).toBe(8);
    expect(model.requestView.request?.state).toBe('pending');
    server.requestDown = false;
    await jest.advanceTimersByTimeAsync(10_000 + 3_000);
    expect(model.requestView.request?.state).toBe('scheduled');
  });

  it("shows the server's refusal of a submission", async () => {
    await model.start();
    await model.submit({ cores: 1, memory: 4 });
    expect(model.requestView).toEqual({
      request: null,
      startedAt: null,
      error: 'request r1 is still pending; wait for its outcome first'
    });
  });
});
