"""cProfile of the extender's hot paths, in process (no HTTP): the request decoded, decided
and its reply encoded exactly as the tornado handlers do it, on the cluster of
bench_extender.py (by default 5,000 nodes x 8 GPUs with 100,000 running pods).

Per path (filter, prioritize, bind with an in-memory API) it prints the mean time per call
and the functions with the most cumulative and own time.

Usage: python benchmarks/extender/profile_extender.py [--nodes 5000] [--pods 100000]
           [--names kube-scheduler|all] [--calls 300] [--top 15]
           [--policy binpack|fgd-filter|...] [--timing [--warmup 20] [--stages]] [--no-headroom]
           [--pause-ms 6] [--evict-mb 64]

``--stages`` (with ``--timing``): the filter's CPU time per stage too (decode, the generic
filter, fgd-filter's pick and its parts), percentiles over the filters that ran the stage, and
the stages of the slowest filters.

``--pause-ms`` sleeps and ``--evict-mb`` writes a buffer of that size before each filter: the
filter then runs on caches other work has used, as it does over HTTP when kube-scheduler (or
bench_extender.py's client and its other servers) runs between two requests; back to back, the
cycles here keep the extender's working set cached and the filter looks cheaper than it is
(benchmarks/extender/README.md, "Twelfth step").

Every node's CPU headroom is known (128 CPUs allocatable less 2 per running pod), as the
deployed extender's informers give it; ``--no-headroom`` leaves it unknown.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_extender as bench  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=100000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--names", choices=("kube-scheduler", "all"), default="kube-scheduler")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--policy", default="binpack", help="the extender's placement policy")
    parser.add_argument("--timing", action="store_true",
                        help="no profiler: each call's time, percentiles after --warmup calls")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--stages", action="store_true", help="with --timing: CPU time per stage of the filter")
    parser.add_argument("--no-headroom", action="store_true",
                        help="leave every node's CPU headroom unknown (what this script did before: the "
                             "fgd-filter batch then never counts CPU copies, unlike the deployed extender)")
    parser.add_argument("--pause-ms", type=float, default=0.0, help="sleep this long before each filter")
    parser.add_argument("--evict-mb", type=int, default=0, help="write a buffer of this many MB before each filter")
    args = parser.parse_args()

    stages = _time_stages() if args.stages else None
    from vgpu_plugin.extender.decisions import Decisions
    from vgpu_plugin.extender.headroom import HostHeadroom
    from vgpu_plugin.extender.wire import (
        binding_result,
        decode_binding_args,
        decode_extender_args,
        dumps,
        filter_result,
        priority_list,
    )

    started = time.perf_counter()
    nodes = bench.make_nodes(args.nodes, args.gpus)
    pods = bench.make_running_pods(nodes, args.pods, args.seed)
    ledger = bench.build_ledger(nodes, pods)
    hosts = HostHeadroom()
    if not args.no_headroom:  # what the deployed extender's node and pod informers feed it
        bench.feed_headroom(hosts, nodes, pods)
    decisions = Decisions(ledger, bench.InMemoryPods(), bench.NAMES, args.policy, hosts=hosts)
    gc.collect()
    gc.freeze()  # as the extender does after its first full list: no full collections over this heap
    print(f"cluster of {args.nodes} nodes and {args.pods} pods built in {time.perf_counter() - started:.1f} s")
    node_names = [f"node-{i:04d}" for i in range(args.nodes)]

    def filter_call(body: bytes) -> bytes:  # FilterHandler.post
        request = decode_extender_args(body)
        found = decisions.filter(request)
        return dumps(filter_result(request, found.passed, found.failed, found.unresolvable))

    def prioritize_call(body: bytes) -> bytes:  # PrioritizeHandler.post
        return dumps(priority_list(decisions.prioritize(decode_extender_args(body))))

    def bind_call(body: bytes) -> bytes:  # BindHandler.post (its executor step inline)
        return dumps(binding_result(decisions.bind(decode_binding_args(body))))

    # the requests of filter -> prioritize -> bind cycles, as bench_extender sends them:
    # prioritize names the nodes that passed the filter, bind the best of them
    work: list[tuple[dict[str, Any], bytes]] = []
    for cycle in range(args.calls):
        shape = cycle % len(bench.SHAPES)
        pod = bench.pod_object(f"pending-{shape}-{cycle}", bench.SHAPES[shape])
        names = bench.candidate_names(node_names, cycle, args)
        work.append((pod, json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()))
    calls = {"filter": filter_call, "prioritize": prioritize_call, "bind": bind_call}
    profiles = {verb: cProfile.Profile() for verb in calls}
    spent = dict.fromkeys(calls, 0.0)
    each: dict[str, list[float]] = {verb: [] for verb in calls}
    cpu: dict[str, list[float]] = {verb: [] for verb in calls}  # the process's CPU time: no preemption in it

    def timed(verb: str, body: bytes) -> Any:
        t, c = time.perf_counter(), time.process_time()
        if not args.timing:
            profiles[verb].enable()
        reply = calls[verb](body)
        if not args.timing:
            profiles[verb].disable()
        cpu[verb].append(time.process_time() - c)
        each[verb].append(time.perf_counter() - t)
        spent[verb] += each[verb][-1]
        return json.loads(reply)

    evicting = bytearray(args.evict_mb << 20)
    zeros = bytes(len(range(0, len(evicting), 64)))
    for pod, f_body in work:
        if args.pause_ms:
            time.sleep(args.pause_ms / 1000)
        if evicting:
            evicting[::64] = zeros  # one write per cache line
        passed = timed("filter", f_body)["NodeNames"] or []
        if not passed:
            continue
        scores = timed("prioritize", json.dumps({"Pod": pod, "Nodes": None, "NodeNames": passed}).encode())
        best = max(scores, key=lambda s: s["Score"])["Host"]
        name = pod["metadata"]["name"]
        error = timed("bind", json.dumps({"PodName": name, "PodNamespace": "bench", "PodUID": f"uid-{name}",
                                          "Node": best}).encode())["Error"]
        if error:
            raise RuntimeError(f"bind refused: {error}")
    if args.timing:
        if stages is not None:
            _print_stages(stages, args.warmup)
        for verb in calls:
            for what, values in (("wall", each[verb]), ("CPU", cpu[verb])):
                kept = sorted(values[args.warmup:])
                if kept:
                    at = {q: kept[min(len(kept) - 1, int(q / 100 * len(kept)))] * 1000 for q in (50, 90, 99)}
                    print(f"{verb} ({what}): {len(kept)} calls after {args.warmup}: p50 {at[50]:.2f} "
                          f"p90 {at[90]:.2f} p99 {at[99]:.2f} max {kept[-1] * 1000:.2f} ms (in process, no profiler)")
        return
    report: dict[str, Any] = {}
    for verb, profile in profiles.items():
        mean_ms = spent[verb] / args.calls * 1000
        report[verb] = round(mean_ms, 3)
        bench.print_cprofile(profile, f"{verb}: {mean_ms:.3f} ms per call under cProfile", args.top)
    print("\nmean ms per call (profiled):", json.dumps(report))


def _time_stages() -> dict[str, list[tuple[int, float]]]:
    """Wrap the filter's stages (those this checkout has) to record (filter number, CPU seconds)."""
    import functools

    from vgpu_plugin.extender import cache, decisions, fgd_batch, wire

    stages: dict[str, list[tuple[int, float]]] = {}
    number = [0]
    aimed = [(wire, "decode_extender_args", "decode (filter and prioritize)"),
             (decisions.Decisions, "filter", "filter, decided"), (decisions.Decisions, "_filter_slots", "generic _filter"),
             (decisions.Decisions, "_filter", "generic _filter"),
             (cache.DecisionCache, "slots_of", "  names to slots"),
             (decisions.Decisions, "_fgd_best", "fgd pick"), (decisions.Decisions, "_fgd_index", "  row lookups"),
             (decisions, "levels_of", "  numpy batch"), (decisions, "levels_few", "  few rows in Python"),
             (decisions, "stored_levels_few", "  few rows in Python"),
             (decisions, "falls_few_lists", "  few rows in Python"),
             (decisions.Decisions, "_fgd_top", "  best row (gather, argmax, levels not kept)"),
             (fgd_batch.CountMemo, "of", "  counts per snapshot"),
             (fgd_batch.CountMemo, "before_of", "  fragment before, per snapshot"),
             (getattr(fgd_batch, "RequestColumns", None), "falls", "  kept columns (batch and weighing)"),
             (fgd_batch, "fall_parts", "    batch for rows or typical pods not kept")]
    for owner, name, label in aimed:
        if owner is None or not hasattr(owner, name):  # not in this checkout
            continue
        function = getattr(owner, name)

        def timed(*args: Any, _function: Any = function, _label: str = label, **kwargs: Any) -> Any:
            if _label == "filter, decided":
                number[0] += 1
            started = time.process_time()
            try:
                return _function(*args, **kwargs)
            finally:
                stages.setdefault(_label, []).append((number[0], time.process_time() - started))

        setattr(owner, name, functools.wraps(function)(timed))
    return stages


def _print_stages(stages: dict[str, list[tuple[int, float]]], warmup: int) -> None:
    per_filter: dict[int, dict[str, float]] = {}
    for label, values in stages.items():
        for number, seconds in values:
            if number > warmup:
                per_filter.setdefault(number, {}).setdefault(label, 0.0)
                per_filter[number][label] += seconds
    for label in stages:
        kept = sorted(entry[label] for entry in per_filter.values() if label in entry)
        if kept:
            at = {q: kept[min(len(kept) - 1, int(q / 100 * len(kept)))] * 1000 for q in (50, 90, 99)}
            print(f"stage {label:32} {len(kept):4} filters: p50 {at[50]:.3f} p90 {at[90]:.3f} p99 {at[99]:.3f} ms CPU")
    slowest = sorted(per_filter, key=lambda n: -per_filter[n].get("filter, decided", 0.0))[:5]
    for number in slowest:
        print(f"slow filter {number}: " + ", ".join(f"{label.strip()} {seconds * 1000:.2f}"
                                                    for label, seconds in per_filter[number].items()))


if __name__ == "__main__":
    main()
