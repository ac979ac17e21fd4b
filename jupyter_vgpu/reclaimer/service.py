"""``jupyter-vgpu reclaimer``: the JupyterHub service that gives idle GPU shares back.

Every ``period_seconds`` one pass: the Hub's active servers (REST API, the service's own
token and scopes), every vGPU pod's usage since the last pass (the node daemons' scrape
listeners, with the scrape token), then per server the pure policy (``policy.py``) and
what it decides: warn (with a deadline), withdraw a warning, or reclaim (restart on a
CPU-only server, restart on a smaller share, or stop: ``action``). Each step is an Event
on the pod, a log line and a counter (``record.py``). ``dry_run`` decides and logs, and
changes nothing: no Event, no warning shown, no server touched.

Its own HTTP API (under ``JUPYTERHUB_SERVICE_PREFIX``), for the notebook server (its
``JUPYTERHUB_API_TOKEN``), the user and admins, every call with ``Authorization: token``:

- ``GET api/v1/servers/<user>[/<server>]`` → the share's reclaim state (owner or admin);
- ``POST api/v1/servers/<user>[/<server>]/keep`` → "keep my GPU" (owner or admin);
- ``GET api/v1/servers`` → every tracked share (admins);
- ``GET metrics`` → the Prometheus counters (no names in them).

A token must be for this service (its access scope, as JupyterHub's HubAuthenticated requires)
or be a server's own token asking about that server; "admin" is decided on such a token only.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlparse

import tornado.web
from tornado.ioloop import IOLoop, PeriodicCallback
from traitlets import Bool, Dict, Float, Int, List, Unicode, default
from traitlets.config import Application

from .hubapi import HubClient, HubError, Server
from .hubconfig import ACCESS_SCOPE, acts_as_admin
from .nodes import NodeReader, PodUsage, ScrapeToken
from .policy import (
    ACT,
    CLEAR,
    UNKNOWN,
    WARN,
    Decision,
    Policy,
    PostponeRefused,
    ShareState,
    classify,
    describe,
    gpu_hours,
    postpone,
    step,
)
from .queue import QueueReader
from .record import (
    EVENT_CLEARED,
    EVENT_POSTPONED,
    EVENT_RECLAIMED,
    EVENT_WARNED,
    Counters,
    EventRecorder,
)

MAX_BODY_BYTES = 4096
"""Request body limit of the service's port: POST .../keep reads none."""

OVERRIDABLE = {
    "idle_utilization": "idle_utilization", "idle_memory_mib": "idle_memory_mib",
    "idle_minutes": "idle_seconds", "hoard_minutes": "hoard_seconds", "grace_minutes": "grace_seconds",
    "postpone_minutes": "postpone_seconds", "max_postpones": "max_postpones", "action": "action",
    "exempt": "exempt",
}
"""group_overrides keys (trait names) -> Policy fields (minutes become seconds)."""


@dataclass(frozen=True)
class Tracked:
    server: Server
    usage: PodUsage
    state: ShareState
    policy: Policy


def _minutes(name: str, value: Any) -> float:
    return float(value) * 60.0 if name.endswith("_minutes") else value


