"""A share request from the REST API in the demo: JupyterLab runs as the notebook pod's process;
POST requests re-creates the pod, the new pod's lab takes over the URL and reports the outcome."""

from __future__ import annotations

import pytest
from demo_support import lab_api, request_and_follow

pytestmark = pytest.mark.slow


def test_request_in_the_demo_moves_the_lab_to_the_new_share(tmp_path):
    from vgpu_plugin.demo.lab import Demo, DemoOptions

    demo = Demo(DemoOptions(neighbours=False, root_dir=str(tmp_path)), say=lambda message: None).start()

    api = lab_api(demo)

    try:
        before = api("allocation")["allocation"]
        assert (before["pod"], before["cores"]) == ("notebook", 25)
        request_id, state, after = request_and_follow(api, {"cores": 50, "memory": "8GiB"}, "notebook-v2")
        assert (after["cores"], after["memoryMib"]) == (50, 8192)
        assert [(c["index"], c["uuid"]) for c in after["cards"]] == [(c["index"], c["uuid"]) for c in state["cards"]]
        recovered = api("requests")
        assert (recovered["id"], recovered["state"], recovered["message"]) == (  # one id for one request
            request_id, "scheduled", state["message"])
        assert api(f"requests/{request_id}")["state"] == "scheduled"  # what the panel follows, after the move
    finally:
        demo.stop()
