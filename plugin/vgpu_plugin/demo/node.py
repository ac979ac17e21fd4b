"""One simulated GPU node: its spec, its parts (simulated GPUs, the kubelet stand-in, the node
daemon) and how they start and stop. ``SimCluster`` builds its nodes with these in its own
process, and each ``demo.node_process`` child builds the nodes it hosts the same way."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_vgpu.core import contract as c

__all__ = ["NodeSettings", "NodeSpec", "SimNode", "expected_allocatable", "new_daemon", "new_kubelet", "new_node",
           "simulated_gpus", "start_node", "stop_node"]

DEFAULT_MODEL = "NVIDIA A100-SXM4-40GB"
DEFAULT_MEMORY_MIB = 40960


@dataclass(frozen=True)
class NodeSpec:
    """One GPU node: its name, an ``nvidia-smi topo -m`` capture, and the cards' model and memory."""

    name: str
    topology: str  # a file in the fixtures dir, or a path
    model: str = DEFAULT_MODEL
    memory_mib: int = DEFAULT_MEMORY_MIB
    labels: Mapping[str, str] = field(default_factory=dict)
    seed: int = 0
    mig: Mapping[int, Sequence[str]] = field(default_factory=dict)
    """Card index -> the MIG profiles an admin created on it ("2g.10gb", ...), set before the node starts."""
    gpu_sharing: str | None = None
    """The node's ``Names.gpu_sharing`` annotation (the admin's time-shared / MIG choice)."""

    def topology_path(self, fixtures_dir: Path) -> Path:
        """The capture: ``topology`` as a path, else a file of that name in ``fixtures_dir``."""
        path = Path(self.topology)
        if not path.is_absolute() and not path.exists():
            path = fixtures_dir / self.topology
        if not path.exists():
            raise FileNotFoundError(f"node {self.name}: no topology capture {self.topology!r} (looked in {fixtures_dir})")
        return path


@dataclass
class SimNode:
    spec: NodeSpec
    gpus: Any  # jupyter_vgpu.gpu.simulated.SimulatedGPUs
    kubelet: Any  # demo.kubelet.SimKubelet
    daemon: Any  # deviceplugin.daemon.NodeDaemon
    plugin_dir: str
    state_dir: str
    proc_root: str

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def metrics_url(self) -> str | None:
        server = self.daemon.metrics_server if self.daemon is not None else None
        return f"http://127.0.0.1:{server.port}" if server is not None else None

    @property
    def scrape_url(self) -> str | None:
        """Prometheus /metrics and /metric (bearer SimCluster.scrape_token)."""
        server = self.daemon.metrics_server if self.daemon is not None else None
        return f"http://127.0.0.1:{server.scrape_port}" if server is not None else None


@dataclass(frozen=True)
class NodeSettings:
    """What every node of a cluster starts with besides its own spec; picklable (node processes)."""

    names: c.Names
    enforcement: str
    run_processes: bool
    metrics_period: float
    scrape_token: str
    host_pid: bool = True
    """The node daemon runs in the host's PID namespace (the DaemonSet's ``hostPID``); without it
    the driver shows the daemon no pod's GPU process, as on a real node."""


def simulated_gpus(spec: NodeSpec, topology: Path) -> Any:
    """The node's simulated GPUs (``jupyter_vgpu.gpu.simulated.SimulatedGPUs``), its MIG layout
    set as an admin would before the node starts."""
    from jupyter_vgpu.gpu.simulated import SimulatedGPUs

    gpus = SimulatedGPUs.from_fixture(topology, model=spec.model, memory_mib=spec.memory_mib, seed=spec.seed,
                                      host=spec.name)
    for card, layout in spec.mig.items():
        gpus.set_mig_layout(card, list(layout))
    return gpus


def new_node(spec: NodeSpec, topology: Path, dirs: tuple[str, str, str]) -> SimNode:
    """The node's simulated GPUs; kubelet stand-in and daemon not started yet."""
    plugin_dir, state_dir, proc_root = dirs
    return SimNode(spec, simulated_gpus(spec, topology), None, None, plugin_dir, state_dir, proc_root)


def start_node(node: SimNode, settings: NodeSettings, api_client: Callable[[], Any]) -> None:
    """The kubelet stand-in (which registers the Node), the spec's labels and annotation, then the daemon."""
    import kubernetes.client

    node.kubelet = new_kubelet(node, settings, api_client()).start()
    spec = node.spec
    if spec.labels:
        kubernetes.client.CoreV1Api(api_client()).patch_node(spec.name, {"metadata": {"labels": dict(spec.labels)}})
    if spec.gpu_sharing is not None:
        kubernetes.client.CoreV1Api(api_client()).patch_node(
            spec.name, {"metadata": {"annotations": {settings.names.gpu_sharing: spec.gpu_sharing}}})
    node.daemon = new_daemon(node, settings, api_client()).start()


def stop_node(node: SimNode) -> None:
    if node.daemon is not None:
        node.daemon.stop()
    if node.kubelet is not None:
        node.kubelet.stop()
    node.gpus.close()


def new_kubelet(node: SimNode, settings: NodeSettings, client: Any) -> Any:
    from .kubelet import SimKubelet

    return SimKubelet(node.name, node.plugin_dir, client, gpus=node.gpus, proc_root=node.proc_root,
                      run_processes=settings.run_processes,
                      process_log_dir=os.path.join(os.path.dirname(node.plugin_dir), "logs"),
                      seed=node.spec.seed)


def new_daemon(node: SimNode, settings: NodeSettings, client: Any) -> Any:
    from ..deviceplugin.daemon import DaemonConfig, NodeDaemon
    from ..deviceplugin.enforcement import EnforcementConfig

    config = DaemonConfig(
        node=node.name, plugin_dir=node.plugin_dir, names=settings.names, state_dir=node.state_dir,
        enforcement=EnforcementConfig(mode=settings.enforcement,
                                      hami_root=os.path.join(node.state_dir, "hami"),
                                      hami_lock_dir=os.path.join(node.state_dir, "vgpulock")),
        metrics={"address": "127.0.0.1", "port": 0, "proc_root": node.proc_root,
                 "period": settings.metrics_period, "scrape_port": 0, "scrape_token": settings.scrape_token})
    # the daemon shares the driver with the kubelet's pods; which processes it sees is its namespace's
    gpus = node.gpus if settings.host_pid else node.gpus.seen_from(f"vgpu-node container on {node.name}")
    return NodeDaemon(config, gpus, client)


def expected_allocatable(inventory: Sequence[Any]) -> tuple[str, str]:
    """The node's vcuda-core and vcuda-memory allocatable once its device plugin has published
    every card of ``inventory`` (a MIG card's devices are what its slices hold together)."""
    from ..deviceplugin.devices import CORE, MEMORY, devices_per_card, serves

    mig = [card for card in inventory if card.mig and serves(card)]
    plain = [card for card in inventory if not card.mig]
    cores = len(plain) * 100 + sum(devices_per_card(CORE, card) for card in mig)
    memory = sum(card.memory_mib // c.MEMORY_UNIT_MIB for card in plain) + sum(devices_per_card(MEMORY, card) for card in mig)
    return str(cores), str(memory)
