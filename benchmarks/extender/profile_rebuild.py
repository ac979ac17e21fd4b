"""cProfile (or wall time) of the extender's rebuild in process: the real ``Extender`` wiring
(ledger, CPU/memory headroom, decision caches, ``ClusterView``) fed the node and pod lists
through the informer's own ``_apply_list``, as after the first LIST, without HTTP or decoding.

Usage: python benchmarks/extender/profile_rebuild.py [--nodes 5000] [--pods 100000]
           [--top 20] [--timing [--repeat 3]]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_extender as bench  # noqa: E402

sys.modules["kubernetes_validate"] = None  # type: ignore[assignment]  # as bench_extender starts the extender


def rebuild(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> Any:
    """A fresh extender's ledger after its informers applied ``nodes`` then ``pods``."""
    from kubernetes import client
    from vgpu_plugin.extender.server import Extender
    from vgpu_plugin.informer import cyclic_gc_paused

    extender = Extender(names=bench.NAMES, api_client=client.ApiClient(), policy="binpack")
    view = extender.view
    with cyclic_gc_paused():
        view.nodes._apply_list({"items": nodes, "metadata": {"resourceVersion": "1"}})
    with cyclic_gc_paused():
        view.pods._apply_list({"items": pods, "metadata": {"resourceVersion": "2"}})
    return extender


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=100000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--timing", action="store_true", help="no profiler: wall and CPU seconds per rebuild")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import kubernetes  # noqa: F401  # imported before the clock starts: the rebuild, not the imports
    from vgpu_plugin.extender import server  # noqa: F401
    nodes = bench.make_nodes(args.nodes, args.gpus)
    pods = bench.make_running_pods(nodes, args.pods, args.seed)
    gc.collect()
    if args.timing:
        for _ in range(args.repeat):
            t, c = time.perf_counter(), time.process_time()
            extender = rebuild(nodes, pods)
            wall, cpu = time.perf_counter() - t, time.process_time() - c
            assert extender.ledger.stats()["pods"] == args.pods
            print(f"rebuild in process: {wall:.2f} s wall, {cpu:.2f} s CPU "
                  f"({args.nodes} nodes, {args.pods} pods, load {os.getloadavg()[0]:.2f})", flush=True)
            del extender
            gc.collect()
        return
    profile = cProfile.Profile()
    profile.enable()
    rebuild(nodes, pods)
    profile.disable()
    for order in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(order).print_stats(args.top)
        print(f"\n=== rebuild, sorted by {order} ===")
        print(out.getvalue().replace(os.getcwd() + "/", "").rstrip())


if __name__ == "__main__":
    main()
