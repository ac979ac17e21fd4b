"""Fixtures for tests against the simulated Kubernetes API (as pytest-jupyter is for Jupyter servers).

Loaded by the ``pytest11`` entry point when the package is installed, or with
``pytest_plugins = ["simkube.pytest_plugin"]`` in a conftest from a checkout.

- ``kube``: a fresh ``simkube.apiserver.SimKubeAPI`` per test, already started, with
  ``.kubeconfig`` written to the test's temp dir, ``.url``, ``.api_client()``, ``.store``,
  ``.compact()`` and ``.emulator`` (kmock reactions inject faults);
- ``kube_session``: one API for a whole session, for read-mostly tests that create their own
  uniquely named objects (start costs ~0.1 s, so prefer ``kube``);
- ``core_v1``: ``kubernetes.client.CoreV1Api`` on ``kube``.

kmock and kubernetes are imported when a fixture is used, not when the plugin loads: an
installed plugin is loaded into every pytest run of its environment.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from simkube.apiserver import SimKubeAPI


def _started(directory: pathlib.Path) -> SimKubeAPI:
    from simkube.apiserver import SimKubeAPI

    api = SimKubeAPI().start()
    api.write_kubeconfig(directory / "kubeconfig")
    return api


@pytest.fixture
def kube(tmp_path: pathlib.Path) -> Iterator[SimKubeAPI]:
    api = _started(tmp_path)
    try:
        yield api
    finally:
        api.stop()


@pytest.fixture(scope="session")
def kube_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimKubeAPI]:
    api = _started(tmp_path_factory.mktemp("kube-session"))
    try:
        yield api
    finally:
        api.stop()


@pytest.fixture
def core_v1(kube: SimKubeAPI) -> Any:
    import kubernetes.client

    return kubernetes.client.CoreV1Api(kube.api_client())
