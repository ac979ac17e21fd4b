"""KubeSpawner loads a kubeconfig when constructed; give it one pointing at a closed port
(unit tests never reach the API) unless a test points it at the simulated cluster."""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio.config import kube_config


def write_kubeconfig(path, server: str) -> str:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "users": [{"name": "test", "user": {"token": "unused"}}],
    }))
    return str(path)


@pytest.fixture(autouse=True)
def kubespawner_kubeconfig(tmp_path, monkeypatch):
    path = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", path)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return path
