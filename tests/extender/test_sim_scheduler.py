"""The kube-scheduler stand-in and the extender together, over HTTP, on the simulated API."""

from __future__ import annotations

import json

import pytest
from extender_support import GIB_UNITS, NAMES, node, pod
from simkube.scheduler import SimScheduler, fit_error, load_config
from simkube.waiting import wait_for
from vgpu_plugin.demo.cluster import scheduler_config_path
from vgpu_plugin.informer import Informer

from jupyter_vgpu.core import contract


@pytest.fixture
def scheduled(cluster):
    cluster.add_node(node("gpu-a", count=2, memory_gib=16))
    cluster.add_node(node("gpu-b", count=2, memory_gib=16, cpu="2"))
    # no kubelet here admits a pod: without this, the fifth pod bound to a node would find four
    # awaiting admission there and be steered to another node (test_bind_rivals.py)
    cluster.start_extender().decisions.admission_backlog = 0
    scheduler = SimScheduler(cluster.kube.api_client(), scheduler_config_path(), informer=Informer,
                             extender_url=cluster.extender.base_url, seed=1, initial_backoff=0.2, max_backoff=1.0)
    scheduler.start()
    try:
        yield cluster, scheduler
    finally:
        scheduler.stop()


def events(cluster, name, reason):
    items = json.loads(cluster.core.list_namespaced_event("default", _preload_content=False).data)["items"]
    return [e for e in items if e["involvedObject"]["name"] == name and e["reason"] == reason]


def test_pods_are_scheduled_through_the_extender(scheduled):
    cluster, _ = scheduled
    # One after another: kube-scheduler binds asynchronously, so in a burst the extender may
    # score pod n+1 before pod n's bind reaches it (placement then is valid but less packed).
    for i in range(6):
        cluster.add_pod(pod(f"nb-{i}", cores=30, memory_units=4 * GIB_UNITS))
        wait_for(lambda name=f"nb-{i}": cluster.read_pod(name)["spec"].get("nodeName"), timeout=20, what=f"nb-{i} bound")
    bound = cluster.list_pods()
    for p in bound:
        allocation = contract.PodAllocation.from_json(p["metadata"]["annotations"][NAMES.allocation])
        assert allocation.node == p["spec"]["nodeName"]
        # Events are recorded asynchronously, as kube-scheduler's broadcaster does
        wait_for(lambda name=p["metadata"]["name"]: events(cluster, name, "Scheduled"), timeout=20,
                 what="Scheduled event")
    # binpack: 4 cards x 100 cores hold 3 shares of 30 each; 6 pods need 2 cards, never 3
    cards = {(a.node, s.index) for p in bound
             for a in [contract.PodAllocation.from_json(p["metadata"]["annotations"][NAMES.allocation])]
             for c in a.containers for s in c.cards}
    assert len(cards) == 2
    assert cluster.extender.ledger.overcommitted() == []


def test_unschedulable_pod_gets_failed_scheduling_events_and_is_retried(scheduled):
    cluster, scheduler = scheduled
    # 60 cores: only one such share per card; 4 cards
    for i in range(4):
        cluster.add_pod(pod(f"big-{i}", cores=60, memory_units=2 * GIB_UNITS))
    wait_for(lambda: sum(1 for p in cluster.list_pods() if p["spec"].get("nodeName")) == 4, timeout=20, what="4 bound")
    cluster.add_pod(pod("late", cores=60, memory_units=2 * GIB_UNITS))
    failed = wait_for(lambda: events(cluster, "late", "FailedScheduling"), timeout=20, what="FailedScheduling event")
    message = failed[0]["message"]
    # gpu-b has 2 CPUs for two 1-CPU pods: kube-scheduler's own fit refuses it first
    assert message == ("0/2 nodes are available: 1 Insufficient cpu, 1 needs 60 cores and 2 GiB on one card; "
                       "largest free share is 40 cores / 14 GiB on card 0."), message
    assert failed[0]["type"] == "Warning" and failed[0]["involvedObject"]["kind"] == "Pod"
    # retried with backoff: the same event counted again
    wait_for(lambda: events(cluster, "late", "FailedScheduling")[0].get("count", 1) >= 2, timeout=20, what="a retry")
    # free a card: the pod is scheduled on the next attempt
    cluster.core.delete_namespaced_pod("big-0", "default")
    wait_for(lambda: cluster.read_pod("late")["spec"].get("nodeName"), timeout=20, what="late pod bound")
    assert cluster.extender.ledger.overcommitted() == []


