"""A share request from the REST API in the demo: JupyterLab runs as the notebook pod's process;
POST requests re-creates the pod, the new pod's lab takes over the URL and reports the outcome."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from simkube.waiting import wait_for

pytestmark = pytest.mark.slow


def test_request_in_the_demo_moves_the_lab_to_the_new_share(tmp_path):
    from vgpu_plugin.demo.lab import Demo, DemoOptions

    demo = Demo(DemoOptions(neighbours=False, root_dir=str(tmp_path)), say=lambda message: None).start()

    def api(path, method="GET", body=None):
        request = urllib.request.Request(demo.server_url + "vgpu/api/" + path, method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"token {demo.token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    try:
        before = api("allocation")["allocation"]
        assert (before["pod"], before["cores"]) == ("notebook", 25)
        request_id = api("requests", "POST", {"cores": 50, "memory": "8GiB"})["id"]
        state = wait_for(lambda: (s := api(f"requests/{request_id}"))["state"] != "pending" and s, timeout=120,
                         interval=0.2, what="the request to leave pending")
        assert state["state"] == "scheduled" and state["message"].startswith("pod notebook-v2 was scheduled on ")

        def new_lab():
            try:  # the old lab goes away; the new pod's lab answers on the same URL and token
                after = api("allocation")["allocation"]
            except (urllib.error.URLError, OSError, ValueError):
                return None
            return after if after and after["pod"] == "notebook-v2" else None

        after = wait_for(new_lab, timeout=180, interval=0.5, what="the new pod's lab to answer")
        assert (after["cores"], after["memoryMib"]) == (50, 8192)
        assert [(c["index"], c["uuid"]) for c in after["cards"]] == [(c["index"], c["uuid"]) for c in state["cards"]]
        recovered = api("requests")
        assert (recovered["id"], recovered["state"], recovered["message"]) == (  # one id for one request
            request_id, "scheduled", state["message"])
        assert api(f"requests/{request_id}")["state"] == "scheduled"  # what the panel follows, after the move
    finally:
        demo.stop()
