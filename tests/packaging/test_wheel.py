"""The wheel carries the prebuilt lab extension and enables both extensions, with no
Node.js where it is installed.

The wheel is built once per session (the ``wheel`` fixture in conftest.py), then installed
into a fresh virtual environment whose PATH has no node.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from simkube.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
EXTENSION_DATA = "share/jupyter/labextensions/jupyter-vgpu"
SERVER_CONFIG = "etc/jupyter/jupyter_server_config.d/jupyter_vgpu.json"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="session")
def fresh_env(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A new venv with the wheel and JupyterLab installed; its PATH holds only the venv."""
    root = tmp_path_factory.mktemp("fresh")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {
        "PATH": str(venv / "bin"),
        "HOME": str(root / "home"),
        "VIRTUAL_ENV": str(venv),
        "JUPYTER_CONFIG_DIR": str(root / "config"),
        "JUPYTER_DATA_DIR": str(root / "data"),
        "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
        # pip settings of this machine (wheel cache, local indexes) still apply
        **{k: v for k, v in os.environ.items() if k.startswith("PIP_")},
    }
    assert shutil.which("node", path=env["PATH"]) is None
    pip_cache = os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip"))
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-compile", "--cache-dir", pip_cache,
                    "--find-links", str(wheel.parent), str(wheel), "jupyterlab>=4.2,<5"],
                   check=True, env=env, timeout=900)
    yield env


def test_wheel_ships_the_prebuilt_extension_and_server_config(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        data = f"jupyter_vgpu-{wheel.name.split('-')[1]}.data/data/"
        assert f"{data}{EXTENSION_DATA}/package.json" in names
        assert f"{data}{EXTENSION_DATA}/install.json" in names
        assert f"{data}{EXTENSION_DATA}/schemas/jupyter-vgpu/plugin.json" in names
        assert any(re.fullmatch(rf"{re.escape(data + EXTENSION_DATA)}/static/remoteEntry\.[0-9a-f]+\.js", n)
                   for n in names)
        assert "jupyter_vgpu/labextension/package.json" in names  # for _jupyter_labextension_paths
        # the widgets read the panel's glossary (labextension/src/glossary.json) from here
        glossary = json.loads(archive.read("jupyter_vgpu/widgets/glossary.json"))
        assert glossary == json.loads((REPO / "labextension" / "src" / "glossary.json").read_text(encoding="utf-8"))
        # the widgets' front end: the panel's renderer bundled as one ES module, and its stylesheet
        widget = archive.read("jupyter_vgpu/widgets/static/widget.js").decode()
        assert "export" in widget and "jp-vgpu-facts" in widget and "import " not in widget  # self-contained
        assert ".jp-vgpu-topo-gpu" in archive.read("jupyter_vgpu/widgets/static/widget.css").decode()
        assert f"{data}{SERVER_CONFIG}" in names
        package = json.loads(archive.read(f"{data}{EXTENSION_DATA}/package.json"))
        assert package["name"] == "jupyter-vgpu"
        assert package["jupyterlab"]["_build"]["load"].startswith("static/remoteEntry.")
        server_config = json.loads(archive.read(f"{data}{SERVER_CONFIG}"))
        assert server_config["ServerApp"]["jpserver_extensions"]["jupyter_vgpu"] is True


def _run(env: dict[str, str], *args: str) -> str:
    result = subprocess.run([str(Path(env["VIRTUAL_ENV"]) / "bin" / "jupyter"), *args], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return ANSI.sub("", result.stdout + result.stderr)


def test_fresh_env_lists_both_extensions_enabled(fresh_env: dict[str, str]) -> None:
    labextensions = _run(fresh_env, "labextension", "list")
    assert re.search(r"jupyter-vgpu v0\.1\.0 enabled OK \(python, jupyter-vgpu\)", labextensions), labextensions
    server_extensions = _run(fresh_env, "server", "extension", "list")
    assert re.search(r"jupyter_vgpu enabled", server_extensions), server_extensions
    assert re.search(r"jupyter_vgpu\s+\S*\s*OK", server_extensions), server_extensions


def test_fresh_env_serves_the_extension_and_its_api(fresh_env: dict[str, str], tmp_path: Path) -> None:
    """`jupyter lab` from the fresh env (no node) loads the prebuilt bundle and the REST API."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    token = secrets.token_hex(16)
    command = [str(Path(fresh_env["VIRTUAL_ENV"]) / "bin" / "jupyter"), "lab", "--no-browser", "--ip=127.0.0.1",
               f"--port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
               "--ServerApp.port_retries=0"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    log = tmp_path / "lab.log"
    with open(log, "wb") as handle:
        process = subprocess.Popen(command, env={**fresh_env, "JUPYTER_VGPU_SOURCE": "none"}, stdout=handle,
                                   stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/"

    def get(path: str) -> tuple[int, bytes]:
        request = urllib.request.Request(base + path, headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()

    try:

        def answers() -> bool:
            assert process.poll() is None, log.read_text()
            try:
                get("api/status")
            except (urllib.error.URLError, OSError):
                return False
            return True

        try:
            wait_for(answers, timeout=120, interval=0.25, what="the installed lab to answer")
        except TimeoutError:
            raise AssertionError(log.read_text()) from None
        _, page = get("lab")
        options = json.loads(re.search(rb'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                                       page, re.S).group(1))
        federated = {e["name"]: e for e in options["federated_extensions"]}
        assert "jupyter-vgpu" in federated
        status, bundle = get(f"lab/extensions/jupyter-vgpu/{federated['jupyter-vgpu']['load']}")
        assert status == 200 and b"jupyter-vgpu" in bundle
        _, allocation = get("vgpu/api/allocation")
        assert json.loads(allocation)["state"] == "none"
    finally:
        process.terminate()
        process.wait(timeout=30)
