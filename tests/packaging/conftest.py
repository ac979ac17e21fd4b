"""The wheel, built once per session for every packaging test."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`python -m build --wheel` of this repository (the hatch build hook runs npm there)."""
    if shutil.which("npm") is None:
        pytest.fail("building the wheel needs npm (Node.js 20+) on PATH")
    outdir = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(outdir), str(REPO)],
                   check=True, capture_output=True, timeout=900)
    (built,) = outdir.glob("jupyter_vgpu-*.whl")
    return built
