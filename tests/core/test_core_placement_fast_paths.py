"""Bind's cheaper placement paths against the code they replaced (hypothesis).

The extender's bind ranks one node's cards per pod; these shortcuts make that cheaper and
must not change a single choice. Each reference below is the earlier code, restated:

- a pod is refused or placed exactly as before (the fit check that no longer ranks the
  cards, and the last container placed without building the state it leaves), for every
  policy, single- and multi-container pods, with and without a learned mix and headroom;
- fgd-filter's card order equals the order from rebuilding the node with the card taken
  (also where a typical pod fits exactly in what a card would have left);
- a node's topology groups are the tree walk's, whatever cards the node has;
- ``CardState.holding`` is ``dataclasses.replace`` with the held amounts added.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from hypothesis import given
from hypothesis import strategies as st
from test_core_fgd_properties import LABELS, with_labels
from test_core_fragment_properties import fragment_cases
from test_core_placement_properties import SETTINGS, states, topologies

from jupyter_vgpu.core import fgd
from jupyter_vgpu.core.contract import Request
from jupyter_vgpu.core.fragment import Mix, Shape
from jupyter_vgpu.core.placement import (
    POLICIES,
    CardState,
    FragmentView,
    NodeState,
    PodPlacement,
    Refusal,
    _candidates,
    _fgd_cpu_after,
    _fgd_free,
    _fgd_share_order,
    _refusal,
    place_pod,
)
from jupyter_vgpu.core.topology import Topology


def _place_reference(state: NodeState, requests: Mapping[int, Request], policy: str,
                     view: FragmentView | None) -> PodPlacement | Refusal:
    """``placement._place`` as it was: the fit check took the first ranked candidate, and every
    container's assignment was applied to the state before the search went on."""
    order = sorted(requests, key=lambda i: (-requests[i].cards, requests[i].is_share,
                                            -requests[i].cores, -requests[i].memory_units, i))
    for index in order:
        if next(_candidates(state, requests[index], policy), None) is None:
            prefix = f"container {index}: " if len(requests) > 1 else ""
            return Refusal(prefix + _refusal(state, requests[index]))
    budget = [20_000]

    def search(position: int, current: NodeState) -> dict[int, tuple[tuple[int, int, int], ...]] | None:
        if position == len(order):
            return {}
        index = order[position]
        for assignment in _candidates(current, requests[index], policy, view):
            budget[0] -= 1
            if budget[0] < 0:
                return None
            rest = search(position + 1, current._with(assignment))
            if rest is not None:
                rest[index] = assignment
                return rest
        return None

    found = search(0, state)
    if found is None:
        asks = "; ".join(f"container {i}: {requests[i].describe()}" for i in sorted(requests))
        return Refusal(f"each container fits on its own but not all together on this node ({asks})")
    containers = {i: found[i] for i in sorted(found)}
    cost = sum(state.set_cost(i for i, _, _ in a) for a in containers.values() if len(a) > 1)
    return PodPlacement(containers, cost)


@SETTINGS
@given(fragment_cases(), LABELS, st.sampled_from(POLICIES), st.booleans())
def test_pods_are_placed_and_refused_as_before(case, labels, policy, learned):
    state, requests, view = case
    state = with_labels(state, labels)
    view = view if learned else FragmentView(cpu_milli=view.cpu_milli, memory_mib=view.memory_mib)
    assert place_pod(state, requests, policy, view=view) == _place_reference(state, requests, policy, view)


def _fgd_order_reference(state: NodeState, fitting: list[CardState], request: Request,
                         view: FragmentView) -> list[CardState]:
    """fgd-filter's card order as it was: the node rebuilt with the card holding the share."""
    mix, cpu = view.mix_for({0: request}), _fgd_cpu_after(state, view)

    def rank(card: CardState) -> tuple[float, int, int, int]:
        free = _fgd_free(c.holding(request.cores, 0) if c.index == card.index else c for c in state.cards)
        return (round(fgd.node_fragment(free, cpu, state.labels, mix), 6), card.free_cores,
                card.free_memory_units, card.index)

    return sorted(fitting, key=rank)


@SETTINGS
@given(fragment_cases(), LABELS, st.integers(1, 99), st.integers(1, 96))
def test_fgd_card_order_is_the_rebuilt_nodes_order(case, labels, cores, memory):
    state, _, view = case
    state = with_labels(state, labels)
    request = Request(cores, memory)
    fitting = [card for card in state.cards if card.fits_share(cores, memory)]
    assert _fgd_share_order(state, fitting, request, view) == _fgd_order_reference(state, fitting, request, view)


def _groups_reference(topology: Topology, present: set[int]) -> tuple[frozenset[int], ...]:
    out = []
    for _, node in topology.tree.walk():
        if node.level not in ("ROOT", "GPU") and len(node.gpus) > 1:
            out.append(frozenset(node.gpus) & present)
    return tuple(out)


@SETTINGS
@given(topologies(), st.data())
def test_topology_groups_are_the_tree_walks(topology, data):
    indices = data.draw(st.sets(st.integers(0, topology.count - 1)))
    state = NodeState(tuple(CardState(i, 40) for i in sorted(indices)), topology)
    assert state.groups == _groups_reference(topology, indices)
    # the same topology, other cards: not the first node's groups
    others = set(range(topology.count)) - indices
    other = NodeState(tuple(CardState(i, 40) for i in sorted(others)), topology)
    assert other.groups == _groups_reference(topology, others)


def _held(card: CardState, cores: int, memory: int) -> CardState:
    return dataclasses.replace(card, used_cores=card.used_cores + cores,
                               used_memory_units=card.used_memory_units + memory)


@SETTINGS
@given(states(), st.integers(0, 100), st.integers(0, 160))
def test_holding_adds_to_the_same_card(state, cores, memory):
    for card in state.cards:
        assert card.holding(cores, memory) == _held(card, cores, memory)


@st.composite
def boundary_cases(draw: st.DrawFn) -> tuple[NodeState, Request, FragmentView]:
    """A share and a typical pod that fits exactly in what one card would have left: the
    fragment after that card turns on one core, so an order computed from a wrong 'after'
    shows."""
    used = draw(st.lists(st.integers(0, 90), min_size=2, max_size=8))
    state = NodeState(tuple(CardState(i, 160, True, u, 0) for i, u in enumerate(used)))
    card = draw(st.sampled_from(state.cards))
    cores = draw(st.integers(1, max(1, card.free_cores - 1)))
    typical = Shape(card.free_cores - cores) if card.free_cores - cores >= 1 else Shape(1)
    other = Shape(draw(st.integers(1, 99)))
    mix = Mix.of([(typical, draw(st.floats(0.5, 2))), (other, draw(st.floats(0.01, 1)))])
    return state, Request(cores, 1), FragmentView(mix)


@SETTINGS
@given(boundary_cases())
def test_fgd_card_order_at_the_typical_pods_boundary(case):
    state, request, view = case
    fitting = [card for card in state.cards if card.fits_share(request.cores, request.memory_units)]
    assert _fgd_share_order(state, fitting, request, view) == _fgd_order_reference(state, fitting, request, view)
