"""fgd-filter's worst case, in process: every filter scores all the nodes afresh.

``bench_extender.py`` rotates five request shapes, so after its warm-up fgd-filter's memo
answers for the nodes that did not change. Here every request has a shape not seen before
(and every 16th pod a drifted mix would do the same), so each filter scores all 1,000
nodes in one batch: ``Decisions.filter`` timed directly (no HTTP), on nodes with 8 cards
each holding a random load, the learned mix being the pods bound so far (``learn_bound``, as
the extender's bind).

    .venv/bin/python benchmarks/extender/bench_fgd_fresh.py --nodes 1000 --filters 300
    .venv/bin/python benchmarks/extender/bench_fgd_fresh.py --nodes 1000 --filters 300 --policy binpack
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin")]

from vgpu_plugin.extender.decisions import Decisions  # noqa: E402
from vgpu_plugin.extender.ledger import Holding, Ledger, NodeCards  # noqa: E402
from vgpu_plugin.extender.wire import ExtenderArgs  # noqa: E402

from jupyter_vgpu.core.contract import DEFAULT_NAMES, CardShare, ContainerAllocation  # noqa: E402
from jupyter_vgpu.core.inventory import Card  # noqa: E402


def pod(i: int, cores: int, memory: int) -> dict:
    limits = {DEFAULT_NAMES.core_resource: str(cores)}
    if memory:
        limits[DEFAULT_NAMES.memory_resource] = str(memory)
    return {"metadata": {"name": f"p{i}", "namespace": "bench", "uid": f"u{i}"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits, "requests": {"cpu": "2"}}}]}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--filters", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policy", default="fgd-filter", help="binpack: the same filters without fgd-filter's part")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    ledger = Ledger()
    names = [f"node-{i:04d}" for i in range(args.nodes)]
    held = 0
    for name in names:
        ledger.set_node(name, NodeCards(tuple(Card(g, f"{name}-{g}", "A100", 80 * 1024) for g in range(8)),
                                        None, "inventory"))
        for g in range(8):
            used = rng.choice([0, 0, 25, 50, 75, 90, 100])
            if used:
                held += 1
                share = CardShare(g, "", used, 0 if used == 100 else used * 3)
                ledger.put(Holding(f"h{held}", "bench", f"h{held}", name, (ContainerAllocation(0, "c", (share,)),)))
    decisions = Decisions(ledger, None, policy=args.policy)
    took = []
    for i in range(args.filters + 20):
        # a new shape each time: cores 1-99 with memory, or 1-4 whole cards
        if i % 5 == 4:
            cores, memory = 100 * (1 + i // 5 % 4), 0
        else:
            cores, memory = 1 + (i * 37) % 99, 4 + i % 200
        request = ExtenderArgs(pod=pod(i, cores, memory), node_names=names, nodes=None, raw_nodes=None)
        started = time.perf_counter()
        passed = decisions.filter(request).passed
        if i >= 20:  # the first filters also build the node rows
            took.append((time.perf_counter() - started) * 1000)
        if passed:
            # binpack passes every fitting node: bind to the first, as fgd-filter's one
            share = CardShare(0, "", min(cores, 100), memory)
            ledger.put(Holding(f"b{i}", "bench", f"b{i}", passed[0], (ContainerAllocation(0, "c", (share,)),)))
            decisions.learn_bound(request.pod)
    took.sort()
    p = lambda q: took[min(len(took) - 1, int(q * len(took)))]  # noqa: E731
    print(f"{args.policy}: {args.nodes} nodes, {len(took)} filters, each a new request shape, "
          f"{len(decisions.typical_snapshot.shapes)} typical pods at the end")
    print(f"filter ms: p50 {p(0.5):.2f}  p90 {p(0.9):.2f}  p99 {p(0.99):.2f}  max {took[-1]:.2f}  "
          f"mean {statistics.mean(took):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
