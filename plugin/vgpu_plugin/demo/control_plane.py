"""The simulated cluster's control plane: the real extender and the kube-scheduler stand-in.

``ControlPlane`` starts, stops and restarts the two (``extender.server.Extender`` and
``simkube.scheduler.SimScheduler``), reaching the API with its url, token and CA. ``SimCluster``
runs one in its own process by default.

``ControlPlaneProcess`` runs one in a spawned child, as deployed (its own pod, never on a
notebook node): in one process with forty nodes' kubelet stand-ins and node daemons (~600
threads), every scheduling cycle's HTTP round trips to the extender wait for the same GIL as
everything else. It gives the parent what callers of ``SimCluster`` read:

- ``extender``: ``url``, ``base_url``, ``port`` and ``ledger``, whose read-only queries
  (``LEDGER_QUERIES``) are answered over the pipe by the child's real ledger;
- ``restart_extender()``: the extender's pod restarting on the same address (the scheduler
  keeps calling it there);
- ``call(fn, *args)``: run a module-level function in the child (a benchmark's timers).

One request at a time goes over the pipe (a lock), and the child answers in order.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from simkube import child
from simkube.client import api_client

from jupyter_vgpu.core import contract as c

from .errors import ClusterError

log = logging.getLogger(__name__)

LEDGER_QUERIES = frozenset(("claims", "overcommitted", "slices_held_more_than_once", "stats", "node_names"))
"""What the parent may ask the child's ledger: answers are plain data."""


class ControlPlaneError(ClusterError):
    """The control plane did not start, or the child failed a request (its message says why)."""


@dataclass(frozen=True)
class ControlPlaneSpec:
    """Everything the control plane needs, picklable."""

    api_url: str
    api_token: str
    api_ca_pem: bytes
    scheduler_config: str
    policy: str
    names: c.Names
    queue_token: str
    ready_timeout: float
    log_level: int

    @classmethod
    def for_api(cls, kube: Any, *, scheduler_config: str | Path, policy: str, names: c.Names, queue_token: str,
                ready_timeout: float) -> ControlPlaneSpec:
        """For a started ``SimKubeAPI`` or ``SimKubeAPIProcess``: its url, token and certificate."""
        return cls(kube.url, kube.token, kube.identity.cert_pem, str(scheduler_config), policy, names, queue_token,
                   ready_timeout, logging.getLogger().getEffectiveLevel())


