"""The views' state as it goes over the comm: bar values, SVG, live updates, clean stop."""

from __future__ import annotations

from pathlib import Path

import pytest
from simkube.waiting import wait_for

from jupyter_vgpu.data import TOPOLOGY_DIR
from jupyter_vgpu.gpu.simulated import SimulatedGPUs
from jupyter_vgpu.sources.base import SourceSettings
from jupyter_vgpu.sources.local_nvml import LocalGPUSource
from jupyter_vgpu.widgets import render
from jupyter_vgpu.widgets.glossary import colour
from jupyter_vgpu.widgets.views import AllocationCard, Dashboard, TopologyView, UsageChart

SHARE = {
    "state": "allocated", "source": "node-api", "message": None,
    "allocation": {"node": "gpu-node-1", "namespace": "jupyter", "pod": "jupyter-alice", "podUid": "u1",
                   "container": "notebook", "cores": 25, "memoryMib": 10240, "enforcement": "hami-core",
                   "cards": [{"index": 2, "uuid": "GPU-2222", "model": "NVIDIA A100-SXM4-40GB", "cores": 25,
                              "memoryMib": 10240, "memoryTotalMib": 40960}]},
}


@pytest.fixture
def gpus():
    backend = SimulatedGPUs.from_fixture(TOPOLOGY_DIR / "a100-sxm-4gpu-nv4.txt", seed=7)
    backend.start_process(4242, 1, memory_limit_mib=8192, cores_limit=50, pattern="training")
    yield backend
    backend.close()


@pytest.fixture
def source(gpus, monkeypatch):
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return LocalGPUSource(SourceSettings(source="local-nvml", backend_factory=lambda: gpus))


def widget_ids(widget):
    return [c.model_id for c in widget.children]


def test_allocation_card_sends_share_bars(comms):
    card = AllocationCard(source=None, answer=SHARE)
    bars = [c for c in card.children if type(c).__name__ == "FloatProgress"]
    compute, memory = bars
    assert comms.last(compute.model_id, "value") == 25 and comms.last(compute.model_id, "max") == 100
    assert comms.last(memory.model_id, "value") == 10240 and comms.last(memory.model_id, "max") == 40960
    header = comms.last(card.children[0].model_id, "value")
    assert "gpu-node-1" in header and "jupyter/jupyter-alice" in header
    title = comms.last(card.children[1].model_id, "value")
    assert "GPU-2222" in title and "A100" in title
    # the box itself carries its children as widget references
    assert comms.last(card.model_id, "children") == [f"IPY_MODEL_{i}" for i in widget_ids(card)]
    text = card._repr_mimebundle_()["text/plain"]
    assert "25 % compute, 10 GiB memory" in text and "10 GiB of 40 GiB" in text and "GPU-2222" in text


def test_empty_state_says_how_to_get_one(comms):
    from jupyter_vgpu.sources.base import NoVGPUSource

    card = AllocationCard(NoVGPUSource())
    assert "%vgpu request" in comms.last(card.children[0].model_id, "value")
    assert "%vgpu request" in repr(card)


def test_topology_svg_highlights_yours_and_shows_others_anonymously(comms, source, gpus):
    view = TopologyView(source)
    svg = comms.last(view.model_id, "value")
    assert svg.count('class="vgpu-card') == 4
    assert svg.count("vgpu-mine") == 1 and 'data-index="1"' in svg.split("vgpu-mine")[1][:40]
    assert "NV4" in svg  # the tree's link level from the capture
    assert "pid" not in svg and "4242" not in svg  # other tenants are counts, never identities
    text = repr(view)
    assert "GPU 1 [##########] yours" in text


