"""Bind reads a pod from the extender's watch instead of GETting it when nothing of the
extender's own can be newer than that copy (``Decisions._watched_copy``): one request to the
API for a fresh pod, the API read again for a pod it bound a moment ago, and the ledger as
the API says after a Binding refused because someone else bound the pod meanwhile."""

from __future__ import annotations

from typing import Any

from extender_support import GIB_UNITS, NAMES, bind_as_another_writer, binding_args, node, pod, post
from simkube.waiting import wait_for
from test_concurrency import api_overcommit, settle

from jupyter_vgpu.core import contract


def served(cluster: Any, since: int, name: str) -> list[tuple[str, str]]:
    """The API requests about pod ``name`` the simulated API received after the first ``since``."""
    path = f"/api/v1/namespaces/default/pods/{name}"
    return [(str(getattr(r.method, "value", r.method)), r.url.path) for r in list(cluster.kube.emulator)[since:]
            if r.url.path.startswith(path)]


def watched(cluster: Any, name: str) -> dict[str, Any]:
    pods = cluster.extender.view.pods
    copy: dict[str, Any] = wait_for(lambda: pods.get("default", name), timeout=20,
                                    what="the extender's watch to see the pod")
    return copy

def two_nodes_and_a_watched_pod(cluster: Any) -> dict[str, Any]:
    """Nodes n0 and n1 (two cards each), the extender, and pod "nb" (40 % and 4 GiB) in its watch."""
    cluster.add_node(node("n0", count=2, memory_gib=16))
    cluster.add_node(node("n1", count=2, memory_gib=16))
    cluster.start_extender()
    created: dict[str, Any] = cluster.add_pod(pod("nb", cores=40, memory_units=4 * GIB_UNITS))
    watched(cluster, "nb")
    return created


def test_a_fresh_pod_is_bound_with_the_binding_alone(cluster):
    cluster.add_node(node("n0", count=2, memory_gib=16))
    cluster.start_extender()
    created = cluster.add_pod(pod("nb", cores=40, memory_units=4 * GIB_UNITS))
    watched(cluster, "nb")
    since = len(list(cluster.kube.emulator))
    status, reply = post(f"{cluster.url}/bind", binding_args(created, "n0"))
    assert status == 200 and reply == {"Error": ""}
    assert served(cluster, since, "nb") == [("POST", "/api/v1/namespaces/default/pods/nb/binding")]
    bound = cluster.read_pod("nb")
    assert bound["spec"]["nodeName"] == "n0"
    allocation = contract.PodAllocation.from_json(bound["metadata"]["annotations"][NAMES.allocation])
    assert [(s.index, s.cores, s.memory_units) for c in allocation.containers for s in c.cards] == \
        [(0, 40, 4 * GIB_UNITS)]
    settle(cluster)
    assert cluster.extender.ledger.claims() == {"n0": {created["metadata"]["uid"]: [(0, 0, 40, 4 * GIB_UNITS)]}}


def test_a_pod_bound_a_moment_ago_is_read_from_the_api_and_keeps_its_cards(cluster):
    """The watch still shows the pod unbound after this extender bound it: a second bind (to
    another node, as a stale scheduler might send) reads the API, and the cards the pod holds are
    never given back meanwhile, not even for the moment another bind could take them."""
    cluster.add_node(node("n0", count=1, memory_gib=16))
    cluster.add_node(node("n1", count=1, memory_gib=16))
    cluster.start_extender()
    created = cluster.add_pod(pod("nb", cores=60, memory_units=4 * GIB_UNITS))
    watched(cluster, "nb")
    cluster.extender.view.pods.stop()  # from here on the extender's watch sees nothing
    assert post(f"{cluster.url}/bind", binding_args(created, "n0"))[1] == {"Error": ""}
    ledger = cluster.extender.ledger
    claims = ledger.claims()
    assert claims == {"n0": {created["metadata"]["uid"]: [(0, 0, 60, 4 * GIB_UNITS)]}}
    changed: list[str] = []
    ledger.subscribe(lambda name, _cards: changed.append(name))
    since = len(list(cluster.kube.emulator))
    status, reply = post(f"{cluster.url}/bind", binding_args(created, "n1"))
    assert reply == {"Error": "pod default/nb is already bound to node n0"}
    assert changed == []
    assert ledger.claims() == claims
    assert served(cluster, since, "nb") == [("GET", "/api/v1/namespaces/default/pods/nb")]
    assert api_overcommit(cluster) == []


