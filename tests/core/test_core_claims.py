"""core.claims: one reading of what a pod holds, when it has finished, and whether a request fits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_vgpu.core import claims, placement
from jupyter_vgpu.core import contract as c

N = c.DEFAULT_NAMES


def pod(annotations, *containers, node="gpu-1", scheduler=c.SCHEDULER_NAME, phase="Running"):
    spec = {"schedulerName": scheduler, "containers": [
        {"name": name, "resources": {"limits": limits}} for name, limits in containers]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "annotations": annotations},
            "spec": spec, "status": {"phase": phase}}


SHARE = {N.core_resource: "25", N.memory_resource: "16"}


def held(claim):
    assert claim is not None and claim.problem is None and claim.allocation is not None, claim
    return {(k.index, k.name): [(s.index, s.cores, s.memory_units) for s in k.cards]
            for k in claim.allocation.containers}


def record(node, *containers):
    """An allocation record: containers as (index, name, [(card, cores, units)], allocation id)."""
    return c.PodAllocation(node, tuple(
        c.ContainerAllocation(i, name, tuple(c.CardShare(card, f"GPU-{card}", cores, units)
                                             for card, cores, units in shares), allocation_id)
        for i, name, shares, allocation_id in containers)).to_json()


def test_shares_and_whole_cards_are_read_from_keys_and_requests():
    p = pod({N.predicate_gpu_idx(0): "3", N.predicate_gpu_idx(2): "0,1"},
            ("nb", SHARE), ("sidecar", {}), ("train", {N.core_resource: "200"}))
    claim = claims.pod_claim(p, N)
    assert claim is not None and claim.node == "gpu-1" and claim.bound
    assert held(claim) == {(0, "nb"): [(3, 25, 16)], (2, "train"): [(0, 100, 0), (1, 100, 0)]}
    assert claim.from_record == frozenset()


def test_no_keys_and_no_record_is_no_allocation():
    claim = claims.pod_claim(pod({}, ("plain", {})), N)
    assert claim is not None and claim.allocation is None and claim.problem is None
    claim = claims.pod_claim(pod({}, ("nb", SHARE)), N)
    assert claim is not None and claim.allocation is None
    assert "without a card assignment" in (claim.problem or "")


@pytest.mark.parametrize("annotations, limits, message", [
    ({N.predicate_gpu_idx(0): "1,2"}, SHARE, "a share sits on one card"),
    ({N.predicate_gpu_idx(0): "1"}, {N.core_resource: "200"}, "names 1 cards for 2 whole cards"),
    ({N.predicate_gpu_idx(0): "1,1"}, {N.core_resource: "200"}, "names a card twice"),
    ({N.predicate_gpu_idx(0): "1"}, {}, "asks for no vGPU"),
    ({N.predicate_gpu_idx(0): "one"}, {N.core_resource: "100"}, "expected card indices"),
    ({N.predicate_node: "gpu-2", N.predicate_gpu_idx(0): "1"}, SHARE, "names node gpu-2, pod is on gpu-1"),
])
def test_disagreements_name_the_key(annotations, limits, message):
    claim = claims.pod_claim(pod(annotations, ("nb", limits)), N)
    assert claim is not None and claim.allocation is None and message in (claim.problem or "")


def test_the_keys_and_the_requests_win_over_a_record_that_disagrees():
    # the record claims a whole card for a 25-core container: the amounts come from the spec
    forged = record("gpu-1", (0, "nb", [(3, 100, 64)], "id-1"))
    claim = claims.pod_claim(pod({N.predicate_gpu_idx(0): "3", N.allocation: forged}, ("nb", SHARE)), N)
    assert held(claim) == {(0, "nb"): [(3, 25, 16)]}
    assert claim.from_record == frozenset() and "the keys win" in (claim.note or "")
    # the record names other cards than the keys: the keys win, the record's token id is not believed
    moved = record("gpu-1", (0, "nb", [(5, 25, 16)], "id-2"))
    claim = claims.pod_claim(pod({N.predicate_gpu_idx(0): "3", N.allocation: moved}, ("nb", SHARE)), N)
    assert held(claim) == {(0, "nb"): [(3, 25, 16)]}
    assert claim.allocation.containers[0].allocation_id == ""


def test_a_record_that_agrees_adds_uuids_and_the_token_id():
    mine = record("gpu-1", (0, "nb", [(3, 25, 16)], "id-1"), (1, "train", [(0, 100, 160), (1, 100, 160)], ""))
    annotations = {N.predicate_gpu_idx(0): "3", N.predicate_gpu_idx(1): "1,0", N.allocation: mine}
    claim = claims.pod_claim(pod(annotations, ("nb", SHARE), ("train", {N.core_resource: "200"})), N)
    assert held(claim) == {(0, "nb"): [(3, 25, 16)], (1, "train"): [(0, 100, 160), (1, 100, 160)]}
    assert claim.from_record == {0, 1} and claim.note is None
    assert claim.allocation.containers[0].cards[0].uuid == "GPU-3"
    assert claim.allocation.containers[0].allocation_id == "id-1"


def test_a_record_alone_is_read_only_where_it_agrees_with_the_requests():
    good = record("gpu-1", (0, "nb", [(3, 25, 16)], "id-1"))
    assert held(claims.pod_claim(pod({N.allocation: good}, ("nb", SHARE)), N)) == {(0, "nb"): [(3, 25, 16)]}
    greedy = record("gpu-1", (0, "nb", [(3, 100, 64)], "id-1"))
    claim = claims.pod_claim(pod({N.allocation: greedy}, ("nb", SHARE)), N)
    assert claim is not None and claim.allocation is None and "asks for 25 %" in (claim.problem or "")
    elsewhere = record("gpu-9", (0, "nb", [(3, 25, 16)], ""))
    claim = claims.pod_claim(pod({N.allocation: elsewhere}, ("nb", SHARE)), N)
    assert "names node gpu-9, pod is on gpu-1" in (claim.problem or "")
    claim = claims.pod_claim(pod({N.allocation: "{not json"}, ("static", {})), N)
    assert claim is not None and "not JSON" in (claim.problem or "")


def test_unbound_pods_hold_only_when_ours_and_asking_for_a_vgpu():
    annotations = {N.predicate_node: "gpu-1", N.predicate_gpu_idx(0): "2",
                   N.allocation: record("gpu-1", (0, "nb", [(2, 25, 16)], ""))}
    ours = pod(annotations, ("nb", SHARE), node="")
    claim = claims.pod_claim(ours, N, schedulers={c.SCHEDULER_NAME})
    assert claim is not None and not claim.bound and held(claim) == {(0, "nb"): [(2, 25, 16)]}
    assert claims.pod_claim(pod(annotations, ("nb", SHARE), node="", scheduler="default-scheduler"), N,
                            schedulers={c.SCHEDULER_NAME}) is None
    assert claims.pod_claim(pod(annotations, ("nb", {}), node=""), N, schedulers={c.SCHEDULER_NAME}) is None
    assert claims.pod_claim(pod(annotations, ("nb", {N.core_resource: "150"}), node=""), N) is None
    assert claims.pod_claim(pod({}, ("nb", SHARE), node=""), N) is None  # placed nowhere


@pytest.mark.parametrize("phase, finished", [("Succeeded", True), ("Failed", True), ("Running", False),
                                             ("Pending", False), (None, False)])
def test_finished_pods_hold_nothing(phase, finished):
    p = pod({N.predicate_gpu_idx(0): "3"}, ("nb", SHARE), phase=phase)
    assert claims.is_finished(p) is finished
    assert (claims.pod_claim(p, N) is None) is finished


def test_a_whole_card_holds_all_its_memory():
    assert claims.held_memory_units(100, 0, 160) == 160
    assert claims.held_memory_units(100, 7, 160) == 160
    assert claims.held_memory_units(99, 7, 160) == 7
    assert claims.held_memory_units(100, 7, None) == 7  # the card is unknown: what the share says


@settings(max_examples=300, deadline=None)
@given(cards=st.lists(st.tuples(st.sampled_from([64, 96, 160]), st.booleans(),
                                st.integers(0, 100), st.integers(0, 160)), min_size=1, max_size=6),
       request=st.one_of(st.builds(c.Request, st.integers(1, 99), st.integers(1, 200)),
                         st.builds(lambda n, m: c.Request(100 * n, m), st.integers(1, 4),
                                   st.sampled_from([0, 64, 200, 500]))))
def test_the_fast_rule_is_the_placement_policys(cards, request):
    states = tuple(placement.CardState(i, size, healthy, min(used, 100), min(memory, size))
                   for i, (size, healthy, used, memory) in enumerate(cards))
    free = claims.free_cards((s.index, s.memory_units, s.healthy, s.used_cores, s.used_memory_units) for s in states)
    state = placement.NodeState(states)
    placed = isinstance(placement.place_pod(state, {0: request}), placement.PodPlacement)
    assert claims.fits_alone(free, request) == placed
    if not placed:
        assert claims.refusal_alone(free, request)
    healthy = [s.memory_units for s in states if s.healthy]
    assert claims.fits_empty(healthy, request) == placement.could_ever_fit(state, {0: request})


def test_claims_imports_only_the_standard_library_and_core():
    import ast
    import pathlib

    tree = ast.parse(pathlib.Path(claims.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert {m for m in imported if m and not m.startswith("jupyter_vgpu.core")} <= {
        "__future__", "collections.abc", "dataclasses", "typing"}
