"""The simulated cluster with its nodes hosted in node processes (``SimCluster(node_processes=2)``,
as bench_storm --node-processes runs it): GPU pods are scheduled, admitted and confirmed by
kubelet stand-ins and device plugins living in two children; the parent's proxies answer
what the children's real objects hold, and test_churn's invariant watcher and agreement
check work through them unchanged."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from e2e_support import NAMES, allocation, create_pod, http, pod_body
from simkube.waiting import wait_for
from test_churn import CHURN, Watcher, _settled

from jupyter_vgpu.core import contract as c

pytestmark = pytest.mark.slow

NODES = (("np-nv4", "a100-sxm-4gpu-nv4.txt", 40960), ("np-p40", "p40-7gpu-pix-phb.txt", 24576))
RESOURCE = {"core": NAMES.core_resource, "memory": NAMES.memory_resource}  # device kind -> resource


def _confirmed(cluster: Any, name: str) -> dict[str, Any]:
    cluster.wait_for_pod("default", name, timeout=60)
    return cluster.wait_for(
        lambda: (pod := cluster.read_pod("default", name))["metadata"]["annotations"].get(NAMES.gpu_assigned)
        == "true" and pod, timeout=60, what=f"{name}'s allocation confirmed")


def test_pods_run_on_nodes_in_node_processes_and_the_proxies_answer_what_the_children_hold(
        topology_fixtures: Any) -> None:
    from vgpu_plugin.demo.cluster import ClusterError, NodeSpec, SimCluster

    specs = [NodeSpec(name, fixture, memory_mib=memory, seed=i) for i, (name, fixture, memory) in enumerate(NODES)]
    with SimCluster(specs, fixtures_dir=topology_fixtures, metrics_period=1.0, ready_timeout=90,
                    node_processes=2) as cluster:
        hosts = list(cluster.node_hosts)
        # one node per child (round-robin), and none of their threads here
        assert len(hosts) == 2 and all(h.running for h in hosts)
        assert len({h.pid for h in hosts} | {os.getpid()}) == 3
        assert [[spec.name for spec, _, _ in h.spec.nodes] for h in hosts] == [["np-nv4"], ["np-p40"]]
        assert not [t.name for t in threading.enumerate() if t.name.startswith("vgpu-")]

        watcher = Watcher(cluster).start()
        try:
            asks = {"np-a": ("np-nv4", 30, 24), "np-b": ("np-nv4", 50, 40), "np-c": ("np-p40", 25, 16)}
            for name, (node, cores, units) in asks.items():
                create_pod(cluster, pod_body(cluster, name, cores, units, node=node, labels={CHURN: "true"}))
            pods = {name: _confirmed(cluster, name) for name in asks}
            views = wait_for(lambda: _settled(cluster), timeout=60, interval=0.5, what="every component to agree")
        finally:
            watcher.stop()
        assert watcher.violations == [] and watcher.checks > 0 and watcher.failed == {}

        # the agreement views, read through the proxies, hold the three pods where they run
        uids = {name: pod["metadata"]["uid"] for name, pod in pods.items()}
        assert views["pods"] == views["device plugin pods"] == views["kubelet checkpoint pods"] == {
            "np-nv4": {uids["np-a"], uids["np-b"]}, "np-p40": {uids["np-c"]}}
        assert sum(cores for cores, _ in views["device plugin"].values()) == 30 + 50 + 25

        readings = cluster.device_plugin_readings()  # one request per child
        assert set(readings) == {"np-nv4", "np-p40"}
        for name, pod in pods.items():
            node = cluster.node(pod["spec"]["nodeName"])
            usage, served = readings[node.name]
            assert (usage, served) == (node.daemon.allocator.usage(), node.daemon.allocator.served())
            entry = served[(uids[name], 0)]
            # the record the device plugin confirmed is the one it serves, of the size asked
            (container,) = allocation(pod).containers
            assert entry.allocation.cards == container.cards
            assert [(s.cores, s.memory_units) for s in container.cards] == [asks[name][1:]]
            # kubelet admitted exactly the devices the device plugin served
            admitted = node.kubelet.admitted(uids[name])
            assert admitted is not None and admitted.name == name
            assert admitted.containers[0].devices == {RESOURCE[kind]: ids for kind, ids in entry.devices.items()}
            assert node.kubelet.failure(uids[name]) is None
            # the container's env from Allocate reaches the child's metrics server
            env = node.kubelet.env("default", name, "notebook")
            assert env is not None and env[c.ENV_METRICS_URL].startswith(node.metrics_url)
            status, body = wait_for(
                lambda env=env: (r := http(env[c.ENV_METRICS_URL] + "/api/v1/allocation", env[c.ENV_TOKEN]))[0]
                != 403 and r, timeout=30, interval=0.1, what="the metrics server to know the pod")
            assert status == 200 and body, body
        for node in cluster.nodes.values():
            in_use = {RESOURCE[kind]: {d for e in node.daemon.allocator.served().values() for d in e.devices[kind]}
                      for kind in RESOURCE}
            for resource, devices in in_use.items():
                assert node.kubelet.in_use(resource) == devices
            assert node.kubelet.registered(NAMES.core_resource)
            assert sum(h == "Healthy" for h in node.kubelet.devices(NAMES.core_resource).values()) == len(
                [card for card in node.gpus.inventory() if not card.mig]) * 100

        with pytest.raises(ClusterError, match="node process"):
            cluster.restart_daemon("np-nv4")
    assert [h.exitcode for h in hosts] == [0, 0]  # each child stopped its nodes and exited
