"""A notebook pod's journey through real Kubernetes: kube-apiserver, kube-scheduler calling our
extender (filter, prioritize, bind with the claim annotations), the kubelet's device manager
calling our device plugin (registration, ListAndWatch, GetPreferredAllocation, Allocate, its
checkpoint), the container created with the Allocate answer, and our node API answering the
pod's token. The simulated cluster's tests/e2e/test_allocation_flow.py and test_mig_flow.py
walk the same journey with the stand-ins, with faults the real programs cannot be made to show.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from realkube_support import GPU_A, GPU_B, MIG, annotations, http, notebook
from simkube.waiting import wait_for
from vgpu_plugin.deviceplugin.checkpoint import read_checkpoint

from jupyter_vgpu.core import contract as c

pytestmark = pytest.mark.slow


def kube_version() -> str:
    go_mod = Path(__file__).resolve().parents[2] / "hack" / "kube" / "go.mod"
    return next(line.split()[1] for line in go_mod.read_text().splitlines() if line.strip().startswith("k8s.io/kubernetes "))


def record(pod: dict[str, Any], names: c.Names) -> c.PodAllocation:
    return c.PodAllocation.from_json(annotations(pod)[names.allocation])


def confirmed(real: Any, pod: dict[str, Any], names: c.Names) -> dict[str, Any]:
    """The pod once the node daemon has seen kubelet's checkpoint and marked it assigned."""
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    return real.wait_for(lambda: (p := real.read_pod(namespace, name)) and annotations(p).get(names.gpu_assigned)
                         == "true" and p, timeout=30, what=f"{name} marked {names.gpu_assigned}=true")


def checkpoint_devices(real: Any, node: str, uid: str, resource: str) -> tuple[str, ...]:
    entries = read_checkpoint(str(real.node(node).plugin_dir / "kubelet_internal_checkpoint"))
    return tuple(d for e in entries if e.pod_uid == uid and e.resource == resource for d in e.device_ids)


def test_kubectl_reports_the_real_server_version(real: Any) -> None:
    versions = json.loads(real.kubectl("version", "-o", "json"))
    assert versions["serverVersion"]["gitVersion"] == kube_version()
    assert versions["clientVersion"]["gitVersion"] == kube_version()
    nodes = json.loads(real.kubectl("get", "nodes", "-o", "json"))["items"]
    assert {n["metadata"]["name"]: n["status"]["nodeInfo"]["kubeletVersion"] for n in nodes} == {
        GPU_A: kube_version(), GPU_B: kube_version(), MIG: kube_version()}
    assert {n["status"]["nodeInfo"]["containerRuntimeVersion"].split(":")[0] for n in nodes} == {"fakeRuntime"}


def test_share_pod_through_the_real_scheduler_kubelet_and_device_plugin(real: Any, pods: list, names: c.Names
                                                                         ) -> None:
    pod = notebook(real, pods, "share", cores=25, memory="4GiB", pool="a100")
    node, uid = pod["spec"]["nodeName"], pod["metadata"]["uid"]
    assert node == GPU_A
    # bound by kube-scheduler through our extender: the Binding carried the claim
    assert annotations(pod)[names.predicate_node] == GPU_A
    allocation = record(pod, names)
    [share] = allocation.containers[0].cards
    assert (share.cores, share.memory_units) == (25, 16)
    # the kubelet's device manager checkpointed what our device plugin gave it
    pod = confirmed(real, pod, names)
    assert len(checkpoint_devices(real, node, uid, names.core_resource)) == 25
    assert len(checkpoint_devices(real, node, uid, names.memory_resource)) == 16
    # the container the kubelet created holds the Allocate answer
    env = real.node(node).container_env("default", "share", "notebook")
    assert env[c.ENV_NVIDIA_VISIBLE_DEVICES] == share.uuid
    assert env["VGPU_CORES"] == "25" and env["VGPU_MEMORY_MIB"] == "4096"
    assert env["VGPU_POD_UID"] == uid
    assert "CDIDevices" not in real.node(node).container_config("default", "share", "notebook")  # gpu-a: no --cdi
    # the node API answers the pod's own token with its own allocation
    status, body = wait_for(lambda: (r := http(env[c.ENV_METRICS_URL] + "/api/v1/allocation", env[c.ENV_TOKEN]))[0]
                            != 403 and r, timeout=30, interval=0.2, what="the node API to know the pod")
    assert status == 200 and (body["pod"], body["cores"], body["memoryMib"]) == ("share", 25, 4096)
    assert body["cards"][0]["uuid"] == share.uuid
    assert http(env[c.ENV_METRICS_URL] + "/api/v1/allocation", "v2.not-a-token")[0] in (401, 403)


