"""Bind's Kubernetes calls (cluster.KubePodAPI) against the simulated API through the official
client: the GET and the Binding go through the client's ApiClient without its generated methods,
so what they send, what they return and how they fail are checked here against the generated
methods' own answers to the same requests."""

from __future__ import annotations

import json
from typing import Any

import kubernetes.client
import pytest
from extender_support import pod
from kubernetes.client.exceptions import ApiException
from simkube.client import api_client
from vgpu_plugin.extender.cluster import KubePodAPI
from vgpu_plugin.extender.decisions import APIFailure


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


@pytest.fixture
def created(kube: Any, core_v1: Any) -> dict[str, Any]:
    core_v1.create_node(node("n1"))
    response = core_v1.create_namespaced_pod("default", pod("p1"), _preload_content=False)
    return json.loads(response.data)


def generated_status(call: Any) -> tuple[int, str]:
    """The status and message the generated method's ApiException carries for the same request."""
    with pytest.raises(ApiException) as raised:
        call()
    return raised.value.status, json.loads(raised.value.body)["message"]


def test_get_pod_returns_the_pod_as_the_generated_method_reads_it(kube, core_v1, created):
    api = KubePodAPI(kube.api_client())
    read = api.get_pod("default", "p1")
    assert read == json.loads(core_v1.read_namespaced_pod("p1", "default", _preload_content=False).data)
    assert read["metadata"]["uid"] == created["metadata"]["uid"]
    assert api.get_pod("default", "no-such-pod") is None
    assert api.get_pod("other", "p1") is None


def test_bind_sets_the_node_and_copies_the_annotations(kube, core_v1, created):
    api = KubePodAPI(kube.api_client())
    api.bind("default", "p1", created["metadata"]["uid"], "n1", {"example.com/card": "0"})
    now = json.loads(core_v1.read_namespaced_pod("p1", "default", _preload_content=False).data)
    assert now["spec"]["nodeName"] == "n1"
    assert now["metadata"]["annotations"]["example.com/card"] == "0"


def test_refusals_carry_the_status_and_message_the_generated_methods_see(kube, core_v1, created):
    api = KubePodAPI(kube.api_client())
    binding = {"apiVersion": "v1", "kind": "Binding",
               "metadata": {"name": "p1", "namespace": "default", "uid": "not-its-uid"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}
    status, message = generated_status(lambda: core_v1.create_namespaced_pod_binding("p1", "default", binding))
    assert status == 409
    with pytest.raises(APIFailure) as refused:
        api.bind("default", "p1", "not-its-uid", "n1")
    assert refused.value.status == 409
    assert str(refused.value) == f"binding the pod: 409 {message}"
    assert core_v1.read_namespaced_pod("p1", "default").spec.node_name is None

    api.bind("default", "p1", created["metadata"]["uid"], "n1")
    with pytest.raises(APIFailure) as again:  # bound already: the API refuses a second binding
        api.bind("default", "p1", created["metadata"]["uid"], "n2")
    assert again.value.status == 409
    assert core_v1.read_namespaced_pod("p1", "default").spec.node_name == "n1"

    with pytest.raises(APIFailure) as missing:
        api.bind("default", "no-such-pod", "", "n1")
    assert missing.value.status == 404


def test_the_configured_token_and_certificate_are_what_lets_the_calls_in(kube, created):
    wrong_token = KubePodAPI(api_client(kube.url, "not-the-token", kube.identity.cert_pem))
    with pytest.raises(APIFailure) as refused:
        wrong_token.get_pod("default", "p1")
    assert refused.value.status == 401
    with pytest.raises(APIFailure) as unbound:
        wrong_token.bind("default", "p1", created["metadata"]["uid"], "n1")
    assert unbound.value.status == 401

    configuration = kubernetes.client.Configuration()
    configuration.host = kube.url
    configuration.api_key = {"authorization": f"Bearer {kube.token}"}  # no CA: the server is not trusted
    configuration.retries = 0
    untrusted = KubePodAPI(kubernetes.client.ApiClient(configuration), timeout=5)
    with pytest.raises(APIFailure) as unverified:
        untrusted.get_pod("default", "p1")
    assert unverified.value.status is None
    assert "SSL" in str(unverified.value) or "certificate" in str(unverified.value)
    assert KubePodAPI(kube.api_client()).get_pod("default", "p1") is not None


def test_no_answer_is_a_failure_without_a_status(kube, created):
    url = kube.url
    kube.stop()
    configuration = kubernetes.client.Configuration()
    configuration.host = url
    configuration.retries = 0
    with pytest.raises(APIFailure) as unreachable:
        KubePodAPI(kubernetes.client.ApiClient(configuration), timeout=2).get_pod("default", "p1")
    assert unreachable.value.status is None
    assert str(unreachable.value).startswith("reading the pod: ")
