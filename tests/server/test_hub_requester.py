"""The JupyterHub requester against a real JupyterHub running jupyter_vgpu.hub's restart endpoint.

The Hub runs ``VGPUHub(config=c).configure(c)`` with an in-memory proxy and a recording
spawner; requests are made with the token the Hub gave the (stand-in) server, exactly as
a notebook server would. The Hub stops the server (revoking that token), starts it with the
new share, and the restarted server reads the outcome.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from simkube.waiting import wait_for

from jupyter_vgpu.core import contract
from jupyter_vgpu.requesters.hub import HANDED_OVER, HUB_RESTART_SCOPE, HubRequester
from jupyter_vgpu.requesters.tracker import RequestTracker

HERE = Path(__file__).resolve().parent
HUBFILES = HERE.parent / "hub" / "hubfiles"  # null_proxy.MemoryProxy, shared with the Hub tests
ADMIN = secrets.token_hex(16)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Hub:
    def __init__(self, tmp: Path, vgpu: bool = True) -> None:
        self.tmp = tmp
        self.hub_port = free_port()
        self.api = f"http://127.0.0.1:{self.hub_port}/hub/api"
        self.spawn_log = tmp / "spawns.jsonl"
        config = tmp / "jupyterhub_config.py"
        vgpu_lines = """
from jupyter_vgpu.hub import VGPUHub
def refuse_40(spawner):  # stands for a share the cluster cannot place
    if spawner.user_options.get("vgpu_cores") == 40:
        raise RuntimeError("no node has 40 % of a card free")
c.Spawner.pre_spawn_hook = refuse_40
c.VGPUHub.default_limit = {"cores": 50, "memory": "20GiB"}
VGPUHub(config=c).configure(c)
c.Spawner.apply_user_options = c.KubeSpawner.apply_user_options
""" if vgpu else ""
        config.write_text(f"""
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {free_port()}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {self.hub_port}
c.JupyterHub.proxy_class = "null_proxy.MemoryProxy"
c.JupyterHub.spawner_class = "server_hub_support.RecordingSpawner"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = {{"alice"}}
c.JupyterHub.db_url = "sqlite:///{tmp}/hub.sqlite"
c.JupyterHub.cookie_secret = bytes.fromhex("{secrets.token_hex(32)}")
c.JupyterHub.services = [{{"name": "test-admin", "api_token": "{ADMIN}"}}]
c.JupyterHub.load_roles = [{{"name": "test-admin", "scopes": ["admin:users", "admin:servers", "tokens"],
                             "services": ["test-admin"]}}]
{vgpu_lines}
""")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(HUBFILES), os.environ.get("PYTHONPATH", "")]),
                   VGPU_TEST_SPAWN_LOG=str(self.spawn_log), CONFIGPROXY_AUTH_TOKEN="unused")
        self.log = open(tmp / "hub.log", "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(config)], cwd=tmp, env=env,
            stdout=self.log, stderr=subprocess.STDOUT)

    def call(self, method: str, path: str, body=None, token: str = ADMIN):
        request = urllib.request.Request(self.api + path, method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"token {token}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read().decode()
                return response.status, json.loads(text) if text else None
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def wait(self, condition, what: str, timeout: float = 120):
        def while_running():
            if self.process.poll() is not None:
                raise AssertionError("JupyterHub exited:\n" + (self.tmp / "hub.log").read_text()[-3000:])
            return condition()

        try:
            return wait_for(while_running, timeout=timeout, interval=0.2, what=what)
        except TimeoutError as error:
            raise AssertionError(f"{error}:\n" + (self.tmp / "hub.log").read_text()[-3000:]) from None

    def ready(self) -> None:
        def up():
            try:
                return self.call("GET", "/")[0] == 200
            except OSError:
                return False
        self.wait(up, "JupyterHub to start")
        assert self.call("POST", "/users/alice")[0] in (201, 409)

    def spawns(self) -> list[dict]:
        if not self.spawn_log.exists():
            return []
        return [json.loads(line) for line in self.spawn_log.read_text().splitlines()]

    def start_server(self, options: dict | None = None) -> str:
        """Start alice's server (stopping a running one first); the token the Hub gave it."""
        self.call("DELETE", "/users/alice/server")
        self.wait(lambda: not self.server(), "the server to stop")
        before = len(self.spawns())
        status, body = self.call("POST", "/users/alice/server", body=options or {})
        assert status in (201, 202), body
        self.wait(lambda: (self.server() or {}).get("ready"), "the server to start")
        return self.spawns()[before]["token"]

    def server(self) -> dict | None:
        _, user = self.call("GET", "/users/alice")
        return (user.get("servers") or {}).get("")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    hub = Hub(tmp_path_factory.mktemp("hub"))
    try:
        hub.ready()
        yield hub
    finally:
        hub.stop()


def new_server_env(hub, token):
    """What the restarted server sees: its new token, and the share as VGPU_* env."""
    return {"JUPYTERHUB_API_URL": hub.api, "JUPYTERHUB_API_TOKEN": token, "JUPYTERHUB_USER": "alice",
            contract.ENV_CORES: "30", contract.ENV_MEMORY_MIB: "8192", contract.ENV_NODE: "gpu-a",
            contract.ENV_DEVICE_INDICES: "1", contract.ENV_DEVICE_UUIDS: "GPU-1111"}


