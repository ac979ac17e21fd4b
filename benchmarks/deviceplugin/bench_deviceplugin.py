"""Device plugin benchmark: Allocate latency with 200 pods on the node, and how fast a health
change reaches kubelet through ListAndWatch.

Everything is real except the GPUs: the node daemon (NodeDaemon) serves its two gRPC sockets,
the Kubernetes API is the simulated one (kmock-based, over HTTP), and this script plays kubelet
over the unix sockets (Registration server, GetPreferredAllocation + Allocate per container and
resource, in placement order).

    .venv/bin/python benchmarks/deviceplugin/bench_deviceplugin.py [--pods 200] [--health-rounds 30]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent import futures

import grpc
from simkube.apiserver import SimKubeAPI
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
from jupyter_vgpu.gpu import open_backend

NAMES = DEFAULT_NAMES


class Registration(api_pb2_grpc.RegistrationServicer):
    def __init__(self) -> None:
        self.endpoints: dict[str, str] = {}

    def Register(self, request, context):  # noqa: N802
        self.endpoints[request.resource_name] = request.endpoint
        return api_pb2.Empty()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--health-rounds", type=int, default=30)
    parser.add_argument("--arrivals", action="store_true",
                        help="bind each pod just before kubelet admits it (one waiting at a time: the usual case, "
                             "where answers name their pod), instead of all 200 waiting with identical requests")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    plugin_dir = tempfile.mkdtemp(prefix="vdpb-", dir="/tmp")
    state_dir = tempfile.mkdtemp(prefix="vdpb-state-")
    api = SimKubeAPI().start()
    registration = Registration()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_RegistrationServicer_to_server(registration, server)
    server.add_insecure_port("unix://" + os.path.join(plugin_dir, "kubelet.sock"))
    server.start()
    gpus = open_backend("sim:dgx-a100", model="NVIDIA A100-SXM4-80GB", memory_mib=81920, host="bench")
    cards = gpus.inventory()
    daemon = None
    try:
        from kubernetes import client

        core_v1 = client.CoreV1Api(api.api_client())
        core_v1.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bench"}})
        # 200 pods, 4 cores + 12 units each, spread over the 8 cards (exactly 100 cores per card)
        cores, units = 800 // args.pods, 12
        placements = []
        for i in range(args.pods):
            card = i % len(cards)
            request = Request(cores, units)
            name = f"nb-{i:03d}"
            allocation = PodAllocation(node="bench", assigned_at_ns=1_000 + i, containers=(
                ContainerAllocation(0, "notebook", (CardShare(card, cards[card].uuid, cores, units),)),))
            core_v1.create_namespaced_pod("default", {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"containers": [{"name": "notebook", "image": "x",
                                         "resources": {"limits": request_limits(request, NAMES)}}]}},
                _preload_content=False)
            binding = {"apiVersion": "v1", "kind": "Binding",
                       "metadata": {"name": name, "annotations": predicate_annotations(allocation, NAMES)},
                       "target": {"apiVersion": "v1", "kind": "Node", "name": "bench"}}
            if not args.arrivals:
                core_v1.create_namespaced_binding("default", binding, _preload_content=False)
            placements.append((name, card, binding))
        config = DaemonConfig(node="bench", plugin_dir=plugin_dir, state_dir=state_dir,
                              enforcement=EnforcementConfig(mode="hami-core", hami_root=os.path.join(state_dir, "hami"),
                                                            hami_lock_dir=os.path.join(state_dir, "vgpulock")),
                              metrics_url="http://127.0.0.1:5678")
        daemon = NodeDaemon(config, gpus, api.api_client()).start()
        if not daemon.wait_ready(30):
            raise SystemExit("the daemon did not register")
        while len(daemon.informer.items()) < (0 if args.arrivals else args.pods):
            time.sleep(0.05)
        channels = {r: grpc.insecure_channel("unix://" + os.path.join(plugin_dir, e))
                    for r, e in registration.endpoints.items()}
        stubs = {r: api_pb2_grpc.DevicePluginStub(ch) for r, ch in channels.items()}
        free = {NAMES.core_resource: [f"gpu{c}-core-{n:02d}" for c in range(8) for n in range(100)],
                NAMES.memory_resource: [f"gpu{c}-mem-{n:04d}" for c in range(8) for n in range(320)]}
        allocate_ms: list[float] = []
        preferred_ms: list[float] = []
        wrong = named = 0
        for number, (name, card, binding) in enumerate(placements):
            if args.arrivals:  # bound now; kubelet admits it once its watch (and so ours) saw it
                core_v1.create_namespaced_binding("default", binding, _preload_content=False)
                while len(daemon.informer.items()) <= number:
                    time.sleep(0.001)
            for resource, count in ((NAMES.core_resource, cores), (NAMES.memory_resource, units)):
                stub = stubs[resource]
                t0 = time.perf_counter()
                answer = stub.GetPreferredAllocation(api_pb2.PreferredAllocationRequest(container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=free[resource],
                                                                allocation_size=count)]), timeout=10)
                preferred_ms.append((time.perf_counter() - t0) * 1000)
                ids = list(answer.container_responses[0].deviceIDs)
                t0 = time.perf_counter()
                response = stub.Allocate(api_pb2.AllocateRequest(container_requests=[
                    api_pb2.ContainerAllocateRequest(devices_ids=ids)]), timeout=10)
                allocate_ms.append((time.perf_counter() - t0) * 1000)
                taken = set(ids)
                free[resource] = [d for d in free[resource] if d not in taken]
                if resource == NAMES.core_resource:
                    env = response.container_responses[0].envs
                    # identical requests: an answer may name no pod (kubelet could be admitting any of
                    # them), but never another pod
                    wrong += env.get("VGPU_POD_NAME", name) != name or env["VGPU_DEVICE_INDICES"] != str(card)
                    named += "VGPU_POD_NAME" in env
        # health: XID on a card -> the next ListAndWatch message
        stream = stubs[NAMES.core_resource].ListAndWatch(api_pb2.Empty())
        next(stream)
        propagation_ms: list[float] = []
        for round_ in range(args.health_rounds):
            card = round_ % 8
            t0 = time.perf_counter()
            gpus.inject_xid(card, 79)
            update = next(stream)
            propagation_ms.append((time.perf_counter() - t0) * 1000)
            assert any(d.health == "Unhealthy" for d in update.devices if d.ID.startswith(f"gpu{card}-"))
            gpus.restore_card(card)
            next(stream)
        stream.cancel()
        print(f"pods on the node: {args.pods} (8 cards, {cores} cores + {units} memory units each)")
        print(f"Allocate  ({len(allocate_ms)} calls): p50 {statistics.median(allocate_ms):.2f} ms, "
              f"p99 {percentile(allocate_ms, 99):.2f} ms, max {max(allocate_ms):.2f} ms")
        print(f"GetPreferredAllocation ({len(preferred_ms)} calls): p50 {statistics.median(preferred_ms):.2f} ms, "
              f"p99 {percentile(preferred_ms, 99):.2f} ms")
        print(f"answers for the wrong pod or card: {wrong}; answers naming their pod: {named}")
        print(f"health change -> ListAndWatch ({len(propagation_ms)} XIDs): p50 {statistics.median(propagation_ms):.1f} ms, "
              f"max {max(propagation_ms):.1f} ms")
        for channel in channels.values():
            channel.close()
        return 0 if wrong == 0 else 1
    finally:
        if daemon is not None:
            daemon.stop()
        server.stop(0)
        api.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)
        shutil.rmtree(state_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
