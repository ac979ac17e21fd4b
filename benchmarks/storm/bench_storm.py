"""The 9 a.m. classroom storm, on the simulated cluster or (``--real``) on real Kubernetes.

A SimCluster (the simulated Kubernetes API, the real extender behind the kube-scheduler
stand-in, per node a kubelet stand-in and the real node daemon with its device plugins on
unix sockets) gets ``--pods`` notebook pods created within ``--spread`` seconds, each asking
a class-sized share (10-25 % of a card, 2-8 GiB). Per pod it records, from a watch on the
pods, the time from the create call to: bound (``spec.nodeName`` set), admitted by the
device plugin (the allocation record confirmed: ``gpu-assigned=true``, written by the
device plugin once kubelet's Allocate served every container) and Running with that
record confirmed.

Side by side in the same run and on the same cluster: the same storm of CPU-only pods
(same scheduler profile; kube-scheduler does not call the extender for pods that ask for
none of its managedResources, so they bind through the API directly): the floor the
simulated cluster itself imposes. Rounds alternate which storm goes first.

Throughout every GPU storm the invariant watcher of tests/e2e/test_churn.py runs (no card
over-committed in the annotations, the extender's ledger or any device plugin); after each
GPU storm every component must agree (test_churn's ``_settled``: annotations, ledger,
/inspect, device plugins, kubelet stand-ins and their checkpoints).

With ``--real`` the cluster is ``realkube.RealCluster``: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler calling the extender, and per node a real kubelet on
Kubernetes' fake CRI runtime with the real node daemon, each a process. Both storms then pay
the real kubelet's admission, sandbox and container calls; the over-commit watcher reads the
allocation records, and the agreement check compares each kubelet's checkpoint with them.

Usage: python benchmarks/storm/bench_storm.py [--nodes 40] [--pods 200] [--rounds 2] [--json FILE]
       [--api-process] [--control-plane-process] [--node-processes N] [--policy P] [--real]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))  # test_churn's invariant watcher and agreement check
sys.path.insert(0, str(ROOT / "tests" / "realkube"))  # the real cluster's over-commit watcher
sys.path.insert(0, str(ROOT / "tests"))  # http_support, which the areas' helpers import

from simkube.waiting import wait_for  # noqa: E402
from test_churn import CHURN, Watcher, _agreement, _settled  # noqa: E402

from jupyter_vgpu.core import contract as c  # noqa: E402
from jupyter_vgpu.core import placement  # noqa: E402

NAMES = c.DEFAULT_NAMES
STORM = "vgpu.jupyter.org/storm"
GIB_UNITS = 1024 // c.MEMORY_UNIT_MIB


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


class Timeline:
    """Per pod, the monotonic time of each milestone, seen on a watch of the storm's pods."""

    def __init__(self, cluster: Any) -> None:
        from vgpu_plugin.informer import Informer

        self.created: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.confirmed: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.failed: dict[str, str] = {}
        self._lock = threading.Lock()
        self._informer = Informer(cluster.core_v1.list_pod_for_all_namespaces, label_selector=STORM,
                                  on_event=self._on_event)
        self._informer.name = "storm-timeline"  # its thread's name (bench_storm --thread-cpu)

    def start(self) -> Timeline:
        self._informer.start()
        if not self._informer.wait_synced(60):
            raise RuntimeError("the storm's pod watch did not sync")
        return self

    def stop(self) -> None:
        self._informer.stop()

    def _on_event(self, kind: str, pod: dict[str, Any] | None) -> None:
        now = time.monotonic()
        if pod is None or kind == "DELETED":
            return
        name = pod["metadata"]["name"]
        gpu = pod["metadata"].get("labels", {}).get(STORM) == "gpu"
        confirmed = (pod["metadata"].get("annotations") or {}).get(NAMES.gpu_assigned) == "true"
        phase = (pod.get("status") or {}).get("phase")
        with self._lock:
            if pod.get("spec", {}).get("nodeName"):
                self.bound.setdefault(name, now)
            if confirmed:
                self.confirmed.setdefault(name, now)
            if phase == "Running" and (confirmed or not gpu):
                self.running.setdefault(name, now)
            if phase == "Failed":
                self.failed[name] = (pod.get("status") or {}).get("message", "")

    def done(self, names: list[str]) -> bool:
        with self._lock:
            return all(n in self.running or n in self.failed for n in names)


