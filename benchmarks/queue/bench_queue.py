"""The cost of the extender's GET /queue (issue 17: "cheap to call").

A real extender (its HTTP server and token check) over a hand-fed ledger of N nodes x 8 cards,
most of them full, and a pod cache holding P waiting vGPU pods plus B bound ones (the pods an
informer would hold). Measured: one recompute of the report (one pass over the pod cache, done
at most once per ``queue_max_age``), and the latency of GET /queue (whole queue) and
GET /queue?namespace=&pod= (one pod's entry) over HTTP while the report is cached.

    .venv/bin/python benchmarks/queue/bench_queue.py --nodes 1000 --waiting 500 --bound 20000 --calls 300
    .venv/bin/python benchmarks/queue/bench_queue.py --nodes 1000 --waiting 500 --bound 20000 --calls 300 \
        --distinct-nodes --shapes 500   # the worst case
    .venv/bin/python benchmarks/queue/bench_queue.py --nodes 5000 --waiting 1500 --bound 100000 --calls 100 \
        --touch 200   # a recompute after a bind burst on 200 nodes (issue 18); --profile 30: cProfile of one
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vgpu_plugin.extender.cluster import unbound  # noqa: E402
from vgpu_plugin.extender.ledger import Holding, Ledger, node_cards  # noqa: E402
from vgpu_plugin.extender.server import Extender  # noqa: E402

from jupyter_vgpu.core import contract  # noqa: E402
from jupyter_vgpu.core.contract import CardShare, ContainerAllocation  # noqa: E402
from jupyter_vgpu.core.inventory import Card, NodeInventory  # noqa: E402

TOKEN = "bench-queue-token-0123456789abcdef"
DISTINCT_SIZES = (contract.MAX_CARD_MEMORY_MIB - 16384) // 256 - 8  # room for the waiting pods to ask more


class PodCache:
    """What ``Extender.queue_report`` reads of the informer: ``subset_items()``, its index of the
    unbound pods (``cluster.unbound``), kept apart from the bound ones as the informer does."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.unbound = [p for p in pods if unbound(p)]

    def items(self) -> list[dict[str, Any]]:
        return self.pods

    def subset_items(self) -> list[dict[str, Any]]:
        return list(self.unbound)


class View:
    synced = True
    sync_seconds = 0.0

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = PodCache(pods)

    def start(self) -> None:
        """Filled by hand: nothing to list or watch."""

    def stop(self) -> None:
        """Nothing to stop."""


