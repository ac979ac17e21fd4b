"""Fixtures shared by every test area.

- ``kube``: a fresh simulated Kubernetes API (``vgpu_plugin.sim.kube.SimKubeAPI``) per
  test, already started, with ``.kubeconfig`` written to the test's temp dir,
  ``.url``, ``.api_client()``, ``.store``, ``.compact()`` and ``.emulator``.
- ``kube_session``: one API for a whole session, for read-mostly tests that
  create their own uniquely named objects (start costs ~0.1 s, so prefer ``kube``).
- ``core_v1``: ``kubernetes.client.CoreV1Api`` on ``kube``.
- ``topology_fixtures``: the directory of real ``nvidia-smi topo -m`` captures.
- ``kubespawner_kubeconfig``: KubeSpawner loads a kubeconfig when constructed; this gives it
  one pointing at a closed port (unit tests never reach an API). Returns its path.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator

import pytest

from jupyter_vgpu.data import TOPOLOGY_DIR

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def kube(tmp_path: pathlib.Path) -> Iterator[object]:
    from vgpu_plugin.sim.kube import SimKubeAPI

    api = SimKubeAPI().start()
    api.write_kubeconfig(tmp_path / "kubeconfig")
    try:
        yield api
    finally:
        api.stop()


@pytest.fixture(scope="session")
def kube_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from vgpu_plugin.sim.kube import SimKubeAPI

    api = SimKubeAPI().start()
    api.write_kubeconfig(tmp_path_factory.mktemp("kube-session") / "kubeconfig")
    try:
        yield api
    finally:
        api.stop()


@pytest.fixture
def core_v1(kube: object) -> object:
    import kubernetes.client

    return kubernetes.client.CoreV1Api(kube.api_client())  # type: ignore[attr-defined]


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
