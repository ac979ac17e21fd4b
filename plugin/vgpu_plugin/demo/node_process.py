"""Some of the simulated cluster's nodes in a spawned child process, asked over a pipe.

In one process, forty nodes' kubelet stand-ins and node daemons (~600 threads) share one GIL:
every gRPC hop between a kubelet stand-in and its device plugin waits behind other nodes'
work, which a real cluster (a kubelet written in Go and a device plugin process per node)
never does. ``SimCluster(node_processes=N)`` deals its nodes round-robin to N
``NodeProcess`` children; each builds its nodes as ``SimCluster`` does in-process
(``demo.node``) and gives the parent, per node, proxies with the
queries the cluster's callers read, answered by the child's real objects:

- ``kubelet``: ``devices``, ``registered``, ``admitted``, ``failure``, ``env``, ``in_use``,
  and ``checkpoint_path`` (a file on the shared disk the parent reads itself);
- ``daemon``: ``wait_ready``, ``metrics_server`` (its two ports) and ``allocator`` with
  ``usage`` and ``served``;
- ``gpus``: ``inventory``.

``readings()`` answers every hosted node's allocator ``usage`` and ``served`` in one request
(the invariant watcher polls them every 50 ms); ``call(fn, *args)`` runs a module-level
function in the child (a benchmark's timers). Stopping or restarting one node's daemon or
kubelet is not offered: ``SimCluster`` refuses it while nodes run in node processes.

One request at a time goes over the pipe (a lock), and the child answers in order.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from simkube import child
from simkube.client import api_client

from .errors import ClusterError
from .node import NodeSettings, NodeSpec, SimNode, new_node, start_node, stop_node

log = logging.getLogger(__name__)

KUBELET_QUERIES = frozenset(("devices", "registered", "admitted", "failure", "env", "in_use"))
ALLOCATOR_QUERIES = frozenset(("usage", "served"))
"""What the parent may ask a hosted node's kubelet stand-in and allocator: answers are plain data."""


class NodeProcessError(ClusterError):
    """A node process did not start, or failed a request (its message says why)."""


@dataclass(frozen=True)
class NodeProcessSpec:
    """Everything a node process needs, picklable: the API's address and credentials, what
    every node shares, and per hosted node its spec, topology capture and (plugin, state,
    proc) directories."""

    api_url: str
    api_token: str
    api_ca_pem: bytes
    settings: NodeSettings
    nodes: tuple[tuple[NodeSpec, str, tuple[str, str, str]], ...]
    ready_timeout: float
    log_level: int


@dataclass(frozen=True)
class MetricsPorts:
    """A hosted node's metrics server, as ``SimNode.metrics_url`` and ``scrape_url`` read it."""

    port: int
    scrape_port: int


# --- the child ------------------------------------------------------------------------------------


def _address(node: SimNode) -> dict[str, Any]:
    server = node.daemon.metrics_server
    return {"metrics": (server.port, server.scrape_port) if server is not None else None,
            "checkpoint_path": node.kubelet.checkpoint_path}


def _admitted(pod: Any) -> Any:
    """A copy that pickles: a container's process handle stays in the child (its pid is ``gpu_pid``)."""
    if pod is None:
        return None
    return dataclasses.replace(pod, containers=[dataclasses.replace(ctr, process=None) for ctr in pod.containers])


def _handle(nodes: dict[str, SimNode], command: tuple[Any, ...]) -> Any:
    """The child's answer to one request of the parent."""
    verb = command[0]
    if verb == "readings":
        return {name: (node.daemon.allocator.usage(), node.daemon.allocator.served()) for name, node in nodes.items()}
    if verb == "call":
        _, fn, args = command
        return fn(*args)
    _, name, query, args = command
    node = nodes[name]
    if verb == "kubelet" and query in KUBELET_QUERIES:
        answer = getattr(node.kubelet, query)(*args)
        return _admitted(answer) if query == "admitted" else answer
    if verb == "allocator" and query in ALLOCATOR_QUERIES:
        return getattr(node.daemon.allocator, query)()
    if verb == "daemon" and query == "wait_ready":
        return node.daemon.wait_ready(*args)
    if verb == "gpus" and query == "inventory":
        return node.gpus.inventory()
    raise NodeProcessError(f"not a query a node process answers: {verb} {query!r}")


def _stop_all(nodes: dict[str, SimNode]) -> None:
    for node in reversed(list(nodes.values())):
        stop_node(node)


def _serve(conn: Connection, spec: NodeProcessSpec, label: str) -> None:
    """The child: start its nodes one by one (as ``SimCluster`` does), then answer the parent
    until told to stop (or the parent is gone)."""
    logging.basicConfig(level=spec.log_level, format=f"%(asctime)s %(levelname)s %(name)s [{label}]: %(message)s")
    nodes: dict[str, SimNode] = {}

    def client() -> Any:
        return api_client(spec.api_url, spec.api_token, spec.api_ca_pem)

    try:
        for node_spec, topology, dirs in spec.nodes:
            node = new_node(node_spec, Path(topology), dirs)
            nodes[node.name] = node  # stopped below with the others, should the rest fail
            start_node(node, spec.settings, client)
    except Exception as error:  # noqa: BLE001 - reported to the parent, which raises it
        _stop_all(nodes)
        conn.send(("failed", f"{type(error).__name__}: {error}"))
        return
    conn.send(("ready", {name: _address(node) for name, node in nodes.items()}))
    try:
        for command in child.commands(conn):
            try:
                conn.send(("ok", _handle(nodes, command)))
            except Exception as error:  # noqa: BLE001 - the parent raises it as NodeProcessError
                log.exception("node process request %r failed", command[:3])
                conn.send(("error", f"{type(error).__name__}: {error}"))
    finally:
        _stop_all(nodes)


