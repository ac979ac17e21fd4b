"""Building a healthy simulated GPU node for the doctor: temporary roots laid out as on a real node
(kubelet's directory with listening sockets and a checkpoint, /dev, HAMi-core, /proc with a
pod's process, containerd's config) and the simulated API holding what the cluster would."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client
from vgpu_plugin.deviceplugin.checkpoint import PodDeviceEntry, write_checkpoint
from vgpu_plugin.doctor.setup import NodeSetup

from jupyter_vgpu.core import contract
from jupyter_vgpu.gpu import node_inventory, resolve_fixture
from jupyter_vgpu.gpu.simulated import SimulatedGPUs

NODE = "gpu-node-1"
NAMESPACE = "vgpu-system"
NAMES = contract.DEFAULT_NAMES
NOTEBOOK_PID_NAMESPACE = "container " + "4f3c2b1a" * 8  # build_host's notebook container
CONTAINERD_NVIDIA_DEFAULT = """
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
  BinaryName = "/usr/bin/nvidia-container-runtime"
"""

# the NVIDIA Container Toolkit's config.toml as `nvidia-ctk config` writes it, hardened
TOOLKIT_HARDENED = """
accept-nvidia-visible-devices-as-volume-mounts = false
accept-nvidia-visible-devices-envvar-when-unprivileged = false
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"

[nvidia-container-cli]
environment = []
ldconfig = "@/sbin/ldconfig.real"
load-kmods = true

