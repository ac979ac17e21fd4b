"""fgd-filter through the real extender over HTTP, with kube-scheduler's exact ExtenderArgs JSON:
the filter passes only the node FGD's measure prefers (first by name among equals), the
typical pods (with their node selectors) are learned from the pods bound, not from every pod
the filter is asked about, and bind puts the share on the card the measure chose."""

from __future__ import annotations

import json

import pytest
from extender_support import GIB_UNITS, NAMES, binding_args, filter_args, node, pod, post
from simkube.waiting import wait_for

from jupyter_vgpu.core.fragment import Shape


@pytest.fixture
def three_nodes(cluster):
    for name in ("gpu-b", "gpu-a", "gpu-c"):
        obj = node(name, count=2, memory_gib=16, cpu="64", memory="256Gi")
        if name == "gpu-c":
            obj["metadata"]["labels"]["gpu"] = "T4"
        cluster.add_node(obj)
    cluster.policy = "fgd-filter"
    cluster.start_extender()
    hosts = cluster.extender.decisions.hosts
    wait_for(lambda: "gpu=T4" in hosts.labels("gpu-c") and hosts.headroom("gpu-a") is not None,
             timeout=20, what="the informer to deliver the nodes' labels and allocatable")
    return cluster


def card_of(cluster, name: str) -> list[str]:
    annotations = cluster.read_pod(name)["metadata"]["annotations"]
    return sorted(k for k in annotations if k.startswith(NAMES.predicate_gpu_idx_prefix))


def test_filter_passes_only_the_best_node_and_bind_fills_the_stranded_card(three_nodes):
    cluster = three_nodes
    # empty nodes score alike: the first by name passes, whatever order kube-scheduler sends
    first = cluster.add_pod(pod("nb-75", cores=75, memory_units=4 * GIB_UNITS))
    status, result = post(f"{cluster.url}/filter", filter_args(first, ["gpu-c", "gpu-b", "gpu-a"]))
    assert status == 200 and result["Error"] == ""
    assert result["NodeNames"] == ["gpu-a"]
    assert not result["FailedNodes"] and not result["FailedAndUnresolvableNodes"]  # left out, not failed
    assert post(f"{cluster.url}/bind", binding_args(first, "gpu-a"))[1] == {"Error": ""}
    cluster.wait_ledger(lambda ledger: ledger.node("gpu-a").used_cores[0] == 75, "the 75-core claim")

    # a 25-core share: on gpu-a it completes the card whose 25 cores no 75-core pod could use
    # (FGD's fragment falls), on an empty node it would leave nothing stranded either way
    second = cluster.add_pod(pod("nb-25", cores=25, memory_units=4 * GIB_UNITS))
    status, result = post(f"{cluster.url}/filter", filter_args(second, ["gpu-c", "gpu-b", "gpu-a"]))
    assert status == 200 and result["NodeNames"] == ["gpu-a"]
    assert post(f"{cluster.url}/bind", binding_args(second, "gpu-a"))[1] == {"Error": ""}
    assert cluster.read_pod("nb-25")["spec"]["nodeName"] == "gpu-a"
    assert card_of(cluster, "nb-25") == card_of(cluster, "nb-75")  # the same card, now full

    # a pod that fits nowhere is refused as by the other policies: no node passes
    huge = cluster.add_pod(pod("nb-big", cores=None, memory_units=None, containers=[(300, 0)]))
    status, result = post(f"{cluster.url}/filter", filter_args(huge, ["gpu-a", "gpu-b", "gpu-c"]))
    assert status == 200 and result["NodeNames"] == []


def test_full_node_mode_returns_one_node_object(three_nodes):
    cluster = three_nodes
    created = cluster.add_pod(pod("nb", cores=10, memory_units=2 * GIB_UNITS))
    nodes = json.loads(cluster.core.list_node(_preload_content=False).data)
    status, result = post(f"{cluster.url}/filter", {"Pod": created, "Nodes": nodes, "NodeNames": None})
    assert status == 200 and result["Error"] == "" and result["NodeNames"] is None
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["gpu-a"]


