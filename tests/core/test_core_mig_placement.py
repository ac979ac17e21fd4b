"""core.mig_placement against a brute-force oracle (hypothesis), and the rules in examples."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_vgpu.core.contract import Request
from jupyter_vgpu.core.inventory import Card, NodeInventory
from jupyter_vgpu.core.mig import GEOMETRIES, parse_sharing, slices_of
from jupyter_vgpu.core.mig_placement import (
    NodeSlice,
    SlicePlacement,
    SliceRefusal,
    node_slices,
    place_slices,
    score_slices,
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# layouts an admin could make (each fits its card)
LAYOUTS = {
    "A100-SXM4-40GB": [["2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"], ["3g.20gb", "3g.20gb"], ["1g.5gb"] * 7,
                       ["4g.20gb", "2g.10gb", "1g.5gb"], ["7g.40gb"], ["1g.10gb", "1g.10gb", "3g.20gb"]],
    "H100-80GB": [["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"], ["1g.20gb"] * 4, ["4g.40gb", "3g.40gb"]],
    "A30-24GB": [["2g.12gb", "1g.6gb", "1g.6gb"], ["1g.6gb"] * 4, ["4g.24gb"]],
}


def inventory(cards: Sequence[tuple[str, list[str]]]) -> NodeInventory:
    built = []
    for index, (model, layout) in enumerate(cards):
        geometry = GEOMETRIES[model]
        built.append(Card(index, f"GPU-{index}", model, geometry.memory_mib, healthy=False, mig=True,
                          slices=slices_of(geometry, layout, f"GPU-{index}")))
    return NodeInventory("n", tuple(built), None)


@st.composite
def nodes(draw: st.DrawFn) -> tuple[tuple[NodeSlice, ...], frozenset[str]]:
    models = draw(st.lists(st.sampled_from(sorted(LAYOUTS)), min_size=0, max_size=3))
    slices = node_slices(inventory([(m, draw(st.sampled_from(LAYOUTS[m]))) for m in models]))
    held = frozenset(s.uuid for s in slices if draw(st.integers(0, 3)) == 0)
    return slices, held


shares = st.builds(Request, st.integers(1, 99), st.integers(1, 200))


def oracle(slices: Sequence[NodeSlice], held: frozenset[str], requests: Mapping[int, Request]) -> Fraction | None:
    """The smallest total size of any assignment of distinct free fitting slices, by trying them all."""
    free = [s for s in slices if s.uuid not in held and s.slice.placeable]
    order = sorted(requests)
    best = None
    for chosen in itertools.permutations(free, len(order)):
        if all(s.slice.fits(requests[i]) for i, s in zip(order, chosen, strict=True)):
            total = sum((s.size for s in chosen), Fraction(0))
            best = total if best is None or total < best else best
    return best


@SETTINGS
@given(nodes(), st.dictionaries(st.integers(0, 3), shares, min_size=1, max_size=3))
def test_placement_matches_the_oracle(node: tuple[tuple[NodeSlice, ...], frozenset[str]],
                                      requests: dict[int, Request]) -> None:
    slices, held = node
    found = place_slices(slices, held, requests)
    best = oracle(slices, held, requests)
    if best is None:
        assert isinstance(found, SliceRefusal) and found.reason
        return
    assert isinstance(found, SlicePlacement)
    chosen = list(found.containers.values())
    assert len({s.uuid for s in chosen}) == len(chosen) == len(requests)     # never one slice twice
    assert not {s.uuid for s in chosen} & held                               # never a held slice
    assert all(found.containers[i].slice.fits(r) for i, r in requests.items())
    assert found.size == best                                                # the smallest that fits
    assert 1 <= score_slices(found, requests) <= 10


@SETTINGS
@given(nodes(), shares)
def test_one_request_gets_a_smallest_fitting_slice(node: tuple[tuple[NodeSlice, ...], frozenset[str]],
                                                   request: Request) -> None:
    slices, held = node
    found = place_slices(slices, held, {0: request})
    fitting = [s for s in slices if s.uuid not in held and s.slice.fits(request)]
    if not fitting:
        assert isinstance(found, SliceRefusal)
        return
    assert isinstance(found, SlicePlacement)
    got = found.containers[0]
    # no fitting free slice is at most as large in both compute and memory and smaller in one
    assert not any(s.slice.cores <= got.slice.cores and s.slice.memory_mib <= got.slice.memory_mib
                   and (s.slice.cores, s.slice.memory_mib) != (got.slice.cores, got.slice.memory_mib)
                   and s.card_memory_mib == got.card_memory_mib for s in fitting)


def test_a_1g_request_does_not_spend_a_3g_slice_while_a_1g_is_free() -> None:
    slices = node_slices(inventory([("A100-SXM4-40GB", ["3g.20gb", "3g.20gb"]),
                                    ("A100-SXM4-40GB", ["4g.20gb", "2g.10gb", "1g.5gb"])]))
    found = place_slices(slices, frozenset(), {0: Request(10, 16)})
    assert isinstance(found, SlicePlacement)
    assert found.containers[0].describe() == "MIG 1g.5gb on GPU 1"


def test_equal_slices_fill_the_card_with_fewer_free_slices_first() -> None:
    slices = node_slices(inventory([("A100-SXM4-40GB", ["2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"]),
                                    ("A100-SXM4-40GB", ["2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"])]))
    held = frozenset(s.uuid for s in slices if s.card == 1 and s.slice.gpu_instance < 3)
    found = place_slices(slices, held, {0: Request(20, 30)})
    assert isinstance(found, SlicePlacement) and found.containers[0].card == 1


def test_refusals_say_what_is_free() -> None:
    slices = node_slices(inventory([("A100-SXM4-40GB", ["2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"])]))
    refused = place_slices(slices, frozenset(), {0: Request(50, 40)})
    assert isinstance(refused, SliceRefusal)
    assert "largest free one is MIG 2g.10gb on GPU 0" in refused.reason
    assert "no MIG slices" in place_slices((), frozenset(), {0: Request(5, 4)}).reason
    whole = place_slices(slices, frozenset(), {0: Request(100)})
    assert isinstance(whole, SliceRefusal) and "whole cards" in whole.reason


def test_sharing_mode_limits_which_cards_serve() -> None:
    slices = node_slices(inventory([("A100-SXM4-40GB", ["1g.5gb"]), ("A100-SXM4-40GB", ["7g.40gb"])]))
    sharing = parse_sharing("isolated; 0=time-shared")
    found = place_slices(slices, frozenset(), {0: Request(5, 4)},
                         eligible=lambda card: sharing.slices_serve(card, isolated=True))
    assert isinstance(found, SlicePlacement) and found.containers[0].card == 1


def test_score_rewards_a_close_fit() -> None:
    slices = node_slices(inventory([("A100-SXM4-40GB", ["1g.5gb"]), ("A100-SXM4-40GB", ["7g.40gb"])]))
    close = place_slices(slices, frozenset(), {0: Request(14, 20)})
    loose = place_slices(slices, frozenset({slices[0].uuid}), {0: Request(14, 20)})
    assert isinstance(close, SlicePlacement) and isinstance(loose, SlicePlacement)
    assert score_slices(close, {0: Request(14, 20)}) > score_slices(loose, {0: Request(14, 20)})
