"""The simulated Kubernetes API, driven through the official client and kubectl."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import threading
import urllib.error
import urllib.request

import kubernetes.client
import pytest
from kubernetes import watch
from kubernetes.client.exceptions import ApiException
from simkube.apiserver import SimKubeAPI
from simkube.waiting import wait_for


def pod(name: str, labels: dict[str, str] | None = None, **spec: object) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"containers": [{"name": "main", "image": "busybox"}], **spec}}


def node(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"gpu": "true"}},
            "status": {"capacity": {"cpu": "8"}, "allocatable": {"cpu": "8"}}}


def raw(response) -> dict:
    return json.loads(response.data)


def names(items) -> list[str]:
    return sorted(i["metadata"]["name"] if isinstance(i, dict) else i.metadata.name for i in items)


def events_since(core: kubernetes.client.CoreV1Api, rv: str, **kwargs) -> list[tuple[str, dict]]:
    """Every event a watch from ``rv`` replays (the stream closes after a second of quiet)."""
    stream = watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=rv,
                                  timeout_seconds=1, **kwargs)
    return [(e["type"], e["raw_object"]) for e in stream]


def bind(core: kubernetes.client.CoreV1Api, name: str, node_name: str, namespace: str = "default",
         annotations: dict[str, str] | None = None):
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "annotations": annotations or {}},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node_name}}
    # The API answers a Binding POST with a Status, which the client's Binding model cannot parse.
    return core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False)


# -- CRUD and object metadata -------------------------------------------------------------


def test_crud_through_the_official_client(core_v1):
    created = core_v1.create_namespaced_pod("default", pod("p1", {"app": "a"}))
    assert created.metadata.uid and created.metadata.creation_timestamp
    assert created.metadata.generation == 1
    assert created.status.phase == "Pending"
    assert created.spec.scheduler_name == "default-scheduler"

    fetched = core_v1.read_namespaced_pod("p1", "default")
    assert fetched.metadata.uid == created.metadata.uid

    with pytest.raises(ApiException) as exists:
        core_v1.create_namespaced_pod("default", pod("p1"))
    assert exists.value.status == 409 and json.loads(exists.value.body)["reason"] == "AlreadyExists"

    fetched.metadata.labels["app"] = "b"
    replaced = core_v1.replace_namespaced_pod("p1", "default", fetched)
    assert replaced.metadata.labels == {"app": "b"}
    assert int(replaced.metadata.resource_version) > int(created.metadata.resource_version)

    core_v1.delete_namespaced_pod("p1", "default", grace_period_seconds=0)
    with pytest.raises(ApiException) as missing:
        core_v1.read_namespaced_pod("p1", "default")
    assert missing.value.status == 404
    assert json.loads(missing.value.body)["message"] == 'pods "p1" not found'


def test_namespaces_must_exist_and_other_kinds_work(kube, core_v1):
    with pytest.raises(ApiException) as missing:
        core_v1.create_namespaced_config_map("nowhere", {"metadata": {"name": "c"}})
    assert missing.value.status == 404

    core_v1.create_namespace({"metadata": {"name": "jhub"}})
    core_v1.create_namespaced_config_map("jhub", {"metadata": {"name": "c"}, "data": {"k": "v"}})
    secret = core_v1.create_namespaced_secret("jhub", {"metadata": {"name": "s"}, "stringData": {"token": "abc"}})
    assert base64.b64decode(secret.data["token"]) == b"abc" and secret.type == "Opaque"
    core_v1.create_namespaced_service_account("jhub", {"metadata": {"name": "sa"}})
    service = core_v1.create_namespaced_service("jhub", {"metadata": {"name": "svc"},
                                                         "spec": {"ports": [{"port": 80}]}})
    assert service.spec.cluster_ip
    core_v1.create_namespaced_persistent_volume_claim("jhub", {
        "metadata": {"name": "claim"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    coordination = kubernetes.client.CoordinationV1Api(kube.api_client())
    lease = coordination.create_namespaced_lease("jhub", {"metadata": {"name": "leader"},
                                                         "spec": {"holderIdentity": "a"}})
    lease.spec.holder_identity = "b"
    assert coordination.replace_namespaced_lease("leader", "jhub", lease).spec.holder_identity == "b"

    # Deleting the namespace takes its contents with it.
    core_v1.delete_namespace("jhub")
    assert core_v1.list_config_map_for_all_namespaces().items == []
    assert core_v1.list_namespaced_secret("jhub").items == []


def test_resource_version_increases_on_every_write_and_lists_carry_it(core_v1):
    versions = []
    for i in range(3):
        versions.append(int(core_v1.create_namespaced_pod("default", pod(f"p{i}")).metadata.resource_version))
    patched = core_v1.patch_namespaced_pod("p0", "default", {"metadata": {"labels": {"x": "1"}}})
    versions.append(int(patched.metadata.resource_version))
    assert versions == sorted(set(versions))

    listing = raw(core_v1.list_namespaced_pod("default", _preload_content=False))
    assert int(listing["metadata"]["resourceVersion"]) == versions[-1]
    assert listing["kind"] == "PodList"

    # A patch that changes nothing is not a write.
    again = core_v1.patch_namespaced_pod("p0", "default", {"metadata": {"labels": {"x": "1"}}})
    assert int(again.metadata.resource_version) == versions[-1]


# -- selectors ----------------------------------------------------------------------------


def test_label_and_field_selectors_on_list(core_v1):
    core_v1.create_namespaced_pod("default", pod("a", {"app": "nb", "tier": "gpu"}))
    core_v1.create_namespaced_pod("default", pod("b", {"app": "nb"}, nodeName="n1"))
    core_v1.create_namespaced_pod("default", pod("c", {"app": "other"}, schedulerName="vgpu-scheduler"))

    def listed(**selectors) -> list[str]:
        return names(core_v1.list_namespaced_pod("default", **selectors).items)

    assert listed(label_selector="app=nb") == ["a", "b"]
    assert listed(label_selector="app==nb,tier=gpu") == ["a"]
    assert listed(label_selector="app!=nb") == ["c"]
    assert listed(label_selector="app in (nb, other)") == ["a", "b", "c"]
    assert listed(label_selector="app notin (nb)") == ["c"]
    assert listed(label_selector="tier") == ["a"]
    assert listed(label_selector="!tier") == ["b", "c"]
    assert listed(field_selector="spec.nodeName=n1") == ["b"]
    assert listed(field_selector="spec.nodeName=") == ["a", "c"]
    assert listed(field_selector="spec.nodeName!=n1,metadata.name!=a") == ["c"]
    assert listed(field_selector="spec.schedulerName==vgpu-scheduler") == ["c"]
    assert listed(field_selector="status.phase=Pending", label_selector="app=nb") == ["a", "b"]
    assert names(core_v1.list_pod_for_all_namespaces(field_selector="metadata.namespace=default").items) \
        == ["a", "b", "c"]

    for bad in ({"field_selector": "spec.hostname=x"}, {"label_selector": "app in (a"},
                {"label_selector": "bad key!=x"}):
        with pytest.raises(ApiException) as refused:
            core_v1.list_namespaced_pod("default", **bad)
        assert refused.value.status == 400


def test_watch_applies_selectors_and_turns_transitions_into_added_and_deleted(core_v1):
    start = core_v1.list_namespaced_pod("default").metadata.resource_version
    core_v1.create_namespaced_pod("default", pod("p", {"app": "nb"}))
    core_v1.create_namespaced_pod("default", pod("q", {"app": "nb"}))
    bind(core_v1, "p", "n1")
    bind(core_v1, "q", "n2")
    core_v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"app": "gone"}}})

    on_n1 = events_since(core_v1, start, field_selector="spec.nodeName=n1")
    assert [(t, o["metadata"]["name"]) for t, o in on_n1] == [("ADDED", "p"), ("MODIFIED", "p")]
    assert on_n1[0][1]["spec"]["nodeName"] == "n1"

    labelled = events_since(core_v1, start, label_selector="app=nb")
    assert [(t, o["metadata"]["name"]) for t, o in labelled] == [
        ("ADDED", "p"), ("ADDED", "q"), ("MODIFIED", "p"), ("MODIFIED", "q"), ("DELETED", "p")]


def test_live_watch_sees_changes_as_they_happen(kube, core_v1):
    seen: list[tuple[str, str]] = []
    stream_watch = watch.Watch()
    start = core_v1.list_namespaced_pod("default").metadata.resource_version

    def consume() -> None:
        for event in stream_watch.stream(core_v1.list_namespaced_pod, "default", resource_version=start,
                                         timeout_seconds=30):
            seen.append((event["type"], event["raw_object"]["metadata"]["name"]))
            if event["type"] == "DELETED":
                stream_watch.stop()

    consumer = threading.Thread(target=consume)
    consumer.start()
    wait_for(lambda: kube.call(lambda: len(kube.store.listeners)), timeout=30, interval=0.01,  # open on the server
             what="the watch to connect")
    core_v1.create_namespaced_pod("default", pod("live"))
    core_v1.patch_namespaced_pod("live", "default", {"metadata": {"annotations": {"a": "b"}}})
    core_v1.delete_namespaced_pod("live", "default", grace_period_seconds=0)
    consumer.join(30)
    assert not consumer.is_alive()
    assert seen == [("ADDED", "live"), ("MODIFIED", "live"), ("DELETED", "live")]


# -- resourceVersion resumption ---------------------------------------------------------------


def test_watch_resumes_after_a_resource_version_and_410_after_compaction(kube, core_v1):
    core_v1.create_namespaced_pod("default", pod("old"))
    after = core_v1.list_namespaced_pod("default").metadata.resource_version
    core_v1.create_namespaced_pod("default", pod("new"))
    core_v1.delete_namespaced_pod("old", "default")

    replayed = events_since(core_v1, after)
    assert [(t, o["metadata"]["name"]) for t, o in replayed] == [("ADDED", "new"), ("DELETED", "old")]
    versions = [int(o["metadata"]["resourceVersion"]) for _, o in replayed]
    assert versions == [int(after) + 1, int(after) + 2]

    kube.compact()
    with pytest.raises(ApiException) as gone:
        events_since(core_v1, after)
    assert gone.value.status == 410

    # The ERROR event itself, as the real API sends it on a 200 stream.
    response = core_v1.list_namespaced_pod("default", watch=True, resource_version=after,
                                           _preload_content=False)
    assert response.status == 200
    error = json.loads(response.readline())
    assert error["type"] == "ERROR"
    assert error["object"]["code"] == 410 and error["object"]["reason"] == "Expired"

    # A relist gives a version that can be watched from again.
    fresh = core_v1.list_namespaced_pod("default").metadata.resource_version
    core_v1.create_namespaced_pod("default", pod("later"))
    assert [o["metadata"]["name"] for _, o in events_since(core_v1, fresh)] == ["later"]


def test_bookmarks_are_sent_when_allowed():
    with SimKubeAPI(bookmark_interval=0.2) as api:
        core = kubernetes.client.CoreV1Api(api.api_client())
        response = core.list_namespaced_pod("default", watch=True, allow_watch_bookmarks=True,
                                            resource_version=str(api.resource_version),
                                            timeout_seconds=2, _preload_content=False)
        event = json.loads(response.readline())
        assert event["type"] == "BOOKMARK"
        assert event["object"]["metadata"]["resourceVersion"] == str(api.resource_version)
        response.release_conn()


# -- binding, patches, concurrency, status ------------------------------------------------------


def test_binding_sets_node_name_once(core_v1):
    core_v1.create_namespaced_pod("default", pod("nb"))
    response = bind(core_v1, "nb", "gpu-node-1", annotations={"tencent.com/predicate-node": "gpu-node-1"})
    assert response.status == 201
    assert raw(response) == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    bound = core_v1.read_namespaced_pod("nb", "default")
    assert bound.spec.node_name == "gpu-node-1"
    assert bound.metadata.annotations["tencent.com/predicate-node"] == "gpu-node-1"
    assert [(c.type, c.status) for c in bound.status.conditions] == [("PodScheduled", "True")]

    with pytest.raises(ApiException) as again:
        bind(core_v1, "nb", "gpu-node-2")
    assert again.value.status == 409
    assert "already assigned" in json.loads(again.value.body)["message"]
    assert core_v1.read_namespaced_pod("nb", "default").spec.node_name == "gpu-node-1"

    with pytest.raises(ApiException) as missing:
        bind(core_v1, "nobody", "gpu-node-1")
    assert missing.value.status == 404

    # The older collection form, POST .../bindings.
    core_v1.create_namespaced_pod("default", pod("nb2"))
    core_v1.create_namespaced_binding("default", {"metadata": {"name": "nb2"}, "target": {"name": "gpu-node-2"}},
                                      _preload_content=False)
    assert core_v1.read_namespaced_pod("nb2", "default").spec.node_name == "gpu-node-2"


def test_pod_spec_cannot_be_patched_into_a_node(core_v1):
    core_v1.create_namespaced_pod("default", pod("p"))
    with pytest.raises(ApiException) as refused:
        core_v1.patch_namespaced_pod("p", "default", {"spec": {"nodeName": "n1"}})
    assert refused.value.status == 422


def test_annotation_patches_keep_other_keys(kube, core_v1):
    core_v1.create_namespaced_pod("default", {**pod("p"), "metadata": {
        "name": "p", "annotations": {"keep": "me", "drop": "me"}, "labels": {"a": "1"}}})

    # A dict body goes as a strategic merge patch.
    core_v1.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"new": "1", "drop": None}}})
    # An explicit JSON merge patch, as kubectl annotate sends.
    request = urllib.request.Request(
        f"{kube.url}/api/v1/namespaces/default/pods/p", method="PATCH",
        data=json.dumps({"metadata": {"annotations": {"merge": "2"}}}).encode(),
        headers={"Content-Type": "application/merge-patch+json", **kube.auth_headers()})
    with urllib.request.urlopen(request, context=kube.ssl_context(), timeout=30) as response:
        assert json.load(response)["metadata"]["annotations"]["merge"] == "2"
    # A list body goes as a JSON patch.
    core_v1.patch_namespaced_pod("p", "default", [{"op": "add", "path": "/metadata/annotations/json", "value": "3"}])

    annotations = core_v1.read_namespaced_pod("p", "default").metadata.annotations
    assert annotations == {"keep": "me", "new": "1", "merge": "2", "json": "3"}


def test_stale_resource_version_conflicts(core_v1):
    first = core_v1.create_namespaced_pod("default", pod("p"))
    core_v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"v": "2"}}})

    stale = first
    stale.metadata.labels = {"v": "stale"}
    with pytest.raises(ApiException) as conflict:
        core_v1.replace_namespaced_pod("p", "default", stale)
    assert conflict.value.status == 409 and json.loads(conflict.value.body)["reason"] == "Conflict"

    with pytest.raises(ApiException) as conflict:
        core_v1.patch_namespaced_pod("p", "default", {"metadata": {
            "resourceVersion": first.metadata.resource_version, "annotations": {"x": "y"}}})
    assert conflict.value.status == 409
    assert core_v1.read_namespaced_pod("p", "default").metadata.labels == {"v": "2"}

    current = core_v1.read_namespaced_pod("p", "default").metadata.resource_version
    ok = core_v1.patch_namespaced_pod("p", "default", {"metadata": {"resourceVersion": current,
                                                                   "annotations": {"x": "y"}}})
    assert ok.metadata.annotations == {"x": "y"}


def test_a_write_naming_a_replaced_pods_uid_is_refused_as_the_api_server_does(core_v1):
    """A pod deleted and created again under its name (a restarted JupyterHub server) is another
    object: a write carrying the old one's UID changes nothing. PATCH (also of /status): 422 from
    validation, metadata.uid being immutable; PUT: 409, its body's UID being a precondition."""
    old = core_v1.create_namespaced_pod("default", pod("jupyter-alice"))
    core_v1.delete_namespaced_pod("jupyter-alice", "default", grace_period_seconds=0)
    new = core_v1.create_namespaced_pod("default", pod("jupyter-alice"))
    stale = old.metadata.uid
    assert new.metadata.uid != stale

    for write in (core_v1.patch_namespaced_pod, core_v1.patch_namespaced_pod_status):
        with pytest.raises(ApiException) as refused:
            write("jupyter-alice", "default", {"metadata": {"uid": stale, "annotations": {"served": "true"}},
                                               "status": {"phase": "Running"}})
        status = json.loads(refused.value.body)
        assert refused.value.status == 422 and status["reason"] == "Invalid"
        assert status["message"] == (f'Pod "jupyter-alice" is invalid: metadata.uid: Invalid value: "{stale}": '
                                     f"field is immutable")
        assert status["details"]["causes"] == [{"reason": "FieldValueInvalid", "field": "metadata.uid",
                                                "message": f'Invalid value: "{stale}": field is immutable'}]
    old.metadata.resource_version = None
    with pytest.raises(ApiException) as refused:
        core_v1.replace_namespaced_pod("jupyter-alice", "default", old)
    assert refused.value.status == 409 and f"UID in precondition: {stale}" in json.loads(refused.value.body)["message"]
    kept = core_v1.read_namespaced_pod("jupyter-alice", "default")
    assert kept.metadata.uid == new.metadata.uid and not kept.metadata.annotations and kept.status.phase == "Pending"
    assert kept.metadata.resource_version == new.metadata.resource_version

    # its own UID, or none, is the pod it names
    patched = core_v1.patch_namespaced_pod("jupyter-alice", "default", {"metadata": {
        "uid": new.metadata.uid, "annotations": {"served": "true"}}})
    assert patched.metadata.annotations == {"served": "true"} and patched.metadata.uid == new.metadata.uid
    patched.metadata.labels = {"v": "2"}
    assert core_v1.replace_namespaced_pod("jupyter-alice", "default", patched).metadata.labels == {"v": "2"}


