/**
 * The JSON the jupyter_vgpu server extension serves under `{base_url}vgpu/api/`
 * (docs/internals.md, "Server extension"). Field names are the wire names.
 */

export type Source = 'node-api' | 'gpu-manager' | 'local-nvml' | 'none';

export interface AllocationCard {
  index: number;
  uuid: string;
  model: string;
  cores: number;
  memoryMib: number;
  memoryTotalMib: number;
}

export interface Allocation {
  node: string;
  namespace?: string;
  pod?: string;
  podUid?: string;
  container?: string;
  cores: number;
  memoryMib: number;
  enforcement?: string;
  cards: AllocationCard[];
}

export interface AllocationReply {
  state: 'allocated' | 'none' | 'unreachable';
  source: Source;
  message: string | null;
  allocation: Allocation | null;
}

export interface TreeNode {
  level: string;
  gpus: number[];
  children: TreeNode[];
}

export interface TopologyGpu {
  index: number;
  uuid?: string;
  model?: string;
  memoryMib?: number;
  numa?: number | null;
  healthy?: boolean;
  mine: boolean;
  /** The caller's own share of this card (0 when not mine). */
  myCores?: number;
  myMemoryMib?: number;
  /** Everything held on the card, the caller's share included. */
  allocatedCores?: number;
  allocatedMemoryMib?: number;
  /** How many other holders the card has (anonymous). */
  tenants?: number;
  memoryUsedMib?: number | null;
  utilizationPercent?: number | null;
}

export interface Topology {
  node: string;
  links?: string[][];
  tree?: TreeNode | null;
  gpus: TopologyGpu[];
}

export interface TopologyReply {
  state: 'allocated' | 'none' | 'unreachable';
  source: Source;
  message: string | null;
  topology: Topology | null;
}

export interface UsagePoint {
  /** Unix time in seconds. */
  t: number;
  memoryUsedMib: number;
  utilizationPercent: number;
}

export interface UsageCurrent extends UsagePoint {
  cards?: { index: number; memoryUsedMib: number; utilizationPercent: number }[];
}

export interface Limits {
  cores: number;
  memoryMib: number;
}

export type UsageState = 'live' | 'stale' | 'unreachable' | 'none';

export interface UsageReply {
  state: UsageState;
  source?: Source;
  message?: string | null;
  periodSeconds?: number;
  limits: Limits | null;
  current: UsageCurrent | null;
  history?: UsagePoint[];
}

/** One message of `WS usage/stream`. */
export interface UsageStreamMessage {
  state: UsageState;
  current: UsageCurrent | null;
  limits: Limits | null;
  message?: string | null;
}

export type RequestState = 'pending' | 'scheduled' | 'failed';

export interface ShareRequest {
  id: string;
  state: RequestState;
  message: string | null;
  cores: number;
  memoryUnits: number;
  node?: string | null;
  /** The cards of a scheduled request. */
  cards?: RequestCard[] | null;
}

export interface RequestCard {
  index: number;
  uuid?: string;
  cores?: number;
  memoryMib?: number;
}

/** The body of `POST requests`. */
export interface ShareRequestBody {
  cores: number;
  memory: string | number;
}
