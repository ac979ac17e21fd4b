"""MIG slices through the extender's real HTTP: isolated pods land on the smallest fitting slice,
time-shared pods never on a MIG card unless the node allows it, slices are never given twice."""

from __future__ import annotations

import json

import pytest
from extender_support import GIB_UNITS, NAMES, binding_args, filter_args, node, pod, post

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.inventory import Card, NodeInventory
from jupyter_vgpu.core.mig import GEOMETRIES, slices_of

ISOLATED = {NAMES.isolation: "mig"}


def mig_node(name: str, sharing: str | None = None) -> dict:
    """GPU 0 in MIG mode with 3 x 2g.10gb + 1 x 1g.5gb, GPU 1 a whole A100-40GB."""
    obj = node(name, count=2, memory_gib=40)
    slices = slices_of(GEOMETRIES["A100-SXM4-40GB"], {"2g.10gb": 3, "1g.5gb": 1}, f"GPU-{name}-0")
    cards = (Card(0, f"GPU-{name}-0", "NVIDIA A100-SXM4-40GB", 40960, minor=0, healthy=False, mig=True,
                  unavailable="MIG mode is enabled", slices=slices),
             Card(1, f"GPU-{name}-1", "NVIDIA A100-SXM4-40GB", 40960, minor=1))
    obj["metadata"]["annotations"][NAMES.node_inventory] = NodeInventory(name, cards, None).to_json()
    if sharing is not None:
        obj["metadata"]["annotations"][NAMES.gpu_sharing] = sharing
    return obj


def slice_profiles(name: str) -> dict[str, str]:
    inventory = NodeInventory.from_json(mig_node(name)["metadata"]["annotations"][NAMES.node_inventory])
    return {s.uuid: s.profile for s in inventory.cards[0].slices}


@pytest.fixture
def mig_cluster(cluster):
    cluster.add_node(mig_node("mig-a"))
    cluster.add_node(node("plain", count=2, memory_gib=40))
    cluster.start_extender()
    return cluster


def bind(cluster, created: dict, node_name: str) -> dict:
    status, result = post(f"{cluster.url}/bind", binding_args(created, node_name))
    assert (status, result) == (200, {"Error": ""})
    return cluster.read_pod(created["metadata"]["name"])["metadata"]["annotations"]


def test_an_isolated_pod_lands_on_the_smallest_fitting_slice(mig_cluster):
    cluster = mig_cluster
    created = cluster.add_pod(pod("iso-1", cores=10, memory_units=4 * GIB_UNITS, annotations=ISOLATED))
    status, result = post(f"{cluster.url}/filter", filter_args(created, ["mig-a", "plain"]))
    assert status == 200 and result["NodeNames"] == ["mig-a"]
    assert result["FailedAndUnresolvableNodes"] == {}  # a node passes: kube-scheduler reads no reason
    status, result = post(f"{cluster.url}/filter", filter_args(created, ["plain"]))
    assert status == 200 and result["NodeNames"] == []
    assert "MIG slices" in result["FailedAndUnresolvableNodes"]["plain"]
    annotations = bind(cluster, created, "mig-a")
    device = annotations[NAMES.mig_slice(0)]
    assert slice_profiles("mig-a")[device] == "1g.5gb"
    assert annotations[NAMES.predicate_gpu_idx(0)] == "0"
    record = contract.PodAllocation.from_json(annotations[NAMES.allocation])
    assert record.containers[0].cards[0].mig_device == device
    # the 1g.5gb is held: the next isolated pod of the same size gets a 2g.10gb
    second = cluster.add_pod(pod("iso-2", cores=10, memory_units=4 * GIB_UNITS, annotations=ISOLATED))
    cluster.wait_ledger(lambda ledger: device in ledger.node("mig-a").held_slices, "slice held")
    assert slice_profiles("mig-a")[bind(cluster, second, "mig-a")[NAMES.mig_slice(0)]] == "2g.10gb"


def test_slices_are_never_given_twice(mig_cluster):
    cluster = mig_cluster
    given = []
    for i in range(4):
        created = cluster.add_pod(pod(f"iso-{i}", cores=10, memory_units=4 * GIB_UNITS, annotations=ISOLATED))
        given.append(bind(cluster, created, "mig-a")[NAMES.mig_slice(0)])
    assert len(set(given)) == 4
    cluster.wait_ledger(lambda ledger: len(ledger.node("mig-a").held_slices) == 4, "four slices held")
    fifth = cluster.add_pod(pod("iso-5", cores=10, memory_units=4 * GIB_UNITS, annotations=ISOLATED))
    status, result = post(f"{cluster.url}/filter", filter_args(fifth, ["mig-a"]))
    assert status == 200 and result["NodeNames"] == []
    assert "no MIG slice" in result["FailedNodes"]["mig-a"]      # not unresolvable: slices free up
    status, result = post(f"{cluster.url}/bind", binding_args(fifth, "mig-a"))
    assert status == 200 and "does not fit" in result["Error"]
    assert NAMES.mig_slice(0) not in cluster.read_pod("iso-5")["metadata"]["annotations"]


