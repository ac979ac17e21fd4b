"""The Hub path: spawns through a real JupyterHub and KubeSpawner on the simulated cluster.

A ``SimCluster`` (simulated API, kube-scheduler stand-in with the real extender, per node a
kubelet stand-in and the real node daemon) runs in this process; JupyterHub runs as its own
process with KubeSpawner and ``VGPUHub`` (tests/hub/hub_support.py's ``hub_cluster``,
``sim_cluster_config`` and ``running_hub``, the helpers of the Hub end-to-end tests). The
kubelet stand-in runs each server's command as a local process: a simulated notebook
(``sim_notebook.py``) that answers HTTP on the port KubeSpawner gave it.

Per round, the same users start their servers twice, side by side: once with the CPU-only
profile and once with a vGPU profile (¼ GPU · 20 GiB: the extender places and binds it,
the device plugin serves it), alternating which goes first, every server stopped and its
pod gone in between. The spawns are POSTed to the Hub's REST API evenly over ``--spread``
seconds; per user, spawn-to-ready is the time from the POST to the first poll of the Hub's
``/users`` that shows the server ready (polled every ``--poll`` seconds).

Usage: python benchmarks/hub/bench_hub.py [--users 100] [--nodes 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "hub"))  # the Hub end-to-end tests' helpers

from hub_support import hub_cluster, running_hub, sim_cluster_config  # noqa: E402
from simkube.waiting import wait_for  # noqa: E402

from jupyter_vgpu.core import contract  # noqa: E402
from jupyter_vgpu.data import TOPOLOGY_DIR  # noqa: E402

NAMES = contract.DEFAULT_NAMES
SIM_NOTEBOOK = str(Path(__file__).resolve().parent / "sim_notebook.py")
PROFILES = {"cpu": "cpu", "vgpu": "vgpu-quarter"}

CONFIG = """
from jupyter_vgpu.hub import VGPUHub

c.KubeSpawner.cmd = [sys.executable, {notebook!r}]   # a simulated notebook (see bench_hub.py)
c.KubeSpawner.args = []
# every pod through the simulated cluster's scheduler (the deployed kube-scheduler's vgpu profile), as
# the storm does: kube-scheduler calls the extender only for pods that ask for a vGPU
c.KubeSpawner.scheduler_name = {scheduler!r}
c.JupyterHub.concurrent_spawn_limit = 0
c.JupyterHub.active_server_limit = 0
c.JupyterHub.log_level = "WARN"
VGPUHub(config=c).configure(c)
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


class PodStages:
    """Per user, when the simulated API's watch first showed its server's pod, showed it bound to
    a node, and Running (for a vGPU pod, also with its allocation record confirmed): where the
    time between the POST and the Hub's "ready" goes."""

    def __init__(self, cluster: Any) -> None:
        from vgpu_plugin.informer import Informer

        self.seen: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()
        self._informer = Informer(cluster.core_v1.list_namespaced_pod, namespace="default",
                                  label_selector="component=singleuser-server", on_event=self._on_event)

    def __enter__(self) -> PodStages:
        self._informer.start()
        if not self._informer.wait_synced(60):
            raise RuntimeError("the singleuser pods' watch did not sync")
        return self

    def __exit__(self, *_: object) -> None:
        self._informer.stop()

    def _on_event(self, kind: str, pod: dict[str, Any] | None) -> None:
        now = time.monotonic()
        if pod is None or kind == "DELETED":
            return
        metadata = pod["metadata"]
        user = (metadata.get("annotations") or {}).get("hub.jupyter.org/username")
        if not user:
            return
        gpu = any(NAMES.core_resource in ((c.get("resources") or {}).get("limits") or {})
                  for c in pod["spec"].get("containers", []))
        confirmed = (metadata.get("annotations") or {}).get(NAMES.gpu_assigned) == "true"
        with self._lock:
            stages = self.seen.setdefault(user, {})
            stages.setdefault("created", now)
            if pod["spec"].get("nodeName"):
                stages.setdefault("bound", now)
            if (pod.get("status") or {}).get("phase") == "Running" and (confirmed or not gpu):
                stages.setdefault("running", now)

    def forget(self) -> None:
        with self._lock:
            self.seen.clear()

    def summary(self, posted: dict[str, float], ready: dict[str, float]) -> dict[str, Any]:
        """p50/p95 seconds of each step, over the users whose pod reached it."""
        steps = (("post_to_created", posted, "created"), ("created_to_bound", "created", "bound"),
                 ("bound_to_running", "bound", "running"), ("running_to_ready", "running", ready))
        with self._lock:
            seen = {user: dict(stages) for user, stages in self.seen.items()}
        out: dict[str, Any] = {}
        for name, start, end in steps:
            spans = []
            for user, stages in seen.items():
                begin = start.get(user) if isinstance(start, dict) else stages.get(start)
                finish = end.get(user) if isinstance(end, dict) else stages.get(end)
                if begin is not None and finish is not None:
                    spans.append(finish - begin)
            if spans:
                out[name] = {"p50_s": round(percentile(spans, 50), 2), "p95_s": round(percentile(spans, 95), 2)}
        return out


def ready_servers(hub: Any) -> set[str]:
    status, users = hub.call("GET", "/users?limit=1000")
    if status != 200 or not isinstance(users, list):
        return set()
    return {u["name"] for u in users if ((u.get("servers") or {}).get("") or {}).get("ready")}


