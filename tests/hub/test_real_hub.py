"""The server role and apply_user_options in a real JupyterHub process.

The Hub runs with ``VGPUHub(config=c).configure(c)``; single-user servers are local
stand-in processes (tests/hub/hubfiles/standin_server.py) that record the API token the
Hub gives them, so the test can act with exactly the permissions a real server has.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from jupyter_vgpu.core import contract

HUBFILES = Path(__file__).parent / "hubfiles"
ADMIN_TOKEN = "vgpu-test-admin-" + "0" * 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Hub:
    def __init__(self, root: Path, port: int) -> None:
        self.root, self.api = root, f"http://127.0.0.1:{port}/hub/api"

    def call(self, method: str, path: str, token: str = ADMIN_TOKEN, body=None) -> tuple[int, object]:
        request = urllib.request.Request(
            self.api + path, method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read()
                return response.status, json.loads(text) if text.strip() else None
        except urllib.error.HTTPError as error:
            text = error.read()
            try:
                return error.code, json.loads(text)
            except ValueError:
                return error.code, text.decode(errors="replace")

    def server(self, user: str, name: str = "") -> dict | None:
        status, model = self.call("GET", f"/users/{user}")
        assert status == 200, model
        return model["servers"].get(name)

    def wait(self, condition, what: str, timeout: float = 90.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; hub log:\n{(self.root / 'hub.log').read_text()[-3000:]}")

    def token_of(self, user: str) -> str:
        return (self.root / f"{user}.token").read_text()

    def start(self, user: str, options: dict | None = None) -> str:
        (self.root / f"{user}.token").unlink(missing_ok=True)
        status, body = self.call("POST", f"/users/{user}/server", body=options or {})
        assert status in (201, 202), body
        self.wait(lambda: (self.server(user) or {}).get("ready"), f"{user}'s server")
        return self.token_of(user)


@pytest.fixture
def hub(tmp_path):
    port = free_port()
    config = tmp_path / "jupyterhub_config.py"
    config.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HUBFILES)!r})
        from jupyter_vgpu.hub import VGPUHub

        c.JupyterHub.proxy_class = "null_proxy.MemoryProxy"
        c.JupyterHub.hub_ip = "127.0.0.1"
        c.JupyterHub.hub_port = {port}
        c.JupyterHub.authenticator_class = "dummy"
        c.Authenticator.allow_all = True
        c.JupyterHub.db_url = "sqlite:///{tmp_path}/hub.sqlite"
        c.JupyterHub.cookie_secret_file = "{tmp_path}/cookie_secret"
        c.JupyterHub.services = [{{"name": "test-admin", "api_token": {ADMIN_TOKEN!r}}}]
        c.JupyterHub.load_roles = [{{"name": "test-admin", "services": ["test-admin"],
                                     "scopes": ["admin:users", "admin:servers", "read:users",
                                                "custom:jupyter-vgpu:restart"]}}]
        c.JupyterHub.allow_named_servers = True
        c.JupyterHub.spawner_class = "simple"
        c.Spawner.cmd = [{sys.executable!r}, {str(HUBFILES / 'standin_server.py')!r}]
        c.Spawner.environment = {{"STANDIN_RECORD_DIR": {str(tmp_path)!r}}}
        c.Spawner.http_timeout = 60
        c.Spawner.start_timeout = 60

        def refuse_40(spawner):  # stands for a share the cluster cannot place
            if spawner.user_options.get("vgpu_cores") == 40:
                raise RuntimeError("no node has 40 % of a card free")
        c.Spawner.pre_spawn_hook = refuse_40

        c.VGPUHub.default_limit = {{"cores": 50, "memory": "20GiB"}}
        VGPUHub(config=c).configure(c)
        # this Hub spawns local processes; the same hook KubeSpawner would run
        c.Spawner.apply_user_options = c.KubeSpawner.apply_user_options
    """))
    log = open(tmp_path / "hub.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(config)], cwd=tmp_path,
                               stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    hub = Hub(tmp_path, port)

    def up():
        if process.poll() is not None:
            raise AssertionError(f"the Hub exited:\n{(tmp_path / 'hub.log').read_text()[-3000:]}")
        try:
            return hub.call("GET", "/")[0] == 200
        except OSError:
            return False

    try:
        hub.wait(up, "the Hub to start", timeout=120)
        for user in ("alice", "bob"):
            assert hub.call("POST", f"/users/{user}")[0] == 201
        yield hub
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def restart(hub, token, user="alice", **share):
    return hub.call("POST", f"/vgpu/restart/{user}", token=token, body=share)


def wait_restart(hub, user="alice"):
    def done():
        status, record = hub.call("GET", f"/vgpu/restart/{user}")
        assert status == 200, record
        return record if record["state"] != "pending" else None
    return hub.wait(done, "the restart to finish")


@pytest.mark.slow
def test_server_restarts_itself_with_a_new_share_keeping_its_options(hub):
    old_token = hub.start("alice", {"image": "kept"})
    status, record = restart(hub, old_token, vgpu_cores=30, vgpu_memory_units=32)
    assert status == 202 and record["state"] == "pending", record
    record = wait_restart(hub)
    assert record["state"] == "scheduled", record
    server = hub.server("alice")
    assert server["ready"]
    assert server["user_options"] == {"image": "kept", contract.HUB_OPTION_CORES: 30, contract.HUB_OPTION_MEMORY_UNITS: 32}
    new_token = hub.wait(lambda: (hub.root / "alice.token").exists() and hub.token_of("alice"), "the new token")
    assert new_token != old_token
    assert hub.call("GET", "/user", token=old_token)[0] == 403  # stopping revoked it
    status, record = hub.call("GET", "/vgpu/restart/alice", token=new_token)
    assert status == 200 and record["state"] == "scheduled"  # the new server can read the outcome


@pytest.mark.slow
def test_a_share_that_does_not_start_falls_back_to_the_previous_one(hub):
    token = hub.start("alice", {contract.HUB_OPTION_CORES: 25, contract.HUB_OPTION_MEMORY_UNITS: 16})
    assert restart(hub, token, vgpu_cores=40, vgpu_memory_units=16)[0] == 202
    record = wait_restart(hub)
    assert record["state"] == "failed"
    assert "no node has 40 % of a card free" in record["message"] and "runs again with the previous share" in record["message"]
    server = hub.server("alice")
    assert server["ready"] and server["user_options"][contract.HUB_OPTION_CORES] == 25


@pytest.mark.slow
def test_bad_or_over_limit_share_is_refused_before_anything_stops(hub):
    token = hub.start("alice")
    status, body = restart(hub, token, vgpu_cores=100)
    assert status == 400 and "more than the default limit allows" in body["message"], body
    status, body = restart(hub, token, vgpu_cores=30)
    assert status == 400 and "needs vgpu_memory_units" in body["message"], body
    status, body = restart(hub, token, vgpu_cores=30, vgpu_memory_units=8, profile="x")
    assert status == 400, body
    assert hub.server("alice")["ready"] and hub.token_of("alice") == token


@pytest.mark.slow
def test_server_token_reaches_nothing_else(hub):
    alice = hub.start("alice")
    hub.start("bob")
    assert restart(hub, alice, user="bob", vgpu_cores=10, vgpu_memory_units=4)[0] == 403
    assert hub.call("DELETE", "/users/bob/server", token=alice)[0] == 403
    assert hub.call("DELETE", "/users/alice/server", token=alice)[0] == 403  # restarts go through the Hub
    assert hub.call("POST", "/users/alice/servers/second", token=alice, body={})[0] == 403
    assert hub.call("POST", "/users/alice/tokens", token=alice, body={"scopes": ["servers"]})[0] == 403
    assert hub.server("bob")["ready"] and hub.server("alice")["ready"]


@pytest.mark.slow
def test_hub_refuses_an_over_limit_spawn_with_the_reason(hub):
    status, body = hub.call("POST", "/users/alice/server", body={contract.HUB_OPTION_CORES: 100})
    assert status == 400
    assert "more than the default limit allows" in body["message"], body