def pod(name: str, cores: int, units: int, node: str | None, second: int) -> dict[str, Any]:
    limits = {contract.DEFAULT_NAMES.core_resource: str(cores), contract.DEFAULT_NAMES.memory_resource: str(units)}
    spec: dict[str, Any] = {"schedulerName": contract.SCHEDULER_NAME, "priority": second % 3,
                            "containers": [{"name": "notebook", "resources": {"limits": limits}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "jhub", "uid": f"uid-{name}",
                         "creationTimestamp": f"2026-11-26T{second // 3600 % 24:02d}:{second // 60 % 60:02d}:"
                                              f"{second % 60:02d}Z"},
            "spec": spec, "status": {"phase": "Running" if node else "Pending"}}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--waiting", type=int, default=500)
    parser.add_argument("--bound", type=int, default=20000)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--shapes", type=int, default=8,
                        help="distinct request shapes among the waiting pods (a Hub's profile list: a few)")
    parser.add_argument("--distinct-nodes", action="store_true",
                        help="give every node a room of its own (worst case; default: identical nodes)")
    parser.add_argument("--touch", type=int, default=0, metavar="N",
                        help="before each timed recompute, bind one pod on each of N nodes (a bind burst)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print cProfile's N costliest functions of one recompute, then stop")
    args = parser.parse_args()

    ledger = Ledger()
    for n in range(args.nodes):
        name = f"gpu-{n:04d}"
        # distinct nodes: card memory steps by one unit up to just below the 512 GiB cap (1,976 sizes), and
        # beyond that the node holds 1, 2, ... whole cards, so every node has a room of its own
        step = n % DISTINCT_SIZES if args.distinct_nodes else 0
        memory = 16384 + 256 * step
        cards = tuple(Card(index=i, uuid=f"GPU-{name}-{i}", model="A100", memory_mib=memory, minor=i)
                      for i in range(8))
        inventory = NodeInventory(node=name, cards=cards, topology=None)
        node = {"metadata": {"name": name, "annotations": {contract.DEFAULT_NAMES.node_inventory: inventory.to_json()}}}
        ledger.set_node(name, node_cards(node, contract.DEFAULT_NAMES))
        held = n // DISTINCT_SIZES if args.distinct_nodes else 0
        if held:
            shares = tuple(CardShare(i, f"GPU-{name}-{i}", contract.CORES_PER_CARD, memory // 256) for i in range(held))
            ledger.put(Holding(f"held-{name}", "jhub", f"held-{name}", name,
                               (ContainerAllocation(0, "notebook", shares),)))
    pods = [pod(f"bound-{i}", 0, 0, f"gpu-{i % args.nodes:04d}", i) for i in range(args.bound)]
    # every waiting pod asks more memory than any card has (each gets a reason and an alternative)
    top = 16384 // 256 + (min(args.nodes, DISTINCT_SIZES) if args.distinct_nodes else 0)
    pods += [pod(f"waiting-{i}", 1 + i % args.shapes % 99, top + 1 + i % args.shapes // 99, None, i)
             for i in range(args.waiting)]
    extender = Extender(port=0, ledger=ledger, queue_token=TOKEN, queue_max_age=3600, queue_notice_interval=None)
    extender.view = View(pods)  # type: ignore[assignment]

    if args.profile:
        import cProfile
        import pstats

        extender.queue_report()  # warm, as the notifier's second round is
        profiler = cProfile.Profile()
        profiler.enable()
        extender.queue_report()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.profile)
        return

    def bind_burst(round_: int) -> None:
        for k in range(args.touch):
            name = f"gpu-{(round_ * args.touch + k) % args.nodes:04d}"
            share = CardShare(7, f"GPU-{name}-7", 10, 4)
            ledger.put(Holding(f"burst-{round_}-{k}", "jhub", f"burst-{round_}-{k}", name,
                               (ContainerAllocation(0, "notebook", (share,)),)))

    extender.queue_report()  # the first recompute reads every node; the timed ones follow it
    computes = []
    for round_ in range(5):
        bind_burst(round_)
        started = time.perf_counter()
        report = extender.queue_report()
        computes.append(time.perf_counter() - started)
    assert len(report["pending"]) == args.waiting and len(report["nodes"]) == args.nodes, (len(report["pending"]), len(report["nodes"]))

    extender.start()
    try:
        def get(path: str) -> float:
            request = urllib.request.Request(extender.base_url + path, headers={"Authorization": f"Bearer {TOKEN}"})
            started = time.perf_counter()
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
            return time.perf_counter() - started

        get("/queue")  # the one recompute; the rest are served from the cache
        whole = [get("/queue") for _ in range(args.calls)]
        one = [get(f"/queue?namespace=jhub&pod=waiting-{i % args.waiting}") for i in range(args.calls)]
    finally:
        extender.stop()
    print(f"{args.nodes} {'distinct' if args.distinct_nodes else 'identical'} nodes x 8 cards, "
          f"{args.waiting} waiting pods in {args.shapes} shapes + {args.bound} bound pods")
    print(f"recompute after {args.touch} nodes changed (one pass over the pod cache): median {statistics.median(computes) * 1000:.1f} ms, "
          f"max {max(computes) * 1000:.1f} ms; passes during the HTTP calls: {extender.queue.computed}")
    for label, values in (("GET /queue (whole)", whole), ("GET /queue?namespace=&pod= (one pod)", one)):
        print(f"{label}: p50 {percentile(values, 0.5) * 1000:.2f} ms, p99 {percentile(values, 0.99) * 1000:.2f} ms")


if __name__ == "__main__":
    main()
