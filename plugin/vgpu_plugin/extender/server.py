"""The extender's HTTP server (tornado) and its Python API.

``POST {prefix}/filter``, ``{prefix}/prioritize``, ``{prefix}/bind`` speak
kube-scheduler's extender JSON; ``GET /healthz``, ``/metrics`` and ``/inspect`` are for
probes, Prometheus and admins. Bad requests get a 400 with the reason in the reply's
``Error`` field (kube-scheduler shows it); a pod the extender cannot handle gets the
reason in ``Error`` of a 200 reply, which kube-scheduler turns into a scheduling
failure. No reply ever carries a traceback.

The three POST verbs are answered by ``PostFront`` (front.py) straight from tornado's
connection, without a RequestHandler per request; every other request goes through the
tornado Application below.

``Extender(...).start()`` returns once the port is bound; the server runs on its own
thread with its own event loop, binds run on a fixed set of worker threads (they call the API;
bind_workers.py), and a bind that must wait for a rival pod on its node waits on the loop,
holding no worker (rival_waits.py).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import socket
import ssl
import threading
import time
from collections.abc import Collection
from typing import Any

import tornado.httpserver
import tornado.netutil
import tornado.web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import CORES_PER_CARD, MEMORY_UNIT_MIB, Names

from .bind_workers import BindWorkers, WorkersStopped
from .decisions import ADMISSION_BACKLOG, RIVAL_WAIT, Decisions, PodAPI, PodProblem, RivalWait
from .front import INTERNAL_ERROR, Answer, Post, PostFront, Reply
from .headroom import HostHeadroom
from .ledger import Ledger
from .notices import QueueNotifier
from .queue_access import QueueAuth, QueueCache, one_pod, valid_name
from .rival_waits import RivalWaits, RivalWaitsClosed, Waited
from .waiting import NodeRooms, queue_report
from .wire import (
    ExtenderBindingArgs,
    WireError,
    binding_result,
    decode_binding_args,
    decode_extender_args,
    dumps,
    filter_result,
    priority_list,
)

log = logging.getLogger(__name__)

DEFAULT_PORT = 3456
DEFAULT_PREFIX = "/scheduler"
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ExtenderMetrics:
    """The extender's own series, in a registry of its own (several extenders may share a process)."""

    def __init__(self, ledger: Ledger) -> None:
        self.registry = CollectorRegistry()
        self.seconds = Histogram(contract.METRIC_EXTENDER_REQUEST_SECONDS,
                                 "Time to answer a scheduler request", ["verb"],
                                 buckets=_BUCKETS, registry=self.registry)
        self.decisions = Counter(contract.METRIC_EXTENDER_DECISIONS,
                                 "Decisions: per node for filter, per request for prioritize and bind",
                                 ["verb", "outcome"], registry=self.registry)
        self.rival_waits = Histogram(contract.METRIC_EXTENDER_RIVAL_WAIT_SECONDS,
                                     "Binds that waited for a rival pod's admission on their node, and how long",
                                     ["outcome"], buckets=_BUCKETS + (10.0, 20.0, 30.0), registry=self.registry)
        pods = Gauge(contract.METRIC_EXTENDER_LEDGER_PODS, "Pods in the ledger", ["state"],
                     registry=self.registry)
        nodes = Gauge(contract.METRIC_EXTENDER_NODES, "Nodes the extender knows", registry=self.registry)
        for state in ("held", "assumed", "unattributed"):
            pods.labels(state).set_function(lambda state=state: _ledger_count(ledger, state))
        nodes.set_function(lambda: ledger.stats()["nodes"])
        self._children: dict[tuple[str, ...], Any] = {}

    def decided(self, verb: str, outcome: str) -> Any:
        """The decisions counter for (verb, outcome); children are cached, label lookup is not free."""
        child = self._children.get((verb, outcome))
        if child is None:
            child = self._children[(verb, outcome)] = self.decisions.labels(verb, outcome)
        return child

    def timer(self, verb: str) -> Any:
        child = self._children.get((verb,))
        if child is None:
            child = self._children[(verb,)] = self.seconds.labels(verb)
        return child


def _ledger_count(ledger: Ledger, state: str) -> int:
    stats = ledger.stats()
    return {"held": stats["pods"] - stats["assumed"], "assumed": stats["assumed"],
            "unattributed": stats["unattributed"]}[state]


