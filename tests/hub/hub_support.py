"""A real JupyterHub process for tests: started from a config body, talked to over its REST API."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

import psutil
from simkube.waiting import wait_for

HUBFILES = Path(__file__).parent / "hubfiles"
JUPYTER_CONFIG = Path(__file__).resolve().parents[2] / "jupyter-config"
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



def sim_cluster_config(body: str, *, port: int | None = None, events: bool = False) -> str:
    """A Hub config spawning with KubeSpawner on the simulated cluster, then ``body`` (which must
    call VGPUHub.configure). The kubelet stand-in runs each server's command as a local process:
    with ``port`` every server listens there, without it each gets a free port of its own (for
    several users' servers at once); ``events`` shows the pod's Events on the spawn page."""
    own_port = f"c.KubeSpawner.port = {port}" if port is not None else textwrap.dedent("""
        def own_port(spawner):  # the stand-in kubelet runs every server on this host: one port each
            import socket
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                spawner.port = s.getsockname()[1]
        c.KubeSpawner.pre_spawn_hook = own_port""")
    spawner = textwrap.dedent(f"""
        c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
        c.KubeSpawner.namespace = "default"
        c.KubeSpawner.image = "jupyter-vgpu/singleuser:test"  # the kubelet stand-in runs cmd locally
        c.KubeSpawner.cmd = [{sys.executable!r}, "-m", "jupyterhub.singleuser"]
        c.KubeSpawner.args = ["--allow-root"]  # this machine runs the tests as root
        c.KubeSpawner.events_enabled = {events!r}
        c.KubeSpawner.start_timeout = 180
        c.KubeSpawner.http_timeout = 120
        # what the wheel installs into etc/jupyter: enable the server extension
        c.KubeSpawner.environment = {{"JUPYTER_CONFIG_PATH": {str(JUPYTER_CONFIG)!r}}}
        c.KubeSpawner.profile_list = [{{"display_name": "CPU only", "slug": "cpu", "default": True}}]
    """)
    return spawner + own_port + "\n" + textwrap.dedent(body)


COMMON_CONFIG = """
import sys
import tempfile
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
                             "scopes": ["admin:users", "admin:servers", "read:users", "access:servers", "access:services",
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
        stop_with_children(process)
        log.close()


def stop_with_children(process: subprocess.Popen) -> None:
    """SIGTERM the Hub, then whatever it started that outlived it: the Hub stops its managed
    services on a clean shutdown, but one killed after its grace (a loaded machine) leaves
    them running, re-parented and unseen by the next test."""
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=10)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


# --- single-user servers on the simulated cluster --------------------------------------------


@contextlib.contextmanager
def hub_cluster(nodes: list, fixtures_dir: Path, prefix: str, metrics_period: float = 0.5) -> Iterator:
    """A SimCluster whose kubelet stand-in runs the single-user servers as local processes (with
    no GPU enforcement), in a short work dir of its own under /tmp (unix socket paths live there)."""
    from vgpu_plugin.demo.cluster import SimCluster

    workdir = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    try:
        with SimCluster(nodes, workdir=workdir, fixtures_dir=fixtures_dir, run_processes=True,
                        enforcement="none", metrics_period=metrics_period) as running:
            yield running
    finally:
        shutil.rmtree(workdir, ignore_errors=True)



def notebook_logs(cluster) -> str:
    """What the single-user server processes printed (the kubelet stand-in keeps their output)."""
    logs = sorted(Path(cluster.workdir).glob("**/logs/*.log"))
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}" for p in logs) or "(no process logs)"


def server_get(cluster, hub: Hub, path: str, body: dict | None = None, user: str = "alice") -> dict:
    """GET (or POST ``body``) on ``user``'s single-user server, with a token the Hub vouches for."""
    pod = cluster.read_pod("default", f"jupyter-{user}")
    url = (f"http://{pod['status']['podIP']}:{pod['spec']['containers'][0]['ports'][0]['containerPort']}"
           f"/user/{user}/{path}")
    request = urllib.request.Request(url, headers={"Authorization": f"token {ADMIN_TOKEN}"},
                                     data=None if body is None else json.dumps(body).encode(),
                                     method="GET" if body is None else "POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def allocated(cluster, hub: Hub, user: str = "alice") -> dict | None:
    """The server's vgpu/api/allocation answer once it says "allocated", else None."""
    try:
        answer = server_get(cluster, hub, "vgpu/api/allocation", user=user)
    except (OSError, KeyError, TypeError):  # the server is restarting (no pod, no pod IP yet, refused)
        return None
    return answer if answer["state"] == "allocated" else None


def start_and_wait(cluster, hub: Hub, options: dict, user: str = "alice") -> None:
    """Start ``user``'s server with the spawn form's ``options`` and wait until the Hub says it is ready."""
    status, body = hub.call("POST", f"/users/{user}/server", body=options)
    assert status in (201, 202), body
    try:
        hub.wait(lambda: (hub.server(user) or {}).get("ready"), f"{user}'s server", timeout=240)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{notebook_logs(cluster)}") from None
