"""The extender's bind verb on the cluster of bench_extender.py (by default 5,000 nodes x
8 GPUs with 100,000 running pods), with its in-memory API, after the filter -> bind cycles
bench_extender runs first (they teach fgd-filter its typical pods).

The binds are those of bench_extender's throughput phase: ``pending-1-b<i>`` (10 cores,
8 GiB) to node ``i mod nodes``; a bind the node's cards cannot take any more is refused and
counted, as there. ``--headroom`` gives the extender every node's allocatable CPU and the
running pods' requests, as its node and pod watches do in a deployment (the benchmark's
in-memory server has none), so fgd-filter's bind takes the CPU into account.

Three modes:
- default: in process (no HTTP), the request decoded, decided and its reply encoded as
  BindHandler does it (its executor step inline), under cProfile: the functions with the
  most cumulative and own time;
- ``--timing``: the same without the profiler, each bind's CPU and wall time;
- ``--http``: the extender (tornado, its bind executor) in a child process and 8 keep-alive
  clients here, as bench_extender's throughput phase (without its latency phase): binds
  per second, the server's and the clients' CPU per bind; ``--py-spy FILE`` records the
  server meanwhile (py-spy is not a dependency: ``pip install py-spy``); ``--null`` measures bench_extender's null-wire server instead (the same
  tornado stack answering at once: the HTTP floor).

Usage: python benchmarks/extender/profile_bind.py [--policy fgd-filter] [--binds 1000]
           [--headroom] [--timing | --http [--clients 8] [--null] [--py-spy FILE]]
           [--trace FILE] [--top 25]
           [--nodes 5000] [--pods 100000] [--cache FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import http.client
import json
import os
import pickle
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_extender as bench  # noqa: E402


def cluster(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """bench_extender's nodes and running pods (from ``--cache`` when it exists)."""
    if args.cache and os.path.exists(args.cache):
        with open(args.cache, "rb") as file:
            return pickle.load(file)  # type: ignore[no-any-return]
    nodes = bench.make_nodes(args.nodes, args.gpus)
    pods = bench.make_running_pods(nodes, args.pods, args.seed)
    if args.cache:
        with open(args.cache, "wb") as file:
            pickle.dump((nodes, pods), file)
    return nodes, pods


def prepare(args: argparse.Namespace, decisions: Any, nodes: list[dict[str, Any]],
            pods: list[dict[str, Any]]) -> list[str]:
    """The headroom (``--headroom``), then the cycles bench_extender runs before its throughput
    phase; what each cycle's filter passed and its bind answered."""
    from vgpu_plugin.extender.wire import decode_binding_args, decode_extender_args

    if args.headroom:
        for node in nodes:
            decisions.hosts.on_node("ADDED", node)
        for pod in pods:
            decisions.hosts.on_pod("ADDED", pod)
    node_names = [f"node-{i:04d}" for i in range(args.nodes)]
    sample = argparse.Namespace(names="kube-scheduler")
    trace: list[str] = []
    for cycle in range(args.cycles):
        shape = cycle % len(bench.SHAPES)
        name = f"pending-{shape}-{cycle}"
        pod = bench.pod_object(name, bench.SHAPES[shape])
        passed = decisions.filter(decode_extender_args(json.dumps(
            {"Pod": pod, "Nodes": None, "NodeNames": bench.candidate_names(node_names, cycle, sample)}).encode()))[0]
        if passed:
            trace.append(f"filter {name}: {passed} bind: " + decisions.bind(decode_binding_args(json.dumps(
                {"PodName": name, "PodNamespace": "bench", "PodUID": f"uid-{name}", "Node": passed[0]}).encode())))
    return trace


def bind_bodies(args: argparse.Namespace) -> list[bytes]:
    bodies = []
    for i in range(args.binds):
        name = f"pending-1-b{i}"
        bodies.append(json.dumps({"PodName": name, "PodNamespace": "bench", "PodUID": f"uid-{name}",
                                  "Node": f"node-{i % args.nodes:04d}"}).encode())
    return bodies


def write_trace(path: str, trace: list[str], api: Any, decisions: Any) -> None:
    """Every decision of the run, for comparing two versions of the code: the cycles' filter
    results and bind answers, each pod's annotations (the bind time left out) and the ledger's claims."""
    names = bench.NAMES
    with open(path, "w") as out:
        out.writelines(line + "\n" for line in trace)
        for name in sorted(api.pods):
            annotations = dict(api.pods[name]["metadata"]["annotations"])
            annotations.pop(names.predicate_time, None)
            if names.allocation in annotations:
                record = json.loads(annotations[names.allocation])
                record.pop("assignedAtNs")
                annotations[names.allocation] = record
            out.write(f"pod {name} on {api.pods[name]['spec'].get('nodeName')}: "
                      f"{json.dumps(annotations, sort_keys=True)}\n")
        out.write(json.dumps(decisions.ledger.claims(), sort_keys=True) + "\n")


def serve(args: argparse.Namespace) -> None:
    """``--serve``: the extender with the in-memory API on ``--port``, as bench_extender's real server."""
    from vgpu_plugin.extender.server import Extender

    nodes, pods = cluster(args)
    ledger = bench.build_ledger(nodes, pods)
    extender = Extender(port=args.port, ledger=ledger, api=bench.InMemoryPods(), policy=args.policy)
    prepare(args, extender.decisions, nodes, pods)
    del nodes, pods
    gc.collect()
    extender.start()  # freezes the heap, as bench_extender's server
    print("ready", flush=True)
    threading.Event().wait()


