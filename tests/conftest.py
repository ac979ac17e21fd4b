"""Fixtures shared by every test area.

- ``kube``, ``kube_session``, ``core_v1``: the simulated Kubernetes API, from simkube's
  pytest plugin (``simkube.pytest_plugin``; named here so a checkout needs no install).
- ``topology_fixtures``: the directory of real ``nvidia-smi topo -m`` captures.
- ``kubespawner_kubeconfig``: KubeSpawner loads a kubeconfig when constructed; this gives it
  one pointing at a closed port (unit tests never reach an API). Returns its path.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from jupyter_vgpu.data import TOPOLOGY_DIR

REPO = pathlib.Path(__file__).resolve().parent.parent

pytest_plugins = ["simkube.pytest_plugin"]


@pytest.fixture(scope="session")
def topology_fixtures() -> pathlib.Path:
    return TOPOLOGY_DIR


@pytest.fixture
def kubespawner_kubeconfig(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> str:
    from kubernetes_asyncio.config import kube_config

    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": "http://127.0.0.1:9"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "users": [{"name": "test", "user": {"token": "unused"}}],
    }))
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return str(path)
