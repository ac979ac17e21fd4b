"""The JupyterHub requester against a real JupyterHub (subprocess, in-memory proxy, recording spawner).

A share request stops the user's server and starts it again with the share as
``user_options``; a server token without the ``servers`` scope gets a message saying
what the admin must grant, and nothing is stopped.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from jupyter_vgpu.core import contract
from jupyter_vgpu.server.requests import HubRequester, RequestTracker

HERE = Path(__file__).resolve().parent
ADMIN = secrets.token_hex(16)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Hub:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port, self.hub_port = free_port(), free_port()
        self.api = f"http://127.0.0.1:{self.hub_port}/hub/api"
        self.spawn_log = tmp / "spawns.jsonl"
        config = tmp / "jupyterhub_config.py"
        config.write_text(f"""
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {self.port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {self.hub_port}
c.JupyterHub.proxy_class = "hub_support.MemoryProxy"
c.JupyterHub.spawner_class = "hub_support.RecordingSpawner"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = {{"alice"}}
c.JupyterHub.db_url = "sqlite:///{tmp}/hub.sqlite"
c.JupyterHub.cookie_secret = bytes.fromhex("{secrets.token_hex(32)}")
c.JupyterHub.services = [{{"name": "test-admin", "api_token": "{ADMIN}"}}]
c.JupyterHub.load_roles = [{{"name": "test-admin", "scopes": ["admin:users", "admin:servers", "tokens"],
                             "services": ["test-admin"]}}]
c.JupyterHub.log_level = "INFO"
""")
        env = dict(os.environ, PYTHONPATH=f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                   VGPU_TEST_SPAWN_LOG=str(self.spawn_log), CONFIGPROXY_AUTH_TOKEN="unused")
        self.log = open(tmp / "hub.log", "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(config)], cwd=tmp, env=env,
            stdout=self.log, stderr=subprocess.STDOUT)

    def call(self, method: str, path: str, body=None, token: str = ADMIN):  # type: ignore[no-untyped-def]
        request = urllib.request.Request(self.api + path, method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"token {token}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read().decode()
                return response.status, json.loads(text) if text else None
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError("JupyterHub exited:\n" + (self.tmp / "hub.log").read_text()[-3000:])
            try:
                if self.call("GET", "/")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError("JupyterHub did not start:\n" + (self.tmp / "hub.log").read_text()[-3000:])

    def spawns(self) -> list[dict]:
        if not self.spawn_log.exists():
            return []
        return [json.loads(line) for line in self.spawn_log.read_text().splitlines()]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):  # type: ignore[no-untyped-def]
    hub = Hub(tmp_path_factory.mktemp("hub"))
    try:
        hub.wait_ready()
        assert hub.call("POST", "/users/alice")[0] in (201, 409)
        yield hub
    finally:
        hub.stop()


def running_server(hub: Hub) -> dict:
    status, _ = hub.call("POST", "/users/alice/server")
    assert status in (201, 202, 400), status  # 400: already running
    deadline = time.monotonic() + 60
    while True:
        _, user = hub.call("GET", "/users/alice")
        server = (user.get("servers") or {}).get("")
        if server and server.get("ready"):
            return server
        assert time.monotonic() < deadline, user
        time.sleep(0.2)


def token(hub: Hub, scopes: list[str]) -> str:
    status, body = hub.call("POST", "/users/alice/tokens", {"scopes": scopes, "note": "vgpu test"})
    assert status == 201, body
    return body["token"]


def test_request_restarts_the_server_with_the_share(hub):  # type: ignore[no-untyped-def]
    running_server(hub)
    before = len(hub.spawns())
    server_token = token(hub, ["servers!user=alice", "read:users:name!user=alice"])
    tracker = RequestTracker(HubRequester(hub.api, server_token, "alice", poll_interval=0.2, timeout=120))
    request = tracker.submit(25, 16)
    current = tracker.wait(request.id, timeout=180)
    assert current.state == "scheduled", current.message
    assert "restarted with 25 % of one card with 4 GiB" in current.message
    spawns = hub.spawns()[before:]
    assert spawns == [{"user": "alice", "user_options": {contract.HUB_OPTION_CORES: 25,
                                                         contract.HUB_OPTION_MEMORY_UNITS: 16}}]
    assert current.progress == ["asking for 25 % of one card with 4 GiB", "checking this server's permissions with the Hub",
                                "stopping your server", "starting your server with 25 % of one card with 4 GiB"]
    _, user = hub.call("GET", "/users/alice")
    assert user["servers"][""]["ready"] and user["servers"][""]["user_options"][contract.HUB_OPTION_CORES] == 25


def test_release_restarts_without_a_share(hub):  # type: ignore[no-untyped-def]
    running_server(hub)
    before = len(hub.spawns())
    server_token = token(hub, ["servers!user=alice"])
    outcome = HubRequester(hub.api, server_token, "alice", poll_interval=0.2).request(0, 0, lambda m: None)
    assert outcome.state == "scheduled" and "no GPU (release)" in outcome.message
    assert hub.spawns()[before:][0]["user_options"] == {contract.HUB_OPTION_CORES: 0, contract.HUB_OPTION_MEMORY_UNITS: 0}


def test_a_token_without_the_scope_gets_told_what_to_grant(hub):  # type: ignore[no-untyped-def]
    server = running_server(hub)
    before = len(hub.spawns())
    weak = token(hub, ["read:users:name!user=alice", "users:activity!user=alice"])
    outcome = HubRequester(hub.api, weak, "alice").request(25, 16, lambda m: None)
    assert outcome.state == "failed"
    assert "servers!server" in outcome.message and "c.JupyterHub.load_roles" in outcome.message
    _, user = hub.call("GET", "/users/alice")
    assert user["servers"][""]["started"] == server["started"] and len(hub.spawns()) == before  # untouched


def test_a_bad_token_is_a_clear_failure(hub):  # type: ignore[no-untyped-def]
    outcome = HubRequester(hub.api, "not-a-token", "alice").request(25, 16, lambda m: None)
    assert outcome.state == "failed" and "did not accept this server's token (HTTP 403" in outcome.message
