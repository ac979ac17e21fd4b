"""MIG slices through the device plugin's real gRPC: Allocate hands the container its MIG device and
no HAMi-core/MPS limits; a slice is never given twice; layouts that change are re-advertised."""

from __future__ import annotations

import grpc
import pytest
from deviceplugin_support import make_node, place_pod, sim_gpus, wait_registered
from simkube.waiting import wait_for

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import Request

NAMES = c.DEFAULT_NAMES
LAYOUT = ["2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"]


def mig_ids(kind: str, card: int, count: int) -> list[str]:
    return [f"gpu{card}-core-{n:02d}" if kind == "core" else f"gpu{card}-mem-{n:04d}" for n in range(count)]


def test_allocate_hands_out_the_mig_device_without_software_limits(daemons, peer, core_v1):
    make_node(core_v1)
    gpus = sim_gpus()
    made = gpus.set_mig_layout(1, LAYOUT)
    daemons(gpus)
    wait_registered(peer)
    cores = [d for d in peer.list_devices(NAMES.core_resource) if d.ID.startswith("gpu1-")]
    assert len(cores) == 3 * 28 + 14 and {d.health for d in cores} == {"Healthy"}
    one_g = made[3]
    place_pod(core_v1, gpus, "iso", [(Request(10, 16), (1,))], slices={0: one_g.uuid})
    _, answer = peer.admit(NAMES.core_resource, 10, mig_ids("core", 1, 98))
    envs = dict(answer.envs)
    assert envs[c.ENV_NVIDIA_VISIBLE_DEVICES] == one_g.uuid
    assert envs[c.ENV_DEVICE_UUIDS] == one_g.uuid and envs[c.ENV_DEVICE_INDICES] == "1"
    assert envs[c.ENV_ENFORCEMENT] == c.ENFORCEMENT_MIG and envs[c.ENV_MIG_PROFILE] == "1g.5gb"
    assert (envs[c.ENV_CORES], envs[c.ENV_MEMORY_MIB]) == ("14", "5120")    # the slice's real size
    assert not [k for k in envs if k.startswith(("CUDA_DEVICE_", "CUDA_MPS_"))]
    assert not answer.mounts                                                   # no libvgpu.so, no MPS pipes
    _, memory_answer = peer.admit(NAMES.memory_resource, 16, mig_ids("mem", 1, 140))
    assert not memory_answer.envs


def test_a_card_the_admin_split_into_slices_is_no_warning(daemons, peer, core_v1, caplog):
    """A card in MIG mode with slices is served as them, as set up: said at INFO, not as a WARNING (which the
    demo's --isolated guide showed as a raw log line); a MIG card without slices still warns."""
    make_node(core_v1)
    gpus = sim_gpus()
    gpus.set_mig_layout(1, LAYOUT)
    gpus.set_mig_mode(3, current=True)
    with caplog.at_level("INFO", logger="vgpu_plugin.deviceplugin.daemon"):
        daemons(gpus)
        wait_registered(peer)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "MIG" in r.getMessage()]
    assert len(warnings) == 1 and "card 3" in warnings[0], warnings
    assert any("card 1" in r.getMessage() and "served as its 4 slice(s)" in r.getMessage() and r.levelname == "INFO"
               for r in caplog.records)


def test_a_slice_is_never_given_to_two_containers(daemons, peer, core_v1):
    make_node(core_v1)
    gpus = sim_gpus()
    made = gpus.set_mig_layout(1, LAYOUT)
    daemons(gpus)
    wait_registered(peer)
    place_pod(core_v1, gpus, "first", [(Request(20, 16), (1,))], slices={0: made[0].uuid})
    peer.admit(NAMES.core_resource, 20, mig_ids("core", 1, 98))
    peer.admit(NAMES.memory_resource, 16, mig_ids("mem", 1, 140))
    # a forged or stale second claim on the same slice is refused, with the reason
    place_pod(core_v1, gpus, "second", [(Request(21, 16), (1,))], slices={0: made[0].uuid})
    with pytest.raises(grpc.RpcError, match="already given"):
        peer.admit(NAMES.core_resource, 21, mig_ids("core", 1, 98)[40:])


