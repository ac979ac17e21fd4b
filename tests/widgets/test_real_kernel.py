"""The live chart in a real ipykernel: updates arrive on iopub while another cell runs, and stop on close."""

from __future__ import annotations

import os
import queue

import pytest
from simkube.waiting import wait_for

from jupyter_vgpu.data import TOPOLOGY_DIR

FIXTURE = TOPOLOGY_DIR / "a100-sxm-4gpu-nv4.txt"


@pytest.fixture
def kernel():
    from jupyter_client.manager import start_new_kernel

    env = {k: v for k, v in os.environ.items() if not k.startswith(("VGPU_", "JUPYTERHUB_", "CUDA_"))}
    env.update({"JUPYTER_VGPU_SOURCE": "local-nvml", "NVIDIA_VISIBLE_DEVICES": "2"})
    manager, client = start_new_kernel(kernel_name="python3", startup_timeout=120, env=env)
    try:
        yield client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def execute(client, code, on_message=None, timeout=120):
    """Run a cell; every iopub message while it runs goes to on_message; returns the reply."""
    msg_id = client.execute(code)

    def reply():
        try:
            message = client.get_iopub_msg(timeout=0.1)
        except queue.Empty:
            return None
        if on_message is not None:
            on_message(message)
        if message["header"]["msg_type"] == "error" and message["parent_header"].get("msg_id") == msg_id:
            raise AssertionError("\n".join(message["content"]["traceback"]))
        if (message["header"]["msg_type"] == "status" and message["content"]["execution_state"] == "idle"
                and message["parent_header"].get("msg_id") == msg_id):
            return client.get_shell_msg(timeout=timeout)
        return None

    return wait_for(reply, timeout=timeout, interval=0, what="the cell to finish")


def test_live_chart_updates_while_a_cell_runs_and_stops_when_closed(kernel):
    execute(kernel, f'%config VGPUSettings.local_backend = "simulated:{FIXTURE}"\n%load_ext jupyter_vgpu')
    opened = []
    execute(kernel, "%vgpu watch --interval 0.2",
            lambda m: opened.append(m) if m["header"]["msg_type"] == "comm_open" else None)
    assert opened, "no widget was opened"
    updates = []

    def during(message):
        if message["header"]["msg_type"] == "comm_msg" and message["content"]["data"].get("method") == "update":
            updates.append(message["content"]["data"]["state"])

    execute(kernel, "import time; time.sleep(2.5)", during)  # messages seen while this cell runs
    newest = [state["usage"]["history"][-1]["t"] for state in updates if (state.get("usage") or {}).get("history")]
    # ~1 per 0.2 s, the cell not blocked; each brings a newer sample
    assert len(newest) >= 3 and newest == sorted(newest) and newest[-1] > newest[0], \
        f"{len(updates)} updates while the cell slept"
    # closing ends the chart's poll thread: nothing can be sent after it
    execute(kernel, "_vgpu = get_ipython().magics_manager.registry['VGPUMagics']\n"
                    "chart = _vgpu.live[-1]\nchart.close()\nassert not chart.running")
