"""Hostile tenants against the extender, over real HTTP on the simulated API.

Annotations are written by whoever creates the pod: they are input, never facts. Each test
here failed on the extender before claims were read through ``core.claims`` with the
scheduler-name rule, the capacity re-check at bind and the own-claim exclusion.
"""

from __future__ import annotations

import pytest
from extender_support import GIB_UNITS, NAMES, binding_args, filter_args, node, pod, post
from simkube.waiting import wait_for

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import CardShare, ContainerAllocation, PodAllocation


def claim(node_name: str, card: int, cores: int, units: int) -> dict[str, str]:
    """The annotations our bind writes for a one-container pod on one card."""
    allocation = PodAllocation(node_name, (ContainerAllocation(0, "notebook", (
        CardShare(card, f"GPU-{node_name}-{card}", cores, units),)),), assigned_at_ns=1)
    return contract.predicate_annotations(allocation, NAMES)


def held(cluster, node_name: str) -> dict[int, int]:
    """Cores held per card of a node, as the extender's ledger says."""
    ledger = cluster.extender.ledger
    with ledger.lock:
        entry = ledger.node(node_name)
        return {card.index: entry.used_cores[i] for i, card in enumerate(entry.cards)}


def filtered(cluster, pod_obj, names):
    status, reply = post(f"{cluster.url}/filter", filter_args(pod_obj, names))
    assert status == 200, reply
    return reply


@pytest.mark.parametrize("forger", [
    pod("other-scheduler", cores=25, memory_units=GIB_UNITS, scheduler="default-scheduler"),
    pod("no-request", cores=None, memory_units=None),
    pod("no-request-elsewhere", cores=None, memory_units=None, namespace="kube-system", scheduler="custom"),
], ids=lambda p: p["metadata"]["name"])
def test_unscheduled_pods_with_forged_claims_hold_nothing(cluster, forger):
    cluster.add_node(node("gpu-a", count=1, memory_gib=16))
    forger["metadata"]["annotations"] = claim("gpu-a", 0, 100, 16 * GIB_UNITS)  # the whole card
    cluster.add_pod(forger)
    cluster.start_extender()
    victim = cluster.add_pod(pod("victim", cores=50, memory_units=4 * GIB_UNITS))
    reply = filtered(cluster, victim, ["gpu-a"])
    assert reply["NodeNames"] == ["gpu-a"], reply
    assert held(cluster, "gpu-a") == {0: 0}
    status, reply = post(f"{cluster.url}/bind", binding_args(victim, "gpu-a"))
    assert status == 200 and not reply["Error"], reply
    assert cluster.extender.ledger.overcommitted() == []


def test_bound_pods_count_only_what_they_ask_for(cluster):
    cluster.add_node(node("gpu-a", count=1, memory_gib=16))
    # bound by someone else, asking for 10 cores, annotated as if holding the whole card
    greedy = pod("greedy", cores=10, memory_units=GIB_UNITS, scheduler="default-scheduler")
    greedy["metadata"]["annotations"] = claim("gpu-a", 0, 100, 16 * GIB_UNITS)
    greedy["spec"]["nodeName"] = "gpu-a"
    cluster.add_pod(greedy)
    cluster.start_extender()
    cluster.wait_ledger(lambda ledger: ledger.holdings(), "greedy in the ledger")
    assert held(cluster, "gpu-a") == {0: 10}
    victim = cluster.add_pod(pod("victim", cores=80, memory_units=8 * GIB_UNITS))
    assert filtered(cluster, victim, ["gpu-a"])["NodeNames"] == ["gpu-a"]


def card_0_held_and_named_by_a_tenant(cluster, cards: int) -> dict:
    """Node gpu-a (``cards`` cards) whose card 0 "holder" fills to 90 cores, and pod "sneaky"
    (60 cores) whose tenant named card 0 for it before it was scheduled; the extender started."""
    cluster.add_node(node("gpu-a", count=cards, memory_gib=16))
    holder = pod("holder", cores=90, memory_units=2 * GIB_UNITS)
    holder["metadata"]["annotations"] = claim("gpu-a", 0, 90, 2 * GIB_UNITS)
    holder["spec"]["nodeName"] = "gpu-a"
    cluster.add_pod(holder)
    sneaky = pod("sneaky", cores=60, memory_units=2 * GIB_UNITS)
    sneaky["metadata"]["annotations"] = {NAMES.predicate_node: "gpu-a", NAMES.predicate_gpu_idx(0): "0"}
    sneaky = cluster.add_pod(sneaky)
    cluster.start_extender()
    cluster.wait_ledger(lambda ledger: len(ledger.holdings()) == 2, "both pods in the ledger")
    return sneaky


