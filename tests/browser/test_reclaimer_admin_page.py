"""Issue 17: the GPU reclaimer's admin page in Debian's Chromium, through the Hub's OAuth.

A real JupyterHub (KubeSpawner on the simulated cluster) runs Bob's vGPU server; the
reclaimer (in this process, as an external Hub service with its own token and role) makes a
pass over the Hub's servers and the node daemon's usage. An admin who logs in to the Hub
sees who holds which share; Bob, logged in as himself and let onto the service, gets its 403
and no names; Eve, not let onto it, is refused by the Hub before she reaches it.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from simkube.waiting import wait_for

from jupyter_vgpu.data import TOPOLOGY_DIR

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hub"))
from hub_support import Hub, free_port, running_hub, sim_cluster_config  # noqa: E402 (tests/hub's Hub helpers)

RECLAIMER_TOKEN = "vgpu-reclaimer-browser-" + "2" * 32
PREFIX = "/services/vgpu-reclaimer/"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def cluster() -> Iterator[Any]:
    from vgpu_plugin.demo.cluster import NodeSpec, SimCluster

    node = NodeSpec("gpu-a", "a100-sxm-4gpu-nv4.txt", model="NVIDIA A100-SXM4-80GB", memory_mib=81920)
    workdir = tempfile.mkdtemp(prefix="vgadm-", dir="/tmp")
    try:
        with SimCluster([node], workdir=workdir, fixtures_dir=TOPOLOGY_DIR, run_processes=True,
                        enforcement="none", metrics_period=0.2) as running:
            yield running
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def hub(tmp_path: Path, cluster: Any) -> Iterator[tuple[Hub, int]]:
    port = free_port()
    callback = f"http://127.0.0.1:{port}{PREFIX}oauth_callback"
    config = sim_cluster_config(f"""
        from jupyter_vgpu.hub import VGPUHub
        from jupyter_vgpu.reclaimer.hubconfig import configure_reclaimer

        c.Authenticator.admin_users = {{"root"}}
        VGPUHub(config=c).configure(c)
        configure_reclaimer(c, url="http://127.0.0.1:{port}", api_token={RECLAIMER_TOKEN!r})
        # no proxy in these tests: the browser comes back to the service's own address
        for service in c.JupyterHub.services:
            if service["name"] == "vgpu-reclaimer":
                service.update(oauth_redirect_uri={callback!r}, oauth_no_confirm=True)
        # Bob may open the service's pages (a site that links them for everyone); Eve may not
        c.JupyterHub.load_roles = [*c.JupyterHub.load_roles, {{
            "name": "reclaimer-pages", "users": ["bob"], "scopes": ["access:services!service=vgpu-reclaimer"]}}]
    """)
    with running_hub(tmp_path, config, env={"KUBECONFIG": cluster.kubeconfig}, users=("eve",)) as running:  # root, bob: from the config
        yield running, port


@pytest.fixture
def reclaimer(hub: tuple[Hub, int], cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from urllib.parse import urlparse

    from jupyter_vgpu.reclaimer.service import VGPUReclaimer

    running, port = hub
    hub_url = running.api.removesuffix("/hub/api")
    monkeypatch.setenv("JUPYTERHUB_HOST", hub_url)  # where the browser is sent to log in
    monkeypatch.setenv("JUPYTERHUB_OAUTH_CALLBACK_URL", f"http://127.0.0.1:{port}{PREFIX}oauth_callback")
    monkeypatch.setenv("JUPYTERHUB_CLIENT_ID", "service-vgpu-reclaimer")
    service = VGPUReclaimer(api_client=cluster.api_client(), hub_api_url=running.api, api_token=RECLAIMER_TOKEN,
                            bind_url=f"http://127.0.0.1:{port}", service_prefix=PREFIX,
                            node_urls=[cluster.node("gpu-a").scrape_url], scrape_token=cluster.scrape_token,
                            dry_run=True)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def call(coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(300)

    async def listen() -> Any:
        url = urlparse(service.bind_url)
        return service.make_app().listen(url.port, url.hostname)

    server = call(listen())
    service.call = call
    try:
        yield service
    finally:
        async def stop() -> None:
            server.stop()

        call(stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def log_in(browser: Any, hub_url: str, user: str) -> Any:
    page = browser.new_context().new_page()
    page.goto(f"{hub_url}/hub/login")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", "any")
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_url("**/hub/**")
    return page


def test_the_admin_page_names_holders_to_admins_and_refuses_users(
        browser: Any, hub: tuple[Hub, int], reclaimer: Any, cluster: Any, artifacts: Path) -> None:
    running, port = hub
    status, body = running.call("POST", "/users/bob/server", body={"profile": "vgpu-quarter"})
    assert status in (201, 202), body
    running.wait(lambda: (running.server("bob") or {}).get("ready"), "bob's server", timeout=300)
    sampler = cluster.node("gpu-a").daemon.metrics_server.sampler
    taken = sampler.samples_taken
    cluster.wait_for(lambda: sampler.samples_taken >= taken + 3, timeout=60)
    reclaimer.call(reclaimer.run_once())
    assert ("bob", "") in reclaimer.shares
    hub_url = running.api.removesuffix("/hub/api")
    admin_page = f"http://127.0.0.1:{port}{PREFIX}admin"

    admin = log_in(browser, hub_url, "root")
    admin.goto(admin_page)  # -> the Hub's authorize -> the service's callback -> the page
    admin.wait_for_selector("h1:has-text('GPU shares')")
    text = admin.inner_text("body")
    assert "DRY RUN" in text
    row = admin.locator("tr", has_text="jupyter-bob")
    assert row.count() == 1 and "bob" in row.inner_text() and "gpu-a" in row.inner_text()
    admin.screenshot(path=str(artifacts / "reclaimer-admin-page.png"), full_page=True)
    admin.context.close()

    user = log_in(browser, hub_url, "bob")
    response = user.goto(admin_page)  # the same OAuth round trip, as Bob, ends in the page's refusal
    assert response is not None and response.status == 403 and user.url == admin_page
    body = user.content()
    assert "jupyter-bob" not in body and "gpu-a" not in body and "<table" not in body
    user.context.close()

    other = log_in(browser, hub_url, "eve")
    response = other.goto(admin_page)
    assert response is not None and response.status == 403 and other.url.startswith(f"{hub_url}/hub/api/oauth2/")
    assert "You do not have permission to access JupyterHub service vgpu-reclaimer" in other.inner_text("body")
    assert "jupyter-bob" not in other.content()
    other.context.close()
