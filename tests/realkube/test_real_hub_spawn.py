"""JupyterHub + KubeSpawner spawning a vGPU profile on the real cluster.

A real JupyterHub process (tests/hub's ``running_hub``: dummy authenticator, in-memory proxy)
runs KubeSpawner wired by ``VGPUHub(config=c).configure(c)``, with the real cluster's admin
kubeconfig in ``KUBECONFIG`` (what kubernetes_asyncio loads when KubeSpawner starts its
client), in a namespace of its own. Alice starts "¼ GPU · 20 GiB" through the Hub's REST API,
exactly as the spawn form does. What is real end to end: KubeSpawner's pod (limits from the
profile, ``schedulerName`` and tolerations from our modify_pod hook) created on kube-apiserver,
kube-scheduler binding it through our extender (the Binding carries the claim annotations),
the kubelet admitting it with the device plugin's Allocate answer, KubeSpawner's reflector
seeing it Running, and the Hub's stop deleting it.

The path chosen, and why: the whole Hub spawn, not ``get_pod_manifest`` called by hand. On
Kubernetes' fake CRI runtime the notebook container never runs, so nothing would answer the
Hub's HTTP check at the pod's (fake) IP and the spawn would time out and be torn down. So the
test plays the container's process itself: it reads the environment the kubelet handed the
container from the fake runtime's record (the Hub's API token, ``JUPYTERHUB_SERVICE_URL``, the
device plugin's ``VGPU_*``) and starts tests/hub's stand-in server with exactly that
environment on this host, where ``c.KubeSpawner.pod_connect_ip = "127.0.0.1"`` makes the Hub
look for it. The Hub then marks the server ready by its own check, the token the kubelet gave
the container is one the Hub honours for alice, and the Hub's DELETE goes through KubeSpawner's
real stop (a pod delete it waits on until its reflector sees the pod gone).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from realkube_support import GPU_A, GPU_B, MIG, annotations

from jupyter_vgpu.core import contract as c

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hub"))
from hub_support import HUBFILES, Hub, free_port, running_hub  # noqa: E402 (tests/hub's Hub helpers)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

NAMESPACE = "jhub"
POD = "jupyter-alice"


@pytest.fixture(scope="module")
def jhub(real: Any) -> Iterator[str]:
    """The Hub's namespace, once the controller-manager gave it the default service account
    (without it the ServiceAccount admission plugin refuses every pod there)."""
    real.kubectl("create", "namespace", NAMESPACE)
    real.wait_for(lambda: real.kubectl("get", "serviceaccount", "-n", NAMESPACE, "default", check=False),
                  timeout=60, what=f"the default service account of namespace {NAMESPACE}")
    yield NAMESPACE
    real.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


@pytest.fixture
def hub(tmp_path: Path, real: Any, jhub: str) -> Iterator[Hub]:
    config = f"""
        from jupyter_vgpu.hub import VGPUHub

        c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
        c.KubeSpawner.namespace = {jhub!r}
        # a tagged image with KubeSpawner's IfNotPresent: the fake CRI gives pulled images a size
        c.KubeSpawner.image = "jupyter-vgpu/singleuser:test"
        c.KubeSpawner.port = {free_port()}
        # the fake CRI runs no container: its process is played on this host (see the docstring)
        c.KubeSpawner.pod_connect_ip = "127.0.0.1"
        c.KubeSpawner.start_timeout = 120
        c.KubeSpawner.http_timeout = 90
        c.KubeSpawner.profile_list = [{{"display_name": "CPU only", "slug": "cpu", "default": True}}]
        c.VGPUHub.default_limit = {{"cores": 50, "memory": "40GiB"}}
        VGPUHub(config=c).configure(c)
    """
    with running_hub(tmp_path, config, env={"KUBECONFIG": real.kubeconfig}, users=("alice",)) as running:
        yield running


def container_env(real: Any, node: str) -> dict[str, str]:
    """What the kubelet on ``node`` gave the notebook container (the fake CRI's record of it)."""
    def created() -> dict[str, str] | None:
        try:
            return real.node(node).container_env(NAMESPACE, POD, "notebook")
        except KeyError:
            return None
    return real.wait_for(created, timeout=30, what=f"the kubelet on {node} to create {POD}'s notebook container")


def play_container(env: dict[str, str], record_dir: Path) -> subprocess.Popen[bytes]:
    """tests/hub's stand-in server with the container's environment, on this host's loopback
    (KubeSpawner's pod binds 0.0.0.0 inside its own network namespace; here there is none)."""
    url = urllib.parse.urlparse(env["JUPYTERHUB_SERVICE_URL"])
    local = url._replace(netloc=f"127.0.0.1:{url.port}").geturl()
    return subprocess.Popen(
        [sys.executable, str(HUBFILES / "standin_server.py")],
        env={"PATH": os.environ.get("PATH", ""), **env, "JUPYTERHUB_SERVICE_URL": local,
             "STANDIN_RECORD_DIR": str(record_dir)})


def test_a_vgpu_profile_spawned_by_the_hub_runs_on_real_kubernetes_and_stops(
        real: Any, hub: Hub, pods: list, names: c.Names, tmp_path: Path) -> None:
    status, body = hub.call("POST", "/users/alice/server", body={"profile": "vgpu-quarter"})
    assert status in (201, 202), body
    pods.append((NAMESPACE, POD))  # deleted after the test should the Hub's stop not get there

    try:
        pod = real.wait_for_pod(NAMESPACE, POD, timeout=90)
    except Exception as error:
        events = real.kubectl("get", "events", "-n", NAMESPACE, "-o", "wide", check=False)
        raise AssertionError(f"{error}\nevents:\n{events}\nhub log:\n"
                             f"{(hub.root / 'hub.log').read_text()[-3000:]}") from None

    # KubeSpawner's pod, with what the profile and our modify_pod hook put on it
    spec, notebook = pod["spec"], pod["spec"]["containers"][0]
    assert notebook["name"] == "notebook"
    request = c.Request(25, c.parse_memory_size("20GiB"))
    limits = notebook["resources"]["limits"]
    assert {k: v for k, v in limits.items() if k in names.resources} == c.request_limits(request, names)
    assert limits[names.core_resource] == "25"
    assert spec["schedulerName"] == c.SCHEDULER_NAME
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert pod["metadata"]["labels"]["hub.jupyter.org/username"] == "alice"
    hints = {e["name"]: e.get("value") for e in notebook.get("env") or []}
    assert (hints[c.ENV_HUB_REQUESTED_CORES], hints[c.ENV_HUB_MAX_CORES]) == ("25", "50")

    # bound by the real kube-scheduler through our extender: the Binding carried the claim
    node = spec["nodeName"]
    assert node in (GPU_A, GPU_B, MIG)
    assert annotations(pod)[names.predicate_node] == node
    [share] = c.PodAllocation.from_json(annotations(pod)[names.allocation]).containers[0].cards
    assert (share.cores, share.memory_units) == (request.cores, request.memory_units)
    described = real.kubectl("describe", "pod", "-n", NAMESPACE, POD)
    assert f"Successfully assigned {NAMESPACE}/{POD} to {node}" in described
    scheduled = json.loads(real.kubectl("get", "events", "-n", NAMESPACE, "--field-selector",
                                        f"involvedObject.name={POD},reason=Scheduled", "-o", "json"))["items"]
    assert {e.get("reportingComponent") or e["source"].get("component") for e in scheduled} == {c.SCHEDULER_NAME}

    # admitted by the real kubelet: the container got the device plugin's Allocate answer and the Hub's env
    env = container_env(real, node)
    assert (env["VGPU_CORES"], env["VGPU_MEMORY_MIB"]) == ("25", str(20 * 1024))
    assert env[c.ENV_NVIDIA_VISIBLE_DEVICES] == share.uuid
    assert env["VGPU_POD_UID"] == pod["metadata"]["uid"]
    assert env["JUPYTERHUB_USER"] == "alice" and env[c.ENV_HUB_REQUESTED_CORES] == "25"

    # the container's process (played here): the Hub's own check finds it, and the spawn completes
    server = play_container(env, tmp_path)
    try:
        hub.wait(lambda: (hub.server("alice") or {}).get("ready"), "alice's server to be ready", timeout=120)
        model = hub.server("alice")
        assert model["url"] == "/user/alice/" and model["user_options"] == {"profile": "vgpu-quarter"}
        assert model["state"]["pod_name"] == POD
        # the token the kubelet gave the container is alice's server's token in the Hub
        status, me = hub.call("GET", "/user", token=env["JUPYTERHUB_API_TOKEN"])
        assert status == 200 and me["name"] == "alice", me
        running = real.read_pod(NAMESPACE, POD)
        assert running["metadata"]["uid"] == pod["metadata"]["uid"] and running["status"]["phase"] == "Running"

        # the Hub's stop: KubeSpawner deletes the pod and waits until it is gone
        status, body = hub.call("DELETE", "/users/alice/server")
        assert status in (202, 204), body
        hub.wait(lambda: hub.server("alice") is None, "alice's server to stop", timeout=90)
        assert real.read_pod(NAMESPACE, POD) is None
    finally:
        server.terminate()
        server.wait(10)
    assert hub.call("GET", "/user", token=env["JUPYTERHUB_API_TOKEN"])[0] == 403  # stopping revoked it
