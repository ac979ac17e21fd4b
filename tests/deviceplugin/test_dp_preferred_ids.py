"""GetPreferredAllocation's choice of IDs, computed card by card, is the first version's choice.

``preferred_ids`` used to sort every ID kubelet named (~2,000 on an 8-card node) by card and
ID, parsing each with a regex, then walk that order twice. It now sorts only the IDs of the
cards the plan names, and the whole pool only when those do not fill the request. The
reference below is that first version, verbatim; over random pools (our IDs on several
cards, foreign IDs, duplicates, must-include IDs, quotas larger or smaller than what is
there, sizes from 0 past the pool) both choose the same IDs in the same order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st
from vgpu_plugin.deviceplugin.allocate import preferred_ids
from vgpu_plugin.deviceplugin.devices import card_of, cards_in, device_id, parse_device_id


def reference_preferred_ids(available: Sequence[str], must_include: Sequence[str], size: int,
                            per_card: Mapping[int, int]) -> list[str]:
    def order(device: str) -> tuple[int, str]:
        card = card_of(device)
        return (card if card is not None else 1 << 30, device)

    chosen = list(dict.fromkeys(must_include))[:size] if size > 0 else []
    pool = sorted(set(available) - set(chosen), key=order)
    taken = cards_in(chosen)
    for device in pool:
        card = card_of(device)
        if len(chosen) >= size:
            break
        if card is not None and card in per_card and taken[card] < per_card[card]:
            chosen.append(device)
            taken[card] += 1
    for device in pool:
        if len(chosen) >= size:
            break
        if device not in chosen:
            chosen.append(device)
    return chosen


DEVICE = st.one_of(
    st.builds(device_id, st.sampled_from(["core", "memory"]), st.integers(0, 11), st.integers(0, 120)),
    st.sampled_from(["nvidia0", "gpu1-core", "gpu2-mem-x", "GPU-1234", ""]),
)


@settings(max_examples=400, deadline=None)
@given(available=st.lists(DEVICE, max_size=120), must_include=st.lists(DEVICE, max_size=6),
       size=st.integers(-1, 130), per_card=st.dictionaries(st.integers(0, 11), st.integers(-2, 60), max_size=5))
def test_the_choice_is_the_first_versions(available, must_include, size, per_card):
    assert preferred_ids(available, must_include, size, per_card) == \
        reference_preferred_ids(available, must_include, size, per_card)


def test_a_full_node_pool_fills_the_planned_cards_first():
    available = [device_id("memory", card, n) for card in range(8) for n in range(160)][::-1]
    chosen = preferred_ids(available, [], 24, {5: 16, 2: 8})
    assert chosen == [device_id("memory", 2, n) for n in range(8)] + [device_id("memory", 5, n) for n in range(16)]
    assert chosen == reference_preferred_ids(available, [], 24, {5: 16, 2: 8})


def test_remembered_parses_are_the_parses():
    expected = {"gpu3-core-07": ("core", 3, 7), "gpu12-mem-0159": ("memory", 12, 159), "gpu-core-1": None,
                "gpu1-mem-x": None, "": None}
    for _ in range(2):  # computed, then remembered
        for text, parsed in expected.items():
            assert parse_device_id(text) == parsed
            assert card_of(text) == (parsed[1] if parsed else None)
