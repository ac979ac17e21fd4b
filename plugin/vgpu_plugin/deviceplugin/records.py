"""What a pod's annotations should say once its containers are served: the allocation record,
``gpu-assigned``, the ``predicate-gpu-idx-<i>`` and ``mig-slice-<i>`` keys, all true by the ledger."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import ContainerAllocation, Names, PodAllocation

from .allocate import AllocationError, placement
from .pods import PodView, Wanted
from .served import Ledger

if TYPE_CHECKING:
    from jupyter_vgpu.core.inventory import Card


@dataclass(frozen=True)
class Desired:
    uid: str  # the pod they are about: written under this UID only (the name may be a new pod's by then)
    annotations: dict[str, str | None]  # None: remove the key (a merge patch's null)
    unconfirmed: list[str]  # containers marked assigned before kubelet's checkpoint confirmed their answer


def confirmed(ledger: Ledger, wanted: Wanted, now: float, grace: float) -> bool:
    """kubelet's checkpoint said this container holds its answer (its record has the answer's id),
    or it was answered before this process started, or the grace for the checkpoint ran out."""
    served = ledger.served.get((wanted.uid, wanted.index))
    if served is None:
        return False
    return bool(served.allocation.allocation_id) or now - served.answered_at >= grace


def desired_annotations(view: PodView, ledger: Ledger, cards: Mapping[int, Card], *, node: str, names: Names,
                        now: float, grace: float) -> Desired | None:
    """The annotations that make the pod's record true now; None when there is nothing to say."""
    if view.problem or not view.containers:
        return None
    containers: list[ContainerAllocation] = []
    for wanted in view.containers:
        served = ledger.served.get((wanted.uid, wanted.index))
        if served is not None:
            containers.append(served.allocation)
        else:  # not admitted yet: no answer, so no id
            try:
                planned = placement(wanted, ledger.overrides.get((wanted.uid, wanted.index)), cards, node)
            except AllocationError:
                return None
            containers.append(replace(planned, allocation_id=""))
    complete = all(ledger.container_complete(w) for w in view.containers)
    if not complete and not any((w.uid, w.index) in ledger.overrides for w in view.containers):
        return None
    if complete and not view.assigned and not all(confirmed(ledger, w, now, grace) for w in view.containers):
        return None  # gpu-assigned=true once the record is known true (reconcile asks again)
    unconfirmed = [w.container for w in view.containers  # complete: every container is served
                   if complete and not ledger.served[(w.uid, w.index)].allocation.allocation_id]
    record = PodAllocation(node=node, containers=tuple(containers),
                           assigned_at_ns=view.containers[0].predicate_time, policy=view.policy)
    desired: dict[str, str | None] = {names.allocation: record.to_json(),
                                      names.gpu_assigned: "true" if complete else "false"}
    for allocation in containers:
        desired[names.predicate_gpu_idx(allocation.index)] = c.card_ids_env([s.index for s in allocation.cards])
        # every claim reader lets mig-slice-<i> win over the record: after a swap it must move too
        slice_key = names.mig_slice(allocation.index)
        device = next((s.mig_device for s in allocation.cards if s.mig_device), None)
        if device is not None or slice_key in view.annotations:
            desired[slice_key] = device
    if all(view.annotations.get(k) == v for k, v in desired.items()):
        return None
    return Desired(view.uid, desired, unconfirmed)
