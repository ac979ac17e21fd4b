"""The device plugin as kubelet sees it: real gRPC on unix sockets, Kubernetes in the simulated API."""

from __future__ import annotations

import json
import os

import grpc
import pytest
from deviceplugin_support import (
    CORE,
    MEMORY,
    NAMES,
    all_ids,
    annotations,
    make_node,
    place_pod,
    sim_gpus,
    wait_registered,
)
from simkube.waiting import wait_for
from vgpu_plugin.deviceplugin import api_pb2
from vgpu_plugin.deviceplugin.checkpoint import PodDeviceEntry, write_checkpoint
from vgpu_plugin.tokens import TokenMinter, load_or_create_secret

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import PodAllocation, Request
from jupyter_vgpu.core.inventory import NodeInventory


def ready(daemons, peer, gpus, core_v1, **kwargs):
    make_node(core_v1)
    daemon = daemons(gpus, **kwargs)
    wait_registered(peer)
    assert daemon.wait_ready(10)
    return daemon


def test_serves_first_then_registers_both_resources(daemons, peer, gpus, core_v1):
    ready(daemons, peer, gpus, core_v1)
    registered = peer.registered()
    assert set(registered) == {CORE, MEMORY}
    assert registered[CORE].endpoint == "vgpu-core.sock" and registered[MEMORY].endpoint == "vgpu-memory.sock"
    assert all(request.version == "v1beta1" for request, _ in peer.registrations)
    assert all(exists for _, exists in peer.registrations), "the socket must be served before Register"
    assert registered[CORE].options.get_preferred_allocation_available
    options = peer.stub(CORE).GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
    assert options.get_preferred_allocation_available and not options.pre_start_required


def test_list_and_watch_advertises_cores_and_memory_units_with_numa(daemons, peer, gpus, core_v1):
    ready(daemons, peer, gpus, core_v1)
    cores = peer.list_devices(CORE)
    memory = peer.list_devices(MEMORY)
    assert len(cores) == 400 and len(memory) == 4 * 160
    assert {d.health for d in cores + memory} == {"Healthy"}
    assert sorted(d.ID for d in cores) == sorted(all_ids("core"))
    assert sorted(d.ID for d in memory) == sorted(all_ids("memory"))
    numa = {d.ID: d.topology.nodes[0].ID for d in cores}
    assert numa["gpu0-core-00"] == 0 and numa["gpu3-core-99"] == 1


def test_allocate_a_share_as_kubelet_does(daemons, peer, gpus, core_v1, tmp_path):
    daemon = ready(daemons, peer, gpus, core_v1)
    pod = place_pod(core_v1, gpus, "nb", [(Request(25, 16), (2,))])
    uid = pod["metadata"]["uid"]
    uuid2 = gpus.inventory()[2].uuid

    core_ids, core = peer.admit(CORE, 25, all_ids("core"))
    assert {i.split("-")[0] for i in core_ids} == {"gpu2"}, "GetPreferredAllocation steers to the assigned card"
    mem_ids, memory = peer.admit(MEMORY, 16, all_ids("memory"))
    assert {i.split("-")[0] for i in mem_ids} == {"gpu2"}
    assert memory == api_pb2.ContainerAllocateResponse(), "only vcuda-core answers, so the two never conflict"

    env = dict(core.envs)
    assert env[c.ENV_NVIDIA_VISIBLE_DEVICES] == uuid2
    assert env[c.ENV_CORES] == "25" and env[c.ENV_MEMORY_MIB] == str(16 * 256)
    assert env[c.ENV_DEVICE_INDICES] == "2" and env[c.ENV_DEVICE_UUIDS] == uuid2
    assert env[c.ENV_DEVICE_MODEL] == "NVIDIA A100-SXM4-40GB"
    assert (env[c.ENV_NODE], env[c.ENV_POD_NAME], env[c.ENV_POD_NAMESPACE]) == ("node-1", "nb", "default")
    assert (env[c.ENV_POD_UID], env[c.ENV_CONTAINER]) == (uid, "c0")
    assert env[c.ENV_METRICS_URL] == "http://10.0.0.1:5678"
    assert env[c.ENV_ENFORCEMENT] == "hami-core"
    secret = load_or_create_secret(str(tmp_path / "state" / "token-secret"))
    answer_id = TokenMinter(secret).verify(env[c.ENV_TOKEN])
    assert answer_id and uid not in env[c.ENV_TOKEN], "the token names an allocation, not a pod"
    assert env[c.ENV_HAMI_MEMORY_LIMIT_PREFIX + "0"] == "4096m" and env[c.ENV_HAMI_SM_LIMIT] == "25"
    assert env[c.ENV_HAMI_SHARED_CACHE].startswith("/usr/local/vgpu/")
    assert env[c.ENV_XLA_MEM_FRACTION] == "0.100" and env[c.ENV_CUPY_MEMORY_LIMIT] == str(4096 * 1024 * 1024)
    mounts = {m.container_path: m for m in core.mounts}
    assert mounts["/etc/ld.so.preload"].read_only and mounts["/usr/local/vgpu/libvgpu.so"].read_only
    assert not mounts["/usr/local/vgpu/cache"].read_only
    assert mounts["/usr/local/vgpu/cache"].host_path.endswith(f"containers/{answer_id}")
    assert peer.stub(CORE).PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=core_ids),
                                             timeout=5) == api_pb2.PreStartContainerResponse()

    done = wait_for(lambda: annotations(core_v1, "nb").get(NAMES.gpu_assigned) == "true" and annotations(core_v1, "nb"), timeout=20)
    record = PodAllocation.from_json(done[NAMES.allocation])
    assert record.node == "node-1"
    assert [(s.index, s.uuid, s.cores, s.memory_units) for s in record.containers[0].cards] == [(2, uuid2, 25, 16)]
    assert daemon.allocator.usage() == {2: (25, 16)}
    # no other pod could have been admitted: the record names the answer's id (the token works) at once
    assert record.containers[0].allocation_id == answer_id


