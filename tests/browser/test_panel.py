"""The vGPU sidebar panel in a real JupyterLab, in Debian's headless Chromium.

The lab stands for Ada's notebook pod in the simulated cluster: it reads its facts from
the node's metrics server with the pod's read token (through the jupyter_vgpu server
extension), under a JupyterHub-style base URL, and a share request re-creates the pod
through the simulated Kubernetes API, scheduled by the real extender. Screenshots land in
tests/artifacts/.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from browser_support import PANEL, Cluster, Lab, open_lab, start_lab, stop_lab
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from simkube.waiting import wait_for


@pytest.fixture
def lab(labextension_built: Path, cluster: Cluster, tmp_path: Path) -> Iterator[Lab]:
    env = {**cluster.notebook_env(), "JUPYTER_VGPU_SOURCE": "node-api"}
    # a share request re-creates Ada's pod through the simulated API, as in the demo
    requester = {"VGPUSettings": {"requester_class": "vgpu_plugin.demo.requester.KubeRecreateRequester"}}
    lab = start_lab(labextension_built, env, tmp_path, vgpu_settings={"chartWindowSeconds": 60},
                    server_config=requester)
    try:
        yield lab
    finally:
        stop_lab(lab)


def test_panel_shows_allocation_topology_live_usage_and_request(browser: Any, lab: Lab, cluster: Cluster,
                                                                artifacts: Path) -> None:
    (card,) = cluster.cards_of("jupyter-ada")
    bob, carol = cluster.cards_of("jupyter-bob"), cluster.cards_of("jupyter-carol")
    assert card in bob and card not in carol  # binpack: Ada beside Bob, Carol elsewhere
    page = open_lab(browser, lab)
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" and "/vgpu/api/" in r.url else None)
    streams: list[Any] = []  # the panel's usage websockets
    page.on("websocket", lambda ws: streams.append(ws) if "/vgpu/api/" in ws.url else None)

    # the status bar knows the share before the panel is ever opened
    status = page.locator(".jp-vgpu-status")
    status.wait_for()
    # used against the share, for compute and memory alike
    wait_for(lambda: re.fullmatch(r"vGPU ([0-9]+|–)/25 % · [0-9.]+/4 GiB", status.inner_text()), timeout=60,
             what="status-bar summary")

    # keyboard: the shortcut opens the panel and puts focus in it
    page.keyboard.press("Alt+Shift+G")
    panel = page.locator(PANEL)
    panel.wait_for(state="visible")
    assert page.evaluate(f"() => document.querySelector('{PANEL}').contains(document.activeElement)")
    page.wait_for_selector(f"{PANEL}[data-vgpu-state='allocated']")

    # every call went under the Hub-style base URL
    assert "/user/ada/vgpu/api/" in page.evaluate(
        "() => performance.getEntriesByType('resource').map(e => e.name).filter(n => n.includes('vgpu/api')).join(' ')")

    # allocation card
    card_box = panel.locator(".jp-vgpu-card")
    assert card_box.locator(".jp-vgpu-card-model").inner_text() == "NVIDIA A100-PCIE-40GB"
    assert card_box.locator(".jp-vgpu-card-node").inner_text() == "gpu-node-a"
    assert f"card {card} on node" in card_box.locator(".jp-vgpu-card-where").inner_text()
    compute = card_box.locator(".jp-vgpu-bar-compute [role=progressbar]")
    assert compute.get_attribute("aria-valuenow") == "25"
    memory = card_box.locator(".jp-vgpu-bar-memory [role=progressbar]")
    assert memory.get_attribute("aria-valuenow") == "10"  # 4 GiB of 40 GiB
    assert "4 GiB of 40 GiB" in memory.get_attribute("aria-label")

    # topology: four cards, Ada's highlighted, other people only as counts
    gpus = panel.locator(".jp-vgpu-topo-gpu")
    assert gpus.count() == 4
    mine = panel.locator(".jp-vgpu-topo-gpu.jp-vgpu-mine")
    assert mine.count() == 1 and mine.get_attribute("data-gpu") == str(card)
    # the path to it: the node (merged with its top level) and the NUMA group holding the card
    assert panel.locator(".jp-vgpu-topo-group.jp-vgpu-mine").count() == 2
    words = {int(box.get_attribute("data-gpu")): " ".join(box.inner_text().split())
             for box in gpus.all()}
    assert words[card].startswith(f"GPU {card} yours + 1 other 75 % allocated")
    (carol_card,) = carol
    assert words[carol_card].startswith(f"GPU {carol_card} 1 tenant 30 % allocated")
    for free in set(range(4)) - {card, carol_card}:
        assert words[free].startswith(f"GPU {free} free")
    text = panel.inner_text()
    assert "bob" not in text and "carol" not in text

    # live charts: the stream delivers samples and the memory line moves within the limit
    page.wait_for_selector(f"{PANEL}[data-vgpu-transport='stream']")
    line = panel.locator(".jp-vgpu-chart-memory .jp-vgpu-chart-line")
    wait_for(lambda: int(line.get_attribute("data-points") or 0) >= 3, timeout=60, what="three samples on the chart")
    first = line.get_attribute("d")
    wait_for(lambda: line.get_attribute("d") != first, timeout=30, what="the memory chart to change")
    assert panel.locator(".jp-vgpu-chart-memory .jp-vgpu-chart-limit").count() == 1
    # the chart window comes from the user's settings (60 s, not the default 2 min)
    assert panel.locator(".jp-vgpu-chart-memory .jp-vgpu-chart-axis span").first.inner_text() == "−1 min"
    now_text = panel.locator(".jp-vgpu-chart-memory .jp-vgpu-chart-now").inner_text()
    assert re.fullmatch(r"[0-9.]+/4 GiB", now_text), now_text
    panel.screenshot(path=str(artifacts / "lab-panel-light.png"))
    page.screenshot(path=str(artifacts / "lab-full-light.png"))

    # hidden panel: the stream closes and only the status bar's slow poll remains
    page.locator(".jp-SideBar.jp-mod-right .lm-TabBar-tab[data-id='jp-vgpu-panel']").click()
    page.wait_for_selector(PANEL, state="hidden")
    page.wait_for_selector(f"{PANEL}[data-vgpu-transport='poll']", state="attached")
    assert streams, "the visible panel streamed its usage"
    wait_for(lambda: all(ws.is_closed() for ws in streams), timeout=30, what="the hidden panel's stream to close")
    page.keyboard.press("Alt+Shift+G")
    page.wait_for_selector(f"{PANEL}[data-vgpu-transport='stream']")

    # the request form refuses what the contract refuses, without a round trip
    cores = panel.get_by_role("textbox", name="Compute")
    memory_input = panel.get_by_role("textbox", name="Memory")
    cores.fill("25")
    memory_input.fill("")
    panel.get_by_role("button", name="Request").click()
    error = panel.locator(".jp-vgpu-form-error")
    wait_for(lambda: "needs memory too" in error.inner_text(), timeout=60, what="the form's refusal")
    assert memory_input.get_attribute("aria-invalid") == "true"
    assert posts == []

    # a request no node can take: the extender refuses it and the panel says why
    memory_input.fill("")
    cores.fill("400")
    cores.press("Enter")
    outcome = panel.locator(".jp-vgpu-request-progress")
    wait_for(lambda: "jp-vgpu-request-pending" in (outcome.get_attribute("class") or ""), timeout=30,
               what="the request to show as pending")
    wait_for(lambda: "jp-vgpu-request-failed" in (outcome.get_attribute("class") or ""), timeout=120,
               what="the refusal")
    refused = lab.api("vgpu/api/requests")
    assert (refused["state"], refused["cores"]) == ("failed", 400)
    assert "4 whole cards" in outcome.inner_text() and refused["message"] in outcome.inner_text()
    outcome.scroll_into_view_if_needed()
    panel.locator(".jp-vgpu-request").screenshot(path=str(artifacts / "lab-panel-request-failed.png"))

    # a request that fits: the pod is re-created on the new share and the panel shows where
    memory_input.fill("8GiB")
    cores.fill("50")
    cores.press("Enter")
    wait_for(lambda: "jp-vgpu-request-scheduled" in (outcome.get_attribute("class") or ""), timeout=120,
               what="the request to be scheduled")
    assert [urlparse(url).path for url in posts] == ["/user/ada/vgpu/api/requests"] * 2
    request = lab.api("vgpu/api/requests")
    assert (request["state"], request["cores"], request["memoryUnits"]) == ("scheduled", 50, 32)
    new_card = request["cards"][0]["index"]
    assert cluster.cards_of("jupyter-ada-v2") == {new_card: 50}
    outcome_text = " ".join(outcome.inner_text().split())
    assert f"Scheduled: 50 % of one card with 8 GiB on node gpu-node-a, card {new_card}." in outcome_text
    outcome.scroll_into_view_if_needed()
    panel.locator(".jp-vgpu-request").screenshot(path=str(artifacts / "lab-panel-request.png"))

    # dark theme: the panel follows the --jp-* variables
    page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'")
    background = page.evaluate(
        f"() => getComputedStyle(document.querySelector('{PANEL} .jp-vgpu-card')).backgroundColor")
    assert _luminance(background) < 0.3, background
    panel.locator(".jp-vgpu-topology").scroll_into_view_if_needed()
    panel.screenshot(path=str(artifacts / "lab-panel-dark.png"))

    # this server's pod is retired once its successor runs: its read token stops working and
    # the panel says the metrics are unreachable (with the server's reason) instead of freezing
    cluster.sim.wait_for(lambda: cluster.sim.read_pod("default", "jupyter-ada") is None, timeout=60,
                         what="the old pod to be deleted")
    page.wait_for_selector(f"{PANEL} .jp-vgpu-usage-unreachable", timeout=60_000)
    assert "Metrics unreachable" in panel.locator(".jp-vgpu-usage-status").inner_text()
    panel.locator(".jp-vgpu-usage").screenshot(path=str(artifacts / "lab-panel-unreachable.png"))
    page.context.close()


def test_panel_without_a_vgpu(browser: Any, labextension_built: Path, tmp_path: Path, artifacts: Path) -> None:
    lab = start_lab(labextension_built, {"JUPYTER_VGPU_SOURCE": "none"}, tmp_path)
    try:
        page = open_lab(browser, lab)
        status = page.locator(".jp-vgpu-status")
        wait_for(lambda: status.inner_text() == "vGPU: none", timeout=60, what="the status bar to say none")
        page.evaluate("() => window.jupyterapp.commands.execute('vgpu:open-panel')")
        panel = page.locator(PANEL)
        page.wait_for_selector(f"{PANEL}[data-vgpu-state='none']")
        assert "No vGPU" in panel.locator(".jp-vgpu-state").inner_text()
        assert panel.locator(".jp-vgpu-card").count() == 0
        assert panel.locator(".jp-vgpu-topo-gpu").count() == 0
        assert panel.get_by_role("button", name="Release GPU").is_disabled()
        # the palette lists the command
        search = page.locator(".jp-ModalCommandPalette .lm-CommandPalette-input")
        item = page.locator(".lm-CommandPalette-item:has-text('Show vGPU Panel')")

        def palette_lists_the_command() -> bool:
            if not search.is_visible():  # the modal palette closes when the focus moves (a lab still settling)
                page.keyboard.press("Control+Shift+C")
                return False
            try:
                search.fill("vGPU panel", timeout=2_000)
            except PlaywrightTimeoutError:  # it closed again between the look and the fill
                return False
            return item.is_visible()

        wait_for(palette_lists_the_command, timeout=60, interval=0.5, what="the palette to list Show vGPU Panel")
        page.keyboard.press("Escape")
        panel.screenshot(path=str(artifacts / "lab-panel-none.png"))
        page.context.close()
    finally:
        stop_lab(lab)


def _luminance(css_color: str) -> float:
    r, g, b = (int(v) for v in re.findall(r"\d+", css_color)[:3])
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255
