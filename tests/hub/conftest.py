"""KubeSpawner loads a kubeconfig when constructed: every hub test gets one pointing at a
closed port (unit tests never reach the API) unless a test points it at the simulated cluster."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _offline_kubespawner(kubespawner_kubeconfig: str) -> str:
    return kubespawner_kubeconfig