class _Handler(tornado.web.RequestHandler):
    def initialize(self, extender: Extender) -> None:
        self.extender = extender

    def write_json(self, value: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(dumps(value))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        # never a traceback, always JSON with the verb's Error field (a 500 as the front answers it)
        self.set_header("Content-Type", "application/json")
        self.finish(INTERNAL_ERROR if status_code == 500 else dumps({"Error": self._reason}))


class _VerbOtherMethods(_Handler):
    """A verb's path for any method but POST (PostFront answers POST): tornado's 405, as JSON."""


def answer_filter(extender: Extender, body: bytes) -> Reply:
    """``POST {prefix}/filter``: ExtenderFilterResult, in the request's mode."""
    metrics = extender.metrics
    try:
        args = decode_extender_args(body)
    except WireError as error:
        metrics.decided("filter", "bad-request").inc()
        return 400, dumps(filter_result(None, [], {}, {}, str(error)))
    not_ready = extender.not_ready()
    if not_ready:
        metrics.decided("filter", "not-ready").inc()
        return 200, dumps(filter_result(args, [], {}, {}, not_ready))
    try:
        found = extender.decisions.filter(args)
    except PodProblem as problem:
        metrics.decided("filter", "no-vgpu").inc()
        return 200, dumps(filter_result(args, [], {}, {}, str(problem)))
    for outcome, count in (("fits", len(found.passed)), ("unfit", found.failed_count),
                           ("unresolvable", found.unresolvable_count)):
        if count:
            metrics.decided("filter", outcome).inc(count)
    return 200, dumps(filter_result(args, found.passed, found.failed, found.unresolvable))


def answer_prioritize(extender: Extender, body: bytes) -> Reply:
    """``POST {prefix}/prioritize``: HostPriorityList."""
    metrics = extender.metrics
    try:
        args = decode_extender_args(body)
        not_ready = extender.not_ready()
        if not_ready:
            metrics.decided("prioritize", "not-ready").inc()
            return 503, dumps({"Error": not_ready})
        scores = extender.decisions.prioritize(args)
    except (WireError, PodProblem) as error:
        metrics.decided("prioritize", "bad-request").inc()
        return 400, dumps({"Error": str(error)})
    metrics.decided("prioritize", "scored").inc()
    return 200, dumps(priority_list(scores))


async def answer_bind(extender: Extender, body: bytes) -> Reply:
    """``POST {prefix}/bind``: ExtenderBindingResult, once bound (or refused); one decision counted."""
    metrics = extender.metrics
    try:
        args = decode_binding_args(body)
    except WireError as error:
        metrics.decided("bind", "bad-request").inc()
        return 400, dumps(binding_result(str(error)))
    not_ready = extender.not_ready()
    if not_ready:
        metrics.decided("bind", "not-ready").inc()
        return 200, dumps(binding_result(not_ready))
    try:
        refusal = await _bind(extender, args)
    except (WorkersStopped, RivalWaitsClosed) as stopping:
        metrics.decided("bind", "not-ready").inc()
        return 200, dumps(binding_result(f"{stopping}; try again"))
    metrics.decided("bind", "refused" if refusal else "bound").inc()
    if refusal:
        log.info("bind %s/%s -> %s refused: %s", args.pod_namespace, args.pod_name, args.node, refusal)
    return 200, dumps(binding_result(refusal))


async def _bind(extender: Extender, args: ExtenderBindingArgs) -> str:
    """Bind steps on the bind workers; a wait for a rival pod on the node between two of them here
    on the loop, holding no worker (decisions.RivalWait, rival_waits.py)."""
    decisions, waits = extender.decisions, extender.rival_waits
    deadline = time.monotonic() + decisions.rival_wait
    while True:
        answer = await extender.binds.submit(args)
        if not isinstance(answer, RivalWait):
            return answer
        started = time.monotonic()
        waited = await waits.wait(answer.node, functools.partial(answer.settled, decisions.ledger), deadline)
        extender.metrics.rival_waits.labels(waited.name.lower()).observe(time.monotonic() - started)
        if waited is Waited.LATE:
            return decisions.rival_refusal(args, answer)
        if waited is Waited.FULL:
            return decisions.rival_refusal(args, answer, waiting=waits.limit)


class HealthHandler(_Handler):
    def get(self) -> None:
        not_ready = self.extender.not_ready()
        self.set_status(503 if not_ready else 200)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(not_ready or "ok")


class MetricsHandler(_Handler):
    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.extender.metrics.registry))


class InspectHandler(_Handler):
    def get(self) -> None:
        only = self.get_query_argument("node", None)
        view = self.extender.view
        report = inspect(self.extender.ledger, self.extender.decisions.policy,
                         view.synced if view is not None else True, only)
        report["syncSeconds"] = round(view.sync_seconds, 3) if view is not None and view.sync_seconds else None
        self.write_json(report)


