"""A real JupyterHub process for tests: started from a config body, talked to over its REST API."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

from simkube.waiting import wait_for

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
        try:
            return wait_for(condition, timeout=timeout, interval=0.2, what=what)
        except TimeoutError as error:
            raise AssertionError(f"{error}; hub log:\n{(self.root / 'hub.log').read_text()[-3000:]}") from None

    def token_of(self, user: str) -> str:
        return (self.root / f"{user}.token").read_text()

    def start(self, user: str, options: dict | None = None) -> str:
        (self.root / f"{user}.token").unlink(missing_ok=True)
        status, body = self.call("POST", f"/users/{user}/server", body=options or {})
        assert status in (201, 202), body
        self.wait(lambda: (self.server(user) or {}).get("ready"), f"{user}'s server")
        return self.token_of(user)



COMMON_CONFIG = """
import sys
sys.path.insert(0, {hubfiles!r})
c.JupyterHub.proxy_class = "null_proxy.MemoryProxy"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_connect_ip = "127.0.0.1"
c.JupyterHub.hub_port = {port}
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.JupyterHub.db_url = "sqlite:///{root}/hub.sqlite"
c.JupyterHub.cookie_secret_file = "{root}/cookie_secret"
c.JupyterHub.services = [{{"name": "test-admin", "api_token": {admin!r}}}]
c.JupyterHub.load_roles = [{{"name": "test-admin", "services": ["test-admin"],
                             "scopes": ["admin:users", "admin:servers", "read:users", "access:servers",
                                        "custom:jupyter-vgpu:restart"]}}]
"""


@contextlib.contextmanager
def running_hub(root: Path, config: str, env: Mapping[str, str] | None = None,
                users: tuple[str, ...] = ("alice", "bob")) -> Iterator[Hub]:
    """JupyterHub with the common test settings, then ``config`` (which must call VGPUHub.configure)."""
    port = free_port()
    path = root / "jupyterhub_config.py"
    path.write_text(COMMON_CONFIG.format(hubfiles=str(HUBFILES), port=port, root=root, admin=ADMIN_TOKEN)
                    + textwrap.dedent(config))
    log = open(root / "hub.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(path)], cwd=root,
                               stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    hub = Hub(root, port)

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the Hub exited:\n{(root / 'hub.log').read_text()[-3000:]}")
        try:
            return hub.call("GET", "/")[0] == 200
        except OSError:
            return False

    try:
        hub.wait(up, "the Hub to start", timeout=120)
        for user in users:
            assert hub.call("POST", f"/users/{user}")[0] == 201
        yield hub
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()
