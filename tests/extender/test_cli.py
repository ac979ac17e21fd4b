"""`jupyter-vgpu extender` as an installed command: flags, environment fallbacks, SIGTERM."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from extender_support import GIB_UNITS, binding_args, get, node, pod, post
from simkube.waiting import wait_for

# the entry point installed beside this interpreter (the venv's), else the one on PATH
EXE = shutil.which("jupyter-vgpu", path=os.path.dirname(sys.executable)) or shutil.which("jupyter-vgpu")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_help_lists_flags_and_env():
    out = subprocess.run([EXE, "extender", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for flag in ("--port", "--address", "--kubeconfig", "--policy", "--prefix", "--domain", "--metrics-port",
                 "--tls-cert", "--tls-key", "--client-ca", "--rival-wait", "--admission-backlog"):
        assert flag in out.stdout
    assert "VGPU_EXTENDER_PORT" in out.stdout


def test_bad_flags_exit_2_with_a_reason(tmp_path):
    out = subprocess.run([EXE, "extender", "--policy", "roundrobin"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "invalid choice: 'roundrobin'" in out.stderr
    out = subprocess.run([EXE, "extender", "--domain", "Not A Domain", "--kubeconfig", str(tmp_path / "x")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "is not a DNS subdomain" in out.stderr
    out = subprocess.run([EXE, "extender", "--kubeconfig", str(tmp_path / "missing")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "cannot load the Kubernetes configuration" in out.stderr
    for wait in ("-1", "nan", "inf", "1e12"):  # inf would pass `>= 0` and crash every waiting bind (OverflowError)
        out = subprocess.run([EXE, "extender", "--rival-wait", wait], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "--rival-wait must be a number of seconds from 0 to 3600" in out.stderr
    out = subprocess.run([EXE, "extender", "--admission-backlog", "-1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--admission-backlog must be 0 (no limit) or a number of pods" in out.stderr


def test_runs_from_environment_and_stops_on_sigterm(cluster):
    cluster.add_node(node("gpu-a", count=1))
    port = free_port()
    env = dict(os.environ, VGPU_EXTENDER_PORT=str(port), VGPU_EXTENDER_KUBECONFIG=cluster.kube.kubeconfig,
               VGPU_EXTENDER_PREFIX="/custom", VGPU_EXTENDER_POLICY="spread", VGPU_EXTENDER_RIVAL_WAIT="0.5")
    process = subprocess.Popen([EXE, "extender"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _up(base), timeout=60, what="the extender to answer /healthz")
        created = cluster.add_pod(pod("nb", cores=20, memory_units=2 * GIB_UNITS))
        status, reply = post(f"{base}/custom/bind", binding_args(created, "gpu-a"))
        assert (status, reply) == (200, {"Error": ""})
        assert cluster.read_pod("nb")["spec"]["nodeName"] == "gpu-a"
        # as many vcuda-core, more memory, "nb" not admitted yet: refused after the environment's wait
        rival = cluster.add_pod(pod("rival", cores=20, memory_units=4 * GIB_UNITS))
        status, reply = post(f"{base}/custom/bind", binding_args(rival, "gpu-a"))
        assert status == 200 and "pod default/nb there asks for 20 vcuda-core" in reply["Error"]
        assert "within 0.5 s" in reply["Error"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _up(base: str) -> bool:
    try:
        return get(f"{base}/healthz", timeout=2)[0] == 200
    except OSError:
        time.sleep(0.1)
        return False
