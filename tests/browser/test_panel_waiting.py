"""Issue 17 in the panel: a share request the scheduler cannot place shows where it stands —
why (the extender's words), its position, what would start now — and one click switches it
to that share, which is placed. Real JupyterLab in Debian's Chromium; Ada's lab re-creates
her pod through the simulated API and reads her request's own entry of the extender's queue
(token-protected) through the server extension."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import PANEL, Cluster, Lab, open_lab, start_lab, stop_lab
from simkube.waiting import wait_for


@pytest.fixture
def lab(labextension_built: Path, cluster: Cluster, tmp_path: Path) -> Iterator[Lab]:
    # as the demo's lab: the requester may read its own pod's place in the extender's queue
    env = {**cluster.notebook_env(), **cluster.sim.queue_environment(), "JUPYTER_VGPU_SOURCE": "node-api"}
    requester = {"VGPUSettings": {"requester_class": "vgpu_plugin.demo.requester.KubeRecreateRequester"}}
    lab = start_lab(labextension_built, env, tmp_path, server_config=requester)
    try:
        yield lab
    finally:
        stop_lab(lab)


def test_the_waiting_view_says_where_the_request_stands_and_switches_it(browser: Any, lab: Lab, cluster: Cluster,
                                                                        artifacts: Path) -> None:
    page = open_lab(browser, lab)
    page.keyboard.press("Alt+Shift+G")
    panel = page.locator(PANEL)
    page.wait_for_selector(f"{PANEL}[data-vgpu-state='allocated']")
    # three whole cards: Bob, Ada and Carol hold shares on two of the four, so only two are free
    panel.get_by_role("textbox", name="Memory").fill("")
    cores = panel.get_by_role("textbox", name="Compute")
    cores.fill("300")
    cores.press("Enter")
    waiting = panel.locator(".jp-vgpu-waiting")
    waiting.wait_for(state="visible", timeout=120_000)
    assert waiting.locator(".jp-vgpu-waiting-position").inner_text() == "Position 1 of 1 waiting for a GPU."
    assert waiting.locator(".jp-vgpu-waiting-why").inner_text() == "Why: no node has 3 whole cards free."
    assert waiting.locator(".jp-vgpu-waiting-alternative").inner_text() == (
        "What would start now: 2 whole cards fits on 1 node.")
    first = lab.api("vgpu/api/requests")
    assert (first["state"], first["cores"]) == ("pending", 300)
    assert "bob" not in panel.inner_text() and "carol" not in panel.inner_text()
    waiting.scroll_into_view_if_needed()
    panel.locator(".jp-vgpu-request").screenshot(path=str(artifacts / "lab-panel-waiting.png"))

    # one click: the pending request is withdrawn and the share that fits is asked for instead
    panel.get_by_role("button", name="Switch to 2 whole cards").click()
    outcome = panel.locator(".jp-vgpu-request-progress")
    wait_for(lambda: "jp-vgpu-request-scheduled" in (outcome.get_attribute("class") or ""), timeout=120,
             what="the switched request to be scheduled")
    waiting.wait_for(state="hidden")
    switched = lab.api("vgpu/api/requests")
    assert switched["id"] != first["id"] and (switched["state"], switched["cores"]) == ("scheduled", 200)
    withdrawn = lab.api(f"vgpu/api/requests/{first['id']}")
    assert (withdrawn["state"], withdrawn["message"]) == ("failed", "withdrawn: you asked for another share instead")
    assert sorted(cluster.cards_of("jupyter-ada-v2").values()) == [100, 100]
    assert "Scheduled: 2 whole cards on node gpu-node-a" in " ".join(outcome.inner_text().split())
    page.context.close()
