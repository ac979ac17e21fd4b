"""Helpers of the browser tests: the simulated cluster's notebook pod, and a real `jupyter lab`.

A module with its own name (not conftest) so test modules can import it unambiguously.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simkube.waiting import wait_for

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import DEFAULT_NAMES, PodAllocation

REPO = Path(__file__).resolve().parents[2]
LABEXTENSION_SRC = REPO / "labextension"
LABEXTENSION_OUT = REPO / "jupyter_vgpu" / "labextension"
ARTIFACTS = REPO / "tests" / "artifacts"
BASE_URL = "/user/ada/"
NODE = "gpu-node-a"
PANEL = "#jp-vgpu-panel"


# --- the simulated cluster -------------------------------------------------------------------


@dataclass
class Cluster:
    """A running SimCluster (real API emulator, extender, scheduler stand-in, kubelet stand-in,
    node daemon with its metrics server) and the notebook pod Ada's lab stands for."""

    sim: Any
    namespace: str
    notebook: str

    def pod(self, name: str) -> dict[str, Any]:
        pod = self.sim.read_pod(self.namespace, name)
        assert pod is not None, f"pod {self.namespace}/{name} is gone"
        return pod

    def cards_of(self, name: str) -> dict[int, int]:
        """Card index -> cores that pod holds, from the allocation record written at bind."""
        record = PodAllocation.from_json(self.pod(name)["metadata"]["annotations"][DEFAULT_NAMES.allocation])
        return {share.index: share.cores for container in record.containers for share in container.cards}

    def notebook_env(self) -> dict[str, str]:
        """What the kubelet gave the notebook container (Allocate's env: VGPU_*, limits), plus
        the kubeconfig the server extension uses to re-create its pod for a share request."""
        env = self.sim.node(NODE).kubelet.env(self.namespace, self.notebook, "notebook")
        assert env and contract.ENV_TOKEN in env, f"the kubelet gave the notebook no vGPU env: {env}"
        return {**env, contract.ENV_NOTEBOOK_KUBECONFIG: self.sim.kubeconfig}


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


def start_lab(labextension: Path, env_extra: dict[str, str], workdir: Path,
              vgpu_settings: dict[str, Any] | None = None, app: str = "jupyterlab",
              server_config: dict[str, Any] | None = None) -> Lab:
    """`jupyter lab` (or, with app="notebook", Notebook 7) on an ephemeral port under BASE_URL,
    with its own config, data, runtime, settings and workspace dirs (nothing from this
    machine's user leaks in)."""
    app_class = {"jupyterlab": "LabApp", "notebook": "JupyterNotebookApp"}[app]
    port = _free_port()
    token = secrets.token_hex(16)
    extensions = workdir / "labextensions"
    extensions.mkdir()
    (extensions / "jupyter-vgpu").symlink_to(labextension, target_is_directory=True)
    for name in ("config", "data", "runtime", "settings", "workspaces", "root"):
        (workdir / name).mkdir()
    if app == "notebook":  # Notebook 7 serves extensions from the data dir's labextensions, as installed
        (workdir / "data" / "labextensions").mkdir()
        (workdir / "data" / "labextensions" / "jupyter-vgpu").symlink_to(labextension, target_is_directory=True)
    # no "receive Jupyter news?" toast over the panel
    if app == "jupyterlab":
        news = workdir / "settings" / "@jupyterlab" / "apputils-extension"
        news.mkdir(parents=True)
        (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    if vgpu_settings:  # the user's settings for the panel, as the Settings Editor saves them
        (workdir / "settings" / "jupyter-vgpu").mkdir()
        (workdir / "settings" / "jupyter-vgpu" / "plugin.jupyterlab-settings").write_text(json.dumps(vgpu_settings))
    # enabled here too: an editable install does not put the wheel's etc/jupyter file in place
    (workdir / "config" / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {"jupyter_vgpu": True}},
                    # the simulated cluster's requester, as the demo configures it
                    "VGPUSettings": {"requester_class": "vgpu_plugin.demo.requester.KubeRecreateRequester"},
                    **(server_config or {})}))
    env = {key: value for key, value in os.environ.items()
           if key not in contract.VGPU_ENV_NAMES and not key.startswith(("JUPYTERHUB_", "JUPYTER_VGPU_"))}
    env.update({
        "JUPYTER_CONFIG_DIR": str(workdir / "config"),
        "JUPYTER_DATA_DIR": str(workdir / "data"),
        "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(workdir / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(workdir / "workspaces"),
        # the data dir's labextensions before the environment's (a venv may hold another build)
        "JUPYTER_PREFER_ENV_PATH": "0",
        **env_extra,
    })
    log = workdir / "lab.log"
    command = [
        sys.executable, "-m", app, "--no-browser", "--ip=127.0.0.1", f"--port={port}",
        f"--ServerApp.base_url={BASE_URL}", f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={workdir / 'root'}", "--ServerApp.port_retries=0",
        f"--{app_class}.expose_app_in_browser=True",
    ]
    if app == "jupyterlab":
        command += [f"--LabApp.extra_labextensions_path={workdir / 'labextensions'}", "--LabApp.news_url=",
                    "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:  # CI containers run as root
        command.append("--allow-root")
    with open(log, "wb") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                   cwd=workdir / "root", start_new_session=True)
    lab = Lab(url=f"http://127.0.0.1:{port}{BASE_URL}", token=token, process=process, log=log)

    def answers() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"jupyter lab exited with {process.returncode}:\n{lab.log_tail()}")
        try:
            lab.api("api/status")
        except (urllib.error.URLError, OSError):
            return False
        return True

    try:
        wait_for(answers, timeout=120, interval=0.25, what="jupyter lab to answer")
    except TimeoutError:
        stop_lab(lab)
        raise AssertionError(f"jupyter lab did not answer within 120 s:\n{lab.log_tail()}") from None
    return lab


def stop_lab(lab: Lab) -> None:
    if lab.process.poll() is None:
        os.killpg(lab.process.pid, signal.SIGTERM)
        try:
            lab.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(lab.process.pid, signal.SIGKILL)
            lab.process.wait(timeout=10)


def open_lab(browser: Any, lab: Lab) -> Any:
    """A new browser page on the lab, once JupyterLab has started and restored its layout."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(f"{lab.url}lab?token={lab.token}")
    page.wait_for_selector("#jp-main-dock-panel", state="attached", timeout=120_000)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.started !== undefined")
    page.evaluate("() => window.jupyterapp.restored")
    return page
