"""The device plugin against hostile or broken input, as kubelet and a tenant reach it: real gRPC
on unix sockets, pods in the simulated API through the official client, readiness over HTTP.

- A pod created with ``gpu-assigned: "true"`` (and the extender's keys copied) steals no
  waiting pod's Allocate, identity or read token (issue 12, item 2c).
- A garbled kubelet checkpoint never keeps the daemon from registering, and the readiness
  probe says whether it is registered (issue 12, item 6).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import grpc
import pytest
from deviceplugin_support import (
    CORE,
    MEMORY,
    NAMES,
    KubeletPeer,
    all_ids,
    annotations,
    make_node,
    place_pod,
    read_pod,
    serve_pod,
    wait_registered,
)
from simkube.waiting import wait_for
from vgpu_plugin.deviceplugin.checkpoint import PodDeviceEntry, write_checkpoint
from vgpu_plugin.tokens import TokenMinter, load_or_create_secret

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import (
    CardShare,
    ContainerAllocation,
    PodAllocation,
    Request,
    predicate_annotations,
    request_limits,
)

POD_ENV = {c.ENV_POD_NAME, c.ENV_POD_NAMESPACE, c.ENV_POD_UID}


def create_forged_pod(core_v1, name: str, request: Request, card: int, predicate_time: int) -> dict:
    """What a tenant can do without the scheduler: bind the pod by ``nodeName`` and write every
    annotation the stack writes, ``gpu-assigned: "true"`` included."""
    record = PodAllocation(node="node-1", containers=(
        ContainerAllocation(0, "c0", (CardShare(card, "", request.cores, request.memory_units),)),),
        assigned_at_ns=predicate_time)
    forged = {**predicate_annotations(record, NAMES), NAMES.gpu_assigned: "true"}
    core_v1.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": forged},
        "spec": {"nodeName": "node-1", "containers": [{
            "name": "c0", "image": "jupyter/base-notebook",
            "resources": {"limits": request_limits(request, NAMES)}}]}}, _preload_content=False)
    return read_pod(core_v1, name)


def test_a_pod_forged_as_assigned_steals_no_allocate_identity_or_token(daemons, peer, gpus, core_v1):
    make_node(core_v1)
    daemon = daemons(gpus)
    wait_registered(peer)
    victim = place_pod(core_v1, gpus, "victim", [(Request(30, 10), (0,))], predicate_time=1_000)
    thief = create_forged_pod(core_v1, "thief", Request(30, 10), card=1, predicate_time=2_000)
    wait_for(lambda: daemon.informer.get("default", "thief") and daemon.informer.get("default", "victim"), timeout=20)

    # kubelet admits the forged pod first: two containers wait for 30 cores, so the answer is a
    # guess and names nobody
    thief_ids, stolen = peer.admit(CORE, 30, all_ids("core"))
    thief_mem, _ = peer.admit(MEMORY, 10, all_ids("memory"))
    assert not POD_ENV & set(stolen.envs), "the forged pod's answer names the waiting pod"
    assert victim["metadata"]["uid"] not in stolen.envs.values()

    # the waiting pod is still admitted (it is not refused as "already served")
    victim_ids, answer = peer.admit(CORE, 30, [i for i in all_ids("core") if i not in thief_ids])
    victim_mem, _ = peer.admit(MEMORY, 10, [i for i in all_ids("memory") if i not in thief_mem])

    # kubelet's checkpoint says who holds which answer; each record then holds the id of the
    # token its own container got, so the forged pod's token never reads the victim's allocation
    minter = TokenMinter(load_or_create_secret(os.path.join(daemons.state_dir, "token-secret")))
    write_checkpoint(daemon.checkpoint_path, [
        PodDeviceEntry(thief["metadata"]["uid"], "c0", CORE, tuple(sorted(thief_ids)), stolen.SerializeToString()),
        PodDeviceEntry(thief["metadata"]["uid"], "c0", MEMORY, tuple(sorted(thief_mem))),
        PodDeviceEntry(victim["metadata"]["uid"], "c0", CORE, tuple(sorted(victim_ids)), answer.SerializeToString()),
        PodDeviceEntry(victim["metadata"]["uid"], "c0", MEMORY, tuple(sorted(victim_mem)))], {})

    def victim_confirmed():
        anns = annotations(core_v1, "victim")
        if anns.get(NAMES.gpu_assigned) != "true":
            return None
        record = PodAllocation.from_json(anns[NAMES.allocation])
        return record if record.containers[0].allocation_id else None

    record = wait_for(victim_confirmed, what="the victim's record confirmed", timeout=20)
    assert record.containers[0].allocation_id == minter.verify(answer.envs[c.ENV_TOKEN])
    assert record.containers[0].allocation_id != minter.verify(stolen.envs[c.ENV_TOKEN])
    # the victim's record names the cards its container really runs on
    assert [s.index for s in record.containers[0].cards] == [int(answer.envs[c.ENV_DEVICE_INDICES])]


def test_a_forged_assigned_pod_is_not_taken_for_served_when_the_daemon_restarts(daemons, peer, gpus, core_v1):
    """After a restart the annotations stand in for what kubelet's checkpoint lacks, but a pod marked
    assigned that the checkpoint does not hold (and kubelet does not run) was never admitted."""
    make_node(core_v1)
    first = daemons(gpus)
    wait_registered(peer)
    served = place_pod(core_v1, gpus, "served", [(Request(50, 20), (2,))])
    core_ids, core = peer.admit(CORE, 50, all_ids("core"))
    mem_ids, _ = peer.admit(MEMORY, 20, all_ids("memory"))
    write_checkpoint(first.checkpoint_path, [
        PodDeviceEntry(served["metadata"]["uid"], "c0", CORE, tuple(sorted(core_ids)), core.SerializeToString()),
        PodDeviceEntry(served["metadata"]["uid"], "c0", MEMORY, tuple(sorted(mem_ids)))], {})
    wait_for(lambda: annotations(core_v1, "served").get(NAMES.gpu_assigned) == "true", timeout=20)
    first.stop()
    place_pod(core_v1, gpus, "victim", [(Request(30, 10), (0,))], predicate_time=1_000)
    create_forged_pod(core_v1, "thief", Request(30, 10), card=1, predicate_time=2_000)

    second = daemons(gpus)
    wait_registered(peer, 4)
    assert second.wait_ready(10)
    assert second.allocator.usage() == {2: (50, 20)}  # the forged pod holds nothing
    _, stolen = peer.admit(CORE, 30, [i for i in all_ids("core") if i not in core_ids])
    assert not POD_ENV & set(stolen.envs), "the forged pod's answer names the waiting pod"


def test_a_forged_assigned_pod_with_unreadable_requests_is_a_rival_too(daemons, peer, gpus, core_v1):
    """Its requests cannot be read, so it could be the pod kubelet admits with any count: Allocate
    refuses rather than guess (issue 32), naming it, and admits the waiting pod once it is gone."""
    make_node(core_v1)
    daemon = daemons(gpus)
    wait_registered(peer)
    place_pod(core_v1, gpus, "victim", [(Request(30, 10), (0,))])
    core_v1.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "odd", "annotations": {NAMES.gpu_assigned: "true"}},
        "spec": {"nodeName": "node-1", "containers": [{
            "name": "c0", "image": "jupyter/base-notebook",
            "resources": {"limits": {NAMES.core_resource: "30", NAMES.memory_resource: "not-a-number"}}}]}},
        _preload_content=False)
    wait_for(lambda: daemon.informer.get("default", "odd") and daemon.informer.get("default", "victim"), timeout=20)
    refused_naming(peer, CORE, 30, "default/odd")
    core_v1.delete_namespaced_pod("odd", "default", grace_period_seconds=0)
    wait_for(lambda: daemon.informer.get("default", "odd") is None, timeout=20, what="odd gone from the informer")
    _, answer = peer.admit(CORE, 30, all_ids("core"))
    assert answer.envs[c.ENV_POD_NAME] == "victim"


def refused_naming(peer, kind: str, count: int, pod: str) -> None:
    """kubelet's Allocate of ``count`` devices is refused (FAILED_PRECONDITION) naming ``pod``."""
    with pytest.raises(grpc.RpcError) as caught:
        peer.admit(kind, count, all_ids("core" if kind == CORE else "memory"))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "refusing to guess" in caught.value.details() and pod in caught.value.details(), caught.value.details()


