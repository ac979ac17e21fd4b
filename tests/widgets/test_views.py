"""The widgets' state as it goes over the comm: the REST-shaped facts the panel's renderer
draws, the bundled renderer itself, live samples, the plain text, a clean stop. (How the facts
look is tested in the browser: tests/browser/test_look.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from simkube.waiting import wait_for

from jupyter_vgpu.data import TOPOLOGY_DIR
from jupyter_vgpu.gpu.simulated import SimulatedGPUs
from jupyter_vgpu.sources.base import SourceSettings
from jupyter_vgpu.sources.local_nvml import LocalGPUSource
from jupyter_vgpu.widgets import render
from jupyter_vgpu.widgets.views import STATIC, AllocationCard, Dashboard, TopologyView, UsageChart

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


def test_allocation_card_carries_the_allocation_answer_and_the_panels_renderer(comms):
    card = AllocationCard(source=None, answer=SHARE)
    assert comms.last(card.model_id, "allocation") == SHARE  # the REST shape the panel gets
    assert comms.last(card.model_id, "parts") == ["allocation"]
    # the front end is the panel's renderer, bundled (labextension/src/widget.ts -> static/widget.js)
    esm = comms.last(card.model_id, "_esm")
    assert esm == (STATIC / "widget.js").read_text(encoding="utf-8") and "jp-vgpu-facts" in esm
    assert ".jp-vgpu-topo-gpu" in comms.last(card.model_id, "_css")  # the panel's stylesheet
    text = card._repr_mimebundle_()[0]["text/plain"]
    assert "25 % compute, 10 GiB memory" in text and "10 GiB of 40 GiB" in text and "GPU-2222" in text


def test_empty_state_says_how_to_get_one(comms):
    from jupyter_vgpu.sources.base import NoVGPUSource

    card = AllocationCard(NoVGPUSource())
    answer = comms.last(card.model_id, "allocation")
    assert answer["state"] == "none" and "%vgpu request" in answer["message"]
    assert "%vgpu request" in repr(card)


def test_topology_carries_yours_and_others_anonymously(comms, source, gpus):
    view = TopologyView(source)
    topology = comms.last(view.model_id, "topology")["topology"]
    assert [g["index"] for g in topology["gpus"]] == [0, 1, 2, 3]
    assert [g["index"] for g in topology["gpus"] if g["mine"]] == [1]
    assert "NV4" in json.dumps(topology["tree"])  # the tree's link level from the capture
    assert "4242" not in json.dumps(topology)  # other tenants are counts, never identities
    assert comms.last(view.model_id, "allocation")["state"] == "allocated"  # the views draw for a share
    assert "GPU 1 [##########] yours" in repr(view)


def test_usage_chart_pushes_new_samples_and_stops_when_closed(comms, source):
    chart = UsageChart(source, interval=0.1, window=60)
    chart_id = chart.model_id
    try:
        wait_for(lambda: len([s for s in comms.states(chart_id) if s.get("usage")]) >= 4, timeout=30,
                 what="the chart to get new samples")
        usages = [s["usage"] for s in comms.states(chart_id) if s.get("usage")]
        times = [[p["t"] for p in u["history"]] for u in usages]
        assert times[-1][-1] > times[0][-1]  # newer samples arrived
        assert all(t == sorted(set(t)) for t in times)  # in time order, each once
        assert usages[-1]["limits"] == {"cores": 100, "memoryMib": 40960} and usages[-1]["state"] == "live"
        assert set(usages[-1]["history"][-1]) == {"t", "memoryUsedMib", "utilizationPercent"}
        assert comms.last(chart_id, "window") == 60
        assert chart.running
    finally:
        chart.close()
    assert not chart.running  # the poll thread has ended: nothing can be sent after close
    assert comms.closed(chart_id)


def test_the_history_is_trimmed_to_the_window(comms):
    from jupyter_vgpu.sources.base import usage_answer

    chart = UsageChart(NoSource(), live=False, window=60, allocation=SHARE)
    for start in (0, 50, 100):
        history = [{"t": float(t), "memoryUsedMib": t, "utilizationPercent": 1.0} for t in range(start, start + 50)]
        chart.refresh(usage_answer("live", "test", limits={"cores": 25, "memoryMib": 10240}, history=history))
    sent = comms.last(chart.model_id, "usage")["history"]
    assert [p["t"] for p in sent] == [float(t) for t in range(89, 150)]  # the newest 60 s, merged in order


class NoSource:
    def usage(self, history_seconds: float = 0) -> dict:
        from jupyter_vgpu.sources.base import usage_answer

        return usage_answer("none", "test", message="nothing yet")


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
        assert comms.last(board_id, "parts") == ["allocation", "topology", "usage"]
        text = board._repr_mimebundle_()[0]["text/plain"]
        assert "100 % compute" in text and "GPU 1" in text and "usage (live)" in text
        assert board.running
    finally:
        board.close()
    assert not board.running and comms.closed(board_id)


def test_views_over_the_real_node_api(comms, tmp_path, monkeypatch):
    """The widgets carry the node metrics server's answers as the panel gets them."""
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
        allocation = comms.last(card.model_id, "allocation")["allocation"]
        assert (allocation["cores"], allocation["memoryMib"], allocation["cards"][0]["memoryTotalMib"]) == \
            (30, 12288, 40960)
        topology = comms.last(TopologyView(facts).model_id, "topology")["topology"]
        (mine,) = [g for g in topology["gpus"] if g["mine"]]
        assert (mine["index"], mine["myCores"], mine["allocatedCores"], mine["tenants"]) == (3, 30, 90, 1)
        assert "neighbour" not in json.dumps(topology)  # other pods are occupancy, never names
        # what goes to the front end is what the panel gets: the shapes of docs/server-api.yaml
        from server_api_support import check_schema

        board = Dashboard(facts, live=False)
        for trait, schema in (("allocation", "AllocationReply"), ("topology", "TopologyReply"), ("usage", "UsageReply")):
            check_schema(schema, comms.last(board.model_id, trait))
        assert comms.last(board.model_id, "usage")["history"]  # with its samples
        board.close()
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