def test_failed_scheduling_names_each_nodes_reason_refused_now_or_for_good(cluster):
    """No node passes the extender: the FailedScheduling message carries its reason for each node,
    one refused now (FailedNodes: its cards are taken) and one for good (FailedAndUnresolvableNodes:
    no card that large), both past kube-scheduler's own node-level fit."""
    cluster.add_node(node("gpu-a", count=2, memory_gib=16))
    cluster.add_node(node("gpu-b", count=2, memory_gib=8))
    cluster.start_extender()
    scheduler = SimScheduler(cluster.kube.api_client(), scheduler_config_path(), informer=Informer,
                             extender_url=cluster.extender.base_url, seed=1, initial_backoff=0.2, max_backoff=1.0)
    with scheduler:
        for i in range(2):  # one per card of gpu-a (60 + 60 cores > 100): 40 cores / 6 GiB left on each
            filler = pod(f"filler-{i}", cores=60, memory_units=10 * GIB_UNITS)
            filler["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "gpu-a"}
            cluster.add_pod(filler)
        wait_for(lambda: all(p["spec"].get("nodeName") for p in cluster.list_pods()), timeout=20, what="fillers bound")
        cluster.add_pod(pod("late", cores=50, memory_units=12 * GIB_UNITS))  # each node's totals have room
        failed = wait_for(lambda: events(cluster, "late", "FailedScheduling"), timeout=20, what="FailedScheduling event")
    assert failed[0]["message"] == (
        "0/2 nodes are available: 1 needs 50 cores and 12 GiB on one card; largest free share is 40 cores / 6 GiB "
        "on card 0, 1 needs 50 cores and 12 GiB on one card; the largest card on this node has 8 GiB "
        "(even with every card free)."), failed[0]["message"]


def test_node_level_fit_comes_first_like_kube_scheduler(scheduled):
    cluster, _ = scheduled
    hungry = pod("hungry", cores=10, memory_units=GIB_UNITS)
    hungry["spec"]["containers"][0]["resources"] = {
        "limits": {"cpu": "4", NAMES.core_resource: "10", NAMES.memory_resource: "4"}}
    hungry["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "gpu-b"}
    cluster.add_pod(hungry)
    failed = wait_for(lambda: events(cluster, "hungry", "FailedScheduling"), timeout=20, what="event")
    assert failed[0]["message"] == ("0/2 nodes are available: 1 Insufficient cpu, "
                                    "1 node(s) didn't match Pod's node affinity/selector.")


def test_fit_error_format():
    assert fit_error(3, {"a": ["Insufficient cpu"], "b": ["x"], "c": ["Insufficient cpu"]}) == \
        "0/3 nodes are available: 1 x, 2 Insufficient cpu."


def test_full_node_mode_works_too(cluster):
    cluster.add_node(node("gpu-a", count=1, memory_gib=16))
    cluster.start_extender()
    config = load_config(scheduler_config_path())
    ext = config.extenders[0]
    import dataclasses

    full = dataclasses.replace(config, extenders=(dataclasses.replace(ext, node_cache_capable=False),))
    scheduler = SimScheduler(cluster.kube.api_client(), full, informer=Informer, extender_url=cluster.extender.base_url)
    with scheduler:
        cluster.add_pod(pod("nb", cores=50, memory_units=4 * GIB_UNITS))
        wait_for(lambda: cluster.read_pod("nb")["spec"].get("nodeName") == "gpu-a", timeout=20, what="bound")


def test_pods_without_vgpu_are_bound_by_the_scheduler_itself(scheduled):
    cluster, _ = scheduled
    plain = pod("plain", cores=None, memory_units=None)
    cluster.add_pod(plain)
    bound = wait_for(lambda: cluster.read_pod("plain")["spec"].get("nodeName"), timeout=20, what="plain pod bound")
    assert bound in ("gpu-a", "gpu-b")
    assert not (cluster.read_pod("plain")["metadata"].get("annotations") or {})  # the extender was not asked
    assert cluster.extender.metrics.decided("bind", "bound")._value.get() == 0
    wait_for(lambda: events(cluster, "plain", "Scheduled"), timeout=20, what="Scheduled event")


def test_other_schedulers_pods_are_left_alone(scheduled):
    cluster, _ = scheduled
    cluster.add_pod(pod("elsewhere", scheduler="default-scheduler"))
    cluster.add_pod(pod("mine"))
    wait_for(lambda: cluster.read_pod("mine")["spec"].get("nodeName"), timeout=20, what="our pod bound")
    assert not cluster.read_pod("elsewhere")["spec"].get("nodeName")
    assert not events(cluster, "elsewhere", "FailedScheduling")


def test_a_kept_connection_the_restarted_extender_closed_is_replaced_not_failed(scheduled):
    """The stand-in keeps its HTTP connections to the extender alive, as kube-scheduler's client
    does; one the extender closed meanwhile (here: restarted on its port) is replaced, and the
    next pod is scheduled without a FailedScheduling Event."""
    from vgpu_plugin.extender.server import Extender

    cluster, _ = scheduled
    cluster.add_pod(pod("before", cores=30, memory_units=4 * GIB_UNITS))
    wait_for(lambda: cluster.read_pod("before")["spec"].get("nodeName"), timeout=20, what="before bound")
    port = cluster.extender.port
    cluster.stop_extender()
    cluster.extender = Extender(port=port, policy=cluster.policy, api_client=cluster.kube.api_client()).start()
    assert cluster.extender.view.wait_synced(30), "extender did not sync"
    cluster.add_pod(pod("after", cores=30, memory_units=4 * GIB_UNITS))
    wait_for(lambda: cluster.read_pod("after")["spec"].get("nodeName"), timeout=20, what="after bound")
    assert events(cluster, "after", "FailedScheduling") == []
