"""Bad requests get a 4xx or an Error with a clear message, never a 500 or a traceback,
and never change the ledger or the pod."""

from __future__ import annotations

import json

import pytest
from extender_support import GIB_UNITS, NAMES, binding_args, filter_args, get, node, pod, post


@pytest.fixture
def ready(cluster):
    cluster.add_node(node("gpu-a", count=2, memory_gib=16))
    cluster.start_extender()
    return cluster


def snapshot(cluster):
    ledger = cluster.extender.ledger
    with ledger.lock:
        return ledger.claims(), ledger.stats(), {n: ledger.node(n).generation for n in ledger.node_names()}


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind"])
@pytest.mark.parametrize("body, words", [
    (b"", "empty request body"),
    (b"{not json", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b"null", "must be a JSON object"),
    (b'{"Pod": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nests too deeply"),
])
def test_unparseable_bodies_are_400_with_a_reason(ready, verb, body, words):
    before = snapshot(ready)
    status, reply = post(f"{ready.url}/{verb}", body)
    assert status == 400
    assert words in reply["Error"]
    assert "Traceback" not in json.dumps(reply)
    assert snapshot(ready) == before


@pytest.mark.parametrize("args, words", [
    ({"NodeNames": ["gpu-a"]}, "ExtenderArgs.Pod is missing"),
    ({"Pod": None, "NodeNames": ["gpu-a"]}, "ExtenderArgs.Pod is missing"),
    ({"Pod": "nb", "NodeNames": ["gpu-a"]}, "Pod must be a JSON object"),
    ({"Pod": {"metadata": {"name": "x"}}}, "neither NodeNames"),
    ({"Pod": {"metadata": {"name": "x"}}, "NodeNames": "gpu-a"}, "NodeNames must be a list"),
    ({"Pod": {"metadata": {"annotations": {"a": 1}}}, "NodeNames": []}, "Pod.metadata.annotations['a'] must be a string"),
    ({"Pod": {"spec": {"containers": {}}}, "NodeNames": []}, "Pod.spec.containers must be a list"),
    ({"Pod": {"metadata": {"name": "x"}}, "Nodes": {"items": [{"metadata": {}}]}}, "Nodes.items[0] has no metadata.name"),
])
def test_malformed_extender_args(ready, args, words):
    before = snapshot(ready)
    for verb in ("filter", "prioritize"):
        status, reply = post(f"{ready.url}/{verb}", args)
        assert status == 400, (verb, reply)
        assert words in reply["Error"]
    assert snapshot(ready) == before


def test_pod_without_vgpu_request_is_an_error_naming_the_fix(ready):
    plain = ready.add_pod(pod("plain", cores=None, memory_units=None))
    before = snapshot(ready)
    status, reply = post(f"{ready.url}/filter", filter_args(plain, ["gpu-a"]))
    assert status == 200 and reply["NodeNames"] is None
    assert "asks for no vGPU" in reply["Error"] and "managedResources" in reply["Error"]
    status, reply = post(f"{ready.url}/prioritize", filter_args(plain, ["gpu-a"]))
    assert status == 400 and "asks for no vGPU" in reply["Error"]
    status, reply = post(f"{ready.url}/bind", binding_args(plain, "gpu-a"))
    assert status == 200 and "asks for no vGPU" in reply["Error"]
    assert snapshot(ready) == before
    assert not ready.read_pod("plain")["spec"].get("nodeName")


@pytest.mark.parametrize("cores, memory, annotations, words", [
    (150, 8, {}, "neither a share of one card (1-99) nor whole cards"),
    (25, None, {}, "needs tencent.com/vcuda-memory too"),
    (25, 8, {NAMES.policy: "roundrobin"}, "is not a placement policy"),
])
def test_invalid_requests_are_unresolvable_everywhere(ready, cores, memory, annotations, words):
    bad = ready.add_pod(pod("bad", cores=cores, memory_units=memory, annotations=annotations))
    before = snapshot(ready)
    status, reply = post(f"{ready.url}/filter", filter_args(bad, ["gpu-a", "gpu-x"]))
    assert status == 200 and reply["Error"] == "" and reply["NodeNames"] == []
    assert set(reply["FailedAndUnresolvableNodes"]) == {"gpu-a", "gpu-x"}
    assert words in reply["FailedAndUnresolvableNodes"]["gpu-a"]
    status, reply = post(f"{ready.url}/bind", binding_args(bad, "gpu-a"))
    assert status == 200 and words in reply["Error"]
    assert snapshot(ready) == before
    assert NAMES.allocation not in (ready.read_pod("bad")["metadata"].get("annotations") or {})


@pytest.mark.parametrize("args, words", [
    ({"PodNamespace": "default", "Node": "gpu-a"}, "lacks PodName"),
    ({"PodName": "nb", "PodNamespace": "default"}, "lacks Node"),
    ({"PodName": 3, "PodNamespace": "default", "Node": "gpu-a"}, "PodName must be a string"),
])
def test_malformed_binding_args(ready, args, words):
    before = snapshot(ready)
    status, reply = post(f"{ready.url}/bind", args)
    assert status == 400 and words in reply["Error"]
    assert snapshot(ready) == before


def test_unknown_pod_and_replaced_pod(ready):
    before = snapshot(ready)
    status, reply = post(f"{ready.url}/bind", {"PodName": "ghost", "PodNamespace": "default",
                                               "PodUID": "1234", "Node": "gpu-a"})
    assert status == 200 and reply["Error"] == "pod default/ghost not found"
    created = ready.add_pod(pod("nb", cores=10, memory_units=GIB_UNITS))
    stale = dict(binding_args(created, "gpu-a"), PodUID="0000-old")
    status, reply = post(f"{ready.url}/bind", stale)
    assert "deleted and created again" in reply["Error"]
    assert snapshot(ready) == before
    assert not (ready.read_pod("nb")["metadata"].get("annotations") or {})


def test_bind_to_a_node_without_room_or_cards(ready):
    before = snapshot(ready)
    created = ready.add_pod(pod("nb", cores=10, memory_units=GIB_UNITS))
    status, reply = post(f"{ready.url}/bind", binding_args(created, "no-such-node"))
    assert "node no-such-node" in reply["Error"]
    whole = ready.add_pod(pod("whole", cores=300, memory_units=None))
    status, reply = post(f"{ready.url}/bind", binding_args(whole, "gpu-a"))
    assert "does not fit on node gpu-a" in reply["Error"] and "3 whole cards" in reply["Error"]
    assert snapshot(ready) == before


def test_failed_binding_post_rolls_back_annotations_and_ledger(ready):
    created = ready.add_pod(pod("nb", cores=10, memory_units=GIB_UNITS))
    before = snapshot(ready)
    ready.kube.emulator["post", "/api/v1/namespaces/default/pods/nb/binding"] << 500
    status, reply = post(f"{ready.url}/bind", binding_args(created, "gpu-a"))
    assert status == 200 and "cannot bind pod default/nb to gpu-a" in reply["Error"]
    annotations = ready.read_pod("nb")["metadata"].get("annotations") or {}
    assert not any(key.startswith(NAMES.domain) or key.startswith(NAMES.project_domain) for key in annotations)
    assert not ready.read_pod("nb")["spec"].get("nodeName")
    assert snapshot(ready)[0] == before[0]


def test_keys_of_an_earlier_claim_are_removed_before_binding(ready):
    """A Binding can only add annotations: a MIG slice key this claim does not cover is PATCHed
    away first, and a failed PATCH leaves nothing behind."""
    stale = {NAMES.mig_slice(0): "MIG-0000-old"}
    created = ready.add_pod(pod("old", cores=10, memory_units=GIB_UNITS, annotations=stale))
    before = snapshot(ready)
    ready.kube.emulator["patch", "/api/v1/namespaces/default/pods/old"] << 422
    status, reply = post(f"{ready.url}/bind", binding_args(created, "gpu-a"))
    assert "cannot annotate pod default/old" in reply["Error"]
    assert snapshot(ready)[0] == before[0]
    assert not ready.read_pod("old")["spec"].get("nodeName")
    assert ready.read_pod("old")["metadata"]["annotations"] == stale
    other = ready.add_pod(pod("other", cores=10, memory_units=GIB_UNITS, annotations=stale))
    status, reply = post(f"{ready.url}/bind", binding_args(other, "gpu-a"))
    assert reply == {"Error": ""}
    done = ready.read_pod("other")
    assert done["spec"]["nodeName"] == "gpu-a"
    assert NAMES.mig_slice(0) not in done["metadata"]["annotations"]
    assert NAMES.allocation in done["metadata"]["annotations"]


def test_wrong_method_and_unknown_path(ready):
    status, body = get(f"{ready.url}/filter")
    assert status == 405 and json.loads(body)["Error"]
    assert get(f"{ready.extender.base_url}/nope")[0] == 404