def test_status_goes_through_the_status_subresource(core_v1):
    core_v1.create_namespaced_pod("default", pod("p"))
    core_v1.patch_namespaced_pod("p", "default", {"status": {"phase": "Running"}})
    assert core_v1.read_namespaced_pod("p", "default").status.phase == "Pending"

    patched = core_v1.patch_namespaced_pod_status("p", "default", {"status": {
        "phase": "Running", "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0,
                                                   "image": "busybox", "imageID": "",
                                                   "containerID": "containerd://abc"}]}})
    assert patched.status.phase == "Running"
    assert patched.status.container_statuses[0].container_id == "containerd://abc"
    assert core_v1.list_namespaced_pod("default", field_selector="status.phase=Running").items[0].metadata.name == "p"

    core_v1.create_node(node("n1"))
    core_v1.patch_node_status("n1", {"status": {"capacity": {"tencent.com/vcuda-core": "400"},
                                                "allocatable": {"tencent.com/vcuda-core": "400"}}})
    status = core_v1.read_node_status("n1").status
    assert status.capacity == {"cpu": "8", "tencent.com/vcuda-core": "400"}
    assert status.allocatable["tencent.com/vcuda-core"] == "400"


def test_events_and_deletion(core_v1):
    core_v1.create_namespaced_pod("default", pod("p"))
    core_v1.create_namespaced_event("default", {
        "metadata": {"name": "p.1"}, "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
        "reason": "FailedScheduling", "message": "0/3 nodes are available", "type": "Warning"})
    core_v1.create_namespaced_event("default", {
        "metadata": {"name": "q.1"}, "involvedObject": {"kind": "Pod", "name": "q", "namespace": "default"},
        "reason": "Scheduled", "message": "ok", "type": "Normal"})
    about_p = core_v1.list_namespaced_event("default", field_selector="involvedObject.name=p").items
    assert [(e.reason, e.message) for e in about_p] == [("FailedScheduling", "0/3 nodes are available")]

    # Finalizers hold an object until they are removed.
    core_v1.create_namespaced_config_map("default", {"metadata": {"name": "held", "finalizers": ["x/y"]}})
    core_v1.delete_namespaced_config_map("held", "default")
    assert core_v1.read_namespaced_config_map("held", "default").metadata.deletion_timestamp
    core_v1.patch_namespaced_config_map("held", "default", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException):
        core_v1.read_namespaced_config_map("held", "default")


