"""The list+watch cache against the simulated API: events, selectors, restarts, 410s, no gaps."""

from __future__ import annotations

import threading
import time

import kubernetes.client
import pytest
from simkube.store import resource_type
from simkube.waiting import wait_for
from vgpu_plugin.informer import Informer

POD = resource_type("", "v1", "pods")  # for writes straight into the store while the API is down


def pod(name: str, labels: dict[str, str] | None = None) -> dict:
    return {"metadata": {"name": name, "labels": labels or {}},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str | None, str | None]] = []  # kind, name, resourceVersion
        self.lock = threading.Lock()

    def __call__(self, kind: str, obj: dict | None) -> None:
        with self.lock:
            meta = (obj or {}).get("metadata", {})
            self.events.append((kind, meta.get("name"), meta.get("resourceVersion")))

    def kinds(self) -> list[tuple[str, str | None]]:
        with self.lock:
            return [(k, n) for k, n, _ in self.events]


@pytest.fixture
def informers():
    started: list[Informer] = []

    def start(*args, **kwargs) -> Informer:
        informer = Informer(*args, **kwargs)
        started.append(informer.start())
        assert informer.wait_synced(30)
        return informer

    yield start
    for informer in started:
        informer.stop()


def names(informer: Informer) -> list[str]:
    return sorted(o["metadata"]["name"] for o in informer.items())


def test_sees_add_modify_delete_as_plain_dicts(core_v1, informers):
    core_v1.create_namespaced_pod("default", pod("before"))
    seen = Recorder()
    informer = informers(core_v1.list_namespaced_pod, namespace="default", on_event=seen)
    assert seen.kinds() == [("ADDED", "before"), ("RELISTED", None)]

    core_v1.create_namespaced_pod("default", pod("p"))
    core_v1.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"tencent.com/gpu-assigned": "true"}}})
    core_v1.delete_namespaced_pod("before", "default")
    wait_for(lambda: len(seen.kinds()) == 5, timeout=30, what="three more events")
    assert seen.kinds()[2:] == [("ADDED", "p"), ("MODIFIED", "p"), ("DELETED", "before")]

    cached = informer.get("default", "p")
    assert cached["metadata"]["annotations"] == {"tencent.com/gpu-assigned": "true"}
    assert cached["spec"]["containers"][0]["name"] == "main"  # camelCase dicts, not client models
    assert informer.get("default", "before") is None
    assert names(informer) == ["p"]


def test_selectors_limit_what_is_cached(kube, core_v1, informers):
    on_node = informers(core_v1.list_pod_for_all_namespaces, field_selector="spec.nodeName=gpu-1")
    labelled = informers(core_v1.list_namespaced_pod, namespace="default", label_selector="app=nb")
    nodes = informers(core_v1.list_node)

    core_v1.create_namespaced_pod("default", pod("a", {"app": "nb"}))
    core_v1.create_namespaced_pod("default", pod("b"))
    core_v1.create_namespaced_pod_binding("a", "default", {"metadata": {"name": "a"}, "target": {"name": "gpu-1"}},
                                          _preload_content=False)
    core_v1.create_node({"metadata": {"name": "gpu-1"}})
    wait_for(lambda: names(on_node) == ["a"] and names(labelled) == ["a"] and names(nodes) == ["gpu-1"], timeout=30,
             what="selected objects")
    assert nodes.get(None, "gpu-1")["kind"] == "Node"

    core_v1.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"app": "other"}}})
    wait_for(lambda: names(labelled) == [], timeout=30, what="the relabelled pod to leave the label-selected cache")
    assert names(on_node) == ["a"]


def test_resumes_after_an_api_restart_without_relisting(kube, core_v1, informers):
    seen = Recorder()
    informer = informers(core_v1.list_namespaced_pod, namespace="default", on_event=seen, backoff_initial=0.05)
    core_v1.create_namespaced_pod("default", pod("one"))
    wait_for(lambda: informer.get("default", "one"), timeout=30, what="the first pod")

    kube.stop()
    # Changes made while the API is down (straight into the store) must arrive after it is back.
    kube.store.create(POD, "default", pod("two"))
    kube.store.delete(POD, "default", "one")
    failed = informer.failures
    wait_for(lambda: informer.failures > failed, timeout=30, what="the informer to meet the API down")
    kube.start()

    wait_for(lambda: names(informer) == ["two"], timeout=30, what="the changes made while the API was down")
    assert informer.relists == 1
    assert seen.kinds()[-2:] == [("ADDED", "two"), ("DELETED", "one")]


