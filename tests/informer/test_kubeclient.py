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