def test_faults_can_be_injected_with_kmock_reactions(kube, core_v1):
    kube.emulator["get", "/api/v1/namespaces/default/pods/flaky"] << 503
    with pytest.raises(ApiException) as failed:
        core_v1.read_namespaced_pod("flaky", "default")
    assert failed.value.status == 503


def test_restart_keeps_objects_port_and_versions():
    api = SimKubeAPI().start()
    try:
        core = kubernetes.client.CoreV1Api(api.api_client())
        core.create_namespaced_pod("default", pod("survivor"))
        port, version = api.port, api.resource_version
        api.restart()
        assert api.port == port
        assert core.read_namespaced_pod("survivor", "default").metadata.resource_version == str(version)
    finally:
        api.stop()


# -- kubectl ------------------------------------------------------------------------------------


@pytest.fixture
def kubectl(kube, tmp_path):
    def run(*args: str, stdin: str | None = None) -> str:
        result = subprocess.run(["kubectl", "--kubeconfig", kube.kubeconfig, "--cache-dir",
                                 str(tmp_path / "kubectl-cache"), *args],
                                capture_output=True, text=True, input=stdin, timeout=120)
        assert result.returncode == 0, f"kubectl {' '.join(args)} failed: {result.stderr}"
        return result.stdout
    return run


