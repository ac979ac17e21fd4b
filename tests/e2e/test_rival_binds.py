"""Two pods asking for the same vcuda-core count with different memory, scheduled onto one node
together, through every real component: the extender binds the second only once the device
plugin has marked the first admitted (``gpu-assigned=true``), so kubelet, asking for vcuda-core
first (the count that cannot tell them apart), has one of them to admit at a time, and each
pod runs with its own limit."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_support import DGX, NAMES

from jupyter_vgpu.core import contract as c

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(topology_fixtures: Any) -> Iterator[Any]:
    from vgpu_plugin.demo.cluster import NodeSpec, SimCluster

    with SimCluster([NodeSpec(DGX, "dgx-a100.txt", model="NVIDIA A100-SXM4-40GB", memory_mib=40960, seed=1)],
                    fixtures_dir=topology_fixtures) as sim:
        assert sim.node(DGX).kubelet.resource_order == "as-listed"  # the limits list vcuda-core first
        yield sim


def watch_pods(cluster: Any, seen: list[tuple[int, str, bool, bool]], stop: threading.Event) -> None:
    """(resourceVersion, name, bound, gpu-assigned=true) of every version of the pods in "default"."""
    from kubernetes import watch

    stream = watch.Watch()
    for event in stream.stream(cluster.core_v1.list_namespaced_pod, "default", timeout_seconds=60):
        pod = event["object"]
        seen.append((int(pod.metadata.resource_version), pod.metadata.name, bool(pod.spec.node_name),
                     (pod.metadata.annotations or {}).get(NAMES.gpu_assigned) == "true"))
        if stop.is_set():
            stream.stop()


def test_the_second_is_bound_after_the_first_is_admitted_and_each_runs_with_its_own_limit(cluster):
    asks = {"small": "1Gi", "large": "10Gi"}
    seen: list[tuple[int, str, bool, bool]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=watch_pods, args=(cluster, seen, stop), daemon=True)
    watcher.start()
    for name, memory in asks.items():
        cluster.create_notebook_pod(name, cores=10, memory=memory)
    for name, memory in asks.items():
        pod = cluster.wait_for_pod("default", name, timeout=90)
        assert pod["spec"]["nodeName"] == DGX
        env = cluster.node(DGX).kubelet.env("default", name, "notebook")
        assert env[c.ENV_MEMORY_MIB] == str(c.parse_memory_size(memory) * c.MEMORY_UNIT_MIB), name
    cluster.wait_for(lambda: all(any(n == name and assigned for _, n, _, assigned in seen) for name in asks),
                     what="both pods marked admitted")
    stop.set()
    cluster.core_v1.patch_namespaced_pod("small", "default", {"metadata": {"labels": {"done": "1"}}})  # wakes the watch
    watcher.join(30)

    bound = {name: min(rv for rv, n, is_bound, _ in seen if n == name and is_bound) for name in asks}
    admitted = {name: min(rv for rv, n, _, assigned in seen if n == name and assigned) for name in asks}
    first, second = sorted(asks, key=bound.__getitem__)
    assert bound[second] > admitted[first], (bound, admitted)
    held = cluster.extender.ledger.claims()[DGX]
    assert sorted(claim[0][3] for claim in held.values()) == [4, 40]
