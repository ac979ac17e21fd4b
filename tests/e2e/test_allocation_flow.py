"""A pod's whole journey through the real components of the simulated cluster.

pod spec (vcuda-core / vcuda-memory, schedulerName vgpu-scheduler) -> scheduler stand-in ->
extender filter/prioritize/bind over HTTP -> kubelet stand-in -> device plugin Allocate over
gRPC on unix sockets -> container env -> node metrics server (token API, /metrics) ->
delete -> capacity back in the extender's ledger, the device plugin and the kubelet.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from e2e_support import (
    DGX,
    NAMES,
    P40,
    allocation,
    create_pod,
    delete_pod,
    free_cores,
    http,
    inspect_cards,
    inventory,
    pod_body,
)
from prometheus_client.parser import text_string_to_metric_families
from simkube.waiting import wait_for

from jupyter_vgpu.core import contract as c

pytestmark = pytest.mark.slow


@pytest.fixture
def pods(cluster: Any) -> Iterator[list[str]]:
    """Names of the pods a test creates in "default"; deleted afterwards, capacity awaited."""
    before = {node: free_cores(cluster, node) for node in (DGX, P40)}
    names: list[str] = []
    yield names
    for name in names:
        delete_pod(cluster, "default", name)
    for node in (DGX, P40):
        wait_for(lambda node=node: free_cores(cluster, node) == before[node], timeout=30, what=f"{node}'s capacity back")


def _metric(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def _served(cluster: Any, node: str, uid: str) -> dict[int, tuple[int, int]]:
    """What the device plugin gave the pod: card -> (cores, memory units)."""
    served = cluster.node(node).daemon.allocator.served()
    return {share.index: (share.cores, share.memory_units)
            for (pod_uid, _), entry in served.items() if pod_uid == uid for share in entry.allocation.cards}


def _allocation_api(env: dict[str, str]) -> tuple[int, Any]:
    """GET /api/v1/allocation with the pod's token, once the metrics server knows the pod runs."""
    url = env[c.ENV_METRICS_URL] + "/api/v1/allocation"
    answer: tuple[int, Any] = wait_for(lambda: (r := http(url, env[c.ENV_TOKEN]))[0] != 403 and r, timeout=30,
                                       interval=0.1, what="the metrics server to know the pod")
    return answer


def _kubelet_devices(cluster: Any, node: str, uid: str) -> dict[str, tuple[str, ...]]:
    admitted = cluster.node(node).kubelet.admitted(uid)
    assert admitted is not None, "the kubelet stand-in did not admit the pod"
    return admitted.containers[0].devices


