"""Metrics endpoint cost: scrape latency while the sampler runs, and the sampler's CPU.

Setup: a simulated 8-card DGX A100 node (the real `nvidia-smi topo -m` capture), 64 notebook
containers (8 per card, each with a 12-core / 4 GiB share and one GPU process with a cgroup
file in a temp proc root), pods served by the simulated API server and watched by the same
Informer the node daemon uses. The server runs in-process as in the node daemon.

Measures, side by side in one run:
- latency of GET /metrics, /metric and /api/v1/usage (p50/p99/max) over a keep-alive connection
  while the sampler thread samples every --period seconds;
- the sampler thread's CPU time (utime+stime of its task in /proc/self/task/<tid>/stat) over
  --cpu-seconds of wall time with nobody scraping, as a percentage of one core;
- the wall time of one sample (sample_once) for reference.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client import generate_latest
from simkube.apiserver import SimKubeAPI
from simkube.waiting import wait_for
from vgpu_plugin.informer import Informer
from vgpu_plugin.metrics import MetricsServer
from vgpu_plugin.tokens import TokenMinter, new_allocation_id

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.data import TOPOLOGY_DIR
from jupyter_vgpu.gpu.simulated import SimulatedGPUs

REPO = Path(__file__).resolve().parents[2]
FIXTURE = TOPOLOGY_DIR / "dgx-a100.txt"
NODE = "bench-node"


def thread_cpu_seconds(native_id: int) -> float:
    with open(f"/proc/self/task/{native_id}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def populate(core_v1, gpus: SimulatedGPUs, proc_root: str, containers: int) -> list[tuple[str, int, str]]:
    """Running notebook pods as the device plugin leaves them: (pod UID, GPU pid, allocation id)."""
    uuids = {card.index: card.uuid for card in gpus.inventory()}
    cards = len(uuids)
    created = []
    for i in range(containers):
        card = i % cards
        name = f"jupyter-user{i:03d}"
        allocation_id = new_allocation_id()  # the record holds the id of the container's read token
        allocation = c.PodAllocation(NODE, (c.ContainerAllocation(0, "notebook", (
            c.CardShare(card, uuids[card], 12, 16),), allocation_id=allocation_id),))
        pod = core_v1.create_namespaced_pod("default", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": c.predicate_annotations(allocation)},
            "spec": {"nodeName": NODE, "containers": [{
                "name": "notebook", "image": "jupyter/base-notebook",
                "resources": {"limits": c.request_limits(c.Request(12, 16))}}]},
        })
        container_id = secrets.token_hex(32)
        core_v1.patch_namespaced_pod_status(name, "default", {"status": {"phase": "Running", "containerStatuses": [
            {"name": "notebook", "ready": True, "restartCount": 0, "image": "x", "imageID": "x",
             "containerID": f"containerd://{container_id}"}]}})
        uid = pod.metadata.uid
        pid = 10_000 + i
        os.makedirs(f"{proc_root}/{pid}")
        with open(f"{proc_root}/{pid}/cgroup", "w") as handle:
            handle.write(f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                         f"{uid.replace('-', '_')}.slice/cri-containerd-{container_id}.scope\n")
        gpus.start_process(pid, card, memory_limit_mib=4096, cores_limit=12)
        created.append((uid, pid, allocation_id))
    return created


def measure_latency(port: int, path: str, requests: int, token: str | None = None) -> dict[str, float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    samples = []
    size = 0
    for _ in range(requests):
        start = time.perf_counter()
        connection.request("GET", path, headers=headers)
        response = connection.getresponse()
        body = response.read()
        samples.append((time.perf_counter() - start) * 1000)
        assert response.status == 200, (path, response.status, body[:200])
        size = len(body)
    connection.close()
    return {"p50_ms": statistics.median(samples), "p99_ms": percentile(samples, 0.99), "max_ms": max(samples),
            "bytes": size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=64)
    parser.add_argument("--period", type=float, default=1.0)
    parser.add_argument("--requests", type=int, default=1000, help="requests per endpoint")
    parser.add_argument("--cpu-seconds", type=float, default=60.0)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)

    gpus = SimulatedGPUs.from_fixture(FIXTURE, host=NODE)
    with tempfile.TemporaryDirectory() as proc_root, SimKubeAPI() as kube:
        import kubernetes.client

        core_v1 = kubernetes.client.CoreV1Api(kube.api_client())
        workloads = populate(core_v1, gpus, proc_root, args.containers)
        informer = Informer(core_v1.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={NODE}").start()
        assert informer.wait_synced(60)
        wait_for(lambda: len(informer.items()) >= args.containers, timeout=60, what="the informer to see every pod")
        minter = TokenMinter(secrets.token_bytes(32))
        scrape_token = secrets.token_hex(16)  # what Prometheus sends to the scrape port
        server = MetricsServer(NODE, gpus, informer, minter, address="127.0.0.1", port=0, period=args.period,
                               proc_root=proc_root, scrape_token=scrape_token)
        server.start()
        try:
            while server.sampler.samples_taken < 2:
                time.sleep(0.05)
            snapshot = server.sampler.snapshot()
            attributed = sum(1 for p in snapshot.processes if p.owner == "container")
            assert attributed == args.containers, f"only {attributed} processes attributed"

            # sampler CPU with nobody scraping: the thread's CPU clock (ns), /proc ticks as a cross-check
            thread = server.sampler.thread
            assert thread is not None and thread.ident is not None and thread.native_id is not None
            clock = time.pthread_getcpuclockid(thread.ident)
            cpu0, ticks0 = time.clock_gettime(clock), thread_cpu_seconds(thread.native_id)
            wall0, taken0 = time.monotonic(), server.sampler.samples_taken
            time.sleep(args.cpu_seconds)
            cpu1, ticks1 = time.clock_gettime(clock), thread_cpu_seconds(thread.native_id)
            wall1, taken1 = time.monotonic(), server.sampler.samples_taken
            sampler_cpu_percent = 100 * (cpu1 - cpu0) / (wall1 - wall0)
            sampler_cpu_percent_proc = 100 * (ticks1 - ticks0) / (wall1 - wall0)

            # one sample's wall time, taken on this thread (the background one keeps going);
            # 600 of them also fill the containers' 10-minute usage history the API serves
            durations = []
            for _ in range(600):
                start = time.perf_counter()
                server.sampler.sample_once()
                durations.append((time.perf_counter() - start) * 1000)

            # rendering alone (no HTTP), for telling server cost from scheduling noise
            render_ms = {}
            for path, registry in (("/metrics", server.metrics_registry), ("/metric", server.gpu_manager_registry)):
                times = []
                for _ in range(200):
                    start = time.perf_counter()
                    generate_latest(registry)
                    times.append((time.perf_counter() - start) * 1000)
                render_ms[path] = round(statistics.median(times), 3)

            token = minter.mint(workloads[0][2])
            load_before = os.getloadavg()[0]
            results = {
                "cards": len(snapshot.cards),
                "containers": args.containers,
                "period_s": args.period,
                "sampler_cpu_percent_of_one_core": round(sampler_cpu_percent, 3),
                "sampler_cpu_percent_from_proc_ticks": round(sampler_cpu_percent_proc, 2),
                "cpu_window_s": round(wall1 - wall0, 1),
                "samples_in_cpu_window": taken1 - taken0,
                "sample_once_ms_median": round(statistics.median(durations), 3),
                "render_ms_median": render_ms,
                "scrape": {
                    "/metrics": measure_latency(server.scrape_port, "/metrics", args.requests, scrape_token),
                    "/metric": measure_latency(server.scrape_port, "/metric", args.requests, scrape_token),
                    "/api/v1/usage?history=600": measure_latency(server.port, "/api/v1/usage?history=600",
                                                                 args.requests, token),
                    "/api/v1/topology": measure_latency(server.port, "/api/v1/topology", args.requests, token),
                },
            }
            results["loadavg_1min_before_after_scrapes"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
        finally:
            server.stop()
            informer.stop()
    for numbers in results["scrape"].values():
        for key in ("p50_ms", "p99_ms", "max_ms"):
            numbers[key] = round(numbers[key], 3)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
