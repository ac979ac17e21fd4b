"""Browser-test fixtures: the built lab extension, Debian's headless Chromium through
Playwright, a real node metrics server over simulated GPUs, and a real `jupyter lab`.

The lab runs under a JupyterHub-style base URL (`/user/ada/`) so the panel's URLs are
proven to come from the server settings, and reads its vGPU facts from the node metrics
server exactly as in a pod: through VGPU_METRICS_URL and the pod's read token.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import (
    DEFAULT_NAMES,
    CardShare,
    ContainerAllocation,
    PodAllocation,
    Request,
    request_limits,
)

REPO = Path(__file__).resolve().parents[2]
LABEXTENSION_SRC = REPO / "labextension"
LABEXTENSION_OUT = REPO / "jupyter_vgpu" / "labextension"
TOPOLOGY_FIXTURES = REPO / ".." / "shared" / "fixtures" / "topology"
ARTIFACTS = REPO / "tests" / "artifacts"
CHROMIUM = os.environ.get("VGPU_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
BASE_URL = "/user/ada/"
NODE = "gpu-node-a"


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
    """jupyter_vgpu/labextension, rebuilt with npm when missing or older than its sources."""
    marker = LABEXTENSION_OUT / "static" / "style.js"
    sources = (LABEXTENSION_SRC / "src", LABEXTENSION_SRC / "style", LABEXTENSION_SRC / "schema")
    if not marker.exists() or marker.stat().st_mtime < _newest_mtime(*sources):
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("the lab extension is not built and npm is not on PATH (install Node.js 20+)")
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        if not (LABEXTENSION_SRC / "node_modules").exists():
            subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=LABEXTENSION_SRC, env=env, check=True)
        subprocess.run([npm, "run", "build:prod"], cwd=LABEXTENSION_SRC, env=env, check=True)
    assert marker.exists(), "the lab extension build produced no static/style.js"
    return LABEXTENSION_OUT


# --- the browser -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
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


# --- a node: simulated GPUs, pods as the API server sends them, the metrics server ----------


@dataclass
class Node:
    """One simulated GPU node with its metrics server; `pods` is the metrics server's pod source."""

    gpus: Any
    proc_root: Path
    pods: list[dict[str, Any]] = field(default_factory=list)
    server: Any = None
    minter: Any = None
    _next_pid: int = 4000

    def items(self) -> list[dict[str, Any]]:  # the PodSource protocol
        return list(self.pods)

    def add_pod(self, name: str, cores: int, memory_units: int, cards: tuple[int, ...]) -> dict[str, Any]:
        """A running pod holding a share, annotated as the extender does at bind."""
        uid = str(uuid.uuid4())
        container_id = secrets.token_hex(32)
        inventory = self.gpus.inventory()
        per_card = memory_units // len(cards)
        allocation = PodAllocation(NODE, (ContainerAllocation(0, "notebook", tuple(
            CardShare(card, inventory[card].uuid, min(cores, contract.CORES_PER_CARD), per_card)
            for card in cards)),))
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "jhub", "uid": uid,
                         "annotations": {DEFAULT_NAMES.allocation: allocation.to_json()}},
            "spec": {"nodeName": NODE, "schedulerName": contract.SCHEDULER_NAME, "containers": [
                {"name": "notebook", "image": "quay.io/jupyter/base-notebook",
                 "resources": {"limits": request_limits(Request(cores, memory_units))}}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "notebook", "ready": True, "restartCount": 0, "containerID": f"containerd://{container_id}"}]},
        }
        self.pods.append(pod)
        return pod

    def run_process(self, pod: dict[str, Any], card: int, memory_limit_mib: int, cores_limit: int) -> int:
        """A GPU process in the pod's container: a cgroup file kubelet's layout would give it,
        and a simulated process whose usage moves within its limits."""
        pid = self._next_pid
        self._next_pid += 1
        uid = pod["metadata"]["uid"].replace("-", "_")
        container_id = pod["status"]["containerStatuses"][0]["containerID"].partition("://")[2]
        (self.proc_root / str(pid)).mkdir(parents=True)
        (self.proc_root / str(pid) / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
            f"cri-containerd-{container_id}.scope\n")
        self.gpus.start_process(pid, card, memory_limit_mib=memory_limit_mib, cores_limit=cores_limit)
        return pid

    def notebook_env(self, pod: dict[str, Any]) -> dict[str, str]:
        """The VGPU_* variables the device plugin's Allocate gives this pod's container."""
        allocation = PodAllocation.from_json(pod["metadata"]["annotations"][DEFAULT_NAMES.allocation])
        container = allocation.containers[0]
        inventory = self.gpus.inventory()
        return {
            contract.ENV_CORES: str(container.cores),
            contract.ENV_MEMORY_MIB: str(container.memory_units * contract.MEMORY_UNIT_MIB),
            contract.ENV_DEVICE_UUIDS: ",".join(s.uuid for s in container.cards),
            contract.ENV_DEVICE_INDICES: contract.card_ids_env([s.index for s in container.cards]),
            contract.ENV_DEVICE_MODEL: inventory[container.cards[0].index].model,
            contract.ENV_NODE: NODE,
            contract.ENV_POD_NAME: pod["metadata"]["name"],
            contract.ENV_POD_NAMESPACE: pod["metadata"]["namespace"],
            contract.ENV_POD_UID: pod["metadata"]["uid"],
            contract.ENV_CONTAINER: "notebook",
            contract.ENV_METRICS_URL: self.server.url,
            contract.ENV_TOKEN: self.minter.mint(pod["metadata"]["uid"], 0),
            contract.ENV_ENFORCEMENT: "hami-core",
        }