class QueueHandler(_Handler):
    """``GET /queue[?namespace=&pod=]``: pending vGPU pods in order, why each waits, what fits
    now (waiting.py); to the queue token's bearer only (queue_access.py)."""

    def prepare(self) -> None:
        refused = self.extender.queue_auth.check(self.request.headers.get("Authorization"))
        if refused is not None:
            status, reason = refused
            self.set_header("Cache-Control", "no-store")
            if status == 401:
                self.set_header("WWW-Authenticate", 'Bearer realm="vgpu-queue"')
            self.write_json({"Error": reason}, status)

    def get(self) -> None:
        namespace = self.get_query_argument("namespace", None)
        pod = self.get_query_argument("pod", None)
        self.set_header("Cache-Control", "no-store")
        if namespace is None and pod is None:
            return self.write_json(self.extender.queue.report())
        if not (namespace and pod and valid_name(namespace) and valid_name(pod)):
            return self.write_json({"Error": "give both ?namespace= and ?pod=, as Kubernetes names"}, 400)
        self.write_json(one_pod(self.extender.queue.report(), namespace, pod))


def inspect(ledger: Ledger, policy: str, synced: bool, only: str | None = None) -> dict[str, Any]:
    """Per node and card: capacity, held shares by pod, free capacity."""
    nodes = []
    with ledger.lock:
        names = sorted(ledger.node_names()) if only is None else [only]
        for name in names:
            entry = ledger.node(name)
            if entry is None:
                continue
            holders: dict[int, list[dict[str, Any]]] = {card.index: [] for card in entry.cards}
            sizes = {s.uuid: s.slice for s in entry.slices}
            slice_holders: dict[str, dict[str, Any]] = {}
            for holding in entry.pods.values():
                for container, share in holding.shares():
                    if share.mig_device:  # a slice is held whole: its real size, and what was asked
                        held = sizes.get(share.mig_device)
                        slice_holders[share.mig_device] = {
                            "namespace": holding.namespace, "pod": holding.name, "uid": holding.uid,
                            "container": container, "askedCores": share.cores,
                            "askedMemoryMib": share.memory_units * MEMORY_UNIT_MIB, "assumed": holding.assumed,
                            "cores": held.cores if held is not None else share.cores,
                            "memoryMib": held.memory_mib if held is not None else share.memory_mib,
                        }
                        continue
                    if share.index in holders:
                        holders[share.index].append({
                            "namespace": holding.namespace, "pod": holding.name, "uid": holding.uid,
                            "container": container, "cores": share.cores,
                            "memoryMib": share.memory_units * MEMORY_UNIT_MIB, "assumed": holding.assumed,
                        })
            cards = []
            for i, card in enumerate(entry.cards):
                held_memory = entry.used_memory[i]
                cards.append({
                    "index": card.index, "uuid": card.uuid, "model": card.model, "healthy": card.healthy,
                    "cores": {"capacity": CORES_PER_CARD, "held": entry.used_cores[i],
                              "free": max(0, CORES_PER_CARD - entry.used_cores[i])},
                    "memoryMib": {"capacity": card.memory_units * MEMORY_UNIT_MIB,
                                  "held": held_memory * MEMORY_UNIT_MIB,
                                  "free": max(0, card.memory_units - held_memory) * MEMORY_UNIT_MIB},
                    "holders": sorted(holders[card.index], key=lambda h: (h["namespace"], h["pod"])),
                    **({"slices": [{"uuid": s.uuid, "profile": s.profile, "cores": s.cores, "memoryMib": s.memory_mib,
                                    "placeable": s.placeable, "holder": slice_holders.get(s.uuid)}
                                   for s in card.slices]} if card.mig else {}),
                })
            nodes.append({
                "name": name, "known": entry.known, "source": entry.source, "problem": entry.problem,
                "sharing": entry.sharing.mode,
                "cards": cards,
                "unattributed": [{"namespace": u.namespace, "pod": u.name, "uid": u.uid, "reason": u.reason}
                                 for u in entry.unattributed.values()],
                "unknownCards": [{"uid": uid, "card": share.index, "cores": share.cores}
                                 for uid, share in entry.orphans],
            })
        stats = ledger.stats()
    return {"synced": synced, "policy": policy, "ledger": stats, "nodes": nodes}