def test_the_topology_carries_a_mig_cards_slices(comms):
    """A card in MIG mode goes to the front end with its slices (the panel's renderer draws them
    along the bar: tests/browser/test_panel_mig.py); the plain text marks one per compute slice."""
    topology = {"state": "available", "source": "node-api", "message": None, "topology": {
        "node": "n1", "links": [], "tree": None,
        "gpus": [{"index": 0, "mine": True, "myCores": 28, "allocatedCores": 56, "tenants": 1, "healthy": True,
                  "migSlices": [_slice("2g.10gb", 2, "held"), _slice("2g.10gb", 2, "mine"),
                                _slice("2g.10gb", 2, "free"), _slice("1g.5gb", 1, "unavailable")]},
                 {"index": 1, "mine": False, "allocatedCores": 50, "tenants": 2, "healthy": True}]}}
    view = TopologyView(None, answer=topology, allocation=SHARE)
    sent = comms.last(view.model_id, "topology")["topology"]["gpus"]
    assert [s["state"] for s in sent[0]["migSlices"]] == ["held", "mine", "free", "unavailable"]
    assert "migSlices" not in sent[1]
    text = repr(view)
    assert "GPU 0 [##|@@|..|x] yours: MIG 2g.10gb · 2 of 4 slices held" in text
    assert "2g.10gb · yours" in text and "1g.5gb · unavailable" in text


