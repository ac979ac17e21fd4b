"""Hundreds of concurrent binds on a few nodes never over-commit a card, and an extender
killed and restarted mid-stream rebuilds the same ledger from the API."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest
from extender_support import (
    GIB_UNITS,
    NAMES,
    another_writers_claim,
    bind_as_another_writer,
    binding_args,
    node,
    pod,
    post,
)
from simkube.waiting import wait_for
from vgpu_plugin.extender.ledger import Holding, Ledger, node_cards, pod_holding

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import CORES_PER_CARD

NODES = {"n0": 2, "n1": 2, "n2": 3}   # cards per node, 16 GiB each: room for ~25 of 240 pods
CARD_UNITS = 16 * GIB_UNITS


def api_ledger(cluster) -> Ledger:
    """A ledger built from nothing but what the API holds now."""
    import json

    ledger = Ledger()
    for obj in json.loads(cluster.core.list_node(_preload_content=False).data)["items"]:
        ledger.set_node(obj["metadata"]["name"], node_cards(obj, NAMES))
    for obj in cluster.list_pods():
        claim = pod_holding(obj, NAMES)
        if isinstance(claim, Holding):
            ledger.put(claim)
    return ledger


def api_overcommit(cluster) -> list[str]:
    """Over-committed cards according to the pods' annotations alone (not the extender's memory)."""
    used: dict[tuple[str, int], list[int]] = {}
    for obj in cluster.list_pods():
        annotations = obj["metadata"].get("annotations") or {}
        if NAMES.allocation not in annotations:
            continue
        allocation = contract.PodAllocation.from_json(annotations[NAMES.allocation])
        for container in allocation.containers:
            for share in container.cards:
                slot = used.setdefault((allocation.node, share.index), [0, 0])
                slot[0] += share.cores
                slot[1] += share.memory_units
    return [f"{key}: {value}" for key, value in used.items() if value[0] > CORES_PER_CARD or value[1] > CARD_UNITS]


def random_pods(rng: random.Random, count: int) -> list[dict]:
    pods = []
    for i in range(count):
        kind = rng.random()
        if kind < 0.08:
            pods.append(pod(f"whole-{i}", cores=100 * rng.choice([1, 2]), memory_units=None))
        elif kind < 0.12:
            pods.append(pod(f"multi-{i}", containers=[(rng.randint(5, 40), rng.randint(1, 16)),
                                                       (rng.randint(5, 40), rng.randint(1, 16))]))
        else:
            pods.append(pod(f"share-{i}", cores=rng.randint(5, 60), memory_units=rng.randint(1, 8 * GIB_UNITS)))
    return pods


def start_without_kubelet(cluster) -> None:
    """No kubelet admits the bound pods here: a bind that must wait for one (same vcuda-core
    count, another request, test_bind_rivals.py) is refused after a short wait."""
    cluster.start_extender()
    cluster.extender.decisions.rival_wait = 0.2


RIVAL_REFUSAL = "kubelet has not admitted it"


def settle(cluster) -> None:
    cluster.wait_ledger(lambda ledger: ledger.stats()["assumed"] == 0, "every bind confirmed by the watch")
    wait_for(lambda: cluster.extender.ledger.claims() == api_ledger(cluster).claims(), timeout=20, what="ledger == API")


@pytest.mark.parametrize("seed", [1, 2])
def test_concurrent_binds_never_overcommit(cluster, seed):
    rng = random.Random(seed)
    for name, count in NODES.items():
        cluster.add_node(node(name, count=count, memory_gib=16))
    start_without_kubelet(cluster)
    created = [cluster.add_pod(p) for p in random_pods(rng, 240)]
    # kube-scheduler's view may be stale: binds arrive for nodes where the pod no longer
    # fits, some twice, some for two nodes at once
    calls = [(p, rng.choice(list(NODES))) for p in created]
    calls += [(p, node_name) for p, node_name in rng.sample(calls, 40)]                    # repeats
    calls += [(p, rng.choice([n for n in NODES if n != node_name])) for p, node_name in rng.sample(calls, 40)]
    rng.shuffle(calls)
    with ThreadPoolExecutor(24) as pool:
        replies = list(pool.map(lambda c: post(f"{cluster.url}/bind", binding_args(*c)), calls))
    assert all(status == 200 for status, _ in replies)
    ok = [(p["metadata"]["name"], n) for (p, n), (_, r) in zip(calls, replies, strict=True) if r["Error"] == ""]
    refused = [r["Error"] for _, r in replies if r["Error"]]
    assert ok and refused  # the cards ran out: both outcomes happened
    assert all("does not fit" in e or "already bound" in e or RIVAL_REFUSAL in e
               or "binds are waiting already" in e for e in refused), set(refused)

    settle(cluster)
    assert cluster.extender.ledger.overcommitted() == []
    assert api_overcommit(cluster) == []
    pods = {p["metadata"]["name"]: p for p in cluster.list_pods()}
    for name, node_name in ok:  # every success is bound there, and annotated for it
        assert pods[name]["spec"]["nodeName"] == node_name
        allocation = contract.PodAllocation.from_json(pods[name]["metadata"]["annotations"][NAMES.allocation])
        assert allocation.node == node_name
    for name, obj in pods.items():  # every pod holds at most one allocation, and only if bound
        if not obj["spec"].get("nodeName"):
            assert NAMES.allocation not in (obj["metadata"].get("annotations") or {}), name


BIG = {f"big{i}": 8 for i in range(4)}  # room for about 100 of the 200 pods


def test_restart_mid_stream_rebuilds_the_same_ledger(cluster):
    rng = random.Random(7)
    for name, count in BIG.items():
        cluster.add_node(node(name, count=count, memory_gib=16))
    start_without_kubelet(cluster)
    created = [cluster.add_pod(p) for p in random_pods(rng, 200)]
    first, second, third = created[:70], created[70:140], created[140:]

    answered = []

    def bind_all(batch):
        calls = [(p, rng.choice(list(BIG))) for p in batch]
        url = cluster.url

        def one(call):
            try:
                reply = post(f"{url}/bind", binding_args(*call), timeout=30)
            except OSError as error:  # the extender went away under this request
                reply = (0, {"Error": str(error)})
            answered.append(reply)
            return reply

        with ThreadPoolExecutor(16) as pool:
            return list(pool.map(one, calls))

    bind_all(first)
    settle(cluster)
    before = cluster.extender.ledger.claims()
    assert before
    cluster.stop_extender()
    start_without_kubelet(cluster)
    assert cluster.extender.ledger.claims() == before  # rebuilt from the API alone

    # now kill it while binds are in flight
    with ThreadPoolExecutor(1) as side:
        running = side.submit(bind_all, second)
        answered.clear()
        wait_for(lambda: len(answered) >= 10, timeout=20, what="binds under way")
        cluster.stop_extender()
        outcomes = running.result()
    assert len(outcomes) == len(second)
    start_without_kubelet(cluster)
    wait_for(lambda: cluster.extender.ledger.claims() == api_ledger(cluster).claims(), timeout=20, what="rebuild")
    bound = sum(1 for p in cluster.list_pods() if p["spec"].get("nodeName"))
    bind_all(third)
    settle(cluster)
    assert sum(1 for p in cluster.list_pods() if p["spec"].get("nodeName")) > bound
    assert cluster.extender.ledger.overcommitted() == []
    assert api_overcommit(cluster) == []


def test_a_pod_annotated_but_not_bound_keeps_its_cards_across_a_restart(cluster):
    """A crash between the PATCH and the Binding leaves the pod annotated and pending: the
    claim survives the restart, and the scheduler's retry reuses it instead of allocating again."""
    cluster.add_node(node("n0", count=1, memory_gib=16))
    created = cluster.add_pod(pod("half", cores=60, memory_units=4 * GIB_UNITS))
    claim = another_writers_claim("n0", card=0, cores=60)
    cluster.core.patch_namespaced_pod("half", "default", {"metadata": {"annotations": claim}})
    cluster.start_extender()
    uid = created["metadata"]["uid"]
    assert cluster.extender.ledger.claims() == {"n0": {uid: [(0, 0, 60, 4 * GIB_UNITS)]}}
    other = cluster.add_pod(pod("other", cores=60, memory_units=4 * GIB_UNITS))
    status, reply = post(f"{cluster.url}/bind", binding_args(other, "n0"))
    assert "does not fit" in reply["Error"]   # the half-done bind still holds the card
    status, reply = post(f"{cluster.url}/bind", binding_args(created, "n0"))
    assert reply == {"Error": ""}
    done = cluster.read_pod("half")
    assert done["spec"]["nodeName"] == "n0"
    assert done["metadata"]["annotations"][NAMES.allocation] == claim[NAMES.allocation]
    assert cluster.extender.ledger.claims() == {"n0": {uid: [(0, 0, 60, 4 * GIB_UNITS)]}}


