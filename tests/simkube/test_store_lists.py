"""Lists read each kind's own objects in (namespace, name) order, and a bind leaves the stored pod as it was."""

from __future__ import annotations

import json

from simkube.store import resource_type

PODS = resource_type("", "v1", "pods")


def pod(name: str) -> dict:
    return {"metadata": {"name": name, "annotations": {"keep": "me"}},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}


def listed(response) -> list[tuple[str, str]]:
    return [(i["metadata"].get("namespace", ""), i["metadata"]["name"]) for i in json.loads(response.data)["items"]]


def test_lists_keep_namespace_name_order_as_objects_come_and_go(core_v1):
    for namespace in ("b-team", "a-team"):
        core_v1.create_namespace({"metadata": {"name": namespace}})
    for namespace, name in (("b-team", "z"), ("a-team", "y"), ("b-team", "a"), ("a-team", "x")):
        core_v1.create_namespaced_pod(namespace, pod(name))
    core_v1.create_node({"metadata": {"name": "node-b"}})
    core_v1.create_node({"metadata": {"name": "node-a"}})
    assert listed(core_v1.list_pod_for_all_namespaces(_preload_content=False)) == [
        ("a-team", "x"), ("a-team", "y"), ("b-team", "a"), ("b-team", "z")]

    core_v1.delete_namespaced_pod("x", "a-team")
    core_v1.create_namespaced_pod("a-team", pod("b"))
    core_v1.create_namespaced_pod_binding("y", "a-team", {  # a change that is no new name keeps the order too
        "metadata": {"name": "y"}, "target": {"name": "node-a"}}, _preload_content=False)
    assert listed(core_v1.list_pod_for_all_namespaces(_preload_content=False)) == [
        ("a-team", "b"), ("a-team", "y"), ("b-team", "a"), ("b-team", "z")]
    assert listed(core_v1.list_namespaced_pod("b-team", _preload_content=False)) == [("b-team", "a"), ("b-team", "z")]
    assert listed(core_v1.list_node(_preload_content=False)) == [("", "node-a"), ("", "node-b")]
    assert listed(core_v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-a",
                                                      _preload_content=False)) == [("a-team", "y")]

    core_v1.delete_namespace("b-team")  # its pods go with it
    assert listed(core_v1.list_pod_for_all_namespaces(_preload_content=False)) == [("a-team", "b"), ("a-team", "y")]


def test_a_bind_writes_a_new_pod_and_leaves_the_stored_one_untouched(kube, core_v1):
    core_v1.create_namespaced_pod("default", pod("p"))
    before = kube.call(kube.store.get, PODS, "default", "p")
    snapshot = json.loads(json.dumps(before))
    core_v1.create_namespaced_pod_binding("p", "default", {
        "metadata": {"name": "p", "annotations": {"claim": "card-0"}}, "target": {"name": "gpu-1"}},
        _preload_content=False)

    after = json.loads(core_v1.read_namespaced_pod("p", "default", _preload_content=False).data)
    assert after["spec"]["nodeName"] == "gpu-1"
    assert after["metadata"]["annotations"] == {"keep": "me", "claim": "card-0"}
    assert [c["type"] for c in after["status"]["conditions"]] == ["PodScheduled"]
    assert before == snapshot  # what a watch or a list already handed out did not change