def storm_plan(kind: str, round_no: int, count: int, seed: int) -> list[tuple[str, int, int | None]]:
    rng = random.Random(seed * 1000 + round_no)
    plan = []
    for i in range(count):
        if kind == "gpu":
            plan.append((f"gpu-{round_no}-{i:03d}", rng.randint(10, 25), rng.randint(2, 8) * GIB_UNITS))
        else:
            plan.append((f"cpu-{round_no}-{i:03d}", 0, None))
    return plan


def pod_body(cluster: Any, kind: str, name: str, cores: int, memory: int | None) -> dict[str, Any]:
    labels = {STORM: kind}
    if kind == "gpu":
        labels[CHURN] = "true"  # the invariant watcher and the agreement check follow these
        body: dict[str, Any] = cluster.notebook_pod(name, cores=cores, memory=memory, labels=labels)
    else:
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default", "labels": labels, "annotations": {}},
                "spec": {"schedulerName": c.SCHEDULER_NAME,
                         "containers": [{"name": "notebook", "image": "jupyter/base-notebook",
                                         "resources": {"limits": {}}}]}}
    limits = body["spec"]["containers"][0]["resources"]["limits"]
    limits.update({"cpu": "100m", "memory": "256Mi"})  # the same CPU and memory ask on both storms
    return body


def _cpu_of(pid: int) -> float | None:
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return None


def real_cpu_seconds(cluster: Any) -> dict[str, float]:
    """CPU time so far of the real cluster's programs, summed per program (every kubelet together)."""
    programs = list(cluster.control_plane.programs.values()) + [p for n in cluster.nodes.values() for p in n.programs()]
    result: dict[str, float] = {"benchmark": _cpu_of(os.getpid()) or 0.0}
    for program in programs:
        spent = _cpu_of(program.pid) if program.pid is not None else None
        if spent is not None:
            kind = program.name.rpartition("/")[2]
            result[kind] = result.get(kind, 0.0) + spent
    return result


def cpu_seconds(cluster: Any) -> dict[str, float]:
    """CPU time (user + system) so far of this process and of the API's, control plane's and node processes."""
    if not hasattr(cluster, "node_hosts"):
        return real_cpu_seconds(cluster)
    processes = {"benchmark" if cluster.node_hosts else "benchmark and nodes": os.getpid()}
    for label, owner in (("API", cluster.kube), ("control plane", cluster.control_plane)):
        process = getattr(owner, "_process", None)
        if process is not None and process.pid is not None:
            processes[label] = process.pid
    for number, host in enumerate(cluster.node_hosts):  # --node-processes
        if host.pid is not None:
            processes[f"nodes {number}"] = host.pid
    return {label: spent for label, pid in processes.items() if (spent := _cpu_of(pid)) is not None}


def thread_cpu_seconds() -> dict[str, float]:
    """This process's CPU time per kind of thread (the Python thread's name without its numbers;
    threads Python did not start, such as gRPC's own, under their OS name)."""
    import re

    names = {t.native_id: re.sub(r"[-_]?\d+", "", t.name) for t in threading.enumerate()}
    ticks = os.sysconf("SC_CLK_TCK")
    result: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            with open(f"/proc/self/task/{tid}/stat", encoding="ascii", errors="replace") as handle:
                text = handle.read()
            fields = text.rpartition(")")[2].split()
            name = names.get(int(tid)) or "os:" + re.sub(r"\d+", "", text[text.index("(") + 1:text.rindex(")")])
            result[name] = result.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return result


def rival_waits(cluster: Any) -> dict[str, float]:
    """The real extender's binds that waited for a rival's admission so far: count and seconds
    per outcome ({} without a real extender)."""
    plane = getattr(cluster, "control_plane", None)
    if plane is None or not hasattr(plane, "extender_url"):
        return {}
    with urllib.request.urlopen(f"{plane.extender_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(c.METRIC_EXTENDER_RIVAL_WAIT_SECONDS) and "_bucket" not in line:
            series, _, value = line.rpartition(" ")
            found[series.removeprefix(c.METRIC_EXTENDER_RIVAL_WAIT_SECONDS)] = float(value)
    return found


CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "extender")


def renice_control_plane(cluster: Any, niceness: int) -> list[str]:
    """Every thread of the real control plane's programs at ``niceness`` (Linux's nice is per
    thread; threads made later inherit it): on a cluster the control plane has a machine of its
    own, here it shares two cores with every kubelet and node daemon. Returns the programs reniced."""
    done = []
    for name, program in cluster.control_plane.programs.items():
        if name not in CONTROL_PLANE or program.pid is None:
            continue
        for task in os.listdir(f"/proc/{program.pid}/task"):
            with contextlib.suppress(ProcessLookupError):
                os.setpriority(os.PRIO_PROCESS, int(task), niceness)
        done.append(name)
    return done


