"""The server role and apply_user_options in a real JupyterHub process.

The Hub runs with ``VGPUHub(config=c).configure(c)``; single-user servers are local
stand-in processes (tests/hub/hubfiles/standin_server.py) that record the API token the
Hub gives them, so the test can act with exactly the permissions a real server has.
"""

from __future__ import annotations

import sys

import pytest
from hub_support import HUBFILES, running_hub

from jupyter_vgpu.core import contract


@pytest.fixture
def hub(tmp_path):
    config = f"""
        from jupyter_vgpu.hub import VGPUHub

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
    """
    with running_hub(tmp_path, config) as running:
        yield running


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
    status, _ = hub.call("POST", "/vgpu/restart/alice", body={"vgpu_cores": 10, "vgpu_memory_units": 4})
    assert status == 409  # one restart at a time
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


def server_ready(hub, name):
    return (hub.server("alice", name) or {}).get("ready")


def start_named(hub, name, **share):
    return hub.call("POST", f"/users/alice/servers/{name}", body=share)


@pytest.mark.slow
def test_the_limit_holds_for_the_sum_over_a_users_named_servers(hub):
    """Limit 50 % / 20 GiB: a second server gets only what the first leaves, through the
    Hub's own spawn API; a restart counts the restarted server's new share, not its old one."""
    status, body = start_named(hub, "one", vgpu_cores=30, vgpu_memory_units=32)
    assert status in (201, 202), body
    hub.wait(lambda: server_ready(hub, "one"), "server one")

    status, body = start_named(hub, "two", vgpu_cores=30, vgpu_memory_units=32)
    assert status == 400, body
    assert "already hold" in body["message"] and "server 'one'" in body["message"], body
    assert "more than the default limit allows" in body["message"], body
    assert not server_ready(hub, "two")

    status, body = start_named(hub, "two", vgpu_cores=20, vgpu_memory_units=32)  # 30 + 20 = 50
    assert status in (201, 202), body
    hub.wait(lambda: server_ready(hub, "two"), "server two")

    status, body = hub.call("POST", "/vgpu/restart/alice/one", body={"vgpu_cores": 35, "vgpu_memory_units": 32})
    assert status == 400 and "server 'two'" in body["message"], body  # 35 + 20 > 50
    status, body = hub.call("POST", "/vgpu/restart/alice/one", body={"vgpu_cores": 25, "vgpu_memory_units": 16})
    assert status == 202, body  # 25 + 20: server one's old 30 is not counted
    record = hub.wait(lambda: (lambda r: r if r["state"] != "pending" else None)(
        hub.call("GET", "/vgpu/restart/alice/one")[1]), "the restart of server one")
    assert record["state"] == "scheduled", record
    assert hub.server("alice", "one")["user_options"][contract.HUB_OPTION_CORES] == 25

    # a stopped server holds nothing (its user_options stay in the Hub's database)
    status, body = hub.call("DELETE", "/users/alice/servers/two")
    assert status in (202, 204), body
    hub.wait(lambda: not (hub.server("alice", "two") or {}).get("ready") and not (hub.server("alice", "two") or {}).get("pending"),
             "server two to stop")
    status, body = start_named(hub, "three", vgpu_cores=25, vgpu_memory_units=16)  # 25 + 25 = 50
    assert status in (201, 202), body
    hub.wait(lambda: server_ready(hub, "three"), "server three")
