"""Issue 17 end to end: a spawn that cannot be placed says why, where it stands and what would
start now — on KubeSpawner's progress events — and switching to that share starts the server.

The real JupyterHub + KubeSpawner on the simulated cluster; the extender's VGPUWaiting Events
reach the Hub's progress stream (``GET /users/<name>/server/progress``, what the spawn page
shows) through KubeSpawner's pod event watch.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hub_support import ADMIN_TOKEN, Hub, free_port, hub_cluster, running_hub

from jupyter_vgpu.core import contract

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def cluster(topology_fixtures: Path) -> Iterator[Any]:
    from vgpu_plugin.demo.cluster import NodeSpec

    node = NodeSpec("gpu-a", "a100-sxm-4gpu-nv4.txt", model="NVIDIA A100-SXM4-80GB", memory_mib=81920)
    with hub_cluster([node], topology_fixtures, "vgwait-", metrics_period=0.5) as running:
        yield running


@pytest.fixture
def hub(tmp_path: Path, cluster: Any) -> Iterator[Hub]:
    config = f"""
        from jupyter_vgpu.hub import VGPUHub

        c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
        c.KubeSpawner.namespace = "default"
        c.KubeSpawner.image = "jupyter-vgpu/singleuser:test"
        c.KubeSpawner.cmd = [{sys.executable!r}, "-m", "jupyterhub.singleuser"]
        c.KubeSpawner.port = {free_port()}
        c.KubeSpawner.args = ["--allow-root"]
        c.KubeSpawner.events_enabled = True   # the spawn page shows the pod's Events
        c.KubeSpawner.start_timeout = 180
        c.KubeSpawner.http_timeout = 120
        c.KubeSpawner.environment = {{"JUPYTER_CONFIG_PATH": {str(REPO / "jupyter-config")!r}}}
        c.KubeSpawner.profile_list = [{{"display_name": "CPU only", "slug": "cpu", "default": True}}]
        c.VGPUHub.default_limit = {{"cores": 50, "memory": "40GiB"}}
        VGPUHub(config=c).configure(c)
    """
    with running_hub(tmp_path, config, env={"KUBECONFIG": cluster.kubeconfig}, users=("alice",)) as running:
        yield running


def progress_messages(hub: Hub, wanted: str, timeout: float = 120) -> list[str]:
    """Read the spawn progress stream until a message contains ``wanted``."""
    request = urllib.request.Request(hub.api + "/users/alice/server/progress",
                                     headers={"Authorization": f"token {ADMIN_TOKEN}"})
    seen: list[str] = []
    # the stream ends when the spawn does; a silent stream fails after ``timeout`` (the socket's)
    with urllib.request.urlopen(request, timeout=timeout) as stream:
        for raw in stream:
            line = raw.decode().strip()
            if line.startswith("data:"):
                event = json.loads(line[5:])
                seen.append(str(event.get("message", "")))
                if wanted in seen[-1]:
                    return seen
    raise AssertionError(f"no progress message with {wanted!r}; saw {seen}")


def test_a_spawn_that_cannot_be_placed_says_why_where_and_what_fits(cluster: Any, hub: Hub) -> None:
    for card in range(4):  # every card keeps 10 cores and 10 GiB free
        cluster.create_notebook_pod(f"filler-{card}", cores=90, memory="70GiB")
    for card in range(4):
        cluster.wait_for_pod("default", f"filler-{card}")
    status, body = hub.call("POST", "/users/alice/server", body={"profile": "vgpu-quarter"})
    assert status in (201, 202), body
    messages = progress_messages(hub, "waiting for a vGPU")
    line = next(m for m in messages if "waiting for a vGPU" in m)
    assert "position 1 of 1 waiting for a vGPU: no card on any node has 25 % and 20 GiB free" in line, line
    assert "a 10 % share with 10 GiB fits on 1 node now" in line, line

    # switch the pending request to that share: stop the pending spawn, start with it
    status, body = hub.call("DELETE", "/users/alice/server")
    assert status in (202, 204), body
    hub.wait(lambda: hub.server("alice") is None, "the pending spawn to stop", timeout=120)
    status, body = hub.call("POST", "/users/alice/server", body={
        "profile": "vgpu-quarter", contract.HUB_OPTION_CORES: 10, contract.HUB_OPTION_MEMORY_UNITS: 40})
    assert status in (201, 202), body
    hub.wait(lambda: (hub.server("alice") or {}).get("ready"), "alice's server on the smaller share", timeout=240)
    pod = cluster.read_pod("default", "jupyter-alice")
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits[contract.DEFAULT_NAMES.core_resource] == "10"