def over_http(args: argparse.Namespace) -> None:
    port = bench.free_port()
    if args.null:  # bench_extender's null-wire server: tornado, parse and answer, no decision, no executor
        command = [sys.executable, bench.__file__, "--serve", "null-wire", "--port", str(port)]
    else:
        command = [sys.executable, __file__, "--serve", "--port", str(port), "--policy", args.policy,
                   "--nodes", str(args.nodes), "--gpus", str(args.gpus), "--pods", str(args.pods),
                   "--seed", str(args.seed), "--cycles", str(args.cycles)]
        command += ["--cache", args.cache] if args.cache else []
        command += ["--headroom"] if args.headroom else []
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline() if server.stdout else ""
        if not line.startswith("ready"):
            raise RuntimeError(f"the server did not start: {line!r}")
        bodies = bind_bodies(args)
        local = threading.local()
        refused = [0]

        def one(body: bytes) -> None:
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = http.client.HTTPConnection("127.0.0.1", port)
            _, reply = bench.call(conn, "/scheduler/bind", body)
            refused[0] += bool(reply["Error"])

        spy = None
        if args.py_spy:
            spy = subprocess.Popen(["py-spy", "record", "--pid", str(server.pid), "--rate", "250", "--nonblocking",
                                    "--format", "raw", "--gil", "--output", args.py_spy],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # py-spy attaches
        cpu_before, started = bench._cpu_seconds(server.pid), time.perf_counter()
        clients_before = time.process_time()
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(one, bodies))
        elapsed = time.perf_counter() - started
        cpu = bench._cpu_seconds(server.pid) - cpu_before
        clients = time.process_time() - clients_before
        if spy is not None:
            spy.send_signal(2)
            spy.wait(30)
        print(f"{'null-wire: ' if args.null else ''}{len(bodies)} binds over HTTP, {args.clients} clients, {refused[0]} refused: {len(bodies) / elapsed:.0f} binds/s; "
              f"server CPU {cpu / len(bodies) * 1000:.3f} ms per bind, the clients' {clients / len(bodies) * 1000:.3f} ms; "
              f"load {os.getloadavg()[0]:.2f}")
    finally:
        server.kill()


def in_process(args: argparse.Namespace) -> None:
    from vgpu_plugin.extender.decisions import Decisions
    from vgpu_plugin.extender.wire import binding_result, decode_binding_args, dumps

    started = time.perf_counter()
    nodes, pods = cluster(args)
    api = bench.InMemoryPods()
    decisions = Decisions(bench.build_ledger(nodes, pods), api, bench.NAMES, args.policy)
    trace = prepare(args, decisions, nodes, pods)
    del nodes, pods
    gc.collect()
    gc.freeze()  # as the extender does after its first full list
    print(f"cluster of {args.nodes} nodes and {args.cycles} filter -> bind cycles in "
          f"{time.perf_counter() - started:.1f} s; policy {args.policy}, headroom "
          f"{'known' if args.headroom else 'unknown'}, typical pods {len(decisions.typical_snapshot.shapes)}")
    profile = cProfile.Profile()
    wall: list[float] = []
    cpu: list[float] = []
    refused = 0
    for body in bind_bodies(args):
        t, c = time.perf_counter(), time.process_time()
        if not args.timing:
            profile.enable()
        reply = json.loads(dumps(binding_result(decisions.bind(decode_binding_args(body)))))
        if not args.timing:
            profile.disable()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - t)
        refused += bool(reply["Error"])  # the throughput phase counts refusals too (a full card)
        trace.append(f"bind {body.decode()}: {reply['Error']}")
    if args.trace:
        write_trace(args.trace, trace, api, decisions)
    print(f"{args.binds} binds, {refused} refused (the card was full)")
    if args.timing:
        for what, values in (("wall", wall), ("CPU", cpu)):
            kept = sorted(values[args.warmup:])
            at = {q: kept[min(len(kept) - 1, int(q / 100 * len(kept)))] * 1000 for q in (50, 90, 99)}
            mean = sum(kept) / len(kept) * 1000
            print(f"bind ({what}): {len(kept)} binds after {args.warmup}: mean {mean:.3f} p50 {at[50]:.3f} "
                  f"p90 {at[90]:.3f} p99 {at[99]:.3f} ms (in process, no profiler)")
        return
    mean_ms = sum(wall) / len(wall) * 1000
    bench.print_cprofile(profile, f"bind: {mean_ms:.3f} ms per call under cProfile", args.top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=100000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--binds", type=int, default=1000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--policy", default="fgd-filter", help="the extender's placement policy")
    parser.add_argument("--headroom", action="store_true",
                        help="the nodes' CPU headroom known, as the extender's watches make it")
    parser.add_argument("--timing", action="store_true", help="no profiler: CPU and wall time per bind")
    parser.add_argument("--http", action="store_true", help="over HTTP, 8 clients, the server in its own process")
    parser.add_argument("--clients", type=int, default=8, help="with --http: concurrent keep-alive clients")
    parser.add_argument("--null", action="store_true",
                        help="with --http: bench_extender's null-wire server instead (the HTTP floor)")
    parser.add_argument("--py-spy", help="with --http: py-spy's raw stacks of the server during the binds, to FILE")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--cycles", type=int, default=320,
                        help="filter -> bind cycles before the binds (bench_extender's 300 + 20 warm-up)")
    parser.add_argument("--cache", help="a pickle of the nodes and running pods, written on first use "
                                        "(the same --nodes/--gpus/--pods/--seed each time)")
    parser.add_argument("--trace", help="in process: write every decision to FILE (to compare two versions)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args)
    elif args.http:
        over_http(args)
    else:
        in_process(args)


if __name__ == "__main__":
    main()
