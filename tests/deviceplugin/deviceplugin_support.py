"""Helpers and fixtures for the node daemon's tests (fixtures are re-exported by conftest.py).

``KubeletPeer`` plays kubelet at the protocol level: it serves the real Registration
service on ``kubelet.sock`` in a short temp dir and calls the plugin's real sockets the
way kubelet does. Kubernetes state lives in the simulated API (``kube`` fixture) and is
read and written through the official client.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from simkube.waiting import wait_for
from vgpu_plugin.deviceplugin import api_pb2, api_pb2_grpc
from vgpu_plugin.deviceplugin.daemon import DaemonConfig, NodeDaemon
from vgpu_plugin.deviceplugin.enforcement import EnforcementConfig

from jupyter_vgpu.core.contract import (
    DEFAULT_NAMES,
    CardShare,
    ContainerAllocation,
    PodAllocation,
    Request,
    predicate_annotations,
    request_limits,
)
from jupyter_vgpu.data import TOPOLOGY_DIR
from jupyter_vgpu.gpu.simulated import SimulatedGPUs

NAMES = DEFAULT_NAMES
CORE = NAMES.core_resource
MEMORY = NAMES.memory_resource


class _Registration(api_pb2_grpc.RegistrationServicer):
    def __init__(self, peer: KubeletPeer) -> None:
        self.peer = peer

    def Register(self, request, context):  # noqa: N802
        endpoint_exists = os.path.exists(os.path.join(self.peer.plugin_dir, request.endpoint))
        self.peer.registrations.append((request, endpoint_exists))
        return api_pb2.Empty()


class KubeletPeer:
    """kubelet's side of the device plugin protocol, for tests."""

    def __init__(self, plugin_dir: str) -> None:
        self.plugin_dir = plugin_dir
        self.registrations: list[tuple[api_pb2.RegisterRequest, bool]] = []
        self._server: grpc.Server | None = None
        self._channels: dict[str, grpc.Channel] = {}

    def start(self) -> KubeletPeer:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port("unix://" + os.path.join(self.plugin_dir, "kubelet.sock"))
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def restart(self) -> None:
        """As kubelet does on start: wipe the plugin dir's sockets, serve kubelet.sock anew."""
        self.stop()
        for name in os.listdir(self.plugin_dir):
            if name != "kubelet_internal_checkpoint":
                os.unlink(os.path.join(self.plugin_dir, name))
        self.start()

    def registered(self) -> dict[str, api_pb2.RegisterRequest]:
        return {request.resource_name: request for request, _ in self.registrations}

    def stub(self, resource: str) -> api_pb2_grpc.DevicePluginStub:
        endpoint = self.registered()[resource].endpoint
        if endpoint not in self._channels:
            self._channels[endpoint] = grpc.insecure_channel("unix://" + os.path.join(self.plugin_dir, endpoint))
        return api_pb2_grpc.DevicePluginStub(self._channels[endpoint])

    def list_devices(self, resource: str) -> list[api_pb2.Device]:
        stream = self.stub(resource).ListAndWatch(api_pb2.Empty(), timeout=10)
        first = next(stream)
        stream.cancel()
        return list(first.devices)

    def preferred(self, resource: str, available: list[str], size: int, must: list[str] = ()) -> list[str]:
        answer = self.stub(resource).GetPreferredAllocation(api_pb2.PreferredAllocationRequest(container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=available, must_include_deviceIDs=list(must),
                                                        allocation_size=size)]), timeout=10)
        return list(answer.container_responses[0].deviceIDs)

    def allocate(self, resource: str, ids: list[str]) -> api_pb2.ContainerAllocateResponse:
        answer = self.stub(resource).Allocate(api_pb2.AllocateRequest(container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=ids)]), timeout=10)
        assert len(answer.container_responses) == 1
        return answer.container_responses[0]

    def admit(self, resource: str, count: int, free: list[str]) -> tuple[list[str], api_pb2.ContainerAllocateResponse]:
        """kubelet's sequence for one container and resource: GetPreferredAllocation, then Allocate."""
        ids = self.preferred(resource, free, count) if len(free) > count else free[:count]
        return ids, self.allocate(resource, ids)


@pytest.fixture
def plugin_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="vdp-", dir="/tmp")  # unix socket paths must stay short
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def peer(plugin_dir: str) -> Iterator[KubeletPeer]:
    kubelet = KubeletPeer(plugin_dir).start()
    try:
        yield kubelet
    finally:
        kubelet.stop()


def sim_gpus(name: str = "a100-sxm-4gpu-nv4.txt", memory_mib: int = 40960, host: str = "node-1") -> SimulatedGPUs:
    return SimulatedGPUs.from_fixture(TOPOLOGY_DIR / name, model="NVIDIA A100-SXM4-40GB", memory_mib=memory_mib,
                                      host=host)


@pytest.fixture
def gpus() -> SimulatedGPUs:
    return sim_gpus()


