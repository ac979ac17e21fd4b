"""Where a storm's time goes, per stage: bench_storm.py with wall-clock timers around the
scheduler stand-in's cycle, the extender's verbs and each of bind's API calls, the device
plugin's calls and the kubelet stand-in's admission (stage_timers.py).

A sampling profiler sees little here: hundreds of threads share one GIL and most of a pod's
time is spent waiting (for an API reply, a lock, the binding pool), which py-spy leaves out
of its samples. Timing the stages from the inside shows the waits. The wrappers are the
only difference from bench_storm.py; every argument is passed through to it. With
``--control-plane-process`` the scheduler's and the extender's timers run in the control
plane's process and are read back over its pipe before it stops.

Usage: python benchmarks/storm/profile_storm.py --only gpu --rounds 1 [bench_storm options]
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_storm  # noqa: E402
import stage_timers  # noqa: E402


def main() -> None:
    split = "--control-plane-process" in sys.argv[1:]
    stage_timers.install(stage_timers.NODES if split else stage_timers.NODES + stage_timers.CONTROL_PLANE)
    totals: dict[str, tuple[int, float]] = {}

    def started(cluster: Any) -> None:
        if split:
            cluster.control_plane.call(stage_timers.install_control_plane)

    def stopping(cluster: Any) -> None:
        if split:
            totals.update(cluster.control_plane.call(stage_timers.totals))

    try:
        bench_storm.main(started=started, stopping=stopping)
    finally:
        totals.update(stage_timers.totals())
        print(f"\n{'stage':48s} {'calls':>6s} {'total s':>8s} {'mean ms':>8s}")
        for label, (calls, seconds) in sorted(totals.items()):
            print(f"{label:48s} {calls:6d} {seconds:8.2f} {seconds / max(calls, 1) * 1000:8.1f}")


if __name__ == "__main__":
    main()