def test_memory_first_then_cores_give_one_consistent_answer(daemons, peer, gpus, core_v1):
    ready(daemons, peer, gpus, core_v1)
    place_pod(core_v1, gpus, "a", [(Request(30, 8), (1,))])
    place_pod(core_v1, gpus, "b", [(Request(30, 12), (3,))])
    # kubelet iterates a map: for pod a's container the memory Allocate may come first
    mem_ids, memory = peer.admit(MEMORY, 8, all_ids("memory"))
    assert {i.split("-")[0] for i in mem_ids} == {"gpu1"} and memory == api_pb2.ContainerAllocateResponse()
    _, core = peer.admit(CORE, 30, all_ids("core"))
    assert core.envs[c.ENV_DEVICE_INDICES] == "1"
    assert c.ENV_POD_NAME not in core.envs, "b asks for as many cores: the answer cannot be sure whose it is"
    wait_for(lambda: annotations(core_v1, "a").get(NAMES.gpu_assigned) == "true", timeout=20)
    assert annotations(core_v1, "b").get(NAMES.gpu_assigned) == "false"


def test_unmatched_allocate_is_refused_and_changes_nothing(daemons, peer, gpus, core_v1):
    daemon = ready(daemons, peer, gpus, core_v1)
    place_pod(core_v1, gpus, "nb", [(Request(25, 16), (0,))])
    before = annotations(core_v1, "nb")
    with pytest.raises(grpc.RpcError) as caught:
        peer.allocate(CORE, all_ids("core")[:30])
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    message = caught.value.details()
    assert "exactly 30 tencent.com/vcuda-core" in message
    assert "default/nb container 'c0' (25 vcuda-core, 16 vcuda-memory, card 0)" in message
    assert "predicate-node" in message
    assert annotations(core_v1, "nb") == before
    assert daemon.allocator.served() == {}
    # the right request still works afterwards
    _, core = peer.admit(CORE, 25, all_ids("core"))
    assert core.envs[c.ENV_POD_NAME] == "nb"


def test_pod_not_placed_by_the_extender_is_named_in_the_refusal(daemons, peer, gpus, core_v1):
    ready(daemons, peer, gpus, core_v1)
    core_v1.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "stray"},
        "spec": {"nodeName": "node-1", "containers": [
            {"name": "x", "image": "x", "resources": {"limits": {CORE: "50", MEMORY: "10"}}}]}})
    with pytest.raises(grpc.RpcError) as caught:
        peer.allocate(CORE, all_ids("core")[:50])
    assert "default/stray: not placed by the vGPU scheduler extender" in caught.value.details()


