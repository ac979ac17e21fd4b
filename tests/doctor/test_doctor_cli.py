"""`jupyter-vgpu doctor` as a command: flags for every root, --json, the exit status."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from doctor_support import NODE, argv
from vgpu_plugin.doctor.main import main

EXE = shutil.which("jupyter-vgpu", path=os.path.dirname(sys.executable)) or shutil.which("jupyter-vgpu")


def test_json_on_a_healthy_node(healthy, kube, capsys):
    assert main([*argv(healthy, kube), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["node"] == NODE and report["ok"] is True
    # the command's own simulated cards run no GPU process: visibility cannot be judged, and says so
    assert {c["check"]: c["status"] for c in report["checks"] if c["status"] != "ok"} == {"process-visibility": "warn"}
    driver = next(c for c in report["checks"] if c["check"] == "driver")
    assert driver == {"check": "driver", "status": "ok", "detail": "simulated cards (no driver to check)", "remedy": ""}


def test_text_lines_and_exit_status_on_a_failing_node(healthy, kube):
    (healthy.root / "tmp/vgpulock").chmod(0o755)
    result = subprocess.run([EXE, "doctor", *argv(healthy, kube)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    failing = [i for i, line in enumerate(lines) if line.startswith("fail")]
    assert len(failing) == 1 and "hami-dirs" in lines[failing[0]]
    assert lines[failing[0] + 1].strip().startswith("-> chmod 1777")
    # findings, a remedy each for the failure and the warning (no GPU process to judge visibility by), the summary
    assert lines[-1] == f"{len(lines) - 5} ok, 1 warn, 1 fail"


def test_enforcement_and_roots_come_from_the_daemons_environment(healthy, kube, capsys, monkeypatch):
    """In the vgpu-node pod the doctor reads the same variables as the daemon."""
    monkeypatch.setenv("VGPU_ENFORCEMENT", "none")
    monkeypatch.setenv("VGPU_PLUGIN_DIR", healthy.setup.plugin_dir)
    monkeypatch.setenv("VGPU_METRICS_PROC_ROOT", healthy.setup.proc_root)
    args = argv(healthy, kube)
    for flag in ("--plugin-dir", "--proc-root"):
        index = args.index(flag)
        del args[index:index + 2]
    assert main([*args, "--json"]) == 0
    checks = {c["check"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["enforcement"]["detail"].startswith("none: scheduling-only sharing")
    assert checks["kubelet-socket"]["status"] == "ok" and checks["cgroups"]["status"] == "ok"


def test_bad_input_is_a_usage_error(capsys):
    assert main(["--gpus", "cuda:0", "--no-api"]) == 2
    assert "use 'nvml' or 'sim:FIXTURE'" in capsys.readouterr().err
