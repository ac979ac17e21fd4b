"""End to end: a Hub profile offering a hardware-isolated MIG slice, next to a time-shared share.

The real JupyterHub + KubeSpawner on the simulated cluster, whose one node has an A100 80GB in
MIG mode (3 x 2g.20gb + 1 x 1g.10gb, as an admin made it) beside three whole cards. Alice picks
"1g.10gb — isolated": KubeSpawner creates her pod with the isolation annotation our hook adds,
the extender binds it to the smallest slice that holds the share (the 1g.10gb, not a 2g.20gb),
the device plugin's Allocate hands out that MIG device, and her single-user server reports the
slice. Bob picks the time-shared "¼ GPU · 20 GiB" and never lands on the MIG card.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hub_support import Hub, allocated, hub_cluster, running_hub, sim_cluster_config, start_and_wait

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.claims import pod_claim
from jupyter_vgpu.core.inventory import NodeInventory

pytestmark = pytest.mark.slow

NODE = "gpu-mig"
LAYOUT = ("2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb")
NAMES = contract.DEFAULT_NAMES


@pytest.fixture
def cluster(topology_fixtures: Path) -> Iterator[Any]:
    from vgpu_plugin.demo.cluster import NodeSpec

    node = NodeSpec(NODE, "a100-sxm-4gpu-nv4.txt", model="NVIDIA A100-SXM4-80GB", memory_mib=81920, seed=9,
                    mig={0: LAYOUT})
    with hub_cluster([node], topology_fixtures, "vgmig-") as running:
        yield running


@pytest.fixture
def hub(tmp_path: Path, cluster: Any) -> Iterator[Hub]:
    config = sim_cluster_config("""
        from jupyter_vgpu.hub import VGPUHub

        c.VGPUHub.shares = [
            {"slug": "vgpu-quarter", "display_name": "¼ GPU · 20 GiB", "cores": 25, "memory": "20GiB"},
            {"slug": "mig-1g10", "display_name": "1g.10gb — isolated", "cores": 14, "memory": "9GiB",
             "isolated": True},
        ]
        VGPUHub(config=c).configure(c)
    """)
    with running_hub(tmp_path, config, env={"KUBECONFIG": cluster.kubeconfig}, users=("alice", "bob")) as running:
        yield running


def slices_of(cluster: Any) -> dict[str, str]:
    """MIG device UUID -> profile, from the node annotation the device plugin publishes."""
    node = json.loads(cluster.core_v1.read_node(NODE, _preload_content=False).data)
    inventory = NodeInventory.from_json(node["metadata"]["annotations"][NAMES.node_inventory])
    return {s.uuid: s.profile for card in inventory.cards for s in card.slices}


def test_an_isolated_profile_lands_on_the_smallest_slice_and_a_time_shared_one_never_on_the_mig_card(
        cluster: Any, hub: Hub) -> None:
    # alice: the isolated profile -> the 1g.10gb slice, though the 2g.20gb slices would hold it too
    start_and_wait(cluster, hub, {"profile": "mig-1g10"}, user="alice")
    pod = cluster.read_pod("default", "jupyter-alice")
    annotations = pod["metadata"]["annotations"]
    assert annotations[NAMES.isolation] == "mig" and pod["spec"]["nodeName"] == NODE
    device = annotations[NAMES.mig_slice(0)]
    slices = slices_of(cluster)
    assert slices[device] == "1g.10gb" and sorted(slices.values()) == sorted(LAYOUT)
    claim = pod_claim(pod, NAMES)
    assert claim is not None and claim.allocation is not None
    (share,) = claim.allocation.containers[0].cards
    assert (share.index, share.mig_device) == (0, device)

    # the device plugin's Allocate gave the container that MIG device, and no time-sharing limits
    env = cluster.node(NODE).kubelet.env("default", "jupyter-alice", "notebook")
    assert env[contract.ENV_NVIDIA_VISIBLE_DEVICES] == device and device.startswith("MIG-")
    assert (env[contract.ENV_ENFORCEMENT], env[contract.ENV_MIG_PROFILE]) == (contract.ENFORCEMENT_MIG, "1g.10gb")
    assert not [name for name in env if name.startswith("CUDA_DEVICE_")]
    served = cluster.node(NODE).daemon.allocator.served()
    assert [s.mig_device for entry in served.values() for s in entry.allocation.cards] == [device]

    # her server reports the whole slice: profile, GPU, its real size (not the 14 % and 9 GiB asked)
    answer = hub.wait(lambda: allocated(cluster, hub, user="alice"), "alice's allocation")
    held = answer["allocation"]
    assert (held["enforcement"], held["cores"], held["memoryMib"]) == (contract.ENFORCEMENT_MIG, 14, 10240)
    assert [(c["index"], c["uuid"], c["migProfile"]) for c in held["cards"]] == [(0, device, "1g.10gb")]

    # bob: the time-shared profile, on a whole card beside the MIG card, never on card 0
    start_and_wait(cluster, hub, {"profile": "vgpu-quarter"}, user="bob")
    bob = cluster.read_pod("default", "jupyter-bob")
    assert NAMES.isolation not in bob["metadata"]["annotations"]
    assert NAMES.mig_slice(0) not in bob["metadata"]["annotations"]
    bob_claim = pod_claim(bob, NAMES)
    assert bob_claim is not None and bob_claim.allocation is not None
    (bob_share,) = bob_claim.allocation.containers[0].cards
    assert bob_share.index != 0 and not bob_share.mig_device
    bob_env = cluster.node(NODE).kubelet.env("default", "jupyter-bob", "notebook")
    assert not bob_env[contract.ENV_NVIDIA_VISIBLE_DEVICES].startswith("MIG-")
    answer = hub.wait(lambda: allocated(cluster, hub, user="bob"), "bob's allocation")
    assert (answer["allocation"]["cores"], answer["allocation"]["memoryMib"]) == (25, 20 * 1024)
    assert "migProfile" not in answer["allocation"]["cards"][0]