def run_storm(cluster: Any, timeline: Timeline, kind: str, round_no: int, args: argparse.Namespace) -> dict[str, Any]:
    plan = storm_plan(kind, round_no, args.pods, args.seed)
    names = [name for name, *_ in plan]
    bodies = [pod_body(cluster, kind, *item) for item in plan]
    core = cluster.core_v1
    cpu_before = cpu_seconds(cluster)
    waits_before = rival_waits(cluster)
    threads_before = thread_cpu_seconds() if args.thread_cpu else {}
    start = time.monotonic()
    interval = args.spread / len(plan)

    def create(i: int) -> None:
        due = start + i * interval  # evenly spread over --spread seconds
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        timeline.created[names[i]] = time.monotonic()
        reply = core.create_namespaced_pod("default", bodies[i], _preload_content=False)
        assert reply.data  # read to the end: the connection goes back to the pool

    with ThreadPoolExecutor(args.creators) as pool:
        list(pool.map(create, range(len(plan))))
    created_within = time.monotonic() - start
    with contextlib.suppress(TimeoutError):  # the stages below count what made it
        wait_for(lambda: timeline.done(names), timeout=args.timeout, what="every pod of the storm")
    finished = time.monotonic()
    cpu_after = cpu_seconds(cluster)
    waits = {k: round(v - waits_before.get(k, 0.0), 2) for k, v in rival_waits(cluster).items()}
    if args.thread_cpu:
        spent = {k: v - threads_before.get(k, 0.0) for k, v in thread_cpu_seconds().items()}
        print("CPU s per kind of thread in this process (threads that ended are missing):",
              json.dumps({k: round(v, 2) for k, v in sorted(spent.items(), key=lambda kv: -kv[1]) if v >= 0.05}),
              flush=True)
    result: dict[str, Any] = {"kind": kind, "round": round_no, "pods": len(plan),
                              "created_within_s": round(created_within, 2),
                              "cpu_s": {k: round(cpu_after[k] - v, 2) for k, v in cpu_before.items() if k in cpu_after},
                              "rival_waits": {k: v for k, v in waits.items() if v}}
    stages = [("bound", timeline.bound), ("running", timeline.running)]
    if kind == "gpu":
        stages.insert(1, ("admitted", timeline.confirmed))
    for stage, seen in stages:
        delays = [seen[n] - timeline.created[n] for n in names if n in seen]
        result[f"{stage}_count"] = len(delays)
        if delays:
            for q in (50, 95):
                result[f"{stage}_p{q}_s"] = round(percentile(delays, q), 3)
            result[f"{stage}_max_s"] = round(max(delays), 3)
    running = [timeline.running[n] for n in names if n in timeline.running]
    result["failed"] = sum(n in timeline.failed for n in names)
    result["timed_out"] = len(names) - len(running) - result["failed"]
    last = max(running) if running else finished
    result["pods_per_second"] = round(len(running) / (last - start), 1) if running else 0.0
    return result


def clean_up(cluster: Any, kind: str, round_no: int, count: int) -> None:
    core = cluster.core_v1
    names = [f"{kind}-{round_no}-{i:03d}" for i in range(count)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: len(core.delete_namespaced_pod(n, "default", grace_period_seconds=0,
                                                               _preload_content=False).data), names))
    cluster.wait_for(lambda: not json.loads(core.list_namespaced_pod(
        "default", label_selector=STORM, _preload_content=False).data)["items"], timeout=120,
        what="the storm's pods to be gone")
    if hasattr(cluster, "node_hosts"):  # the simulated cluster: its components can be read directly
        # the next storm starts on a cluster at rest: the nodes and the extender have let every pod
        # go (kubelet stand-ins' checkpoints, device plugins, ledger), not only the API
        cluster.wait_for(lambda: _settled(cluster), timeout=120, interval=0.5,
                         what="every component to have let the storm's pods go")


