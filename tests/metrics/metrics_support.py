"""Helpers for the metrics tests: pods as the API server sends them, a fake proc root, simulated GPUs."""

from __future__ import annotations

import os
import secrets
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from simkube.waiting import wait_for
from vgpu_plugin.tokens import TokenMinter, new_allocation_id

from jupyter_vgpu.core.contract import (
    DEFAULT_NAMES,
    CardShare,
    ContainerAllocation,
    PodAllocation,
    Request,
    request_limits,
)
from jupyter_vgpu.gpu.base import GPUError
from jupyter_vgpu.gpu.simulated import SimulatedGPUs

NODE = "gpu-node-1"
SCRAPE_TOKEN = "scrape-token-for-the-tests-0123456789"  # what Prometheus sends to the scrape port
RUNTIMES = ("containerd", "cri-o", "docker")


def cgroup_text(pod_uid: str, container_id: str, runtime: str, qos: str = "burstable",
                driver: str = "systemd") -> str:
    """The /proc/<pid>/cgroup text kubelet's layout gives a container process (cgroup v2)."""
    if driver == "cgroupfs":
        leaf = f"crio-{container_id}" if runtime == "cri-o" else container_id
        qos_part = "" if qos == "guaranteed" else f"/{qos}"
        return f"0::/kubepods{qos_part}/pod{pod_uid}/{leaf}\n"
    scope = {"containerd": "cri-containerd", "cri-o": "crio", "docker": "docker"}[runtime]
    uid = pod_uid.replace("-", "_")
    if qos == "guaranteed":
        return f"0::/kubepods.slice/kubepods-pod{uid}.slice/{scope}-{container_id}.scope\n"
    return (f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid}.slice/"
            f"{scope}-{container_id}.scope\n")


@dataclass
class FakeNode:
    """A node's view of pods: pod dicts, a proc root with cgroup files, simulated GPUs."""

    gpus: SimulatedGPUs
    proc_root: str
    node: str = NODE
    pods: list[dict[str, Any]] = field(default_factory=list)
    _next_pid: int = 1000

    def items(self) -> list[dict[str, Any]]:
        return list(self.pods)

    def card_uuid(self, index: int) -> str:
        return self.gpus.inventory()[index].uuid

    def pod(self, name: str, shares: dict[str, tuple[int, int, tuple[int, ...]]], *, namespace: str = "hub",
            runtime: str = "containerd", node: str | None = None, phase: str = "Running",
            annotate: bool = True) -> dict[str, Any]:
        """A pod with containers name -> (cores, memory units, cards); containers with
        cores 0 ask for no vGPU. The allocation annotation is written as the device plugin leaves
        it once kubelet's checkpoint confirmed the admission: each vGPU container's record holds the
        allocation id of the read token it was given (``token()`` mints it)."""
        uid = str(uuid.uuid4())
        containers, statuses, allocations = [], [], []
        for index, (container, (cores, units, cards)) in enumerate(shares.items()):
            spec: dict[str, Any] = {"name": container, "image": "jupyter/base-notebook"}
            if cores:
                spec["resources"] = {"limits": request_limits(Request(cores, units))}
                allocations.append(ContainerAllocation(index, container, tuple(
                    CardShare(card, self.card_uuid(card), min(cores, 100), units // len(cards)) for card in cards),
                    allocation_id=new_allocation_id()))
            containers.append(spec)
            statuses.append({"name": container, "ready": True, "restartCount": 0,
                             "containerID": f"{runtime}://{secrets.token_hex(32)}"})
        annotations = {}
        if annotate and allocations:
            annotations[DEFAULT_NAMES.allocation] = PodAllocation(node or self.node, tuple(allocations)).to_json()
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": annotations},
            "spec": {"nodeName": node or self.node, "schedulerName": "vgpu-scheduler", "containers": containers},
            "status": {"phase": phase, "containerStatuses": statuses},
        }
        self.pods.append(pod)
        return pod

    def run(self, pod: dict[str, Any], container: str, card: int, *, memory_mib: int, utilization: float,
            qos: str = "burstable", driver: str = "systemd") -> int:
        """Start a GPU process in a container (a cgroup file for it, a process on the card)."""
        pid = self._next_pid
        self._next_pid += 1
        status = next(s for s in pod["status"]["containerStatuses"] if s["name"] == container)
        runtime, _, container_id = status["containerID"].partition("://")
        self.write_cgroup(pid, cgroup_text(pod["metadata"]["uid"], container_id, runtime, qos, driver))
        self.gpus.start_process(pid, card, memory_limit_mib=40960, cores_limit=100)
        self.gpus.set_usage(pid, memory_mib, utilization)
        return pid

    def run_outside(self, card: int, *, memory_mib: int, utilization: float,
                    cgroup: str = "0::/user.slice/user-1000.slice/session-3.scope\n") -> int:
        pid = self._next_pid
        self._next_pid += 1
        self.write_cgroup(pid, cgroup)
        self.gpus.start_process(pid, card, memory_limit_mib=40960, cores_limit=100)
        self.gpus.set_usage(pid, memory_mib, utilization)
        return pid

    def write_cgroup(self, pid: int, text: str) -> None:
        os.makedirs(os.path.join(self.proc_root, str(pid)), exist_ok=True)
        with open(os.path.join(self.proc_root, str(pid), "cgroup"), "w") as handle:
            handle.write(text)




def wait_for_samples(sampler: Any, count: int, timeout: float = 60.0, since: int | None = None) -> None:
    """Wait until the running sampler has taken ``count`` more samples than now (or than ``since``);
    generous on a busy machine."""
    target = (sampler.samples_taken if since is None else since) + count
    wait_for(lambda: sampler.samples_taken >= target, timeout=timeout, interval=0.01,
             what=f"the sampler to have taken {target} samples")


class FlakyGPUs(SimulatedGPUs):
    """The simulated backend whose driver can be made to fail samples (``failing = "reason"``)."""

    failing: str | None = None

    def sample(self):
        if self.failing:
            raise GPUError(self.failing)
        return super().sample()


def token_of(minter: TokenMinter, pod: dict[str, Any], index: int) -> str:
    """The ``VGPU_TOKEN`` the device plugin gave container ``index`` of ``pod`` (from its record's id)."""
    record = PodAllocation.from_json(pod["metadata"]["annotations"][DEFAULT_NAMES.allocation])
    container = record.container(index)
    assert container is not None and container.allocation_id, f"container {index} has no allocation id"
    return minter.mint(container.allocation_id)


def http_get(url: str, token: str | None = None, header: str | None = None) -> tuple[int, Any, str]:
    """GET ``url`` with a bearer ``token`` (or a raw Authorization ``header``): status, headers, body."""
    request = urllib.request.Request(url)
    if header is not None:
        request.add_header("Authorization", header)
    elif token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read().decode()


def put_on_slice(pod: dict[str, Any], device: str) -> None:
    """Put a one-container pod's share on a MIG device, as the extender's bind writes it."""
    annotations = pod["metadata"]["annotations"]
    record = PodAllocation.from_json(annotations[DEFAULT_NAMES.allocation])
    (container,) = record.containers
    on_slice = replace(container, cards=(replace(container.cards[0], mig_device=device),))
    annotations[DEFAULT_NAMES.allocation] = replace(record, containers=(on_slice,)).to_json()
    annotations[DEFAULT_NAMES.mig_slice(0)] = device