def test_api_server_restart_loses_nothing(cluster):
    for name, count in NODES.items():
        cluster.add_node(node(name, count=count, memory_gib=16))
    cluster.start_extender()
    first = cluster.add_pod(pod("first", cores=40, memory_units=4 * GIB_UNITS))
    second = cluster.add_pod(pod("second", cores=40, memory_units=4 * GIB_UNITS))
    assert post(f"{cluster.url}/bind", binding_args(first, "n0"))[1] == {"Error": ""}
    settle(cluster)
    claims = cluster.extender.ledger.claims()
    cluster.kube.stop()
    # the API is gone: filter still answers from the ledger, bind refuses and changes nothing
    # (it binds from the watch's copy of the pod: the Binding is what fails)
    status, reply = post(f"{cluster.url}/filter", {"Pod": second, "NodeNames": list(NODES)})
    assert status == 200 and reply["NodeNames"] == list(NODES)
    status, reply = post(f"{cluster.url}/bind", binding_args(second, "n0"))
    assert status == 200 and "cannot bind pod default/second to n0" in reply["Error"]
    assert cluster.extender.ledger.claims() == claims
    # while it is down, the first pod goes away
    from simkube.store import resource_type

    cluster.kube.call(cluster.kube.store.delete, resource_type("", "v1", "pods"), "default", "first")
    cluster.kube.start()
    # the watch resumes from where it was: the deletion is seen, and binds work again
    cluster.wait_ledger(lambda ledger: ledger.claims() == {}, "the deletion to release the card")
    status, reply = post(f"{cluster.url}/bind", binding_args(second, "n0"))
    assert reply == {"Error": ""}
    settle(cluster)
    assert cluster.extender.ledger.claims() == {"n0": {second["metadata"]["uid"]: [(0, 0, 40, 4 * GIB_UNITS)]}}
    assert cluster.extender.ledger.overcommitted() == [] and api_overcommit(cluster) == []