def spawn_all(hub: Any, users: list[str], kind: str, args: argparse.Namespace, stages: PodStages) -> dict[str, Any]:
    stages.forget()
    posted: dict[str, float] = {}
    ready: dict[str, float] = {}
    refused: dict[str, str] = {}
    lock = threading.Lock()
    start = time.monotonic()

    def spawn(index: int, user: str) -> None:
        delay = start + 0.5 + index * args.spread / len(users) - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        began = time.monotonic()
        status, body = hub.call("POST", f"/users/{user}/server", body={"profile": PROFILES[kind]})
        with lock:
            posted[user] = began
            if status not in (201, 202):
                refused[user] = f"{status}: {body}"

    load_start = os.getloadavg()
    # one client thread per user: the Hub holds a spawn's POST open until the server is up or
    # slow_spawn_timeout (10 s) passes, so a small pool would throttle the spawns
    with ThreadPoolExecutor(len(users)) as pool:
        futures = [pool.submit(spawn, i, u) for i, u in enumerate(users)]

        def all_settled() -> bool:
            seen = time.monotonic()
            for user in ready_servers(hub):
                with lock:
                    if user in posted:
                        ready.setdefault(user, seen)
            with lock:
                return len(ready) + len(refused) >= len(users)

        try:
            wait_for(all_settled, timeout=args.timeout, interval=args.poll, what="every server ready")
        except TimeoutError:
            pass  # reported as timed out below
        for future in futures:
            future.result()
    times = [ready[u] - posted[u] for u in ready]
    first, last = min(posted.values()), max(ready.values(), default=start)
    result: dict[str, Any] = {
        "kind": kind, "profile": PROFILES[kind], "spawns": len(users), "ready": len(times),
        "refused": len(refused), "timed_out": len(users) - len(times) - len(refused),
        "posted_within_s": round(max(posted.values()) - first, 2),
        "load": " ".join(f"{x:.2f}" for x in load_start) + " -> " + " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    if times:
        result.update({"ready_p50_s": round(percentile(times, 50), 2), "ready_p95_s": round(percentile(times, 95), 2),
                       "ready_max_s": round(max(times), 2),
                       "servers_per_second": round(len(times) / max(1e-9, last - first), 1)})
    result["stages"] = stages.summary(posted, ready)
    if refused:
        result["refused_example"] = next(iter(refused.values()))[:300]
    return result


def stop_all(hub: Any, cluster: Any, users: list[str], timeout: float) -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda u: hub.call("DELETE", f"/users/{u}/server"), users))

    def quiet() -> bool:
        status, listed = hub.call("GET", "/users?limit=1000")
        servers = sum(len(u.get("servers") or {}) for u in listed) if status == 200 else 1
        pods = [p for p in cluster.core_v1.list_namespaced_pod("default").items if p.metadata.name.startswith("jupyter-")]
        return servers == 0 and not pods

    wait_for(quiet, timeout=timeout, interval=0.5, what="every server stopped and its pod gone")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=8, help="nodes of 4 × A100 80 GB (room for 16 quarter shares each)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--spread", type=float, default=10.0, help="seconds over which the spawns are POSTed")
    parser.add_argument("--poll", type=float, default=0.25, help="seconds between polls of the Hub's /users")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    # stopped with SIGTERM, still stop the Hub, the cluster and the notebook processes
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from vgpu_plugin.demo.cluster import NodeSpec

    nodes = [NodeSpec(f"gpu-{i:02d}", "a100-sxm-4gpu-nv4.txt", model="NVIDIA A100-SXM4-80GB", memory_mib=81920)
             for i in range(args.nodes)]
    users = [f"user{i:03d}" for i in range(args.users)]
    results: list[dict[str, Any]] = []
    root = Path(tempfile.mkdtemp(prefix="bench-hub-"))
    try:
        started = time.monotonic()
        with hub_cluster(nodes, TOPOLOGY_DIR, "vgbench-", metrics_period=5.0) as cluster:
            config = sim_cluster_config(CONFIG.format(notebook=SIM_NOTEBOOK, scheduler=contract.SCHEDULER_NAME))
            with running_hub(root, config, env={"KUBECONFIG": cluster.kubeconfig}, users=tuple(users)) as hub:
                print(f"cluster and Hub up in {time.monotonic() - started:.1f} s (load {os.getloadavg()})", flush=True)
                with PodStages(cluster) as stages:
                    for round_no in range(args.rounds):
                        order = ["cpu", "vgpu"] if round_no % 2 == 0 else ["vgpu", "cpu"]
                        for kind in order:
                            result = spawn_all(hub, users, kind, args, stages)
                            result["round"] = round_no
                            print(json.dumps(result), flush=True)
                            results.append(result)
                            stop_all(hub, cluster, users, args.timeout)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for result in results:
        by_round.setdefault(result["round"], {})[result["kind"]] = result
    for round_no, pair in sorted(by_round.items()):
        if "ready_p95_s" in pair.get("cpu", {}) and "ready_p95_s" in pair.get("vgpu", {}):
            print(f"round {round_no}: vGPU / CPU-only spawn-to-ready at p50 "
                  f"{pair['vgpu']['ready_p50_s'] / pair['cpu']['ready_p50_s']:.2f}x, at p95 "
                  f"{pair['vgpu']['ready_p95_s'] / pair['cpu']['ready_p95_s']:.2f}x")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)
    return 0 if all(r["ready"] == r["spawns"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
