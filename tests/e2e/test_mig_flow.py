"""MIG slices end to end on the simulated cluster: scheduler stand-in -> extender -> kubelet stand-in ->
device plugin over gRPC -> the container's env -> the simulated GPU process on its slice.

- an isolated request lands on the smallest fitting slice and is given that MIG device;
- a time-shared request never lands on a MIG card unless the node's sharing mode allows it;
- slices are never given twice through churn and restarts of the node daemon and the extender.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_support import NAMES, allocation, delete_pod, inventory, list_pods
from simkube.waiting import wait_for

from jupyter_vgpu.core import contract as c

pytestmark = pytest.mark.slow

MIG_NODE = "mig"      # card 0: 3 x 2g.10gb + 1 x 1g.5gb; cards 1-3 whole; default sharing ("isolated")
MIG_ONLY = "mig-only"  # card 0 likewise, sharing "mig": every share goes on a slice
LAYOUT = ("2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb")
ISOLATED = {NAMES.isolation: "mig"}


@pytest.fixture(scope="module")
def cluster(topology_fixtures: Any) -> Iterator[Any]:
    from vgpu_plugin.demo.cluster import NodeSpec, SimCluster

    nodes = [NodeSpec(MIG_NODE, "a100-sxm-4gpu-nv4.txt", seed=3, mig={0: LAYOUT},
                      labels={"pool": "a"}),
             NodeSpec(MIG_ONLY, "a100-sxm-4gpu-nv4.txt", seed=4, mig={0: LAYOUT}, gpu_sharing="mig",
                      labels={"pool": "b"})]
    with SimCluster(nodes, fixtures_dir=topology_fixtures, metrics_period=0.5) as sim:
        yield sim


def profiles(cluster: Any, node: str) -> dict[str, str]:
    return {s.uuid: s.profile for card in inventory(cluster, node).cards for s in card.slices}


def notebook(cluster: Any, name: str, cores: int, memory: str, pool: str, annotations: dict[str, str] | None = None
             ) -> dict[str, Any]:
    body = cluster.notebook_pod(name, cores=cores, memory=memory, annotations=annotations)
    body["spec"]["nodeSelector"] = {"pool": pool}
    cluster.core_v1.create_namespaced_pod("default", body, _preload_content=False)
    return cluster.wait_for_pod("default", name, timeout=60)


def env_of(cluster: Any, pod: dict[str, Any]) -> dict[str, str]:
    admitted = cluster.node(pod["spec"]["nodeName"]).kubelet.admitted(pod["metadata"]["uid"])
    assert admitted is not None
    return dict(admitted.containers[0].env)


@pytest.fixture
def pods(cluster: Any) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        delete_pod(cluster, "default", name)
    wait_for(lambda: not [p for p in list_pods(cluster) if p["metadata"]["name"] in names], timeout=60, what="pods gone")
    wait_for(lambda: not cluster.extender.ledger.node(MIG_NODE).held_slices, timeout=30, what="slices given back")


def test_an_isolated_request_lands_on_the_smallest_fitting_slice(cluster: Any, pods: list[str]) -> None:
    pods.append("iso-small")
    pod = notebook(cluster, "iso-small", 10, "4Gi", "a", ISOLATED)
    device = pod["metadata"]["annotations"][NAMES.mig_slice(0)]
    assert profiles(cluster, MIG_NODE)[device] == "1g.5gb"
    env = env_of(cluster, pod)
    assert env[c.ENV_NVIDIA_VISIBLE_DEVICES] == device and env[c.ENV_ENFORCEMENT] == c.ENFORCEMENT_MIG
    assert (env[c.ENV_CORES], env[c.ENV_MEMORY_MIB], env[c.ENV_MIG_PROFILE]) == ("14", "5120", "1g.5gb")
    assert not [k for k in env if k.startswith("CUDA_DEVICE_")]
    gpus = cluster.node(MIG_NODE).gpus
    wait_for(lambda: any(p.mig_device == device for p in gpus.sample().processes), timeout=30, what="the process on its slice")
    pods.append("iso-big")
    bigger = notebook(cluster, "iso-big", 25, "8Gi", "a", ISOLATED)
    assert profiles(cluster, MIG_NODE)[bigger["metadata"]["annotations"][NAMES.mig_slice(0)]] == "2g.10gb"


def test_a_time_shared_request_never_lands_on_a_mig_card_unless_allowed(cluster: Any, pods: list[str]) -> None:
    for i in range(6):
        pods.append(f"shared-{i}")
        pod = notebook(cluster, f"shared-{i}", 30, "4Gi", "a")
        record = allocation(pod)
        assert record is not None
        assert [s.index for s in record.containers[0].cards] != [0]
        assert NAMES.mig_slice(0) not in pod["metadata"]["annotations"]
    pods.append("on-slice")
    allowed = notebook(cluster, "on-slice", 10, "4Gi", "b")     # sharing "mig": shares go on slices
    assert profiles(cluster, MIG_ONLY)[allowed["metadata"]["annotations"][NAMES.mig_slice(0)]] == "1g.5gb"


def _held_slices(cluster: Any) -> Counter[str]:
    live = [p for p in list_pods(cluster) if not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    return Counter(v for p in live for k, v in (p["metadata"].get("annotations") or {}).items()
                   if k.startswith(NAMES.mig_slice_prefix))


def _served_slices(cluster: Any) -> Counter[str]:
    served = cluster.node(MIG_NODE).daemon.allocator.served()
    return Counter(s.mig_device for entry in served.values() for s in entry.allocation.cards if s.mig_device)


def test_slices_are_never_double_allocated_through_churn_and_restarts(cluster: Any, pods: list[str]) -> None:
    sizes = [(10, "4Gi"), (20, "8Gi"), (25, "9Gi"), (12, "4Gi")]
    for wave in range(3):
        names = [f"churn-{wave}-{i}" for i in range(4)]
        for name, (cores, memory) in zip(names, sizes, strict=True):
            pods.append(name)
            notebook(cluster, name, cores, memory, "a", ISOLATED)
        assert set(_held_slices(cluster)) == set(profiles(cluster, MIG_NODE))   # all four taken
        assert max(_held_slices(cluster).values()) == 1 and max(_served_slices(cluster).values()) == 1
        # a fifth isolated pod waits: no slice is free
        pods.append(f"waiting-{wave}")
        body = cluster.notebook_pod(f"waiting-{wave}", cores=10, memory="4Gi", annotations=ISOLATED)
        body["spec"]["nodeSelector"] = {"pool": "a"}
        cluster.core_v1.create_namespaced_pod("default", body, _preload_content=False)
        if wave == 0:
            cluster.restart_daemon(MIG_NODE)
        elif wave == 1:
            cluster.restart_extender()
        assert max(_served_slices(cluster).values()) == 1
        delete_pod(cluster, "default", names[1])
        # the waiting pod takes the slice given back, and only that one
        running = cluster.wait_for_pod("default", f"waiting-{wave}", timeout=60)
        assert max(_held_slices(cluster).values()) == 1
        assert running["metadata"]["annotations"][NAMES.mig_slice(0)] in profiles(cluster, MIG_NODE)
        for name in names + [f"waiting-{wave}"]:
            delete_pod(cluster, "default", name)
        wait_for(lambda: not _held_slices(cluster), timeout=60, what="every slice given back")
        wait_for(lambda: not cluster.extender.ledger.node(MIG_NODE).held_slices, timeout=30, what="the ledger emptied")


def test_whole_card_requests_never_take_a_mig_mode_card(cluster: Any, pods: list[str]) -> None:
    # the MIG-only node has three whole cards and card 0 in MIG mode: three whole cards fit, on 1-3
    pods.append("three-cards")
    pod = notebook(cluster, "three-cards", 300, "1Gi", "b")
    record = allocation(pod)
    assert record is not None and sorted(s.index for s in record.containers[0].cards) == [1, 2, 3]
    assert not [k for k in pod["metadata"]["annotations"] if k.startswith(NAMES.mig_slice_prefix)]
    # one more whole card waits, though card 0's slices are all free: a MIG card is never a whole card
    pods.append("one-more")
    body = cluster.notebook_pod("one-more", cores=100, annotations=None)
    body["spec"]["nodeSelector"] = {"pool": "b"}
    cluster.core_v1.create_namespaced_pod("default", body, _preload_content=False)

    def failed_scheduling() -> list[Any]:
        events = cluster.core_v1.list_namespaced_event("default", field_selector="involvedObject.name=one-more").items
        return [e for e in events if e.reason == "FailedScheduling"]

    wait_for(failed_scheduling, timeout=60, what="a FailedScheduling event for the fourth whole card")
    assert cluster.read_pod("default", "one-more")["status"]["phase"] == "Pending"
    assert not cluster.extender.ledger.node(MIG_ONLY).held_slices