def test_xid_makes_the_cards_devices_unhealthy_in_the_next_list(daemons, peer, gpus, core_v1):
    ready(daemons, peer, gpus, core_v1)
    stream = peer.stub(CORE).ListAndWatch(api_pb2.Empty(), timeout=30)
    first = next(stream)
    assert all(d.health == "Healthy" for d in first.devices)
    gpus.inject_xid(1, 43)  # an application error: no change, nothing sent
    gpus.inject_xid(1, 79)
    second = next(stream)
    health = {d.ID: d.health for d in second.devices}
    assert len(health) == 400, "the whole list is re-sent"
    assert {h for i, h in health.items() if i.startswith("gpu1-")} == {"Unhealthy"}
    assert {h for i, h in health.items() if not i.startswith("gpu1-")} == {"Healthy"}
    stream.cancel()
    # the memory resource agrees, and an allocation on that card is refused with the reason
    memory = {d.ID: d.health for d in peer.list_devices(MEMORY)}
    assert memory["gpu1-mem-0000"] == "Unhealthy" and memory["gpu0-mem-0000"] == "Healthy"
    place_pod(core_v1, gpus, "late", [(Request(10, 4), (1,))])
    with pytest.raises(grpc.RpcError) as caught:
        peer.allocate(CORE, [f"gpu1-core-{n:02d}" for n in range(10)])
    assert "card 1 is unhealthy (XID 79 (GPU has fallen off the bus))" in caught.value.details()
    gpus.restore_card(1)
    wait_for(lambda: {d.health for d in peer.list_devices(CORE)} == {"Healthy"}, timeout=20)


def test_identical_requests_go_oldest_placement_first(daemons, peer, gpus, core_v1):
    daemon = ready(daemons, peer, gpus, core_v1)
    place_pod(core_v1, gpus, "newer", [(Request(20, 8), (3,))], predicate_time=2_000)
    place_pod(core_v1, gpus, "older", [(Request(20, 8), (0,))], predicate_time=1_000)
    wait_for(lambda: (daemon.informer.get("default", "older") or {}).get("spec", {}).get("nodeName"), timeout=20)
    ids, first = peer.admit(CORE, 20, all_ids("core"))
    assert first.envs[c.ENV_DEVICE_INDICES] == "0" and {i[:4] for i in ids} == {"gpu0"}
    first_mem, _ = peer.admit(MEMORY, 8, all_ids("memory"))
    second_ids, second = peer.admit(CORE, 20, [i for i in all_ids("core") if i not in ids])
    second_mem, _ = peer.admit(MEMORY, 8, [i for i in all_ids("memory") if i not in first_mem])
    assert second.envs[c.ENV_DEVICE_INDICES] == "3"
    # kubelet may have admitted them in either order, and no checkpoint says which yet: an answer
    # that named a pod might name another user's, so neither does
    for answer in (first, second):
        assert not {c.ENV_POD_NAME, c.ENV_POD_NAMESPACE, c.ENV_POD_UID} & set(answer.envs)
        assert answer.envs[c.ENV_CONTAINER] == "c0" and answer.envs[c.ENV_TOKEN]
    # nor does a record hold either answer's id, so neither token reads anything yet
    for name in ("older", "newer"):
        anns = annotations(core_v1, name)
        assert all(not ctr.allocation_id for ctr in PodAllocation.from_json(anns[NAMES.allocation]).containers)
    # kubelet's checkpoint tells: it admitted "newer" first. Each record then names what its
    # container really got, and the id of the token in it.
    minter = TokenMinter(load_or_create_secret(os.path.join(daemons.state_dir, "token-secret")))
    uids = {name: json.loads(core_v1.read_namespaced_pod(name, "default", _preload_content=False).data)
            ["metadata"]["uid"] for name in ("older", "newer")}
    write_checkpoint(daemon.checkpoint_path, [
        PodDeviceEntry(uids["newer"], "c0", CORE, tuple(sorted(ids)), first.SerializeToString()),
        PodDeviceEntry(uids["newer"], "c0", MEMORY, tuple(sorted(first_mem))),
        PodDeviceEntry(uids["older"], "c0", CORE, tuple(sorted(second_ids)), second.SerializeToString()),
        PodDeviceEntry(uids["older"], "c0", MEMORY, tuple(sorted(second_mem)))], {})
    for name, answer, card in (("newer", first, 0), ("older", second, 3)):
        record = wait_for(lambda name=name: (lambda r: r if r.containers[0].allocation_id else None)(
            PodAllocation.from_json(annotations(core_v1, name)[NAMES.allocation])), timeout=20, what=f"{name} confirmed")
        assert record.containers[0].allocation_id == minter.verify(answer.envs[c.ENV_TOKEN])
        assert [s.index for s in record.containers[0].cards] == [card]