class Extender:
    """The extender as an object: ``start()`` (non-blocking) and ``stop()``.

    Give ``api_client`` (an official-client ApiClient) to watch and bind against a
    cluster. ``ledger``/``api`` can be given instead for an extender fed by hand.

    ``metrics_port`` (None: off) opens a second listener, by default on every address,
    with only ``/metrics``, ``/healthz`` and ``/queue``: Prometheus, probes and the Hub can
    reach those while filter/prioritize/bind (and ``/inspect``, which names pods) stay on the
    loopback. ``/queue`` wants ``queue_token`` (or the file ``queue_token_file`` holding it)
    on either listener; with neither it refuses everyone.

    ``tls_cert``/``tls_key`` serve the scheduler's listener over HTTPS (kube-scheduler's
    ``enableHTTPS``); with ``client_ca`` a client certificate signed by that CA is
    required (its ``tlsConfig.certFile``/``keyFile``), for an extender that is not a
    sidecar on the loopback.

    ``scheduler_names`` are the kube-scheduler profiles this extender serves: a pod that is
    not bound yet holds the cards its annotations name only when it belongs to one of them
    and asks for a vGPU (anyone can write annotations on a pod of another scheduler).
    """

    def __init__(self, *, port: int = DEFAULT_PORT, address: str = "127.0.0.1",
                 prefix: str = DEFAULT_PREFIX, policy: str = "binpack",
                 names: Names = contract.DEFAULT_NAMES, api_client: Any = None,
                 api: PodAPI | None = None, ledger: Ledger | None = None,
                 assume_ttl: float = 60.0, bind_workers: int = 8,
                 metrics_port: int | None = None, metrics_address: str = "",
                 tls_cert: str | None = None, tls_key: str | None = None,
                 client_ca: str | None = None,
                 scheduler_names: Collection[str] = (contract.SCHEDULER_NAME,),
                 queue_notice_interval: float | None = 5.0,
                 queue_token: str | None = None, queue_token_file: str | None = None,
                 queue_max_age: float = 1.0, rival_wait: float = RIVAL_WAIT,
                 admission_backlog: int = ADMISSION_BACKLOG) -> None:
        self.ssl_context = server_tls(tls_cert, tls_key, client_ca)
        self.port = port
        self.address = address
        self.metrics_port = metrics_port
        self.metrics_address = metrics_address
        self.prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
        self.names = names
        self.ledger = ledger or Ledger()
        self.view = None
        hosts = HostHeadroom()
        if api_client is not None:
            from .cluster import ClusterView, KubePodAPI

            self.view = ClusterView(api_client, self.ledger, names, assume_ttl=assume_ttl,
                                    schedulers=scheduler_names, hosts=hosts)
            api = api or KubePodAPI(api_client)
        self.decisions = Decisions(self.ledger, api, names, policy, scheduler_names, hosts=hosts,
                                   watched=self.view.pods.get if self.view is not None else None,
                                   rival_wait=rival_wait, admission_backlog=admission_backlog)
        self.queue_auth = QueueAuth(queue_token, queue_token_file)
        self.queue = QueueCache(self.queue_report, queue_max_age)
        self._rooms = NodeRooms()  # per node, kept between reports (read under the queue cache's lock)
        self.notifier: QueueNotifier | None = None
        if api_client is not None and queue_notice_interval:
            self.notifier = QueueNotifier(self.queue.report, api_client, queue_notice_interval)
        self.metrics = ExtenderMetrics(self.ledger)
        self.binds: BindWorkers[ExtenderBindingArgs, str | RivalWait] = BindWorkers(self.decisions.bind_step,
                                                                                     bind_workers)
        self.rival_waits = RivalWaits(self.ledger)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._servers: list[tornado.httpserver.HTTPServer] = []

    def queue_report(self) -> dict[str, Any]:
        """``GET /queue``: the pending vGPU pods in order, why they wait, what fits now (waiting.py)."""
        pods = self.view.pods.subset_items() if self.view is not None else []  # the unbound ones
        with self.ledger.lock:
            free = {name: entry.free for name, entry in self.ledger.nodes.items() if entry.known}
        schedulers = self.decisions.schedulers or frozenset((contract.SCHEDULER_NAME,))
        return queue_report(pods, free, self.names, schedulers, self._rooms)

    def not_ready(self) -> str | None:
        """Why the extender cannot decide yet (its first list of nodes and pods not done), or None."""
        view = self.view
        if view is not None and not view.synced:
            return "the extender is still listing nodes and pods; try again shortly"
        return None

    @property
    def url(self) -> str:
        host = self.address if self.address not in ("", "0.0.0.0", "::") else "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://{host}:{self.port}{self.prefix}"

    @property
    def base_url(self) -> str:
        return self.url[: len(self.url) - len(self.prefix)] if self.prefix else self.url

    def application(self) -> PostFront:
        """The scheduler's listener: its three POST verbs answered by the front, the rest by tornado."""
        kwargs = {"extender": self}
        verbs: dict[str, Answer] = {"filter": lambda body: answer_filter(self, body),
                                    "prioritize": lambda body: answer_prioritize(self, body),
                                    "bind": lambda body: answer_bind(self, body)}
        posts = {f"{self.prefix}/{verb}": Post(answer, self.metrics.timer(verb).observe)
                 for verb, answer in verbs.items()}
        web = tornado.web.Application([
            *((path, _VerbOtherMethods, kwargs) for path in posts),
            ("/healthz", HealthHandler, kwargs),
            ("/metrics", MetricsHandler, kwargs),
            ("/inspect", InspectHandler, kwargs),
            ("/queue", QueueHandler, kwargs),
        ], log_function=_log_request)
        return PostFront(posts, web, _log_reply)

    def metrics_application(self) -> tornado.web.Application:
        kwargs = {"extender": self}
        return tornado.web.Application([("/healthz", HealthHandler, kwargs), ("/metrics", MetricsHandler, kwargs),
                                        ("/queue", QueueHandler, kwargs)], log_function=_log_request)

    def start(self) -> Extender:
        if self._thread is not None:
            raise RuntimeError("the extender is already running")
        sockets = tornado.netutil.bind_sockets(self.port, self.address or None, family=socket.AF_UNSPEC)
        self.port = sockets[0].getsockname()[1]
        metrics_sockets: list[socket.socket] = []
        if self.metrics_port is not None:
            try:
                metrics_sockets = tornado.netutil.bind_sockets(self.metrics_port, self.metrics_address or None,
                                                               family=socket.AF_UNSPEC)
            except OSError:
                for sock in sockets:
                    sock.close()
                raise
            self.metrics_port = metrics_sockets[0].getsockname()[1]
        if self.view is not None:
            self.view.start()
            if self.notifier is not None:
                self.notifier.start()
        else:
            gc.freeze()  # a ledger given whole: keep it out of the cyclic GC's full collections
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(sockets, metrics_sockets, ready),
                                        name="extender-http", daemon=True)
        self._thread.start()
        ready.wait(10)
        log.info("scheduler extender listening on %s (policy %s)", self.url, self.decisions.policy)
        return self

    def _run(self, sockets: list[socket.socket], metrics_sockets: list[socket.socket],
             ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        self.binds.start(loop)
        self.rival_waits.start(loop)
        # 64 MiB: a thousand full Node objects when the scheduler does not cache nodes
        server = tornado.httpserver.HTTPServer(self.application(), max_body_size=64 << 20,
                                               ssl_options=self.ssl_context)
        server.add_sockets(sockets)
        self._servers = [server]
        if metrics_sockets:
            metrics = tornado.httpserver.HTTPServer(self.metrics_application(), max_body_size=1 << 16)
            metrics.add_sockets(metrics_sockets)
            self._servers.append(metrics)
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def stop(self, timeout: float = 10.0) -> None:
        loop, thread, servers = self._loop, self._thread, self._servers
        if thread is None or loop is None:
            return

        async def shutdown() -> None:
            for server in servers:
                server.stop()
            await self.rival_waits.close()  # binds waiting for a rival are refused, their replies written
            for server in servers:
                try:
                    await asyncio.wait_for(server.close_all_connections(), timeout)
                except asyncio.TimeoutError:
                    pass
            loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        thread.join(timeout)
        self._thread = self._loop = None
        self._servers = []
        self.binds.stop()  # binds not started yet are dropped, running ones finish (none waits for a rival)
        if self.notifier is not None:
            self.notifier.stop()
        if self.view is not None:
            self.view.stop()

    def __enter__(self) -> Extender:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def server_tls(cert: str | None, key: str | None, client_ca: str | None) -> ssl.SSLContext | None:
    """The HTTPS context for the scheduler's listener, or None for plain HTTP."""
    if not cert and not key:
        if client_ca:
            raise ValueError("a client CA needs a server certificate and key (--tls-cert, --tls-key)")
        return None
    if not (cert and key):
        raise ValueError("HTTPS needs both a certificate and its key (--tls-cert and --tls-key)")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
        if client_ca:
            context.load_verify_locations(cafile=client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"cannot load the TLS files: {error}") from None
    return context


def _log_request(handler: tornado.web.RequestHandler) -> None:
    _log_reply(handler.request.method or "", handler.request.uri or "", handler.get_status())


def _log_reply(method: str, uri: str, status: int) -> None:
    if status >= 500 and status != 503:  # 503: not listed yet, which /healthz reports on purpose
        log.error("%s %s -> %d", method, uri, status)
    elif status >= 400:
        log.info("%s %s -> %d", method, uri, status)

