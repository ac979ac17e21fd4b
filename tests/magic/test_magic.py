"""%vgpu in an IPython shell against the real node metrics server over simulated GPUs."""

from __future__ import annotations

import re

import pytest
from magic_support import run
from simkube.waiting import wait_for

from jupyter_vgpu.core import contract
from jupyter_vgpu.requesters.hub import NOT_UNDER_HUB


def load_magics_for(shell, env, monkeypatch):
    """%load_ext in the notebook's environment ``env``, once the node has sampled its process."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    shell.run_line_magic("load_ext", "jupyter_vgpu")
    magics = shell.magics_manager.registry["VGPUMagics"]
    wait_for(lambda: (magics.facts.usage(0).get("current") or {}).get("memoryUsedMib"), timeout=60, interval=0.1,
             what="the node to sample the notebook's process")


@pytest.fixture
def notebook(shell, real_node, monkeypatch):
    env = real_node.add_notebook("jupyter-alice", card=2, cores=25, memory_units=40)
    load_magics_for(shell, env, monkeypatch)
    return env


def test_help_and_bad_arguments(shell):
    shell.run_line_magic("load_ext", "jupyter_vgpu")
    out, _ = run(shell, "--help")
    assert "%vgpu request --cores N --memory SIZE" in out and "%vgpu release" in out
    out, _ = run(shell, "frobnicate")
    assert "invalid choice: 'frobnicate'" in out and "%vgpu status" in out


def test_status_reports_the_allocation_usage_and_guard_rails(shell, notebook):
    out, _ = run(shell, "status")
    assert "vGPU on gpu-node-1 (pod jupyter/jupyter-alice) — node-api" in out
    assert "share: 25 % compute, 10 GiB memory, enforced by hami-core" in out
    assert notebook[contract.ENV_DEVICE_UUIDS] in out and "10 GiB of 40 GiB" in out
    assert "usage (live)" in out and "of your 10 GiB" in out
    rails = out.split("framework guard rails:")[1]
    assert "jax        in force     XLA_PYTHON_CLIENT_MEM_FRACTION=0.250 (set when the container started)" in rails
    assert "cupy       in force" in rails
    assert "torch" in rails and "tensorflow" in rails


@pytest.fixture
def in_kernel(shell, monkeypatch):
    """The shell as in a kernel (a frontend that may render widgets): ipykernel sets shell.kernel."""
    monkeypatch.setattr(shell, "kernel", object(), raising=False)


def test_dashboard_topo_usage_display_widgets_with_text(shell, notebook, in_kernel):
    magics = shell.magics_manager.registry["VGPUMagics"]
    _, outputs = run(shell, "")
    data = outputs[0].data
    assert "application/vnd.jupyter.widget-view+json" in data
    assert "25 % compute" in data["text/plain"] and "] yours" in data["text/plain"] and "usage (live)" in data["text/plain"]
    assert magics.live and magics.live[-1].running
    _, outputs = run(shell, "topo")
    assert re.search(r"GPU 2 \[[#.]+\] yours", outputs[0].data["text/plain"])
    _, outputs = run(shell, "usage")
    assert outputs[0].data["text/plain"].startswith("usage (live)")


def test_watch_runs_in_the_background_and_stops_on_unload(shell, notebook, in_kernel):
    magics = shell.magics_manager.registry["VGPUMagics"]
    run(shell, "watch --interval 0.1")
    chart = magics.live[-1]
    assert chart.running  # the cell has returned and the chart's poll thread goes on
    first = chart.usage["current"]["t"]
    wait_for(lambda: chart.usage["current"]["t"] != first, timeout=30, what="the live chart to update")
    shell.run_line_magic("unload_ext", "jupyter_vgpu")
    assert not chart.running


def test_without_a_widget_frontend_watch_prints_lines(shell, notebook):
    magics = shell.magics_manager.registry["VGPUMagics"]
    out, outputs = run(shell, "watch --interval 0.3 --count 3")
    lines = out.splitlines()
    assert len(lines) == 3 and not outputs and not magics.live
    assert all(" live " in line and "/10 GiB" in line and "util" in line for line in lines)
    _, outputs = run(shell, "")  # the dashboard, once, as text: no thread left polling
    assert "25 % compute" in outputs[0].data["text/plain"] and not magics.live


def test_on_a_mig_slice_topo_shows_the_slices_and_watch_says_compute_is_not_available(shell, real_node, monkeypatch):
    made = real_node.gpus.set_mig_layout(1, ["2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"])
    env = real_node.add_notebook("jupyter-ada", card=1, cores=25, memory_units=32, mig_device=made[2].uuid)
    load_magics_for(shell, env, monkeypatch)
    out, outputs = run(shell, "topo")
    out += "".join(o.data["text/plain"] for o in outputs)
    assert "GPU 1 [..|..|@@|.] yours: MIG 2g.10gb · 1 of 4 slices held" in out
    assert out.count("2g.10gb · free") == 2 and "2g.10gb · yours" in out and "1g.5gb · free" in out
    out, _ = run(shell, "watch --interval 0.2 --count 2")
    lines = out.splitlines()
    assert len(lines) == 2 and all("util not available" in line and "/10 GiB" in line for line in lines), lines
    out, outputs = run(shell, "usage")
    out += "".join(o.data["text/plain"] for o in outputs)
    assert "compute used not available" in out and "% of the card" not in out


def test_request_validates_and_reports_the_outcome(shell, notebook):
    out, _ = run(shell, "request --cores 25 --memory 3.3GiB")
    assert "not a multiple of 256 MiB" in out
    out, _ = run(shell, "request --cores 150 --memory 4GiB")
    assert "did you mean 100 or 200" in out
    out, _ = run(shell, "request --cores 25")
    assert "needs vcuda-memory" in out
    out, _ = run(shell, "request --cores 50 --memory 4096MiB")
    assert f"✘ failed: {NOT_UNDER_HUB}" in out
    out, _ = run(shell, "status")
    assert "last request r1-" in out and "failed" in out


def test_a_request_cell_shows_its_progress_lines_and_no_value(shell, notebook):
    """`%vgpu request` and `%vgpu release` print their lines; the cell has no result (no ShareRequest repr
    after them as its Out)."""
    from IPython.utils.capture import capture_output

    for line in ("%vgpu request --cores 50 --memory 4096MiB", "%vgpu request --cores 50 --memory 4GiB --no-wait",
                 "%vgpu release"):
        with capture_output() as captured:
            result = shell.run_cell(line, store_history=True)
        assert result.success and result.result is None, (line, result.result)
        assert "ShareRequest(" not in captured.stdout and captured.stdout.startswith("request r"), captured.stdout
        shell.magics_manager.registry["VGPUMagics"].tracker.wait(captured.stdout.split()[1].rstrip(":"), 10)


def test_hub_ceiling_is_enforced_before_anything_restarts(shell, notebook, monkeypatch):
    monkeypatch.setenv(contract.ENV_HUB_MAX_MEMORY_MIB, "8192")
    out, _ = run(shell, "request --cores 25 --memory 16GiB")
    assert "16 GiB is more than your limit of 8 GiB" in out and "asking for" not in out


def test_no_vgpu_says_how_to_get_one(shell):
    shell.config.VGPUSettings.source = "none"
    shell.run_line_magic("load_ext", "jupyter_vgpu")
    out, _ = run(shell, "status")
    assert "No vGPU is allocated" in out and "%vgpu request" in out
    assert "torch      not needed" in out


def test_the_former_setting_names_still_work(shell):
    shell.config.VGPUMagics.source = "none"  # before VGPUSettings existed
    shell.run_line_magic("load_ext", "jupyter_vgpu")
    magics = shell.magics_manager.registry["VGPUMagics"]
    assert magics.vgpu_settings.source == "none" and magics.facts.name == "none"
