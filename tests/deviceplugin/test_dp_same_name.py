"""A pod replaced by a new pod of the same name (a JupyterHub user restarting their server:
KubeSpawner names it ``jupyter-<user>`` again) while the node daemon's view still holds the old
one: the daemon over gRPC with the kubelet stand-in, the simulated API through the official client."""

from __future__ import annotations

import json
import logging
import os

from deviceplugin_support import (
    CORE,
    MEMORY,
    NAMES,
    all_ids,
    annotations,
    make_node,
    place_pod,
    read_pod,
    wait_registered,
)
from simkube.waiting import wait_for
from vgpu_plugin.deviceplugin.checkpoint import PodDeviceEntry, write_checkpoint

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import PodAllocation, Request

POD = "jupyter-alice"


def _patches(kube, since: int) -> list[dict]:
    """The bodies of the PATCHes of the pod the API server has received since request ``since``."""
    return [json.loads(r.body) for r in list(kube.emulator)[since:]
            if str(getattr(r.method, "value", r.method)) == "PATCH"
            and r.url.path == f"/api/v1/namespaces/default/pods/{POD}"]


def test_a_record_worked_out_for_a_replaced_pod_never_lands_on_the_new_pod_of_its_name(daemons, peer, gpus, core_v1,
                                                                                        kube, plugin_dir, caplog):
    caplog.set_level(logging.DEBUG, logger="vgpu_plugin.deviceplugin.daemon")
    make_node(core_v1)
    daemon = daemons(gpus, confirm_grace=3600)  # gpu-assigned waits for kubelet's checkpoint
    wait_registered(peer)
    assert daemon.wait_ready(10)
    # alice's server, and bob's of the same size: kubelet names no pod, so which of the two it is
    # admitting stays a guess until its checkpoint says (and nothing is written until then)
    old = place_pod(core_v1, gpus, POD, [(Request(30, 12), (0,))], predicate_time=1_000)
    place_pod(core_v1, gpus, "jupyter-bob", [(Request(30, 12), (1,))], predicate_time=2_000)
    for name in (POD, "jupyter-bob"):
        wait_for(lambda name=name: (daemon.informer.get("default", name) or {}).get("spec", {}).get("nodeName"),
                 timeout=20, what=f"{name} in the daemon's cache")
    core_ids, core = peer.admit(CORE, 30, all_ids("core"))
    memory_ids, memory = peer.admit(MEMORY, 12, all_ids("memory"))
    assert core.envs[c.ENV_DEVICE_INDICES] == "0" and c.ENV_POD_UID not in core.envs  # a guess: it names no pod
    assert annotations(core_v1, POD)[NAMES.gpu_assigned] == "false"  # as the extender wrote it

    # the daemon's view stops here: it holds the old pod from now on. alice stops her server and
    # starts it again: a new pod of the same name, placed on card 2, not admitted by kubelet
    daemon.informer.stop()
    core_v1.delete_namespaced_pod(POD, "default", grace_period_seconds=0)
    new = place_pod(core_v1, gpus, POD, [(Request(40, 16), (2,))], predicate_time=3_000)
    old_uid, new_uid = old["metadata"]["uid"], new["metadata"]["uid"]
    assert new_uid != old_uid
    since = len(list(kube.emulator))

    # kubelet's checkpoint says the old pod holds the answer: the daemon confirms it and writes the
    # old pod's record, gpu-assigned=true, by the pod's name
    write_checkpoint(os.path.join(plugin_dir, "kubelet_internal_checkpoint"), [
        PodDeviceEntry(old_uid, "c0", CORE, tuple(sorted(core_ids)), core.SerializeToString()),
        PodDeviceEntry(old_uid, "c0", MEMORY, tuple(sorted(memory_ids)), memory.SerializeToString()),
    ], {CORE: all_ids("core"), MEMORY: all_ids("memory")})
    wait_for(lambda: _patches(kube, since), timeout=20, what="the old pod's annotations sent")
    # read after the PATCH was served (one event loop serves both, in order)
    now = read_pod(core_v1, POD)
    assert now["metadata"]["uid"] == new_uid
    kept = now["metadata"]["annotations"]
    assert kept[NAMES.gpu_assigned] == "false", "the new pod, never admitted, is marked served"
    assert kept[NAMES.allocation] == new["metadata"]["annotations"][NAMES.allocation], "the old pod's record is on it"
    assert kept[NAMES.predicate_gpu_idx(0)] == "2", "the old pod's card is on the new pod"
    assert kept == new["metadata"]["annotations"]  # as the extender placed it, nothing else
    # reconciliation keeps asking for the old pod (the view still holds it, served and not marked):
    # it is not written again
    wait_for(lambda: any(f"(UID {old_uid}) is gone or replaced: not written again" in r.getMessage()
                         for r in list(caplog.records)), timeout=20, what="the old pod asked for again")

    # kubelet admits the new pod: it is marked served with its own record
    peer.admit(CORE, 40, all_ids("core"))
    peer.admit(MEMORY, 16, all_ids("memory"))
    wait_for(lambda: annotations(core_v1, POD).get(NAMES.gpu_assigned) == "true", timeout=20,
             what="the new pod marked served")
    served = annotations(core_v1, POD)
    record = PodAllocation.from_json(served[NAMES.allocation])
    assert [(s.index, s.cores, s.memory_units) for s in record.containers[0].cards] == [(2, 40, 16)]
    assert record.containers[0].allocation_id and served[NAMES.predicate_gpu_idx(0)] == "2"
    assert read_pod(core_v1, POD)["metadata"]["uid"] == new_uid
    # each write named its pod; the refused one was not tried again for the old pod
    sent = [body["metadata"].get("uid") for body in _patches(kube, since)]
    assert sent.count(old_uid) == 1 and set(sent) == {old_uid, new_uid}
