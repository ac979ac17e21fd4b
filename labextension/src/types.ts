/**
 * The JSON the jupyter_vgpu server extension serves under `{base_url}vgpu/api/`, named for
 * the panel. The shapes come from docs/server-api.yaml through `server-api.d.ts`, which
 * `npm run api:types` generates (and `npm run api:check` / the jest suite keep current):
 * edit the schema, never these types. Field names are the wire names.
 */

import type { components } from './server-api';

type Schemas = components['schemas'];

/** The source that answered; a plugged-in source may have another name. */
export type Source = Schemas['Source'];

export type AllocationCard = Schemas['AllocationCard'];
export type Allocation = Schemas['Allocation'];
export type AllocationReply = Schemas['AllocationReply'];

export type TreeNode = Schemas['TreeNode'];
export type TopologyGpu = Schemas['TopologyGpu'];
export type Topology = Schemas['Topology'];
export type TopologyReply = Schemas['TopologyReply'];

export type UsagePoint = Schemas['UsagePoint'];
export type UsageCurrent = Schemas['UsageCurrent'];
export type Limits = Schemas['Limits'];
export type UsageState = Schemas['UsageState'];
export type UsageReply = Schemas['UsageReply'];
/** One message of `WS usage/stream`. */
export type UsageStreamMessage = Schemas['UsageStreamMessage'];

export type RequestState = Schemas['ShareRequest']['state'];
export type RequestCard = Schemas['RequestCard'];
export type ShareRequest = Schemas['ShareRequest'];
/** The body of `POST requests`. */
export type ShareRequestBody = Schemas['ShareRequestBody'];

/** jupyter-server's JSON error body. */
export type ErrorBody = Schemas['Error'];
