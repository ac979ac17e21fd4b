"""kubeclient.load finds the configuration the way kubectl does."""

from __future__ import annotations

import kubernetes.client
import pytest
from vgpu_plugin import kubeclient


def test_explicit_path_and_kubeconfig_env(kube, monkeypatch):
    client = kubeclient.load(kube.kubeconfig)
    assert kubernetes.client.CoreV1Api(client).read_namespace("default").status.phase == "Active"

    monkeypatch.setenv("KUBECONFIG", f"/nonexistent/config:{kube.kubeconfig}")
    from_env = kubeclient.load()
    assert from_env.configuration.host == kube.url


def test_no_configuration_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(kubeclient.KubeConfigError, match="no Kubernetes configuration"):
        kubeclient.load()

    broken = tmp_path / "broken"
    broken.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    with pytest.raises(kubeclient.KubeConfigError, match=str(broken)):
        kubeclient.load(str(broken))


def test_the_credential_hook_runs_at_most_once_a_second(kube):
    client = kubeclient.load(kube.kubeconfig)
    assert client.configuration.refresh_api_key_hook is not None  # the kubeconfig's token
    core = kubernetes.client.CoreV1Api(client)
    for _ in range(3):  # still authenticated on every call
        assert core.read_namespace("default").status.phase == "Active"

    # the kubeconfig loader's hook installs a fresh copy of itself each time it runs: followed, still throttled
    now = [100.0]
    calls = []

    class Configuration:
        refresh_api_key_hook = None

    def loader_hook(generation: int):
        def hook(configuration):
            calls.append(generation)
            configuration.refresh_api_key_hook = loader_hook(generation + 1)
        return hook

    configuration = Configuration()
    configuration.refresh_api_key_hook = kubeclient.refresh_at_most_every(loader_hook(1), 1.0, clock=lambda: now[0])
    for at in (100.0, 100.5, 100.99, 101.0, 101.2, 102.5):
        now[0] = at
        configuration.refresh_api_key_hook(configuration)
    assert calls == [1, 2, 3]  # at 100.0, 101.0 and 102.5, each time the copy the last run installed