def test_compute_on_a_mig_slice_is_not_available_rather_than_zero(comms):
    """NVML has no utilisation per MIG device: the widget's front end gets the flag (and, like
    the panel, says "not available" and draws no compute line: tests/browser/test_panel_mig.py);
    the text view and %vgpu say so too, where a time-shared share shows its percentage."""
    history = [{"t": 100.0 + i, "memoryUsedMib": 3000.0, "utilizationPercent": 0.0} for i in range(5)]
    answer = {"state": "live", "source": "node-api", "message": None, "periodSeconds": 1.0,
              "limits": {"cores": 28, "memoryMib": 10240}, "history": history,
              "current": {**history[-1], "cards": [], "utilizationMeasured": False}}

    class Answers:  # the node API's answers as a source gives them
        def usage(self, history_seconds: float = 0) -> dict:
            return answer

    chart = UsageChart(Answers(), live=False, allocation=SLICE)
    assert comms.last(chart.model_id, "usage")["current"]["utilizationMeasured"] is False
    text = repr(chart)
    assert "compute used not available (compute use on a MIG slice is not measured" in text and " 0 %" not in text
    measured = {**answer, "current": {**answer["current"], "utilizationPercent": 12.0, "utilizationMeasured": True}}
    chart.refresh(measured)
    assert comms.last(chart.model_id, "usage")["current"]["utilizationMeasured"] is True
    assert "12 % of the card" in repr(chart)
    chart.close()


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def test_every_widget_displays_a_static_fallback_beside_its_view(comms):
    """The display's mime bundle has the widget view and the same facts as text/plain and text/html, so a
    notebook saved with these outputs still reads where the widget's model is gone (nbconvert here)."""
    import nbformat
    from IPython.core.formatters import DisplayFormatter
    from nbconvert import HTMLExporter

    topology = {"state": "available", "source": "node-api", "message": None, "topology": {
        "node": "gpu-node-1", "links": [], "tree": None,
        "gpus": [{"index": 2, "mine": True, "myCores": 25, "allocatedCores": 75, "tenants": 2, "healthy": True}]}}

    class Answers:
        def allocation(self) -> dict:
            return SHARE

        def topology(self) -> dict:
            return topology

        def usage(self, history_seconds: float = 0) -> dict:
            return {"state": "live", "source": "node-api", "message": None, "periodSeconds": 1.0,
                    "limits": {"cores": 25, "memoryMib": 10240}, "history": [],
                    "current": {"t": 100.0, "memoryUsedMib": 2048.0, "utilizationPercent": 12.0, "cards": []}}

    source = Answers()
    widgets = [AllocationCard(source), TopologyView(source), UsageChart(source, live=False),
               Dashboard(source, live=False)]
    outputs = []
    for widget in widgets:
        data, _ = DisplayFormatter().format(widget)
        assert data[WIDGET_VIEW]["model_id"] == widget.model_id
        assert data["text/plain"] == repr(widget) and "<" not in data["text/plain"][:1]
        assert "<pre>" in data["text/html"] and "run the cell again for the live view" in data["text/html"]
        outputs.append(nbformat.v4.new_output("display_data", data=data))
        widget.close()
    assert "GPU-2222" in outputs[0]["data"]["text/html"] and "yours + 2 others" in outputs[1]["data"]["text/html"]
    assert "2 GiB of your 10 GiB" in outputs[2]["data"]["text/html"]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("%vgpu", outputs=outputs)])
    page, _ = HTMLExporter().from_notebook_node(nbformat.reads(nbformat.writes(notebook), as_version=4))
    assert page.count('class="jp-vgpu-snapshot"') == len(widgets) and "GPU-2222" in page


def test_the_front_end_has_anywidgets_current_module_shape():
    """`export default { render }`, and no `render` exported by name: anywidget warns (once per widget, in the
    browser's console) that a module exporting `render` directly has a shape it will drop."""
    import re

    esm = (STATIC / "widget.js").read_text(encoding="utf-8")
    clauses = re.findall(r"export\s*\{([^}]*)\}", esm)
    exported = {part.split(" as ")[-1].strip() for clause in clauses for part in clause.split(",")}
    assert "default" in exported and "render" not in exported, exported
    assert not re.search(r"export\s+(?:async\s+)?(?:function|const|let|var)\s+render\b", esm)
