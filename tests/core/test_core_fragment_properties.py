"""The fragment policy and its online task mix (hypothesis).

- it never over-commits a card, whatever the learned mix and the node's CPU/memory headroom;
- it never refuses a pod that fits (it refuses exactly when binpack does);
- whole-card sets stay at binpack's exact topology optimum;
- the learned mix stays bounded (at most ``capacity`` shapes, weights summing to 1);
- the expected fragment is between 0 and the node's free capacity.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from test_core_placement_properties import SETTINGS, states

from jupyter_vgpu.core.contract import CORES_PER_CARD, Request
from jupyter_vgpu.core.fragment import CardFree, Headroom, Mix, MixLearner, Shape, node_fragment
from jupyter_vgpu.core.placement import (
    CardState,
    FragmentView,
    NodeState,
    PodPlacement,
    Refusal,
    fragment_of,
    place_pod,
    score_node,
)


@st.composite
def shapes(draw: st.DrawFn) -> Shape:
    cpu, memory = draw(st.integers(0, 64_000)), draw(st.integers(0, 256 * 1024))
    if draw(st.booleans()):
        return Shape(CORES_PER_CARD, 0, draw(st.integers(1, 8)), cpu, memory)
    return Shape(draw(st.integers(1, 99)), draw(st.integers(0, 160)), 1, cpu, memory)


@st.composite
def mixes(draw: st.DrawFn) -> Mix:
    return Mix.of(draw(st.lists(st.tuples(shapes(), st.floats(0.01, 10)), max_size=6)))


@st.composite
def fragment_cases(draw: st.DrawFn) -> tuple[NodeState, dict[int, Request], FragmentView]:
    state = draw(states())
    if draw(st.booleans()):
        state = NodeState(state.cards, state.topology,
                          Headroom(draw(st.integers(-4000, 64_000)), draw(st.integers(-4096, 512 * 1024))))
    n = draw(st.integers(1, 3))
    requests = {}
    for i in range(n):
        if draw(st.integers(0, 3)) == 0:
            requests[i] = Request(CORES_PER_CARD * draw(st.integers(1, 4)))
        else:
            requests[i] = Request(draw(st.integers(1, 99)), draw(st.integers(1, 96)))
    view = FragmentView(draw(mixes()), draw(st.integers(0, 16_000)), draw(st.integers(0, 64 * 1024)))
    return state, requests, view


@SETTINGS
@given(fragment_cases())
def test_fragment_never_over_commits(case):
    state, requests, view = case
    result = place_pod(state, requests, "fragment", view=view)
    if isinstance(result, Refusal):
        return
    after = state.apply(result)
    for card in after.cards:
        assert card.used_cores <= CORES_PER_CARD and card.used_memory_units <= card.memory_units
    for index, assignment in result.containers.items():
        for card_index, _, _ in assignment:
            assert state.card(card_index).healthy
        assert len(assignment) == requests[index].cards


@SETTINGS
@given(fragment_cases())
def test_fragment_refuses_only_what_does_not_fit(case):
    state, requests, view = case
    fragment = place_pod(state, requests, "fragment", view=view)
    binpack = place_pod(state, requests, "binpack")
    assert isinstance(fragment, PodPlacement) == isinstance(binpack, PodPlacement)
    score = score_node(state, requests, "fragment", view=view)
    assert (score > 0) == isinstance(binpack, PodPlacement)
    assert 0 <= score <= 10


@SETTINGS
@given(fragment_cases())
def test_whole_cards_stay_at_the_topology_optimum(case):
    state, requests, view = case
    whole = {i: r for i, r in requests.items() if not r.is_share}
    if not whole:
        return
    fragment = place_pod(state, whole, "fragment", view=view)
    binpack = place_pod(state, whole, "binpack")
    if isinstance(binpack, PodPlacement):
        assert isinstance(fragment, PodPlacement)
        assert fragment.containers == binpack.containers and fragment.link_cost == binpack.link_cost


@SETTINGS
@given(st.integers(1, 12), st.floats(0.5, 1.0), st.lists(shapes(), max_size=300))
def test_learned_mix_stays_bounded(capacity, decay, seen):
    learner = MixLearner(capacity=capacity, decay=decay)
    for shape in seen:
        learner.observe(shape)
        assert len(learner) <= capacity
    mix = learner.mix(coverage=1.0)
    assert len(mix.shapes) <= capacity and len(learner.mix().shapes) <= len(mix.shapes)
    if seen:
        assert abs(sum(w for _, w in mix.shapes) - 1) < 1e-9
        assert mix.shapes[0][1] > 0
        assert any(shape == seen[-1] for shape, _ in mix.shapes)  # the newest is always kept


def test_mix_follows_the_workload_as_it_changes():
    learner = MixLearner(capacity=8, decay=0.99)
    old, new = Shape(25, 16), Shape(CORES_PER_CARD, 0, 2)
    for _ in range(500):
        learner.observe(old)
    for _ in range(500):
        learner.observe(new)
    weights = dict(learner.mix().shapes)
    assert weights[new] > 0.99 and weights.get(old, 0.0) < 0.01


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 100), st.integers(0, 160), st.integers(1, 160)), max_size=8),
       st.one_of(st.none(), st.builds(Headroom, st.integers(-100, 10_000), st.integers(-100, 10_000))),
       mixes())
def test_fragment_is_between_zero_and_free_capacity(cards, headroom, mix):
    free = [CardFree(min(c, 100), min(m, cap), cap) for c, m, cap in cards]
    value = node_fragment(free, headroom, mix)
    assert -1e-9 <= value <= sum(card.amount for card in free) + 1e-9


def test_cpu_headroom_strands_a_node():
    """A node with free cards but no CPU left for the typical task: all its free capacity is fragment."""
    state = NodeState(tuple(CardState(i, 64) for i in range(2)), None, Headroom(500, 64 * 1024))
    mix = Mix.of([(Shape(50, 32, 1, 4000, 8192), 1.0)])
    assert fragment_of(state, mix) == 2.0
    roomy = NodeState(state.cards, None, Headroom(64_000, 64 * 1024))
    assert fragment_of(roomy, mix) == 0.0
