"""Fixtures for the metrics tests (helpers in metrics_support.py)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from metrics_support import NODE, FakeNode
from vgpu_plugin.tokens import TokenMinter

from jupyter_vgpu.data import TOPOLOGY_DIR
from jupyter_vgpu.gpu.simulated import SimulatedGPUs


@pytest.fixture
def gpus() -> SimulatedGPUs:
    return SimulatedGPUs.from_fixture(TOPOLOGY_DIR / "dgx-a100.txt", host=NODE)


@pytest.fixture
def fake_node(gpus: SimulatedGPUs, tmp_path: Path) -> FakeNode:
    proc_root = tmp_path / "proc"
    proc_root.mkdir()
    return FakeNode(gpus, str(proc_root))


@pytest.fixture
def minter() -> TokenMinter:
    return TokenMinter(secrets.token_bytes(32))