[nvidia-container-runtime]
log-level = "info"
mode = "auto"
runtimes = ["docker-runc", "runc", "crun"]
"""


class SimNode(SimulatedGPUs):
    """Simulated cards with a real-looking driver version and per-card MIG mode."""

    def __init__(self, *args: Any, driver: str = "550.54.15", mig: frozenset[int] = frozenset(), **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._driver_text = driver
        self._mig_cards = mig  # not _mig: the backend may keep its own MIG state there

    def driver_version(self) -> str | None:
        return None if self.problem() else self._driver_text

    def mig_mode(self, index: int) -> bool:
        return index in self._mig_cards


def sim_node(**kwargs: Any) -> SimNode:
    from jupyter_vgpu.core.topology import parse_nvidia_smi_topo

    topology = parse_nvidia_smi_topo(Path(resolve_fixture("a100-sxm-4gpu-nv4")).read_text())
    return SimNode(topology, host=NODE, **kwargs)


@dataclass
class Node:
    root: Path
    setup: NodeSetup
    core: Any  # CoreV1Api on the simulated API
    sockets: dict[str, socket.socket]
    pod_uid: str

    def close_socket(self, name: str) -> None:
        self.sockets.pop(name).close()


def listen(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    return server


def build_cluster(kube: Any, backend: SimNode) -> tuple[Any, str]:
    """The cluster side: namespace, RuntimeClass, the Node as the daemon leaves it, the
    vgpu-node and vgpu-scheduler pods, and a notebook pod with a share. Returns (core, notebook uid)."""
    api = kube.api_client()
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    kubernetes.client.NodeV1Api(api).create_runtime_class(
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"})
    cards = backend.inventory()
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", NAMES.core_resource: str(100 * len(cards)),
                NAMES.memory_resource: str(sum(c.memory_units for c in cards))}
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": NODE, "labels": {"vgpu.jupyter.org/node": "true"},
        "annotations": {NAMES.node_inventory: node_inventory(backend, NODE).to_json()}},
        "status": {"capacity": capacity, "allocatable": capacity}})

    def pod(namespace: str, name: str, labels: dict, containers: list, runtime_class: str | None = "nvidia") -> Any:
        spec: dict[str, Any] = {"nodeName": NODE, "containers": containers}
        if runtime_class:
            spec["runtimeClassName"] = runtime_class
        return core.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": namespace, "labels": labels}, "spec": spec})

    pod(NAMESPACE, "vgpu-node-x7k2p", {"app.kubernetes.io/name": "vgpu-node"},
        [{"name": "node", "image": "ghcr.io/jupyter-vgpu/jupyter-vgpu-node:0.1.0"}])
    scheduler = core.create_namespaced_pod(NAMESPACE, {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "vgpu-scheduler-5c9d", "namespace": NAMESPACE, "labels": {"app.kubernetes.io/name": "vgpu-scheduler"}},
        "spec": {"nodeName": "cpu-node-1", "containers": [
            {"name": "kube-scheduler", "image": "registry.k8s.io/kube-scheduler:v1.32.4"},
            {"name": "extender", "image": "ghcr.io/jupyter-vgpu/jupyter-vgpu-node:0.1.0"}]}})
    assert scheduler.metadata.name
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "jhub"}})
    limits = {NAMES.core_resource: "25", NAMES.memory_resource: "40"}
    notebook = pod("jhub", "jupyter-ann", {"component": "singleuser-server"},
                   [{"name": "notebook", "image": "ghcr.io/jupyter-vgpu/singleuser:0.1.0",
                     "resources": {"limits": limits, "requests": limits}}])
    return core, notebook.metadata.uid


def cdi_spec(names: list[str]) -> str:
    """A CDI spec of kind nvidia.com/gpu naming these devices, in the shape nvidia-ctk writes."""
    devices = "".join(f"  - name: {name}\n    containerEdits:\n      deviceNodes:\n        - path: /dev/nvidia0\n"
                      for name in names)
    return f"cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n{devices}containerEdits: {{}}\n"


def build_host(root: Path, backend: SimNode, notebook_uid: str) -> dict[str, str]:
    """The node's files: returns the roots for NodeSetup."""
    plugin_dir = root / "var/lib/kubelet/device-plugins"
    plugin_dir.mkdir(parents=True)
    entries = [PodDeviceEntry(notebook_uid, "notebook", NAMES.core_resource, tuple(f"gpu0-core-{i:02d}" for i in range(25))),
               PodDeviceEntry(notebook_uid, "notebook", NAMES.memory_resource, tuple(f"gpu0-mem-{i:04d}" for i in range(40)))]
    write_checkpoint(str(plugin_dir / "kubelet_internal_checkpoint"), entries,
                     {NAMES.core_resource: [], NAMES.memory_resource: []})
    dev = root / "dev"
    dev.mkdir()
    for name in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] + [f"nvidia{c.minor}" for c in backend.inventory()]:
        (dev / name).touch()
    hami = root / "usr/local/vgpu"
    (hami / "containers").mkdir(parents=True)
    (hami / "libvgpu.so").write_bytes(b"\x7fELF")
    (hami / "libvgpu.so").chmod(0o644)
    (hami / "ld.so.preload").write_text("/usr/local/vgpu/libvgpu.so\n")
    cache = hami / "containers" / "a1b2c3d4e5f6"
    cache.mkdir()
    cache.chmod(0o777)
    lock = root / "tmp/vgpulock"
    lock.mkdir(parents=True)
    lock.chmod(0o1777)
    mps = root / "run/nvidia-mps"
    (mps / "shm").mkdir(parents=True)
    os.mkfifo(mps / "control")
    mps.chmod(0o1777)
    (mps / "shm").chmod(0o1777)
    proc = root / "proc"
    container = NOTEBOOK_PID_NAMESPACE.split()[1]
    processes = {
        1: ("systemd", "0::/init.scope\n"),
        311: ("nvidia-cuda-mps", "0::/system.slice/nvidia-mps.service\n"),
        4242: ("python", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                         f"{notebook_uid.replace('-', '_')}.slice/cri-containerd-{container}.scope\n"),
    }
    for pid, (comm, cgroup) in processes.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")
        (proc / str(pid) / "cgroup").write_text(cgroup)
    (root / "sys/fs/cgroup").mkdir(parents=True)
    (root / "sys/fs/cgroup/cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "etc/containerd").mkdir(parents=True)
    (root / "etc/containerd/config.toml").write_text(CONTAINERD_NVIDIA_DEFAULT)
    # the hardened toolkit: an image's NVIDIA_VISIBLE_DEVICES=all selects nothing in an unprivileged pod
    (root / "etc/nvidia-container-runtime").mkdir(parents=True)
    (root / "etc/nvidia-container-runtime/config.toml").write_text(TOOLKIT_HARDENED)
    # the CDI spec the device plugin's --cdi names resolve in: every card by UUID (nvidia-ctk's uuid strategy)
    (root / "var/run/cdi").mkdir(parents=True)
    (root / "var/run/cdi/nvidia.yaml").write_text(cdi_spec([card.uuid for card in backend.inventory()]))
    return {"plugin_dir": str(plugin_dir), "dev_root": str(dev), "hami_root": str(hami), "hami_lock_dir": str(lock),
            "mps_pipe_dir": str(mps), "mps_shm_dir": str(mps / "shm"), "proc_root": str(proc),
            "sysfs_root": str(root / "sys"), "host_root": str(root)}


def argv(node: Node, kube: Any) -> list[str]:
    """`jupyter-vgpu doctor`'s command line for a simulated node: every root, the simulated API."""
    s = node.setup
    return ["--node", NODE, "--gpus", "sim:a100-sxm-4gpu-nv4", "--kubeconfig", kube.kubeconfig,
            "--plugin-dir", s.plugin_dir, "--dev-root", s.dev_root, "--hami-root", s.hami_root,
            "--hami-lock-dir", s.hami_lock_dir, "--proc-root", s.proc_root, "--sysfs-root", s.sysfs_root,
            "--host-root", s.host_root, "--notebook-uid", str(s.notebook_uid), "--notebook-gid", str(s.notebook_gid),
            "--cdi", "true"]