def check_agreement(cluster: Any, watcher: Watcher) -> dict[str, Any]:
    try:
        views = cluster.wait_for(lambda: _settled(cluster), timeout=120, interval=0.5,
                                 what="every component to agree")
    except Exception:
        views = _agreement(cluster)
        base = views["annotations"]
        differ = {k: {key: (v.get(key), base.get(key)) for key in set(v) | set(base) if v.get(key) != base.get(key)}
                  for k, v in views.items() if k in ("extender", "inspect", "device plugin") and v != base}
        raise AssertionError(f"the components disagree: (view, annotations) per card {differ}; "
                             f"confirmed {views['confirmed']}; pods {views['pods'] == views['extender pods']} "
                             f"{views['pods'] == views['device plugin pods']} "
                             f"{views['pods'] == views['kubelet checkpoint pods']}") from None
    if watcher.violations:
        raise AssertionError(f"over-commit seen during the storm: {watcher.violations[:10]}")
    return {"agree": True, "cards_with_shares": len(views["annotations"]),
            "watcher_events": watcher.events, "watcher_checks": watcher.checks}


def storm_pods(cluster: Any) -> list[dict[str, Any]]:
    return json.loads(cluster.core_v1.list_namespaced_pod("default", label_selector=STORM,
                                                          _preload_content=False).data)["items"]


def real_watcher(cluster: Any) -> Any:
    from realkube_support import OvercommitWatcher

    units = 40960 // c.MEMORY_UNIT_MIB  # every node's cards are the DGX's A100 40GB
    return OvercommitWatcher(cluster.core_v1.list_namespaced_pod, NAMES, lambda node: units, namespace="default",
                             label_selector=STORM)


def real_agreement(cluster: Any, watcher: Any) -> dict[str, Any]:
    """Once the storm is Running: every GPU pod's record confirmed, and each kubelet's checkpoint
    holding, per pod, as many vcuda-core devices as its record's shares."""
    from vgpu_plugin.deviceplugin.checkpoint import read_checkpoint

    pods = [p for p in storm_pods(cluster) if p["metadata"]["labels"].get(STORM) == "gpu"
            and p["status"].get("phase") == "Running"]
    devices: dict[str, int] = {}
    for node in cluster.nodes.values():
        for entry in read_checkpoint(str(node.plugin_dir / "kubelet_internal_checkpoint")):
            if entry.resource == NAMES.core_resource:
                devices[entry.pod_uid] = devices.get(entry.pod_uid, 0) + len(entry.device_ids)
    differ = []
    for pod in pods:
        notes = pod["metadata"].get("annotations") or {}
        record = c.PodAllocation.from_json(notes[NAMES.allocation])
        cores = sum(share.cores for container in record.containers for share in container.cards)
        if notes.get(NAMES.gpu_assigned) != "true" or devices.get(pod["metadata"]["uid"]) != cores:
            differ.append((pod["metadata"]["name"], cores, devices.get(pod["metadata"]["uid"])))
    if differ:
        raise AssertionError(f"kubelet's checkpoints disagree with the records (pod, record, checkpoint): {differ[:10]}")
    if watcher.violations:
        raise AssertionError(f"over-commit seen during the storm: {watcher.violations[:10]}")
    return {"agree": True, "running_gpu_pods_checked": len(pods), "watcher_checks": watcher.checks}


def node_specs(count: int) -> list[Any]:
    from vgpu_plugin.demo.cluster import NodeSpec

    # 8-card nodes from the bundled DGX A100 capture (NV12 between every pair)
    return [NodeSpec(f"gpu-{i:02d}", "dgx-a100.txt", seed=i) for i in range(count)]


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def deployed_policy() -> str:
    """The extender's --policy default (what deploy/ runs), read from its flag parser."""
    from vgpu_plugin.extender.main import parser

    return str(parser().get_default("policy"))


