"""Placement properties against brute-force oracles (hypothesis).

- a placement never over-commits a card and never returns fewer cards than asked;
- whole-card sets cost exactly the optimum over itertools.combinations;
- a refusal happens only when no valid placement exists, for single- and multi-container pods.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from jupyter_vgpu.core.contract import Request
from jupyter_vgpu.core.placement import CardState, NodeState, PodPlacement, Refusal, place_pod
from jupyter_vgpu.core.topology import TopoGPU, Topology, parse_nvidia_smi_topo
from jupyter_vgpu.data import TOPOLOGY_DIR

CAPTURED = [parse_nvidia_smi_topo(p.read_text()) for p in sorted(TOPOLOGY_DIR.glob("*.txt"))]
LINKS = ["NV12", "NV4", "NV2", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS"]
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def topologies(draw: st.DrawFn, max_cards: int = 8) -> Topology:
    if draw(st.booleans()):
        captured = [t for t in CAPTURED if t.count <= max_cards]
        if captured:
            return draw(st.sampled_from(captured))
    n = draw(st.integers(1, max_cards))
    rows = [["X"] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            rows[a][b] = rows[b][a] = draw(st.sampled_from(LINKS))
    numa = [draw(st.sampled_from([None, 0, 1])) for _ in range(n)]
    return Topology(tuple(TopoGPU(i, numa[i]) for i in range(n)), tuple(tuple(r) for r in rows))


@st.composite
def states(draw: st.DrawFn, max_cards: int = 8) -> NodeState:
    topo = draw(topologies(max_cards))
    cards = []
    for i in range(topo.count):
        memory = draw(st.sampled_from([16, 40, 96, 160]))
        healthy = draw(st.integers(0, 9)) > 0
        kind = draw(st.sampled_from(["free", "free", "whole", "share"]))
        if kind == "whole":
            cards.append(CardState(i, memory, healthy, 100, memory))
        elif kind == "share":
            cores = draw(st.integers(1, 100))
            used_memory = draw(st.integers(1 if cores < 100 else 0, memory))
            cards.append(CardState(i, memory, healthy, cores, used_memory))
        else:
            cards.append(CardState(i, memory, healthy))
    return NodeState(tuple(cards), topo)


def requests_for(n_cards: int) -> st.SearchStrategy[Request]:
    share = st.builds(Request, st.integers(1, 99), st.integers(1, 170))
    whole = st.builds(lambda k, m: Request(100 * k, m), st.integers(1, n_cards + 1),
                      st.sampled_from([0, 0, 0, 30, 200, 400]))
    return st.one_of(share, whole)


# --- oracles ---------------------------------------------------------------------------------


def options(state: NodeState, request: Request) -> Iterator[tuple[tuple[int, int, int], ...]]:
    """Every valid way to place one request on a state, by exhaustive enumeration."""
    if request.is_share:
        for card in state.cards:
            if card.healthy and 100 - card.used_cores >= request.cores and \
                    card.memory_units - card.used_memory_units >= request.memory_units:
                yield ((card.index, request.cores, request.memory_units),)
        return
    free = [c for c in state.cards if c.healthy and c.used_cores == 0 and c.used_memory_units == 0]
    for combo in itertools.combinations(free, request.cards):
        if sum(c.memory_units for c in combo) >= request.memory_units:
            yield tuple((c.index, 100, c.memory_units) for c in combo)


def apply(state: NodeState, assignment: tuple[tuple[int, int, int], ...]) -> NodeState:
    return state.apply(PodPlacement({0: assignment}))


def oracle_fits(state: NodeState, requests: list[Request]) -> bool:
    if not requests:
        return True
    return any(oracle_fits(apply(state, option), requests[1:]) for option in options(state, requests[0]))


def assert_valid(state: NodeState, requests: Mapping[int, Request], placement: PodPlacement) -> None:
    assert set(placement.containers) == set(requests)
    for index, request in requests.items():
        assignment = placement.containers[index]
        assert len(assignment) == request.cards  # never fewer (or more) cards than asked
        assert len({card for card, _, _ in assignment}) == request.cards
        for card, cores, memory in assignment:
            before = state.card(card)
            assert before.healthy
            if request.is_share:
                assert (cores, memory) == (request.cores, request.memory_units)
            else:
                assert before.used_cores == 0 and before.used_memory_units == 0
                assert (cores, memory) == (100, before.memory_units)
        if not request.is_share:
            assert sum(m for _, _, m in assignment) >= request.memory_units
    after = state.apply(placement)
    for card_before, card_after in zip(state.cards, after.cards, strict=True):
        if card_after != card_before:  # only touched cards must be within capacity
            assert card_after.used_cores <= 100
            assert card_after.used_memory_units <= card_after.memory_units


# --- properties ------------------------------------------------------------------------------


@SETTINGS
@given(st.data(), st.sampled_from(["binpack", "spread"]))
def test_single_requests_are_valid_and_refused_only_when_nothing_fits(data: st.DataObject, policy: str) -> None:
    state = data.draw(states())
    request = data.draw(requests_for(len(state.cards)))
    result = place_pod(state, {0: request}, policy)
    if isinstance(result, Refusal):
        assert next(options(state, request), None) is None, result.reason
        assert result.reason
    else:
        assert_valid(state, {0: request}, result)


@SETTINGS
@given(st.data())
def test_whole_card_sets_are_at_the_exact_optimum(data: st.DataObject) -> None:
    state = data.draw(states())
    free = [c.index for c in state.cards if c.is_free]
    assume(len(free) >= 2)
    k = data.draw(st.integers(2, len(free)))
    request = Request(100 * k, data.draw(st.sampled_from([0, 0, 100, 300])))
    result = place_pod(state, {0: request})
    valid = [combo for combo in itertools.combinations(free, k)
             if sum(state.card(i).memory_units for i in combo) >= request.memory_units]
    if not valid:
        assert isinstance(result, Refusal)
        return
    assert isinstance(result, PodPlacement), result
    optimum = min(state.set_cost(combo) for combo in valid)
    chosen = result.cards(0)
    assert state.set_cost(chosen) == optimum == result.link_cost
    # among the optimal sets, none spans fewer NUMA nodes
    fewest_numa = min(len({state.numa(i) for i in combo}) for combo in valid if state.set_cost(combo) == optimum)
    assert len({state.numa(i) for i in chosen}) == fewest_numa


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from(["binpack", "spread"]))
def test_pods_are_refused_only_when_no_combination_fits(data: st.DataObject, policy: str) -> None:
    state = data.draw(states(max_cards=4))
    requests = data.draw(st.lists(requests_for(3), min_size=1, max_size=3))
    pod = dict(enumerate(requests))
    result = place_pod(state, pod, policy)
    if isinstance(result, Refusal):
        assert not oracle_fits(state, requests), result.reason
    else:
        assert_valid(state, pod, result)
        # containers together never over-commit: check the combined state per card
        after = state.apply(result)
        for card in after.cards:
            if card != state.card(card.index):
                assert card.used_cores <= 100 and card.used_memory_units <= card.memory_units


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topologies(), st.lists(st.tuples(st.booleans(), st.integers(0, 10**6)), min_size=1, max_size=40),
       st.sampled_from(["binpack", "spread"]))
def test_churn_never_over_commits(topo: Topology, steps: list[tuple[bool, int]], policy: str) -> None:
    state = NodeState(tuple(CardState(i, 96) for i in range(topo.count)), topo)
    running: list[PodPlacement] = []
    for arrive, seed in steps:
        if arrive or not running:
            cores = seed % 130 + 1
            request = Request(cores, seed % 40 + 1) if cores < 100 else Request(100 * (seed % topo.count + 1))
            result = place_pod(state, {0: request}, policy)
            if isinstance(result, PodPlacement):
                running.append(result)
                state = state.apply(result)
            else:
                assert next(options(state, request), None) is None
        else:
            state = state.release(running.pop(seed % len(running)))
        for card in state.cards:
            assert 0 <= card.used_cores <= 100 and 0 <= card.used_memory_units <= card.memory_units


@st.composite
def block_states(draw: st.DrawFn) -> NodeState:
    """Bigger nodes made of switches/NUMA blocks: many interchangeable cards, many ties."""
    n = draw(st.integers(9, 14))
    block = [draw(st.integers(0, 3)) for _ in range(n)]
    numa = [b // 2 for b in block]
    nvlink = draw(st.booleans())
    rows = [["X"] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            if block[a] == block[b]:
                link = "NV12" if nvlink else "PIX"
            else:
                link = "NODE" if numa[a] == numa[b] else "SYS"
            rows[a][b] = rows[b][a] = link
    if draw(st.booleans()):  # one odd link breaks some of the symmetry
        a, b = draw(st.integers(0, n - 2)), n - 1
        rows[a][b] = rows[b][a] = "PXB"
    topo = Topology(tuple(TopoGPU(i, numa[i]) for i in range(n)), tuple(tuple(r) for r in rows))
    used = draw(st.sets(st.integers(0, n - 1), max_size=n // 2))
    cards = tuple(CardState(i, 160, True, 30 if i in used else 0, 8 if i in used else 0) for i in range(n))
    return NodeState(cards, topo)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(block_states(), st.data())
def test_whole_card_sets_on_bigger_symmetric_nodes_are_at_the_exact_optimum(state: NodeState,
                                                                         data: st.DataObject) -> None:
    free = [c.index for c in state.cards if c.is_free]
    k = data.draw(st.integers(1, len(free)))
    result = place_pod(state, {0: Request(100 * k)})
    assert isinstance(result, PodPlacement), result
    combos = list(itertools.combinations(free, k))
    optimum = min(state.set_cost(c) for c in combos)
    chosen = result.cards(0)
    assert len(chosen) == k and set(chosen) <= set(free)
    assert state.set_cost(chosen) == optimum
    fewest_numa = min(len({state.numa(i) for i in c}) for c in combos if state.set_cost(c) == optimum)
    assert len({state.numa(i) for i in chosen}) == fewest_numa


def _share_candidates_reference(state: NodeState, request: Request, policy: str) -> list:
    """binpack's and spread's card ranking as first written: every card's share area and
    intact groups computed afresh (the code now computes each once per distinct card state)."""
    from jupyter_vgpu.core.placement import CORES_PER_CARD, _intact, _share_area

    cores, memory = request.cores, request.memory_units
    fitting = [card for card in state.cards if card.fits_share(cores, memory)]
    area_before = _share_area(state.cards)
    intact_before = _intact(state, frozenset())

    def rank(card: CardState) -> tuple:
        after = [c.holding(cores, memory) if c.index == card.index else c for c in state.cards]
        stranded = area_before - _share_area(after)
        broken = intact_before - _intact(state, frozenset({card.index})) if card.is_free else 0
        left_cores = (card.free_cores - cores) / CORES_PER_CARD
        left_memory = (card.free_memory_units - memory) / max(1, card.memory_units)
        if policy == "spread":
            return (-min(left_cores, left_memory), -(left_cores + left_memory), stranded, broken, card.index)
        return (card.is_free, broken, stranded, left_cores + left_memory, card.index)

    return [((card.index, cores, memory),) for card in sorted(fitting, key=rank)]


@st.composite
def look_alike_states(draw: st.DrawFn) -> NodeState:
    """Nodes whose cards often share their free cores or free memory (but not always both)."""
    topo = draw(st.one_of(st.none(), topologies()))
    cards = []
    for i in range(topo.count if topo is not None else draw(st.integers(2, 8))):
        memory = draw(st.sampled_from([16, 40, 96]))
        cores = draw(st.sampled_from([0, 10, 30, 60, 90]))
        used = draw(st.integers(1, memory)) if cores else 0
        cards.append(CardState(i, memory, draw(st.integers(0, 9)) > 0, cores, used))
    return NodeState(tuple(cards), topo)


@given(st.one_of(states(), look_alike_states()), st.integers(1, 50), st.integers(1, 16),
       st.sampled_from(["binpack", "spread"]))
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_share_ranking_is_the_reference_ranking(state, cores, memory, policy):
    from jupyter_vgpu.core.placement import _share_candidates

    request = Request(cores=cores, memory_units=memory)
    assert _share_candidates(state, request, policy) == _share_candidates_reference(state, request, policy)
