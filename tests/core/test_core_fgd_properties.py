"""The fgd-filter policy's measure (core.fgd) and placement (hypothesis).

- it never over-commits a card, whatever the learned mix, headroom and labels;
- it never refuses a pod that fits (``fgd_level`` is None exactly when binpack refuses);
- whole-card sets stay at binpack's exact topology optimum;
- the learned mix, by count, stays bounded and weighs shapes by how often they were seen;
- the fragment is between 0 and the node's free compute; FGD's worked cases hold.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_core_fragment_properties import fragment_cases, shapes
from test_core_placement_properties import SETTINGS

from jupyter_vgpu.core import fgd
from jupyter_vgpu.core.contract import CORES_PER_CARD, Request
from jupyter_vgpu.core.fragment import Headroom, Mix, MixLearner, Shape
from jupyter_vgpu.core.placement import (
    CardState,
    FragmentView,
    NodeState,
    PodPlacement,
    Refusal,
    fgd_level,
    place_pod,
    score_node,
)

LABELS = st.frozensets(st.sampled_from(["gpu=T4", "gpu=A10", "zone=a"]), max_size=2)


def with_labels(state: NodeState, labels: frozenset[str]) -> NodeState:
    return NodeState(state.cards, state.topology, state.headroom, labels)


@SETTINGS
@given(fragment_cases(), LABELS)
def test_fgd_never_overcommits_and_refuses_exactly_when_binpack_does(case, labels):
    state, requests, view = case
    state = with_labels(state, labels)
    placed = place_pod(state, requests, "fgd-filter", view=view)
    binpack = place_pod(state, requests, "binpack")
    assert isinstance(placed, PodPlacement) == isinstance(binpack, PodPlacement)
    level = fgd_level(state, requests, view)
    if isinstance(placed, Refusal):
        assert level is None and score_node(state, requests, "fgd-filter", view=view) == 0
        return
    assert level is not None and 0 <= level <= 100
    assert 1 <= score_node(state, requests, "fgd-filter", view=view) <= 10
    after = state.apply(placed)
    for card in after.cards:
        assert card.used_cores <= CORES_PER_CARD and card.used_memory_units <= card.memory_units
    for index, request in requests.items():
        assert len(placed.containers[index]) == request.cards


@SETTINGS
@given(fragment_cases())
def test_fgd_whole_cards_keep_the_topology_optimum(case):
    state, requests, view = case
    whole = {0: Request(CORES_PER_CARD * max(1, requests[0].cards))}
    placed = place_pod(state, whole, "fgd-filter", view=view)
    binpack = place_pod(state, whole, "binpack")
    if isinstance(binpack, PodPlacement):
        assert isinstance(placed, PodPlacement)
        assert placed.containers == binpack.containers and placed.link_cost == binpack.link_cost


@SETTINGS
@given(st.integers(1, 12), st.floats(0.5, 1.0), st.lists(shapes(), max_size=300))
def test_counted_mix_stays_bounded(capacity, decay, seen):
    learner = MixLearner(capacity=capacity, decay=decay, by="count")
    for shape in seen:
        learner.observe(shape)
        assert len(learner) <= capacity
    mix = learner.mix(coverage=1.0)
    assert len(mix.shapes) <= capacity
    if seen:
        assert abs(sum(w for _, w in mix.shapes) - 1) < 1e-9


def test_counting_weighs_by_pods_not_by_gpu():
    """Three 8-card jobs and one 0.25 share: by demand the jobs hold 24/24.25 of the weight,
    by count 3/4 (as FGD's typical pods)."""
    job, share = Shape(CORES_PER_CARD, 0, 8), Shape(25, 0, 1)
    counted, demand = MixLearner(decay=1.0, by="count"), MixLearner(decay=1.0)
    for shape in (job, job, job, share):
        counted.observe(shape)
        demand.observe(shape)
    assert dict(counted.mix(coverage=1.0).shapes) == pytest.approx({job: 0.75, share: 0.25})
    assert dict(demand.mix(coverage=1.0).shapes)[job] == pytest.approx(24 / 24.25)
    with pytest.raises(ValueError):
        MixLearner(by="gpus")


def test_shape_selector_is_checked():
    assert Shape(25, 0, 1, 0, 0, ("a=1", "b=2")).selector == ("a=1", "b=2")
    for bad in (("b=2", "a=1"), ("a=1", "a=1"), ("",)):
        with pytest.raises(ValueError):
            Shape(25, 0, 1, 0, 0, bad)


@SETTINGS
@given(st.lists(st.integers(0, 100), max_size=8), st.one_of(st.none(), st.integers(-1000, 64_000)), LABELS,
       st.lists(st.tuples(shapes(), st.sampled_from([(), ("gpu=T4",)]), st.floats(0.01, 10)), max_size=6),
       st.floats(0, 1))
def test_fragment_is_between_zero_and_free_compute(free, cpu, labels, weighted, blend):
    mix = Mix.of((Shape(s.cores, 0, s.cards, s.cpu_milli, 0, sel), w) for s, sel, w in weighted)
    value = fgd.node_fragment(free, cpu, labels, mix, blend)
    assert -1e-9 <= value <= sum(free) + 1e-9


def test_fgd_worked_cases():
    """FGD's definition on small nodes (cores; 100 per card)."""
    half, whole = Shape(50, 0, 1, 4000), Shape(CORES_PER_CARD, 0, 1, 4000)
    mix = Mix.of([(half, 1.0), (whole, 1.0)])
    # cards 30 and 100 free: the 0.5 share uses only the full card, the whole card too: 30 stranded
    assert fgd.node_fragment([30, 100], None, (), mix) == pytest.approx(30)
    # CPU for one copy: FGD counts the whole fitting capacity (blend 1) ...
    assert fgd.node_fragment([100, 100], 4000, (), mix, blend=1.0) == pytest.approx(0)
    # ... CPU-counted copies (blend 0): one 0.5 share or one card usable of 200 free
    assert fgd.node_fragment([100, 100], 4000, (), mix, blend=0.0) == pytest.approx(0.5 * 150 + 0.5 * 100)
    # no CPU for a copy, or a selector the node lacks: all of it is fragment
    assert fgd.node_fragment([100, 100], 3999, (), mix) == pytest.approx(200)
    picky = Mix.of([(Shape(50, 0, 1, 0, 0, ("gpu=T4",)), 1.0)])
    assert fgd.node_fragment([100], None, {"gpu=A10"}, picky) == 100
    assert fgd.node_fragment([100], None, {"gpu=T4", "zone=a"}, picky) == 0
    assert fgd.fall_score(10, 10) == 50 and fgd.fall_score(100, 0) == 73 and fgd.fall_score(0, 100) == 26


def test_a_share_completes_the_card_that_strands_most():
    """Cards with 50, 30 and 100 cores free, typical pods of 50: a 30-core share fills card 1,
    leaving nothing stranded (the tightest rule would agree here; the fragment decides first)."""
    state = NodeState(tuple(CardState(i, 64, True, used, 0) for i, used in enumerate((50, 70, 0))),
                      None, Headroom(64_000, 10**6))
    view = FragmentView(Mix.of([(Shape(50, 0, 1, 1000), 1.0)]), 1000, 0)
    placed = place_pod(state, {0: Request(30, 4)}, "fgd-filter", view=view)
    assert isinstance(placed, PodPlacement) and placed.containers[0][0][0] == 1
    assert fgd_level(state, {0: Request(30, 4)}, view) == fgd.fall_score(30, 0)


def test_a_snapshot_is_replaced_only_once_the_mix_drifted():
    a, b = Shape(25, 0, 1), Shape(CORES_PER_CARD, 0, 2)
    even = Mix.of([(a, 1.0), (b, 1.0)])
    assert fgd.drifted(Mix(), even) and not fgd.drifted(Mix(), Mix())
    assert not fgd.drifted(even, Mix.of([(a, 0.52), (b, 0.48)]))  # total variation 0.02
    assert fgd.drifted(even, Mix.of([(a, 0.56), (b, 0.44)]))  # 0.06
    assert fgd.drifted(even, Mix.of([(a, 1.0)]))  # a shape gone: 0.5