def create_bypass_pod(core_v1, name: str, limits: dict, **spec) -> dict:
    """What a tenant who can create pods does without the scheduler (issue 32): bind the pod by
    ``nodeName`` asking for vGPU, with none of the extender's keys."""
    core_v1.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": "node-1", **spec, "containers": [{
            "name": "c0", "image": "jupyter/base-notebook", "resources": {"limits": limits}}]}},
        _preload_content=False)
    return read_pod(core_v1, name)


def test_a_pod_bound_past_the_extender_gets_no_waiting_pods_card_limits_or_token(daemons, peer, gpus, core_v1):
    """A pod bound by ``nodeName`` asking for as many vcuda-core (or vcuda-memory) as a waiting pod
    could be the one kubelet admits: Allocate refuses, naming it, rather than hand it the waiting
    pod's card, limits and token; a bypass pod asking other counts stops nobody, and once it is
    gone the waiting pod is admitted with an answer naming it."""
    make_node(core_v1)
    daemon = daemons(gpus)
    wait_registered(peer)
    place_pod(core_v1, gpus, "victim", [(Request(30, 10), (0,))], predicate_time=1_000)
    create_bypass_pod(core_v1, "bypass", request_limits(Request(30, 10), NAMES))
    create_bypass_pod(core_v1, "elsewhere", request_limits(Request(50, 20), NAMES))
    wait_for(lambda: all(daemon.informer.get("default", n) for n in ("victim", "bypass", "elsewhere")), timeout=20)

    refused_naming(peer, CORE, 30, "default/bypass")
    refused_naming(peer, MEMORY, 10, "default/bypass")
    assert daemon.allocator.served() == {}

    core_v1.delete_namespaced_pod("bypass", "default", grace_period_seconds=0)
    wait_for(lambda: daemon.informer.get("default", "bypass") is None, timeout=20, what="bypass gone from the informer")
    _, answer = peer.admit(CORE, 30, all_ids("core"))
    peer.admit(MEMORY, 10, all_ids("memory"))
    assert answer.envs[c.ENV_POD_NAME] == "victim" and answer.envs[c.ENV_DEVICE_INDICES] == "0"


