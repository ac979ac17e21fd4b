"""Simulated Kubernetes API: start/stop time and request costs through the official client.

Run: .venv/bin/python benchmarks/sim/bench_kube_api.py [--pods 500]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import kubernetes.client
from kubernetes import watch
from vgpu_plugin.sim.kube import SimKubeAPI


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--starts", type=int, default=10)
    args = parser.parse_args()

    starts, stops = [], []
    for _ in range(args.starts):
        api = SimKubeAPI()
        starts.append(timed(api.start))
        stops.append(timed(api.stop))
    print(f"start: median {statistics.median(starts) * 1000:.1f} ms, max {max(starts) * 1000:.1f} ms "
          f"({args.starts} runs)")
    print(f"stop:  median {statistics.median(stops) * 1000:.1f} ms, max {max(stops) * 1000:.1f} ms")

    with SimKubeAPI() as api:
        core = kubernetes.client.CoreV1Api(api.api_client())
        body = {"metadata": {"name": "", "labels": {"app": "bench"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]}}
        seen = threading.Event()
        count = 0

        def consume() -> None:
            nonlocal count
            for _ in watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=120,
                                          resource_version=str(api.resource_version)):
                count += 1
                if count == args.pods:
                    seen.set()
                    return

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        time.sleep(0.2)
        create = timed(lambda: [core.create_namespaced_pod("default", {**body, "metadata": {
            **body["metadata"], "name": f"p{i}"}}) for i in range(args.pods)])
        seen.wait(120)
        patch = timed(lambda: [core.patch_namespaced_pod(f"p{i}", "default", {"metadata": {
            "annotations": {"k": "v"}}}) for i in range(args.pods)])
        lists = [timed(lambda: core.list_namespaced_pod("default", label_selector="app=bench",
                                                        _preload_content=False).data) for _ in range(10)]
        print(f"create: {create / args.pods * 1000:.2f} ms/pod ({args.pods} pods, a watch open)")
        print(f"patch:  {patch / args.pods * 1000:.2f} ms/pod (strategic merge, annotations)")
        print(f"list {args.pods} pods with a label selector (raw JSON): "
              f"median {statistics.median(lists) * 1000:.1f} ms")
        print(f"watch delivered {count} ADDED events")


if __name__ == "__main__":
    main()
