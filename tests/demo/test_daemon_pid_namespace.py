"""Issue 31: the node daemon sees notebooks' GPU processes only from the host's PID namespace.

The driver reports a process to an NVML caller only if its PID exists in the caller's PID
namespace; the simulated driver keeps that rule and the kubelet stand-in starts each container's
process in its own namespace, as containerd does. So the deployed DaemonSet's ``hostPID``,
read from the manifest, decides here what it decides on a real node.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from vgpu_plugin.demo.cluster import NodeSpec, SimCluster
from vgpu_plugin.metrics.sampler import ContainerKey

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import PodAllocation
from jupyter_vgpu.reclaimer.nodes import parse_pods
from jupyter_vgpu.reclaimer.policy import UNKNOWN, Policy, classify

DAEMONSET = Path(__file__).resolve().parents[2] / "deploy" / "base" / "node-daemonset.yaml"
MEMORY_MIB = 3000


def manifest_host_pid() -> bool:
    return bool(yaml.safe_load(DAEMONSET.read_text())["spec"]["template"]["spec"].get("hostPID", False))


def notebook_with_a_gpu_process(cluster: SimCluster) -> tuple[Any, dict[str, Any], int]:
    """(node, pod, host PID) of a served notebook whose GPU process holds MEMORY_MIB on its card."""
    cluster.create_notebook_pod("ann", cores=25, memory="8GiB")
    pod = cluster.wait_for(lambda: (p := cluster.read_pod("default", "ann")) and p["metadata"].get(
        "annotations", {}).get(c.DEFAULT_NAMES.gpu_assigned) == "true" and p, what="ann served")
    node = cluster.node(pod["spec"]["nodeName"])
    uid = pod["metadata"]["uid"]
    pid = cluster.wait_for(lambda: (a := node.kubelet.admitted(uid)) and a.containers[0].gpu_pid,
                           what="ann's GPU process")
    node.gpus.set_usage(pid, MEMORY_MIB, 30)
    return node, pod, pid


def card_of(pod: dict[str, Any]) -> int:
    record = PodAllocation.from_json(pod["metadata"]["annotations"][c.DEFAULT_NAMES.allocation])
    return record.containers[0].cards[0].index


@pytest.fixture
def cluster(request: pytest.FixtureRequest, topology_fixtures: Path) -> Iterator[SimCluster]:
    with SimCluster([NodeSpec("gpu-a", "a100-sxm-4gpu-nv4.txt")], fixtures_dir=topology_fixtures,
                    metrics_period=0.2, host_pid=request.param) as running:
        yield running


@pytest.mark.parametrize("cluster", [manifest_host_pid()], indirect=True, ids=["manifest-hostPID"])
def test_the_deployed_daemon_attributes_a_notebooks_gpu_memory_to_its_pod(cluster: SimCluster) -> None:
    node, pod, pid = notebook_with_a_gpu_process(cluster)
    sampler = node.daemon.metrics_server.sampler
    key = ContainerKey(pod["metadata"]["uid"], 0)
    usage = cluster.wait_for(lambda: (u := sampler.snapshot().usage.get(key)) and u.memory_used_mib == MEMORY_MIB
                             and u, what="the daemon to attribute ann's GPU memory")
    assert usage.pids == (pid,) and usage.utilization_percent == 30.0


@pytest.mark.parametrize("cluster", [False], indirect=True, ids=["no-hostPID"])
def test_without_host_pid_the_daemon_sees_no_pods_process_and_reports_unknown(cluster: SimCluster) -> None:
    node, pod, _ = notebook_with_a_gpu_process(cluster)
    sampler = node.daemon.metrics_server.sampler
    card = card_of(pod)
    # the card's memory is the same from every namespace: the process runs and was sampled
    snapshot = cluster.wait_for(lambda: (s := sampler.snapshot()) and (v := s.card(card)) is not None
                                and v.memory_used_mib == MEMORY_MIB and s, what="a sample with ann's process")
    assert snapshot.processes == () and snapshot.usage == {}

    url = node.scrape_url + "/api/v1/pods?since=0"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {cluster.scrape_token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body = json.load(response)
    (entry,) = body["pods"]
    assert entry["history"] and all(point[1:] == [None, None] for point in entry["history"])
    _, (usage,) = parse_pods(body, url)
    assert classify(usage.points, Policy()) == UNKNOWN  # the reclaimer acts on nothing it cannot see