def test_share_pod_through_every_component_and_back(cluster: Any, pods: list[str]) -> None:
    node = cluster.node(DGX)
    free_before = free_cores(cluster, DGX)
    create_pod(cluster, pod_body(cluster, "share-a", 25, 16, node=DGX))
    pods.append("share-a")
    pod = cluster.wait_for_pod("default", "share-a")
    uid, annotations = pod["metadata"]["uid"], pod["metadata"]["annotations"]

    # the extender chose the card at bind and the device plugin confirmed it
    record = allocation(pod)
    assert record is not None and record.node == DGX and pod["spec"]["nodeName"] == DGX
    (container,) = record.containers
    (share,) = container.cards
    assert (share.cores, share.memory_units) == (25, 16)
    card = inventory(cluster, DGX).card(share.index)
    assert card is not None and share.uuid == card.uuid
    assert annotations[NAMES.predicate_node] == DGX
    assert annotations[NAMES.predicate_gpu_idx(0)] == str(share.index)
    assert annotations[NAMES.gpu_assigned] == "true"

    # kubelet asked the device plugin over gRPC, one Allocate per resource, and kept the IDs
    calls = {resource: ids for pod_uid, _, resource, ids in node.kubelet.allocate_calls if pod_uid == uid}
    assert {r: len(ids) for r, ids in calls.items()} == {NAMES.core_resource: 25, NAMES.memory_resource: 16}
    assert _kubelet_devices(cluster, DGX, uid) == calls
    assert _served(cluster, DGX, uid) == {share.index: (25, 16)}

    # the container's env is what the notebook side reads
    env = node.kubelet.env("default", "share-a", "notebook")
    assert env is not None
    assert env[c.ENV_NVIDIA_VISIBLE_DEVICES] == card.uuid == env[c.ENV_DEVICE_UUIDS]
    assert (env[c.ENV_CORES], env[c.ENV_MEMORY_MIB]) == ("25", "4096")
    assert env[c.ENV_DEVICE_INDICES] == str(share.index)
    assert (env[c.ENV_NODE], env[c.ENV_POD_NAME], env[c.ENV_POD_NAMESPACE], env[c.ENV_POD_UID]) == (
        DGX, "share-a", "default", uid)
    assert env[c.ENV_CONTAINER] == "notebook" and env[c.ENV_ENFORCEMENT] == "hami-core"
    assert env[c.ENV_METRICS_URL] == node.metrics_url
    assert env[c.ENV_HAMI_SM_LIMIT] == "25" and env[f"{c.ENV_HAMI_MEMORY_LIMIT_PREFIX}0"] == "4096m"

    # the node metrics server reports it to the pod's own token (once its pod cache has seen the
    # pod running), and to nobody without one
    status, body = _allocation_api(env)
    assert status == 200, body
    assert (body["pod"], body["podUid"], body["cores"], body["memoryMib"]) == ("share-a", uid, 25, 4096)
    assert [(x["index"], x["uuid"], x["cores"], x["memoryMib"]) for x in body["cards"]] == [
        (share.index, card.uuid, 25, 4096)]
    assert http(env[c.ENV_METRICS_URL] + "/api/v1/allocation")[0] == 401
    labels = {"node": DGX, "namespace": "default", "pod": "share-a", "container": "notebook",
              "gpu": str(share.index), "uuid": card.uuid}
    assert http(node.scrape_url + "/metrics")[0] == 401  # every tenant's series: Prometheus's token only
    text = wait_for(lambda: (t := http(node.scrape_url + "/metrics", cluster.scrape_token)[1])
                    and _metric(t, c.METRIC_CONTAINER_REQUEST_CORES, **labels) is not None and t,
                    timeout=30, what="the pod's series in /metrics")
    assert _metric(text, c.METRIC_CONTAINER_REQUEST_CORES, **labels) == 25
    assert _metric(text, c.METRIC_CONTAINER_REQUEST_MEMORY, **labels) == 4096 * 2**20

    # the extender's ledger holds it
    entry = inspect_cards(cluster, DGX)[share.index]
    holders = [(h["pod"], h["uid"], h["cores"], h["memoryMib"]) for h in entry["holders"]]
    assert ("share-a", uid, 25, 4096) in holders
    assert entry["cores"]["free"] == free_before[share.index] - 25

    # deleted: every component lets go
    delete_pod(cluster, "default", "share-a")
    wait_for(lambda: free_cores(cluster, DGX) == free_before, timeout=30, what="the extender to free the share")
    wait_for(lambda: not _served(cluster, DGX, uid), timeout=30, what="the device plugin to release the share")
    wait_for(lambda: node.kubelet.admitted(uid) is None, timeout=30, what="the kubelet to forget the pod")
    assert not any(d for d in node.kubelet.in_use(NAMES.core_resource) if d in calls[NAMES.core_resource])
    status, _ = wait_for(lambda: (r := http(env[c.ENV_METRICS_URL] + "/api/v1/allocation", env[c.ENV_TOKEN]))
                         [0] != 200 and r, timeout=30, what="the token to stop working")
    assert status == 403


