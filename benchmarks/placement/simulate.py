"""Trace-driven placement benchmark: notebook sessions arriving at and leaving a small GPU cluster.

Every scheduler sees the same seeded trace on the same cluster and is run side by side:

- ``jupyter-vgpu binpack`` / ``jupyter-vgpu spread``: this project's policies
  (``jupyter_vgpu.core.placement``): the node with the highest ``score_node``, then
  ``place_pod`` on it.
- ``gpu-admission``: TKEStack gpu-admission as documented: nodes and cards best-fit by
  free cores (the fitting node, then the fitting card, with the fewest free cores),
  whole cards taken in index order, topology ignored.
- ``HAMi default``: HAMi's default policies: node ``binpack`` (the fitting node with the
  highest usage), card ``spread`` (the fitting card with the lowest usage); whole cards
  are the free cards in index order (all have usage 0), topology ignored.

A request that does not fit waits (like a pending pod, retried whenever capacity is
freed on some node) until its patience runs out. Reported per scheduler: admitted
requests by kind, pending time, stranded capacity, and the link cost of multi-card sets
against the exact optimum available on the chosen node at that moment.

Run:  .venv/bin/python benchmarks/placement/simulate.py [--seeds 1 2 3] [--sessions 1500]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from jupyter_vgpu.core.contract import CORES_PER_CARD, MEMORY_UNIT_MIB, Request
from jupyter_vgpu.core.fgd import FGD_CAPACITY, FGD_DECAY, drifted
from jupyter_vgpu.core.fragment import Mix, MixLearner, Shape
from jupyter_vgpu.core.placement import (
    CardState,
    FragmentView,
    NodeState,
    PodPlacement,
    fgd_level,
    place_pod,
    reserve,
    reserved_cards,
    score_node,
    uses_reserved,
)
from jupyter_vgpu.core.topology import Topology, parse_nvidia_smi_topo
from jupyter_vgpu.data import topology_fixture

GIB = 1024 // MEMORY_UNIT_MIB  # memory units per GiB

# (node name, topology capture, card memory in GiB)
CLUSTER = (
    ("p40-a", "p40-7gpu-pix-phb", 24),
    ("p40-b", "p40-7gpu-pix-phb", 24),
    ("a100pcie-a", "a100-pcie-4gpu-2numa", 40),
    ("a100pcie-b", "a100-pcie-4gpu-2numa", 40),
    ("a100sxm", "a100-sxm-4gpu-nv4", 40),
    ("dgx", "dgx-a100", 40),
)

# --- the trace ------------------------------------------------------------------------------
#
# Sessions arrive as a Poisson process. Kinds and sizes (documented in README.md):
#   share  70 %: cores uniform from {5, 10, 20, 25, 50}; memory uniform from {2, 4, 8, 16, 20} GiB;
#                duration lognormal, median 45 min; patience 20 min
#   whole  15 %: one whole card; duration lognormal, median 60 min; patience 30 min
#   multi  15 %: 2 cards (55 %), 3 cards (15 %), 4 cards (30 %); median 90 min; patience 60 min

SHARE_CORES = (5, 10, 20, 25, 50)
SHARE_GIB = (2, 4, 8, 16, 20)
MULTI_CARDS = ((2, 0.55), (3, 0.15), (4, 0.30))
KINDS = (("share", 0.70), ("whole", 0.15), ("multi", 0.15))
MEDIAN_MINUTES = {"share": 45.0, "whole": 60.0, "multi": 90.0}
PATIENCE_MINUTES = {"share": 20.0, "whole": 30.0, "multi": 60.0}
SIGMA = 0.8  # lognormal shape: mean is about 1.38x the median


@dataclass(frozen=True)
class Session:
    id: int
    arrival: float
    duration: float
    kind: str
    request: Request
    patience: float


def _pick(rng: random.Random, weighted: Sequence[tuple[object, float]]) -> object:
    return rng.choices([v for v, _ in weighted], weights=[w for _, w in weighted])[0]


def make_trace(seed: int, sessions: int, per_minute: float) -> list[Session]:
    rng = random.Random(seed)
    now, trace = 0.0, []
    for i in range(sessions):
        now += rng.expovariate(per_minute)
        kind = str(_pick(rng, KINDS))
        if kind == "share":
            request = Request(rng.choice(SHARE_CORES), rng.choice(SHARE_GIB) * GIB)
        elif kind == "whole":
            request = Request(CORES_PER_CARD)
        else:
            request = Request(CORES_PER_CARD * int(_pick(rng, MULTI_CARDS)))  # type: ignore[call-overload]
        duration = rng.lognormvariate(0.0, SIGMA) * MEDIAN_MINUTES[kind]
        trace.append(Session(i, now, duration, kind, request, PATIENCE_MINUTES[kind]))
    return trace


# --- schedulers -----------------------------------------------------------------------------

Choice = tuple[str, PodPlacement]
Scheduler = Callable[[dict[str, NodeState], Sequence[str], Request], Choice | None]


def _could_fit(state: NodeState, request: Request) -> bool:
    if request.is_share:
        return any(c.fits_share(request.cores, request.memory_units) for c in state.cards)
    return len(state.free_cards()) >= request.cards


def ours(policy: str) -> Scheduler:
    def choose(nodes: dict[str, NodeState], candidates: Sequence[str], request: Request) -> Choice | None:
        pod = {0: request}
        scored = [(score_node(nodes[n], pod, policy), -i, n) for i, n in enumerate(candidates)
                  if _could_fit(nodes[n], request)]
        scored = [s for s in scored if s[0] > 0]
        if not scored:
            return None
        name = max(scored)[2]
        placement = place_pod(nodes[name], pod, policy)
        assert isinstance(placement, PodPlacement)
        return name, placement

    return choose


@dataclass
class PendingAware:
    """Our binpack with reservations for pending multi-card pods, as the extender would run it.

    The scheduler sees the pending queue (oldest first). ``reserve`` holds cards for the
    oldest ``limit`` pending pods asking for ``min_cards`` whole cards or more; every other
    pod avoids them (a node where it fits only on reserved cards is not chosen) until it
    has waited ``bypass_minutes`` (None: never). With ``drain`` off, only the reserved cards
    still free are avoided and shares may backfill the reserved cards already broken.
    """

    policy: str = "binpack"
    min_cards: int = 2
    limit: int | None = 1
    bypass_minutes: float | None = 10.0
    drain: bool = True  # keep shares off the reserved cards still busy too, so they empty


    def __call__(self, nodes: dict[str, NodeState], candidates: Sequence[str], request: Request,
                 pending: Sequence[Session] = (), me: Session | None = None, now: float = 0.0) -> Choice | None:
        queue = list(pending)
        reservations = reserve(nodes, [{0: s.request} for s in queue], min_cards=self.min_cards, limit=self.limit)
        holder = queue.index(me) if me is not None and me in queue else None
        bypass = me is not None and self.bypass_minutes is not None and now - me.arrival >= self.bypass_minutes
        pod = {0: request}
        scored = []
        for i, name in enumerate(candidates):
            if not _could_fit(nodes[name], request):
                continue
            held = reserved_cards(reservations, name, holder)
            if not self.drain:  # shares may backfill already-broken reserved cards
                held = frozenset(i for i in held if nodes[name].card(i).is_free)
            score = score_node(nodes[name], pod, self.policy, held)
            if score == 0:
                continue
            placement = place_pod(nodes[name], pod, self.policy, held)
            assert isinstance(placement, PodPlacement)
            if uses_reserved(placement, held) and not bypass:
                continue
            scored.append((score, -i, name, placement))
        if not scored:
            return None
        _, _, name, placement = max(scored, key=lambda s: s[:3])
        return name, placement


def _free_cores(state: NodeState) -> int:
    return sum(c.free_cores for c in state.cards if c.healthy)


def _usage(card: CardState) -> float:
    return card.used_cores / CORES_PER_CARD + card.used_memory_units / card.memory_units


def _whole(state: NodeState, cards: Sequence[int]) -> PodPlacement:
    return PodPlacement({0: tuple((i, CORES_PER_CARD, state.card(i).memory_units) for i in cards)},
                        state.set_cost(cards) if len(cards) > 1 else 0)


def _free_memory(state: NodeState) -> int:
    return sum(c.free_memory_units for c in state.cards if c.healthy)


def gpu_admission(nodes: dict[str, NodeState], candidates: Sequence[str], request: Request) -> Choice | None:
    # nodes sorted by (allocatable cores, allocatable memory, name), the first that fits wins;
    # cards sorted by (allocatable cores, allocatable memory, index): a share takes the first
    # that fits, whole cards the first n with all 100 cores free
    fitting = [n for n in candidates if _could_fit(nodes[n], request)]
    if not fitting:
        return None
    name = min(fitting, key=lambda n: (_free_cores(nodes[n]), _free_memory(nodes[n]), n))
    state = nodes[name]
    order = sorted(state.cards, key=lambda c: (c.free_cores, c.free_memory_units, c.index))
    if request.is_share:
        card = next(c for c in order if c.fits_share(request.cores, request.memory_units))
        return name, PodPlacement({0: ((card.index, request.cores, request.memory_units),)})
    return name, _whole(state, [c.index for c in order if c.is_free][: request.cards])


def hami_default(nodes: dict[str, NodeState], candidates: Sequence[str], request: Request) -> Choice | None:
    fitting = [n for n in candidates if _could_fit(nodes[n], request)]
    if not fitting:
        return None

    def node_usage(state: NodeState) -> float:
        healthy = [c for c in state.cards if c.healthy]
        return sum(_usage(c) for c in healthy) / max(1, len(healthy))

    name = max(fitting, key=lambda n: (node_usage(nodes[n]), -candidates.index(n)))
    state = nodes[name]
    if request.is_share:
        card = min((c for c in state.cards if c.fits_share(request.cores, request.memory_units)),
                   key=lambda c: (_usage(c), c.index))
        return name, PodPlacement({0: ((card.index, request.cores, request.memory_units),)})
    return name, _whole(state, state.free_cards()[: request.cards])


def ours_fragment() -> Scheduler:
    """The fragment policy as the extender runs it: the task mix learned online from the pods seen."""
    learner = MixLearner()

    def choose(nodes: dict[str, NodeState], candidates: Sequence[str], request: Request) -> Choice | None:
        pod = {0: request}
        shape = Shape.of_pod(pod)
        if shape is not None:
            learner.observe(shape)
        view = FragmentView(learner.mix())
        scored = [(score_node(nodes[n], pod, "fragment", view=view), -i, n) for i, n in enumerate(candidates)
                  if _could_fit(nodes[n], request)]
        scored = [s for s in scored if s[0] > 0]
        if not scored:
            return None
        name = max(scored)[2]
        placement = place_pod(nodes[name], pod, "fragment", view=view)
        assert isinstance(placement, PodPlacement)
        return name, placement

    return choose


def ours_fgd_filter() -> Scheduler:
    """fgd-filter as the extender runs it: the typical pods counted online from the pods it
    binds (each once; not the requests its filter is asked about, issue 32), the node of the best
    ``fgd_level`` (the first by name among equals), ``place_pod`` there."""
    learner = MixLearner(FGD_CAPACITY, FGD_DECAY, by="count")
    bound = [0]
    snapshot = [Mix()]  # the extender's rule: a new snapshot at the first 16 pods, then every 16 if drifted

    def choose(nodes: dict[str, NodeState], candidates: Sequence[str], request: Request) -> Choice | None:
        pod = {0: request}
        view = FragmentView(snapshot[0])
        levels = [(level, n) for n in candidates if _could_fit(nodes[n], request)
                  and (level := fgd_level(nodes[n], pod, view)) is not None]
        if not levels:
            return None
        name = min(levels, key=lambda ln: (-ln[0], ln[1]))[1]
        placement = place_pod(nodes[name], pod, "fgd-filter", view=view)
        assert isinstance(placement, PodPlacement)
        shape = Shape.of_pod(pod)
        if shape is not None:  # the simulation admits every choice: bound, so learned now
            learner.observe(replace(shape, memory_units=0))
            bound[0] += 1
            if (bound[0] <= 16 or bound[0] % 16 == 0) and drifted(snapshot[0], learned := learner.mix()):
                snapshot[0] = learned
        return name, placement

    return choose


SCHEDULERS: dict[str, Scheduler] = {
    "jupyter-vgpu binpack": ours("binpack"),
    "jupyter-vgpu spread": ours("spread"),
    "jupyter-vgpu fragment": ours_fragment(),
    "jupyter-vgpu fgd-filter": ours_fgd_filter(),
    "gpu-admission": gpu_admission,
    "HAMi default": hami_default,
    "jupyter-vgpu binpack+reserve": PendingAware(),
}


# --- the simulation -------------------------------------------------------------------------


@dataclass
class Result:
    arrived: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("share", "whole", "multi"), 0))
    admitted: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("share", "whole", "multi"), 0))
    waits: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in ("share", "whole", "multi")})
    multi_costs: list[int] = field(default_factory=list)
    multi_at_optimum: int = 0
    stranded_cores: float = 0.0  # time integral, card-equivalents x minutes
    stranded_gib: float = 0.0
    allocated_cores: float = 0.0
    span: float = 0.0
    seconds: float = 0.0


def optimum_cost(state: NodeState, cards: int) -> int:
    """Brute force over itertools.combinations: the cheapest set of free cards on this node."""
    return min(state.set_cost(c) for c in itertools.combinations(state.free_cards(), cards))


def stranded(nodes: dict[str, NodeState]) -> tuple[float, float]:
    """Free capacity on partly used cards that the smallest share of the mix cannot use.

    Cores in card-equivalents, memory in GiB: a card with 3 free cores (or 1 GiB free) is
    stranded, since every share asks for at least 5 cores and 2 GiB.
    """
    cores = memory = 0.0
    small_cores, small_units = min(SHARE_CORES), min(SHARE_GIB) * GIB
    for state in nodes.values():
        for card in state.cards:
            if not card.healthy or card.is_free:
                continue
            if card.free_cores < small_cores or card.free_memory_units < small_units:
                cores += card.free_cores / CORES_PER_CARD
                memory += card.free_memory_units / GIB
    return cores, memory


def simulate(scheduler: Scheduler, cluster: dict[str, NodeState], trace: Sequence[Session]) -> Result:
    started = time.perf_counter()
    nodes = dict(cluster)
    names = list(nodes)
    result = Result()
    events: list[tuple[float, int, str, int, str, PodPlacement | None]] = []
    for session in trace:
        heapq.heappush(events, (session.arrival, session.id * 3, "arrive", session.id, "", None))
    pending: dict[int, Session] = {}  # in arrival order: oldest first
    last = 0.0
    aware = scheduler if isinstance(scheduler, PendingAware) else None

    def ask(session: Session, candidates: Sequence[str], now: float) -> Choice | None:
        if aware is None:
            return scheduler(nodes, candidates, session.request)
        return aware(nodes, candidates, session.request, list(pending.values()), session, now)

    def admit(session: Session, now: float, name: str, placement: PodPlacement) -> None:
        if session.kind == "multi":
            cost = placement.link_cost
            result.multi_costs.append(cost)
            result.multi_at_optimum += cost == optimum_cost(nodes[name], session.request.cards)
        nodes[name] = nodes[name].apply(placement)
        result.admitted[session.kind] += 1
        result.waits[session.kind].append(now - session.arrival)
        heapq.heappush(events, (now + session.duration, session.id * 3 + 1, "depart", session.id, name, placement))

    while events:
        now, _, what, sid, name, placement = heapq.heappop(events)
        cores, gib = stranded(nodes)
        result.stranded_cores += cores * (now - last)
        result.stranded_gib += gib * (now - last)
        result.allocated_cores += sum(c.used_cores for s in nodes.values() for c in s.cards) / 100 * (now - last)
        last = now
        if what == "arrive":
            session = trace[sid]
            result.arrived[session.kind] += 1
            choice = ask(session, names, now)
            if choice is None:
                pending[sid] = session
                heapq.heappush(events, (now + session.patience, sid * 3 + 2, "give-up", sid, "", None))
                if aware and aware.bypass_minutes is not None:  # kube-scheduler retries unschedulable pods
                    heapq.heappush(events, (now + aware.bypass_minutes, sid * 3 + 2, "retry", sid, "", None))
            else:
                admit(session, now, *choice)
        elif what == "depart":
            assert placement is not None
            nodes[name] = nodes[name].release(placement)
            # only this node gained room: pending requests are retried on it, oldest first
            # (with reservations, every node: a reservation may have moved or gone)
            for waiting_id in list(pending):
                choice = ask(pending[waiting_id], names if aware else [name], now)
                if choice is not None:
                    admit(pending.pop(waiting_id), now, *choice)
        elif what == "retry":
            if sid in pending:
                choice = ask(pending[sid], names, now)
                if choice is not None:
                    admit(pending.pop(sid), now, *choice)
        else:
            pending.pop(sid, None)
            if aware:  # its reservation is gone: the others may fit now
                for waiting_id in list(pending):
                    choice = ask(pending[waiting_id], names, now)
                    if choice is not None:
                        admit(pending.pop(waiting_id), now, *choice)
        for state in nodes.values():  # never over-committed, whatever the scheduler
            assert all(c.used_cores <= 100 and c.used_memory_units <= c.memory_units for c in state.cards)
    result.span = last
    result.seconds = time.perf_counter() - started
    return result


def build_cluster() -> dict[str, NodeState]:
    cluster = {}
    for name, capture, gib in CLUSTER:
        topology: Topology = parse_nvidia_smi_topo(topology_fixture(capture).read_text())
        cards = tuple(CardState(i, gib * GIB) for i in range(topology.count))
        cluster[name] = NodeState(cards, topology)
    return cluster


# --- report ---------------------------------------------------------------------------------


def _p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) >= 2 else (values[0] if values else 0.0)


def report(results: dict[str, Result]) -> str:
    base = results["gpu-admission"]
    total_cards = sum(s.count for s in (parse_nvidia_smi_topo(topology_fixture(c).read_text()) for _, c, _ in CLUSTER))
    head = ["scheduler", "shares", "whole", "multi", "multi vs gpu-adm", "wait mean/p95 min",
            "multi wait mean", "stranded cards", "stranded GiB", "util %", "multi cost", "at optimum", "run s"]
    rows = [head]
    for name, r in results.items():
        waits = [w for k in r.waits for w in r.waits[k]]
        ratio = r.admitted["multi"] / base.admitted["multi"] if base.admitted["multi"] else float("inf")
        rows.append([
            name,
            f"{r.admitted['share']}/{r.arrived['share']}",
            f"{r.admitted['whole']}/{r.arrived['whole']}",
            f"{r.admitted['multi']}/{r.arrived['multi']}",
            f"{ratio:.2f}x",
            f"{statistics.fmean(waits):.1f}/{_p95(waits):.1f}" if waits else "-",
            f"{statistics.fmean(r.waits['multi']):.1f}" if r.waits["multi"] else "-",
            f"{r.stranded_cores / r.span:.2f}",
            f"{r.stranded_gib / r.span:.1f}",
            f"{100 * r.allocated_cores / r.span / total_cards:.1f}",
            f"{statistics.fmean(r.multi_costs):.0f}" if r.multi_costs else "-",
            f"{100 * r.multi_at_optimum / max(1, len(r.multi_costs)):.1f} %",
            f"{r.seconds:.1f}",
        ])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["| " + " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _add(total: Result, r: Result) -> None:
    for kind in total.arrived:
        total.arrived[kind] += r.arrived[kind]
        total.admitted[kind] += r.admitted[kind]
        total.waits[kind] += r.waits[kind]
    total.multi_costs += r.multi_costs
    total.multi_at_optimum += r.multi_at_optimum
    total.stranded_cores += r.stranded_cores
    total.stranded_gib += r.stranded_gib
    total.allocated_cores += r.allocated_cores
    total.span += r.span
    total.seconds += r.seconds


def run(seeds: Sequence[int], sessions: int, rate: float, verbose: bool) -> dict[str, Result]:
    cluster = build_cluster()
    totals: dict[str, Result] = {name: Result() for name in SCHEDULERS}
    for seed in seeds:
        trace = make_trace(seed, sessions, rate)
        results = {name: simulate(scheduler, cluster, trace) for name, scheduler in SCHEDULERS.items()}
        if verbose:
            print(f"seed {seed}:\n{report(results)}\n")
        for name, r in results.items():
            _add(totals[name], r)
    return totals


def reserve_grid(seeds: Sequence[int], sessions: int, rate: float) -> str:
    """The trade-off of reservations: variants of binpack+reserve against gpu-admission, one trace set."""
    variants: dict[str, Scheduler] = {"gpu-admission": gpu_admission, "jupyter-vgpu binpack": ours("binpack")}
    for limit in (1, 2):
        for bypass in (5.0, 10.0, 19.0, None):
            variants[f"reserve limit {limit}, bypass {bypass if bypass is not None else 'never'}"] = \
                PendingAware(limit=limit, bypass_minutes=bypass)
    variants["reserve limit 1, bypass 10.0, no drain"] = PendingAware(drain=False)
    variants["reserve limit 1, bypass 10.0, single cards too"] = PendingAware(min_cards=1)
    cluster = build_cluster()
    totals = {name: Result() for name in variants}
    for seed in seeds:
        trace = make_trace(seed, sessions, rate)
        for name, scheduler in variants.items():
            _add(totals[name], simulate(scheduler, cluster, trace))
    base = totals["gpu-admission"]
    cards = sum(len(s.cards) for s in cluster.values())
    lines = [f"| variant ({rate}/min) | shares | whole | multi | multi vs gpu-adm | shares vs gpu-adm "
             "| share wait mean | util % |", "|---|---|---|---|---|---|---|---|"]
    for name, r in totals.items():
        a = r.admitted
        lines.append(f"| {name} | {a['share']} | {a['whole']} | {a['multi']} "
                     f"| {a['multi'] / max(1, base.admitted['multi']):.2f}x | {a['share'] - base.admitted['share']:+d} "
                     f"| {statistics.fmean(r.waits['share']):.1f} | {100 * r.allocated_cores / r.span / cards:.1f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--sessions", type=int, default=1500, help="sessions per trace")
    parser.add_argument("--rate", type=float, default=0.5, help="arrivals per minute")
    parser.add_argument("--sweep", type=float, nargs="*", default=[0.25, 0.35, 0.5, 0.8],
                        help="also run these arrival rates (all seeds) and print one summary line each")
    parser.add_argument("--reserve-grid", type=float, nargs="*", default=[],
                        help="also print the reservation trade-off (variants of binpack+reserve) at these rates")
    args = parser.parse_args(argv)
    cluster = build_cluster()
    cards = sum(len(s.cards) for s in cluster.values())
    print(f"cluster: {', '.join(f'{n} ({c}, {g} GiB cards)' for n, c, g in CLUSTER)}; {cards} cards")
    print(f"trace: {args.sessions} sessions, {args.rate} arrivals/min, seeds {args.seeds}\n")
    totals = run(args.seeds, args.sessions, args.rate, verbose=True)
    if len(args.seeds) > 1:
        print(f"all seeds together:\n{report(totals)}")
    ours_bp, base = totals["jupyter-vgpu binpack"], totals["gpu-admission"]
    ratio = ours_bp.admitted["multi"] / max(1, base.admitted["multi"])
    optimum = all(t.multi_at_optimum == len(t.multi_costs) for n, t in totals.items() if n.startswith("jupyter"))
    shares_ok = ours_bp.admitted["share"] >= base.admitted["share"]
    ceiling = ours_bp.arrived["multi"] / max(1, base.admitted["multi"])
    print(f"\ntarget: multi-card sets at the optimum 100 %: {'met' if optimum else 'MISSED'}; "
          f"multi-card admitted >= 1.25x gpu-admission: {ratio:.2f}x {'met' if ratio >= 1.25 else 'MISSED'} "
          f"(admitting every multi-card request would be {ceiling:.2f}x); "
          f"shares admitted not fewer: {ours_bp.admitted['share']} vs {base.admitted['share']} "
          f"{'met' if shares_ok else 'MISSED'}")
    held = totals["jupyter-vgpu binpack+reserve"]
    print(f"binpack+reserve: multi-card admitted {held.admitted['multi'] / max(1, base.admitted['multi']):.2f}x "
          f"gpu-admission, shares {held.admitted['share']} vs {base.admitted['share']}, "
          f"whole cards {held.admitted['whole']} vs {base.admitted['whole']}")
    if args.sweep:
        print(f"\nload sweep (seeds {args.seeds} together): multi-card admitted / arrived, shares admitted")
        names = list(SCHEDULERS)
        print("| arrivals/min | " + " | ".join(names) + " | binpack vs gpu-admission (all admitted) | +reserve vs gpu-admission |")
        print("|---" * (len(names) + 3) + "|")
        for rate in args.sweep:
            sweep = run(args.seeds, args.sessions, rate, verbose=False)
            cells = [f"{sweep[n].admitted['multi']}/{sweep[n].arrived['multi']} m, {sweep[n].admitted['share']} s"
                     for n in names]
            adm = max(1, sweep["gpu-admission"].admitted["multi"])
            r = sweep["jupyter-vgpu binpack"].admitted["multi"] / adm
            held_r = sweep["jupyter-vgpu binpack+reserve"].admitted["multi"] / adm
            print(f"| {rate} | " + " | ".join(cells) + f" | {r:.2f}x (ceiling {sweep['gpu-admission'].arrived['multi'] / adm:.2f}x) "
                  f"| {held_r:.2f}x |")
    for rate in args.reserve_grid:
        print(f"\nreservation trade-off at {rate} arrivals/min (seeds {args.seeds} together):")
        print(reserve_grid(args.seeds, args.sessions, rate))
    return 0


if __name__ == "__main__":
    sys.exit(main())
