"""Which pod kubelet is admitting, when the daemon's watch lags kubelet's: real gRPC on unix sockets,
the simulated API, and its request log to count the LISTs of the node's pods."""

from __future__ import annotations

from deviceplugin_support import (
    CORE,
    MEMORY,
    NAMES,
    all_ids,
    annotations,
    make_node,
    place_pod,
    wait_registered,
)
from simkube.waiting import wait_for
from vgpu_plugin.deviceplugin.listed import ListedPods

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import Request


def _node_lists(kube) -> int:
    """LISTs of node-1's pods the API server has answered (watches excluded)."""
    return sum(1 for r in list(kube.emulator)
               if str(getattr(r.method, "value", r.method)) == "GET" and r.url.path == "/api/v1/pods"
               and r.url.query.get("fieldSelector") == "spec.nodeName=node-1" and r.url.query.get("watch") is None)


def _ready_with_a_dead_watch(daemons, peer, gpus, core_v1, *seen: str):
    """The daemon serving kubelet, its watch stopped once it has delivered the pods ``seen``."""
    make_node(core_v1)
    daemon = daemons(gpus)
    wait_registered(peer)
    assert daemon.wait_ready(10)
    for name in seen:
        wait_for(lambda name=name: (daemon.informer.get("default", name) or {}).get("spec", {}).get("nodeName"),
                 timeout=20, what=f"{name} in the daemon's cache")
    daemon.informer.stop()  # what it holds now is all it will ever hold
    return daemon


def test_a_pod_bound_after_the_watch_died_is_found_and_one_list_serves_the_admission(daemons, peer, gpus,
                                                                                      core_v1, kube):
    daemon = _ready_with_a_dead_watch(daemons, peer, gpus, core_v1)
    place_pod(core_v1, gpus, "late", [(Request(30, 12), (2,))])
    assert daemon.informer.get("default", "late") is None
    before = _node_lists(kube)
    _, core = peer.admit(CORE, 30, all_ids("core"))
    # the preferred call missed and listed; Allocate then checks once more, as it must, that no pod
    # its view lacks could be the one kubelet admits (the one list per vcuda-core Allocate)
    assert _node_lists(kube) - before == 2
    assert core.envs[c.ENV_POD_NAME] == "late" and core.envs[c.ENV_DEVICE_INDICES] == "2"
    peer.admit(MEMORY, 12, all_ids("memory"))
    assert _node_lists(kube) - before == 2  # the list stood in for the dead watch: no list for vcuda-memory
    # and the record is written from it too
    wait_for(lambda: annotations(core_v1, "late").get(NAMES.gpu_assigned) == "true", timeout=20,
             what="late marked assigned")


def test_a_pod_the_watch_never_delivered_keeps_an_identical_one_from_being_named(daemons, peer, gpus, core_v1):
    place_pod(core_v1, gpus, "seen", [(Request(20, 8), (0,))], predicate_time=1_000)
    _ready_with_a_dead_watch(daemons, peer, gpus, core_v1, "seen")
    place_pod(core_v1, gpus, "unseen", [(Request(20, 8), (0,))], predicate_time=2_000)
    # the cache holds one pod of this size, so it would name "seen"; the API holds two, and kubelet
    # may be admitting either: the answer names neither
    _, core = peer.admit(CORE, 20, all_ids("core"))
    assert not {c.ENV_POD_NAME, c.ENV_POD_NAMESPACE, c.ENV_POD_UID} & set(core.envs)
    assert core.envs[c.ENV_CONTAINER] == "c0" and core.envs[c.ENV_TOKEN]


def test_with_a_live_watch_each_vcuda_core_allocate_lists_once_and_vcuda_memory_never(daemons, peer, gpus,
                                                                                     core_v1, kube):
    make_node(core_v1)
    daemon = daemons(gpus)
    wait_registered(peer)
    assert daemon.wait_ready(10)
    for index, name in enumerate(("first", "second")):
        place_pod(core_v1, gpus, name, [(Request(15 + index, 4), (index,))])
        wait_for(lambda name=name: daemon.informer.get("default", name), timeout=20, what=f"{name} in the cache")
        before = _node_lists(kube)
        _, core = peer.admit(CORE, 15 + index, all_ids("core"))
        assert core.envs[c.ENV_POD_NAME] == name
        assert _node_lists(kube) - before == 1
        peer.admit(MEMORY, 4, all_ids("memory"))
        assert _node_lists(kube) - before == 1


def _pod(uid: str, rv: int, node: str = "n1") -> dict:
    return {"metadata": {"uid": uid, "name": uid, "namespace": "default", "resourceVersion": str(rv)},
            "spec": {"nodeName": node}}


def _uids_rvs(pods) -> set[tuple[str, str]]:
    return {(p["metadata"]["uid"], p["metadata"]["resourceVersion"]) for p in pods}


def test_a_list_stands_per_pod_where_it_is_newer_and_only_until_the_watch_passes_it():
    listed = ListedPods()
    cached = [_pod("kept", 5), _pod("changed", 6), _pod("deleted", 7), _pod("bound-after-the-list", 30)]
    items = listed.replace({"metadata": {"resourceVersion": "20"},
                            "items": [_pod("kept", 5), _pod("changed", 12), _pod("new", 15)]})
    assert _uids_rvs(items) == {("kept", "5"), ("changed", "12"), ("new", "15")}
    assert listed.standing
    assert _uids_rvs(listed.merged(cached, "10")) == {
        ("kept", "5"), ("changed", "12"), ("new", "15"), ("bound-after-the-list", "30")}
    # a newer copy in the cache beats the list's
    assert ("changed", "25") in _uids_rvs(listed.merged([_pod("changed", 25)], "19"))
    # the watch reached the list: the cache alone, and the list is dropped for good
    assert _uids_rvs(listed.merged(cached, "20")) == _uids_rvs(cached)
    assert not listed.standing
    assert _uids_rvs(listed.merged(cached, "3")) == _uids_rvs(cached)


def test_a_list_without_comparable_versions_serves_only_its_own_call():
    listed = ListedPods()
    items = listed.replace({"metadata": {"resourceVersion": "abc"}, "items": [_pod("x", 1)]})
    assert _uids_rvs(items) == {("x", "1")} and not listed.standing
    cached = [_pod("y", 2)]
    assert listed.merged(cached, "1") == cached
