"""Where a storm's time goes, per stage: bench_storm.py with wall-clock timers around the
scheduler stand-in's cycle, the extender's verbs and each of bind's API calls.

A sampling profiler sees little here: hundreds of threads share one GIL and most of a pod's
time is spent waiting (for an API reply, a lock, the binding pool), which py-spy leaves out
of its samples. Timing the stages from the inside shows the waits. The wrappers are the
only difference from bench_storm.py; every argument is passed through to it.

Usage: python benchmarks/storm/profile_storm.py --only gpu --rounds 1 [bench_storm options]
"""

from __future__ import annotations

import collections
import functools
import os
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_storm  # noqa: E402

_totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
_lock = threading.Lock()


def timed(owner: Any, name: str, label: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            with _lock:
                entry = _totals[label]
                entry[0] += 1
                entry[1] += time.perf_counter() - started

    setattr(owner, name, wrapper)


def main() -> None:
    from simkube import scheduler
    from vgpu_plugin.demo import kubelet
    from vgpu_plugin.extender import cluster, decisions

    timed(scheduler.SimScheduler, "schedule_one", "scheduler: one scheduling cycle")
    timed(scheduler.SimScheduler, "_node_fit", "scheduler: node resource fit")
    timed(scheduler.SimScheduler, "_extender_filter", "scheduler: extender filter over HTTP")
    timed(scheduler.SimScheduler, "_select", "scheduler: prioritize over HTTP and choice")
    timed(scheduler.SimScheduler, "_bind", "scheduler: binding cycle (incl. event)")
    timed(scheduler.SimScheduler, "_record", "scheduler: event POST")
    timed(decisions.Decisions, "filter", "extender: filter decision")
    timed(decisions.Decisions, "prioritize", "extender: prioritize decision")
    timed(decisions.Decisions, "bind", "extender: bind (all of it)")
    for verb in ("get_pod", "patch_annotations", "bind"):
        timed(cluster.KubePodAPI, verb, f"extender: API {verb}")
    from vgpu_plugin.deviceplugin import allocator

    timed(allocator.Allocator, "allocate", "device plugin: Allocate (one resource)")
    timed(allocator.Allocator, "preferred", "device plugin: GetPreferredAllocation")
    timed(allocator.Allocator, "_fetch_fresh", "device plugin: list the node's pods (cache check)")
    timed(allocator.Allocator, "desired_annotations", "device plugin: record to write")
    timed(kubelet.SimKubelet, "_admit", "kubelet: admit one pod")
    timed(kubelet.SimKubelet, "_allocate_one", "kubelet: one Allocate (+ preferred)")
    timed(kubelet.SimKubelet, "_write_checkpoint", "kubelet: checkpoint write")
    timed(kubelet.SimKubelet, "_run", "kubelet: status Running")
    try:
        bench_storm.main()
    finally:
        print(f"\n{'stage':48s} {'calls':>6s} {'total s':>8s} {'mean ms':>8s}")
        for label, (calls, seconds) in sorted(_totals.items()):
            print(f"{label:48s} {int(calls):6d} {seconds:8.2f} {seconds / max(calls, 1) * 1000:8.1f}")


if __name__ == "__main__":
    main()
