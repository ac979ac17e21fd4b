"""The ledger and its inputs: cards from node objects, claims from pod objects (ours and
gpu-admission's), accounting, and the watch keeping it in step with the API."""

from __future__ import annotations

import json

import pytest
from extender_support import GIB_UNITS, NAMES, binding_args, filter_args, node, pod, post
from simkube.waiting import wait_for
from vgpu_plugin.extender.ledger import Holding, Ledger, Unattributed, node_cards, pod_holding
from vgpu_plugin.extender.wire import WireError, decode_binding_args, decode_extender_args

from jupyter_vgpu.core import contract


def test_cards_from_inventory_annotation(topology_fixtures):
    text = (topology_fixtures / "p40-7gpu-pix-phb.txt").read_text()
    cards = node_cards(node("p40", topology_text=text, memory_gib=24, unhealthy=(3,)), NAMES)
    assert cards.source == "inventory" and len(cards.cards) == 7 and cards.topology is not None
    assert [c.healthy for c in cards.cards] == [True, True, True, False, True, True, True]
    assert cards.cards[0].memory_units == 24 * GIB_UNITS


def test_cards_inferred_from_capacity_like_gpu_admission():
    gm = node("gm", count=4, memory_gib=16, annotate=False)  # a gpu-manager node: no annotation
    cards = node_cards(gm, NAMES)
    assert cards.source == "capacity" and [c.index for c in cards.cards] == [0, 1, 2, 3]
    assert {c.memory_units for c in cards.cards} == {16 * GIB_UNITS}
    broken = node("bad", count=2)
    broken["metadata"]["annotations"][NAMES.node_inventory] = "{not json"
    cards = node_cards(broken, NAMES)
    assert cards.source == "capacity" and "malformed" in cards.problem and len(cards.cards) == 2
    none = node_cards({"metadata": {"name": "cpu"}, "status": {"capacity": {"cpu": "4"}}}, NAMES)
    assert none.cards == () and "no vGPU cards" in none.problem


def _bound(obj, node_name, annotations=None, phase="Running"):
    obj = json.loads(json.dumps(obj))
    obj["metadata"]["uid"] = f"uid-{obj['metadata']['name']}"
    obj["metadata"]["annotations"].update(annotations or {})
    obj["spec"]["nodeName"] = node_name
    obj["status"]["phase"] = phase
    return obj


def test_claims_from_gpu_admission_keys():
    share = _bound(pod("share", cores=30, memory_units=8), "gm", {NAMES.predicate_gpu_idx(0): "2"})
    claim = pod_holding(share, NAMES)
    assert isinstance(claim, Holding) and claim.node == "gm"
    assert [(c, s.index, s.cores, s.memory_units) for c, s in claim.shares()] == [(0, 2, 30, 8)]
    whole = _bound(pod("whole", cores=200, memory_units=None), "gm", {NAMES.predicate_gpu_idx(0): "0,3"})
    assert [(s.index, s.cores) for _, s in pod_holding(whole, NAMES).shares()] == [(0, 100), (3, 100)]
    wrong = _bound(pod("wrong", cores=200, memory_units=None), "gm", {NAMES.predicate_gpu_idx(0): "1"})
    assert isinstance(pod_holding(wrong, NAMES), Unattributed)
    garbage = _bound(pod("garbage", cores=30, memory_units=8), "gm", {NAMES.predicate_gpu_idx(0): "one"})
    assert "expected card indices" in pod_holding(garbage, NAMES).reason
    unknown = _bound(pod("unknown", cores=30, memory_units=8), "gm")
    assert "without a card assignment" in pod_holding(unknown, NAMES).reason


def test_terminated_and_unplaced_pods_hold_nothing():
    allocation = contract.PodAllocation("n", (contract.ContainerAllocation(
        0, "notebook", (contract.CardShare(0, "u", 30, 8),)),))
    done = _bound(pod("done"), "n", contract.predicate_annotations(allocation), phase="Succeeded")
    assert pod_holding(done, NAMES) is None
    assert pod_holding(pod("pending"), NAMES) is None
    moved = _bound(pod("moved"), "other", contract.predicate_annotations(allocation))
    assert "names node n, pod is on other" in pod_holding(moved, NAMES).reason


def test_whole_cards_hold_all_memory_and_overcommit_is_reported():
    ledger = Ledger()
    ledger.set_node("n", node_cards(node("n", count=2, memory_gib=16), NAMES))
    ledger.put(Holding("a", "ns", "a", "n", (contract.ContainerAllocation(
        0, "c", (contract.CardShare(0, "", 100, 0),)),)))
    entry = ledger.node("n")
    assert entry.used_memory[0] == 16 * GIB_UNITS
    assert [f.index for f in entry.free] == [0, 1] and entry.free[0].free_cores == 0
    ledger.put(Holding("b", "ns", "b", "n", (contract.ContainerAllocation(
        0, "c", (contract.CardShare(0, "", 10, 1),)),)))
    assert ledger.overcommitted() == [f"n card 0: 110 cores / {16 * GIB_UNITS + 1} memory units held of 100 / "
                                      f"{16 * GIB_UNITS}"]
    generation = entry.generation
    ledger.drop("b")
    assert ledger.overcommitted() == [] and entry.generation > generation