def test_a_bypass_pod_the_cache_has_not_seen_is_refused_from_the_fresh_list(daemons, peer, gpus, core_v1):
    """A bypass pod bound just before kubelet's Allocate, missing from the daemon's informer: the
    LIST made before a vcuda-core answer names a pod shows it, and the answer is refused."""
    make_node(core_v1)
    daemon = daemons(gpus)
    wait_registered(peer)
    place_pod(core_v1, gpus, "victim", [(Request(30, 10), (0,))], predicate_time=1_000)
    wait_for(lambda: daemon.informer.get("default", "victim"), timeout=20)
    daemon.informer.stop()  # the watch lags: whatever is bound now, the cache does not see
    create_bypass_pod(core_v1, "unseen", request_limits(Request(30, 10), NAMES))
    assert daemon.informer.get("default", "unseen") is None
    refused_naming(peer, CORE, 30, "default/unseen")



def test_a_record_nested_past_the_json_readers_depth_stops_nothing(daemons, peer, gpus, core_v1):
    """A tenant who can create pods binds one here whose allocation annotation is 5,000 open
    brackets: every reader of it (Allocate, the annotator, restore after a restart) takes it for a
    pod with an unreadable record, and the waiting pod is still admitted and confirmed."""
    make_node(core_v1)
    first = daemons(gpus)
    wait_registered(peer)
    core_v1.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "deep", "annotations": {NAMES.allocation: "[" * 5000}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c0", "image": "jupyter/base-notebook"}]}},
        _preload_content=False)
    victim = place_pod(core_v1, gpus, "victim", [(Request(30, 10), (0,))])
    wait_for(lambda: first.informer.get("default", "deep") and first.informer.get("default", "victim"), timeout=20)
    core_ids, answer = peer.admit(CORE, 30, all_ids("core"))
    mem_ids, _ = peer.admit(MEMORY, 10, all_ids("memory"))
    assert answer.envs[c.ENV_DEVICE_INDICES] == "0"
    write_checkpoint(first.checkpoint_path, [
        PodDeviceEntry(victim["metadata"]["uid"], "c0", CORE, tuple(sorted(core_ids)), answer.SerializeToString()),
        PodDeviceEntry(victim["metadata"]["uid"], "c0", MEMORY, tuple(sorted(mem_ids)))], {})
    wait_for(lambda: annotations(core_v1, "victim").get(NAMES.gpu_assigned) == "true", timeout=20,
             what="the victim confirmed by the annotator")

    first.stop()  # a restart restores from the checkpoint with the deep pod still listed
    second = daemons(gpus)
    wait_registered(peer, 4)
    assert second.wait_ready(10)
    assert second.allocator.usage() == {0: (30, 10)}


