"""A real Kubernetes cluster on this machine, with jupyter-vgpu deployed on it.

    with RealCluster([NodeSpec("gpu-a", "a100-sxm-4gpu-nv4.txt")]) as cluster:
        cluster.create_notebook_pod("alice", cores=25, memory="8GiB")
        pod = cluster.wait_for_pod("default", "alice", phase="Running")

What runs, each a process speaking its real protocol: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler as ``vgpu-scheduler`` calling our extender
(``control_plane.ControlPlane``), and per node a kubelet on Kubernetes' fake CRI runtime
with our node daemon on simulated GPUs (``node.RealNode``). The Kubernetes programs are
built from Kubernetes' own Go modules (``hack/kube``). It needs root (kubelet, and a mount
namespace per node) and Linux.

It offers what ``demo.cluster.SimCluster`` offers tests (``ClusterWorkloads``), and
restarts of each program, gracefully or killed, for failure tests.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.data import TOPOLOGY_DIR

from ..demo.errors import ClusterError
from ..demo.node import NodeSpec, expected_allocatable, simulated_gpus
from ..demo.workloads import ClusterWorkloads
from .binaries import kube_bin_dir
from .control_plane import ControlPlane, ControlPlaneError
from .node import RealNode, scrape_token

__all__ = ["NodeSpec", "RealCluster"]

log = logging.getLogger(__name__)


INOTIFY_PER_NODE = 7  # measured: a kubelet holds 6 (cAdvisor, config and certificate watches), a node daemon 1


def _check_inotify(nodes: int) -> None:
    """Every kubelet's cAdvisor needs inotify instances, and a host's default allows 128 per user:
    say so before forty kubelets start and fail one by one."""
    try:
        limit = int(Path("/proc/sys/fs/inotify/max_user_instances").read_text())
    except (OSError, ValueError):
        return
    needed = nodes * INOTIFY_PER_NODE + 32
    if limit < needed:
        raise ClusterError(f"{nodes} nodes need about {needed} inotify instances and this host allows {limit} "
                           f"per user: sysctl -w fs.inotify.max_user_instances={max(needed, 1024)}")


class RealCluster(ClusterWorkloads):
    def __init__(self, nodes: Sequence[NodeSpec], *, workdir: str | None = None,
                 bin_dir: str | os.PathLike[str] | None = None, fixtures_dir: str | os.PathLike[str] | None = None,
                 policy: str = "binpack", enforcement: str = "hami-core", names: c.Names = c.DEFAULT_NAMES,
                 metrics_period: float = 1.0, ready_timeout: float = 90.0,
                 daemon_args: Mapping[str, Sequence[str]] | None = None, extender_args: Sequence[str] = (),
                 deploy: Callable[[ControlPlane], None] | None = None) -> None:
        """``daemon_args``: node name -> more flags for that node's daemon (``--cdi true``);
        ``extender_args``: more flags for the extender (``--rival-wait 5``); ``deploy``: installs
        jupyter-vgpu's objects in place of applying deploy/base (``ControlPlane``)."""
        if not nodes:
            raise ValueError("a cluster needs at least one node")
        if len({spec.name for spec in nodes}) != len(nodes):
            raise ValueError("node names must be unique")
        if os.geteuid() != 0:
            raise ClusterError("the real cluster needs root: kubelet, and a mount namespace per node")
        _check_inotify(len(nodes))
        self.specs = tuple(nodes)
        self.fixtures_dir = Path(fixtures_dir) if fixtures_dir else TOPOLOGY_DIR
        self.policy, self.enforcement, self.names = policy, enforcement, names
        self.metrics_period, self.ready_timeout = metrics_period, ready_timeout
        self.daemon_args = {name: list(args) for name, args in (daemon_args or {}).items()}
        self.extender_args = list(extender_args)
        self.deploy = deploy
        self._own_workdir = workdir is None
        # unix socket paths must stay under ~100 characters: keep the work dir short
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="vgreal-", dir="/tmp"))
        self.bin_dir = kube_bin_dir(bin_dir)
        self.plane: ControlPlane | None = None
        self.nodes: dict[str, RealNode] = {}
        self.scrape_token = ""

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> RealCluster:
        try:
            self.plane = ControlPlane(self.workdir, self.bin_dir, policy=self.policy, ready_timeout=self.ready_timeout,
                                      extender_args=self.extender_args, deploy=self.deploy).start()
            token_file = self.workdir / "scrape-token"
            self.scrape_token = scrape_token(token_file)
            for index, spec in enumerate(self.specs):
                node = RealNode(spec, spec.topology_path(self.fixtures_dir), self.plane, self.workdir / f"n{index}",
                                enforcement=self.enforcement, names=self.names, scrape_token_file=token_file,
                                metrics_period=self.metrics_period, daemon_args=self.daemon_args.get(spec.name, ()))
                self.nodes[spec.name] = node
                node.start_kubelet()
            for node in self.nodes.values():
                self._wait_registered(node)
                self._label(node)
                node.start_daemon()
            for node in self.nodes.values():
                self.wait_published(node)
            self.plane.start_scheduler()
        except BaseException:
            self.stop()
            raise
        log.info("real cluster up: API %s, extender %s, nodes %s", self.plane.server, self.plane.extender_url,
                 ", ".join(self.nodes))
        return self

    def stop(self) -> None:
        if self.plane is not None:
            for name in ("kube-scheduler", "extender"):
                program = self.plane.programs.get(name)
                if program is not None:
                    program.stop()
        for node in reversed(list(self.nodes.values())):
            node.stop()
        if self.plane is not None:
            self.plane.stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> RealCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- clients ---------------------------------------------------------------------------------

    @property
    def control_plane(self) -> ControlPlane:
        if self.plane is None:
            raise ClusterError("the cluster is not started")
        return self.plane

    @property
    def kubeconfig(self) -> str:
        """An admin's kubeconfig (client certificate in system:masters)."""
        return str(self.control_plane.kubeconfig)

    def api_client(self) -> Any:
        import kubernetes.config

        return kubernetes.config.new_client_from_config(config_file=self.kubeconfig)

    @property
    def version(self) -> str:
        """The Kubernetes release the API server reports."""
        return str(json.loads(self.kubectl("version", "-o", "json"))["serverVersion"]["gitVersion"])

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        """This cluster's own kubectl (the same Kubernetes release), as an admin."""
        return self.control_plane.kubectl(*args, input=input, check=check)

    def node(self, name: str) -> RealNode:
        try:
            return self.nodes[name]
        except KeyError:
            raise KeyError(f"no node {name!r}; nodes: {', '.join(self.nodes)}") from None

    # --- nodes -----------------------------------------------------------------------------------

    def _read_node(self, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return json.loads(self.core_v1.read_node(name, _preload_content=False).data)  # type: ignore[no-any-return]
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def _wait_registered(self, node: RealNode) -> None:
        def ready() -> bool:
            for program in (node.runtime, node.kubelet):
                ended = program.exited()
                if ended:
                    raise ClusterError(ended)
            raw = self._read_node(node.name)
            conditions = ((raw or {}).get("status") or {}).get("conditions") or []
            return any(cond["type"] == "Ready" and cond["status"] == "True" for cond in conditions)

        self.wait_for(ready, what=f"kubelet of {node.name} to register a Ready node")

    def _label(self, node: RealNode) -> None:
        """What an admin does to a new GPU node before the daemon starts."""
        metadata: dict[str, Any] = {}
        if node.spec.labels:
            metadata["labels"] = dict(node.spec.labels)
        if node.spec.gpu_sharing is not None:
            metadata["annotations"] = {self.names.gpu_sharing: node.spec.gpu_sharing}
        if metadata:
            self.core_v1.patch_node(node.name, {"metadata": metadata})

    def expected_allocatable(self, node: RealNode) -> tuple[str, str]:
        """What the node's daemon will publish: worked out from the same cards it simulates."""
        gpus = simulated_gpus(node.spec, node.topology)
        try:
            return expected_allocatable(gpus.inventory())
        finally:
            gpus.close()

    def wait_published(self, node: RealNode) -> None:
        """The device plugin registered and kubelet publishes every card; the inventory annotated."""
        cores, memory = self.expected_allocatable(node)
        seen: dict[str, Any] = {}

        def published() -> bool:
            if node.daemon is not None and node.daemon.exited():
                raise ClusterError(node.daemon.exited())
            raw = self._read_node(node.name) or {}
            allocatable = (raw.get("status") or {}).get("allocatable") or {}
            seen.update(cores=allocatable.get(self.names.core_resource),
                        memory=allocatable.get(self.names.memory_resource),
                        inventory=self.names.node_inventory in ((raw.get("metadata") or {}).get("annotations") or {}))
            return seen["cores"] == cores and seen["memory"] == memory and bool(seen["inventory"])

        try:
            self.wait_for(published, what=f"node {node.name} to publish {cores} {self.names.core_resource}, "
                                          f"{memory} {self.names.memory_resource} and its GPU inventory")
        except ClusterError as error:
            raise ClusterError(f"{error} (last seen: {seen})") from None

    # --- failures --------------------------------------------------------------------------------

    def restart_kubelet(self, name: str, *, kill: bool = False) -> None:
        """kubelet restarting on the same root dir: the device plugin must register again."""
        node = self.node(name)
        node.kubelet.restart(kill=kill)
        self.wait_published(node)

    def restart_daemon(self, name: str, *, kill: bool = False) -> None:
        """The DaemonSet pod restarting: a new daemon over the same dirs and kubelet checkpoint."""
        node = self.node(name)
        if node.daemon is not None:
            node.daemon.stop(kill=kill)
        node.start_daemon()
        self.wait_published(node)

    def restart_extender(self, *, kill: bool = False) -> None:
        self.control_plane.restart_extender(kill=kill)

    def restart_scheduler(self, *, kill: bool = False) -> None:
        self.control_plane.restart_scheduler(kill=kill)

    @property
    def extender_url(self) -> str:
        return self.control_plane.extender_url


__all__ += ["ClusterError", "ControlPlaneError"]
