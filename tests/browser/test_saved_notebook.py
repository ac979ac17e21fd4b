"""A notebook with the %vgpu widgets, saved and opened again where their models are gone.

The first lab is Ada's (the simulated cluster's notebook pod): it runs `%vgpu` and saves the
notebook. The second is a lab of its own, as the next `jupyter-vgpu demo` run is (its own data
dir: the notebook is not trusted there and no kernel holds the widgets' models): the outputs must
read as the facts' text, not "Error displaying widget: model not found". anywidget must not warn
that the widgets' front end has a deprecated module shape.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from browser_support import Cluster, open_lab, start_lab, stop_lab, wait_for_widgets
from simkube.waiting import wait_for

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

pytestmark = pytest.mark.timeout(600)  # two labs, one after the other


def _saved_outputs(path: Path) -> list[dict[str, Any]]:
    try:
        notebook = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    outputs = [output for cell in notebook.get("cells", []) for output in cell.get("outputs", [])
               if WIDGET_VIEW in output.get("data", {})]
    for output in outputs:  # nbformat keeps multi-line text as a list of lines
        output["data"] = {k: "".join(v) if isinstance(v, list) else v for k, v in output["data"].items()}
    return outputs


def test_a_saved_notebook_reads_as_text_where_the_widgets_are_gone(browser: Any, labextension_built: Path,
                                                                   cluster: Cluster, tmp_path: Path,
                                                                   artifacts: Path) -> None:
    env = {**cluster.notebook_env(), "JUPYTER_VGPU_SOURCE": "node-api"}
    (tmp_path / "first").mkdir()
    first = start_lab(labextension_built, env, tmp_path / "first")
    try:
        saved = tmp_path / "first" / "root" / "vgpu.ipynb"
        saved.write_text(json.dumps({
            "nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "cells": [{"cell_type": "code", "id": "vgpu", "metadata": {}, "execution_count": None, "outputs": [],
                       "source": "%load_ext jupyter_vgpu\n%vgpu"}]}))
        page = open_lab(browser, first)
        console: list[str] = []
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:open', {path: 'vgpu.ipynb'})")
        editor = page.locator(".jp-Notebook .jp-Cell .cm-content").first
        editor.wait_for(timeout=120_000)
        wait_for(lambda: any(k["execution_state"] == "idle" for k in first.api("api/kernels")), timeout=120,
                 what="the notebook's kernel to be idle")
        editor.click()
        page.keyboard.press("Shift+Enter")
        wait_for_widgets(page)
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        outputs = wait_for(lambda: _saved_outputs(saved), timeout=60, what="the notebook saved with its widget")
        page.context.close()
    finally:
        stop_lab(first)
    assert not [line for line in console if "anywidget" in line and "Deprecation" in line], console
    (output,) = outputs
    assert output["data"]["text/plain"].startswith("vGPU on gpu-node-a (pod default/jupyter-ada)")
    assert 'class="jp-vgpu-snapshot"' in output["data"]["text/html"]

    # the next run: a lab of its own (not trusting the notebook), no kernel, no widget models
    (tmp_path / "second").mkdir()
    second = start_lab(labextension_built, env, tmp_path / "second")
    try:
        shutil.copy(saved, tmp_path / "second" / "root" / "vgpu.ipynb")
        page = open_lab(browser, second)
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:open', {path: 'vgpu.ipynb'})")
        snapshot = page.locator(".jp-OutputArea-output .jp-vgpu-snapshot")
        snapshot.wait_for(timeout=60_000)
        text = snapshot.inner_text()
        assert "vGPU on gpu-node-a" in text and "GPU topology of gpu-node-a" in text and "usage (" in text
        assert "run the cell again for the live view" in text
        assert "model not found" not in page.locator(".jp-Notebook").inner_text()
        page.locator(".jp-OutputArea-output").first.screenshot(path=str(artifacts / "lab-saved-notebook.png"))
        page.context.close()
    finally:
        stop_lab(second)