def test_whole_card_pod(cluster: Any, pods: list[str]) -> None:
    free_before = free_cores(cluster, DGX)
    create_pod(cluster, pod_body(cluster, "whole-a", 100, None, node=DGX))
    pods.append("whole-a")
    pod = cluster.wait_for_pod("default", "whole-a")
    uid = pod["metadata"]["uid"]
    record = allocation(pod)
    assert record is not None
    (share,) = record.containers[0].cards
    card = inventory(cluster, DGX).card(share.index)
    assert card is not None and free_before[share.index] == 100, "a whole card goes to an empty card"
    assert (share.cores, share.memory_units) == (100, card.memory_units)  # the whole card's memory
    devices = _kubelet_devices(cluster, DGX, uid)
    assert {r: len(ids) for r, ids in devices.items()} == {NAMES.core_resource: 100}
    env = cluster.node(DGX).kubelet.env("default", "whole-a", "notebook")
    assert env is not None and env[c.ENV_NVIDIA_VISIBLE_DEVICES] == card.uuid
    assert (env[c.ENV_CORES], env[c.ENV_MEMORY_MIB]) == ("100", str(card.memory_mib))
    status, body = _allocation_api(env)
    assert status == 200 and (body["cores"], body["memoryMib"]) == (100, card.memory_mib), body
    entry = inspect_cards(cluster, DGX)[share.index]
    assert entry["cores"]["free"] == 0 and entry["memoryMib"]["free"] == 0
    assert _served(cluster, DGX, uid) == {share.index: (100, card.memory_units)}


def _multi_card(cluster: Any, pods: list[str], node: str, name: str, cards: int,
                occupy: list[tuple[str, int, int | None]]) -> tuple[tuple[int, ...], set[int], Any]:
    """Occupy some cards, then place a ``cards``-card pod; (its cards, the free set it chose from, topology)."""
    for other, cores, memory in occupy:
        create_pod(cluster, pod_body(cluster, other, cores, memory, node=node))
        pods.append(other)
    for other, _, _ in occupy:
        cluster.wait_for_pod("default", other)
    free = {i for i, card in inspect_cards(cluster, node).items() if card["cores"]["held"] == 0 and card["healthy"]}
    create_pod(cluster, pod_body(cluster, name, 100 * cards, None, node=node))
    pods.append(name)
    pod = cluster.wait_for_pod("default", name)
    record = allocation(pod)
    assert record is not None
    chosen = tuple(share.index for share in record.containers[0].cards)
    assert len(set(chosen)) == cards and set(chosen) <= free, (chosen, free)
    assert all(share.cores == 100 for share in record.containers[0].cards)
    inv = inventory(cluster, node)
    env = cluster.node(node).kubelet.env("default", name, "notebook")
    assert env is not None
    assert env[c.ENV_NVIDIA_VISIBLE_DEVICES].split(",") == [inv.card(i).uuid for i in chosen]
    assert env[c.ENV_DEVICE_INDICES].split(",") == [str(i) for i in chosen]
    status, body = _allocation_api(env)
    assert status == 200 and body["cores"] == 100 * cards and sorted(x["index"] for x in body["cards"]) == sorted(chosen)
    return chosen, free, inv.topology


def test_multi_card_pod_on_the_dgx_gets_a_cheapest_set(cluster: Any, pods: list[str]) -> None:
    from e2e_support import best_set_cost

    chosen, free, topology = _multi_card(cluster, pods, DGX, "multi-4", 4,
                                         [("dgx-busy-1", 100, None), ("dgx-busy-2", 60, 40), ("dgx-busy-3", 100, None)])
    assert len(free) < 8, "the occupying pods must have taken cards"
    assert topology.set_cost(chosen) == best_set_cost(topology, free, 4)


def test_two_card_pod_on_the_p40_box_lands_on_a_pix_pair(cluster: Any, pods: list[str]) -> None:
    from e2e_support import best_set_cost

    chosen, free, topology = _multi_card(cluster, pods, P40, "pair", 2,
                                         [("p40-busy-1", 100, None), ("p40-busy-2", 100, None), ("p40-busy-3", 50, 16)])
    assert len(free) == 4
    a, b = chosen
    assert topology.links[a][b] == "PIX", (chosen, topology.links[a][b])
    assert topology.set_cost(chosen) == best_set_cost(topology, free, 2)
