"""core.node_placement: time-shared cards and MIG slices on one node, by the admin's sharing mode;
the mig-slice hand-off keys in the contract and in claims."""

from __future__ import annotations

import pytest

from jupyter_vgpu.core import claims, contract, node_placement
from jupyter_vgpu.core.contract import CardShare, ContainerAllocation, Names, PodAllocation, Request
from jupyter_vgpu.core.inventory import Card, NodeInventory
from jupyter_vgpu.core.mig import GEOMETRIES, parse_sharing, slices_of
from jupyter_vgpu.core.mig_placement import node_slices
from jupyter_vgpu.core.placement import NodeState, PodPlacement, Refusal, place_pod

NAMES = Names()
A100 = GEOMETRIES["A100-SXM4-40GB"]


def fixture_node() -> NodeInventory:
    """GPU 0 in MIG mode with 3 x 2g.10gb + 1 x 1g.5gb, GPUs 1-2 whole."""
    mig = Card(0, "GPU-0", "NVIDIA A100-SXM4-40GB", 40960, healthy=False, mig=True, unavailable="MIG",
               slices=slices_of(A100, {"2g.10gb": 3, "1g.5gb": 1}, "GPU-0"))
    return NodeInventory("n", (mig, Card(1, "GPU-1", "m", 40960), Card(2, "GPU-2", "m", 40960)), None)


def place(requests: dict[int, Request], sharing: str = "", isolated: bool = False, held: frozenset[str] = frozenset(),
          state: NodeState | None = None) -> node_placement.NodePlacement | Refusal:
    inventory = fixture_node()
    return node_placement.place(state or NodeState.build(inventory), node_slices(inventory), held, requests,
                                "binpack", parse_sharing(sharing), isolated)


def test_an_isolated_share_takes_the_smallest_fitting_slice() -> None:
    found = place({0: Request(10, 16)}, isolated=True)
    assert isinstance(found, node_placement.NodePlacement)
    assert found.slices.containers[0].describe() == "MIG 1g.5gb on GPU 0"
    assert not found.cards.containers
    bigger = place({0: Request(25, 40)}, isolated=True)
    assert isinstance(bigger, node_placement.NodePlacement)
    assert bigger.slices.containers[0].slice.profile == "2g.10gb"


def test_without_isolation_the_default_keeps_shares_off_slices_exactly_as_before() -> None:
    inventory = fixture_node()
    state = NodeState.build(inventory)
    found = place({0: Request(10, 16)})
    assert isinstance(found, node_placement.NodePlacement) and not found.slices.containers
    assert found.cards == place_pod(state, {0: Request(10, 16)})
    assert 0 not in found.cards.cards(0)


def test_isolation_refused_where_no_slice_serves_and_whole_cards_never_take_a_mig_card() -> None:
    refused = place({0: Request(10, 16)}, sharing="time-shared", isolated=True)
    assert isinstance(refused, Refusal) and "MIG" in refused.reason
    too_big = place({0: Request(50, 16)}, isolated=True)
    assert isinstance(too_big, Refusal) and "largest free one is MIG 2g.10gb" in too_big.reason
    whole = place({0: Request(300)}, sharing="prefer-mig")
    assert isinstance(whole, Refusal)                # two non-MIG cards only; GPU 0 is never a whole card
    two = place({0: Request(200), 1: Request(10, 8)}, isolated=True)
    assert isinstance(two, node_placement.NodePlacement)
    assert sorted(two.cards.cards(0)) == [1, 2] and two.slices.containers[1].card == 0


def test_preferences_order_the_routes() -> None:
    mig_first = place({0: Request(10, 16)}, sharing="prefer-mig")
    assert isinstance(mig_first, node_placement.NodePlacement) and 0 in mig_first.slices.containers
    time_first = place({0: Request(10, 16)}, sharing="prefer-time-shared")
    assert isinstance(time_first, node_placement.NodePlacement) and 0 in time_first.cards.containers
    # time-shared cards full: prefer-time-shared spills onto a slice, the default does not
    inventory = fixture_node()
    full = NodeState.build(inventory, [CardShare(1, "", 100, 160), CardShare(2, "", 100, 160)])
    spilled = place({0: Request(10, 16)}, sharing="prefer-time-shared", state=full)
    assert isinstance(spilled, node_placement.NodePlacement) and 0 in spilled.slices.containers
    assert isinstance(place({0: Request(10, 16)}, state=full), Refusal)


