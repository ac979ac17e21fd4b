"""The kube-scheduler / API server version-skew check the extender makes at start.

The verdicts follow Kubernetes' policy (kube-scheduler at most one minor older than
kube-apiserver, never newer); the versions are read from the simulated API's /version
(v1.32.0-vgpu-sim) and from the extender's own pod, as in the vgpu-scheduler Deployment.
"""

from __future__ import annotations

import os
import subprocess
import threading

import pytest
from simkube.waiting import wait_for
from test_cli import EXE, free_port
from vgpu_plugin.extender.version_skew import check_paired_scheduler, image_tag, judge

NAMESPACE = "vgpu-system"


@pytest.mark.parametrize(("server", "image", "level"), [
    ("v1.32.0", "registry.k8s.io/kube-scheduler:v1.32.4", "ok"),
    ("v1.33.2", "registry.k8s.io/kube-scheduler:v1.32.4", "ok"),         # one minor older: allowed
    ("v1.30.6-eks-7f9249a", "registry.k8s.io/kube-scheduler:v1.32.4", "fail"),  # newer than the server
    ("v1.34.1", "registry.k8s.io/kube-scheduler:v1.32.4", "fail"),       # two minors older: unsupported
    ("v1.27.16+k3s1", "registry.k8s.io/kube-scheduler:v1.27.16", "ok"),
    ("v1.32.0", "registry.k8s.io/kube-scheduler@sha256:" + "0" * 64, "warn"),  # digest only: cannot tell
    ("v1.32.0", "mirror.example.org:5000/kube-scheduler:v1.31.0@sha256:" + "1" * 64, "ok"),
    ("garbage", "registry.k8s.io/kube-scheduler:v1.32.4", "warn"),
])
def test_verdicts_follow_the_skew_policy(server, image, level):
    verdict = judge(server, image)
    assert verdict.level == level, verdict.message
    if level != "ok":
        assert "newTag" in verdict.remedy or "scheduler-1." in verdict.remedy or "by hand" in verdict.remedy


def test_remedy_names_the_servers_own_version():
    verdict = judge("v1.29.10", "registry.k8s.io/kube-scheduler:v1.32.4")
    assert "newTag: v1.29.<patch>" in verdict.remedy and "registry.k8s.io/kube-scheduler" in verdict.remedy


def test_image_tag_ignores_registry_ports_and_digests():
    assert image_tag("mirror.example.org:5000/kube-scheduler") is None
    assert image_tag("mirror.example.org:5000/kube-scheduler:v1.30.1@sha256:ab") == "v1.30.1"


def scheduler_pod(core_v1, name: str, tag: str) -> None:
    core_v1.create_namespaced_pod(NAMESPACE, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"containers": [
            {"name": "kube-scheduler", "image": f"registry.k8s.io/kube-scheduler:{tag}"},
            {"name": "extender", "image": "ghcr.io/jupyter-vgpu/jupyter-vgpu-node:0.1.0"}]}})


@pytest.fixture
def namespace(core_v1):
    core_v1.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    return core_v1


def test_check_reads_the_pod_and_the_api_servers_version(kube, namespace):
    scheduler_pod(namespace, "in-policy", "v1.31.9")
    scheduler_pod(namespace, "too-old", "v1.29.3")
    client = kube.api_client()
    assert check_paired_scheduler(client, NAMESPACE, "in-policy", "kube-scheduler").level == "ok"
    verdict = check_paired_scheduler(client, NAMESPACE, "too-old", "kube-scheduler")
    assert verdict.level == "fail" and "v1.29.3" in verdict.message and "v1.32.0-vgpu-sim" in verdict.message
    assert check_paired_scheduler(client, NAMESPACE, "in-policy", "scheduler").level == "warn"
    missing = check_paired_scheduler(client, NAMESPACE, "no-such-pod", "kube-scheduler")
    assert missing.level == "warn" and "cannot check" in missing.message


def test_extender_logs_the_skew_at_start(kube, namespace):
    """The installed command with the Deployment's environment: a warning in its log, and it keeps serving."""
    scheduler_pod(namespace, "vgpu-scheduler-7d9f", "v1.33.0")
    env = dict(os.environ, VGPU_EXTENDER_PORT=str(free_port()), VGPU_EXTENDER_KUBECONFIG=kube.kubeconfig,
               VGPU_EXTENDER_POD_NAME="vgpu-scheduler-7d9f", VGPU_EXTENDER_POD_NAMESPACE=NAMESPACE)
    process = subprocess.Popen([EXE, "extender"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    try:
        wait_for(lambda: any("version skew" in line for line in lines), timeout=60, what="the skew warning")
        (line,) = [line for line in lines if "version skew" in line]
        assert "WARNING" in line and "kube-scheduler v1.33.0 with API server v1.32.0-vgpu-sim" in line
        assert "newer than the API server" in line and process.poll() is None
    finally:
        process.terminate()
        process.wait(30)
