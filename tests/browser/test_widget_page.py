"""The widgets' front end (jupyter_vgpu/widgets/static/widget.js: the panel's renderer, bundled for
anywidget) on a page of its own in Chromium, with a stand-in anywidget model: layouts and words that
depend on the facts, checked at several widths without starting a lab.

- the topology's cards in one group have one width, a lone card on the last row too;
- on a MIG slice the memory chart's scale tops at a round number of GiB over the slice's memory, and
  the compute chart, which nothing measures there, is a sentence saying so, not an empty frame.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import WIDGET_BUNDLE

from jupyter_vgpu.data import TOPOLOGY_DIR
from jupyter_vgpu.gpu.simulated import SimulatedGPUs
from jupyter_vgpu.sources.base import SourceSettings
from jupyter_vgpu.sources.local_nvml import LocalGPUSource


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


@pytest.fixture
def site(labextension_built: Path, tmp_path: Path) -> Iterator[str]:
    """widget.js and widget.css served over HTTP (an ES module is not imported from file://)."""
    root = tmp_path / "site"
    root.mkdir()
    for name in ("widget.js", "widget.css"):
        shutil.copy(WIDGET_BUNDLE / name, root / name)
    (root / "index.html").write_text('<!DOCTYPE html><html><head><meta charset="utf-8">'
                                     '<link rel="stylesheet" href="widget.css"></head><body></body></html>')
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        thread.join(10)


# Draw one widget into a box `width` px wide, as anywidget would: the module's default export's render.
_RENDER = """async ({facts, width, id}) => {
  const module = await import('./widget.js');
  const el = document.createElement('div');
  el.id = id;
  el.style.width = `${width}px`;
  document.body.append(el);
  const model = {get: name => (name in facts ? facts[name] : null), on() {}, off() {}};
  module.default.render({model, el});
}"""

# Per group of cards: each card's width and top, in document order.
_CARDS = """(root) => [...root.querySelectorAll('.jp-vgpu-topo-children')]
  .map(group => [...group.children].filter(c => c.classList.contains('jp-vgpu-topo-gpu'))
    .map(c => { const r = c.getBoundingClientRect(); return {width: r.width, top: r.top}; }))
  .filter(cards => cards.length)"""


@pytest.fixture
def page(browser: Any, site: str) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(site)
    yield page
    context.close()


def test_a_lone_card_on_the_last_row_is_as_wide_as_the_others(page: Any) -> None:
    gpus = SimulatedGPUs.from_fixture(TOPOLOGY_DIR / "a100-sxm-4gpu-nv4.txt", seed=3)  # 4 cards, one NVLink group
    try:
        source = LocalGPUSource(SourceSettings(source="local-nvml", backend_factory=lambda: gpus,
                                               environ={"NVIDIA_VISIBLE_DEVICES": "1"}))
        facts = {"parts": ["topology"], "allocation": source.allocation(), "topology": source.topology(),
                 "window": 120}
    finally:
        gpus.close()
    lone = 0
    for width in (250, 340, 430, 560, 700):
        box = f"w{width}"
        page.evaluate(_RENDER, {"facts": facts, "width": width, "id": box})
        groups = page.evaluate(_CARDS, page.locator(f"#{box}").element_handle())
        assert groups, f"{width} px: no cards drawn"
        for cards in groups:
            widths = [card["width"] for card in cards]
            assert max(widths) - min(widths) < 1, f"{width} px: cards of one group differ in width: {widths}"
            rows = sorted({round(card["top"]) for card in cards})
            lone += len(rows) > 1 and sum(round(card["top"]) == rows[-1] for card in cards) == 1
    assert lone, f"no width put a lone card on a last row: the check did not run ({groups})"


def test_on_a_mig_slice_memory_tops_at_round_gib_and_compute_says_it_is_not_measured(page: Any) -> None:
    slice_ = {"index": 0, "uuid": "MIG-1", "model": "NVIDIA A100-SXM4-40GB", "cores": 28, "memoryMib": 10240,
              "memoryTotalMib": 10240, "migProfile": "2g.10gb"}
    allocation = {"state": "allocated", "source": "node-api", "message": None, "allocation": {
        "node": "a100-mig", "namespace": "default", "pod": "notebook", "podUid": "u", "container": "notebook",
        "cores": 28, "memoryMib": 10240, "enforcement": "mig", "cards": [slice_]}}
    history = [{"t": 100.0 + i, "memoryUsedMib": 2500.0, "utilizationPercent": 0.0} for i in range(5)]
    usage = {"state": "live", "source": "node-api", "message": None, "periodSeconds": 1.0,
             "limits": {"cores": 28, "memoryMib": 10240}, "history": history,
             "current": {**history[-1], "cards": [], "utilizationMeasured": False}}
    page.evaluate(_RENDER, {"facts": {"parts": ["allocation", "usage"], "allocation": allocation, "usage": usage,
                                      "window": 120}, "width": 420, "id": "mig"})
    memory = page.locator("#mig .jp-vgpu-chart-memory")
    assert memory.locator(".jp-vgpu-chart-scale").inner_text() == "top 12 GiB · dashed: your share 10 GiB"
    compute = page.locator("#mig .jp-vgpu-chart-utilization")
    assert compute.locator("svg").count() == 0 and compute.locator(".jp-vgpu-chart-limit").count() == 0
    assert compute.locator(".jp-vgpu-chart-now").inner_text() == "not available"
    assert compute.locator(".jp-vgpu-chart-note").inner_text().startswith("Compute use on a MIG slice is not measured")
    assert page.locator("#mig .jp-vgpu-card-enforcement").inner_text() == (
        "Limits enforced by the hardware: a MIG slice's compute and memory are its own")
