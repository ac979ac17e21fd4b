"""``jupyter-vgpu demo --control-plane real``: the demo's notebook on the real stack.

A cluster of its own (the demo's two nodes, not the session's ``real`` cluster): the real
kube-scheduler binds the notebook pod through the extender, the real kubelet admits it through
the node daemon's device plugin, and the lab runs beside the cluster with the command and
environment kubelet gave its container (``realkube.containers``; the fake runtime runs none).
The lab reads its allocation from the node daemon with the token the device plugin's Allocate
answer carried, and a share request moves it to a new pod, whose lab answers on the same URL.
The same journey on the simulated cluster: tests/server/test_demo_request.py."""

from __future__ import annotations

import pytest
from demo_support import lab_api, request_and_follow

pytestmark = pytest.mark.slow


def test_demo_on_the_real_stack_serves_the_allocation_and_moves_on_a_share_request(tmp_path):
    from vgpu_plugin.demo.lab import NOTEBOOK_CONTAINER, NOTEBOOK_NAMESPACE, Demo, DemoOptions

    demo = Demo(DemoOptions(neighbours=False, root_dir=str(tmp_path), control_plane="real"),
                say=lambda message: None).start()

    api = lab_api(demo)
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

        request_id, state, after = request_and_follow(api, {"cores": 50, "memory": "8GiB"}, "notebook-v2")
        assert (after["cores"], after["memoryMib"]) == (50, 8192)
        assert first.poll() is not None, "the old pod's lab was stopped with its pod"
        assert api(f"requests/{request_id}")["state"] == "scheduled"  # one id for one request, after the move
        assert cluster.read_pod(NOTEBOOK_NAMESPACE, "notebook") is None
    finally:
        demo.stop()
    assert demo.cluster is None and demo.runner is None
    for process in [first] if first is not None else []:
        assert process.poll() is not None
