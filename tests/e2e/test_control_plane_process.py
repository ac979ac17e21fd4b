"""The simulated cluster with the API server and the control plane (extender + scheduler
stand-in) each in a process of their own, as the storm benchmark runs it: a notebook pod is
scheduled, bound, admitted and confirmed, and the parent's ledger proxy answers what the
child's real ledger holds, before and after the extender restarts."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_support import NAMES, allocation, inspect_cards

pytestmark = pytest.mark.slow

NODE = "cp-a100"


@pytest.fixture
def split_cluster(topology_fixtures: Any) -> Iterator[Any]:
    from vgpu_plugin.demo.cluster import NodeSpec, SimCluster

    with SimCluster([NodeSpec(NODE, "a100-sxm-4gpu-nv4.txt", seed=3)], fixtures_dir=topology_fixtures,
                    metrics_period=2.0, ready_timeout=90, api_process=True, control_plane_process=True) as sim:
        yield sim


def _confirmed(cluster: Any, name: str) -> dict[str, Any]:
    cluster.wait_for_pod("default", name, timeout=60)
    return cluster.wait_for(
        lambda: (pod := cluster.read_pod("default", name))["metadata"]["annotations"].get(NAMES.gpu_assigned)
        == "true" and pod, timeout=60, what=f"{name}'s allocation confirmed")


def _claims_from_record(pod: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    record = allocation(pod)
    assert record is not None and record.node == NODE
    return sorted((container.index, share.index, share.cores, share.memory_units)
                  for container in record.containers for share in container.cards)


def test_a_pod_runs_and_the_ledger_proxy_reports_its_claim_through_an_extender_restart(split_cluster: Any) -> None:
    cluster = split_cluster
    # the extender and the scheduler run in the child, not here
    assert cluster.scheduler is None and cluster.control_plane.running
    assert not [t.name for t in threading.enumerate() if t.name in ("extender-http", "sim-scheduler")]

    created = cluster.core_v1.create_namespaced_pod(
        "default", cluster.notebook_pod("alice", cores=30, memory="6GiB"), _preload_content=False)
    assert created.status == 201
    pod = _confirmed(cluster, "alice")
    uid = pod["metadata"]["uid"]
    expected = {NODE: {uid: _claims_from_record(pod)}}
    assert expected[NODE][uid][0][2:] == (30, 6 * 1024 // 256)  # what was asked, on one card
    ledger = cluster.extender.ledger
    assert ledger.claims() == expected
    assert ledger.overcommitted() == [] and ledger.slices_held_more_than_once() == []
    assert ledger.stats()["pods"] == 1 and ledger.node_names() == [NODE]
    card = expected[NODE][uid][0][1]
    assert inspect_cards(cluster, NODE)[card]["cores"]["held"] == 30  # the child's /inspect, over HTTP

    address = cluster.extender.base_url
    cluster.restart_extender()
    assert cluster.extender.base_url == address  # the scheduler keeps calling it there
    assert cluster.extender.ledger.claims() == expected  # rebuilt from the API alone

    cluster.create_notebook_pod("bob", cores=80, memory="20GiB")  # scheduled through the restarted extender
    second = _confirmed(cluster, "bob")
    claims = cluster.extender.ledger.claims()
    assert claims == {NODE: {uid: expected[NODE][uid], second["metadata"]["uid"]: _claims_from_record(second)}}
    assert cluster.extender.ledger.overcommitted() == []
