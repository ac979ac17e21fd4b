"""The simulated cluster: every real component, wired the way a cluster wires them.

    with SimCluster([NodeSpec("gpu-a", "a100-sxm-4gpu-nv4.txt"),
                     NodeSpec("gpu-b", "p40-7gpu-pix-phb.txt", model="Tesla P40", memory_mib=24576)]) as cluster:
        cluster.create_notebook_pod("alice", cores=25, memory="8GiB")
        pod = cluster.wait_for_pod("default", "alice", phase="Running")

What runs, each talking its real protocol to the next:

- the Kubernetes API (``simkube.apiserver.SimKubeAPI``), with a kubeconfig under ``workdir``;
- the scheduler extender (``extender.Extender``, HTTP on 127.0.0.1) and the kube-scheduler
  stand-in (``simkube.scheduler.SimScheduler``) configured from ``deploy/scheduler/config.yaml``
  (``scheduler_config_path()``) with the extender's address swapped in;
- per node: simulated GPUs from a topology fixture (``jupyter_vgpu.gpu.simulated``), the
  kubelet stand-in (``demo.kubelet.SimKubelet``, which registers the Node) and the node
  daemon (``deviceplugin.daemon.NodeDaemon``: device plugin gRPC servers on unix sockets,
  node annotation, health, and the metrics server on an ephemeral port).

Components can be stopped and restarted one at a time (``restart_daemon``,
``restart_kubelet``, ``restart_extender``, ``restart_api``) for failure tests.

``api_process=True`` runs the API server in a spawned process (``simkube.process``) and
``control_plane_process=True`` the extender and the scheduler stand-in in another
(``demo.control_plane``), as deployed, where neither shares a host with the notebook
nodes; ``extender`` is then a proxy with the same address and ledger queries.
``node_processes=N`` hosts the nodes in N spawned children (``demo.node_process``), as
each node of a real cluster is a host of its own; failure tests keep them in this process.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simkube.apiserver import SimKubeAPI
from simkube.process import SimKubeAPIProcess

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.data import TOPOLOGY_DIR

from .errors import ClusterError
from .node import (
    NodeSettings,
    NodeSpec,
    SimNode,
    expected_allocatable,
    new_daemon,
    new_node,
    start_node,
    stop_node,
)
from .workloads import ClusterWorkloads

__all__ = ["ClusterError", "NodeSpec", "SimCluster", "SimNode", "scheduler_config_path"]

log = logging.getLogger(__name__)


def scheduler_config_path() -> Path:
    """deploy/scheduler/config.yaml in a checkout; the copy the wheel packs beside this module otherwise."""
    here = Path(__file__).resolve()
    checkout = here.parents[3] / "deploy" / "scheduler" / "config.yaml"
    return checkout if checkout.exists() else here.with_name("scheduler-config.yaml")


class SimCluster(ClusterWorkloads):
    def __init__(self, nodes: Sequence[NodeSpec], *, workdir: str | None = None,
                 fixtures_dir: str | os.PathLike[str] | None = None, policy: str = "binpack",
                 enforcement: str = "hami-core", run_processes: bool = False, metrics_period: float = 1.0,
                 scheduler_config: str | os.PathLike[str] | None = None, names: c.Names = c.DEFAULT_NAMES,
                 kube_port: int = 0, ready_timeout: float = 60.0, api_process: bool = False,
                 control_plane_process: bool = False, node_processes: int = 0, host_pid: bool = True) -> None:
        """``api_process``: run the API server in a process of its own (``simkube.process``), so
        it does not share this process's GIL; the store is then out of reach (no ``kube.call``).
        ``control_plane_process``: the extender and the scheduler stand-in in another
        (``demo.control_plane``); ``extender`` is then an ``ExtenderProxy`` (address, ledger
        queries) and ``scheduler`` None.
        ``node_processes``: host the nodes (kubelet stand-in and node daemon each) in that many
        spawned children, dealt round-robin (``demo.node_process``); each node's ``kubelet``,
        ``daemon`` and ``gpus`` are then proxies with the queries tests and benchmarks read, and
        stopping or restarting one node's daemon or kubelet is refused (``ClusterError``).
        ``host_pid``: the node daemons run in the host's PID namespace, as the DaemonSet's ``hostPID``
        puts them; False shows them what a daemon without it gets (``NodeSettings.host_pid``)."""
        if not nodes:
            raise ValueError("a simulated cluster needs at least one node")
        duplicates = {spec.name for spec in nodes if sum(s.name == spec.name for s in nodes) > 1}
        if duplicates:
            raise ValueError(f"node names must be unique: {', '.join(sorted(duplicates))}")
        if node_processes < 0:
            raise ValueError(f"node_processes must be 0 (in this process) or more, not {node_processes}")
        self.specs = tuple(nodes)
        self.node_processes = node_processes
        self.node_hosts: list[Any] = []  # demo.node_process.NodeProcess, each hosting some nodes
        self.fixtures_dir = Path(fixtures_dir) if fixtures_dir else TOPOLOGY_DIR
        self.policy = policy
        self.enforcement = enforcement
        self.run_processes = run_processes
        self.metrics_period = metrics_period
        self.host_pid = host_pid
        self.scheduler_config = scheduler_config
        self.names = names
        self.ready_timeout = ready_timeout
        self.scrape_token = secrets.token_hex(16)  # what Prometheus would send to every node's scrape port
        self.queue_token = secrets.token_hex(16)  # what the extender's GET /queue wants (the Hub, the demo lab)
        # Unix socket paths must stay under ~100 characters: keep the work dir short.
        self._own_workdir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="vgsim-", dir="/tmp")
        self.kube: Any = SimKubeAPIProcess(port=kube_port) if api_process else SimKubeAPI(port=kube_port)
        self.kubeconfig = os.path.join(self.workdir, "kubeconfig")
        self.control_plane_process = control_plane_process
        self.control_plane: Any = None  # demo.control_plane.ControlPlaneProcess when control_plane_process
        self._plane: Any = None  # demo.control_plane.ControlPlane otherwise: the two in this process
        self.nodes: dict[str, SimNode] = {}
        self._started = False

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> SimCluster:
        if self._started:
            raise RuntimeError("the simulated cluster is already running")
        self._started = True
        try:
            self.kube.start()
            self.kube.write_kubeconfig(self.kubeconfig)
            self._start_extender()
            if self.node_processes:
                self._start_node_processes()
            else:
                for index, spec in enumerate(self.specs):
                    self._start_node(index, spec)
            for node in self.nodes.values():
                self._wait_node_ready(node)
            self._start_scheduler()
        except BaseException:
            self.stop()
            raise
        log.info("simulated cluster up: API %s, extender %s, nodes %s", self.kube.url, self.extender.url,
                 ", ".join(self.nodes))
        return self

    def stop(self) -> None:
        if self._plane is not None:
            self._plane.stop_scheduler()
        if self.node_hosts:
            for host in reversed(self.node_hosts):  # each stops its nodes, as below
                host.stop()
            self.node_hosts.clear()
        else:
            for node in reversed(list(self.nodes.values())):
                stop_node(node)
        self.nodes.clear()
        for plane in (self.control_plane, self._plane):
            if plane is not None:
                plane.stop()
        self.control_plane = self._plane = None
        self.kube.stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self._started = False

    def __enter__(self) -> SimCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- clients ---------------------------------------------------------------------------------

    def api_client(self) -> Any:
        return self.kube.api_client()

    def node(self, name: str) -> SimNode:
        try:
            return self.nodes[name]
        except KeyError:
            raise KeyError(f"no node {name!r}; nodes: {', '.join(self.nodes)}") from None

    # --- components ------------------------------------------------------------------------------

    @property
    def extender(self) -> Any:
        """The extender (``extender.server.Extender``), or its ``ExtenderProxy`` when the control
        plane runs in its own process; None while stopped."""
        if self.control_plane is not None:
            return self.control_plane.extender
        return self._plane.extender if self._plane is not None else None

    @property
    def scheduler(self) -> Any:
        """The kube-scheduler stand-in; None while stopped or when it runs in the control plane's process."""
        return self._plane.scheduler if self._plane is not None else None

    def _start_extender(self) -> None:
        """The extender; in its own process with the scheduler when ``control_plane_process``."""
        from .control_plane import ControlPlane, ControlPlaneProcess, ControlPlaneSpec

        spec = ControlPlaneSpec.for_api(self.kube, scheduler_config=self.scheduler_config or scheduler_config_path(),
                                        policy=self.policy, names=self.names, queue_token=self.queue_token,
                                        ready_timeout=self.ready_timeout)
        if self.control_plane_process:  # the scheduler starts with it, in the same child
            self.control_plane = ControlPlaneProcess(spec).start()
            return
        self._plane = ControlPlane(spec)
        self._plane.start_extender()

    def _start_scheduler(self) -> None:
        """In this process, once the nodes are ready (the control plane's process started its own)."""
        if self._plane is not None:
            self._plane.start_scheduler()

    def _node_dirs(self, index: int) -> tuple[str, str, str]:
        base = os.path.join(self.workdir, f"n{index}")
        dirs = (os.path.join(base, "dp"), os.path.join(base, "state"), os.path.join(base, "proc"))
        for path in dirs:
            os.makedirs(path, exist_ok=True)
        return dirs

    @property
    def _node_settings(self) -> NodeSettings:
        return NodeSettings(self.names, self.enforcement, self.run_processes, self.metrics_period, self.scrape_token,
                            self.host_pid)

    def _start_node(self, index: int, spec: NodeSpec) -> None:
        node = new_node(spec, spec.topology_path(self.fixtures_dir), self._node_dirs(index))
        self.nodes[spec.name] = node  # stop() closes what started of it, should the rest fail
        start_node(node, self._node_settings, self.api_client)

    def _start_node_processes(self) -> None:
        """The nodes dealt round-robin to ``node_processes`` children, started side by side;
        ``nodes`` then holds each one's proxies, in the specs' order."""
        from .node_process import NodeProcess, NodeProcessSpec

        count = min(self.node_processes, len(self.specs))
        dealt: list[list[tuple[NodeSpec, str, tuple[str, str, str]]]] = [[] for _ in range(count)]
        for index, spec in enumerate(self.specs):
            dealt[index % count].append((spec, str(spec.topology_path(self.fixtures_dir)), self._node_dirs(index)))
        level = logging.getLogger().getEffectiveLevel()
        for number, hosted in enumerate(dealt):
            spec = NodeProcessSpec(self.kube.url, self.kube.token, self.kube.identity.cert_pem, self._node_settings,
                                   tuple(hosted), self.ready_timeout, level)
            self.node_hosts.append(NodeProcess(spec, name=f"sim-nodes-{number}").spawn())
        proxies: dict[str, SimNode] = {}
        for host in self.node_hosts:
            proxies.update(host.await_ready())
        for spec in self.specs:
            self.nodes[spec.name] = proxies[spec.name]

    def _wait_node_ready(self, node: SimNode) -> None:
        """Registered with kubelet, capacity published, inventory annotated: schedulable."""
        if not node.daemon.wait_ready(self.ready_timeout):
            raise ClusterError(f"node {node.name}: the device plugin did not register with the kubelet")
        expected, expected_memory = expected_allocatable(node.gpus.inventory())
        seen: dict[str, Any] = {}

        def published() -> bool:
            raw = json.loads(self.core_v1.read_node(node.name, _preload_content=False).data)
            allocatable = (raw.get("status") or {}).get("allocatable") or {}
            annotations = (raw.get("metadata") or {}).get("annotations") or {}
            seen.update(allocatable=allocatable.get(self.names.core_resource),
                        memory=allocatable.get(self.names.memory_resource),
                        inventory=self.names.node_inventory in annotations)
            return seen["allocatable"] == expected and seen["memory"] == expected_memory and seen["inventory"]

        try:
            self.wait_for(published, what=f"node {node.name} to publish {expected} {self.names.core_resource}, "
                                          f"{expected_memory} {self.names.memory_resource} and its GPU inventory")
        except ClusterError as error:
            held = sum(h == "Healthy" for h in node.kubelet.devices(self.names.core_resource).values())
            raise ClusterError(
                f"{error} (last seen: allocatable {seen.get('allocatable')} / {seen.get('memory')}, inventory annotation "
                f"{'present' if seen.get('inventory') else 'missing'}; the kubelet stand-in holds {held} healthy "
                f"{self.names.core_resource} devices)") from None

    def device_plugin_readings(self) -> dict[str, tuple[dict[int, tuple[int, int]], dict[Any, Any]]]:
        """Node -> (its allocator's ``usage()``, its ``served()``), for every node whose daemon
        runs: one request per node process rather than two per node (the invariant watcher
        polls these every 50 ms)."""
        if self.node_hosts:
            readings: dict[str, Any] = {}
            for host in self.node_hosts:
                readings.update(host.readings())
            return {name: readings[name] for name in self.nodes if name in readings}
        readings = {}
        for name, node in list(self.nodes.items()):
            daemon = node.daemon  # None while a failure test has it stopped
            if daemon is not None:
                readings[name] = (daemon.allocator.usage(), daemon.allocator.served())
        return readings

    # --- failure injection -------------------------------------------------------------------------

    def _in_this_process(self, name: str, what: str) -> SimNode:
        node = self.node(name)
        if self.node_hosts:
            raise ClusterError(f"cannot {what} on {name}: its node runs in a node process "
                               "(start the cluster without node_processes for failure tests)")
        return node

    def stop_daemon(self, name: str) -> None:
        node = self._in_this_process(name, "stop the node daemon")
        if node.daemon is not None:
            node.daemon.stop()
            node.daemon = None

    def start_daemon(self, name: str) -> None:
        node = self._in_this_process(name, "start the node daemon")
        if node.daemon is not None:
            raise RuntimeError(f"the node daemon on {name} is already running")
        node.daemon = new_daemon(node, self._node_settings, self.api_client()).start()
        self._wait_node_ready(node)

    def restart_daemon(self, name: str) -> None:
        """The DaemonSet pod restarting: a new daemon process over the same dirs and checkpoint."""
        self.stop_daemon(name)
        self.start_daemon(name)

    def restart_kubelet(self, name: str) -> None:
        """kubelet restarting: sockets wiped, the device plugin must register again."""
        node = self._in_this_process(name, "restart the kubelet stand-in")
        node.kubelet.restart()
        self._wait_node_ready(node)

    def queue_environment(self) -> dict[str, str]:
        """What the demo's share requester needs to show a waiting request's place in the queue:
        the extender's address and a file (mode 0600) holding the queue token."""
        path = os.path.join(self.workdir, "queue-token")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "w", encoding="utf-8") as handle:
            handle.write(self.queue_token)
        from .requester import ENV_QUEUE_TOKEN_FILE, ENV_QUEUE_URL

        return {ENV_QUEUE_URL: self.extender.base_url, ENV_QUEUE_TOKEN_FILE: path}

    def restart_extender(self) -> None:
        """The extender's Deployment pod restarting on the same address (its state is rebuilt)."""
        (self.control_plane or self._plane).restart_extender()

    def restart_api(self) -> None:
        """The API server restarting: same objects, same port; watches must resume."""
        self.kube.restart()