class VGPUReclaimer(Application):
    name = "jupyter-vgpu-reclaimer"
    description = "Give idle GPU shares back: warn their users, then reclaim them (a JupyterHub service)."

    # -- where things are ------------------------------------------------------------
    config_file = Unicode("", help="A Python config file (c.VGPUReclaimer.<trait> = ...).").tag(config=True)
    hub_api_url = Unicode(help="The Hub's REST API (default $JUPYTERHUB_API_URL).").tag(config=True)
    api_token = Unicode(help="The service's Hub token (default $JUPYTERHUB_API_TOKEN).").tag(config=True)
    service_prefix = Unicode(help="URL prefix of the service's API (default $JUPYTERHUB_SERVICE_PREFIX).").tag(
        config=True)
    bind_url = Unicode(help="Where the service's API listens (default $JUPYTERHUB_SERVICE_URL, "
                            "else http://127.0.0.1:10102).").tag(config=True)
    node_urls = List(Unicode(), help="Scrape-listener base URLs of the node daemons "
                                     "(http://<node>:5679); with node_selector, added to the discovered ones.").tag(
        config=True)
    node_selector = Unicode("", help="Label selector of the node daemon pods (e.g. "
                                     "app.kubernetes.io/name=vgpu-node) in node_namespace: their pod IPs and "
                                     "node_scrape_port are read each pass. Empty: node_urls only.").tag(config=True)
    node_namespace = Unicode("vgpu-system", help="Namespace of the node daemon pods (node_selector).").tag(
        config=True)
    node_scrape_port = Int(5679, help="The node daemons' scrape port (node_selector).").tag(config=True)
    scrape_token = Unicode("", help="The node daemons' scrape token (prefer scrape_token_file).").tag(config=True)
    scrape_token_file = Unicode("", help="File holding the scrape token (a mounted Secret key).").tag(config=True)
    queue_url = Unicode("", help="The scheduler extender's queue listener (http://vgpu-scheduler-queue.vgpu-system:3457):"
                                 " its waiting pods are listed on the admin page. Empty: not shown.").tag(config=True)
    queue_token = Unicode("", help="The extender's queue token (prefer queue_token_file).").tag(config=True)
    queue_token_file = Unicode("", help="File holding the queue token (a mounted Secret key).").tag(config=True)
    kubeconfig = Unicode("", help="Kubeconfig for Events and node discovery; empty: $KUBECONFIG, else the "
                                  "in-cluster service account.").tag(config=True)
    record_events = Bool(True, help="Record each step as a Kubernetes Event on the notebook pod.").tag(config=True)

    # -- policy ------------------------------------------------------------------------
    period_seconds = Float(60.0, help="Seconds between passes (keep it below the nodes' history, 900 s).").tag(
        config=True)
    idle_utilization = Float(1.0, help="A share computes when its utilisation (percent of one card) averaged "
                                       "over the time of a pass reaches this: one busy sample does not keep it."
                             ).tag(config=True)
    idle_memory_mib = Float(512.0, help="A quiet share holding less GPU memory (MiB) is idle; more, hoarding."
                            ).tag(config=True)
    idle_minutes = Float(60.0, help="Minutes a share may stay idle before its user is warned.").tag(config=True)
    hoard_minutes = Float(120.0, help="Minutes a share may hold memory without computing before its user is "
                                      "warned.").tag(config=True)
    grace_minutes = Float(15.0, help="Minutes between the warning and the reclaim.").tag(config=True)
    postpone_minutes = Float(60.0, help="Minutes one 'keep my GPU' adds to the deadline.").tag(config=True)
    max_postpones = Int(2, help="How many times a user may postpone one reclaim.").tag(config=True)
    action = Unicode("cpu", help="What reclaiming does: 'cpu' restarts the server without a GPU, 'shrink' on "
                                 "shrink_cores/shrink_memory_units, 'stop' stops it. The home volume stays.").tag(
        config=True)
    cpu_user_options = Dict({"vgpu_cores": 0, "vgpu_memory_units": 0},
                            help="user_options merged over the server's own for a CPU-only restart.").tag(
        config=True)
    shrink_cores = Int(10, help="Cores of the smaller share ('shrink'); a share no larger goes CPU-only.").tag(
        config=True)
    shrink_memory_units = Int(16, help="Memory units (256 MiB) of the smaller share ('shrink').").tag(config=True)
    exempt_groups = List(Unicode(), help="Hub groups whose servers are never reclaimed.").tag(config=True)
    group_overrides = Dict(help="Hub group -> policy overrides ({'students': {'idle_minutes': 20}}); keys: "
                                + ", ".join(OVERRIDABLE) + ". The first listed group a user is in applies."
                           ).tag(config=True)
    dry_run = Bool(False, help="Decide and log, change nothing (no warning shown, no Event, no server touched)."
                   ).tag(config=True)
    restart_timeout = Float(300.0, help="Seconds to wait for a reclaimed server to stop before restarting it.").tag(
        config=True)

    @default("hub_api_url")
    def _hub_api_url(self) -> str:
        import os

        return os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")

    @default("api_token")
    def _api_token(self) -> str:
        import os

        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    @default("service_prefix")
    def _service_prefix(self) -> str:
        import os

        return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/vgpu-reclaimer/")

    @default("bind_url")
    def _bind_url(self) -> str:
        import os

        return os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10102")

    def __init__(self, clock: Callable[[], float] = time.time, api_client: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.clock = clock
        self._api_client = api_client
        self.base_policy = Policy(
            idle_utilization=self.idle_utilization, idle_memory_mib=self.idle_memory_mib,
            idle_seconds=self.idle_minutes * 60, hoard_seconds=self.hoard_minutes * 60,
            grace_seconds=self.grace_minutes * 60, postpone_seconds=self.postpone_minutes * 60,
            max_postpones=self.max_postpones, action=self.action)
        self._overrides = self._check_overrides(self.group_overrides)
        self.shares: dict[tuple[str, str], Tracked] = {}
        self.journal: collections.deque[dict[str, Any]] = collections.deque(maxlen=500)
        """The last steps taken (warn, clear, keep, reclaim), for the admin page."""
        self.reclaims: dict[tuple[str, str], dict[str, Any]] = {}
        self.counters = Counters()
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._hub: HubClient | None = None
        self._nodes: NodeReader | None = None
        self._queue: QueueReader | None = None
        self._events: EventRecorder | None = None
        self._hub_auth: Any = None
        self.passes = 0

    def _check_overrides(self, table: Mapping[str, Any]) -> list[tuple[str, Policy]]:
        """Each group's policy, checked at start (a typo fails here, not at a reclaim)."""
        checked = []
        for group, override in table.items():
            if not isinstance(override, Mapping):
                raise ValueError(f"group_overrides[{group!r}] must be a dict, not {override!r}")
            unknown = set(override) - set(OVERRIDABLE)
            if unknown:
                raise ValueError(f"group_overrides[{group!r}]: unknown keys {sorted(unknown)}; "
                                 f"use {', '.join(OVERRIDABLE)}")
            changes: dict[str, Any] = {OVERRIDABLE[k]: _minutes(k, v) for k, v in override.items()}
            checked.append((str(group), replace(self.base_policy, **changes)))
        return checked

    def policy_for(self, groups: Iterable[str]) -> Policy:
        groups = set(groups)
        if groups & set(self.exempt_groups):
            return replace(self.base_policy, exempt=True)
        for group, policy in self._overrides:
            if group in groups:
                return policy
        return self.base_policy

    # -- collaborators (made on first use, in the running loop) -----------------------

    @property
    def hub(self) -> HubClient:
        if self._hub is None:
            self._hub = HubClient(self.hub_api_url, self.api_token)
        return self._hub

    @property
    def queue(self) -> QueueReader | None:
        if self._queue is None and self.queue_url:
            self._queue = QueueReader(self.queue_url, ScrapeToken(self.queue_token, self.queue_token_file))
        return self._queue

    @property
    def nodes(self) -> NodeReader:
        if self._nodes is None:
            self._nodes = NodeReader(ScrapeToken(self.scrape_token, self.scrape_token_file))
        return self._nodes

    def _kube(self) -> Any:
        if self._api_client is None:
            from kubernetes import client, config

            if self.kubeconfig:
                self._api_client = config.new_client_from_config(config_file=self.kubeconfig)
            else:
                try:
                    self._api_client = config.new_client_from_config()
                except Exception:  # no kubeconfig: the in-cluster service account
                    config.load_incluster_config()
                    self._api_client = client.ApiClient()
        return self._api_client

    @property
    def events(self) -> EventRecorder:
        if self._events is None:
            self._events = EventRecorder(self._kube() if self.record_events and not self.dry_run else None)
        return self._events

    async def node_urls_now(self) -> list[str]:
        urls = list(self.node_urls)
        if self.node_selector:
            from kubernetes import client

            api = client.CoreV1Api(self._kube())
            try:
                pods = await asyncio.get_running_loop().run_in_executor(
                    None, lambda: api.list_namespaced_pod(self.node_namespace, label_selector=self.node_selector))
            except Exception as error:
                self.log.warning("cannot list the node daemons (%s): %s", self.node_selector, error)
            else:
                urls += [f"http://{p.status.pod_ip}:{self.node_scrape_port}" for p in pods.items
                         if p.status and p.status.pod_ip and p.status.phase == "Running"]
        return urls

    # -- one pass ---------------------------------------------------------------------------

    async def run_once(self) -> None:
        started = time.perf_counter()
        now = self.clock()
        servers = await self.hub.active_servers()
        urls = await self.node_urls_now()
        usage = await self.nodes.read(urls)
        if self.queue is not None:
            await self.queue.read()
        everyone_answered = not any(url in self.nodes.problems for url in urls)
        self.counters.nodes_unreachable.set(sum(url in self.nodes.problems for url in urls))
        seen = set()
        for server in servers:
            if not server.ready or server.pending or not server.pod or server.key in self._tasks:
                if server.key in self.shares:
                    seen.add(server.key)
                continue
            pod = usage.get((server.namespace or "", server.pod))
            tracked = self.shares.get(server.key)
            if pod is None:
                if tracked is None or everyone_answered:
                    continue  # no vGPU share (a CPU server), or it gave it back
                pod = replace(tracked.usage, points=())  # its node did not answer: unknown
            elif tracked is None or tracked.usage.uid != pod.uid:
                tracked = Tracked(server, pod, ShareState(), self.base_policy)  # a new share (or server)
            seen.add(server.key)
            policy = self.policy_for(server.groups)
            kind = classify(pod.points, policy) if pod.points else UNKNOWN
            state, decision = step(tracked.state, kind, now, policy)
            tracked = Tracked(server, pod, state, policy)
            self.shares[server.key] = tracked
            await self._carry_out(tracked, decision, now)
        for key in set(self.shares) - seen:
            del self.shares[key]
        self.passes += 1
        self.counters.pass_seconds.set(time.perf_counter() - started)

    def _quiet_minutes(self, tracked: Tracked, now: float) -> float:
        since = tracked.state.quiet_since
        return 0.0 if since is None else (now - since) / 60.0

    async def _carry_out(self, tracked: Tracked, decision: Decision, now: float) -> None:
        if decision.kind not in (WARN, CLEAR, ACT):
            return
        server, pod = tracked.server, tracked.usage
        who = f"{server.user}/{server.name}" if server.name else server.user
        if self.dry_run:
            self.counters.dry_run.labels(decision.kind, decision.reason).inc()
            self.log.info("dry run: would %s %s's share (pod %s/%s, %s for %.0f min)", decision.kind, who,
                          pod.namespace, pod.pod, decision.reason or "active", self._quiet_minutes(tracked, now))
            return
        self._journal(now, server, decision.kind, decision.reason, "")
        if decision.kind == WARN:
            self.counters.warnings.labels(decision.reason).inc()
            message = (f"GPU share {decision.reason} for {self._quiet_minutes(tracked, now):.0f} min: it will be "
                       f"reclaimed ({tracked.policy.action}) in {tracked.policy.grace_seconds / 60:.0f} min "
                       f"unless it computes again or its user keeps it")
            self.log.warning("warned %s: %s", who, message)
            await self.events.event(pod.namespace, pod.pod, pod.uid, EVENT_WARNED, message, warning=True)
        elif decision.kind == CLEAR:
            self.log.info("warning withdrawn for %s: the share computes again (or is exempt)", who)
            await self.events.event(pod.namespace, pod.pod, pod.uid, EVENT_CLEARED,
                                    "GPU share in use again: reclaim cancelled")
        else:
            await self._reclaim(tracked, now)

    async def _reclaim(self, tracked: Tracked, now: float) -> None:
        server, pod, policy = tracked.server, tracked.usage, tracked.policy
        action, options = self._action_for(tracked)
        hours = gpu_hours(pod.cores, tracked.state, now)
        quiet = self._quiet_minutes(tracked, now)
        what = {"cpu": "restarted without a GPU", "shrink": f"restarted on a {self.shrink_cores} % share",
                "stop": "stopped"}[action]
        message = (f"GPU share reclaimed: {tracked.state.kind} for {quiet:.0f} min "
                   f"({pod.cores} % of a card, {pod.memory_mib} MiB); the server is {what}, its files stay")
        self.counters.reclaimed.labels(tracked.state.kind, action).inc()
        self.counters.gpu_hours.labels(tracked.state.kind).inc(hours)
        who = f"{server.user}/{server.name}" if server.name else server.user
        self.log.warning("reclaimed %s (pod %s/%s): %s; %.3f GPU-hours returned", who, pod.namespace, pod.pod,
                         message, hours)
        await self.events.event(pod.namespace, pod.pod, pod.uid, EVENT_RECLAIMED, message, warning=True)
        self.reclaims[server.key] = {
            "at": now, "reason": tracked.state.kind, "action": action, "message": message, "outcome": "pending",
            "cores": pod.cores, "memoryMib": pod.memory_mib, "quietSeconds": round(quiet * 60, 1),
            "postpones": tracked.state.postpones, "policyAction": policy.action,
        }
        self.journal[-1]["message"] = message
        self._tasks[server.key] = asyncio.ensure_future(self._restart(server, action, options))

    def _journal(self, now: float, server: Server, step: str, reason: str, message: str) -> None:
        self.journal.append({"at": now, "user": server.user, "server": server.name, "step": step,
                             "reason": reason, "message": message})

    def _action_for(self, tracked: Tracked) -> tuple[str, dict[str, Any] | None]:
        action = tracked.policy.action
        if action == "shrink" and (tracked.usage.cores <= self.shrink_cores):
            action = "cpu"  # already no larger than the smaller share: give the GPU back
        if action == "stop":
            return action, None
        options = dict(tracked.server.user_options)
        if action == "cpu":
            options.update(self.cpu_user_options)
        else:
            options.update({"vgpu_cores": self.shrink_cores, "vgpu_memory_units": self.shrink_memory_units})
        return action, options

    async def _restart(self, server: Server, action: str, options: dict[str, Any] | None) -> None:
        record = self.reclaims[server.key]
        try:
            await self.hub.stop(server)
            deadline = time.monotonic() + self.restart_timeout
            while (await self.hub.server(server.user, server.name)) is not None:
                if time.monotonic() > deadline:
                    raise HubError(f"the server did not stop within {self.restart_timeout:.0f} s")
                await asyncio.sleep(0.5)
            if options is not None:
                await self.hub.start(server, options)
            record["outcome"] = "done"
        except HubError as error:
            record["outcome"] = "failed"
            record["message"] += f" (failed: {error})"
            self.log.error("reclaiming %s's server failed: %s", server.user, error)
        finally:
            self._tasks.pop(server.key, None)
            self.shares.pop(server.key, None)  # the server that held the share is gone

    async def wait_idle(self) -> None:
        """Wait for the restarts under way (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    # -- what users and admins see -------------------------------------------------------

    def view(self, user: str, server: str) -> dict[str, Any]:
        now = self.clock()
        tracked = self.shares.get((user, server))
        body: dict[str, Any] = {"user": user, "server": server, "dryRun": self.dry_run, "now": now}
        if tracked is None:
            body.update({"phase": "none", "reason": None, "quietSeconds": None, "deadline": None,
                         "secondsLeft": None, "postponesLeft": None, "postponeSeconds": None,
                         "action": self.policy_for(()).action})
        else:
            body.update(describe(tracked.state, now, tracked.policy))
            body["cores"], body["memoryMib"] = tracked.usage.cores, tracked.usage.memory_mib
        body["lastReclaim"] = self.reclaims.get((user, server))
        return body

    async def keep(self, user: str, server: str) -> dict[str, Any]:
        """"Keep my GPU"; PostponeRefused (for the user) when it cannot."""
        tracked = self.shares.get((user, server))
        if tracked is None:
            raise PostponeRefused("this server holds no GPU share the reclaimer watches")
        now = self.clock()
        state = postpone(tracked.state, now, tracked.policy)
        self.shares[(user, server)] = replace(tracked, state=state)
        self.counters.postpones.inc()
        self._journal(now, tracked.server, "keep", tracked.state.kind, f"postpone {state.postpones} of "
                      f"{tracked.policy.max_postpones}")
        self.log.info("%s kept the GPU share of %s/%s until %.0f (postpone %d of %d)", user, user, server,
                      state.deadline or 0, state.postpones, tracked.policy.max_postpones)
        if not self.dry_run:
            pod = tracked.usage
            await self.events.event(pod.namespace, pod.pod, pod.uid, EVENT_POSTPONED,
                                    f"the user kept the GPU share (postpone {state.postpones} of "
                                    f"{tracked.policy.max_postpones})")
        return self.view(user, server)

    def all_views(self) -> list[dict[str, Any]]:
        return [self.view(user, server) for user, server in sorted(self.shares)]

    # -- HTTP --------------------------------------------------------------------------

    @property
    def hub_auth(self) -> Any:
        if self._hub_auth is None:
            from jupyterhub.services.auth import HubAuth

            self._hub_auth = _with_access_scope(HubAuth(api_url=self.hub_api_url, api_token=self.api_token,
                                                        cache_max_age=30))
        return self._hub_auth

    @property
    def hub_oauth(self) -> Any:
        if getattr(self, "_hub_oauth", None) is None:
            import os

            from jupyterhub.services.auth import HubOAuth

            self._hub_oauth = _with_access_scope(HubOAuth(
                api_url=self.hub_api_url, api_token=self.api_token, cache_max_age=30,
                oauth_client_id=os.environ.get("JUPYTERHUB_CLIENT_ID", "service-vgpu-reclaimer")))
        return self._hub_oauth

    def make_app(self) -> tornado.web.Application:
        from .admin import AdminPage, OAuthCallback

        prefix = "/" + self.service_prefix.strip("/") + "/"
        context = {"reclaimer": self}
        return tornado.web.Application([
            (prefix + r"admin/?", AdminPage, context),
            (prefix + r"oauth_callback", OAuthCallback, context),
            (prefix + r"api/v1/servers/?", AllHandler, context),
            (prefix + r"api/v1/servers/([^/]+)(?:/([^/]*))?/keep/?", KeepHandler, context),
            (prefix + r"api/v1/servers/([^/]+)(?:/([^/]*))?/?", ServerHandler, context),
            (prefix + r"metrics", MetricsHandler, context),
        ], cookie_secret=os.urandom(32))

    def listen(self) -> Any:
        """Serve the API at ``bind_url`` on the current event loop; the HTTPServer."""
        url = urlparse(self.bind_url)
        # only POST .../keep takes a request, and reads no body: refuse one before it is buffered
        # (tornado's defaults would hold 100 MB per request in the Hub's pod)
        return self.make_app().listen(url.port or 80, url.hostname or "127.0.0.1", max_body_size=MAX_BODY_BYTES,
                                      max_buffer_size=1 << 20)

    def start(self) -> None:
        """Serve the API and run a pass every period, until interrupted."""
        self.listen()
        self.log.info("vGPU reclaimer on %s%s: every %.0f s, action %s%s", self.bind_url, self.service_prefix,
                      self.period_seconds, self.action, " (DRY RUN)" if self.dry_run else "")
        loop = IOLoop.current()

        async def tick() -> None:
            try:
                await self.run_once()
            except HubError as error:
                self.log.error("pass skipped: %s", error)
            except Exception:
                self.log.exception("pass failed")

        PeriodicCallback(tick, self.period_seconds * 1000).start()
        loop.add_callback(tick)
        loop.start()


def _with_access_scope(auth: Any) -> Any:
    """``auth`` requiring this service's access scope: the Hub hands a managed service its own in
    the environment (HubAuth's default); an external one (``api_token``) gets none from there."""
    if not auth.access_scopes:
        auth.access_scopes = {ACCESS_SCOPE}
    return auth


class _Handler(tornado.web.RequestHandler):
    def initialize(self, reclaimer: VGPUReclaimer) -> None:
        self.reclaimer = reclaimer
        self.identity: dict[str, Any] = {}
        self.for_this_service = False

    def reply(self, status: int, body: Any) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.reply(status_code, {"message": self._reason})

    async def prepare(self) -> None:
        scheme, _, token = (self.request.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() not in ("token", "bearer") or not token.strip():
            self.reply(401, {"message": "send 'Authorization: token <your Hub or server token>'"})
            return
        try:
            model = await self.reclaimer.hub_auth.user_for_token(token.strip(), sync=False)
        except Exception as error:
            self.reply(503, {"message": f"the Hub cannot check the token now: {error}"})
            return
        if not model:
            self.reply(403, {"message": "the Hub does not know this token"})
            return
        self.identity = model
        auth = self.reclaimer.hub_auth
        self.for_this_service = bool(auth.check_scopes(auth.access_scopes, model))
        if not (self.for_this_service or self.server_token_of(*self.path_args)):
            self.reply(403, {"message": "this token is not for the GPU reclaimer: use your own token, or "
                                        "your server's for that server"})

    def server_token_of(self, user: str | None = None, server: str | None = None) -> bool:
        """Whether the token is its owner's, with access to this one server of theirs: a notebook
        server's own token asking about that server (it carries no access to services)."""
        return (user is not None and self.identity.get("kind") == "user" and self.identity.get("name") == user
                and bool(self.reclaimer.hub_auth.check_scopes(f"access:servers!server={user}/{server or ''}",
                                                              self.identity)))

    @property
    def admin(self) -> bool:
        return self.for_this_service and acts_as_admin(self.identity)

    def check_owner(self, user: str) -> bool:
        mine = self.identity.get("kind", "user") == "user" and self.identity.get("name") == user
        if not (mine or self.admin):
            self.reply(403, {"message": "only the server's owner or an admin may see or keep its share"})
            return False
        return True


class ServerHandler(_Handler):
    def get(self, user: str, server: str | None = None) -> None:
        if self.check_owner(user):
            self.reply(200, self.reclaimer.view(user, server or ""))


class KeepHandler(_Handler):
    async def post(self, user: str, server: str | None = None) -> None:
        if not self.check_owner(user):
            return
        try:
            self.reply(200, await self.reclaimer.keep(user, server or ""))
        except PostponeRefused as error:
            self.reply(409, {"message": str(error)})


class AllHandler(_Handler):
    def get(self) -> None:
        if not self.admin:
            self.reply(403, {"message": "admins only"})
            return
        self.reply(200, {"dryRun": self.reclaimer.dry_run, "servers": self.reclaimer.all_views(),
                         "nodeProblems": dict(self.reclaimer.nodes.problems)})


class MetricsHandler(tornado.web.RequestHandler):
    def initialize(self, reclaimer: VGPUReclaimer) -> None:
        self.reclaimer = reclaimer

    def get(self) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.reclaimer.counters.registry))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[%(levelname).1s %(asctime)s %(name)s] %(message)s")
    app = VGPUReclaimer()
    app.parse_command_line(argv)
    if app.config_file:
        app.load_config_file(app.config_file)
    # the policy is built from the traits at construction: build it from the loaded config
    reclaimer = VGPUReclaimer(config=app.config)
    reclaimer.start()
    return 0