def test_a_preset_card_without_room_is_not_adopted(cluster):
    sneaky = card_0_held_and_named_by_a_tenant(cluster, cards=2)
    assert filtered(cluster, sneaky, ["gpu-a"])["NodeNames"] == ["gpu-a"]  # card 1 has room
    status, reply = post(f"{cluster.url}/bind", binding_args(sneaky, "gpu-a"))
    assert status == 200 and not reply["Error"], reply
    bound = cluster.read_pod("sneaky")
    assert bound["spec"]["nodeName"] == "gpu-a"
    assert bound["metadata"]["annotations"][NAMES.predicate_gpu_idx(0)] == "1"  # placed afresh
    assert cluster.extender.ledger.overcommitted() == []
    cluster.wait_ledger(lambda ledger: not any(h.assumed for h in ledger.holdings()), "the watch confirmed it")
    assert held(cluster, "gpu-a") == {0: 90, 1: 60}


def test_a_preset_card_is_refused_when_nothing_else_has_room(cluster):
    sneaky = card_0_held_and_named_by_a_tenant(cluster, cards=1)
    reply = filtered(cluster, sneaky, ["gpu-a"])
    assert reply["NodeNames"] == [] and "largest free share is 10 cores" in reply["FailedNodes"]["gpu-a"]
    status, reply = post(f"{cluster.url}/bind", binding_args(sneaky, "gpu-a"))
    assert status == 200 and "does not fit on node gpu-a" in reply["Error"], reply
    assert not cluster.read_pod("sneaky")["spec"].get("nodeName")


def test_an_interrupted_bind_is_retried_to_success(cluster):
    cluster.add_node(node("gpu-a", count=1, memory_gib=16))
    cluster.start_extender()
    # a MIG slice key left by an earlier claim makes bind PATCH the new claim before the Binding
    # (a Binding can only add annotations)
    nb = cluster.add_pod(pod("nb", cores=60, memory_units=8 * GIB_UNITS,
                             annotations={NAMES.mig_slice(0): "MIG-0000-old"}))
    # the Binding fails and so does the undo of the claim: the pod keeps our annotations, unbound
    emulator = cluster.kube.emulator
    emulator["post", "/api/v1/namespaces/default/pods/nb/binding"] << 500
    # (the undo removes several keys; the claim's PATCH removes only the stale one)
    emulator["patch", "/api/v1/namespaces/default/pods/nb"][lambda request: request.body.count(b"null") > 1] << 500
    status, reply = post(f"{cluster.url}/bind", binding_args(nb, "gpu-a"))
    assert status == 200 and "cannot bind pod default/nb" in reply["Error"], reply
    stranded = cluster.read_pod("nb")
    assert stranded["metadata"]["annotations"][NAMES.predicate_node] == "gpu-a"
    assert not stranded["spec"].get("nodeName")
    # the extender dies; the API restarts without the faults (same objects); a new extender
    # lists the stranded claim
    cluster.stop_extender()
    cluster.kube.stop()
    cluster.kube.start()
    cluster.start_extender()
    cluster.wait_ledger(lambda ledger: ledger.holding(nb["metadata"]["uid"]), "the stranded claim listed")
    assert held(cluster, "gpu-a") == {0: 60}
    # kube-scheduler retries: filter, prioritize and bind see the node as the pod's own
    reply = filtered(cluster, nb, ["gpu-a"])
    assert reply["NodeNames"] == ["gpu-a"], reply
    status, scores = post(f"{cluster.url}/prioritize", filter_args(nb, ["gpu-a"]))
    assert status == 200 and scores[0]["Score"] > 0, scores
    status, reply = post(f"{cluster.url}/bind", binding_args(nb, "gpu-a"))
    assert status == 200 and not reply["Error"], reply
    assert cluster.read_pod("nb")["spec"]["nodeName"] == "gpu-a"
    assert held(cluster, "gpu-a") == {0: 60} and cluster.extender.ledger.overcommitted() == []
    # and the next pod still sees the card as it is
    other = cluster.add_pod(pod("other", cores=60, memory_units=2 * GIB_UNITS))
    wait_for(lambda: not filtered(cluster, other, ["gpu-a"])["NodeNames"], timeout=20, what="other refused")
