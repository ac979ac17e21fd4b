"""The node image's install steps, run in a clean virtualenv (no container engine here).

The final stage of plugin/Dockerfile is read, not copied: its RUN command runs as written
in a fresh venv whose PATH holds only that venv, with the wheel where the image has it.
Then the commands the manifests run (device-plugin, extender, doctor) must at least start.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "plugin" / "Dockerfile"

pytestmark = pytest.mark.slow  # builds the wheel and installs [node] from the index


def final_stage_run() -> str:
    """The RUN command of the Dockerfile's last stage, continuation lines joined."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    last_stage = text[text.rindex("\nFROM "):]
    (run,) = re.findall(r"^RUN (.+)$", last_stage, re.M)
    return run


@pytest.fixture(scope="module")
def image_env(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("image")
    wheels = root / "wheels"
    wheels.mkdir()
    shutil.copy(wheel, wheels)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(root / "home"), "VIRTUAL_ENV": str(venv),
           # this machine's pip cache (HOME moved, so pip would start from an empty one)
           "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip")),
           **{k: v for k, v in os.environ.items() if k.startswith("PIP_")}}
    # the image's command with the wheel directory moved; pip may use this machine's cache and
    # skips byte-compiling (a third of the install's time here; the image's pip does compile)
    command = final_stage_run().replace("/wheels", str(wheels)).replace("--no-cache-dir ", "--no-compile ")
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", command], env=env, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    assert not wheels.exists(), "the image's RUN removes the wheels after installing"
    return env


def test_the_dockerfile_installs_the_node_extra_and_checks_the_daemon():
    run = final_stage_run()
    assert re.search(r'pip install [^&]*"\$\(ls /wheels/jupyter_vgpu-\*\.whl\)\[node\]"', run), run
    assert "jupyter-vgpu device-plugin --help" in run


@pytest.mark.parametrize("command", [["device-plugin", "--help"], ["extender", "--help"], ["doctor", "--help"]])
def test_installed_image_runs_the_manifests_commands(image_env, command):
    venv = Path(image_env["VIRTUAL_ENV"])
    result = subprocess.run([str(venv / "bin" / "jupyter-vgpu"), *command], env=image_env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"usage: jupyter-vgpu {command[0]}"), result.stdout


def test_installed_image_has_the_node_side_and_no_notebook_frontend(image_env):
    python = Path(image_env["VIRTUAL_ENV"]) / "bin" / "python"
    probe = ("import importlib.util as u; import grpc, kubernetes, pynvml, prometheus_client, vgpu_plugin.deviceplugin.server; "
             "print(u.find_spec('jupyterlab') is None)")
    result = subprocess.run([str(python), "-c", probe], env=image_env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"  # [node] does not pull JupyterLab into the daemon image
