"""Pytest fixtures for the pure-core tests: the captured `nvidia-smi topo -m` outputs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from jupyter_vgpu.core.topology import Topology, parse_nvidia_smi_topo
from jupyter_vgpu.data import TOPOLOGY_DIR

FIXTURE_FILES = sorted(TOPOLOGY_DIR.glob("*.txt"))
assert FIXTURE_FILES, f"no topology fixtures under {TOPOLOGY_DIR}"


@pytest.fixture(params=FIXTURE_FILES, ids=lambda p: p.stem)
def fixture_file(request: pytest.FixtureRequest) -> Path:
    """Each captured `nvidia-smi topo -m` file in turn."""
    return request.param


@pytest.fixture
def topology_of() -> Callable[[str], Topology]:
    """Parse a fixture by file name."""
    return lambda name: parse_nvidia_smi_topo((TOPOLOGY_DIR / name).read_text())