def test_kubectl_works_against_the_generated_kubeconfig(kube, core_v1, kubectl, tmp_path):
    manifest = tmp_path / "pod.yaml"
    manifest.write_text("apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels: {app: web}\n"
                        "spec:\n  containers:\n  - name: c\n    image: nginx\n")
    assert "pod/web created" in kubectl("apply", "-f", str(manifest))
    manifest.write_text(manifest.read_text().replace("{app: web}", "{app: web, tier: front}"))
    assert "pod/web configured" in kubectl("apply", "-f", str(manifest))
    assert core_v1.read_namespaced_pod("web", "default").metadata.labels == {"app": "web", "tier": "front"}

    core_v1.create_namespace({"metadata": {"name": "other"}})
    core_v1.create_namespaced_pod("other", pod("elsewhere"))
    listing = json.loads(kubectl("get", "pods", "-A", "-o", "json"))
    assert sorted((i["metadata"]["namespace"], i["metadata"]["name"]) for i in listing["items"]) == [
        ("default", "web"), ("other", "elsewhere")]

    assert "pod/web annotated" in kubectl("annotate", "pod", "web", "vgpu/note=hello")
    annotations = core_v1.read_namespaced_pod("web", "default").metadata.annotations
    assert annotations["vgpu/note"] == "hello"
    assert "kubectl.kubernetes.io/last-applied-configuration" in annotations

    kubectl("create", "-f", "-", stdin=json.dumps(node("gpu-1")))
    assert "gpu-1" in kubectl("get", "nodes")
    assert json.loads(kubectl("get", "nodes", "-l", "gpu=true", "-o", "json"))["items"][0]["metadata"]["name"] \
        == "gpu-1"
    assert kubectl("get", "pods", "--field-selector", "spec.nodeName=", "-o", "name").split() == ["pod/web"]
    assert "deleted" in kubectl("delete", "pod", "web")


