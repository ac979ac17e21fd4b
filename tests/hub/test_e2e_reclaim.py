"""Issue 17 end to end: idle GPU shares are warned about, then given back.

The real JupyterHub + KubeSpawner on the simulated cluster (as test_e2e_sim_cluster.py);
the reclaimer runs in this process with a fast (injected) clock and talks to the real
Hub REST API with its own token and role, to the node daemon's scrape listener with the
scrape token, and records Events through the simulated Kubernetes API. Usage is driven
by pinning the simulated GPU processes of the real notebook servers.

- alice: idle; warned, keeps her GPU once (a second keep is refused), then her server is
  restarted without a GPU, and the file she wrote is still there;
- bob: computing: never warned;
- carol: idle but in an exempt group: left alone;
- dave: hoarding (memory held, no compute), in a group whose override stops servers:
  caught later than idle (hoard limit) and stopped;
- a dry run over the same timeline first changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hub_support import ADMIN_TOKEN, Hub, free_port, running_hub
from prometheus_client.parser import text_string_to_metric_families

from jupyter_vgpu.reclaimer.hubconfig import ENV_RECLAIMER_URL

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from server_api_support import check_response  # noqa: E402  (docs/server-api.yaml, as tests/server check it)

from jupyter_vgpu.reclaimer.service import VGPUReclaimer

REPO = Path(__file__).resolve().parents[2]
RECLAIMER_TOKEN = "vgpu-reclaimer-test-" + "1" * 32
MIN = 60.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def cluster(topology_fixtures: Path) -> Iterator[Any]:
    from vgpu_plugin.demo.cluster import NodeSpec, SimCluster

    node = NodeSpec("gpu-a", "a100-sxm-4gpu-nv4.txt", model="NVIDIA A100-SXM4-80GB", memory_mib=81920)
    workdir = tempfile.mkdtemp(prefix="vgrec-", dir="/tmp")
    try:
        with SimCluster([node], workdir=workdir, fixtures_dir=topology_fixtures, run_processes=True, enforcement="none", metrics_period=0.2) as running:
            yield running
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def default_scheduler(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The cluster's default-scheduler (the stand-in, no extender): CPU-only servers run too."""
    from simkube.scheduler import SimScheduler
    from vgpu_plugin.informer import Informer

    config = tmp_path_factory.mktemp("scheduler") / "default.yaml"
    config.write_text("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
                      "profiles:\n  - schedulerName: default-scheduler\n")
    scheduler = SimScheduler(cluster.api_client(), str(config), informer=Informer).start()
    yield scheduler
    scheduler.stop()


@pytest.fixture(scope="module")
def homes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("homes")
    for user in ("alice", "bob", "carol", "dave"):
        (root / user).mkdir()
    return root


@pytest.fixture(scope="module")
def reclaimer_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory, cluster: Any, default_scheduler: Any, homes: Path,
        reclaimer_port: int) -> Iterator[Hub]:
    config = f"""
        from jupyter_vgpu.hub import VGPUHub
        from jupyter_vgpu.reclaimer.hubconfig import configure_reclaimer

        c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
        c.KubeSpawner.namespace = "default"
        c.KubeSpawner.image = "jupyter-vgpu/singleuser:test"
        c.KubeSpawner.cmd = [{sys.executable!r}, "-m", "jupyterhub.singleuser"]
        def own_port(spawner):  # the stand-in kubelet runs every server on this host: one port each
            import socket
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                spawner.port = s.getsockname()[1]
        c.KubeSpawner.pre_spawn_hook = own_port
        c.KubeSpawner.args = ["--allow-root"]
        c.KubeSpawner.events_enabled = False
        c.KubeSpawner.start_timeout = 180
        c.KubeSpawner.http_timeout = 120
        c.KubeSpawner.notebook_dir = {str(homes)!r} + "/{{username}}"   # the "home volume"
        c.KubeSpawner.environment = {{"JUPYTER_CONFIG_PATH": {str(REPO / "jupyter-config")!r}}}
        c.KubeSpawner.profile_list = [{{"display_name": "CPU only", "slug": "cpu", "default": True}}]
        c.JupyterHub.load_groups = {{"exempt": {{"users": ["carol"]}}, "hoarders": {{"users": ["dave"]}}}}
        VGPUHub(config=c).configure(c)
        configure_reclaimer(c, url="http://127.0.0.1:{reclaimer_port}", api_token={RECLAIMER_TOKEN!r})
    """
    with running_hub(tmp_path_factory.mktemp("hub"), config, env={"KUBECONFIG": cluster.kubeconfig},
                     users=("alice", "bob")) as running:
        yield running


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Running:
    """A reclaimer on its own event loop thread (its API answers between passes)."""

    def __init__(self, reclaimer: VGPUReclaimer, cluster: Any) -> None:
        self.reclaimer, self.cluster = reclaimer, cluster
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = self.call(self._listen())

    async def _listen(self) -> Any:
        return self.reclaimer.listen()

    def call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(300)

    def pass_at(self, clock: Clock, minutes: float) -> None:
        """One pass at the given fake time, over usage sampled since the last pass."""
        sampler = self.cluster.node("gpu-a").daemon.metrics_server.sampler
        taken = sampler.samples_taken
        self.cluster.wait_for(lambda: sampler.samples_taken >= taken + 3, timeout=60)
        clock.now = START + minutes * MIN
        self.call(self.reclaimer.run_once())
        self.call(self.reclaimer.wait_idle())

    def close(self) -> None:
        async def stop() -> None:
            self.server.stop()

        self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