def test_relists_on_410_and_reports_the_difference(kube, core_v1, informers):
    core_v1.create_namespaced_pod("default", pod("stays"))
    core_v1.create_namespaced_pod("default", pod("goes"))
    core_v1.create_namespaced_pod("default", pod("changes"))
    seen = Recorder()
    informer = informers(core_v1.list_namespaced_pod, namespace="default", on_event=seen, backoff_initial=0.05)
    kube.stop()
    kube.store.delete(POD, "default", "goes")
    kube.store.patch(POD, "default", "changes", {"metadata": {"labels": {"v": "2"}}}, "application/merge-patch+json")
    kube.store.create(POD, "default", pod("new"))
    kube.store.compact()  # the informer's resourceVersion is now too old
    kube.start()

    wait_for(lambda: informer.relists == 2, timeout=30, what="a relist after 410")
    assert names(informer) == ["changes", "new", "stays"]
    assert informer.get("default", "changes")["metadata"]["labels"] == {"v": "2"}
    after_relist = seen.kinds()[seen.kinds().index(("RELISTED", None)) + 1:]
    assert sorted(after_relist[:-1]) == [("ADDED", "new"), ("DELETED", "goes"), ("MODIFIED", "changes")]
    assert after_relist[-1] == ("RELISTED", None)

    core_v1.create_namespaced_pod("default", pod("after"))
    wait_for(lambda: informer.get("default", "after"), timeout=30, what="events after the relist")


def test_never_misses_an_event_across_watch_timeouts_and_restarts(kube, core_v1, informers):
    seen = Recorder()
    informer = informers(core_v1.list_namespaced_pod, namespace="default", on_event=seen,
                         watch_timeout=1, backoff_initial=0.05)
    start_version = int(informer.resource_version)
    writes = 0

    def write(count: int) -> None:
        nonlocal writes
        client = kubernetes.client.CoreV1Api(kube.api_client())
        for i in range(count):
            name = f"w{writes}"
            client.create_namespaced_pod("default", pod(name))
            client.patch_namespaced_pod(name, "default", {"metadata": {"labels": {"i": str(i)}}})
            if i % 3 == 0:
                client.delete_namespaced_pod(name, "default")
            writes += 1
            time.sleep(0.02)

    write(30)  # spans at least one watch timeout at this pace on a loaded machine, or not: both must work
    kube.restart()
    write(30)
    end_version = kube.resource_version
    wait_for(lambda: int(informer.resource_version) >= end_version, timeout=30, what="the informer to catch up")

    versions = [int(v) for kind, _, v in seen.events if kind != "RELISTED" and v is not None]
    assert informer.relists == 1
    assert versions == list(range(start_version + 1, end_version + 1)), "an event was missed or repeated"
    assert names(informer) == sorted(p.metadata.name for p in core_v1.list_namespaced_pod("default").items)


def test_a_failing_callback_does_not_stop_the_cache(core_v1, informers):
    def explode(kind: str, obj: dict | None) -> None:
        raise RuntimeError("consumer bug")

    informer = informers(core_v1.list_namespaced_pod, namespace="default", on_event=explode)
    core_v1.create_namespaced_pod("default", pod("x"))
    core_v1.create_namespaced_pod("default", pod("y"))
    wait_for(lambda: names(informer) == ["x", "y"], timeout=30, what="both pods despite the callback failing")


def test_stop_ends_an_open_watch(core_v1):
    informer = Informer(core_v1.list_namespaced_pod, namespace="default").start()
    assert informer.wait_synced(30)
    thread = informer._thread
    informer.stop()
    assert thread is not None and not thread.is_alive()


