"""Reconciliation as a pure plan: ledger + kubelet's checkpoint + pods in, a new ledger out, the
input untouched. No gRPC, no threads: the plan is a function (the wiring is covered over gRPC in
test_dp_protocol.py and test_dp_kubelet.py)."""

from __future__ import annotations

import copy
import json

from vgpu_plugin.deviceplugin.allocate import rivals, settled_pods
from vgpu_plugin.deviceplugin.checkpoint import PodDeviceEntry
from vgpu_plugin.deviceplugin.devices import CORE, MEMORY
from vgpu_plugin.deviceplugin.pods import parse_pod
from vgpu_plugin.deviceplugin.reconcile import (
    ABSENCE_GRACE,
    World,
    gone_pods,
    plan_reconcile,
    plan_restore,
)
from vgpu_plugin.deviceplugin.served import Ledger, Served

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import CardShare, ContainerAllocation, PodAllocation, Request
from jupyter_vgpu.core.inventory import Card

NAMES = c.DEFAULT_NAMES
CARDS = {i: Card(index=i, uuid=f"GPU-{i}", model="T", memory_mib=16384) for i in range(4)}
REQUEST = Request(20, 8)


def pod(name: str, card: int, *, assigned: bool = False, time_ns: int = 1) -> dict:
    record = PodAllocation(node="n1", containers=(
        ContainerAllocation(0, "c0", (CardShare(card, f"GPU-{card}", REQUEST.cores, REQUEST.memory_units),)),),
        assigned_at_ns=time_ns)
    annotations = c.predicate_annotations(record, NAMES)
    if assigned:
        annotations[NAMES.gpu_assigned] = "true"
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "resourceVersion": "1",
                         "annotations": annotations},
            "spec": {"nodeName": "n1", "containers": [
                {"name": "c0", "resources": {"limits": c.request_limits(REQUEST, NAMES)}}]},
            "status": {"phase": "Pending"}}


def world(*pods: dict, now: float = 100.0) -> World:
    views = [v for v in (parse_pod(p, "n1", NAMES) for p in pods) if v is not None]
    # answers are JSON here, tokens "token-<id>": the plan takes both readers as arguments
    return World(node="n1", names=NAMES, views=views, cards=CARDS,
                 verify=lambda token: token[len("token-"):] if token and token.startswith("token-") else None,
                 answer_env=lambda raw: json.loads(raw) if raw else {}, now=now)


def answer(card: int, uid: str = "", allocation_id: str = "") -> bytes:
    env = {c.ENV_DEVICE_INDICES: str(card), c.ENV_DEVICE_UUIDS: f"GPU-{card}", c.ENV_CORES: "20",
           c.ENV_MEMORY_MIB: str(8 * c.MEMORY_UNIT_MIB), c.ENV_CONTAINER: "c0", c.ENV_TOKEN: f"token-{allocation_id}"}
    if uid:
        env[c.ENV_POD_UID] = uid
    return json.dumps(env).encode()


def served(name: str, card: int, core_ids: tuple[str, ...], *, guessed: bool = True) -> Served:
    allocation = ContainerAllocation(0, "c0", (CardShare(card, f"GPU-{card}", 20, 8),))
    return Served(key=(f"uid-{name}", 0), namespace="default", pod=name, container="c0", allocation=allocation,
                  devices={CORE: core_ids}, identity_uid=f"uid-{name}", since=0.0, guessed=guessed)


def test_an_answer_kubelet_gave_to_the_other_pod_moves_the_records_and_leaves_the_input_alone():
    older, newer = pod("older", 0, time_ns=1), pod("newer", 3, time_ns=2)
    ids = ("gpu0-core-00", "gpu0-core-01")
    before = Ledger(served={("uid-older", 0): served("older", 0, ids)})
    before.given[ids] = (before.served[("uid-older", 0)].allocation, ("uid-older", 0))
    snapshot = copy.deepcopy(before)
    # kubelet's checkpoint: "newer" holds the IDs and the answer prepared for "older" (id a1)
    entries = [PodDeviceEntry("uid-newer", "c0", NAMES.core_resource, ids, answer(0, allocation_id="a1"))]

    plan = plan_reconcile(before, entries, world(older, newer), gone=set())

    assert before == snapshot, "the plan changed its input"
    moved = plan.ledger.served[("uid-newer", 0)]
    assert [s.index for s in moved.allocation.cards] == [0] and moved.allocation.allocation_id == "a1"
    assert not moved.guessed and moved.devices[CORE] == ids
    assert ("uid-older", 0) not in plan.ledger.served  # it was never admitted with those IDs
    assert [s.index for s in plan.ledger.overrides[("uid-older", 0)].cards] == [3]  # it takes newer's placement
    assert plan.dirty == {("default", "older"), ("default", "newer")}
    assert any("answer prepared for pod UID uid-older" in text for _, text in plan.notes)


