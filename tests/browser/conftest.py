"""Browser-test fixtures: the built lab extension, Debian's headless Chromium through
Playwright, and the simulated cluster (helpers in browser_support.py).

The lab runs under a JupyterHub-style base URL (`/user/ada/`) so the panel's URLs are
proven to come from the server settings. It gets the environment the simulated kubelet
gave Ada's notebook pod (the device plugin's VGPU_* variables: the node's metrics URL and
the pod's read token), so it reads its facts as in a real pod, and it re-creates that pod
through the simulated Kubernetes API when the user asks for a different share.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import (
    ARTIFACTS,
    LABEXTENSION_OUT,
    LABEXTENSION_SRC,
    NODE,
    WIDGET_BUNDLE,
    Cluster,
)

from jupyter_vgpu.data import TOPOLOGY_DIR

CHROMIUM = os.environ.get("VGPU_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.browser)


# --- the built extension ---------------------------------------------------------------------


def _newest_mtime(*roots: Path) -> float:
    newest = 0.0
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file():
                newest = max(newest, path.stat().st_mtime)
    return newest


@pytest.fixture(scope="session")
def labextension_built() -> Path:
    """jupyter_vgpu/labextension and the widgets' bundle (jupyter_vgpu/widgets/static), rebuilt
    with npm when missing or older than their sources."""
    marker = LABEXTENSION_OUT / "static" / "style.js"
    widget = WIDGET_BUNDLE / "widget.js"
    sources = (LABEXTENSION_SRC / "src", LABEXTENSION_SRC / "style", LABEXTENSION_SRC / "schema")
    newest = _newest_mtime(*sources)
    if not marker.exists() or not widget.exists() or min(marker.stat().st_mtime, widget.stat().st_mtime) < newest:
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("the lab extension is not built and npm is not on PATH (install Node.js 20+)")
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        if not (LABEXTENSION_SRC / "node_modules").exists():
            subprocess.run([npm, "install", "--no-audit", "--no-fund"], cwd=LABEXTENSION_SRC, env=env, check=True)
        subprocess.run([npm, "run", "build:prod"], cwd=LABEXTENSION_SRC, env=env, check=True)
    assert marker.exists(), "the lab extension build produced no static/style.js"
    assert widget.exists(), "the build produced no jupyter_vgpu/widgets/static/widget.js"
    return LABEXTENSION_OUT


# --- the browser -----------------------------------------------------------------------------


# Module scope, not session: Playwright's sync API keeps an event loop running in the main
# thread while it is open, which would break every asyncio test collected after this area.
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"no Chromium at {CHROMIUM}: `apt-get install -y chromium` (or set VGPU_CHROMIUM)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


# --- the simulated cluster -------------------------------------------------------------------


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """One 4-card A100 PCIe node (two NUMA nodes). Bob (50 %) and Ada (25 % + 4 GiB) are
    placed by the real extender; Carol's 30 % no longer fits beside them and lands on
    another card. Samples every 0.5 s."""
    from vgpu_plugin.demo.cluster import NodeSpec, SimCluster

    spec = NodeSpec(NODE, "a100-pcie-4gpu-2numa.txt", model="NVIDIA A100-PCIE-40GB", memory_mib=40960, seed=7)
    with SimCluster([spec], fixtures_dir=TOPOLOGY_DIR, metrics_period=0.5) as sim:
        for name, cores, memory in (("jupyter-bob", 50, "10GiB"), ("jupyter-ada", 25, "4GiB"),
                                    ("jupyter-carol", 30, "6GiB")):
            sim.create_notebook_pod(name, cores=cores, memory=memory, namespace="default")
            sim.wait_for_pod("default", name, phase="Running")
        yield Cluster(sim=sim, namespace="default", notebook="jupyter-ada")