def test_a_layout_change_is_readvertised(daemons, peer, core_v1):
    make_node(core_v1)
    gpus = sim_gpus()
    gpus.set_mig_layout(1, ["7g.40gb"])
    daemon = daemons(gpus)
    wait_registered(peer)
    assert len([d for d in peer.list_devices(NAMES.core_resource) if d.ID.startswith("gpu1-")]) == 100
    gpus.set_mig_layout(1, ["3g.20gb", "3g.20gb"])
    wait_for(lambda: len([d for d in peer.list_devices(NAMES.core_resource) if d.ID.startswith("gpu1-")]) == 84,
             what="the new layout advertised", timeout=20)
    assert [s.profile for s in daemon.cards.by_index()[1].slices] == ["3g.20gb", "3g.20gb"]


def test_a_pod_on_a_slice_that_no_longer_exists_is_refused(daemons, peer, core_v1):
    make_node(core_v1)
    gpus = sim_gpus()
    made = gpus.set_mig_layout(1, LAYOUT)
    daemon = daemons(gpus)
    wait_registered(peer)
    gpus.set_mig_layout(1, ["3g.20gb", "3g.20gb"])
    wait_for(lambda: [s.profile for s in daemon.cards.by_index()[1].slices] == ["3g.20gb", "3g.20gb"],
             what="the new layout read", timeout=20)
    place_pod(core_v1, gpus, "late", [(Request(10, 16), (1,))], slices={0: made[3].uuid})
    with pytest.raises(grpc.RpcError, match="does not exist"):
        peer.admit(NAMES.core_resource, 10, mig_ids("core", 1, 84))


def test_a_node_whose_cards_are_all_in_mig_mode_is_labelled_and_publishes_its_slices(daemons, peer, core_v1):
    import json

    from jupyter_vgpu.core.inventory import NodeInventory

    make_node(core_v1)
    gpus = sim_gpus()
    for card in range(4):
        gpus.set_mig_layout(card, ["3g.20gb", "3g.20gb"])
    daemons(gpus)
    wait_registered(peer)

    def meta() -> dict:
        return json.loads(core_v1.read_node("node-1", _preload_content=False).data)["metadata"]

    text = wait_for(lambda: (meta().get("annotations") or {}).get(NAMES.node_inventory), what="the inventory", timeout=20)
    inventory = NodeInventory.from_json(text)
    assert all(not card.healthy and [s.profile for s in card.slices] == ["3g.20gb"] * 2 for card in inventory.cards)
    assert meta()["labels"][NAMES.node_label_gpu] == "true"   # slices to serve: a GPU node all the same
    assert len(peer.list_devices(NAMES.core_resource)) == 4 * 2 * 42


def test_a_slice_is_named_as_its_cdi_device_and_its_parents_device_node():
    """With CDI, a container on a slice gets the MIG device's CDI name (nvidia.com/gpu=MIG-...), never its
    parent card's; with device specs, the parent's /dev node (the runtime hook adds the MIG capabilities)."""
    from vgpu_plugin.deviceplugin.enforcement import EnforcementConfig, Identity, container_response

    gpus = sim_gpus()
    made = gpus.set_mig_layout(1, LAYOUT)
    cards = {card.index: card for card in gpus.inventory()}
    share = c.CardShare(index=1, uuid=cards[1].uuid, cores=10, memory_units=16, mig_device=made[3].uuid)
    identity = Identity(node="n1", namespace="ns", pod="nb", pod_uid="u", container="notebook", container_index=0)
    for mode in ("hami-core", "mps", "none"):
        answer = container_response(EnforcementConfig(mode=mode, cdi=True, device_specs=True, dev_root="/dev"),
                                    c.ContainerAllocation(index=0, name="notebook", cards=(share,)), cards, identity,
                                    metrics_url="http://x", token="t")
        assert [d.name for d in answer.cdi_devices] == [f"nvidia.com/gpu={made[3].uuid}"], mode
        assert [d.container_path for d in answer.devices][-1] == f"/dev/nvidia{cards[1].minor}"
        assert answer.envs[c.ENV_ENFORCEMENT] == c.ENFORCEMENT_MIG and not answer.mounts
