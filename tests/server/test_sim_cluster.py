"""The notebook side against the simulated cluster: real extender, device plugin, kubelet
stand-in and metrics server over simulated GPUs.

The notebook "container" is this test process, given the environment the device plugin's
Allocate gave the pod's container. The REST API and %vgpu must report the allocation the
device plugin recorded, usage that changes over time, and a share request must re-create
the pod through the Kubernetes API and report where it was scheduled (or why not).
"""

from __future__ import annotations

import json

import pytest
from server_peers_support import as_json
from simkube.waiting import wait_for

from jupyter_vgpu.core import contract

pytestmark = pytest.mark.slow

KUBE_REQUESTER = "vgpu_plugin.demo.requester.KubeRecreateRequester"


@pytest.fixture(scope="module")
def cluster():
    from vgpu_plugin.demo.cluster import NodeSpec, SimCluster

    with SimCluster([NodeSpec("gpu-a", "a100-sxm-4gpu-nv4.txt")], metrics_period=0.2) as sim:
        yield sim


def start_notebook(cluster, name, cores, memory):
    cluster.create_notebook_pod(name, cores=cores, memory=memory)
    pod = cluster.wait_for_pod("default", name)
    pod = cluster.wait_for(lambda: (p := cluster.read_pod("default", name))["metadata"]["annotations"].get(
        contract.DEFAULT_NAMES.gpu_assigned) == "true" and p, what="gpu-assigned")
    admitted = cluster.node(pod["spec"]["nodeName"]).kubelet.admitted(pod["metadata"]["uid"])
    record = contract.PodAllocation.from_json(pod["metadata"]["annotations"][contract.DEFAULT_NAMES.allocation])
    return dict(admitted.container("notebook").env), record


@pytest.fixture
def in_pod(monkeypatch):
    def enter(env):
        for key, value in env.items():
            monkeypatch.setenv(key, value)
    return enter


def shell_run(line):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    ip = InteractiveShell.instance()
    if "jupyter_vgpu" not in ip.extension_manager.loaded:
        ip.run_line_magic("load_ext", "jupyter_vgpu")
    with capture_output() as captured:
        ip.run_line_magic("vgpu", line)
    return captured.stdout, ip


def unload(ip):
    if "jupyter_vgpu" in ip.extension_manager.loaded:
        ip.run_line_magic("unload_ext", "jupyter_vgpu")


@pytest.fixture(scope="module")
def alice(cluster):
    return start_notebook(cluster, "alice", 25, "8GiB")


class TestAllocationAndUsage:
    @pytest.fixture
    def vgpu_config(self, alice, in_pod):
        self.env, self.record = alice
        in_pod(self.env)
        return {"source": "auto"}

    def test_api_and_magic_report_the_device_plugins_allocation(self, run, jp_fetch):
        [share] = self.record.containers[0].cards
        answer = as_json(run(jp_fetch("vgpu", "api", "allocation")))
        assert answer["state"] == "allocated" and answer["source"] == "node-api"
        allocation = answer["allocation"]
        assert (allocation["node"], allocation["pod"], allocation["cores"], allocation["memoryMib"]) == \
            (self.record.node, "alice", 25, 8192)
        [card] = allocation["cards"]
        assert (card["index"], card["uuid"], card["cores"], card["memoryMib"]) == \
            (share.index, share.uuid, share.cores, share.memory_mib)
        assert self.env[contract.ENV_DEVICE_UUIDS] == share.uuid
        out, ip = shell_run("status")
        try:
            assert f"vGPU on {self.record.node} (pod default/alice) — node-api" in out
            assert f"GPU {share.index} · NVIDIA A100-SXM4-40GB  {share.uuid}" in out
            assert "share: 25 % compute, 8 GiB memory" in out
        finally:
            unload(ip)
        topology = as_json(run(jp_fetch("vgpu", "api", "topology")))["topology"]
        assert [g["index"] for g in topology["gpus"] if g["mine"]] == [share.index]

    def test_usage_changes_over_time_in_api_and_magic(self, run, jp_fetch):
        seen = set()

        def three_readings() -> bool:
            usage = as_json(run(jp_fetch("vgpu", "api", "usage", params={"history": "30"})))
            if usage["state"] == "live" and usage["current"]:
                assert usage["limits"] == {"cores": 25, "memoryMib": 8192}
                assert usage["current"]["memoryUsedMib"] <= 8192
                seen.add((usage["current"]["memoryUsedMib"], usage["current"]["utilizationPercent"]))
            return len(seen) >= 3

        wait_for(three_readings, timeout=60, interval=0.3, what="three different usage readings")
        out, ip = shell_run("status")
        unload(ip)
        assert "usage (live)" in out and "of your 8 GiB" in out


def wait_request(run, jp_fetch, request_id, timeout=120):
    messages = []

    def settled():
        state = as_json(run(jp_fetch("vgpu", "api", "requests", request_id)))
        if not messages or messages[-1] != state["message"]:
            messages.append(state["message"])
        return state if state["state"] != "pending" else None

    return wait_for(settled, timeout=timeout, interval=0.1, what=f"request {request_id} to settle"), messages