# --- the parent -----------------------------------------------------------------------------------


class KubeletProxy:
    """A hosted node's kubelet stand-in: the same queries, answered by the child's."""

    def __init__(self, host: NodeProcess, node: str, checkpoint_path: str) -> None:
        self._host = host
        self._node = node
        self.checkpoint_path = checkpoint_path

    def _ask(self, query: str, *args: Any) -> Any:
        return self._host.request(("kubelet", self._node, query, args))

    def devices(self, resource: str) -> dict[str, str]:
        result: dict[str, str] = self._ask("devices", resource)
        return result

    def registered(self, resource: str) -> bool:
        return bool(self._ask("registered", resource))

    def admitted(self, uid: str) -> Any:
        """The ``AdmittedPod`` (a copy; each container's ``process`` is None here), or None."""
        return self._ask("admitted", uid)

    def failure(self, uid: str) -> str | None:
        result: str | None = self._ask("failure", uid)
        return result

    def env(self, namespace: str, name: str, container: str) -> dict[str, str] | None:
        result: dict[str, str] | None = self._ask("env", namespace, name, container)
        return result

    def in_use(self, resource: str) -> set[str]:
        result: set[str] = self._ask("in_use", resource)
        return result


class AllocatorProxy:
    """A hosted node's device plugin allocator: what it gave out, and to whom."""

    def __init__(self, host: NodeProcess, node: str) -> None:
        self._host = host
        self._node = node

    def usage(self) -> dict[int, tuple[int, int]]:
        result: dict[int, tuple[int, int]] = self._host.request(("allocator", self._node, "usage", ()))
        return result

    def served(self) -> dict[Any, Any]:
        result: dict[Any, Any] = self._host.request(("allocator", self._node, "served", ()))
        return result


class DaemonProxy:
    """A hosted node's daemon: readiness, its metrics server's ports and its allocator."""

    def __init__(self, host: NodeProcess, node: str, metrics: tuple[int, int] | None) -> None:
        self._host = host
        self._node = node
        self.metrics_server = MetricsPorts(*metrics) if metrics is not None else None
        self.allocator = AllocatorProxy(host, node)

    def wait_ready(self, timeout: float) -> bool:
        return bool(self._host.request(("daemon", self._node, "wait_ready", (timeout,))))


class GPUsProxy:
    """A hosted node's simulated GPUs, as the cluster's readiness check reads them."""

    def __init__(self, host: NodeProcess, node: str) -> None:
        self._host = host
        self._node = node

    def inventory(self) -> list[Any]:
        result: list[Any] = self._host.request(("gpus", self._node, "inventory", ()))
        return result


class NodeProcess:
    """Some nodes' kubelet stand-ins and node daemons in a spawned child, asked over a pipe."""

    def __init__(self, spec: NodeProcessSpec, *, name: str) -> None:
        self.spec = spec
        self.name = name
        self._process: Any = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self.exitcode: int | None = None
        """Once stopped: 0 when the child stopped its nodes and exited, negative when it had to be terminated."""

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def spawn(self) -> NodeProcess:
        """Start the child; it starts its nodes while the parent spawns the others (``await_ready``)."""
        if self._process is not None:
            raise RuntimeError(f"{self.name} is already running")
        self._process, self._conn = child.spawn(_serve, (self.spec, self.name), self.name)
        return self

    def await_ready(self) -> dict[str, SimNode]:
        """Once the child started its nodes: each hosted node, with proxies for its parts."""
        if self._conn is None:
            raise NodeProcessError(f"{self.name} is not running")
        # importing and starting its nodes one by one, each well within ready_timeout
        state, detail = child.await_ready(self._conn, self.spec.ready_timeout * 2 + 60)
        if state != "ready":
            self.stop()
            raise NodeProcessError(f"{self.name} did not start its nodes in time" if state == "timeout"
                                   else f"{self.name} failed to start its nodes: {detail}")
        nodes = {}
        for spec, _, (plugin_dir, state_dir, proc_root) in self.spec.nodes:
            address = detail[spec.name]
            nodes[spec.name] = SimNode(spec, GPUsProxy(self, spec.name),
                                       KubeletProxy(self, spec.name, address["checkpoint_path"]),
                                       DaemonProxy(self, spec.name, address["metrics"]),
                                       plugin_dir, state_dir, proc_root)
        return nodes

    def request(self, command: tuple[Any, ...]) -> Any:
        """One request to the child and its answer; raises NodeProcessError with the child's reason."""
        with self._lock:
            state, detail = child.ask(self._conn, command)
        if state == "gone":
            raise NodeProcessError(f"{self.name} is gone: {detail}")
        if state != "ok":
            raise NodeProcessError(f"{self.name} failed {command[0]!r}: {detail}")
        return detail

    def readings(self) -> dict[str, tuple[dict[int, tuple[int, int]], dict[Any, Any]]]:
        """Every hosted node's allocator ``usage()`` and ``served()``, in one request."""
        result: dict[str, tuple[dict[int, tuple[int, int]], dict[Any, Any]]] = self.request(("readings",))
        return result

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the child (``fn`` must be importable there: a module-level function)."""
        return self.request(("call", fn, args))

    def stop(self, timeout: float = 60.0) -> None:
        """The child stops its nodes (daemons, then kubelet stand-ins, last node first) and exits."""
        with self._lock:
            process, conn = self._process, self._conn
            self._process, self._conn = None, None
        child.stop(process, conn, timeout)
        if process is not None:
            self.exitcode = process.exitcode
