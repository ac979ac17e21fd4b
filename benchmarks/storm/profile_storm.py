"""Where a storm's time goes, per stage: bench_storm.py with wall-clock timers around the
scheduler stand-in's cycle, the extender's verbs and each of bind's API calls, the device
plugin's calls and the kubelet stand-in's admission (stage_timers.py).

A sampling profiler sees little here: hundreds of threads share one GIL and most of a pod's
time is spent waiting (for an API reply, a lock, the binding pool), which py-spy leaves out
of its samples. Timing the stages from the inside shows the waits. The wrappers are the
only difference from bench_storm.py; every argument is passed through to it. With
``--control-plane-process`` the scheduler's and the extender's timers run in the control
plane's process and are read back over its pipe before it stops; with ``--node-processes N``
the nodes' run in each node process and are summed the same way.

Usage: python benchmarks/storm/profile_storm.py --only gpu --rounds 1 [bench_storm options]
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_storm  # noqa: E402
import stage_timers  # noqa: E402


def add(totals: dict[str, tuple[int, float]], more: dict[str, tuple[int, float]]) -> None:
    for label, (calls, seconds) in more.items():
        before = totals.get(label, (0, 0.0))
        totals[label] = (before[0] + calls, before[1] + seconds)


def main() -> None:
    split = "--control-plane-process" in sys.argv[1:]
    hosts = argparse.ArgumentParser(add_help=False)
    hosts.add_argument("--node-processes", type=int, default=0)
    here = () if hosts.parse_known_args()[0].node_processes else stage_timers.NODES  # nodes in this process
    stage_timers.install(here if split else here + stage_timers.CONTROL_PLANE)
    totals: dict[str, tuple[int, float]] = {}

    def started(cluster: Any) -> None:
        if split:
            cluster.control_plane.call(stage_timers.install_control_plane)
        for host in cluster.node_hosts:
            host.call(stage_timers.install_nodes)

    def stopping(cluster: Any) -> None:
        if split:
            add(totals, cluster.control_plane.call(stage_timers.totals))
        for host in cluster.node_hosts:  # each node process's timers, summed
            add(totals, host.call(stage_timers.totals))

    try:
        bench_storm.main(started=started, stopping=stopping)
    finally:
        add(totals, stage_timers.totals())
        print(f"\n{'stage':48s} {'calls':>6s} {'total s':>8s} {'mean ms':>8s}")
        for label, (calls, seconds) in sorted(totals.items()):
            print(f"{label:48s} {calls:6d} {seconds:8.2f} {seconds / max(calls, 1) * 1000:8.1f}")


if __name__ == "__main__":
    main()
