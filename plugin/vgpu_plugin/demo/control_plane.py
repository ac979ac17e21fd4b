"""The simulated cluster's control plane in a process of its own: the real extender and the
kube-scheduler stand-in, as deployed (their own pod, never on a notebook node).

In one process with forty nodes' kubelet stand-ins and node daemons (~600 threads), every
scheduling cycle's HTTP round trips to the extender wait for the same GIL as everything
else. ``ControlPlaneProcess`` runs ``extender.server.Extender`` and ``simkube.scheduler.
SimScheduler`` in a spawned child that reaches the API with the url, token and CA the
parent's clients use, and gives the parent what callers of ``SimCluster`` read:

- ``extender``: ``url``, ``base_url``, ``port`` and ``ledger``, whose read-only queries
  (``LEDGER_QUERIES``) are answered over the pipe by the child's real ledger;
- ``restart_extender()``: the extender's pod restarting on the same address (the scheduler
  keeps calling it there);
- ``call(fn, *args)``: run a module-level function in the child (a benchmark's timers).

One request at a time goes over the pipe (a lock), and the child answers in order.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from jupyter_vgpu.core import contract as c

log = logging.getLogger(__name__)

LEDGER_QUERIES = frozenset(("claims", "overcommitted", "slices_held_more_than_once", "stats", "node_names"))
"""What the parent may ask the child's ledger: answers are plain data."""


class ControlPlaneError(RuntimeError):
    """The control plane did not start, or the child failed a request (its message says why)."""


@dataclass(frozen=True)
class ControlPlaneSpec:
    """Everything the child needs, picklable."""

    api_url: str
    api_token: str
    api_ca_pem: bytes
    scheduler_config: str
    policy: str
    names: c.Names
    queue_token: str
    ready_timeout: float
    log_level: int


def api_client(url: str, token: str, ca_pem: bytes) -> Any:
    """An official-client ``ApiClient`` for the API at ``url`` (as ``SimKubeAPI.api_client``)."""
    import kubernetes.client

    configuration = kubernetes.client.Configuration()
    configuration.host = url
    configuration.api_key = {"authorization": f"Bearer {token}"}
    configuration.ca_cert_data = ca_pem.decode()
    return kubernetes.client.ApiClient(configuration)


class _Child:
    """What runs in the child: the extender and the scheduler, and the answers to the parent."""

    def __init__(self, spec: ControlPlaneSpec) -> None:
        self.spec = spec
        self.extender: Any = None
        self.scheduler: Any = None

    def start_extender(self, port: int = 0) -> None:
        from ..extender.server import Extender

        spec = self.spec
        self.extender = Extender(port=port, address="127.0.0.1", policy=spec.policy, names=spec.names,
                                 api_client=api_client(spec.api_url, spec.api_token, spec.api_ca_pem),
                                 queue_token=spec.queue_token).start()
        if self.extender.view is not None and not self.extender.view.wait_synced(spec.ready_timeout):
            raise ControlPlaneError("the extender did not sync its node and pod caches")

    def start_scheduler(self) -> None:
        from simkube.scheduler import SimScheduler

        from ..informer import Informer

        spec = self.spec
        self.scheduler = SimScheduler(api_client(spec.api_url, spec.api_token, spec.api_ca_pem),
                                      spec.scheduler_config, informer=Informer,
                                      extender_url=self.extender.base_url).start()
        if not (self.scheduler.nodes.wait_synced(spec.ready_timeout)
                and self.scheduler.pods.wait_synced(spec.ready_timeout)):
            raise ControlPlaneError("the scheduler did not sync its node and pod caches")

    def address(self) -> dict[str, Any]:
        return {"url": self.extender.url, "base_url": self.extender.base_url, "port": self.extender.port}

    def handle(self, command: tuple[Any, ...]) -> Any:
        verb = command[0]
        if verb == "ledger":
            _, query, args = command
            if query not in LEDGER_QUERIES:
                raise ControlPlaneError(f"not a ledger query: {query!r}")
            return getattr(self.extender.ledger, query)(*args)
        if verb == "restart_extender":
            port = self.extender.port
            self.extender.stop()
            self.extender = None
            self.start_extender(port)
            return self.address()
        if verb == "call":
            _, fn, args = command
            return fn(*args)
        raise ControlPlaneError(f"unknown request {verb!r}")

    def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
            self.scheduler = None
        if self.extender is not None:
            self.extender.stop()
            self.extender = None


