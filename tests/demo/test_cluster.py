"""The simulated cluster end to end: API, scheduler stand-in, extender, kubelet stand-in,
device plugin and metrics, all real, wired by ``vgpu_plugin.demo.cluster``."""

from __future__ import annotations

import json
import urllib.request

import pytest
from vgpu_plugin.demo.cluster import ClusterError, NodeSpec, SimCluster

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import PodAllocation

A100 = NodeSpec("gpu-a", "a100-sxm-4gpu-nv4.txt")
P40 = NodeSpec("gpu-b", "p40-7gpu-pix-phb.txt", model="Tesla P40", memory_mib=24576, labels={"gpu": "p40"})


@pytest.fixture
def cluster(topology_fixtures):
    with SimCluster([A100, P40], fixtures_dir=topology_fixtures, metrics_period=0.2) as running:
        yield running


def allocation(pod: dict) -> PodAllocation:
    return PodAllocation.from_json(pod["metadata"]["annotations"][c.DEFAULT_NAMES.allocation])


def served(cluster: SimCluster, name: str, namespace: str = "default") -> dict:
    """The pod once the device plugin marked it assigned: kubelet's checkpoint confirmed which
    container holds which answer, so the records are true and each container's token works."""
    cluster.wait_for_pod(namespace, name)
    return cluster.wait_for(
        lambda: (pod := cluster.read_pod(namespace, name))["metadata"]["annotations"].get(
            c.DEFAULT_NAMES.gpu_assigned) == "true" and pod, what=f"{name} assigned")


def fetch(url: str, token: str) -> dict:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def test_nodes_come_up_with_devices_and_inventory(cluster):
    nodes = {n.metadata.name: n for n in cluster.core_v1.list_node().items}
    assert set(nodes) == {"gpu-a", "gpu-b"}
    assert nodes["gpu-a"].status.allocatable[c.DEFAULT_NAMES.core_resource] == "400"
    assert nodes["gpu-b"].status.allocatable[c.DEFAULT_NAMES.core_resource] == "700"
    assert nodes["gpu-b"].status.allocatable[c.DEFAULT_NAMES.memory_resource] == str(7 * 24576 // 256)
    assert nodes["gpu-b"].metadata.labels["gpu"] == "p40"
    assert c.DEFAULT_NAMES.node_inventory in nodes["gpu-a"].metadata.annotations


def test_a_notebook_pod_is_scheduled_admitted_and_served_its_metrics(cluster):
    cluster.create_notebook_pod("alice", cores=25, memory="8GiB")
    pod = served(cluster, "alice")
    record = allocation(pod)
    node = cluster.node(pod["spec"]["nodeName"])
    assert record.node == node.name
    share = record.containers[0].cards[0]
    assert (share.cores, share.memory_units) == (25, 32)
    assert record.containers[0].allocation_id, "the record holds the id of the container's token"

    env = node.kubelet.env("default", "alice", "notebook")
    assert env[c.ENV_CORES] == "25" and env[c.ENV_MEMORY_MIB] == "8192"
    assert env[c.ENV_DEVICE_INDICES] == str(share.index)
    assert env[c.ENV_METRICS_URL] == node.metrics_url

    answer = fetch(env[c.ENV_METRICS_URL] + "/api/v1/allocation", env[c.ENV_TOKEN])
    assert (answer["pod"], answer["podUid"], answer["cores"]) == ("alice", pod["metadata"]["uid"], 25)
    assert [card["index"] for card in answer["cards"]] == [share.index]


def test_an_unfit_pod_waits_and_is_scheduled_when_room_frees_up(cluster):
    cluster.create_notebook_pod("big-a", cores=400)   # every card of gpu-a
    cluster.create_notebook_pod("big-b", cores=700)   # every card of gpu-b
    for name in ("big-a", "big-b"):
        cluster.wait_for_pod("default", name)
    cluster.create_notebook_pod("late", cores=50, memory="4GiB")

    def failed_scheduling() -> list:
        events = cluster.core_v1.list_namespaced_event("default", field_selector="involvedObject.name=late").items
        return [e for e in events if e.reason == "FailedScheduling"]

    events = cluster.wait_for(failed_scheduling, what="a FailedScheduling event for the late pod")
    assert "0/2 nodes are available" in events[0].message
    assert cluster.read_pod("default", "late")["status"]["phase"] == "Pending"

    cluster.core_v1.delete_namespaced_pod("big-b", "default", grace_period_seconds=0)
    pod = cluster.wait_for_pod("default", "late")
    assert pod["spec"]["nodeName"] == "gpu-b"


def test_allocations_survive_component_restarts(cluster):
    cluster.create_notebook_pod("first", cores=60, memory="8GiB")
    first = served(cluster, "first")
    node = first["spec"]["nodeName"]

    cluster.restart_daemon(node)
    cluster.restart_kubelet(node)
    cluster.restart_extender()
    cluster.restart_api()

    # The share is still held: a second 60 % share cannot land on the same card.
    cluster.create_notebook_pod("second", cores=60, memory="8GiB")
    second = cluster.wait_for_pod("default", "second")
    placed = {(p["spec"]["nodeName"], allocation(p).containers[0].cards[0].index) for p in (first, second)}
    assert len(placed) == 2
    assert allocation(cluster.read_pod("default", "first")) == allocation(first)


def test_bad_setups_are_refused_with_a_reason(topology_fixtures):
    with pytest.raises(ValueError, match="unique"):
        SimCluster([A100, A100])
    with pytest.raises(FileNotFoundError, match="no-such.txt"):
        SimCluster([NodeSpec("x", "no-such.txt")], fixtures_dir=topology_fixtures).start()
    with pytest.raises(c.RequestError):
        SimCluster([A100]).notebook_pod("p", cores=150)
    assert issubclass(ClusterError, RuntimeError)