def test_discovery_and_version_answer_the_official_client(core_v1, kube):
    assert kubernetes.client.VersionApi(kube.api_client()).get_code().major == "1"
    resources = {r.name: r for r in core_v1.get_api_resources().resources}
    assert resources["pods"].namespaced and not resources["nodes"].namespaced
    assert resources["pods/binding"].verbs == ["create"]
    groups = {g.name for g in kubernetes.client.ApisApi(kube.api_client()).get_api_versions().groups}
    assert {"coordination.k8s.io", "apps", "events.k8s.io"} <= groups


@pytest.mark.parametrize(("containers", "init", "qos"), [
    # a notebook asking only for vGPU resources: extended resources never count
    ([{"limits": {"tencent.com/vcuda-core": "25", "tencent.com/vcuda-memory": "16"}}], [], "BestEffort"),
    ([{}], [], "BestEffort"),
    ([{"requests": {"cpu": "0", "memory": "0"}}], [], "BestEffort"),  # zero is unset
    ([{"limits": {"tencent.com/vcuda-core": "25", "cpu": "1", "memory": "1Gi"}}], [], "Guaranteed"),
    # requests default to limits; quantities compare by value
    ([{"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "1000m", "memory": "1024Mi"}}], [], "Guaranteed"),
    ([{"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "500m"}}], [], "Burstable"),
    ([{"limits": {"tencent.com/vcuda-core": "100", "cpu": "2"}}], [], "Burstable"),  # no memory limit
    ([{"requests": {"cpu": "100m"}}], [], "Burstable"),
    ([{"limits": {"cpu": "1", "memory": "1Gi"}}, {}], [], "Burstable"),  # one container without limits
    ([{"limits": {"cpu": "1", "memory": "1Gi"}}], [{}], "Burstable"),  # init containers count too
    ([{"limits": {"cpu": "1", "memory": "1Gi"}}], [{"limits": {"cpu": "0.5", "memory": "512Mi"}}], "Guaranteed"),
])
def test_qos_class_counts_only_cpu_and_memory(core_v1, containers, init, qos):
    spec = {"containers": [{"name": f"c{i}", "image": "busybox", "resources": r} for i, r in enumerate(containers)]}
    if init:
        spec["initContainers"] = [{"name": f"init{i}", "image": "busybox", "resources": r} for i, r in enumerate(init)]
    created = core_v1.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod",
                                                        "metadata": {"name": "qos"}, "spec": spec})
    assert created.status.qos_class == qos
    assert core_v1.read_namespaced_pod("qos", "default").status.qos_class == qos


def columns(output: str) -> tuple[list[str], list[list[str]]]:
    """kubectl's printed table: the header's names and each row's cells (split on 2+ spaces)."""
    lines = [line for line in output.splitlines() if line.strip()]
    split = [[cell for cell in re.split(r"\s{2,}", line.strip())] for line in lines]
    return split[0], split[1:]


def test_kubectl_prints_the_columns_of_a_real_cluster(kube, core_v1, kubectl):
    """Pods, nodes and events come back as meta.k8s.io Tables: kubectl prints STATUS, NODE, ..."""
    kubectl("create", "-f", "-", stdin=json.dumps({
        **node("gpu-1"), "metadata": {"name": "gpu-1", "labels": {"node-role.kubernetes.io/worker": ""}}}))
    core_v1.patch_node_status("gpu-1", {"status": {
        "conditions": [{"type": "Ready", "status": "True"}], "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}],
        "nodeInfo": {"kubeletVersion": "v1.32.0", "osImage": "Debian", "kernelVersion": "6.1", "containerRuntimeVersion":
                     "containerd://1.7", "machineID": "", "systemUUID": "", "bootID": "", "kubeProxyVersion": "",
                     "operatingSystem": "linux", "architecture": "amd64"}}})
    core_v1.create_namespaced_pod("default", pod("nb", nodeName="gpu-1"))
    core_v1.create_namespaced_pod("default", pod("waiting"))
    core_v1.patch_namespaced_pod_status("nb", "default", {"status": {
        "phase": "Running", "podIP": "10.1.0.5",
        "containerStatuses": [{"name": "main", "ready": True, "restartCount": 2, "image": "busybox", "imageID": "",
                               "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}})

    header, rows = columns(kubectl("get", "pods", "-o", "wide"))
    assert header == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE", "NOMINATED NODE", "READINESS GATES"]
    by_name = {row[0]: row for row in rows}
    assert by_name["nb"][1:4] == ["1/1", "Running", "2"] and by_name["nb"][5:] == ["10.1.0.5", "gpu-1", "<none>",
                                                                                    "<none>"]
    assert by_name["waiting"][1:4] == ["0/1", "Pending", "0"] and by_name["waiting"][6] == "<none>"
    assert columns(kubectl("get", "pods"))[0] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]  # priority 0 only
    assert columns(kubectl("get", "pod", "nb", "-o", "wide"))[1][0][6] == "gpu-1"  # one object: a one-row Table

    header, rows = columns(kubectl("get", "nodes", "-o", "wide"))
    assert header[:7] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION", "INTERNAL-IP", "EXTERNAL-IP"]
    assert rows[0][:3] == ["gpu-1", "Ready", "worker"] and rows[0][4:6] == ["v1.32.0", "10.0.0.7"]

    core_v1.create_namespaced_event("default", {
        "metadata": {"name": "nb.1"}, "involvedObject": {"kind": "Pod", "name": "nb", "namespace": "default"},
        "reason": "Scheduled", "message": "Successfully assigned default/nb to gpu-1", "type": "Normal",
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z", "count": 1,
        "source": {"component": "default-scheduler"}})
    header, rows = columns(kubectl("get", "events"))
    assert header == ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert rows[0][1:] == ["Normal", "Scheduled", "pod/nb", "Successfully assigned default/nb to gpu-1"]

    # the same Table to a raw client; a bad includeObject is a 400, not a crash
    def table(include: str):
        request = urllib.request.Request(f"{kube.url}/api/v1/namespaces/default/pods?includeObject={include}",
                                         headers={**kube.auth_headers(),
                                                  "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
        with urllib.request.urlopen(request, context=kube.ssl_context(), timeout=30) as response:
            return json.loads(response.read())

    for include, kind in (("Object", "Pod"), ("Metadata", "PartialObjectMetadata")):
        answer = table(include)
        assert (answer["kind"], answer["apiVersion"]) == ("Table", "meta.k8s.io/v1")
        assert {row["object"]["kind"] for row in answer["rows"]} == {kind}
    # kubectl get -w: each watch event's object is a one-row Table
    request = urllib.request.Request(f"{kube.url}/api/v1/namespaces/default/pods?watch=1&timeoutSeconds=1",
                                     headers={**kube.auth_headers(),
                                              "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
    with urllib.request.urlopen(request, context=kube.ssl_context(), timeout=30) as response:
        events = [json.loads(line) for line in response.read().splitlines() if line.strip()]
    rows = {e["object"]["rows"][0]["cells"][0]: e["object"]["rows"][0]["cells"] for e in events}
    assert {e["type"] for e in events} == {"ADDED"} and {e["object"]["kind"] for e in events} == {"Table"}
    assert rows["nb"][2] == "Running" and rows["nb"][6] == "gpu-1"
    with pytest.raises(urllib.error.HTTPError) as refused:
        table("All")
    assert refused.value.code == 400 and json.loads(refused.value.read())["reason"] == "BadRequest"


@pytest.mark.parametrize(("seconds", "printed"), [
    (-5, "<invalid>"), (0, "0s"), (119, "119s"), (125, "2m5s"), (600, "10m"), (3 * 3600 + 60, "3h1m"),
    (9 * 3600, "9h"), (3 * 86400 + 3600, "3d1h"), (30 * 86400, "30d"), (3 * 365 * 86400 + 86400, "3y1d")])
def test_ages_print_as_kubectl_prints_them(seconds, printed):
    from simkube.tables import human_duration
    assert human_duration(seconds) == printed


def test_a_watch_pinned_to_a_node_sees_its_pods_through_many_changes_it_is_not_woken_for():
    # the watch is woken only by changes to pods on its node (and every 500 others, to keep its
    # place in the history): 700 other changes in a history of 600 must not make it fall behind
    with SimKubeAPI(history=600) as api:
        core = kubernetes.client.CoreV1Api(api.api_client())
        seen: list[tuple[str, str, str]] = []
        start = str(api.resource_version)

        def consume() -> None:
            pinned = watch.Watch()
            for event in pinned.stream(core.list_pod_for_all_namespaces, field_selector="spec.nodeName==n1",
                                       resource_version=start, timeout_seconds=60):
                obj = event["raw_object"]
                seen.append((event["type"], obj["metadata"].get("name", ""), obj.get("spec", {}).get("nodeName", "")))
                if event["type"] in ("DELETED", "ERROR"):
                    pinned.stop()

        consumer = threading.Thread(target=consume)
        consumer.start()
        wait_for(lambda: api.call(lambda: len(api.store.listeners)), timeout=30, interval=0.01,
                 what="the watch to connect")
        for name, target in (("here", "n1"), ("there", "n2")):
            core.create_namespaced_pod("default", pod(name))
            bind(core, name, target)
        for i in range(700):
            core.create_namespaced_config_map("default", {"metadata": {"name": f"cm-{i}"}})
            if i % 100 == 0:
                core.patch_namespaced_pod("there", "default", {"metadata": {"annotations": {"i": str(i)}}})
        core.patch_namespaced_pod("here", "default", {"metadata": {"annotations": {"a": "b"}}})
        core.delete_namespaced_pod("here", "default", grace_period_seconds=0)
        consumer.join(30)
        assert not consumer.is_alive()
        assert seen == [("ADDED", "here", "n1"), ("MODIFIED", "here", "n1"), ("DELETED", "here", "n1")]
