"""`jupyter-vgpu sim --control-plane real` as a user runs it: the printed kubeconfig reaches a
real kube-apiserver, a vGPU pod made with plain kubectl runs with its claim and confirmed
allocation record, and Ctrl-C leaves no process and no file behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from simkube.waiting import wait_for

from jupyter_vgpu.core import contract as c

pytestmark = pytest.mark.slow

NAMES = c.DEFAULT_NAMES
POD = f"""
apiVersion: v1
kind: Pod
metadata: {{name: by-hand}}
spec:
  schedulerName: {c.SCHEDULER_NAME}
  containers:
    - name: notebook
      image: jupyter/base-notebook
      resources:
        limits: {{{NAMES.core_resource}: "25", {NAMES.memory_resource}: "16"}}
"""


def test_sim_control_plane_real_prints_a_kubeconfig_that_runs_a_vgpu_pod(tmp_path: Path) -> None:
    sim = subprocess.Popen([sys.executable, "-m", "jupyter_vgpu.cli", "sim", "--control-plane", "real"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(sim.stdout), daemon=True)  # until it exits
    reader.start()
    try:
        wait_for(lambda: any("Press Ctrl-C" in line for line in lines) or sim.poll() is not None, timeout=180,
                 interval=0.2, what="jupyter-vgpu sim to say the cluster is up")
        assert sim.poll() is None, "".join(lines)
        guide = "".join(lines)
        kubeconfig = re.search(r"kubeconfig: (\S+)", guide).group(1)
        kubectl = re.search(r"^\s+(\S+ kubectl) --kubeconfig", guide, re.M).group(1).split()
        workdir = Path(kubeconfig).parent

        def run(*args: str, input: str | None = None) -> str:
            return subprocess.run([*kubectl, "--kubeconfig", kubeconfig, *args], input=input, capture_output=True,
                                  text=True, check=True, timeout=60).stdout

        server = json.loads(run("version", "-o", "json"))["serverVersion"]["gitVersion"]
        assert f"Kubernetes {server})" in guide and server.startswith("v1.")
        run("apply", "-f", "-", input=POD)

        def confirmed() -> dict | None:
            pod = json.loads(run("get", "pod", "by-hand", "-o", "json"))
            notes = pod["metadata"].get("annotations") or {}
            return pod if pod["status"].get("phase") == "Running" and notes.get(NAMES.gpu_assigned) == "true" else None

        pod = wait_for(confirmed, timeout=60, interval=0.5, what="the pod Running with its record confirmed")
        notes = pod["metadata"]["annotations"]
        assert notes[NAMES.predicate_node] == pod["spec"]["nodeName"]
        [share] = c.PodAllocation.from_json(notes[NAMES.allocation]).containers[0].cards
        assert (share.cores, share.memory_units) == (25, 16)
        children = psutil.Process(sim.pid).children(recursive=True)
        assert {"kube", "kubelet", "fake-cri"} <= {Path(p.exe()).name for p in children}
    finally:
        if sim.poll() is None:
            os.killpg(sim.pid, signal.SIGINT)
        sim.wait(90)
        reader.join(10)
    rest = "".join(lines)
    assert sim.returncode == 0, rest
    assert "stopping" in rest
    gone = psutil.wait_procs(children, timeout=30)[1]
    assert gone == [], f"left running: {gone}"
    assert not workdir.exists()
