"""Issue 17: the Hub runs `jupyter-vgpu reclaimer` as a managed service with its own role."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from hub_support import ADMIN_TOKEN, HUBFILES, free_port, running_hub


def get(url: str, token: str | None) -> tuple[int, object]:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
            return response.status, json.loads(text) if "json" in response.headers["Content-Type"] else text
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_hub_starts_the_reclaimer_and_it_answers_with_the_hub_s_tokens(tmp_path: Path) -> None:
    port = free_port()
    config = f"""
        from jupyter_vgpu.hub import VGPUHub
        from jupyter_vgpu.reclaimer.hubconfig import configure_reclaimer
        VGPUHub(config=c).configure(c)
        configure_reclaimer(c, url="http://127.0.0.1:{port}",
                            args=["--VGPUReclaimer.period_seconds=0.5", "--VGPUReclaimer.idle_minutes=30",
                                  "--VGPUReclaimer.dry_run=True", "--VGPUReclaimer.record_events=False"])
    """
    with running_hub(tmp_path, config, users=("alice",)) as hub:
        base = f"http://127.0.0.1:{port}/services/vgpu-reclaimer/"

        def listing():
            try:
                status, body = get(base + "api/v1/servers", ADMIN_TOKEN)
            except OSError:
                return None  # not listening yet
            return body if status == 200 else None

        body = hub.wait(listing, "the reclaimer service")
        assert body["dryRun"] is True and body["servers"] == []
        status, view = get(base + "api/v1/servers/alice", ADMIN_TOKEN)
        assert status == 200 and view["phase"] == "none" and view["lastReclaim"] is None
        assert get(base + "api/v1/servers/alice", None)[0] == 401
        assert get(base + "api/v1/servers/alice", "forged")[0] == 403
        # its passes run against the Hub with its own token and role (no failed pass in the log)
        hub.wait(lambda: "vgpu-reclaimer@127.0.0.1" in (hub.root / "hub.log").read_text(), "a reclaimer pass")
        log = (hub.root / "hub.log").read_text()
        assert "403 GET /hub/api/users" not in log and "pass failed" not in log
        status, text = get(base + "metrics", None)
        assert status == 200 and "vgpu_reclaimer_pass_seconds" in text


def call(url: str, token: str, method: str = "GET") -> int:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None,
                                     headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_a_token_issued_for_something_else_is_refused_even_an_admins(tmp_path: Path) -> None:
    """An admin opens Mallory's server: the Hub issues the admin's OAuth token to that server,
    with the scopes below; Mallory captures it. The Hub's /user still says ``admin: true`` for
    it, but it is not for the reclaimer: refused, as JupyterHub's HubAuthenticated refuses it.
    The tokens meant for the reclaimer keep working: a server's own token for that server, an
    admin's own token, and one issued to the reclaimer itself (the admin page's OAuth token)."""
    port = free_port()
    config = f"""
        import sys
        from jupyter_vgpu.hub import VGPUHub
        from jupyter_vgpu.reclaimer.hubconfig import configure_reclaimer
        c.JupyterHub.spawner_class = "simple"
        c.Spawner.cmd = [sys.executable, {str(HUBFILES / 'standin_server.py')!r}]
        c.Spawner.environment = {{"STANDIN_RECORD_DIR": {str(tmp_path)!r}}}
        c.Authenticator.admin_users = {{"boss"}}
        c.JupyterHub.load_roles = [*c.JupyterHub.load_roles,
                                   {{"name": "token-issuer", "services": ["test-admin"], "scopes": ["tokens"]}}]
        VGPUHub(config=c).configure(c)
        configure_reclaimer(c, url="http://127.0.0.1:{port}",
                            args=["--VGPUReclaimer.period_seconds=0.5", "--VGPUReclaimer.dry_run=True",
                                  "--VGPUReclaimer.record_events=False"])
    """
    with running_hub(tmp_path, config, users=("alice", "mallory")) as hub:
        base = f"http://127.0.0.1:{port}/services/vgpu-reclaimer/"
        hub.wait(lambda: _answers(base + "api/v1/servers"), "the reclaimer service")

        def token(scopes: list[str] | None) -> str:
            status, body = hub.call("POST", "/users/boss/tokens", body={} if scopes is None else {"scopes": scopes})
            assert status == 201, body
            return body["token"]

        identify = ["read:users:name!user", "read:users:groups!user"]  # what every OAuth token carries
        captured = token(["access:servers!server=mallory/", *identify])
        status, model = hub.call("GET", "/user", token=captured)
        assert status == 200 and model["admin"] is True and "admin:servers" not in model["scopes"], model
        for path, method in (("api/v1/servers", "GET"), ("api/v1/servers/alice/keep", "POST"),
                             ("api/v1/servers/alice", "GET"), ("api/v1/servers/boss", "GET"),
                             ("api/v1/servers/mallory", "GET"), ("admin", "GET")):
            assert call(base + path, captured, method) == 403, path

        mallorys_server = hub.start("mallory")
        assert call(base + "api/v1/servers/mallory", mallorys_server) == 200
        assert call(base + "api/v1/servers/mallory/keep", mallorys_server, "POST") in (200, 409)  # nothing to keep
        for path in ("api/v1/servers", "api/v1/servers/alice", "api/v1/servers/mallory/other", "admin"):
            assert call(base + path, mallorys_server) == 403, path
        for admins in (token(None), token(["access:services!service=vgpu-reclaimer", *identify])):
            assert call(base + "api/v1/servers", admins) == 200
            assert call(base + "api/v1/servers/alice", admins) == 200
            assert call(base + "admin", admins) == 200


def _answers(url: str) -> bool:
    try:
        return call(url, ADMIN_TOKEN) == 200
    except OSError:
        return False  # not listening yet
