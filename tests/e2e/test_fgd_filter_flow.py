"""The deployed default policy, fgd-filter, through every real component of the simulated cluster.

Under fgd-filter the extender's filter answers kube-scheduler with one node only (the best FGD
score), so the scheduler stand-in binds there without scoring; the pods must still run with
their allocation confirmed by the device plugin, no card may be over-committed, and the
capacity must come back when they go.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_support import (
    DGX,
    NAMES,
    P40,
    allocation,
    create_pod,
    delete_pod,
    free_cores,
    holdings_from_annotations,
    inventory,
    list_pods,
    overcommitted,
    pod_body,
)
from simkube.waiting import wait_for

pytestmark = pytest.mark.slow

SHARES = [(25, 16), (50, 32), (10, 8), (75, 48), (20, 8), (40, 24), (15, 4), (30, 16)]


@pytest.fixture(scope="module")
def fgd_cluster(topology_fixtures: Any) -> Iterator[Any]:
    from vgpu_plugin.demo.cluster import NodeSpec, SimCluster

    nodes = [NodeSpec(DGX, "dgx-a100.txt", model="NVIDIA A100-SXM4-40GB", memory_mib=40960, seed=1),
             NodeSpec(P40, "p40-7gpu-pix-phb.txt", model="Tesla P40", memory_mib=24576, seed=2)]
    with SimCluster(nodes, fixtures_dir=topology_fixtures, metrics_period=0.5, policy="fgd-filter") as sim:
        yield sim


def test_the_filter_answers_kube_scheduler_with_one_node(fgd_cluster: Any) -> None:
    """What the scheduler stand-in gets back for a share both nodes could take: one of them."""
    body = pod_body(fgd_cluster, "fgd-asked", 25, 16)
    body["metadata"]["uid"] = "0b0e7c6e-5f2a-4c1e-9d8a-000000000001"
    request = urllib.request.Request(f"{fgd_cluster.extender.url}/filter", method="POST",
                                     data=json.dumps({"Pod": body, "Nodes": None, "NodeNames": [P40, DGX]}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=15) as response:
        result = json.loads(response.read())
    assert result["Error"] == "" and len(result["NodeNames"]) == 1 and result["NodeNames"][0] in (DGX, P40)
    assert not result["FailedNodes"]


def test_shares_placed_by_fgd_filter_run_and_never_overcommit(fgd_cluster: Any) -> None:
    cluster = fgd_cluster
    before = {node: free_cores(cluster, node) for node in (DGX, P40)}
    names = [f"fgd-{i}" for i in range(len(SHARES))]
    try:
        for name, (cores, units) in zip(names, SHARES, strict=True):
            create_pod(cluster, pod_body(cluster, name, cores, units))  # no node selector: the extender picks
        for name, (cores, units) in zip(names, SHARES, strict=True):
            pod = cluster.wait_for_pod("default", name, timeout=60)
            record = allocation(pod)
            assert record is not None and record.node == pod["spec"]["nodeName"], name
            assert pod["metadata"]["annotations"][NAMES.gpu_assigned] == "true"
            (container,) = record.containers
            assert [(s.cores, s.memory_units) for s in container.cards] == [(cores, units)]

        capacity = {(node, card.index): card.memory_units for node in (DGX, P40)
                    for card in inventory(cluster, node).cards}
        held = holdings_from_annotations(p for p in list_pods(cluster) if p["metadata"]["name"] in names)
        assert overcommitted(held, capacity) == []
        # the extender's ledger holds exactly what the annotations say
        for node in (DGX, P40):
            used = {i: before[node][i] - free for i, free in free_cores(cluster, node).items()}
            assert {i: n for i, n in used.items() if n} == {i: cores for (n, i), (cores, _) in held.items()
                                                            if n == node}
    finally:
        for name in names:
            delete_pod(cluster, "default", name)
    for node in (DGX, P40):
        wait_for(lambda node=node: free_cores(cluster, node) == before[node], timeout=30,
                 what=f"{node}'s capacity back")
