from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_vgpu.data import TOPOLOGY_DIR


@pytest.fixture
def fixtures() -> Path:
    return TOPOLOGY_DIR
