"""Where the benchmark process's CPU goes during a storm: bench_storm.py under yappi's CPU clock.

``profile_storm.py`` times the stages from the inside (wall time, waits included); a sampling
profiler sees little in a process of ~600 mostly waiting threads. This one counts CPU time per
function over all threads (yappi, CPU clock) from the moment the cluster is up to the moment
it stops, and prints the functions with the most CPU, by total and by own time. yappi's hooks
make Python calls several times slower, so storms run slower under it and call-heavy code
looks heavier than it is: read it for where the CPU goes, and time with bench_storm.py.
Every argument is passed through to bench_storm.py. Needs the ``bench`` extra (yappi).

Usage: python benchmarks/storm/cpu_profile_storm.py --api-process --control-plane-process --only gpu --rounds 1 [--top N]
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_storm  # noqa: E402


def _top() -> int:
    """``--top N`` (taken out of the arguments bench_storm.py reads)."""
    if "--top" not in sys.argv:
        return 40
    at = sys.argv.index("--top")
    value = int(sys.argv[at + 1])
    del sys.argv[at:at + 2]
    return value


def main() -> None:
    import yappi

    top = _top()
    printed: dict[str, str] = {}

    def started(cluster: Any) -> None:
        yappi.set_clock_type("cpu")
        yappi.start(builtins=False, profile_threads=True)

    def stopping(cluster: Any) -> None:
        yappi.stop()
        stats = list(yappi.get_func_stats())
        for key in ("ttot", "tsub"):
            lines = [f"{'calls':>9s} {'own s':>8s} {'total s':>8s}  function"]
            for stat in sorted(stats, key=lambda s: getattr(s, key), reverse=True)[:top]:
                lines.append(f"{stat.ncall:9d} {stat.tsub:8.3f} {stat.ttot:8.3f}  {stat.full_name}")
            printed[key] = "\n".join(lines)

    bench_storm.main(started=started, stopping=stopping)
    for key, title in (("ttot", "including callees"), ("tsub", "own time")):
        print(f"\nCPU seconds by function, by {title} (top {top}):\n{printed.get(key, '(no profile)')}")


if __name__ == "__main__":
    main()
