"""Reservations for pending whole-card pods: which cards are held back, and who avoids them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_core_placement_properties import SETTINGS, states

from jupyter_vgpu.core.contract import CardShare, Request
from jupyter_vgpu.core.inventory import Card, NodeInventory
from jupyter_vgpu.core.placement import (
    NodeState,
    PodPlacement,
    Refusal,
    Reservation,
    place_pod,
    reserve,
    reserved_cards,
    score_node,
    uses_reserved,
)
from jupyter_vgpu.core.topology import Topology

GIB = 4  # memory units per GiB


def node(topology: Topology, holdings: list[tuple[int, int, int]] | None = None) -> NodeState:
    cards = tuple(Card(i, f"GPU-{i}", "Tesla P40", 24576) for i in range(topology.count))
    shares = [CardShare(i, f"GPU-{i}", cores, units) for i, cores, units in holdings or []]
    return NodeState.build(NodeInventory("n", cards, topology), shares)


def cards_of(result: PodPlacement | Refusal) -> tuple[int, ...]:
    assert isinstance(result, PodPlacement), result
    return result.cards(0)


@pytest.fixture
def p40(topology_of: Callable[[str], Topology]) -> Topology:
    return topology_of("p40-7gpu-pix-phb.txt")


def test_a_share_avoids_reserved_cards_while_another_card_fits(p40: Topology) -> None:
    state = node(p40, [(0, 50, 8 * GIB), (3, 50, 8 * GIB)])
    share = {0: Request(25, 4 * GIB)}
    assert cards_of(place_pod(state, share)) == (0,)  # without reservations: the fullest card
    placed = place_pod(state, share, reserved=frozenset({0, 1, 2}))
    assert cards_of(placed) == (3,)
    assert isinstance(placed, PodPlacement) and not uses_reserved(placed, frozenset({0, 1, 2}))


def test_reserved_cards_are_used_only_when_nothing_else_fits_on_the_node(p40: Topology) -> None:
    state = node(p40, [(i, 100, 24 * GIB) for i in (3, 4, 5, 6)])  # only 0, 1, 2 left
    held = frozenset({0, 1})
    placed = place_pod(state, {0: Request(25, 4 * GIB)}, reserved=held)
    assert cards_of(placed) == (2,)
    after = state.apply(placed) if isinstance(placed, PodPlacement) else state
    placed = place_pod(after, {0: Request(100)}, reserved=held)  # 2 is broken now: only reserved cards fit
    assert cards_of(placed) in ((0,), (1,))
    assert isinstance(placed, PodPlacement) and uses_reserved(placed, held)
    # the score says so: a fit on reserved cards only is the lowest fit there is
    assert score_node(after, {0: Request(100)}, reserved=held) == 1
    assert score_node(after, {0: Request(100)}) > 1
    # a refusal is still a refusal, with the usual reason
    refused = place_pod(after, {0: Request(300)}, reserved=held)
    assert isinstance(refused, Refusal) and "only 2 whole cards free (0, 1)" in refused.reason


def test_whole_cards_avoid_a_reserved_pcie_switch(p40: Topology) -> None:
    state = node(p40)
    assert cards_of(place_pod(state, {0: Request(200)})) == (0, 1)
    assert cards_of(place_pod(state, {0: Request(200)}, reserved=frozenset({0, 1, 2}))) == (3, 4)


def test_reserve_picks_the_node_closest_to_fitting(p40: Topology) -> None:
    nodes = {
        "far": node(p40, [(i, 50, 4 * GIB) for i in range(5)]),          # 2 free cards
        "near": node(p40, [(i, 100, 24 * GIB) for i in range(4)] + [(4, 5, 2 * GIB)]),  # 2 free + one nearly empty
        "full": node(p40, [(i, 100, 24 * GIB) for i in range(7)]),
    }
    [r] = reserve(nodes, [{0: Request(300)}])
    # both have two free cards; "near" needs only a lightly used card to drain
    assert r == Reservation(0, "near", frozenset({4, 5, 6}), busy=1)
    # a pod that fits now reserves the set it would take
    [r] = reserve(nodes, [{0: Request(200)}])
    assert r.busy == 0 and r.node == "far" and r.cards == frozenset({5, 6})


def test_reserve_goes_oldest_first_within_its_limit_and_never_overlaps(p40: Topology) -> None:
    nodes = {"a": node(p40), "b": node(p40, [(0, 100, 24 * GIB)])}
    pending = [{0: Request(25, 4 * GIB)}, {0: Request(100)}, {0: Request(400)}, {0: Request(400)},
               {0: Request(400)}, {0: Request(800)}]
    # shares and single cards (below min_cards) get nothing; the 8-card pod fits nowhere
    [first] = reserve(nodes, pending)
    assert first.holder == 2 and first.cards == frozenset({3, 4, 5, 6})
    every = reserve(nodes, pending, limit=None)
    # the second 4-card pod takes b's switch; the third finds 3 unreserved cards per node: none
    assert [(r.holder, r.node, r.cards) for r in every] == [
        (2, "a", frozenset({3, 4, 5, 6})), (3, "b", frozenset({3, 4, 5, 6}))]
    assert reserved_cards(every, "a") == frozenset({3, 4, 5, 6})
    assert reserved_cards(every, "a", holder=2) == frozenset()
    assert reserved_cards(every, "b", holder=2) == frozenset({3, 4, 5, 6})
    # single whole cards can be covered too
    assert [r.holder for r in reserve(nodes, pending, min_cards=1, limit=2)] == [1, 2]


def test_a_holder_places_on_its_own_reservation(p40: Topology) -> None:
    nodes = {"a": node(p40, [(0, 100, 24 * GIB)])}
    pending = [{0: Request(300)}, {0: Request(200)}]
    res = reserve(nodes, pending, limit=None)
    mine = reserved_cards(res, "a", holder=0)
    assert cards_of(place_pod(nodes["a"], pending[0], reserved=mine)) == tuple(sorted(res[0].cards))


@SETTINGS
@given(state=states(), cores=st.integers(1, 100), units=st.integers(1, 40),
       reserved=st.frozensets(st.integers(0, 7)))
def test_reserved_cards_are_taken_only_when_no_other_placement_exists(
        state: NodeState, cores: int, units: int, reserved: frozenset[int]) -> None:
    request = {0: Request(cores) if cores == 100 else Request(cores, units)}
    plain = place_pod(state, request)
    held = place_pod(state, request, reserved=reserved)
    assert isinstance(plain, PodPlacement) == isinstance(held, PodPlacement)  # never refuses more
    if isinstance(held, PodPlacement) and uses_reserved(held, reserved):
        others = [c for c in state.cards if c.index not in reserved]
        if request[0].is_share:
            assert not any(c.fits_share(cores, units) for c in others)
        else:
            assert not any(c.is_free for c in others)
    assert place_pod(state, request, reserved=frozenset()) == plain


@SETTINGS
@given(a=states(), b=states(), sizes=st.lists(st.integers(1, 8), min_size=1, max_size=5),
       limit=st.sampled_from([1, 2, None]))
def test_reservations_are_disjoint_healthy_and_sized(
        a: NodeState, b: NodeState, sizes: list[int], limit: int | None) -> None:
    nodes = {"a": a, "b": b}
    pending = [{0: Request(100 * n)} for n in sizes]
    found = reserve(nodes, pending, limit=limit)
    if limit is not None:
        assert len(found) <= limit
    assert [r.holder for r in found] == sorted({r.holder for r in found})  # oldest first, once each
    for r in found:
        state = nodes[r.node]
        assert sizes[r.holder] >= 2 and len(r.cards) == sizes[r.holder]
        assert all(state.card(i).healthy for i in r.cards)
        assert r.busy == sum(not state.card(i).is_free for i in r.cards)
        others = reserved_cards(found, r.node, holder=r.holder)
        assert others.isdisjoint(r.cards)
        if r.busy == 0:  # it fits now, on cards nobody else holds
            placed = place_pod(state, pending[r.holder], reserved=others)
            assert isinstance(placed, PodPlacement) and not uses_reserved(placed, others)
    # a pod gets nothing only when, past the earlier reservations, no node has enough healthy cards
    for position, n in enumerate(sizes):
        if n < 2 or position in {r.holder for r in found}:
            continue
        if limit is not None and len([r for r in found if r.holder < position]) >= limit:
            continue
        earlier = [r for r in found if r.holder < position]
        for name, state in nodes.items():
            left = [c for c in state.cards if c.healthy and c.index not in reserved_cards(earlier, name)]
            assert len(left) < n