def test_watch_releases_deleted_and_finished_pods_and_learns_gpu_manager_nodes(cluster):
    cluster.add_node(node("gm", count=2, memory_gib=16, annotate=False))
    cluster.start_extender()
    a = cluster.add_pod(pod("a", cores=60, memory_units=4 * GIB_UNITS))
    b = cluster.add_pod(pod("b", cores=60, memory_units=4 * GIB_UNITS))
    assert post(f"{cluster.url}/bind", binding_args(a, "gm"))[1] == {"Error": ""}
    assert post(f"{cluster.url}/bind", binding_args(b, "gm"))[1] == {"Error": ""}
    c = cluster.add_pod(pod("c", cores=60, memory_units=4 * GIB_UNITS))
    status, reply = post(f"{cluster.url}/filter", filter_args(c, ["gm"]))
    assert reply["NodeNames"] == [] and "largest free share is 40 cores" in reply["FailedNodes"]["gm"]
    # a finishes: its card is free again
    done = cluster.read_pod("a")
    done["status"]["phase"] = "Succeeded"
    cluster.core.replace_namespaced_pod_status("a", "default", done)
    wait_for(lambda: post(f"{cluster.url}/filter", filter_args(c, ["gm"]))[1]["NodeNames"] == ["gm"], timeout=20,
             what="a's card released")
    # b is deleted: both cards free
    cluster.core.delete_namespaced_pod("b", "default")
    cluster.wait_ledger(lambda ledger: ledger.claims() == {}, "b released")
    # a pod another scheduler placed with gpu-admission's key only
    other = pod("gm-pod", cores=40, memory_units=2 * GIB_UNITS, annotations={NAMES.predicate_gpu_idx(0): "1"})
    other["spec"]["nodeName"] = "gm"
    created = cluster.add_pod(other)
    cluster.wait_ledger(lambda ledger: ledger.claims() == {
        "gm": {created["metadata"]["uid"]: [(0, 1, 40, 2 * GIB_UNITS)]}}, "gpu-admission claim")


def test_go_style_decoding():
    args = decode_extender_args(json.dumps({
        "pod": {"Metadata": {"Name": "x", "namespace": "ns"}, "SPEC": {"Containers": [
            {"name": "c", "Resources": {"Limits": {NAMES.core_resource: 10}}}]}},
        "NodeNames": ["a"], "nodenames": ["b"],  # the last match wins, as in encoding/json
        "Unknown": 1,
    }).encode())
    assert args.node_names == ["b"]
    assert args.pod["metadata"]["name"] == "x"
    assert args.pod["spec"]["containers"][0]["resources"]["limits"] == {NAMES.core_resource: 10}
    binding = decode_binding_args(b'{"podname":"p","PODNAMESPACE":"ns","PodUid":"u","node":"n"}')
    assert (binding.pod_name, binding.pod_namespace, binding.pod_uid, binding.node) == ("p", "ns", "u", "n")
    with pytest.raises(WireError, match="PodUID must be a string"):
        decode_binding_args(b'{"PodName":"p","PodNamespace":"ns","PodUID":5,"Node":"n"}')


def test_assumptions_the_watch_never_confirms_are_settled_from_the_api(cluster):
    cluster.add_node(node("n", count=1))
    cluster.start_extender()
    view, ledger = cluster.extender.view, cluster.extender.ledger
    share = (contract.ContainerAllocation(0, "c", (contract.CardShare(0, "", 50, 4),)),)
    # a claim for a pod that is gone, and one for a live pod that carries no annotations
    live = cluster.add_pod(pod("live", cores=50, memory_units=4))
    wait_for(lambda: view.pods.get("default", "live"), timeout=20, what="live pod in the cache")
    ledger.put(Holding("gone-uid", "default", "gone", "n", share, assumed=True, assumed_at=0.0))
    ledger.put(Holding(live["metadata"]["uid"], "default", "live", "n", share, assumed=True, assumed_at=0.0))
    fresh = Holding("fresh-uid", "default", "fresh", "n", share, assumed=True, assumed_at=1e12)
    ledger.put(fresh)
    assert view.sweep(now=view.assume_ttl + 1.0) == 2
    assert ledger.claims() == {"n": {"fresh-uid": [(0, 0, 50, 4)]}}  # young assumptions stay


def test_a_slice_held_by_two_pods_is_reported_with_its_node_and_count():
    """What the churn and storm watchers ask the ledger (in-process and across the control plane's pipe)."""
    def holding(uid: str, node_name: str, slice_uuid: str) -> Holding:
        share = contract.CardShare(0, "GPU-0", 25, 4 * GIB_UNITS, mig_device=slice_uuid)
        return Holding(uid, "default", uid, node_name, (contract.ContainerAllocation(0, "nb", (share,)),))

    ledger = Ledger()
    ledger.put(holding("a", "n1", "MIG-1"))
    ledger.put(holding("b", "n1", "MIG-2"))
    ledger.put(holding("c", "n2", "MIG-1"))  # another node's slice of the same name is another slice
    assert ledger.slices_held_more_than_once() == []
    ledger.put(holding("d", "n1", "MIG-1"))
    ledger.put(holding("e", "n1", "MIG-1"))
    assert ledger.slices_held_more_than_once() == [("n1", "MIG-1", 3)]
    ledger.drop("d")
    ledger.drop("e")
    assert ledger.slices_held_more_than_once() == []
