"""The widgets' plain text words a card's occupancy exactly as the lab panel does: both read the
cases in labextension/test/occupancy-cases.json (the panel in test/glossary.test.ts) and the
words from one glossary, labextension/src/glossary.json. (In a browser the widgets draw with
the panel's own renderer: tests/browser/test_look.py checks they show the same words.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_vgpu.widgets import glossary, render

CASES = json.loads((Path(__file__).resolve().parents[2] / "labextension" / "test" / "occupancy-cases.json")
                   .read_text(encoding="utf-8"))["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["words"] for c in CASES])
def test_the_widgets_word_a_card_as_the_panel_does(case):
    gpu = case["gpu"]
    assert glossary.occupancy(gpu) == case["words"]
    topology = {"node": "n", "gpus": [gpu]}
    assert case["words"] in render.topology_text({"state": "available", "topology": topology})


def test_the_glossary_is_the_panels_file():
    source = Path(__file__).resolve().parents[2] / "labextension" / "src" / "glossary.json"
    assert glossary.glossary() == json.loads(source.read_text(encoding="utf-8"))
    assert glossary.count("tenants", 2) == "2 tenants" and glossary.fill("{a} {b}", a=1) == "1 {b}"