def _serve(conn: Connection, spec: ControlPlaneSpec) -> None:
    """The child: start both, then answer the parent until told to stop (or the parent is gone)."""
    logging.basicConfig(level=spec.log_level, format="%(asctime)s %(levelname)s %(name)s [control plane]: %(message)s")
    child = _Child(spec)
    try:
        child.start_extender()
        child.start_scheduler()
    except Exception as error:  # noqa: BLE001 - reported to the parent, which raises it
        child.stop()
        conn.send(("failed", f"{type(error).__name__}: {error}"))
        return
    conn.send(("ready", child.address()))
    try:
        while True:
            try:
                command = conn.recv()
            except EOFError:
                break
            if command == "stop":
                break
            try:
                conn.send(("ok", child.handle(command)))
            except Exception as error:  # noqa: BLE001 - the parent raises it as ControlPlaneError
                log.exception("control plane request %r failed", command[0])
                conn.send(("error", f"{type(error).__name__}: {error}"))
    finally:
        child.stop()


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
    def __init__(self, spec: ControlPlaneSpec) -> None:
        self.spec = spec
        self.extender: ExtenderProxy | None = None
        self._process: Any = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()

    @classmethod
    def for_api(cls, kube: Any, *, scheduler_config: str | Path, policy: str, names: c.Names, queue_token: str,
                ready_timeout: float) -> ControlPlaneProcess:
        """For a ``SimKubeAPI`` or ``SimKubeAPIProcess``: its url, token and certificate."""
        return cls(ControlPlaneSpec(kube.url, kube.token, kube.identity.cert_pem, str(scheduler_config), policy,
                                    names, queue_token, ready_timeout, logging.getLogger().getEffectiveLevel()))

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def start(self) -> ControlPlaneProcess:
        if self._process is not None:
            raise RuntimeError("the control plane is already running")
        context = multiprocessing.get_context("spawn")  # never fork a process full of threads
        ours, theirs = context.Pipe()
        self._process = context.Process(target=_serve, name="sim-control-plane", daemon=True,
                                        args=(theirs, self.spec))
        self._process.start()
        theirs.close()
        self._conn = ours
        # importing, listing and syncing both caches: the child's own ready_timeout, plus its start-up
        if not ours.poll(self.spec.ready_timeout * 2 + 60):
            self.stop()
            raise ControlPlaneError("the control plane process did not start in time")
        try:
            state, detail = ours.recv()
        except EOFError:
            state, detail = "failed", "it exited"
        if state != "ready":
            self.stop()
            raise ControlPlaneError(f"the control plane process failed to start: {detail}")
        self.extender = ExtenderProxy(self, detail)
        return self

    def request(self, command: tuple[Any, ...]) -> Any:
        """One request to the child and its answer; raises ControlPlaneError with the child's reason."""
        with self._lock:
            conn = self._conn
            if conn is None:
                raise ControlPlaneError("the control plane is not running")
            try:
                conn.send(command)
                state, detail = conn.recv()
            except (EOFError, BrokenPipeError, OSError) as error:
                raise ControlPlaneError(f"the control plane process is gone ({error!r})") from None
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
        if conn is not None:
            try:
                conn.send("stop")
            except (BrokenPipeError, OSError):
                pass
            conn.close()
        if process is not None:
            process.join(timeout)
            if process.is_alive():
                process.terminate()
                process.join(timeout)
        self.extender = None