def test_topology_view_of_a_share(comms):
    topology = {"state": "available", "source": "node-api", "message": None, "topology": {
        "node": "n1", "links": [["X", "SYS"], ["SYS", "X"]],
        "tree": {"level": "ROOT", "gpus": [0, 1], "children": [{"level": "GPU", "gpus": [0], "children": []},
                                                             {"level": "GPU", "gpus": [1], "children": []}]},
        "gpus": [{"index": 0, "mine": False, "allocatedCores": 75, "tenants": 3, "healthy": True},
                 {"index": 1, "mine": True, "allocatedCores": 25, "tenants": 1, "healthy": False}]}}
    svg = comms.last(TopologyView(None, answer=topology).model_id, "value")
    others = svg.split('data-index="0"')[1].split("</g>")[0]
    assert ">3 tenants</text>" in others and ">75 % allocated</text>" in others  # two lines, no collision
    assert f"fill:{colour('others')}" in others and "var(--jp-ui-font-color3" in others  # theme-aware
    assert "GPU 1 ✕" in svg  # unhealthy marked
    assert "#000" not in svg and 'fill="white"' not in svg  # nothing fixed to a light theme


def test_usage_chart_updates_live_and_stops_when_closed(comms, source):
    chart = UsageChart(source, interval=0.1, window=60)
    chart_id, svg_id = chart.model_id, chart.chart.model_id
    try:
        wait_for(lambda: len([s for s in comms.states(chart.chart.model_id) if "value" in s]) >= 4, timeout=30,
                 what="the chart to update")
        svgs = [s["value"] for s in comms.states(chart.chart.model_id) if "value" in s]
        assert "vgpu-memory" in svgs[-1] and svgs[-1] != svgs[0]  # more points, new picture
        memory_values = [s["value"] for s in comms.states(chart.memory.model_id) if "value" in s]
        assert comms.last(chart.memory.model_id, "max") == 40960 and max(memory_values) > 0
        assert chart.running
    finally:
        chart.close()
    assert not chart.running  # the poll thread has ended: nothing can be sent after close
    assert comms.closed(svg_id) and comms.closed(chart_id)


def test_frontend_closing_the_comm_stops_polling(comms, source):
    chart = UsageChart(source, interval=0.05)
    assert chart.running
    chart.comm.handle_close({"content": {"data": {}}})  # what a frontend's comm_close triggers
    wait_for(lambda: not chart.running, timeout=10, interval=0.02, what="the chart to stop polling")
    chart.close()


def test_dashboard_combines_and_closes_everything(comms, source):
    board = Dashboard(source, interval=0.1)
    board_id = board.model_id
    try:
        text = board._repr_mimebundle_()["text/plain"]
        assert "100 % compute" in text and "GPU 1" in text and "usage (live)" in text
        assert board.usage.running
    finally:
        board.close()
    assert not board.usage.running and comms.closed(board_id)


def test_usage_svg_has_one_quantity_per_chart_with_units_and_time():
    history = [{"t": 100.0 + i, "memoryUsedMib": 1000 * i, "utilizationPercent": 10 * i} for i in range(5)]
    svg = render.usage_svg(history, {"cores": 25, "memoryMib": 4096}, window=60)
    compute, memory = svg.split("</svg>")[:2]
    assert "compute used, % of the card" in compute and "your share 25 %" in compute and "100 %" in compute
    assert "memory used, GiB" in memory and "your share 4 GiB" in memory and ">4</text>" in memory
    for chart in (compute, memory):
        assert "60 s ago" in chart and ">now</text>" in chart  # a labelled time axis
    assert "vgpu-memory" not in compute and "vgpu-utilization" not in memory
    points = memory.split('class="vgpu-memory"')[1].split('points="')[1].split('"')[0].split()
    # the newest sample at "now" (the right edge), 4 s earlier 4/60 of the width to the left
    assert len(points) == 5 and points[-1].startswith("468.0,") and points[0].startswith(f"{44 + 424 * 56 / 60:.1f},")
    assert points[-1].endswith(f",{20 + 64 * (1 - 4000 / 4096):.1f}")


