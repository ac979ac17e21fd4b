"""Issue 17 in Debian's Chromium: the reclaim warning in the panel, and the reclaimer's admin page.

A real JupyterHub (KubeSpawner on the simulated cluster) runs Bob's vGPU server; the
reclaimer (in this process, as an external Hub service with its own token and role) makes
passes over the Hub's servers and the node daemon's usage.

The banner: Bob's share goes quiet, the reclaimer warns (an injected clock); a lab with Bob's
server token and the reclaimer's URL (as the Hub's spawner gives them) shows the warning with
its countdown, and "Keep my GPU" postpones the reclaim in the reclaimer itself.

The admin page, through the Hub's OAuth: an admin who logs in to the Hub
sees who holds which share and the scheduler's queue; Bob, logged in as himself and let onto the service, gets its 403
and no names; Eve, not let onto it, is refused by the Hub before she reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import PANEL, open_lab, start_lab, stop_lab
from simkube.waiting import wait_for

from jupyter_vgpu.data import TOPOLOGY_DIR

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hub"))
from hub_support import Hub, free_port, hub_cluster, running_hub, sim_cluster_config  # noqa: E402 (tests/hub's Hub helpers)

RECLAIMER_TOKEN = "vgpu-reclaimer-browser-" + "2" * 32
PREFIX = "/services/vgpu-reclaimer/"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def cluster() -> Iterator[Any]:
    from vgpu_plugin.demo.cluster import NodeSpec

    node = NodeSpec("gpu-a", "a100-sxm-4gpu-nv4.txt", model="NVIDIA A100-SXM4-80GB", memory_mib=81920)
    with hub_cluster([node], TOPOLOGY_DIR, "vgadm-", metrics_period=0.2) as running:
        yield running


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


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@contextlib.contextmanager
def serving(hub: tuple[Hub, int], cluster: Any, monkeypatch: pytest.MonkeyPatch, **traits: Any) -> Iterator[Any]:
    """The reclaimer on its own event-loop thread, answering on the service's port; ``call`` runs
    a coroutine there (a pass) and waits for it."""
    from urllib.parse import urlparse

    from jupyter_vgpu.reclaimer.service import VGPUReclaimer

    running, port = hub
    monkeypatch.setenv("JUPYTERHUB_HOST", running.api.removesuffix("/hub/api"))  # where browsers log in
    monkeypatch.setenv("JUPYTERHUB_OAUTH_CALLBACK_URL", f"http://127.0.0.1:{port}{PREFIX}oauth_callback")
    monkeypatch.setenv("JUPYTERHUB_CLIENT_ID", "service-vgpu-reclaimer")
    service = VGPUReclaimer(api_client=cluster.api_client(), hub_api_url=running.api, api_token=RECLAIMER_TOKEN,
                            bind_url=f"http://127.0.0.1:{port}", service_prefix=PREFIX,
                            node_urls=[cluster.node("gpu-a").scrape_url], scrape_token=cluster.scrape_token,
                            **traits)
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


def start_bobs_server(running: Hub) -> None:
    status, body = running.call("POST", "/users/bob/server", body={"profile": "vgpu-quarter"})
    assert status in (201, 202), body
    running.wait(lambda: (running.server("bob") or {}).get("ready"), "bob's server", timeout=300)


def new_samples(cluster: Any) -> None:
    sampler = cluster.node("gpu-a").daemon.metrics_server.sampler
    taken = sampler.samples_taken
    cluster.wait_for(lambda: sampler.samples_taken >= taken + 3, timeout=60)


def pin(cluster: Any, memory_mib: int, utilization: float) -> None:
    """Bob's simulated GPU process uses exactly this from now on."""
    node = cluster.node("gpu-a")
    pod = cluster.read_pod("default", "jupyter-bob")
    node.gpus.set_usage(node.kubelet.admitted(pod["metadata"]["uid"]).containers[0].gpu_pid, memory_mib,
                        utilization)


def log_in(browser: Any, hub_url: str, user: str) -> Any:
    page = browser.new_context().new_page()
    page.goto(f"{hub_url}/hub/login")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", "any")
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_url("**/hub/**")
    return page


