"""Placement policies on the captured topologies: choices, refusals, scores."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from jupyter_vgpu.core.contract import CardShare, Request
from jupyter_vgpu.core.inventory import Card, NodeInventory
from jupyter_vgpu.core.placement import (
    CardState,
    NodeState,
    PodPlacement,
    Refusal,
    best_possible_cost,
    could_ever_fit,
    place_pod,
    score_node,
)
from jupyter_vgpu.core.topology import Topology

GIB = 4  # memory units per GiB


def node(topology: Topology, holdings: list[CardShare] | None = None, memory_mib: int = 24576,
         unhealthy: tuple[int, ...] = ()) -> NodeState:
    cards = [Card(i, f"GPU-{i}", "Tesla P40", memory_mib, healthy=i not in unhealthy) for i in range(topology.count)]
    return NodeState.build(NodeInventory("n1", tuple(cards), topology), holdings or [])


def held(index: int, cores: int, memory_units: int = 0) -> CardShare:
    return CardShare(index, f"GPU-{index}", cores, memory_units)


def cards_of(result: PodPlacement | Refusal, container: int = 0) -> tuple[int, ...]:
    assert isinstance(result, PodPlacement), result
    return result.cards(container)


def refusal(result: PodPlacement | Refusal) -> str:
    assert isinstance(result, Refusal), result
    return result.reason


@pytest.fixture
def p40(topology_of: Callable[[str], Topology]) -> Topology:
    return topology_of("p40-7gpu-pix-phb.txt")


# --- whole cards -----------------------------------------------------------------------------


def test_p40_whole_card_sets_follow_the_pcie_switches(p40: Topology) -> None:
    empty = node(p40)
    assert cards_of(place_pod(empty, {0: Request(400)})) == (3, 4, 5, 6)
    assert cards_of(place_pod(empty, {0: Request(300)})) == (0, 1, 2)
    # two cards: both switches offer a PIX pair; take it from the smaller switch so the
    # four-card switch stays whole
    assert cards_of(place_pod(empty, {0: Request(200)})) == (0, 1)
    assert cards_of(place_pod(empty, {0: Request(100)})) == (0,)
    # seven cards: all of them, never fewer
    assert cards_of(place_pod(empty, {0: Request(700)})) == tuple(range(7))


def test_p40_single_card_comes_from_the_already_broken_switch(p40: Topology) -> None:
    state = node(p40, [held(4, 100)])
    # switch {3,4,5,6} is broken already; taking 3 keeps switch {0,1,2} whole
    assert cards_of(place_pod(state, {0: Request(100)})) == (3,)
    # three cards: both switches offer three PIX-joined cards; the broken switch's are taken
    assert cards_of(place_pod(state, {0: Request(300)})) == (3, 5, 6)


def test_a100_pcie_pairs_stay_within_a_numa_node(topology_of: Callable[[str], Topology]) -> None:
    topo = topology_of("a100-pcie-4gpu-2numa.txt")
    assert cards_of(place_pod(node(topo), {0: Request(200)})) == (0, 1)
    assert cards_of(place_pod(node(topo, [held(0, 10, 4)]), {0: Request(200)})) == (2, 3)
    # 0 and 2 taken: what is left is one card per NUMA node, joined by SYS; still two cards
    result = place_pod(node(topo, [held(0, 100), held(2, 100)]), {0: Request(200)})
    assert cards_of(result) == (1, 3)
    assert isinstance(result, PodPlacement) and result.link_cost == topo.set_cost([1, 3])


@pytest.mark.parametrize("fixture", ["dgx-a100.txt", "a100-sxm-4gpu-nv4.txt"])
def test_nvlink_all_to_all_ties_are_broken_by_numa(topology_of: Callable[[str], Topology], fixture: str) -> None:
    topo = topology_of(fixture)
    pair = cards_of(place_pod(node(topo), {0: Request(200)}))
    assert len({topo.numa(i) for i in pair}) == 1
    if topo.count == 8:
        four = cards_of(place_pod(node(topo), {0: Request(400)}))
        assert len({topo.numa(i) for i in four}) == 2


def test_refusals_say_what_is_free(p40: Topology) -> None:
    state = node(p40, [held(i, 100) for i in (0, 2, 3, 4, 6)])
    assert refusal(place_pod(state, {0: Request(400)})) == "only 2 whole cards free (1, 5); asked for 4 whole cards"
    full = node(p40, [held(i, 100) for i in range(7)])
    assert "no whole card free on this node" in refusal(place_pod(full, {0: Request(100)}))
    assert "all 7 healthy cards are fully taken" in refusal(place_pod(full, {0: Request(10, 4)}))
    partly = node(p40, [held(i, 100) for i in range(7) if i != 3] + [held(3, 90, 48)])
    assert refusal(place_pod(partly, {0: Request(30, 12 * GIB)})) == (
        "needs 30 cores and 12 GiB on one card; largest free share is 10 cores / 12 GiB on card 3")
    too_big = refusal(place_pod(node(p40), {0: Request(50, 40 * GIB)}))
    assert too_big == "needs 50 cores and 40 GiB on one card; the largest card on this node has 24 GiB"
    sick = node(p40, [held(i, 100) for i in range(5)], unhealthy=(5,))
    assert refusal(place_pod(sick, {0: Request(200)})) == (
        "only 1 whole card free (6); asked for 2 whole cards; card 5 unhealthy")
    declared = refusal(place_pod(node(p40), {0: Request(200, 200)}))
    assert declared == "asked for 2 whole cards with 50 GiB in total, but the 2 largest free cards have 48 GiB"


def test_unhealthy_cards_are_never_chosen(p40: Topology) -> None:
    state = node(p40, unhealthy=(0, 1, 2, 3))
    assert cards_of(place_pod(state, {0: Request(300)})) == (4, 5, 6)
    assert cards_of(place_pod(state, {0: Request(10, 4)})) in ((4,), (5,), (6,))
    assert isinstance(place_pod(state, {0: Request(400)}), Refusal)


# --- shares ----------------------------------------------------------------------------------


def test_binpack_fills_used_cards_and_keeps_whole_ones(p40: Topology) -> None:
    state = node(p40, [held(5, 50, 40)])
    assert cards_of(place_pod(state, {0: Request(25, 16)})) == (5,)
    # does not fit card 5 any more: a new card is broken, from the broken switch
    assert cards_of(place_pod(state, {0: Request(60, 16)})) in ((3,), (4,), (6,))


def test_binpack_avoids_stranding_memory(p40: Topology) -> None:
    # card 1 has 30 cores with 10 GiB, card 2 30 cores with 2.5 GiB; a 20-core / 2.5 GiB share
    # on card 1 would leave 10 cores with 7.5 GiB and lose every 30-core, >2.5 GiB share size
    state = node(p40, [held(i, 100) for i in (0, 3, 4, 5, 6)] + [held(1, 70, 56), held(2, 70, 86)])
    assert cards_of(place_pod(state, {0: Request(20, 10)})) == (2,)


def test_binpack_measures_stranding_not_just_free_cores(p40: Topology) -> None:
    # card 1: 45 cores and 15 GiB free; card 2: 50 cores and 512 MiB free. Best fit by cores
    # picks card 1 and leaves its 15 GiB with no cores; card 2 loses almost nothing.
    state = node(p40, [held(i, 100) for i in (0, 3, 4, 5, 6)] + [held(1, 55, 36), held(2, 50, 94)])
    assert cards_of(place_pod(state, {0: Request(45, 2)})) == (2,)


def test_spread_picks_the_emptiest_card(p40: Topology) -> None:
    state = node(p40, [held(i, 30, 20) for i in range(7) if i != 4] + [held(4, 10, 8)])
    assert cards_of(place_pod(state, {0: Request(20, 8)}, "spread")) == (4,)
    assert cards_of(place_pod(state, {0: Request(20, 8)}, "binpack")) != (4,)
    with pytest.raises(ValueError, match="unknown placement policy 'random'"):
        place_pod(state, {0: Request(20, 8)}, "random")


# --- pods with several containers ---------------------------------------------------------


def test_containers_are_placed_one_after_another_on_the_same_state(p40: Topology) -> None:
    requests = {0: Request(40, 8), 1: Request(200), 2: Request(40, 8), 3: Request(30, 40)}
    result = place_pod(node(p40), requests)
    assert isinstance(result, PodPlacement)
    assert len(result.cards(1)) == 2
    after = node(p40).apply(result)
    assert all(c.used_cores <= 100 and c.used_memory_units <= c.memory_units for c in after.cards)
    shared = {result.cards(i)[0] for i in (0, 2, 3)}
    assert not shared & set(result.cards(1))
    assert result.link_cost == p40.set_cost(result.cards(1))
    assert node(p40).apply(result).release(result) == node(p40)


def test_pod_refusal_names_the_container(p40: Topology) -> None:
    state = node(p40, [held(i, 100) for i in range(6)])
    reason = refusal(place_pod(state, {0: Request(10, 4), 1: Request(200)}))
    assert reason == "container 1: only 1 whole card free (6); asked for 2 whole cards"
    together = refusal(place_pod(state, {0: Request(60, 4), 1: Request(60, 4)}))
    assert together.startswith("each container fits on its own but not all together on this node")


# --- node state --------------------------------------------------------------------------------


def test_build_counts_whole_cards_as_all_their_memory(p40: Topology) -> None:
    state = node(p40, [held(2, 100), held(3, 25, 10), held(3, 25, 10), held(9, 50, 5)])
    assert state.card(2) == CardState(2, 96, True, 100, 96)
    assert state.card(3).free_cores == 50 and state.card(3).free_memory_units == 76
    # over-committed holdings (a bug elsewhere) never show negative free capacity
    over = node(p40, [held(0, 80, 90), held(0, 80, 90)])
    assert over.card(0).free_cores == 0 and over.card(0).free_memory_units == 0
    assert isinstance(place_pod(over, {0: Request(100)}), PodPlacement)  # but card 0 is not offered
    assert 0 not in cards_of(place_pod(over, {0: Request(600)}))


def test_could_ever_fit(p40: Topology) -> None:
    full = node(p40, [held(i, 100) for i in range(7)])
    assert could_ever_fit(full, {0: Request(400)})
    assert not could_ever_fit(full, {0: Request(800)})
    assert not could_ever_fit(full, {0: Request(10, 100 * GIB)})


# --- scores ------------------------------------------------------------------------------------


def test_scores_prefer_fuller_nodes_for_binpack_and_emptier_for_spread(p40: Topology) -> None:
    empty, busy = node(p40), node(p40, [held(i, 60, 40) for i in range(7)])
    share = {0: Request(20, 8)}
    assert 1 <= score_node(empty, share) < score_node(busy, share) <= 10
    assert score_node(empty, share, "spread") > score_node(busy, share, "spread") >= 1
    assert score_node(node(p40, [held(i, 100) for i in range(7)]), share) == 0


def test_scores_prefer_better_connected_sets(p40: Topology) -> None:
    whole_switch = node(p40, [held(i, 100) for i in (0, 1, 2)])
    split = node(p40, [held(i, 100) for i in (1, 4, 5)])  # free: 0, 2, 3, 6 -- two per switch
    request = {0: Request(400)}
    assert best_possible_cost(split, 4) == p40.set_cost([3, 4, 5, 6])
    assert score_node(whole_switch, request) == 10
    assert score_node(whole_switch, request) > score_node(split, request) > 0


def test_containers_backtrack_when_the_first_choice_blocks_a_later_one() -> None:
    # card 0: a whole 16 GiB card; card 1: 40 GiB with a small tenant. Binpack would put the
    # 60-core share on card 1 (no whole card broken), leaving no room for the 40-core / 22.5 GiB
    # share anywhere; the search puts it on card 0 instead.
    state = NodeState((CardState(0, 64), CardState(1, 160, True, 1, 1)))
    alone = place_pod(state, {0: Request(60, 10)})
    assert cards_of(alone) == (1,)
    both = place_pod(state, {0: Request(60, 10), 1: Request(40, 90)})
    assert isinstance(both, PodPlacement)
    assert both.containers == {0: ((0, 60, 10),), 1: ((1, 40, 90),)}


def test_binpack_score_ranks_not_breaking_a_whole_card_first(p40: Topology) -> None:
    share = {0: Request(20, 8)}
    # nearly empty node, but the share fits beside a tenant on card 0
    roomy = node(p40, [held(0, 50, 20)])
    # nearly full node, but the share would break its last free card
    crowded = node(p40, [held(i, 100) for i in range(6)])
    assert score_node(roomy, share) >= 6 > 5 >= score_node(crowded, share) >= 1
    # whole cards go where the fewest free whole cards are left
    assert score_node(crowded, {0: Request(100)}) > score_node(roomy, {0: Request(100)})