def test_mig_mode_cards_take_no_time_shared_shares() -> None:
    only = place({0: Request(10, 16)}, sharing="mig")
    assert isinstance(only, node_placement.NodePlacement) and 0 in only.slices.containers
    card_one = place({0: Request(10, 16)}, sharing="prefer-time-shared; 1=mig")
    assert isinstance(card_one, node_placement.NodePlacement) and card_one.cards.cards(0) == (2,)


def test_held_slices_are_never_given_twice() -> None:
    inventory = fixture_node()
    everything = frozenset(s.uuid for s in node_slices(inventory))
    assert isinstance(place({0: Request(10, 16)}, isolated=True, held=everything), Refusal)
    one_left = everything - {node_slices(inventory)[2].uuid}
    found = place({0: Request(10, 16)}, isolated=True, held=one_left)
    assert isinstance(found, node_placement.NodePlacement)
    assert found.slices.containers[0].uuid == node_slices(inventory)[2].uuid


def test_scores() -> None:
    inventory = fixture_node()
    state, slices = NodeState.build(inventory), node_slices(inventory)
    exact = node_placement.score(state, slices, (), {0: Request(14, 20)}, "binpack", parse_sharing(""), True)
    loose = node_placement.score(state, slices, (), {0: Request(2, 4)}, "binpack", parse_sharing(""), True)
    assert exact == 10 and 1 <= loose < exact
    assert node_placement.score(state, slices, (), {0: Request(90, 4)}, "binpack", parse_sharing(""), True) == 0


# --- the hand-off keys ------------------------------------------------------------------------------------

MIG = "MIG-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"


def placed_pod(extra: dict[str, str], cores: int = 10) -> dict:
    allocation = PodAllocation("n", (ContainerAllocation(0, "nb", (CardShare(0, "GPU-0", cores, 16, MIG),)),))
    annotations = {**contract.predicate_annotations(allocation, NAMES), **extra}
    resources = {NAMES.core_resource: str(cores), NAMES.memory_resource: "16"}
    return {"metadata": {"uid": "u", "namespace": "ns", "name": "p", "annotations": annotations},
            "spec": {"nodeName": "n", "containers": [{"name": "nb", "resources": {"limits": resources}}]}}


def test_bind_annotations_carry_the_slice_and_claims_read_it() -> None:
    pod = placed_pod({})
    assert pod["metadata"]["annotations"][NAMES.mig_slice(0)] == MIG
    claim = claims.pod_claim(pod, NAMES)
    assert claim is not None and claim.problem is None and claim.allocation is not None
    assert claim.allocation.containers[0].cards[0].mig_device == MIG
    record = PodAllocation.from_json(pod["metadata"]["annotations"][NAMES.allocation])
    assert record.containers[0].cards[0].mig_device == MIG


def test_the_keys_win_over_the_record() -> None:
    other = "MIG-ffffffff-0000-0000-0000-000000000000"
    claim = claims.pod_claim(placed_pod({NAMES.mig_slice(0): other}), NAMES)
    assert claim is not None and claim.allocation is not None
    assert claim.allocation.containers[0].cards[0].mig_device == other


@pytest.mark.parametrize(("extra", "problem"), [
    ({NAMES.mig_slice(0): "GPU-1234"}, "not a MIG device"),
    ({NAMES.mig_slice_prefix + "x": MIG}, "not a number"),
    ({NAMES.mig_slice(3): "MIG-1"}, "without a card"),
])
def test_malformed_slice_keys_make_the_claim_unreadable(extra: dict[str, str], problem: str) -> None:
    claim = claims.pod_claim(placed_pod(extra), NAMES)
    assert claim is not None and claim.allocation is None and claim.problem is not None and problem in claim.problem


def test_a_slice_key_on_a_whole_card_container_is_refused() -> None:
    pod = placed_pod({}, cores=100)
    pod["metadata"]["annotations"].pop(NAMES.allocation)
    claim = claims.pod_claim(pod, NAMES)
    assert claim is not None and claim.problem is not None and "whole cards" in claim.problem


def test_one_slice_named_for_two_containers_is_refused() -> None:
    with pytest.raises(ValueError, match="several containers"):
        contract.parse_mig_slices({NAMES.mig_slice(0): MIG, NAMES.mig_slice(1): MIG}, NAMES)


def test_placement_is_unchanged_for_plain_nodes() -> None:
    state = NodeState.build([Card(0, "GPU-0", "m", 40960)])
    found = node_placement.place(state, (), (), {0: Request(10, 16)}, "binpack", parse_sharing(""), False)
    assert isinstance(found, node_placement.NodePlacement)
    assert isinstance(found.cards, PodPlacement) and found.cards == place_pod(state, {0: Request(10, 16)})