START = 1_800_000_000.0


def make_reclaimer(cluster: Any, hub: Hub, port: int, clock: Clock, **traits: Any) -> VGPUReclaimer:
    return VGPUReclaimer(
        clock=clock, api_client=cluster.api_client(), hub_api_url=hub.api, api_token=RECLAIMER_TOKEN,
        bind_url=f"http://127.0.0.1:{port}", service_prefix="/services/vgpu-reclaimer/",
        node_urls=[cluster.node("gpu-a").scrape_url], scrape_token=cluster.scrape_token,
        idle_utilization=2.0, idle_memory_mib=500, idle_minutes=10, hoard_minutes=20, grace_minutes=5,
        postpone_minutes=10, max_postpones=1, action="cpu", exempt_groups=["exempt"],
        group_overrides={"hoarders": {"action": "stop"}}, **traits)


def notebook_logs(cluster: Any) -> str:
    logs = sorted(Path(cluster.workdir).glob("**/logs/*.log"))
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs) or "(no process logs)"


def pod_of(cluster: Any, user: str) -> dict[str, Any] | None:
    return cluster.read_pod("default", f"jupyter-{user}")


def pin(cluster: Any, user: str, memory_mib: int, utilization: float) -> None:
    """Make the user's simulated GPU process use exactly this (as a real notebook would)."""
    node = cluster.node("gpu-a")

    def pid() -> int | None:
        pod = pod_of(cluster, user)
        admitted = node.kubelet.admitted(pod["metadata"]["uid"]) if pod else None
        return admitted.containers[0].gpu_pid if admitted and admitted.containers else None

    node.gpus.set_usage(cluster.wait_for(pid, timeout=60), memory_mib, utilization)


def busy_then_scenario(cluster: Any) -> None:
    """Everyone computes for a few samples, then the scenario: a new reclaimer's first pass
    (-5 min) reads both and sees everyone active; from its next pass on, only the scenario."""
    for user in ("alice", "bob", "carol", "dave"):
        pin(cluster, user, 4000, 50)
    sampler = cluster.node("gpu-a").daemon.metrics_server.sampler
    taken = sampler.samples_taken
    cluster.wait_for(lambda: sampler.samples_taken >= taken + 3, timeout=60)
    pin(cluster, "alice", 0, 0)  # idle
    pin(cluster, "bob", 6000, 40)  # computing
    pin(cluster, "carol", 0, 0)  # idle, exempt
    pin(cluster, "dave", 9000, 0)  # hoarding