def test_whole_cards_and_several_containers(daemons, peer, gpus, core_v1):
    ready(daemons, peer, gpus, core_v1)
    place_pod(core_v1, gpus, "train", [(Request(200), (2, 3)), (Request(10, 4), (0,))])
    ids, core = peer.admit(CORE, 200, all_ids("core"))
    assert sorted({i[:4] for i in ids}) == ["gpu2", "gpu3"] and len(ids) == 200
    env = core.envs
    uuids = [card.uuid for card in gpus.inventory()]
    assert env[c.ENV_NVIDIA_VISIBLE_DEVICES] == f"{uuids[2]},{uuids[3]}"
    assert env[c.ENV_CORES] == "200" and env[c.ENV_MEMORY_MIB] == str(2 * 40960)
    assert c.ENV_HAMI_SM_LIMIT not in env, "whole cards need no limits"
    _, second = peer.admit(CORE, 10, [i for i in all_ids("core") if i not in ids])
    assert second.envs[c.ENV_CONTAINER] == "c1" and second.envs[c.ENV_DEVICE_INDICES] == "0"
    peer.admit(MEMORY, 4, all_ids("memory"))
    record = PodAllocation.from_json(wait_for(
        lambda: annotations(core_v1, "train").get(NAMES.gpu_assigned) == "true" and annotations(core_v1, "train"), timeout=20)[
        NAMES.allocation])
    assert [[s.index for s in ctr.cards] for ctr in record.containers] == [[2, 3], [0]]


def test_a_card_is_never_overcommitted(daemons, peer, gpus, core_v1):
    ready(daemons, peer, gpus, core_v1)
    place_pod(core_v1, gpus, "first", [(Request(60, 20), (1,))])
    peer.admit(CORE, 60, all_ids("core"))
    # a placement that does not fit (a broken or foreign scheduler) is refused at admission
    place_pod(core_v1, gpus, "second", [(Request(60, 20), (1,))])
    with pytest.raises(grpc.RpcError) as caught:
        peer.allocate(CORE, [f"gpu2-core-{n:02d}" for n in range(60)])
    assert "card 1 cannot take 60 cores" in caught.value.details()


@pytest.mark.parametrize("mode", ["mps", "none"])
def test_other_enforcement_backends(daemons, peer, gpus, core_v1, mode):
    ready(daemons, peer, gpus, core_v1, enforcement=mode)
    place_pod(core_v1, gpus, "nb", [(Request(25, 16), (2,))])
    _, core = peer.admit(CORE, 25, all_ids("core"))
    env = dict(core.envs)
    assert env[c.ENV_ENFORCEMENT] == mode
    assert c.ENV_HAMI_SM_LIMIT not in env and not any(m.container_path == "/etc/ld.so.preload" for m in core.mounts)
    assert env[c.ENV_XLA_MEM_FRACTION] == "0.100"
    if mode == "mps":
        assert env[c.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == "25"
        assert env[c.ENV_MPS_PINNED_MEMORY_LIMIT] == "0=4096M"
        assert [m.container_path for m in core.mounts] == [env[c.ENV_MPS_PIPE_DIRECTORY], "/dev/shm"]
    else:
        assert list(core.mounts) == []


def test_device_specs_and_cdi_when_configured(daemons, peer, gpus, core_v1, tmp_path):
    from vgpu_plugin.deviceplugin.enforcement import EnforcementConfig

    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidia-uvm-tools").write_text("")
    config = EnforcementConfig(mode="none", device_specs=True, cdi=True, dev_root=str(dev))
    ready(daemons, peer, gpus, core_v1, enforcement_config=config)
    place_pod(core_v1, gpus, "nb", [(Request(25, 16), (2,))])
    _, core = peer.admit(CORE, 25, all_ids("core"))
    assert [d.container_path for d in core.devices] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                                                        "/dev/nvidia2"]
    assert all(d.permissions == "rw" for d in core.devices)
    assert [d.name for d in core.cdi_devices] == [f"nvidia.com/gpu={gpus.inventory()[2].uuid}"]


def test_kubelet_restart_means_serve_again_and_register_again(daemons, peer, gpus, core_v1):
    daemon = ready(daemons, peer, gpus, core_v1)
    assert daemon.registrations == 1
    peer.restart()  # kubelet wipes the sockets and serves a new kubelet.sock
    wait_registered(peer, 4)
    assert daemon.wait_ready(10) and daemon.registrations == 2
    assert all(exists for _, exists in peer.registrations[2:])
    assert len(peer.list_devices(CORE)) == 400