def test_a_confirmed_answer_gets_its_id_and_nothing_else_moves():
    ids = ("gpu0-core-00",)
    before = Ledger(served={("uid-a", 0): served("a", 0, ids)})
    entries = [PodDeviceEntry("uid-a", "c0", NAMES.core_resource, ids, answer(0, allocation_id="a7"))]
    plan = plan_reconcile(before, entries, world(pod("a", 0)), gone=set())
    assert plan.ledger.served[("uid-a", 0)].allocation.allocation_id == "a7"
    assert before.served[("uid-a", 0)].allocation.allocation_id == ""
    assert plan.dirty == {("default", "a")} and not plan.ledger.overrides


def test_gone_pods_release_what_they_held():
    before = Ledger(served={("uid-a", 0): served("a", 0, ("gpu0-core-00",)),
                            ("uid-b", 0): served("b", 1, ("gpu1-core-00",))})
    # "a" was deleted; "b" has been missing from the cache longer than the grace
    assert gone_pods(before, {"uid-a"}, {"uid-a"}, now=ABSENCE_GRACE - 1) == {"uid-a"}
    gone = gone_pods(before, {"uid-a"}, set(), now=ABSENCE_GRACE + 1)
    assert gone == {"uid-a", "uid-b"}
    plan = plan_reconcile(before, [], world(), gone=gone)
    assert plan.ledger.usage() == {} and before.usage() == {0: (20, 8), 1: (20, 8)}


def test_restore_counts_assigned_pods_as_served_and_takes_the_checkpoint_first():
    ids = ("gpu2-core-00",)
    entries = [PodDeviceEntry("uid-b", "c0", NAMES.core_resource, ids, answer(2, uid="uid-b", allocation_id="b1")),
               PodDeviceEntry("uid-b", "c0", NAMES.memory_resource, ("gpu2-mem-0000",))]
    plan = plan_restore(entries, world(pod("a", 0, assigned=True), pod("b", 2), pod("c", 1)))
    assert plan.ledger.usage() == {0: (20, 8), 2: (20, 8)}  # "c" waits: not served
    assert plan.ledger.served[("uid-b", 0)].allocation.allocation_id == "b1"
    assert plan.ledger.served[("uid-a", 0)].devices == {CORE: (), MEMORY: ()}


def test_a_pod_marked_assigned_but_never_served_is_a_rival():
    forged, waiting = pod("forged", 1, assigned=True), pod("waiting", 0)
    views = world(forged, waiting).views
    ledger = Ledger()
    assert settled_pods(views, ledger, running=set()) == set()
    assert sorted(rivals(ledger, 20, views, settled=set())) == [("uid-forged", 0), ("uid-waiting", 0)]
    # once kubelet runs it (a status only kubelet writes), or the ledger holds it, it is settled
    assert settled_pods(views, ledger, running={"uid-forged"}) == {"uid-forged"}
    held = Ledger(served={("uid-forged", 0): served("forged", 1, ("gpu1-core-00",))})
    held.served[("uid-forged", 0)].devices[MEMORY] = ("gpu1-mem-0000",)
    assert settled_pods(views, held, running=set()) == {"uid-forged"}


def test_restore_with_kubelets_whole_record_does_not_take_a_forged_assigned_pod_for_served():
    ids = ("gpu2-core-00",)
    entries = [PodDeviceEntry("uid-b", "c0", NAMES.core_resource, ids, answer(2, uid="uid-b", allocation_id="b1"))]
    pods = (pod("forged", 0, assigned=True), pod("b", 2, assigned=True), pod("running", 1, assigned=True))
    plan = plan_restore(entries, world(*pods), checkpoint_complete=True, running={"uid-running"})
    assert ("uid-forged", 0) not in plan.ledger.served
    assert plan.ledger.usage() == {1: (20, 8), 2: (20, 8)}  # kubelet runs "running": it holds its share
    assert any("forged" in text and "not admitted" in text for _, text in plan.notes)