def test_the_admin_page_names_holders_to_admins_and_refuses_users(
        browser: Any, hub: tuple[Hub, int], cluster: Any, artifacts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    running, port = hub
    start_bobs_server(running)
    cluster.create_notebook_pod("zed", cores=400)  # four whole cards: waits while Bob holds a share
    new_samples(cluster)
    with serving(hub, cluster, monkeypatch, dry_run=True, queue_url=cluster.extender.base_url,
                 queue_token=cluster.queue_token) as reclaimer:
        reclaimer.call(reclaimer.run_once())
        assert ("bob", "") in reclaimer.shares

        def zed_in_the_queue_read() -> bool:
            """A pass reads the extender's queue once, and the page shows what the last pass read.
            The extender lists zed once its informer has the pod, from a cache renewed at most
            once a second: until then, the next pass (the service's loop, here the test) reads
            it again."""
            latest = reclaimer.queue.latest or {}
            if any((e.get("namespace"), e.get("pod")) == ("default", "zed") for e in latest.get("pending", [])):
                return True
            reclaimer.call(reclaimer.run_once())
            return False

        wait_for(zed_in_the_queue_read, timeout=60, interval=0.5, what="default/zed in the queue a pass read")
        look_at_the_admin_page(browser, running, port, artifacts)


def look_at_the_admin_page(browser: Any, running: Hub, port: int, artifacts: Path) -> None:
    hub_url = running.api.removesuffix("/hub/api")
    admin_page = f"http://127.0.0.1:{port}{PREFIX}admin"

    admin = log_in(browser, hub_url, "root")
    admin.goto(admin_page)  # -> the Hub's authorize -> the service's callback -> the page
    admin.wait_for_selector("h1:has-text('GPU shares')")
    text = admin.inner_text("body")
    assert "DRY RUN" in text
    row = admin.locator("tr", has_text="jupyter-bob")
    assert row.count() == 1 and "bob" in row.inner_text() and "gpu-a" in row.inner_text()
    # the scheduler's queue, from the extender's token-protected GET /queue
    waiting = admin.locator("table.queue tr", has_text="default/zed")
    assert waiting.count() == 1
    assert "no node has 4 whole cards free" in waiting.inner_text()
    assert "3 whole cards fits on 1 node" in waiting.inner_text()
    admin.screenshot(path=str(artifacts / "reclaimer-admin-page.png"), full_page=True)
    admin.context.close()

    user = log_in(browser, hub_url, "bob")
    response = user.goto(admin_page)  # the same OAuth round trip, as Bob, ends in the page's refusal
    assert response is not None and response.status == 403 and user.url == admin_page
    body = user.content()
    assert "jupyter-bob" not in body and "zed" not in body and "gpu-a" not in body and "<table" not in body
    user.context.close()

    other = log_in(browser, hub_url, "eve")
    response = other.goto(admin_page)
    assert response is not None and response.status == 403 and other.url.startswith(f"{hub_url}/hub/api/oauth2/")
    assert "You do not have permission to access JupyterHub service vgpu-reclaimer" in other.inner_text("body")
    assert "jupyter-bob" not in other.content()
    other.context.close()


MIN = 60.0
START = 1_800_000_000.0


def test_the_warning_counts_down_and_keep_my_gpu_postpones_the_reclaim(
        browser: Any, hub: tuple[Hub, int], cluster: Any, labextension_built: Path, tmp_path: Path,
        artifacts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    running, port = hub
    start_bobs_server(running)
    clock = Clock(START)
    policy = {"idle_utilization": 2.0, "idle_memory_mib": 500, "idle_minutes": 10, "grace_minutes": 5,
              "postpone_minutes": 10, "max_postpones": 1, "action": "cpu"}
    with serving(hub, cluster, monkeypatch, clock=clock, **policy) as reclaimer:
        def pass_at(minutes: float) -> None:
            new_samples(cluster)
            clock.now = START + minutes * MIN
            reclaimer.call(reclaimer.run_once())
            reclaimer.call(reclaimer.wait_idle())

        pin(cluster, 4000, 50)  # computing for a few samples, then quiet and holding nothing: idle
        new_samples(cluster)
        pin(cluster, 0, 0)
        for minute in (-5, 0, 5, 10):  # the first pass still sees it compute
            pass_at(minute)
        before = reclaimer.view("bob", "")
        assert (before["phase"], before["reason"], before["secondsLeft"], before["postponesLeft"]) == (
            "warned", "idle", 5 * MIN, 1)

        # Bob's lab: his server's Hub token and the reclaimer's URL, as KubeSpawner gives them
        token = cluster.node("gpu-a").kubelet.env("default", "jupyter-bob", "notebook")["JUPYTERHUB_API_TOKEN"]
        env = {"VGPU_RECLAIMER_URL": f"http://127.0.0.1:{port}{PREFIX}api/v1/", "JUPYTERHUB_API_TOKEN": token,
               "JUPYTERHUB_USER": "bob", "JUPYTER_VGPU_SOURCE": "none"}
        lab = start_lab(labextension_built, env, tmp_path)
        try:
            page = open_lab(browser, lab)
            page.evaluate("() => window.jupyterapp.commands.execute('vgpu:open-panel')")
            banner = page.locator(f"{PANEL} .jp-vgpu-reclaim-banner.jp-vgpu-mod-warned")
            banner.wait_for(state="visible", timeout=60_000)
            text = banner.locator(".jp-vgpu-reclaim-text")
            first = text.inner_text()
            # 5:00 until the page's first one-second tick, 4:xx after it (the reclaimer's clock is frozen)
            assert re.match(r"This GPU share has been idle for 10 min\. The server will be restarted "
                            r"without a GPU in (5:00|4:[0-5]\d) ", first), first
            assert first.endswith("unless it computes again (your files stay).")
            # the countdown runs in the page between the reclaimer's answers
            wait_for(lambda: text.inner_text() != first, timeout=30, what="the countdown to tick")
            keep = banner.get_by_role("button", name="Keep my GPU")
            assert keep.is_enabled() and keep.get_attribute("title") == "1 postpone(s) left"
            page.locator(f"{PANEL} .jp-vgpu-reclaim-banner").screenshot(path=str(artifacts / "lab-reclaim-banner.png"))

            keep.click()
            # postponed in the reclaimer itself: 10 more minutes, no keep left
            after = wait_for(lambda: (v := reclaimer.view("bob", ""))["postponesLeft"] == 0 and v, timeout=60,
                             what="the reclaimer to record the keep")
            assert after["phase"] == "warned" and after["deadline"] == before["deadline"] + 10 * MIN
            assert after["secondsLeft"] == 15 * MIN
            wait_for(lambda: " in 14:" in text.inner_text() or " in 15:" in text.inner_text(), timeout=30,
                     what="the banner to show the later deadline")
            assert keep.is_disabled()  # the last keep is spent
            pass_at(15)  # the old deadline passes: nothing is reclaimed
            assert reclaimer.view("bob", "")["phase"] == "warned" and (running.server("bob") or {}).get("ready")
            page.context.close()
        finally:
            stop_lab(lab)