def test_request_restarts_the_server_and_the_new_server_reads_the_outcome(hub):
    old_token = hub.start_server({"image": "kept"})
    before = len(hub.spawns())
    tracker = RequestTracker(HubRequester.from_environ(
        {"JUPYTERHUB_API_URL": hub.api, "JUPYTERHUB_API_TOKEN": old_token, "JUPYTERHUB_USER": "alice"},
        poll_interval=0.2, timeout=120))
    request = tracker.submit(30, 32)
    handed = tracker.wait(request.id, timeout=180)
    # this server was stopped by the Hub (its token revoked): it hands over and says so
    assert handed.state == "pending" and handed.handed_over and handed.message == HANDED_OVER
    assert handed.progress[:2] == ["asking for 30 % of one card with 8 GiB",
                                   "asking the Hub to restart your server with the new share"]
    hub.wait(lambda: len(hub.spawns()) > before and (hub.server() or {}).get("ready"), "the restarted server")
    spawn = hub.spawns()[before]
    assert spawn["user_options"] == {"image": "kept", contract.HUB_OPTION_CORES: 30, contract.HUB_OPTION_MEMORY_UNITS: 32}
    # the restarted server's own tracker shows the outcome, with where the share landed
    restarted = RequestTracker(HubRequester.from_environ(new_server_env(hub, spawn["token"])))
    latest = hub.wait(lambda: (r := restarted.latest()) and r.state != "pending" and r, "the outcome")
    assert latest.state == "scheduled" and latest.cores == 30 and latest.memoryUnits == 32
    assert latest.message == "the server restarted with the new share: on gpu-a, card 1 (GPU-1111)"
    assert latest.cards == [{"index": 1, "uuid": "GPU-1111", "cores": 30, "memoryMib": 8192}]
    assert restarted.get(latest.id).state == "scheduled"


def test_a_share_that_does_not_start_is_reported_after_the_fallback(hub):
    hub.start_server({contract.HUB_OPTION_CORES: 25, contract.HUB_OPTION_MEMORY_UNITS: 16})
    before = len(hub.spawns())
    token = hub.spawns()[-1]["token"]
    assert HubRequester(hub.api, token, "alice", poll_interval=0.2).request(40, 16, lambda m: None).state == "pending"
    hub.wait(lambda: len(hub.spawns()) >= before + 1 and (hub.server() or {}).get("ready"), "the fallback start")
    restarted = RequestTracker(HubRequester(hub.api, hub.spawns()[-1]["token"], "alice"))
    latest = hub.wait(lambda: (r := restarted.latest()) and r.state != "pending" and r, "the outcome")
    assert latest.state == "failed" and "no node has 40 % of a card free" in latest.message
    assert hub.server()["user_options"][contract.HUB_OPTION_CORES] == 25


def test_over_the_limit_is_refused_before_anything_stops(hub):
    token = hub.start_server()
    started = hub.server()["started"]
    outcome = HubRequester(hub.api, token, "alice").request(100, 0, lambda m: None)
    assert outcome.state == "failed" and "more than the default limit allows" in outcome.message
    assert hub.server()["started"] == started


def test_a_token_without_the_scope_is_told_what_to_grant(hub):
    hub.start_server()
    status, body = hub.call("POST", "/users/alice/tokens", {"scopes": ["read:users:name!user=alice"]})
    assert status == 201, body
    outcome = HubRequester(hub.api, body["token"], "alice").request(25, 16, lambda m: None)
    assert outcome.state == "failed" and f"{HUB_RESTART_SCOPE}!server" in outcome.message
    assert "VGPUHub(config=c).configure(c)" in outcome.message


def test_a_hub_without_jupyter_vgpu_is_explained(tmp_path):
    plain = Hub(tmp_path, vgpu=False)
    try:
        plain.ready()
        token = plain.start_server()
        outcome = HubRequester(plain.api, token, "alice").request(25, 16, lambda m: None)
        assert outcome.state == "failed" and "ask your admin to enable it" in outcome.message
    finally:
        plain.stop()


class TestRestartedServerAPI:
    """Through the REST API: the server that comes back from a Hub restart serves the outcome."""

    @pytest.fixture
    def vgpu_config(self, hub, monkeypatch):
        old_token = hub.start_server()
        before = len(hub.spawns())
        assert HubRequester(hub.api, old_token, "alice", poll_interval=0.2).request(
            30, 32, lambda m: None).state == "pending"  # handed over: the Hub restarts it
        hub.wait(lambda: len(hub.spawns()) > before and (hub.server() or {}).get("ready"), "the restart")
        for key, value in new_server_env(hub, hub.spawns()[before]["token"]).items():
            monkeypatch.setenv(key, value)
        return {"source": "none", "requester": "jupyterhub"}

    def test_get_requests_returns_the_hubs_outcome(self, run, jp_fetch):
        def final():
            body = json.loads(run(jp_fetch("vgpu", "api", "requests")).body)
            return body if body["state"] != "pending" else None

        body = wait_for(final, timeout=60, interval=0.2, what="the Hub's outcome")
        assert body["state"] == "scheduled" and body["id"].startswith("hub-") and body["handed_over"]
        assert body["node"] == "gpu-a" and body["cards"][0]["uuid"] == "GPU-1111"
        again = json.loads(run(jp_fetch("vgpu", "api", "requests", body["id"])).body)
        assert again["state"] == "scheduled"