class TestShareRequests:
    @pytest.fixture
    def vgpu_config(self, cluster, in_pod, monkeypatch):
        env, _ = start_notebook(cluster, "bob", 25, "4GiB")
        in_pod(env)
        monkeypatch.setenv(contract.ENV_NOTEBOOK_KUBECONFIG, cluster.kubeconfig)
        return {"source": "auto", "requester_class": KUBE_REQUESTER}

    def test_request_recreates_the_pod_with_the_new_share(self, run, jp_fetch, cluster):
        accepted = run(jp_fetch("vgpu", "api", "requests", method="POST",
                                body=json.dumps({"cores": 50, "memory": "8GiB"})))
        assert accepted.code == 202
        final, _ = wait_request(run, jp_fetch, as_json(accepted)["id"])
        assert final["progress"][:3] == ["asking for 50 % of one card with 8 GiB", "reading pod default/bob",
                                         "creating pod bob-v2 with 50 % of one card with 8 GiB"]
        assert final["state"] == "scheduled", final
        new = cluster.read_pod("default", "bob-v2")
        record = contract.PodAllocation.from_json(new["metadata"]["annotations"][contract.DEFAULT_NAMES.allocation])
        [share] = record.containers[0].cards
        assert (share.cores, share.memory_mib) == (50, 8192)
        assert final["node"] == record.node and final["cards"] == [
            {"index": share.index, "uuid": share.uuid, "cores": 50, "memoryMib": 8192}]
        assert f"pod bob-v2 was scheduled on {record.node}, card {share.index} ({share.uuid})" == final["message"]
        # make before break: the old pod goes only after the new one holds its share
        cluster.wait_for(lambda: cluster.read_pod("default", "bob") is None, what="the old pod to be deleted")
        # the server in the new pod tells its user what happened
        admitted = cluster.node(new["spec"]["nodeName"]).kubelet.admitted(new["metadata"]["uid"])
        from vgpu_plugin.demo.requester import KubeRecreateRequester

        from jupyter_vgpu.requesters.base import RequesterSettings
        from jupyter_vgpu.requesters.registry import make_tracker

        tracker = make_tracker(KubeRecreateRequester, RequesterSettings(
            environ={**admitted.container("notebook").env, contract.ENV_NOTEBOOK_KUBECONFIG: cluster.kubeconfig},
            timeout=60))
        recovered = tracker.latest()
        # one id for one request: the new pod's server answers for it by the id the old one gave it
        assert (recovered.id, recovered.state, recovered.message) == (final["id"], "scheduled", final["message"])
        again = make_tracker(KubeRecreateRequester, RequesterSettings(
            environ={**admitted.container("notebook").env, contract.ENV_NOTEBOOK_KUBECONFIG: cluster.kubeconfig},
            timeout=60)).get(final["id"])  # the panel follows the request it sent, on the server that took over
        assert again is not None and (again.id, again.state) == (final["id"], "scheduled")
        assert recovered.cards == final["cards"] and recovered.progress[0] == "re-created from pod bob"

    def test_release_recreates_the_pod_without_a_gpu(self, cluster, in_pod, monkeypatch):
        env, _ = start_notebook(cluster, "dave", 10, "2GiB")
        in_pod(env)
        monkeypatch.setenv(contract.ENV_NOTEBOOK_KUBECONFIG, cluster.kubeconfig)
        monkeypatch.setenv(contract.ENV_NOTEBOOK_REQUESTER, KUBE_REQUESTER)  # as the demo's lab passes it on
        out, ip = shell_run("release")
        unload(ip)
        assert out.splitlines()[-1].startswith("✔ scheduled: pod dave-v2 runs on gpu-a without a GPU"), out
        limits = cluster.read_pod("default", "dave-v2")["spec"]["containers"][0]["resources"].get("limits") or {}
        assert not set(limits) & set(contract.DEFAULT_NAMES.resources)
        cluster.wait_for(lambda: cluster.read_pod("default", "dave") is None, what="the old pod to be deleted")

    def test_an_impossible_request_says_why_and_keeps_the_old_pod(self, cluster, in_pod, monkeypatch):
        env, _ = start_notebook(cluster, "carol", 10, "2GiB")
        in_pod(env)
        monkeypatch.setenv(contract.ENV_NOTEBOOK_KUBECONFIG, cluster.kubeconfig)
        monkeypatch.setenv(contract.ENV_NOTEBOOK_REQUESTER, KUBE_REQUESTER)  # as the demo's lab passes it on
        out, ip = shell_run("request --cores 400")  # four whole cards while shares are held
        unload(ip)
        assert "✘ failed: no node can take carol-v2's share:" in out, out
        assert "Insufficient tencent.com/vcuda-core" in out.splitlines()[-1]  # the scheduler's own reason
        assert "  … creating pod carol-v2 with 4 whole cards" in out
        assert cluster.read_pod("default", "carol")["status"]["phase"] == "Running"
        cluster.wait_for(lambda: cluster.read_pod("default", "carol-v2") is None, what="the refused pod to go")
