"""MIG variant of the placement benchmark: isolated notebook sessions on partitioned A100s.

Every scheduler sees the same seeded trace of isolated share requests on the same MIG
cluster (layouts an admin could make with nvidia-smi mig, from NVIDIA's profile tables):

- ``jupyter-vgpu``: this project's policy as the extender runs it: per node
  ``core.node_placement.score`` (the closest fitting slice scores highest), the best node,
  then ``place`` on it (the smallest fitting slice, then the card with fewest free slices);
- ``first-fit``: the first node, card and GPU instance (in index order) with a free slice
  that fits, as a naive device plugin or a scheduler unaware of slice sizes would do.

A request that does not fit waits (retried when any slice is given back) until its patience
runs out. Reported per scheduler: sessions admitted and given up, pending time, and slices
stranded by the policy: placements that took a bigger slice while a smaller fitting one was
free in the cluster, and the share of held slice capacity (compute + memory fraction) that
no one asked for.

Run:  .venv/bin/python benchmarks/placement/mig.py [--seeds 1 2 3] [--sessions 1500] [--rate 1.0]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from jupyter_vgpu.core.contract import CORES_PER_CARD, MEMORY_UNIT_MIB, Request
from jupyter_vgpu.core.inventory import Card, NodeInventory
from jupyter_vgpu.core.mig import GEOMETRIES, Sharing, slices_of
from jupyter_vgpu.core.mig_placement import NodeSlice, node_slices
from jupyter_vgpu.core.node_placement import NodePlacement, place, score
from jupyter_vgpu.core.placement import NodeState

GIB = 1024 // MEMORY_UNIT_MIB
A100 = GEOMETRIES["A100-SXM4-40GB"]
# four nodes of four A100-40GB cards, each card partitioned as admins commonly do
LAYOUTS = (
    ("2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"),
    ("1g.5gb",) * 7,
    ("3g.20gb", "3g.20gb"),
    ("4g.20gb", "2g.10gb", "1g.5gb"),
)
NODES = 4
# (cores, memory GiB) asks of isolated notebooks, and how often: most fit a 1g, some a 2g or 3g
ASKS = (((10, 4), 0.35), ((14, 5), 0.15), ((20, 8), 0.2), ((28, 10), 0.1), ((25, 16), 0.1), ((40, 20), 0.1))


@dataclass(frozen=True)
class Session:
    arrival: float
    duration: float
    patience: float
    request: Request


@dataclass
class Result:
    admitted: int = 0
    gave_up: int = 0
    waits: list[float] = field(default_factory=list)
    oversized: int = 0          # took a bigger slice while a smaller fitting one was free
    held_size: Fraction = Fraction(0)
    asked_size: Fraction = Fraction(0)


Scheduler = Callable[[dict[str, tuple[NodeSlice, ...]], dict[str, set[str]], Request], tuple[str, NodeSlice] | None]


def build_cluster() -> dict[str, tuple[NodeSlice, ...]]:
    cluster = {}
    for n in range(NODES):
        cards = tuple(Card(i, f"GPU-{n}-{i}", A100.model, A100.memory_mib, healthy=False, mig=True,
                           slices=slices_of(A100, list(LAYOUTS[(n + i) % len(LAYOUTS)]), f"GPU-{n}-{i}"))
                      for i in range(4))
        name = f"mig-{n}"
        cluster[name] = node_slices(NodeInventory(name, cards, None))
    return cluster


def make_trace(seed: int, sessions: int, per_minute: float) -> list[Session]:
    rng = random.Random(seed)
    now, trace = 0.0, []
    asks, weights = zip(*ASKS, strict=True)
    for _ in range(sessions):
        now += rng.expovariate(per_minute)
        cores, gib = rng.choices(asks, weights)[0]
        trace.append(Session(now, rng.lognormvariate(3.8, 0.8), 20.0, Request(cores, gib * GIB)))
    return trace


def ours(cluster: dict[str, tuple[NodeSlice, ...]], held: dict[str, set[str]],
         request: Request) -> tuple[str, NodeSlice] | None:
    empty = NodeState(())
    best: tuple[int, str] | None = None
    for name, slices in cluster.items():
        value = score(empty, slices, held[name], {0: request}, "binpack", Sharing(), True)
        if value and (best is None or value > best[0]):
            best = (value, name)
    if best is None:
        return None
    found = place(empty, cluster[best[1]], held[best[1]], {0: request}, "binpack", Sharing(), True)
    assert isinstance(found, NodePlacement)
    return best[1], found.slices.containers[0]


def first_fit(cluster: dict[str, tuple[NodeSlice, ...]], held: dict[str, set[str]],
              request: Request) -> tuple[str, NodeSlice] | None:
    for name, slices in cluster.items():
        for s in slices:
            if s.uuid not in held[name] and s.slice.fits(request):
                return name, s
    return None


def _asked(request: Request, s: NodeSlice) -> Fraction:
    return Fraction(request.cores, CORES_PER_CARD) + Fraction(request.memory_mib, s.card_memory_mib)


def simulate(scheduler: Scheduler, cluster: dict[str, tuple[NodeSlice, ...]], trace: Sequence[Session]) -> Result:
    held: dict[str, set[str]] = {name: set() for name in cluster}
    result = Result()
    leaving: list[tuple[float, int, str, str]] = []
    waiting: list[Session] = []
    order = itertools.count()

    def admit(session: Session, now: float) -> bool:
        chosen = scheduler(cluster, held, session.request)
        if chosen is None:
            return False
        name, s = chosen
        assert s.uuid not in held[name] and s.slice.fits(session.request)
        smallest = min((x.size for n, xs in cluster.items() for x in xs
                        if x.uuid not in held[n] and x.slice.fits(session.request)))
        result.oversized += s.size > smallest
        held[name].add(s.uuid)
        result.admitted += 1
        result.waits.append(now - session.arrival)
        result.held_size += s.size
        result.asked_size += _asked(session.request, s)
        heapq.heappush(leaving, (now + session.duration, next(order), name, s.uuid))
        return True

    def retry(now: float) -> None:
        for session in list(waiting):
            if now - session.arrival > session.patience:
                waiting.remove(session)
                result.gave_up += 1
            elif admit(session, now):
                waiting.remove(session)

    for session in trace:
        while leaving and leaving[0][0] <= session.arrival:
            when, _, name, uuid = heapq.heappop(leaving)
            held[name].discard(uuid)
            retry(when)
        if not admit(session, session.arrival):
            waiting.append(session)
    result.gave_up += len(waiting)
    return result


def report(results: dict[str, Result]) -> str:
    lines = ["| scheduler | admitted | gave up | mean wait (min) | oversized placements | "
             "held capacity not asked for |", "|---|---|---|---|---|---|"]
    for name, r in results.items():
        wasted = 1 - r.asked_size / r.held_size if r.held_size else 0
        lines.append(f"| {name} | {r.admitted} | {r.gave_up} | {statistics.fmean(r.waits or [0]):.2f} | "
                     f"{r.oversized} ({r.oversized / max(1, r.admitted):.0%}) | {float(wasted):.0%} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--sessions", type=int, default=1500)
    parser.add_argument("--rate", type=float, default=1.0, help="arrivals per minute")
    args = parser.parse_args(argv)
    totals: dict[str, Result] = {}
    for seed in args.seeds:
        trace = make_trace(seed, args.sessions, args.rate)
        for name, scheduler in (("jupyter-vgpu", ours), ("first-fit", first_fit)):
            r = simulate(scheduler, build_cluster(), trace)
            total = totals.setdefault(name, Result())
            total.admitted += r.admitted
            total.gave_up += r.gave_up
            total.waits += r.waits
            total.oversized += r.oversized
            total.held_size += r.held_size
            total.asked_size += r.asked_size
    print(f"MIG cluster: {NODES} nodes x 4 A100-40GB, layouts {', '.join('+'.join(x) for x in LAYOUTS)}; "
          f"seeds {args.seeds}, {args.sessions} isolated sessions each, {args.rate}/min")
    print(report(totals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
