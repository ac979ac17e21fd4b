"""End to end: JupyterHub + KubeSpawner on the simulated cluster.

A user picks "¼ GPU · 20 GiB"; KubeSpawner creates the pod on the simulated API with the
limits and schedulerName our hooks set; the kube-scheduler stand-in asks the extender, which
picks the card and binds; the kubelet stand-in calls the device plugin's Allocate and runs
the real single-user server (with the jupyter_vgpu server extension) as a local process;
its ``vgpu/api/allocation`` answers the share from the node's metrics API. Then the server
asks the Hub, with its own token, for half a card, and comes back with it.
"""

from __future__ import annotations

import pytest
from hub_support import (
    allocated,
    free_port,
    hub_cluster,
    running_hub,
    server_get,
    sim_cluster_config,
    start_and_wait,
)

from jupyter_vgpu.core import contract

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(topology_fixtures):
    try:
        from vgpu_plugin.demo.cluster import NodeSpec
    except ImportError as error:
        pytest.fail(f"the simulated cluster (vgpu_plugin.demo.cluster) is not there: {error}")
    node = NodeSpec("gpu-a", "a100-sxm-4gpu-nv4.txt", model="NVIDIA A100-SXM4-80GB", memory_mib=81920)
    with hub_cluster([node], topology_fixtures, "vghub-", metrics_period=0.2) as running:
        yield running


@pytest.fixture
def hub(tmp_path, cluster):
    config = sim_cluster_config("""
        from jupyter_vgpu.hub import VGPUHub

        c.VGPUHub.default_limit = {"cores": 50, "memory": "40GiB"}
        VGPUHub(config=c).configure(c)
    """, port=free_port())
    with running_hub(tmp_path, config, env={"KUBECONFIG": cluster.kubeconfig}, users=("alice",)) as running:
        yield running


def test_a_vgpu_profile_runs_a_server_that_reports_its_share(cluster, hub):
    start_and_wait(cluster, hub, {"profile": "vgpu-quarter"})
    pod = cluster.read_pod("default", "jupyter-alice")
    assert pod["spec"]["schedulerName"] == contract.SCHEDULER_NAME
    assert pod["spec"]["nodeName"] == "gpu-a"
    assert pod["metadata"]["annotations"][contract.DEFAULT_NAMES.gpu_assigned] == "true"

    answer = hub.wait(lambda: (lambda a: a if a["state"] == "allocated" else None)(
        server_get(cluster, hub, "vgpu/api/allocation")), "the server's allocation")
    assert answer["source"] == "node-api"
    allocation = answer["allocation"]
    assert (allocation["cores"], allocation["memoryMib"]) == (25, 20 * 1024)
    assert allocation["pod"] == "jupyter-alice" and allocation["node"] == "gpu-a"

    # the server asks the Hub, with its own token, for half a card (as %vgpu request does)
    env = cluster.node("gpu-a").kubelet.env("default", "jupyter-alice", "notebook")
    assert env[contract.ENV_HUB_REQUESTED_CORES] == "25" and env[contract.ENV_HUB_MAX_CORES] == "50"
    status, record = hub.call("POST", "/vgpu/restart/alice", token=env["JUPYTERHUB_API_TOKEN"],
                              body={contract.HUB_OPTION_CORES: 50, contract.HUB_OPTION_MEMORY_UNITS: 160})
    assert status == 202, record

    def finished():
        status, record = hub.call("GET", "/vgpu/restart/alice")
        return record if status == 200 and record["state"] != "pending" else None

    record = hub.wait(finished, "the restart", timeout=240)
    assert record["state"] == "scheduled", record
    answer = hub.wait(lambda: (lambda a: a if a["state"] == "allocated" else None)(
        server_get(cluster, hub, "vgpu/api/allocation")), "the restarted server's allocation")
    assert (answer["allocation"]["cores"], answer["allocation"]["memoryMib"]) == (50, 40 * 1024)
    assert hub.server("alice")["user_options"]["profile"] == "vgpu-quarter"  # kept


def test_a_cpu_profile_stays_off_the_vgpu_scheduler(cluster, hub):
    status, body = hub.call("POST", "/users/alice/server", body={"profile": "cpu"})
    assert status in (201, 202), body
    pod = hub.wait(lambda: cluster.read_pod("default", "jupyter-alice"), "alice's pod")
    assert pod["spec"].get("schedulerName", "default-scheduler") != contract.SCHEDULER_NAME
    assert not (pod["spec"]["containers"][0].get("resources", {}).get("limits") or {}).keys() & set(contract.DEFAULT_NAMES.resources)


def test_a_share_request_from_the_notebook_restarts_it_through_the_hub(cluster, hub):
    """The user's path: the panel / %vgpu request POST vgpu/api/requests on their server."""
    start_and_wait(cluster, hub, {"profile": "vgpu-quarter"})
    hub.wait(lambda: allocated(cluster, hub), "the first allocation")
    old_uid = cluster.read_pod("default", "jupyter-alice")["metadata"]["uid"]
    request = server_get(cluster, hub, "vgpu/api/requests", body={"cores": 50, "memory": "40GiB"})
    assert request["state"] == "pending", request

    def restarted() -> dict | None:
        pod = cluster.read_pod("default", "jupyter-alice")
        if pod is None or pod["metadata"]["uid"] == old_uid:
            status, record = hub.call("GET", "/vgpu/restart/alice")
            assert status in (200, 404), record
            return None
        return allocated(cluster, hub)

    try:
        answer = hub.wait(restarted, "the server to come back with the new share", timeout=240)
    except AssertionError:
        try:
            latest = server_get(cluster, hub, f"vgpu/api/requests/{request['id']}")
        except OSError as error:
            latest = f"(server unreachable: {error})"
        raise AssertionError(f"the notebook's share request did not restart it; its request state: {latest}") from None
    assert (answer["allocation"]["cores"], answer["allocation"]["memoryMib"]) == (50, 40 * 1024)


def test_the_spawn_form_offers_the_shares_and_explains_a_refusal(cluster, hub):
    """A browser's path: log in, see the profiles, type a custom share above the limit."""
    import http.cookiejar
    import re
    import urllib.error
    import urllib.parse
    import urllib.request

    base = hub.api.removesuffix("/api")
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def page(path: str, form: dict | None = None, status: int = 200) -> str:
        data = None if form is None else urllib.parse.urlencode(form).encode()
        try:
            with opener.open(base + path, data=data, timeout=60) as response:
                code, text = response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            code, text = error.code, error.read().decode()
        assert code == status, (path, code, text[-2000:])
        return text

    def xsrf(html: str) -> str:
        # forms carry it as a hidden input; every page has it in its JS config
        found = re.search(r'name="_xsrf"[^>]*value="([^"]+)"', html) or re.search(r'xsrf_token: "([^"]+)"', html)
        assert found, html[-3000:]
        return found.group(1)

    login = page("/login")
    page("/login", {"username": "alice", "password": "any", "_xsrf": xsrf(login)})
    form = page("/spawn")
    for label in ("CPU only", "¼ GPU · 20 GiB", "½ GPU · 40 GiB", "Custom vGPU share"):
        assert label in form
    assert '"vgpu-one"' not in form  # the default limit is half a card
    answer = page("/spawn", {"_xsrf": xsrf(form), "profile": "vgpu-custom",
                             "profile-option-vgpu-custom--vgpu-share--unlisted-choice": "90% 8GiB"}, status=400)
    assert "more than the default limit allows" in answer
    assert cluster.read_pod("default", "jupyter-alice") is None  # nothing was started
