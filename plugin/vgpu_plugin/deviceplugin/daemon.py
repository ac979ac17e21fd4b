"""The node daemon: device plugin servers, registration, health, reconciliation, node
annotation, and the metrics server, with a non-blocking ``start()`` / ``stop()``.

    daemon = NodeDaemon(DaemonConfig(node="n1", plugin_dir=...), backend, api_client)
    daemon.start()             # returns at once; daemon.wait_ready(timeout) to wait for registration
    ...
    daemon.stop()
"""

from __future__ import annotations

import collections
import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jupyter_vgpu.core.claims import is_finished
from jupyter_vgpu.core.contract import DEFAULT_NAMES, Names

from ..tokens import TokenMinter, load_or_create_secret
from .allocator import Allocator
from .checkpoint import CheckpointError, CheckpointReader, PodDeviceEntry, read_checkpoint
from .checkpoint_watch import CheckpointWatch
from .devices import (
    CHECKPOINT_FILE,
    CORE,
    DEFAULT_PLUGIN_DIR,
    KUBELET_SOCKET,
    MEMORY,
    SOCKETS,
    minor_mismatches,
)
from .enforcement import EnforcementConfig, mount_sources, remove_stale_hami_dirs
from .publisher import NodePublisher
from .server import DevicePluginService, ResourceServer
from .state import CardsState

if TYPE_CHECKING:
    from jupyter_vgpu.gpu import GPUBackend

log = logging.getLogger(__name__)


@dataclass
class DaemonConfig:
    node: str
    plugin_dir: str = DEFAULT_PLUGIN_DIR
    names: Names = DEFAULT_NAMES
    enforcement: EnforcementConfig = field(default_factory=EnforcementConfig)
    state_dir: str = "/var/lib/vgpu"              # holds the token secret
    metrics: dict[str, Any] | None = None          # MetricsServer keyword arguments; None: no metrics server
    metrics_url: str | None = None                 # advertised to containers; default http://<node IP>:<port>
    checkpoint_path: str | None = None             # default <plugin dir>/kubelet_internal_checkpoint
    reconcile_period: float = 2.0
    confirm_grace: float = 10.0                    # gpu-assigned waits this long for kubelet's checkpoint
    publish_period: float = 60.0
    watch_period: float = 0.2
    sync_timeout: float = 60.0
    hami_gc_period: float = 60.0                   # how often HAMi-core cache dirs of gone containers are removed
    hami_gc_min_age: float = 300.0                 # a cache dir younger than this is kept (not yet in the checkpoint)