class DaemonFactory:
    def __init__(self, kube: Any, plugin_dir: str, state_dir: str) -> None:
        self.kube = kube
        self.plugin_dir = plugin_dir
        self.state_dir = state_dir
        self.running: list[NodeDaemon] = []

    def __call__(self, backend: Any, *, node: str = "node-1", enforcement: str = "hami-core",
                 metrics: dict | None = None, start: bool = True, **config: Any) -> NodeDaemon:
        config.setdefault("reconcile_period", 0.3)
        config.setdefault("confirm_grace", 1.0)  # KubeletPeer writes no checkpoint: gpu-assigned after 1 s
        config.setdefault("watch_period", 0.05)
        config.setdefault("metrics_url", "http://10.0.0.1:5678")
        enforcement_config = config.pop("enforcement_config", None) or EnforcementConfig(
            mode=enforcement, hami_root=os.path.join(self.state_dir, "hami"),
            hami_lock_dir=os.path.join(self.state_dir, "vgpulock"))
        daemon = NodeDaemon(DaemonConfig(node=node, plugin_dir=self.plugin_dir, state_dir=self.state_dir,
                                         enforcement=enforcement_config, metrics=metrics, **config),
                            backend, self.kube.api_client())
        if start:
            daemon.start()
            self.running.append(daemon)
        return daemon

    def stop_all(self) -> None:
        for daemon in self.running:
            daemon.stop()
        self.running.clear()


@pytest.fixture
def daemons(kube: Any, plugin_dir: str, tmp_path: Path) -> Iterator[DaemonFactory]:
    factory = DaemonFactory(kube, plugin_dir, str(tmp_path / "state"))
    try:
        yield factory
    finally:
        factory.stop_all()


def make_node(core_v1: Any, name: str = "node-1") -> None:
    core_v1.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})


_counter = iter(range(1, 1_000_000))


def place_pod(core_v1: Any, gpus: SimulatedGPUs, name: str, containers: list[tuple[Request, tuple[int, ...]]],
              *, node: str = "node-1", namespace: str = "default", predicate_time: int | None = None,
              bind: bool = True, extra: dict | None = None, slices: dict[int, str] | None = None) -> dict:
    """Create a vGPU pod and do what the extender does at bind: annotations, then the Binding.

    ``slices``: container index -> the MIG device the extender chose for it."""
    spec_containers = []
    shares = []
    uuids = {card.index: card.uuid for card in gpus.inventory()} if gpus.available() else {}
    units = {card.index: card.memory_units for card in gpus.inventory()} if gpus.available() else {}
    for index, (request, cards) in enumerate(containers):
        spec_containers.append({"name": f"c{index}", "image": "jupyter/base-notebook",
                                "resources": {"limits": request_limits(request, NAMES)}, **(extra or {})})
        if request.is_share:
            card_shares = (CardShare(cards[0], uuids.get(cards[0], ""), request.cores, request.memory_units,
                                     (slices or {}).get(index, "")),)
        else:
            card_shares = tuple(CardShare(i, uuids.get(i, ""), 100, units.get(i, 0)) for i in cards)
        shares.append(ContainerAllocation(index=index, name=f"c{index}", cards=card_shares))
    core_v1.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"schedulerName": "vgpu-scheduler", "containers": spec_containers}}, _preload_content=False)
    allocation = PodAllocation(node=node, containers=tuple(shares),
                               assigned_at_ns=predicate_time if predicate_time is not None else
                               time.time_ns() + next(_counter))
    annotations = predicate_annotations(allocation, NAMES)
    if bind:
        core_v1.create_namespaced_binding(namespace, {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}, _preload_content=False)
    return read_pod(core_v1, name, namespace)


def read_pod(core_v1: Any, name: str, namespace: str = "default") -> dict:
    import json

    return json.loads(core_v1.read_namespaced_pod(name, namespace, _preload_content=False).data)


def annotations(core_v1: Any, name: str, namespace: str = "default") -> dict[str, str]:
    return read_pod(core_v1, name, namespace)["metadata"].get("annotations") or {}


def all_ids(kind: str, cards: int = 4, units: int = 160) -> list[str]:
    if kind == "core":
        return [f"gpu{c}-core-{n:02d}" for c in range(cards) for n in range(100)]
    return [f"gpu{c}-mem-{n:04d}" for c in range(cards) for n in range(units)]


def wait_registered(peer: KubeletPeer, count: int = 2, timeout: float = 20.0) -> None:
    wait_for(lambda: len(peer.registrations) >= count, timeout=timeout, what=f"{count} registrations")


def stop_thread(thread: threading.Thread) -> None:
    thread.join(5)


def confirmed_record(core_v1: Any, name: str, timeout: float = 20.0, namespace: str = "default") -> PodAllocation:
    """The pod's allocation record once it is served and kubelet's checkpoint confirmed each
    container's answer (the record then holds the allocation id of the container's token)."""
    def confirmed() -> PodAllocation | None:
        anns = annotations(core_v1, name, namespace)
        if anns.get(NAMES.gpu_assigned) != "true":
            return None
        allocation = PodAllocation.from_json(anns[NAMES.allocation])
        return allocation if all(ctr.allocation_id for ctr in allocation.containers) else None

    return wait_for(confirmed, timeout=timeout, what=f"{name} assigned and confirmed")


def serve_pod(core_v1: Any, gpus: SimulatedGPUs, peer: KubeletPeer, name: str = "a") -> None:
    """Pod ``name`` (70 cores, 20 units on card 0) placed, admitted by kubelet and marked served."""
    place_pod(core_v1, gpus, name, [(Request(70, 20), (0,))])
    peer.admit(CORE, 70, all_ids("core"))
    peer.admit(MEMORY, 20, all_ids("memory"))
    wait_for(lambda: annotations(core_v1, name).get(NAMES.gpu_assigned) == "true", timeout=20,
             what=f"{name} served")