@pytest.fixture
def node() -> Iterator[Node]:
    """A 4-card A100 PCIe node (two NUMA nodes): Ada holds 25 % + 4 GiB of card 1, two other
    people share cards 1 and 2. The metrics server samples every 0.5 s."""
    from vgpu_plugin.metrics.server import MetricsServer
    from vgpu_plugin.tokens import TokenMinter

    from jupyter_vgpu.gpu.simulated import SimulatedGPUs

    fixture = TOPOLOGY_FIXTURES / "a100-pcie-4gpu-2numa.txt"
    gpus = SimulatedGPUs.from_fixture(fixture, model="NVIDIA A100-PCIE-40GB", memory_mib=40960, seed=7)
    with tempfile.TemporaryDirectory(prefix="vgpu-proc-") as proc_root:
        node = Node(gpus=gpus, proc_root=Path(proc_root))
        ada = node.add_pod("jupyter-ada", 25, 16, (1,))
        bob = node.add_pod("jupyter-bob", 50, 40, (1,))
        carol = node.add_pod("jupyter-carol", 30, 24, (2,))
        node.run_process(ada, 1, memory_limit_mib=4096, cores_limit=25)
        node.run_process(bob, 1, memory_limit_mib=10240, cores_limit=50)
        node.run_process(carol, 2, memory_limit_mib=6144, cores_limit=30)
        node.minter = TokenMinter(secrets.token_bytes(32))
        node.server = MetricsServer(NODE, gpus, node, node.minter, address="127.0.0.1", port=0, period=0.5,
                                    proc_root=proc_root, enforcement="hami-core")
        node.server.start()
        try:
            yield node
        finally:
            node.server.stop()
            gpus.close()


# --- jupyter lab ---------------------------------------------------------------------------


@dataclass
class Lab:
    url: str          # http://127.0.0.1:<port>/user/ada/
    token: str
    process: subprocess.Popen[bytes]
    log: Path

    def api(self, path: str) -> Any:
        request = urllib.request.Request(self.url + path, headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_lab(labextension: Path, env_extra: dict[str, str], workdir: Path) -> Lab:
    """`jupyter lab` on an ephemeral port under BASE_URL, with its own config, data, runtime,
    settings and workspace dirs (nothing from this machine's user leaks in)."""
    port = _free_port()
    token = secrets.token_hex(16)
    extensions = workdir / "labextensions"
    extensions.mkdir()
    (extensions / "jupyter-vgpu").symlink_to(labextension, target_is_directory=True)
    for name in ("config", "data", "runtime", "settings", "workspaces", "root"):
        (workdir / name).mkdir()
    # no "receive Jupyter news?" toast over the panel
    news = workdir / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    # enabled here too: an editable install does not put the wheel's etc/jupyter file in place
    (workdir / "config" / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {"jupyter_vgpu": True}}}))
    env = {key: value for key, value in os.environ.items()
           if key not in contract.VGPU_ENV_NAMES and not key.startswith(("JUPYTERHUB_", "JUPYTER_VGPU_"))}
    env.update({
        "JUPYTER_CONFIG_DIR": str(workdir / "config"),
        "JUPYTER_DATA_DIR": str(workdir / "data"),
        "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(workdir / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(workdir / "workspaces"),
        **env_extra,
    })
    log = workdir / "lab.log"
    command = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
        f"--ServerApp.base_url={BASE_URL}", f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={workdir / 'root'}", "--ServerApp.port_retries=0",
        f"--LabApp.extra_labextensions_path={workdir / 'labextensions'}",
        "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if os.geteuid() == 0:  # CI containers run as root
        command.append("--allow-root")
    with open(log, "wb") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                   cwd=workdir / "root", start_new_session=True)
    lab = Lab(url=f"http://127.0.0.1:{port}{BASE_URL}", token=token, process=process, log=log)
    deadline = time.monotonic() + 120
    while True:
        if process.poll() is not None:
            raise AssertionError(f"jupyter lab exited with {process.returncode}:\n{lab.log_tail()}")
        try:
            lab.api("api/status")
            return lab
        except (urllib.error.URLError, OSError):
            if time.monotonic() > deadline:
                stop_lab(lab)
                raise AssertionError(f"jupyter lab did not answer within 120 s:\n{lab.log_tail()}") from None
            time.sleep(0.25)


def stop_lab(lab: Lab) -> None:
    if lab.process.poll() is None:
        os.killpg(lab.process.pid, signal.SIGTERM)
        try:
            lab.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(lab.process.pid, signal.SIGKILL)
            lab.process.wait(timeout=10)