def test_a_pod_bound_meanwhile_leaves_the_ledger_as_the_api_says(cluster):
    """The extender's watch has not seen it yet, but the pod was bound meanwhile by another
    writer (with card 1): bind answers success for that node and the ledger takes the claim
    the API shows, not one of its own."""
    cluster.add_node(node("n0", count=2, memory_gib=16))
    cluster.start_extender()
    busy = cluster.add_pod(pod("busy", cores=20, memory_units=2 * GIB_UNITS))
    assert post(f"{cluster.url}/bind", binding_args(busy, "n0"))[1] == {"Error": ""}
    settle(cluster)
    assert [share[1] for share in cluster.extender.ledger.claims()["n0"][busy["metadata"]["uid"]]] == [0]
    created = cluster.add_pod(pod("nb", cores=40, memory_units=4 * GIB_UNITS))
    pods = cluster.extender.view.pods
    wait_for(lambda: pods.get("default", "nb"), timeout=20, what="the extender's watch to see the pod")
    pods.stop()  # from here on the extender's watch sees nothing
    assert bind_as_another_writer(cluster.core, "nb", "n0", card=1) == 201
    # binpack would put the pod on card 0, next to "busy"; the API says card 1
    status, reply = post(f"{cluster.url}/bind", binding_args(created, "n0"))
    assert reply == {"Error": ""}
    assert cluster.extender.ledger.claims()["n0"][created["metadata"]["uid"]] == [(0, 1, 40, 4 * GIB_UNITS)]
    assert cluster.extender.ledger.overcommitted() == [] and api_overcommit(cluster) == []


def test_bind_leaves_alone_a_pod_bound_meanwhile_elsewhere(cluster):
    """A pod whose earlier claim's keys bind would PATCH away first, bound meanwhile to another
    node (the extender's watch has not seen it): bind refuses and leaves its claim intact."""
    cluster.add_node(node("n0", count=2, memory_gib=16))
    cluster.add_node(node("n1", count=2, memory_gib=16))
    cluster.start_extender()
    stale = {NAMES.mig_slice(0): "MIG-0000-old"}
    created = cluster.add_pod(pod("nb", cores=40, memory_units=4 * GIB_UNITS, annotations=stale))
    pods = cluster.extender.view.pods
    wait_for(lambda: pods.get("default", "nb"), timeout=20, what="the extender's watch to see the pod")
    pods.stop()  # from here on the extender's watch sees nothing
    claim = another_writers_claim("n1", card=1)
    assert bind_as_another_writer(cluster.core, "nb", "n1", card=1) == 201
    status, reply = post(f"{cluster.url}/bind", binding_args(created, "n0"))
    assert reply["Error"] == "pod default/nb is already bound to node n1"
    annotations = cluster.read_pod("nb")["metadata"]["annotations"]
    assert {key: annotations.get(key) for key in claim} == claim  # the claim the API holds is intact