def test_a_pod_bound_elsewhere_while_its_binding_is_on_the_way_leaves_the_api_claim(cluster):
    """Someone else binds the pod (card 1 of n1) just after bind recorded its claim from the
    watch's copy, and the watch delivers that while the claim is in flight (so it cannot change
    it): the Binding is refused, and the ledger ends up holding what the API holds."""
    created = two_nodes_and_a_watched_pod(cluster)
    uid = created["metadata"]["uid"]
    ledger, pods = cluster.extender.ledger, cluster.extender.view.pods
    foreign: list[int] = []

    def bind_elsewhere(_node: str, _cards: bool) -> None:
        held = ledger.holding(uid)
        if foreign or held is None or not held.assumed or held.node != "n0":
            return
        # bind is about to POST its Binding to n0; another writer binds the pod to n1 first
        foreign.append(bind_as_another_writer(cluster.core, "nb", "n1", card=1))
        wait_for(lambda: ((pods.get("default", "nb") or {}).get("spec") or {}).get("nodeName") == "n1",
                 timeout=20, what="the extender's watch to see the pod bound to n1")

    ledger.subscribe(bind_elsewhere)
    status, reply = post(f"{cluster.url}/bind", binding_args(created, "n0"))
    assert foreign == [201]
    assert reply == {"Error": "pod default/nb is already bound to node n1"}
    settle(cluster)
    assert ledger.claims() == {"n1": {uid: [(0, 1, 40, 4 * GIB_UNITS)]}}
    assert ledger.overcommitted() == [] and api_overcommit(cluster) == []


def test_a_pod_bound_elsewhere_after_its_copy_was_read_is_read_from_the_api(cluster):
    """The watch delivers someone else's binding between bind's read of its copy and the claim:
    the copy is outdated by then, so bind reads the API instead; it sends no Binding and the
    ledger never holds a claim of ours for the pod, not even for a moment."""
    created = two_nodes_and_a_watched_pod(cluster)
    uid = created["metadata"]["uid"]
    decisions, ledger = cluster.extender.decisions, cluster.extender.ledger
    read_copy = decisions.watched
    held_on: list[str] = []
    ledger.subscribe(lambda _node, _cards: held_on.append(getattr(ledger.holding(uid), "node", "")))

    def copy_then_bound_elsewhere(namespace: str, name: str) -> Any:
        copy = read_copy(namespace, name)
        if held_on:
            return copy
        # the copy is read; before bind records its claim, another writer binds the pod to n1
        # and the extender's watch tells the ledger
        assert bind_as_another_writer(cluster.core, "nb", "n1", card=1) == 201
        wait_for(lambda: getattr(ledger.holding(uid), "node", "") == "n1", timeout=20,
                 what="the extender's watch to give the ledger the pod's claim on n1")
        return copy

    decisions.watched = copy_then_bound_elsewhere
    since = len(list(cluster.kube.emulator))
    status, reply = post(f"{cluster.url}/bind", binding_args(created, "n0"))
    assert reply == {"Error": "pod default/nb is already bound to node n1"}
    assert served(cluster, since, "nb") == [("POST", "/api/v1/namespaces/default/pods/nb/binding"),
                                            ("GET", "/api/v1/namespaces/default/pods/nb")]
    assert held_on and set(held_on) == {"n1"}
    settle(cluster)
    assert ledger.claims() == {"n1": {uid: [(0, 1, 40, 4 * GIB_UNITS)]}}
    assert ledger.overcommitted() == [] and api_overcommit(cluster) == []