class NodeDaemon:
    def __init__(self, config: DaemonConfig, backend: GPUBackend, api_client: Any) -> None:
        self.config = config
        self.backend = backend
        self._api_client = api_client
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._threads: list[threading.Thread] = []
        self._reconcile_now = threading.Event()
        self._publish_now = threading.Event()
        self._annotate: queue.Queue[tuple[str, str]] = queue.Queue()
        # pods queued or waiting to be retried: each at most once, however often it changes or
        # a reconcile pass finds it unmarked (a PATCH the API server keeps refusing was retried
        # by every pass, so the retries grew without bound)
        self._annotate_pending: set[tuple[str, str]] = set()
        self._annotate_lock = threading.Lock()
        # UIDs of pods a write found deleted or replaced by a new pod of their name: our view may hold
        # them a while yet, and reconcile keeps asking; the last few are enough to write each never again
        self._gone_uids: collections.deque[str] = collections.deque(maxlen=256)
        self.cards = CardsState()
        self.informer: Any = None
        self.allocator: Allocator | None = None
        self.publisher: NodePublisher | None = None
        self.metrics_server: Any = None
        self.servers: dict[str, ResourceServer] = {}
        self.checkpoint_watch: CheckpointWatch | None = None
        self.registrations = 0
        self._node_address = "127.0.0.1"
        self._minter: TokenMinter | None = None
        self._checkpoint_problem: str | None = None  # the last complaint about kubelet's checkpoint, said once
        self._restored = False  # the ledger was rebuilt from kubelet's checkpoint and the pods
        self._checkpoint = CheckpointReader(self.checkpoint_path)  # parses only bytes it has not parsed last

    @property
    def checkpoint_path(self) -> str:
        return self.config.checkpoint_path or os.path.join(self.config.plugin_dir, CHECKPOINT_FILE)

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> NodeDaemon:
        """Start everything in background threads; errors in the configuration raise here."""
        from kubernetes import client

        from ..informer import Informer

        cfg = self.config
        if len(os.path.join(cfg.plugin_dir, SOCKETS[MEMORY])) > 100:
            raise ValueError(f"plugin dir {cfg.plugin_dir!r} is too long for unix socket paths")
        os.makedirs(cfg.plugin_dir, exist_ok=True)
        self._stopping.clear()
        self._restored = False  # once per start: a supervisor started over keeps the ledger it has
        secret = load_or_create_secret(os.path.join(cfg.state_dir, "token-secret"))
        self._minter = TokenMinter(secret)
        self.cards.replace_cards(self.backend.inventory() if self.backend.available() else [])
        if not self.backend.available():
            log.warning("node %s: no usable GPUs (%s); advertising no devices", cfg.node, self.backend.problem())
        for card in self.cards.cards():
            if card.mig and any(s.placeable for s in card.slices):
                # as the admin set it up: not a problem to warn about (the demo's MIG node starts so)
                log.info("node %s: card %d (%s) is in MIG mode: served as its %d slice(s), never time-shared",
                         cfg.node, card.index, card.uuid, len(card.slices))
            elif card.unavailable:
                log.warning("node %s: card %d (%s) is kept out of sharing: %s", cfg.node, card.index, card.uuid,
                            card.unavailable)
        mismatched = minor_mismatches(self.cards.cards())
        if mismatched:
            log.warning("node %s: NVML indices differ from /dev/nvidia minor numbers (%s); predicate-gpu-idx "
                        "annotations here are NVML indices, which TKEStack gpu-manager would read as minors: "
                        "do not run gpu-manager on this node", cfg.node, ", ".join(mismatched))
        core_api = client.CoreV1Api(self._api_client)
        self._core_api = core_api
        self.informer = Informer(core_api.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={cfg.node}",
                                 on_event=self._on_pod_event)
        self.allocator = Allocator(cfg.node, self.informer, self.cards, self._minter, names=cfg.names,
                                   enforcement=cfg.enforcement, metrics_url=self._metrics_url,
                                   on_pod_changed=self._queue_annotation,
                                   fresh_pods=self._list_pods, confirm_grace=cfg.confirm_grace)
        self.publisher = NodePublisher(core_api, cfg.node, self.backend, self.cards, cfg.names)
        for kind in (CORE, MEMORY):
            resource = cfg.names.core_resource if kind == CORE else cfg.names.memory_resource
            service = DevicePluginService(kind, resource, self.cards, self.allocator, self._stopping)
            self.servers[kind] = ResourceServer(service, cfg.plugin_dir, SOCKETS[kind])
        self.informer.start()
        if cfg.metrics is not None:
            self._start_metrics()
        # kubelet's checkpoint write wakes reconciliation at once: that confirms guessed answers
        self.checkpoint_watch = CheckpointWatch(self.checkpoint_path, self._reconcile_now.set, self._stopping)
        for target, name in ((self._supervise, "supervisor"), (self._watch_health, "health"),
                             (self._run_annotator, "annotator"), (self._run_publisher, "publisher"),
                             (self.checkpoint_watch.run, "checkpoint-watch")):
            thread = threading.Thread(target=target, name=f"vgpu-{name}-{cfg.node}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def wait_ready(self, timeout: float) -> bool:
        """True once the servers run and are registered with kubelet."""
        return self._ready.wait(timeout)

    def not_ready(self) -> str | None:
        """Why the daemon is not ready (None: it serves and is registered with kubelet); the readiness probe."""
        if self._ready.is_set():
            return None
        if self._stopping.is_set():
            return "stopping"
        if not self._restored:
            return "not registered with kubelet yet: the served ledger is not rebuilt yet (see the log)"
        return "not registered with kubelet (kubelet down, or it refused us: see the log)"

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._reconcile_now.set()
        self._publish_now.set()
        self.cards.poke()
        for server in self.servers.values():
            server.stop()
        for thread in self._threads:
            thread.join(timeout)
        self._threads.clear()
        if self.metrics_server is not None:
            self.metrics_server.stop(timeout)
            self.metrics_server = None
        if self.informer is not None:
            self.informer.stop(timeout)
        self._ready.clear()
        log.info("node daemon for %s stopped", self.config.node)

    # --- metrics ----------------------------------------------------------------------------------

    def _start_metrics(self) -> None:
        from ..metrics.server import MetricsServer

        options = dict(self.config.metrics or {})
        options.setdefault("readiness", self.not_ready)
        self.metrics_server = MetricsServer(self.config.node, self.backend, self.informer, self._minter,
                                            self.config.names, enforcement=self.config.enforcement.mode, **options)
        self.metrics_server.start()

    def _metrics_url(self) -> str:
        if self.config.metrics_url:
            return self.config.metrics_url
        port = self.metrics_server.port if self.metrics_server is not None else None
        if port is None:
            port = int((self.config.metrics or {}).get("port") or 5678)
        return f"http://{self._node_address}:{port}"

    def _read_node_address(self) -> None:
        try:
            response = self._core_api.read_node(self.config.node, _preload_content=False, _request_timeout=30)
            addresses = (json.loads(response.data).get("status") or {}).get("addresses") or []
        except Exception as error:
            log.info("cannot read node %s's address (%s); containers get 127.0.0.1", self.config.node, error)
            return
        for kind in ("InternalIP", "ExternalIP"):
            for address in addresses:
                if address.get("type") == kind and address.get("address"):
                    self._node_address = address["address"]
                    return

    # --- supervisor: start-up, kubelet restarts, reconciliation -------------------------------------

    def _supervise(self) -> None:
        """Run the supervisor; an unexpected error is logged, readiness drops, and it starts over."""
        while not self._stopping.is_set():
            try:
                self._run_supervisor()
            except Exception:
                log.exception("the device plugin supervisor failed; starting it again")
                self._ready.clear()
                self._stopping.wait(1.0)

    def _restore(self) -> bool:
        """Rebuild the ledger before serving kubelet; False (logged) when that failed, to be retried."""
        try:
            entries = self._checkpoint_entries()
            complete = self._checkpoint_problem is None and os.path.exists(self.checkpoint_path)
            self.allocator.restore(entries, checkpoint_complete=complete)
        except Exception:
            log.exception("rebuilding the served ledger failed; not registering with kubelet yet, retrying")
            return False
        self._restored = True
        return True

    def _run_supervisor(self) -> None:
        cfg = self.config
        while not self.informer.wait_synced(1.0):
            if self._stopping.is_set():
                return
            log.info("waiting for the pod list of node %s", cfg.node)
        self._read_node_address()
        registered_for: tuple[int, int, int] | None = None
        checkpoint_seen = _identity(self.checkpoint_path)
        last_reconcile = 0.0
        last_gc = 0.0
        backoff_until = 0.0
        while not self._stopping.is_set():
            if not self._restored and not self._restore():  # no Allocate is answered without the ledger
                self._stopping.wait(1.0)
                continue
            kubelet = _identity(os.path.join(cfg.plugin_dir, KUBELET_SOCKET))
            ours_missing = any(not os.path.exists(s.path) for s in self.servers.values())
            now = time.monotonic()
            if kubelet is not None and (kubelet != registered_for or ours_missing) and now >= backoff_until:
                if registered_for is not None:
                    log.info("kubelet restarted (kubelet.sock re-created) or our sockets vanished: "
                             "restarting the servers and registering again")
                self._ready.clear()
                try:
                    for server in self.servers.values():
                        server.start()
                    for server in self.servers.values():
                        server.register(cfg.plugin_dir)
                    registered_for = kubelet
                    self.registrations += 1
                    self._ready.set()
                except Exception as error:  # kubelet not up yet, or it refused us
                    log.warning("registration with kubelet failed: %s; retrying", _rpc_text(error))
                    backoff_until = now + 1.0
            elif kubelet is None and registered_for is not None and self._ready.is_set():
                log.info("kubelet.sock is gone; waiting for kubelet to come back")
                self._ready.clear()
                registered_for = None
            # kubelet rewrites its checkpoint right after Allocate: reading it at once confirms who
            # holds each answer, which is when a container's token starts to work. The checkpoint
            # watch wakes this loop then; the poll (watch_period) is its safety net and fallback
            checkpoint = _identity(self.checkpoint_path)
            if (checkpoint != checkpoint_seen or self._reconcile_now.is_set()
                    or now - last_reconcile >= cfg.reconcile_period):
                checkpoint_seen = checkpoint
                self._reconcile_now.clear()
                last_reconcile = now
                try:
                    self.allocator.reconcile(self._checkpoint_entries())
                except Exception:
                    log.exception("reconciliation failed")
            if cfg.enforcement.mode == "hami-core" and now - last_gc >= cfg.hami_gc_period:
                last_gc = now
                self.collect_hami_dirs()
            self._reconcile_now.wait(cfg.watch_period)

    def collect_hami_dirs(self) -> list[str]:
        """Remove HAMi-core cache dirs that no container in kubelet's checkpoint mounts any more.

        Nothing is removed while the checkpoint is missing or unreadable: then nobody can say
        which containers are alive.
        """
        if not os.path.exists(self.checkpoint_path):
            return []
        try:
            entries = read_checkpoint(self.checkpoint_path)
        except (CheckpointError, OSError) as error:
            log.warning("not removing HAMi-core cache dirs: kubelet's checkpoint is unreadable (%s)", error)
            return []
        live = mount_sources(entry.alloc_response for entry in entries)
        try:
            return remove_stale_hami_dirs(self.config.enforcement, live, min_age=self.config.hami_gc_min_age,
                                          now=time.time())
        except OSError as error:
            log.warning("removing HAMi-core cache dirs failed: %s", error)
            return []

    def _list_pods(self) -> dict[str, Any]:
        """This node's pods as the API has them now: the LIST reply (items and its resourceVersion)."""
        response = self._core_api.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.config.node}", _preload_content=False, _request_timeout=10)
        from ..informer import decode

        body = decode(response.data)
        return body if isinstance(body, dict) else {}

    def _checkpoint_entries(self) -> list[PodDeviceEntry]:
        """kubelet's checkpoint; [] (and a warning each time the complaint changes) when unreadable:
        the ledger then keeps what it knows and the pod annotations stand in."""
        try:
            entries = self._checkpoint.read()
        except (CheckpointError, OSError) as error:
            problem = str(error)
            if problem != self._checkpoint_problem:
                log.warning("ignoring kubelet's checkpoint %s: %s", self.checkpoint_path, problem)
            self._checkpoint_problem = problem
            return []
        if self._checkpoint_problem is not None:
            log.info("kubelet's checkpoint %s is readable again", self.checkpoint_path)
            self._checkpoint_problem = None
        return entries

    def _on_pod_event(self, kind: str, pod: dict[str, Any] | None) -> None:
        if pod is None or self.allocator is None:
            return
        meta = pod.get("metadata") or {}
        # a terminating pod (deletionTimestamp) still runs and holds its share until it is gone
        if kind == "DELETED" or is_finished(pod):
            self.allocator.pod_gone(meta.get("uid") or "")
            self._reconcile_now.set()

    # --- health ----------------------------------------------------------------------------------------

    def _watch_health(self) -> None:
        while not self._stopping.is_set():
            try:
                event = self.backend.next_health_event(0.5)
            except Exception:
                log.exception("health watch failed")
                self._stopping.wait(1.0)
                continue
            if event is None:
                continue
            changed = self.cards.set_health(event.card_index, event.healthy, event.reason)
            if self.cards.refresh_mig(self.backend.inventory()):
                log.warning("card %d: MIG slices changed (%s)", event.card_index, event.reason)
                self._publish_now.set()
            if changed:
                log.warning("card %d (%s) is now %s: %s", event.card_index, event.uuid,
                            "healthy" if event.healthy else "UNHEALTHY", event.reason)
                self._publish_now.set()
            else:
                log.info("card %d: %s (health unchanged: %s)", event.card_index, event.reason,
                         "healthy" if event.healthy else "unhealthy")

    # --- annotations -------------------------------------------------------------------------------------

    def _queue_annotation(self, namespace: str, name: str) -> None:
        with self._annotate_lock:
            if (namespace, name) in self._annotate_pending:
                return
            self._annotate_pending.add((namespace, name))
        self._annotate.put((namespace, name))

    def _run_annotator(self) -> None:
        from kubernetes.client.exceptions import ApiException

        while not self._stopping.is_set():
            try:
                namespace, name = self._annotate.get(timeout=0.5)
            except queue.Empty:
                continue
            with self._annotate_lock:  # a change from now on queues the pod again
                self._annotate_pending.discard((namespace, name))
            try:
                desired = self.allocator.desired_annotations(namespace, name)
            except Exception:  # one pod's bad record must not end the thread that writes every pod's
                log.exception("cannot work out pod %s/%s's annotations; skipped", namespace, name)
                continue
            if desired is None:
                continue
            if desired.uid in self._gone_uids:
                log.debug("pod %s/%s (UID %s) is gone or replaced: not written again", namespace, name, desired.uid)
                continue
            # Under JupyterHub a restarted server is a new pod with the same name, often on this node
            # seconds later, while our view may still hold the old one. The UID in the patch is a
            # precondition, as in kubelet's status patches (kubernetes#86320): the API server refuses
            # it when the pod of that name has another UID (422 Invalid, "metadata.uid: Invalid value:
            # ...: field is immutable"), so one pod's record never lands on another.
            patch = {"metadata": {"uid": desired.uid, "annotations": desired.annotations}}
            try:
                # the reply is read but not turned into client models (several ms per pod)
                reply = self._core_api.patch_namespaced_pod(name, namespace, patch, _request_timeout=30,
                                                            _preload_content=False)
                reply.data  # noqa: B018 - read to the end: the connection goes back to the pool
                log.info("pod %s/%s: %s=%s, allocation record written", namespace, name,
                         self.config.names.gpu_assigned, desired.annotations.get(self.config.names.gpu_assigned))
            except ApiException as error:
                if error.status == 404 or _uid_refused(error):
                    # not retried: a new pod of that name is annotated once our view has it (reconcile
                    # queues every served pod not marked assigned; Allocate queues it when served)
                    log.info("pod %s/%s (UID %s) is gone or replaced by a new pod of that name: its annotations "
                             "are not written", namespace, name, desired.uid)
                    if desired.uid:
                        self._gone_uids.append(desired.uid)
                    continue
                log.warning("annotating pod %s/%s failed (%s %s); retrying", namespace, name, error.status,
                            error.reason)
                self._retry_later(namespace, name)
            except Exception as error:
                log.warning("annotating pod %s/%s failed (%s); retrying", namespace, name, error)
                self._retry_later(namespace, name)

    def _retry_later(self, namespace: str, name: str) -> None:
        with self._annotate_lock:
            if (namespace, name) in self._annotate_pending:  # changed meanwhile: queued already
                return
            self._annotate_pending.add((namespace, name))
        timer = threading.Timer(1.0, self._annotate.put, ((namespace, name),))
        timer.daemon = True
        timer.start()

    def _run_publisher(self) -> None:
        last_full = 0.0
        while not self._stopping.is_set():
            now = time.monotonic()
            full = now - last_full >= self.config.publish_period
            try:
                self.publisher.publish(check_node=full)
                if full:
                    last_full = now
            except Exception as error:
                status = getattr(error, "status", None)
                reason = "the Node does not exist (yet)" if status == 404 else (
                    f"{status} {getattr(error, 'reason', '')}" if status else str(error))
                log.warning("publishing node %s's GPU inventory failed: %s; retrying", self.config.node, reason)
                self._publish_now.wait(2.0)
                continue
            self._publish_now.wait(min(self.config.publish_period, 5.0))
            self._publish_now.clear()


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_ino, stat.st_ctime_ns, stat.st_mtime_ns


def _uid_refused(error: Any) -> bool:
    """The API server refused a write because the object of that name has another UID now."""
    if error.status != 422:
        return False
    try:
        causes = json.loads(error.body)["details"]["causes"]
        return any(isinstance(cause, dict) and cause.get("field") == "metadata.uid" for cause in causes)
    except (TypeError, ValueError, LookupError):  # not a Status naming its causes
        return False


def _rpc_text(error: Exception) -> str:
    details = getattr(error, "details", None)
    if callable(details):
        try:
            return f"{error.code().name}: {details()}"  # type: ignore[attr-defined]
        except Exception:
            pass
    return str(error)
