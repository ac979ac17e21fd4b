"""binder/: repo2docker's files, and the demo command jupyter-server-proxy runs, run here."""

from __future__ import annotations

import json
import os
import runpy
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from simkube.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
BINDER = REPO / "binder"


def test_repo2docker_files():
    for script in ("postBuild", "start"):
        path = BINDER / script
        assert os.access(path, os.X_OK), f"binder/{script} must be executable"
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    for line in (BINDER / "requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            Requirement(line)
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert 'pip install --no-cache-dir ".[sim]"' in (BINDER / "postBuild").read_text() and "sim" in extras


def test_start_hands_over_to_binders_server():
    result = subprocess.run([str(BINDER / "start"), sys.executable, "-c", "print('server')"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stdout.strip() == "server"


def _proxy_entry() -> dict:
    class Config:  # what get_config() returns, enough for attribute assignment
        def __init__(self):
            self.ServerProxy = type("Section", (), {})()

    config = Config()
    runpy.run_path(str(BINDER / "jupyter_server_config.py"), init_globals={"get_config": lambda: config})
    return config.ServerProxy.servers["vgpu-demo"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_the_demo_jupyter_server_proxy_starts_serves_lab_with_a_vgpu(tmp_path):
    """Run the command exactly as jupyter-server-proxy formats it, then use its Lab."""
    entry = _proxy_entry()
    assert entry["absolute_url"] is True
    port, base_url = _free_port(), "/user/binder-test/"
    command = [part.format(port=port, base_url=base_url) for part in entry["command"]]
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = open(tmp_path / "demo.log", "w")
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    prefix = f"http://127.0.0.1:{port}{base_url}vgpu-demo/"

    def get(path: str):
        with urllib.request.urlopen(prefix + path, timeout=10) as response:
            return response.status, response.read()

    try:

        def lab_page():
            if process.poll() is not None:
                pytest.fail(f"`{' '.join(command)}` exited with {process.returncode}:\n{(tmp_path / 'demo.log').read_text()[-3000:]}")
            try:
                return get("lab")
            except (urllib.error.URLError, ConnectionError, OSError):
                return None

        try:
            status, body = wait_for(lab_page, timeout=entry["timeout"], interval=0.5, what="the demo's JupyterLab")
        except TimeoutError:
            pytest.fail(f"the demo's JupyterLab never answered at {prefix}lab:\n{(tmp_path / 'demo.log').read_text()[-3000:]}")
        assert status == 200
        assert b"Jupyter Server" not in body[:400] or b"token" not in body, (
            "the demo's lab shows its token login page behind the proxy")
        assert b"jupyter-vgpu" in body  # the panel's extension is in the lab's page config
        wait_for(lambda: json.loads(get("vgpu/api/allocation")[1])["state"] == "allocated", timeout=60, interval=0.5,
                 what="the demo's notebook to hold its share")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 15)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
                process.wait(10)
        log.close()