def test_views_over_the_real_node_api(comms, tmp_path, monkeypatch):
    """The share bars and the highlighted card come from the node metrics server's answers."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
    from server_node_support import RealNode

    from jupyter_vgpu.sources.node_api import NodeAPISource

    node = RealNode(tmp_path).start()
    try:
        node.add_notebook("neighbour", card=3, cores=60, memory_units=80)
        env = node.add_notebook("me", card=3, cores=30, memory_units=48)
        facts = NodeAPISource(SourceSettings(environ=env))
        wait_for(lambda: (facts.usage(0).get("current") or {}).get("memoryUsedMib"), timeout=60, interval=0.1,
                 what="the node to sample the notebook")
        card = AllocationCard(facts)
        compute, memory = [c for c in card.children if type(c).__name__ == "FloatProgress"]
        assert (comms.last(compute.model_id, "value"), comms.last(memory.model_id, "value"),
                comms.last(memory.model_id, "max")) == (30, 12288, 40960)
        svg = comms.last(TopologyView(facts).model_id, "value")
        mine = svg.split("vgpu-mine")[1].split("</g>")[0]
        assert 'data-index="3"' in mine and ">yours + 1 other</text>" in mine and ">90 % allocated</text>" in mine
        own = float(mine.split('class="vgpu-own"')[1].split('width="')[1].split('"')[0])
        allocated = float(mine.split('class="vgpu-occupancy"')[1].split('width="')[1].split('"')[0])
        assert (own, allocated) == (round(108 * 0.3, 1), round(108 * 0.9, 1))  # yours on top of the card's total
        assert "neighbour" not in svg  # other pods are occupancy, never names
    finally:
        node.stop()


SLICE = {
    "state": "allocated", "source": "node-api", "message": None,
    "allocation": {"node": "gpu-node-1", "namespace": "jupyter", "pod": "jupyter-bob", "podUid": "u2",
                   "container": "notebook", "cores": 28, "memoryMib": 10240, "enforcement": "mig",
                   "cards": [{"index": 0, "uuid": "MIG-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9",
                              "model": "NVIDIA A100-SXM4-40GB", "cores": 28, "memoryMib": 10240,
                              "memoryTotalMib": 10240, "migProfile": "2g.10gb"}]},
}


def test_a_mig_slice_is_shown_as_isolated(comms):
    card = AllocationCard(source=None, answer=SLICE)
    title = comms.last(card.children[1].model_id, "value")
    assert "MIG 2g.10gb on GPU 0 (isolated)" in title and "MIG-0a1b2c3d" in title
    header = comms.last(card.children[0].model_id, "value")
    assert "enforced by mig" in header
    text = repr(card)
    assert "MIG 2g.10gb on GPU 0 (isolated)" in text and "10 GiB of 10 GiB" in text


def test_the_environment_of_a_slice_container_names_its_profile():
    from jupyter_vgpu.core import contract
    from jupyter_vgpu.sources.base import env_allocation

    env = {contract.ENV_CORES: "28", contract.ENV_MEMORY_MIB: "10240", contract.ENV_DEVICE_INDICES: "0",
           contract.ENV_DEVICE_UUIDS: "MIG-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9", contract.ENV_ENFORCEMENT: "mig",
           contract.ENV_MIG_PROFILE: "2g.10gb"}
    allocation = env_allocation(env)
    assert allocation is not None and allocation["enforcement"] == "mig"
    assert allocation["cards"][0]["migProfile"] == "2g.10gb"
    assert render.card_title(allocation["cards"][0]).startswith("MIG 2g.10gb on GPU 0 (isolated)")
    del env[contract.ENV_MIG_PROFILE]
    assert "migProfile" not in (env_allocation(env) or {})["cards"][0]


def _slice(profile: str, slices: int, state: str) -> dict:
    return {"profile": profile, "slices": slices, "cardSlices": 7, "cores": 100 * slices // 7,
            "memoryMib": 5120 * slices, "state": state}


def test_the_topology_shows_a_mig_cards_slices(comms):
    """A card in MIG mode is drawn as its slices along the bar (yours, held, free), each as wide as
    its sevenths of the card; a whole card next to it keeps the allocated bar."""
    topology = {"state": "available", "source": "node-api", "message": None, "topology": {
        "node": "n1", "links": [], "tree": None,
        "gpus": [{"index": 0, "mine": True, "myCores": 28, "allocatedCores": 56, "tenants": 1, "healthy": True,
                  "migSlices": [_slice("2g.10gb", 2, "held"), _slice("2g.10gb", 2, "mine"),
                                _slice("2g.10gb", 2, "free"), _slice("1g.5gb", 1, "unavailable")]},
                 {"index": 1, "mine": False, "allocatedCores": 50, "tenants": 2, "healthy": True}]}}
    view = TopologyView(None, answer=topology)
    svg = comms.last(view.model_id, "value")
    mig = svg.split('data-index="0"')[1].split("</g>")[0]
    segments = mig.split('<rect class="vgpu-slice ')[1:]
    assert [s.split('"')[0] for s in segments] == ["vgpu-slice-held", "vgpu-slice-mine", "vgpu-slice-free",
                                                   "vgpu-slice-unavailable"]
    assert [s.split('data-profile="')[1].split('"')[0] for s in segments] == ["2g.10gb"] * 3 + ["1g.5gb"]
    xs = [float(s.split(' x="')[1].split('"')[0]) for s in segments]
    assert xs == [round(12 + 8 + 108 * k / 7, 1) for k in (0, 2, 4, 6)]  # by compute slices, from the bar's left
    assert f"fill:{colour('compute')}" in segments[1] and f"fill:{colour('others')}" in segments[0]
    assert f"fill:{colour('track')}" in segments[2] and "<title>2g.10gb · yours</title>" in segments[1]
    assert ">yours: MIG 2g.10gb</text>" in mig and ">2 of 4 slices held</text>" in mig
    assert "vgpu-occupancy" not in mig  # the slices replace the allocated bar
    whole = svg.split('data-index="1"')[1].split("</g>")[0]
    assert "vgpu-slice" not in whole and "vgpu-occupancy" in whole
    text = repr(view)
    assert "GPU 0 [##|@@|..|x] yours: MIG 2g.10gb · 2 of 4 slices held" in text
    assert "2g.10gb · yours" in text and "1g.5gb · unavailable" in text


def test_compute_on_a_mig_slice_is_not_available_rather_than_zero(comms):
    """NVML has no utilisation per MIG device: the widgets, the text view and %vgpu say "not
    available" and draw no compute line, where a time-shared share shows its percentage."""
    history = [{"t": 100.0 + i, "memoryUsedMib": 3000.0, "utilizationPercent": 0.0} for i in range(5)]
    answer = {"state": "live", "source": "node-api", "message": None, "periodSeconds": 1.0,
              "limits": {"cores": 28, "memoryMib": 10240}, "history": history,
              "current": {**history[-1], "cards": [], "utilizationMeasured": False}}
    class Answers:  # the node API's answers as a source gives them
        def usage(self, history_seconds: float = 0) -> dict:
            return answer

    chart = UsageChart(Answers(), live=False)
    readout = comms.last(chart.utilization_readout.model_id, "value")
    assert "not available" in readout and "0 % of the card" not in readout
    svg = comms.last(chart.chart.model_id, "value")
    assert 'class="vgpu-utilization"' not in svg and 'class="vgpu-memory"' in svg  # no made-up compute line
    assert "compute used, % of the card: not available" in svg
    text = render.usage_text(answer)
    assert "compute used not available (compute use on a MIG slice is not measured" in text and " 0 %" not in text
    measured = {**answer, "current": {**answer["current"], "utilizationPercent": 12.0, "utilizationMeasured": True}}
    chart.refresh(measured)
    assert "12 % of the card" in comms.last(chart.utilization_readout.model_id, "value")
    assert "12 % of the card" in render.usage_text(measured)
    chart.close()