def test_a_time_shared_pod_never_takes_a_mig_card_by_default(mig_cluster):
    cluster = mig_cluster
    created = cluster.add_pod(pod("shared", cores=10, memory_units=4 * GIB_UNITS))
    annotations = bind(cluster, created, "mig-a")
    assert annotations[NAMES.predicate_gpu_idx(0)] == "1"
    assert NAMES.mig_slice(0) not in annotations
    # with the whole card taken, a share does not spill onto the slices
    whole = cluster.add_pod(pod("whole", cores=100, memory_units=None))
    other = cluster.add_pod(pod("more", cores=95, memory_units=4 * GIB_UNITS))
    status, result = post(f"{cluster.url}/filter", filter_args(other, ["mig-a"]))
    assert result["NodeNames"] == []
    status, result = post(f"{cluster.url}/filter", filter_args(whole, ["mig-a"]))
    assert result["NodeNames"] == []          # GPU 1 holds a share; GPU 0 is never a whole card


def test_the_admin_lets_time_shared_pods_onto_slices(cluster):
    cluster.add_node(mig_node("mig-b", sharing="prefer-mig"))
    cluster.start_extender()
    created = cluster.add_pod(pod("shared", cores=20, memory_units=8 * GIB_UNITS))
    annotations = bind(cluster, created, "mig-b")
    assert slice_profiles("mig-b")[annotations[NAMES.mig_slice(0)]] == "2g.10gb"


def test_prioritize_prefers_the_closest_slice(cluster):
    cluster.add_node(mig_node("mig-a"))
    cluster.add_node(mig_node("mig-c"))
    cluster.start_extender()
    first = cluster.add_pod(pod("iso-x", cores=10, memory_units=4 * GIB_UNITS, annotations=ISOLATED))
    bind(cluster, first, "mig-c")   # mig-c's 1g.5gb is gone: only 2g.10gb slices are left there
    cluster.wait_ledger(lambda ledger: ledger.node("mig-c").held_slices, "slice held")
    created = cluster.add_pod(pod("iso-y", cores=10, memory_units=4 * GIB_UNITS, annotations=ISOLATED))
    status, result = post(f"{cluster.url}/prioritize", filter_args(created, ["mig-a", "mig-c"]))
    scores = {item["Host"]: item["Score"] for item in result}
    assert scores["mig-a"] > scores["mig-c"] > 0


@pytest.mark.parametrize("value", ["yes", "MIG-0a1b2c3d", ""])
def test_a_bad_isolation_annotation_is_a_clear_refusal(mig_cluster, value):
    created = mig_cluster.add_pod(pod("bad", cores=10, memory_units=4 * GIB_UNITS,
                                      annotations={NAMES.isolation: value}))
    status, result = post(f"{mig_cluster.url}/filter", filter_args(created, ["mig-a", "plain"]))
    assert status == 200 and result["NodeNames"] == []
    assert all(NAMES.isolation in reason for reason in result["FailedAndUnresolvableNodes"].values())


def test_a_malformed_sharing_annotation_falls_back_to_the_default(cluster):
    cluster.add_node(mig_node("mig-d", sharing="everything please"))
    cluster.start_extender()
    created = cluster.add_pod(pod("iso", cores=10, memory_units=4 * GIB_UNITS, annotations=ISOLATED))
    status, result = post(f"{cluster.url}/filter", filter_args(created, ["mig-d"]))
    assert result["NodeNames"] == ["mig-d"]


def test_inspect_shows_each_slice_at_its_real_size_with_its_holder(mig_cluster):
    from extender_support import get

    cluster = mig_cluster
    created = cluster.add_pod(pod("iso", cores=10, memory_units=4 * GIB_UNITS, annotations=ISOLATED))
    device = bind(cluster, created, "mig-a")[NAMES.mig_slice(0)]
    status, raw = get(f"{cluster.extender.base_url}/inspect?node=mig-a")
    assert status == 200
    (entry,) = json.loads(raw)["nodes"]
    assert entry["sharing"] == "isolated"
    card = entry["cards"][0]
    assert card["holders"] == [] and card["cores"]["held"] == 0     # slices do not count as time-shared use
    by_uuid = {s["uuid"]: s for s in card["slices"]}
    held = by_uuid[device]
    assert (held["profile"], held["cores"], held["memoryMib"]) == ("1g.5gb", 14, 5120)
    assert held["holder"]["pod"] == "iso" and held["holder"]["cores"] == 14 and held["holder"]["askedCores"] == 10
    assert held["holder"]["memoryMib"] == 5120 and held["holder"]["askedMemoryMib"] == 4096
    assert all(s["holder"] is None for uuid, s in by_uuid.items() if uuid != device)
    assert "slices" not in entry["cards"][1]