def test_whole_and_multi_card_pods(real: Any, pods: list, names: c.Names) -> None:
    whole = notebook(real, pods, "whole", cores=100, pool="p40")
    pair = notebook(real, pods, "pair", cores=200, pool="p40")
    for pod, cards in ((whole, 1), (pair, 2)):
        assert pod["spec"]["nodeName"] == GPU_B
        shares = record(pod, names).containers[0].cards
        assert len(shares) == cards and all(s.cores == 100 for s in shares)
        confirmed(real, pod, names)
        env = real.node(GPU_B).container_env("default", pod["metadata"]["name"], "notebook")
        assert sorted(env[c.ENV_NVIDIA_VISIBLE_DEVICES].split(",")) == sorted(s.uuid for s in shares)
        # gpu-b's daemon runs with --cdi: kubelet hands the runtime each card as a CDI device named
        # by its UUID, the name a CDI spec generated with NVIDIA's uuid naming strategy carries
        config = real.node(GPU_B).container_config("default", pod["metadata"]["name"], "notebook")
        assert sorted(d["name"] for d in config["CDIDevices"]) == sorted(f"nvidia.com/gpu={s.uuid}" for s in shares)
        # a whole card is 100 vcuda-core devices and all its memory
        assert len(checkpoint_devices(real, GPU_B, pod["metadata"]["uid"], names.core_resource)) == 100 * cards
    assert not set(record(whole, names).containers[0].cards[0].uuid.split()) & {
        s.uuid for s in record(pair, names).containers[0].cards}


def test_isolated_share_lands_on_a_mig_slice(real: Any, pods: list, names: c.Names) -> None:
    pod = notebook(real, pods, "sliced", cores=10, memory="4GiB", pool="mig", annotations={names.isolation: "mig"})
    assert pod["spec"]["nodeName"] == MIG
    [share] = record(pod, names).containers[0].cards
    assert share.index == 0 and share.mig_device  # card 0 is the one in MIG mode
    confirmed(real, pod, names)
    env = real.node(MIG).container_env("default", "sliced", "notebook")
    assert env[c.ENV_NVIDIA_VISIBLE_DEVICES] == share.mig_device
    # the smallest slice that holds 10 % and 4 GiB, with the slice's real size
    assert (env[c.ENV_MIG_PROFILE], env[c.ENV_CORES], env[c.ENV_MEMORY_MIB]) == ("1g.5gb", "14", "5120")


def test_kubectl_shows_the_pod_where_kube_scheduler_put_it(real: Any, pods: list) -> None:
    notebook(real, pods, "seen", cores=10, memory="1GiB", pool="a100")
    wide = real.kubectl("get", "pods", "-o", "wide")
    [row] = [line.split() for line in wide.splitlines() if line.startswith("seen ")]
    assert row[1:3] == ["1/1", "Running"] and GPU_A in row
    described = real.kubectl("describe", "pod", "seen")
    assert "Successfully assigned default/seen to gpu-a" in described
    events = json.loads(real.kubectl("get", "events", "--field-selector", "involvedObject.name=seen", "-o", "json"))
    reasons = {(e["reason"], (e.get("reportingComponent") or e["source"].get("component", ""))) for e in events["items"]}
    assert ("Scheduled", "vgpu-scheduler") in reasons
