"""What the demo says and keeps: the enforcement its nodes really have, the lab's notes per mode, and
the lab's settings and log beside the notebooks (not in the work dir that Ctrl-C removes)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from vgpu_plugin.demo.lab import (
    KEPT_DIR,
    NEWS_SETTINGS,
    WIDGET_SETTINGS,
    Demo,
    DemoOptions,
    start_cluster,
)

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.sources.base import env_allocation
from jupyter_vgpu.widgets import render


def test_the_demos_nodes_enforce_nothing_and_the_notebook_is_told_so() -> None:
    """Simulated GPUs have no HAMi-core: the node daemons run with enforcement "none", the notebook's
    container gets no HAMi-core limits, and what it reads of its allocation says nothing enforces them."""
    cluster = start_cluster(run_processes=False)
    try:
        cluster.create_notebook_pod("nb", cores=25, memory="4GiB", namespace="default")
        pod = cluster.wait_for_pod("default", "nb", phase="Running")
        env = cluster.node(pod["spec"]["nodeName"]).kubelet.env("default", "nb", "notebook")
    finally:
        cluster.stop()
    assert env is not None and env[c.ENV_ENFORCEMENT] == "none"
    assert not [name for name in env if name.startswith(("CUDA_DEVICE_", "LD_PRELOAD"))], env
    assert env[c.ENV_XLA_MEM_FRACTION] in ("0.100", "0.166")  # the rails still get the share: 4 GiB of 40 or 24
    allocation = env_allocation(env)
    assert allocation is not None and allocation["enforcement"] == "none"
    text = render.allocation_text({"state": "allocated", "source": "node-api", "allocation": allocation})
    assert "enforced by" not in text and "Limits not enforced: the share is kept by scheduling" in text


def test_the_guide_says_what_moves_the_charts_on_a_card_and_on_a_slice() -> None:
    shared = "\n".join(Demo(DemoOptions(), say=lambda _: None).lab_notes())
    assert "a busy cell (e.g. `while True: pass`) raises" in shared
    assert "nothing enforces limits on simulated GPUs (enforcement none)" in shared
    isolated = "\n".join(Demo(DemoOptions(isolated=True), say=lambda _: None).lab_notes())
    assert "raises" not in isolated and "busy cell moves no chart" in isolated
    assert "compute use on a MIG slice is not\n  measured" in isolated
    assert "on a MIG slice the hardware isolates your compute and memory" in isolated


def test_the_labs_settings_are_kept_beside_the_notebooks_and_the_news_prompt_answered(tmp_path: Path) -> None:
    demo = Demo(DemoOptions(root_dir=str(tmp_path)), say=lambda _: None)
    settings = Path(demo.lab_settings_dir())
    assert settings == tmp_path / KEPT_DIR / "lab-settings"
    news = settings.joinpath(*NEWS_SETTINGS)
    assert json.loads(news.read_text()) == {"fetchNews": "false"}
    # the widgets' state goes with a saved notebook: reopened in the same run, %vgpu's outputs are drawn
    assert json.loads(settings.joinpath(*WIDGET_SETTINGS).read_text()) == {"saveState": True}
    # a theme chosen in one run is there in the next; an answer the user gave is theirs
    theme = settings / "@jupyterlab" / "apputils-extension" / "themes.jupyterlab-settings"
    theme.write_text(json.dumps({"theme": "JupyterLab Dark"}))
    news.write_text(json.dumps({"fetchNews": "true", "checkForUpdates": False}))
    again = Demo(DemoOptions(root_dir=str(tmp_path)), say=lambda _: None)
    assert Path(again.lab_settings_dir()) == settings
    assert json.loads(theme.read_text()) == {"theme": "JupyterLab Dark"}
    assert json.loads(news.read_text()) == {"fetchNews": "true", "checkForUpdates": False}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_labs_log_goes_beside_the_notebooks(tmp_path: Path, monkeypatch) -> None:
    """The lab's command logs to KEPT_DIR/logs/lab.log (what the guide prints); each pod's lab appends
    after a line naming its pod, stdout and stderr alike."""
    demo = Demo(DemoOptions(root_dir=str(tmp_path)), say=lambda _: None)
    monkeypatch.setattr(demo, "_extra_labextensions", lambda: [])
    log = Path(demo.lab_log())
    assert log == tmp_path / KEPT_DIR / "logs" / "lab.log"
    assert f"--log={log}" in demo.lab_command()
    port = _free_port()
    for pod in ("notebook", "notebook-v2"):
        done = subprocess.run(
            [sys.executable, "-m", "vgpu_plugin.demo.notebook", f"--port={port}", f"--log={log}", "--",
             sys.executable, "-c", "import sys; print('lab says hello'); print('lab warns', file=sys.stderr)"],
            env={"PATH": "/usr/bin:/bin", "HOSTNAME": pod}, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout == done.stderr == "", done
    text = log.read_text()
    assert text.count("lab says hello") == text.count("lab warns") == 2
    assert "the lab of pod notebook starts" in text and "the lab of pod notebook-v2 starts" in text
