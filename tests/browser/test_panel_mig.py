"""The vGPU panel of a notebook on a hardware-isolated MIG slice, in a real JupyterLab and Chromium.

Ada's notebook pod asks for 25 % and 8 GiB with isolation on a simulated A100 40GB whose GPU 0
an admin split into 3 x 2g.10gb + 1 x 1g.5gb: the real extender binds it to a 2g.10gb slice and
the device plugin hands out that MIG device. Her lab reads its facts from the node's metrics
server with the pod's read token, as in a real pod; the panel must say where she is, in the
widgets' words, and the slice's real size (she holds all of it), not the share she asked for;
the topology view draws GPU 0 as its slices, hers marked, and so do the %vgpu widgets.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import (
    NODE,
    PANEL,
    WIDGET,
    Cluster,
    Lab,
    assert_same_words,
    open_lab,
    run_vgpu_in_a_new_notebook,
    start_lab,
    stop_lab,
)
from simkube.waiting import wait_for

from jupyter_vgpu.core import contract
from jupyter_vgpu.data import TOPOLOGY_DIR

LAYOUT = ("2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb")


@pytest.fixture
def mig_cluster() -> Iterator[Cluster]:
    from vgpu_plugin.demo.cluster import NodeSpec, SimCluster

    spec = NodeSpec(NODE, "a100-sxm-4gpu-nv4.txt", model="NVIDIA A100-SXM4-40GB", memory_mib=40960, seed=11,
                    mig={0: LAYOUT})
    with SimCluster([spec], fixtures_dir=TOPOLOGY_DIR, metrics_period=0.5) as sim:
        sim.create_notebook_pod("jupyter-ada", cores=25, memory="8GiB", namespace="default",
                                annotations={contract.DEFAULT_NAMES.isolation: "mig"})
        sim.wait_for_pod("default", "jupyter-ada", phase="Running")
        yield Cluster(sim=sim, namespace="default", notebook="jupyter-ada")


@pytest.fixture
def mig_lab(labextension_built: Path, mig_cluster: Cluster, tmp_path: Path) -> Iterator[Lab]:
    lab = start_lab(labextension_built, {**mig_cluster.notebook_env(), "JUPYTER_VGPU_SOURCE": "node-api"}, tmp_path)
    try:
        yield lab
    finally:
        stop_lab(lab)


def test_the_panel_shows_the_mig_slice_with_its_real_size(browser: Any, mig_lab: Lab, mig_cluster: Cluster,
                                                          artifacts: Path) -> None:
    # the pod is on a 2g.10gb slice of GPU 0 (the 1g.5gb has 1/7 of the compute, too little for 25 %)
    annotations = mig_cluster.pod("jupyter-ada")["metadata"]["annotations"]
    device = annotations[contract.DEFAULT_NAMES.mig_slice(0)]
    slices = {s.uuid: s.profile for card in mig_cluster.sim.node(NODE).gpus.inventory() for s in card.slices}
    assert slices[device] == "2g.10gb"
    assert mig_cluster.notebook_env()[contract.ENV_NVIDIA_VISIBLE_DEVICES] == device

    page = open_lab(browser, mig_lab)
    # the status bar: the slice by name and memory used of its 10 GiB (not the 25 % and 8 GiB asked; no
    # compute share that could read as usage: nothing measures a slice's compute)
    status = page.locator(".jp-vgpu-status")
    status.wait_for()
    wait_for(lambda: re.fullmatch(r"vGPU MIG 2g\.10gb · [0-9.]+/10 GiB", status.inner_text()), timeout=60,
             what="the status bar to show the slice")

    page.keyboard.press("Alt+Shift+G")
    panel = page.locator(PANEL)
    panel.wait_for(state="visible")
    page.wait_for_selector(f"{PANEL}[data-vgpu-state='allocated']")
    card = panel.locator(".jp-vgpu-card")
    assert card.locator(".jp-vgpu-card-model").inner_text() == "NVIDIA A100-SXM4-40GB"
    assert card.locator(".jp-vgpu-card-mig").inner_text() == (
        "MIG 2g.10gb on GPU 0 (isolated) · the whole slice: 28 % of the card's compute, 10 GiB")
    assert "card 0 on node" in card.locator(".jp-vgpu-card-where").inner_text()
    assert card.locator(".jp-vgpu-bar-compute [role=progressbar]").get_attribute("aria-valuenow") == "28"
    assert "10 GiB of 10 GiB" in card.locator(".jp-vgpu-bar-memory [role=progressbar]").get_attribute("aria-label")
    assert card.locator(".jp-vgpu-card-enforcement").inner_text() == (
        "Limits enforced by the hardware: a MIG slice's compute and memory are its own")
    text = card.inner_text()
    assert "25 %" not in text and "8 GiB" not in text, text

    # the live memory chart's limit is the slice's memory too
    page.wait_for_selector(f"{PANEL}[data-vgpu-transport='stream']")
    now = panel.locator(".jp-vgpu-chart-memory .jp-vgpu-chart-now")
    wait_for(lambda: re.fullmatch(r"[0-9.]+/10 GiB", now.inner_text()), timeout=60, what="the chart's slice limit")
    scale = panel.locator(".jp-vgpu-chart-memory .jp-vgpu-chart-scale").inner_text()
    assert scale == "top 12 GiB · dashed: your share 10 GiB", scale  # a round top over the slice, not 19.5 GiB
    card.screenshot(path=str(artifacts / "lab-panel-mig-slice.png"))
    # NVML measures no compute per MIG slice: "not available" and a sentence saying so, not an empty frame
    # with a share line, never a 0
    compute = panel.locator(".jp-vgpu-chart-utilization")
    assert compute.locator(".jp-vgpu-chart-now").inner_text() == "not available"
    assert "MIG slice" in (compute.locator(".jp-vgpu-chart-now").get_attribute("title") or "")
    assert compute.locator("svg").count() == 0
    assert compute.locator(".jp-vgpu-chart-note").inner_text().startswith("Compute use on a MIG slice is not measured")
    # the request form suggests the slice held, not a fixed 25 % with 4 GiB
    assert panel.get_by_role("textbox", name="Compute").get_attribute("placeholder") == "28"
    assert panel.get_by_role("textbox", name="Memory").get_attribute("placeholder") == "10GiB"

    # the topology: GPU 0 drawn as its slices in GPU instance order, hers marked, the rest free;
    # the other cards of the node are whole, with the allocated bar
    order = [s.uuid for s in mig_cluster.sim.node(NODE).gpus.inventory()[0].slices]
    states = ["mine" if uuid == device else "free" for uuid in order]
    topology = panel.locator(".jp-vgpu-topology")
    topology.wait_for(state="visible")
    segments = topology.locator(".jp-vgpu-topo-gpu[data-gpu='0'] .jp-vgpu-topo-slice")
    wait_for(lambda: segments.count() == 4, timeout=30, what="GPU 0's slices in the topology")
    assert [(segments.nth(i).get_attribute("data-profile"), segments.nth(i).get_attribute("data-state"))
            for i in range(4)] == list(zip(LAYOUT, states, strict=True))
    widths = [segments.nth(i).bounding_box()["width"] for i in range(4)]
    assert abs(widths[0] - widths[1]) < 0.5 and abs(widths[1] - widths[2]) < 0.5  # 2 sevenths each, then 1
    assert abs(widths[3] - widths[0] / 2) < 0.5 and widths[3] > 0
    assert topology.locator(".jp-vgpu-topo-gpu[data-gpu='0'] .jp-vgpu-topo-fill").count() == 0
    assert topology.locator(".jp-vgpu-topo-gpu[data-gpu='1'] .jp-vgpu-topo-fill").count() == 1
    assert topology.locator(".jp-vgpu-topo-gpu[data-gpu='1'] .jp-vgpu-topo-slice").count() == 0
    card0 = topology.locator(".jp-vgpu-topo-gpu[data-gpu='0']")
    assert " ".join(card0.inner_text().split()).startswith("GPU 0 yours: MIG 2g.10gb 1 of 4 slices held")
    assert card0.locator(".jp-vgpu-topo-slices li").all_inner_texts() == [
        f"{profile} · {'yours' if state == 'mine' else 'free'}" for profile, state in zip(LAYOUT, states, strict=True)]
    assert "unhealthy" not in topology.inner_text()  # a card in MIG mode is not a broken card
    topology.screenshot(path=str(artifacts / "lab-panel-mig-topology.png"))

    # the %vgpu widgets draw with the panel's renderer: the same slices, the same words
    run_vgpu_in_a_new_notebook(page)
    widget_segments = page.locator(f"{WIDGET} .jp-vgpu-topo-gpu[data-gpu='0'] .jp-vgpu-topo-slice")
    assert [(widget_segments.nth(i).get_attribute("data-profile"), widget_segments.nth(i).get_attribute("data-state"))
            for i in range(widget_segments.count())] == list(zip(LAYOUT, states, strict=True))
    assert_same_words(page)
    page.locator(f"{WIDGET} .jp-vgpu-topology").screenshot(path=str(artifacts / "lab-widget-mig-topology.png"))
    page.context.close()