GARBLED = {
    "numa map of a number": lambda entry: entry.update(DeviceIDs={"0": 5}),
    "AllocResp a number": lambda entry: entry.update(AllocResp=5),
    "PodUID a list": lambda entry: entry.update(PodUID=["x"]),
    "device IDs of numbers": lambda entry: entry.update(DeviceIDs=[1, 2]),
}


def garbled_checkpoint(path: str, uid: str, how) -> None:
    entry = {"PodUID": uid, "ContainerName": "c0", "ResourceName": CORE,
             "DeviceIDs": {"0": ["gpu0-core-00"]}, "AllocResp": ""}
    how(entry)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"Data": {"PodDeviceEntries": [entry], "RegisteredDevices": {}}, "Checksum": 1}, handle)


def readyz(daemon) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(daemon.metrics_server.url + "/readyz", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize("how", list(GARBLED.values()), ids=list(GARBLED))
def test_a_garbled_checkpoint_never_keeps_the_daemon_from_registering(daemons, peer, gpus, core_v1, how):
    make_node(core_v1)
    first = daemons(gpus)
    wait_registered(peer)
    serve_pod(core_v1, gpus, peer)
    first.stop()
    garbled_checkpoint(first.checkpoint_path, read_pod(core_v1, "a")["metadata"]["uid"], how)

    second = daemons(gpus, metrics={"address": "127.0.0.1", "port": 0}, metrics_url=None)
    wait_registered(peer, 4)
    assert second.wait_ready(10)
    assert readyz(second) == (200, {"ready": True, "reason": ""})
    # the annotations stood in for the unreadable checkpoint: card 0 is still taken
    assert second.allocator.usage() == {0: (70, 20)}
    place_pod(core_v1, gpus, "b", [(Request(30, 8), (0,))])
    _, answer = peer.admit(CORE, 30, all_ids("core"))
    assert answer.envs[c.ENV_POD_NAME] == "b"


def test_readiness_follows_registration_with_kubelet(daemons, plugin_dir, gpus, core_v1):
    make_node(core_v1)
    daemon = daemons(gpus, metrics={"address": "127.0.0.1", "port": 0}, metrics_url=None)
    status, body = readyz(daemon)  # no kubelet yet
    assert status == 503 and not body["ready"] and "kubelet" in body["reason"]
    kubelet = KubeletPeer(plugin_dir).start()
    try:
        wait_registered(kubelet)
        assert daemon.wait_ready(10)
        assert readyz(daemon)[0] == 200
        kubelet.stop()  # kubelet went away: its socket is gone
        wait_for(lambda: readyz(daemon)[0] == 503, what="not ready without kubelet", timeout=20)
        kubelet.start()
        wait_for(lambda: readyz(daemon)[0] == 200, what="ready again once registered", timeout=20)
    finally:
        kubelet.stop()


def test_a_failing_restore_is_retried_and_registration_waits_for_it(daemons, peer, gpus, core_v1, monkeypatch):
    """Fault injection: the first rebuild of the ledger raises (as a bug would). The daemon logs it,
    stays unready and unregistered (no Allocate without the ledger), retries, then registers."""
    from vgpu_plugin.deviceplugin.allocator import Allocator

    real_restore = Allocator.restore
    attempts = []

    def flaky_restore(self, entries, **kwargs):
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("injected failure")
        return real_restore(self, entries, **kwargs)

    monkeypatch.setattr(Allocator, "restore", flaky_restore)
    make_node(core_v1)
    place_pod(core_v1, gpus, "a", [(Request(70, 20), (0,))])
    daemon = daemons(gpus, metrics={"address": "127.0.0.1", "port": 0}, metrics_url=None)
    wait_registered(peer)
    assert daemon.wait_ready(10)
    assert len(attempts) == 2 and daemon.registrations == 1
    assert readyz(daemon)[0] == 200