def test_typical_pods_are_learned_once_each_when_bound_with_their_node_selector(three_nodes):
    cluster = three_nodes
    decisions = cluster.extender.decisions
    picky = pod("nb-t4", cores=50, memory_units=4 * GIB_UNITS)
    picky["spec"]["nodeSelector"] = {"gpu": "T4"}
    created = cluster.add_pod(picky)
    for _ in range(3):  # kube-scheduler retries: a pod asked about is not learned until bound
        status, result = post(f"{cluster.url}/filter", filter_args(created, ["gpu-a", "gpu-b", "gpu-c"]))
        assert status == 200 and len(result["NodeNames"]) == 1
    assert decisions.typical_snapshot.shapes == ()
    for _ in range(2):  # a bind repeated (its answer lost) counts once
        assert post(f"{cluster.url}/bind", binding_args(created, "gpu-c"))[1] == {"Error": ""}
    plain = cluster.add_pod(pod("nb-any", cores=50, memory_units=4 * GIB_UNITS))
    assert post(f"{cluster.url}/filter", filter_args(plain, ["gpu-a"]))[0] == 200
    assert post(f"{cluster.url}/bind", binding_args(plain, "gpu-a"))[1] == {"Error": ""}
    learned = dict(decisions.typical_snapshot.shapes)
    # counted (decayed per pod bound), not weighted by GPU demand
    assert learned == pytest.approx({Shape(50, 0, 1, 1000, 0, ("gpu=T4",)): 0.5, Shape(50, 0, 1, 1000): 0.5},
                                    abs=1e-3)
    for i in range(decisions.typical.capacity + 5):  # as many shapes (CPU requests) as pods
        small = pod(f"nb-x{i}", cores=1, memory_units=1)
        small["spec"]["containers"][0]["resources"]["requests"]["cpu"] = f"{10 + i}m"
        other = cluster.add_pod(small)
        assert post(f"{cluster.url}/bind", binding_args(other, ("gpu-a", "gpu-b")[i % 2]))[1] == {"Error": ""}
    assert len(decisions.typical) <= decisions.typical.capacity


def test_a_namespace_of_pending_pods_that_never_fit_does_not_take_over_the_typical_pods(three_nodes):
    """Issue 32: one namespace's pending pods of one shape, a 10-core share asking 20 GiB of a
    16 GiB card (kube-scheduler's own fit passes them on the node's 32 GiB; no card ever takes
    one), each filtered twice as kube-scheduler retries it, do not become the typical pods. Were
    they learned (as when the filter learned every pod it was asked about), they would be nearly
    all of the mix: every node fits a 10-core share anywhere, every node scores alike, and a
    25-core share would break a fresh card on the first node by name instead of completing the
    card a 75-core notebook left on gpu-b."""
    cluster = three_nodes
    decisions = cluster.extender.decisions
    first = cluster.add_pod(pod("nb-75", cores=75, memory_units=4 * GIB_UNITS))
    assert post(f"{cluster.url}/filter", filter_args(first, ["gpu-b"]))[1]["NodeNames"] == ["gpu-b"]
    assert post(f"{cluster.url}/bind", binding_args(first, "gpu-b"))[1] == {"Error": ""}
    cluster.core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tenant-x"}})
    for i in range(80):
        pending = cluster.add_pod(pod(f"greedy-{i}", cores=10, memory_units=20 * GIB_UNITS, namespace="tenant-x"))
        for _ in range(2):
            status, result = post(f"{cluster.url}/filter", filter_args(pending, ["gpu-a", "gpu-b", "gpu-c"]))
            assert status == 200 and result["NodeNames"] == []
            assert set(result["FailedAndUnresolvableNodes"]) == {"gpu-a", "gpu-b", "gpu-c"}
    assert dict(decisions.typical_snapshot.shapes) == {Shape(75, 0, 1, 1000): 1.0}

    second = cluster.add_pod(pod("nb-25", cores=25, memory_units=4 * GIB_UNITS))
    status, result = post(f"{cluster.url}/filter", filter_args(second, ["gpu-a", "gpu-b", "gpu-c"]))
    assert status == 200 and result["NodeNames"] == ["gpu-b"]
    assert post(f"{cluster.url}/bind", binding_args(second, "gpu-b"))[1] == {"Error": ""}
    assert card_of(cluster, "nb-25") == card_of(cluster, "nb-75")  # the card the 75-core share left


def test_a_node_whose_cpu_is_taken_stops_winning(cluster):
    """Two empty nodes score alike, gpu-a first by name; once a CPU-only pod takes 7 of its 8
    cores, a notebook there would leave no CPU for the next one (its cards stranded), and the
    filter, asked about the same request shape again, passes gpu-b instead."""
    for name in ("gpu-a", "gpu-b"):
        cluster.add_node(node(name, count=2, cpu="8", memory="64Gi"))
    cluster.policy = "fgd-filter"
    cluster.start_extender()
    hosts = cluster.extender.decisions.hosts
    wait_for(lambda: hosts.headroom("gpu-b") is not None, timeout=20, what="the nodes' allocatable")
    first = cluster.add_pod(pod("nb-1", cores=25, memory_units=4 * GIB_UNITS))
    assert post(f"{cluster.url}/filter", filter_args(first, ["gpu-b", "gpu-a"]))[1]["NodeNames"] == ["gpu-a"]
    busy = pod("cpu-job", cores=None, memory_units=None)
    busy["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "7", "memory": "8Gi"}}
    busy["spec"]["nodeName"] = "gpu-a"
    cluster.add_pod(busy)
    wait_for(lambda: hosts.headroom("gpu-a").cpu_milli == 1000, timeout=20, what="the CPU-only pod counted")
    second = cluster.add_pod(pod("nb-2", cores=25, memory_units=4 * GIB_UNITS))
    assert post(f"{cluster.url}/filter", filter_args(second, ["gpu-b", "gpu-a"]))[1]["NodeNames"] == ["gpu-b"]
