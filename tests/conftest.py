"""Fixtures shared by every test area.

- ``kube``, ``kube_session``, ``core_v1``: the simulated Kubernetes API, from simkube's
  pytest plugin (``simkube.pytest_plugin``; named here so a checkout needs no install).
- ``topology_fixtures``: the directory of real ``nvidia-smi topo -m`` captures.
- ``kubespawner_kubeconfig``: KubeSpawner loads a kubeconfig when constructed; this gives it
  one pointing at a closed port (unit tests never reach an API). Returns its path.
- ``helm_program``: the ``helm`` hack/helm builds (Helm at its go.mod's pin), or $VGPU_HELM_BIN.
  scripts/test.sh builds it before pytest starts; when pytest runs directly, the collection hook
  below builds it (minutes cold, outside any test's timeout) if a collected test needs it.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from jupyter_vgpu.data import TOPOLOGY_DIR

REPO = pathlib.Path(__file__).resolve().parent.parent

pytest_plugins = ["simkube.pytest_plugin"]


@pytest.fixture(scope="session")
def topology_fixtures() -> pathlib.Path:
    return TOPOLOGY_DIR


def pytest_collection_finish(session: pytest.Session) -> None:
    if not os.environ.get("VGPU_HELM_BIN") and any(
            "helm_program" in getattr(item, "fixturenames", ()) for item in session.items):
        from vgpu_plugin.realkube.binaries import BinariesError, helm_bin

        try:
            os.environ["VGPU_HELM_BIN"] = str(helm_bin())
        except BinariesError:  # no Go here: the tests that need helm fail with the reason, the rest run
            pass


@pytest.fixture(scope="session")
def helm_program() -> pathlib.Path:
    from vgpu_plugin.realkube.binaries import BinariesError, helm_bin

    try:
        return helm_bin()
    except BinariesError as error:
        pytest.fail(str(error))


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