class ControlPlane:
    """The extender and the kube-scheduler stand-in, started, stopped and restarted as a cluster
    does it: in ``SimCluster``'s own process, or in ``ControlPlaneProcess``'s child.

    The two start separately because a cluster starts the scheduler last, once its nodes are
    ready; each start waits until that component has synced its caches from the API.
    """

    def __init__(self, spec: ControlPlaneSpec) -> None:
        self.spec = spec
        self.extender: Any = None  # extender.server.Extender
        self.scheduler: Any = None  # simkube.scheduler.SimScheduler

    def _api_client(self) -> Any:
        return api_client(self.spec.api_url, self.spec.api_token, self.spec.api_ca_pem)

    def start_extender(self, port: int = 0) -> None:
        from ..extender.server import Extender

        spec = self.spec
        self.extender = Extender(port=port, address="127.0.0.1", policy=spec.policy, names=spec.names,
                                 api_client=self._api_client(), queue_token=spec.queue_token).start()
        if self.extender.view is not None and not self.extender.view.wait_synced(spec.ready_timeout):
            raise ControlPlaneError("the extender did not sync its node and pod caches")

    def start_scheduler(self) -> None:
        from simkube.scheduler import SimScheduler

        from ..informer import Informer

        spec = self.spec
        self.scheduler = SimScheduler(self._api_client(), spec.scheduler_config, informer=Informer,
                                      extender_url=self.extender.base_url).start()
        if not (self.scheduler.nodes.wait_synced(spec.ready_timeout)
                and self.scheduler.pods.wait_synced(spec.ready_timeout)):
            raise ControlPlaneError("the scheduler did not sync its node and pod caches")

    def restart_extender(self) -> None:
        """The extender's pod restarting on the same port; its state is rebuilt from the API."""
        port = self.extender.port
        self.extender.stop()
        self.extender = None
        self.start_extender(port)

    def stop_scheduler(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
            self.scheduler = None

    def stop(self) -> None:
        self.stop_scheduler()
        if self.extender is not None:
            self.extender.stop()
            self.extender = None


def _address(plane: ControlPlane) -> dict[str, Any]:
    return {"url": plane.extender.url, "base_url": plane.extender.base_url, "port": plane.extender.port}


def _handle(plane: ControlPlane, command: tuple[Any, ...]) -> Any:
    """The child's answer to one request of the parent."""
    verb = command[0]
    if verb == "ledger":
        _, query, args = command
        if query not in LEDGER_QUERIES:
            raise ControlPlaneError(f"not a ledger query: {query!r}")
        return getattr(plane.extender.ledger, query)(*args)
    if verb == "restart_extender":
        plane.restart_extender()
        return _address(plane)
    if verb == "call":
        _, fn, args = command
        return fn(*args)
    raise ControlPlaneError(f"unknown request {verb!r}")


def _serve(conn: Connection, spec: ControlPlaneSpec) -> None:
    """The child: start both, then answer the parent until told to stop (or the parent is gone)."""
    logging.basicConfig(level=spec.log_level, format="%(asctime)s %(levelname)s %(name)s [control plane]: %(message)s")
    plane = ControlPlane(spec)
    try:
        plane.start_extender()
        plane.start_scheduler()
    except Exception as error:  # noqa: BLE001 - reported to the parent, which raises it
        plane.stop()
        conn.send(("failed", f"{type(error).__name__}: {error}"))
        return
    conn.send(("ready", _address(plane)))
    try:
        for command in child.commands(conn):
            try:
                conn.send(("ok", _handle(plane, command)))
            except Exception as error:  # noqa: BLE001 - the parent raises it as ControlPlaneError
                log.exception("control plane request %r failed", command[0])
                conn.send(("error", f"{type(error).__name__}: {error}"))
    finally:
        plane.stop()


class LedgerProxy:
    """The child extender's ledger, asked over the pipe: the same read-only methods, the same answers."""

    def __init__(self, plane: ControlPlaneProcess) -> None:
        self._plane = plane

    def _ask(self, query: str, *args: Any) -> Any:
        return self._plane.request(("ledger", query, args))

    def claims(self) -> dict[str, dict[str, list[tuple[int, int, int, int]]]]:
        result: dict[str, dict[str, list[tuple[int, int, int, int]]]] = self._ask("claims")
        return result

    def overcommitted(self) -> list[str]:
        result: list[str] = self._ask("overcommitted")
        return result

    def slices_held_more_than_once(self) -> list[tuple[str, str, int]]:
        result: list[tuple[str, str, int]] = self._ask("slices_held_more_than_once")
        return result

    def stats(self) -> dict[str, int]:
        result: dict[str, int] = self._ask("stats")
        return result

    def node_names(self) -> list[str]:
        result: list[str] = self._ask("node_names")
        return result


class ExtenderProxy:
    """The extender as the parent sees it: its address and its ledger."""

    def __init__(self, plane: ControlPlaneProcess, address: dict[str, Any]) -> None:
        self.url: str = address["url"]
        self.base_url: str = address["base_url"]
        self.port: int = address["port"]
        self.ledger = LedgerProxy(plane)


class ControlPlaneProcess:
    """A ``ControlPlane`` in a spawned child process, asked over a pipe."""

    def __init__(self, spec: ControlPlaneSpec) -> None:
        self.spec = spec
        self.extender: ExtenderProxy | None = None
        self._process: Any = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def start(self) -> ControlPlaneProcess:
        if self._process is not None:
            raise RuntimeError("the control plane is already running")
        self._process, self._conn = child.spawn(_serve, (self.spec,), "sim-control-plane")
        # importing, listing and syncing both caches: the child's own ready_timeout, plus its start-up
        state, detail = child.await_ready(self._conn, self.spec.ready_timeout * 2 + 60)
        if state != "ready":
            self.stop()
            raise ControlPlaneError("the control plane process did not start in time" if state == "timeout"
                                    else f"the control plane process failed to start: {detail}")
        self.extender = ExtenderProxy(self, detail)
        return self

    def request(self, command: tuple[Any, ...]) -> Any:
        """One request to the child and its answer; raises ControlPlaneError with the child's reason."""
        with self._lock:
            state, detail = child.ask(self._conn, command)
        if state == "gone":
            raise ControlPlaneError(f"the control plane process is gone: {detail}")
        if state != "ok":
            raise ControlPlaneError(f"the control plane failed {command[0]!r}: {detail}")
        return detail

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the child (``fn`` must be importable there: a module-level function)."""
        return self.request(("call", fn, args))

    def restart_extender(self) -> None:
        """The extender's pod restarting on the same address; its state is rebuilt from the API."""
        self.extender = ExtenderProxy(self, self.request(("restart_extender",)))

    def stop(self, timeout: float = 30.0) -> None:
        with self._lock:
            process, conn = self._process, self._conn
            self._process, self._conn = None, None
        child.stop(process, conn, timeout)
        self.extender = None