def test_cyclic_gc_pauses_nest_and_restore_what_was_there() -> None:
    import gc

    from vgpu_plugin.informer import cyclic_gc_paused

    assert gc.isenabled()
    with cyclic_gc_paused():
        assert not gc.isenabled()
        with cyclic_gc_paused():  # a second informer listing at the same time
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer list is still being applied
    assert gc.isenabled()
    gc.disable()  # someone else's choice is kept
    try:
        with cyclic_gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_watch_events_decoded_once_are_what_the_client_would_give() -> None:
    """The informer's watch decodes each line once; what it yields and where a resumed watch would
    start are the official client's own answers (``Watch.unmarshal_event`` with return_type=object)."""
    import json

    from kubernetes import watch
    from vgpu_plugin.informer import _raw_watch

    labelled = {**pod("é-pod", {"team": "données"}), "apiVersion": "v1", "kind": "Pod"}
    labelled["metadata"].update(namespace="default", uid="u1", resourceVersion="41")
    lines = [json.dumps({"type": kind, "object": {**labelled, "metadata": {**labelled["metadata"],
                                                                          "resourceVersion": version}}},
                        ensure_ascii=ascii_only)
             for kind, version, ascii_only in (("ADDED", "41", True), ("MODIFIED", "42", False), ("DELETED", "43", True))]
    lines += [json.dumps({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                                                         "metadata": {"resourceVersion": "57"}}}),
              json.dumps({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                                      "status": "Failure", "message": "too old resource version",
                                                      "reason": "Expired", "code": 410}}),
              json.dumps({"type": "MODIFIED", "object": {"metadata": {"name": "no-version"}}}),
              "", "   \n", "{not json"]
    stock, ours = watch.Watch(return_type=object), _raw_watch()
    stock.resource_version = ours.resource_version = "1"
    for line in lines:
        expected = stock.unmarshal_event(line, object)
        assert ours.unmarshal_event(line, object) == expected, line
        assert ours.resource_version == stock.resource_version, line
    assert ours.resource_version == "57"  # the bookmark's; the ERROR and the version-less object moved nothing


def test_subset_index_follows_binds_deletes_and_relists(kube, core_v1, informers):
    def unbound(obj: dict) -> bool:
        return not (obj.get("spec") or {}).get("nodeName")

    def subset(informer: Informer) -> list[str]:
        return sorted(o["metadata"]["name"] for o in informer.subset_items())

    def bind(name: str) -> None:
        core_v1.create_namespaced_pod_binding(name, "default", {
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-1"}}, _preload_content=False)

    core_v1.create_namespaced_pod("default", pod("bound-before"))
    bind("bound-before")
    core_v1.create_namespaced_pod("default", pod("waits"))
    informer = informers(core_v1.list_namespaced_pod, namespace="default", subset=unbound, backoff_initial=0.05)
    assert subset(informer) == ["waits"]  # from the list

    core_v1.create_namespaced_pod("default", pod("new"))
    wait_for(lambda: subset(informer) == ["new", "waits"], timeout=30, what="an unbound pod added")
    bind("waits")
    wait_for(lambda: subset(informer) == ["new"], timeout=30, what="a bound pod leaving the subset")
    assert informer.get("default", "waits")["spec"]["nodeName"] == "gpu-1"  # still cached, only not indexed
    core_v1.delete_namespaced_pod("new", "default")
    wait_for(lambda: subset(informer) == [], timeout=30, what="a deleted pod leaving the subset")
    assert names(informer) == ["bound-before", "waits"]

    kube.stop()  # changes the watch never delivers: the relist after 410 must rebuild the index
    kube.store.create(POD, "default", pod("while-down"))
    kube.store.compact()
    kube.start()
    wait_for(lambda: informer.relists == 2, timeout=30, what="a relist after 410")
    assert subset(informer) == ["while-down"]
    assert names(informer) == ["bound-before", "waits", "while-down"]


def test_without_a_subset_every_object_is_in_it(core_v1, informers):
    core_v1.create_namespaced_pod("default", pod("a"))
    informer = informers(core_v1.list_namespaced_pod, namespace="default")
    assert [o["metadata"]["name"] for o in informer.subset_items()] == ["a"]