def main(argv: Sequence[str] | None = None, *, started: Callable[[Any], None] | None = None,
         stopping: Callable[[Any], None] | None = None) -> None:
    """``started(cluster)`` runs once the cluster is up, ``stopping(cluster)`` before it stops (profile_storm)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--spread", type=float, default=5.0, help="seconds over which the pods are created")
    parser.add_argument("--creators", type=int, default=8, help="client threads creating pods")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", choices=("cpu", "gpu"), help="run one kind of storm (for profiling)")
    parser.add_argument("--policy", default=deployed_policy(), choices=placement.POLICIES,
                        help=f"the extender's placement policy (default: the deployed one, {deployed_policy()})")
    parser.add_argument("--api-process", action="store_true",
                        help="run the simulated API server in a process of its own (its own GIL)")
    parser.add_argument("--control-plane-process", action="store_true",
                        help="run the extender and the scheduler stand-in in a process of their own, as deployed")
    parser.add_argument("--node-processes", type=int, default=0, metavar="N",
                        help="host the nodes (kubelet stand-in and node daemon each) in N processes, dealt "
                             "round-robin (default 0: in this process)")
    parser.add_argument("--real", action="store_true",
                        help="run on real Kubernetes (realkube: kube-apiserver, kube-scheduler, real kubelets on the "
                             "fake CRI runtime, the real node daemons; needs root and hack/kube/build.sh)")
    parser.add_argument("--control-plane-nice", type=int, default=0, metavar="N",
                        help="with --real, run the control plane's programs (etcd, kube-apiserver, "
                             "kube-controller-manager, kube-scheduler, the extender) at this nice value, e.g. -10: "
                             "the CPU priority a control plane on a machine of its own would have over the nodes "
                             "(default 0: every program alike)")
    parser.add_argument("--extender-flag", action="append", default=[], metavar="FLAG",
                        help="with --real, one more flag for the extender (repeat; e.g. --extender-flag=--rival-wait=0)")
    parser.add_argument("--settle", type=float, default=None, metavar="SECONDS",
                        help="wait this long after the cluster is up before the first storm (default 30 with "
                             "--real: forty kubelets and daemons starting keep two cores busy for a while; else 0)")
    parser.add_argument("--thread-cpu", action="store_true",
                        help="print this process's CPU time per kind of thread for each storm")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    import logging

    logging.basicConfig(level=logging.ERROR)
    from vgpu_plugin.demo.cluster import SimCluster

    if args.real:
        from vgpu_plugin.realkube.cluster import RealCluster

        cluster_made: Any = RealCluster(node_specs(args.nodes), metrics_period=30.0, ready_timeout=600,
                                        policy=args.policy, extender_args=args.extender_flag)
    else:
        cluster_made = SimCluster(node_specs(args.nodes), metrics_period=30.0, ready_timeout=600, policy=args.policy,
                                  api_process=args.api_process, control_plane_process=args.control_plane_process,
                                  node_processes=args.node_processes)
    results: dict[str, Any] = {"nodes": args.nodes, "gpus": args.nodes * 8, "pods": args.pods, "policy": args.policy,
                               "real": args.real, "extender_flags": args.extender_flag,
                               "control_plane_nice": args.control_plane_nice,
                               "api_process": args.api_process, "control_plane_process": args.control_plane_process,
                               "node_processes": args.node_processes,
                               "load_start": load_average(), "storms": []}
    began = time.monotonic()
    with cluster_made as cluster:
        results["cluster_start_s"] = round(time.monotonic() - began, 1)
        print(f"cluster up in {results['cluster_start_s']} s (load {load_average()})", flush=True)
        if args.control_plane_nice:
            reniced = renice_control_plane(cluster, args.control_plane_nice)
            print(f"control plane at nice {args.control_plane_nice}: {', '.join(reniced)}", flush=True)
        settle = args.settle if args.settle is not None else (30.0 if args.real else 0.0)
        time.sleep(settle)
        results["settled_s"], results["load_after_settling"] = settle, load_average()
        if started is not None:
            started(cluster)
        timeline = Timeline(cluster).start()
        try:
            for round_no in range(args.rounds):
                order = ("cpu", "gpu") if round_no % 2 == 0 else ("gpu", "cpu")
                order = tuple(kind for kind in order if args.only in (None, kind))
                for kind in order:
                    watcher = None
                    if kind == "gpu":
                        watcher = (real_watcher(cluster) if args.real else Watcher(cluster)).start()
                    try:
                        result = run_storm(cluster, timeline, kind, round_no, args)
                        if watcher is not None:
                            result.update(real_agreement(cluster, watcher) if args.real
                                          else check_agreement(cluster, watcher))
                    finally:
                        if watcher is not None:
                            watcher.stop()
                    result["load"] = load_average()
                    print(json.dumps(result), flush=True)
                    results["storms"].append(result)
                    clean_up(cluster, kind, round_no, args.pods)
        finally:
            timeline.stop()
            if stopping is not None:
                stopping(cluster)
    results["load_end"] = load_average()
    for round_no in range(args.rounds):
        pair = {r["kind"]: r for r in results["storms"] if r["round"] == round_no}
        if "running_p95_s" in pair.get("gpu", {}) and "running_p95_s" in pair.get("cpu", {}):
            results[f"round{round_no}_running_p95_ratio"] = round(
                pair["gpu"]["running_p95_s"] / pair["cpu"]["running_p95_s"], 2)
    print(json.dumps({k: v for k, v in results.items() if k != "storms"}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
