"""The simulated API lets in only holders of its token, over TLS: pods it stores can become
real processes (the kubelet stand-in's run-processes mode), so no other local user may
create or even list them."""

from __future__ import annotations

import json
import os
import ssl
import stat
import subprocess
import urllib.error
import urllib.request

import kubernetes.client
import pytest
from kubernetes.client.rest import ApiException
from simkube.apiserver import UNAUTHORIZED, SimKubeAPI

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "intruder"},
       "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", "id"]}]}}

# (method, path, body): list, create and watch, the three a local attacker would need
REQUESTS = [
    ("GET", "/api/v1/pods", None),
    ("POST", "/api/v1/namespaces/default/pods", POD),
    ("GET", "/api/v1/namespaces/default/pods?watch=1&timeoutSeconds=5", None),
    ("GET", "/version", None),
]

WRONG = [
    None,  # no Authorization header at all
    "Bearer not-the-token",
    "Bearer ",
    "Basic dmdwdTpzaW0=",
    "token {token}",  # the right secret under the wrong scheme
    "Bearer {token}x",  # a longer secret that starts with the right one
]


def send(kube: SimKubeAPI, method: str, path: str, body: object = None,
         authorization: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    request = urllib.request.Request(kube.url + path, method=method, headers=headers,
                                     data=json.dumps(body).encode() if body is not None else None)
    try:
        with urllib.request.urlopen(request, context=kube.ssl_context(), timeout=30) as response:
            return response.status, json.loads(response.readline() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize("authorization", WRONG)
@pytest.mark.parametrize(("method", "path", "body"), REQUESTS)
def test_requests_without_the_token_get_401_and_change_nothing(kube, core_v1, method, path, body, authorization):
    core_v1.create_namespaced_pod("default", {**POD, "metadata": {"name": "existing"}})
    version = kube.resource_version
    if authorization is not None:
        authorization = authorization.format(token=kube.token)

    status, answer = send(kube, method, path, body, authorization)

    assert (status, answer) == (401, UNAUTHORIZED)
    assert answer["kind"] == "Status" and answer["reason"] == "Unauthorized" and answer["code"] == 401
    assert kube.resource_version == version
    assert [p.metadata.name for p in core_v1.list_pod_for_all_namespaces().items] == ["existing"]


def test_the_token_lets_raw_clients_in(kube):
    status, created = send(kube, "POST", "/api/v1/namespaces/default/pods", POD, kube.auth_headers()["Authorization"])
    assert status == 201 and created["metadata"]["name"] == "intruder"
    status, first = send(kube, "GET", "/api/v1/namespaces/default/pods?watch=1&timeoutSeconds=5",
                         authorization=kube.auth_headers()["Authorization"])
    assert status == 200 and (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "intruder")


def test_another_instances_token_and_client_are_refused(kube, core_v1):
    other = SimKubeAPI()
    assert other.token != kube.token, "tokens are random per instance"
    assert send(kube, "GET", "/api/v1/pods", authorization=other.auth_headers()["Authorization"])[0] == 401

    anonymous = kubernetes.client.Configuration()
    anonymous.host, anonymous.ca_cert_data = kube.url, kube.identity.cert_pem.decode()
    with pytest.raises(ApiException) as refused:
        kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(anonymous)).create_namespaced_pod("default", POD)
    assert refused.value.status == 401 and json.loads(refused.value.body) == UNAUTHORIZED
    assert core_v1.list_pod_for_all_namespaces().items == []


def test_plain_http_and_unverified_certificates_get_nothing(kube):
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(kube.url.replace("https://", "http://") + "/api/v1/pods", timeout=30)
    with pytest.raises(urllib.error.URLError) as untrusted:  # the system trust store does not know it
        urllib.request.urlopen(urllib.request.Request(kube.url + "/api/v1/pods", headers=kube.auth_headers()),
                               context=ssl.create_default_context(), timeout=30)
    assert isinstance(untrusted.value.reason, ssl.SSLCertVerificationError)


def test_token_can_be_chosen_and_survives_a_restart(tmp_path):
    with pytest.raises(ValueError, match="token"):
        SimKubeAPI(token="")
    with pytest.raises(ValueError, match="token"):
        SimKubeAPI(token="has space")
    api = SimKubeAPI(token="chosen-token").start()
    try:
        core = kubernetes.client.CoreV1Api(api.api_client())
        assert api.auth_headers() == {"Authorization": "Bearer chosen-token"}
        api.restart()
        assert core.read_namespace("default").metadata.name == "default"
        assert send(api, "GET", "/api/v1/pods", authorization="Bearer chosen-token")[0] == 200
    finally:
        api.stop()


def test_kubeconfig_holds_token_and_certificate_and_only_its_owner_reads_it(kube, tmp_path):
    path = tmp_path / "existing-kubeconfig"
    path.write_text("old")
    os.chmod(path, 0o644)
    kube.write_kubeconfig(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(kube.kubeconfig).st_mode) == 0o600
    (user,) = json.loads(path.read_text())["users"]
    assert user["user"] == {"token": kube.token}

    from kubernetes import config

    core = kubernetes.client.CoreV1Api(config.new_client_from_config(config_file=str(path)))
    assert core.read_namespace("default").metadata.name == "default"


def kubectl(kubeconfig: str, cache: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "--cache-dir", cache, *args],
                          capture_output=True, text=True, timeout=120)


def test_kubectl_needs_the_token_from_the_kubeconfig(kube, core_v1, tmp_path):
    cache = str(tmp_path / "kubectl-cache")
    created = kubectl(kube.kubeconfig, cache, "run", "web", "--image=nginx", "--restart=Never")
    assert created.returncode == 0, created.stderr
    assert core_v1.read_namespaced_pod("web", "default").spec.containers[0].image == "nginx"

    config = json.loads(open(kube.kubeconfig).read())
    config["users"][0]["user"] = {"token": "guessed"}  # (with none at all kubectl prompts for a password)
    guessed = tmp_path / "guessed-token"
    guessed.write_text(json.dumps(config))
    refused = kubectl(str(guessed), cache, "run", "intruder", "--image=busybox", "--restart=Never")
    assert refused.returncode != 0 and "Unauthorized" in refused.stderr, refused.stderr
    assert [p.metadata.name for p in core_v1.list_pod_for_all_namespaces().items] == ["web"]
