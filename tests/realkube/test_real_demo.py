"""``jupyter-vgpu demo --control-plane real``: the demo's notebook on the real stack.

A cluster of its own (the demo's two nodes, not the session's ``real`` cluster): the real
kube-scheduler binds the notebook pod through the extender, the real kubelet admits it through
the node daemon's device plugin, and the lab runs beside the cluster with the command and
environment kubelet gave its container (``realkube.containers``; the fake runtime runs none).
The lab reads its allocation from the node daemon with the token the device plugin's Allocate
answer carried, and a share request moves it to a new pod, whose lab answers on the same URL.
The same journey on the simulated cluster: tests/server/test_demo_request.py."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from simkube.waiting import wait_for

pytestmark = pytest.mark.slow


def test_demo_on_the_real_stack_serves_the_allocation_and_moves_on_a_share_request(tmp_path):
    from vgpu_plugin.demo.lab import NOTEBOOK_CONTAINER, NOTEBOOK_NAMESPACE, Demo, DemoOptions

    demo = Demo(DemoOptions(neighbours=False, root_dir=str(tmp_path), control_plane="real"),
                say=lambda message: None).start()

    def api(path, method="GET", body=None):
        request = urllib.request.Request(demo.server_url + "vgpu/api/" + path, method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"token {demo.token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    first = None
    try:
        cluster = demo.cluster
        assert cluster.version.startswith("v1.")  # the real API server, not simkube
        answer = api("allocation")
        assert answer["state"] == "allocated" and answer["source"] == "node-api", answer
        before = answer["allocation"]
        assert (before["pod"], before["cores"], before["memoryMib"]) == ("notebook", 25, 4096)
        # the lab runs with the environment kubelet gave the container: the device plugin's answer
        pod = cluster.read_pod(NOTEBOOK_NAMESPACE, "notebook")
        node = cluster.node(pod["spec"]["nodeName"])
        recorded = node.container_env(NOTEBOOK_NAMESPACE, "notebook", NOTEBOOK_CONTAINER)
        first = demo.runner.process(NOTEBOOK_NAMESPACE, "notebook")
        assert first is not None and first.poll() is None
        with open(f"/proc/{first.pid}/environ", "rb") as handle:
            environ = dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item)
        for key in ("VGPU_TOKEN", "VGPU_METRICS_URL", "NVIDIA_VISIBLE_DEVICES"):
            assert environ[key.encode()].decode() == recorded[key], key
        assert [card["uuid"] for card in before["cards"]] == recorded["NVIDIA_VISIBLE_DEVICES"].split(",")

        request_id = api("requests", "POST", {"cores": 50, "memory": "8GiB"})["id"]
        state = wait_for(lambda: (s := api(f"requests/{request_id}"))["state"] != "pending" and s, timeout=120,
                         interval=0.2, what="the request to leave pending")
        assert state["state"] == "scheduled" and state["message"].startswith("pod notebook-v2 was scheduled on "), state["message"]

        def new_lab():
            try:  # the old lab goes away with its pod; the new pod's lab answers on the same URL and token
                after = api("allocation")["allocation"]
            except (urllib.error.URLError, OSError, ValueError):
                return None
            return after if after and after["pod"] == "notebook-v2" else None

        after = wait_for(new_lab, timeout=180, interval=0.5, what="the new pod's lab to answer")
        assert (after["cores"], after["memoryMib"]) == (50, 8192)
        assert first.poll() is not None, "the old pod's lab was stopped with its pod"
        assert cluster.read_pod(NOTEBOOK_NAMESPACE, "notebook") is None
    finally:
        demo.stop()
    assert demo.cluster is None and demo.runner is None
    for process in [first] if first is not None else []:
        assert process.poll() is not None