def server_call(cluster: Any, user: str, path: str, method: str = "GET", body: Any = None) -> Any:
    pod = pod_of(cluster, user)
    assert pod is not None, f"{user} has no pod"
    port = pod["spec"]["containers"][0]["ports"][0]["containerPort"]
    request = urllib.request.Request(f"http://{pod['status']['podIP']}:{port}/user/{user}/{path}", method=method,
                                     headers={"Authorization": f"token {ADMIN_TOKEN}"},
                                     data=None if body is None else json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def reclaimer_call(port: int, path: str, token: str, method: str = "GET") -> tuple[int, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/services/vgpu-reclaimer/api/v1/{path}",
                                     method=method, data=b"" if method == "POST" else None,
                                     headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def events(cluster: Any) -> list[tuple[str, str, str]]:
    listed = cluster.core_v1.list_namespaced_event("default")
    return sorted((e.involved_object.name, e.reason, e.message) for e in listed.items
                  if e.source and e.source.component == "vgpu-reclaimer")


def user_token(cluster: Any, user: str) -> str:
    """The token of the user's running server (it acts as the user)."""
    return cluster.node("gpu-a").kubelet.env("default", f"jupyter-{user}", "notebook")["JUPYTERHUB_API_TOKEN"]


def test_idle_shares_are_warned_kept_and_reclaimed_active_and_exempt_ones_are_not(
        cluster: Any, hub: Hub, homes: Path, reclaimer_port: int) -> None:
    for user in ("alice", "bob", "carol", "dave"):
        status, body = hub.call("POST", f"/users/{user}/server", body={"profile": "vgpu-quarter"})
        assert status in (201, 202), body
    for user in ("alice", "bob", "carol", "dave"):
        hub.wait(lambda user=user: (hub.server(user) or {}).get("ready"), f"{user}'s server", timeout=300)
    uids = {u: pod_of(cluster, u)["metadata"]["uid"] for u in ("alice", "bob", "carol", "dave")}
    env = cluster.node("gpu-a").kubelet.env("default", "jupyter-alice", "notebook")
    assert env[ENV_RECLAIMER_URL] == f"http://127.0.0.1:{reclaimer_port}/services/vgpu-reclaimer/api/v1/"
    server_call(cluster, "alice", "api/contents/keep-me.txt", "PUT",
                {"type": "file", "format": "text", "content": "my work"})

    # --- a dry run over the whole timeline changes nothing --------------------------------
    clock = Clock()
    dry = Running(make_reclaimer(cluster, hub, reclaimer_port, clock, dry_run=True), cluster)
    try:
        busy_then_scenario(cluster)
        for minute in (-5, 0, 10, 15, 20, 25, 30):
            dry.pass_at(clock, minute)
        counters = dry.reclaimer.counters
        assert counters.dry_run.labels("act", "idle")._value.get() == 1  # alice would have been reclaimed
        assert counters.dry_run.labels("act", "hoarding")._value.get() == 1  # and dave
        status, view = reclaimer_call(reclaimer_port, "servers/alice", user_token(cluster, "alice"))
        assert status == 200 and view["dryRun"] is True
    finally:
        dry.close()
    assert events(cluster) == []
    assert {u: pod_of(cluster, u)["metadata"]["uid"] for u in uids} == uids
    assert all((hub.server(u) or {}).get("ready") for u in uids)

    # --- the real thing --------------------------------------------------------------------
    clock = Clock()
    running = Running(make_reclaimer(cluster, hub, reclaimer_port, clock), cluster)
    try:
        alice_token, bob_token = user_token(cluster, "alice"), user_token(cluster, "bob")
        busy_then_scenario(cluster)
        running.pass_at(clock, -5)
        running.pass_at(clock, 0)
        running.pass_at(clock, 5)
        status, view = reclaimer_call(reclaimer_port, "servers/alice", alice_token)
        assert status == 200 and view["phase"] == "idle" and view["quietSeconds"] == 5 * MIN
        running.pass_at(clock, 10)  # alice idle 10 min: warned, reclaim at 15
        status, view = reclaimer_call(reclaimer_port, "servers/alice", alice_token)
        assert (view["phase"], view["reason"], view["secondsLeft"], view["postponesLeft"]) == \
            ("warned", "idle", 5 * MIN, 1)
        # another user's token does not read it
        assert reclaimer_call(reclaimer_port, "servers/alice", bob_token)[0] == 403
        assert reclaimer_call(reclaimer_port, "servers/alice/keep", bob_token, "POST")[0] == 403
        assert reclaimer_call(reclaimer_port, "servers/alice", "not-a-token")[0] == 403

        # the notebook server shows it (its panel's banner, %vgpu status)
        shown = server_call(cluster, "alice", "vgpu/api/reclaim")
        check_response("reclaim", "GET", 200, shown)
        assert shown["state"] == "watched" and shown["reclaim"]["phase"] == "warned"

        # "keep my GPU" from the notebook: the deadline moves 10 min; a second keep is refused (max 1)
        clock.now = START + 12 * MIN
        kept = server_call(cluster, "alice", "vgpu/api/reclaim/keep", "POST", {})
        check_response("reclaim/keep", "POST", 200, kept)
        view = kept["reclaim"]
        assert view["secondsLeft"] == 13 * MIN and view["postponesLeft"] == 0
        status, refused = reclaimer_call(reclaimer_port, "servers/alice/keep", alice_token, "POST")
        assert status == 409 and "postponed 1 times" in refused["message"]
        running.pass_at(clock, 15)
        running.pass_at(clock, 20)  # dave has hoarded 20 min: warned
        assert pod_of(cluster, "alice")["metadata"]["uid"] == uids["alice"]  # kept
        assert reclaimer_call(reclaimer_port, "servers/dave", ADMIN_TOKEN)[1]["phase"] == "warned"

        running.pass_at(clock, 25)  # alice's postponed deadline, dave's deadline
        assert running.reclaimer.reclaims[("alice", "")]["outcome"] == "done", running.reclaimer.reclaims
        try:
            hub.wait(lambda: (hub.server("alice") or {}).get("ready"), "alice's restarted server", timeout=300)
        except AssertionError:
            lines = (hub.root / "hub.log").read_text().splitlines()
            raise AssertionError("\n".join(line for line in lines if "GET /hub/api/users" not in line)[-5000:]
                                 + notebook_logs(cluster)) from None
        assert hub.server("dave") is None  # the hoarders' override: stopped
        alice_pod = pod_of(cluster, "alice")
        assert alice_pod["metadata"]["uid"] != uids["alice"]
        limits = alice_pod["spec"]["containers"][0].get("resources", {}).get("limits") or {}
        assert not any("vcuda" in name for name in limits), limits  # no GPU
        assert hub.server("alice")["user_options"]["vgpu_cores"] == 0
        # her files survive
        assert server_call(cluster, "alice", "api/contents/keep-me.txt")["content"] == "my work"
        shown = server_call(cluster, "alice", "vgpu/api/reclaim")  # what her panel says after the restart
        check_response("reclaim", "GET", 200, shown)
        view = shown["reclaim"]
        assert view["phase"] == "none" and view["lastReclaim"]["action"] == "cpu"
        assert view["lastReclaim"]["reason"] == "idle" and view["lastReclaim"]["outcome"] == "done"

        for minute in (30, 40, 60):  # bob computes, carol is exempt: never touched
            running.pass_at(clock, minute)
        assert pod_of(cluster, "bob")["metadata"]["uid"] == uids["bob"]
        assert pod_of(cluster, "carol")["metadata"]["uid"] == uids["carol"]
        assert reclaimer_call(reclaimer_port, "servers/carol", ADMIN_TOKEN)[1]["phase"] == "exempt"
        assert reclaimer_call(reclaimer_port, "servers/bob", bob_token)[1]["phase"] == "active"

        # every step on record: Events on the pods, counters
        recorded = events(cluster)
        reasons = [(pod, reason) for pod, reason, _ in recorded]
        assert reasons == [("jupyter-alice", "VGPUIdleWarning"), ("jupyter-alice", "VGPUReclaimPostponed"),
                           ("jupyter-alice", "VGPUReclaimed"), ("jupyter-dave", "VGPUIdleWarning"),
                           ("jupyter-dave", "VGPUReclaimed")]
        status, listing = reclaimer_call(reclaimer_port, "servers", alice_token)
        assert status == 403
        status, listing = reclaimer_call(reclaimer_port, "servers", ADMIN_TOKEN)
        assert status == 200 and {s["user"] for s in listing["servers"]} == {"bob", "carol"}
        with urllib.request.urlopen(f"http://127.0.0.1:{reclaimer_port}/services/vgpu-reclaimer/metrics") as r:
            families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
        reclaimed = {tuple(sorted(s.labels.items())): s.value for s in families["vgpu_reclaimer_shares_reclaimed"].samples
                     if s.name.endswith("_total")}
        assert reclaimed == {(("action", "cpu"), ("reason", "idle")): 1.0,
                             (("action", "stop"), ("reason", "hoarding")): 1.0}
        # the admin page: names for admins, 403 for everyone else
        page = urllib.request.Request(f"http://127.0.0.1:{reclaimer_port}/services/vgpu-reclaimer/admin",
                                      headers={"Authorization": f"token {ADMIN_TOKEN}"})
        with urllib.request.urlopen(page) as response:
            text = response.read().decode()
        assert "jupyter-bob" in text and "carol" in text and "exempt" in text
        assert "GPU share reclaimed: idle for 25 min" in text and "postpone 1 of 1" in text
        page = urllib.request.Request(page.full_url, headers={"Authorization": f"token {bob_token}"})
        try:
            urllib.request.urlopen(page)
            raise AssertionError("a user read the admin page")
        except urllib.error.HTTPError as error:
            assert error.code == 403
        hours = {s.labels["reason"]: s.value for s in families["vgpu_reclaimer_gpu_hours_returned"].samples
                 if s.name.endswith("_total")}
        # alice: 25 % of a card, quiet 0 -> 25 min; dave: 25 %, quiet 0 -> 25 min
        assert hours == {"idle": pytest.approx(0.25 * 25 / 60), "hoarding": pytest.approx(0.25 * 25 / 60)}
    finally:
        running.close()