def test_node_annotation_published_once_and_on_health_change(daemons, peer, gpus, core_v1):
    daemon = ready(daemons, peer, gpus, core_v1)
    key = NAMES.node_inventory

    def node_meta():
        return json.loads(core_v1.read_node("node-1", _preload_content=False).data)["metadata"]

    text = wait_for(lambda: (node_meta().get("annotations") or {}).get(key), timeout=20)
    inventory = NodeInventory.from_json(text)
    assert [card.uuid for card in inventory.cards] == [card.uuid for card in gpus.inventory()]
    assert inventory.topology.links[0][1] == "NV4" and inventory.problem is None
    assert node_meta()["labels"][NAMES.node_label_gpu] == "true"
    version = node_meta()["resourceVersion"]
    assert daemon.publisher.publish(check_node=True) is False, "unchanged inventory is not rewritten"
    assert node_meta()["resourceVersion"] == version
    gpus.lose_card(0)
    changed = wait_for(lambda: NodeInventory.from_json(node_meta()["annotations"][key]).cards[0].healthy is False, timeout=20)
    assert changed


def test_node_without_a_driver_says_so(daemons, peer, core_v1):
    from jupyter_vgpu.core.topology import parse_nvidia_smi_topo
    from jupyter_vgpu.data import TOPOLOGY_DIR
    from jupyter_vgpu.gpu.simulated import SimulatedGPUs

    topology = parse_nvidia_smi_topo((TOPOLOGY_DIR / "a100-sxm-4gpu-nv4.txt").read_text())
    nodriver = SimulatedGPUs(topology, driver_problem="no NVIDIA driver: simulated node without one")
    ready(daemons, peer, nodriver, core_v1)
    assert peer.list_devices(CORE) == [] and peer.list_devices(MEMORY) == []
    text = wait_for(lambda: (json.loads(core_v1.read_node("node-1", _preload_content=False).data)["metadata"]
                             .get("annotations") or {}).get(NAMES.node_inventory), timeout=20)
    inventory = NodeInventory.from_json(text)
    assert inventory.cards == () and inventory.problem == "no NVIDIA driver: simulated node without one"


def test_metrics_server_runs_in_the_daemon(daemons, peer, core_v1):
    import urllib.request

    gpus = sim_gpus()
    make_node(core_v1)
    scrape_token = "scrape-token-for-the-daemon-test"
    daemon = daemons(gpus, metrics={"address": "127.0.0.1", "port": 0, "scrape_token": scrape_token},
                     metrics_url=None)
    wait_registered(peer)
    request = urllib.request.Request(f"{daemon.metrics_server.scrape_url}/metrics",
                                     headers={"Authorization": f"Bearer {scrape_token}"})
    body = urllib.request.urlopen(request, timeout=10).read().decode()
    assert "vgpu_card_memory_total_bytes" in body
    place_pod(core_v1, gpus, "nb", [(Request(25, 16), (2,))])
    _, core = peer.admit(CORE, 25, all_ids("core"))
    assert core.envs[c.ENV_METRICS_URL] == f"http://127.0.0.1:{daemon.metrics_server.port}"


def test_a_record_that_disagrees_with_the_request_is_not_believed(daemons, peer, gpus, core_v1):
    from jupyter_vgpu.core.contract import CardShare, ContainerAllocation

    daemon = ready(daemons, peer, gpus, core_v1)
    place_pod(core_v1, gpus, "greedy", [(Request(25, 16), (1,))])
    inflated = PodAllocation(node="node-1", assigned_at_ns=1, containers=(
        ContainerAllocation(0, "c0", (CardShare(1, gpus.inventory()[1].uuid, 90, 150),)),))
    core_v1.patch_namespaced_pod("greedy", "default", {"metadata": {"annotations": {
        NAMES.allocation: inflated.to_json()}}})
    def cached_record() -> str | None:
        cached = daemon.informer.get("default", "greedy")  # None until the daemon's watch delivers it
        return ((cached or {}).get("metadata") or {}).get("annotations", {}).get(NAMES.allocation)

    wait_for(lambda: cached_record() is not None  # the daemon's own cache has the inflated record
             and PodAllocation.from_json(cached_record()).containers[0].cores == 90, timeout=20)
    _, core = peer.admit(CORE, 25, all_ids("core"))
    assert core.envs[c.ENV_CORES] == "25" and core.envs[c.ENV_MEMORY_MIB] == str(16 * 256)
    assert core.envs[c.ENV_HAMI_SM_LIMIT] == "25"
