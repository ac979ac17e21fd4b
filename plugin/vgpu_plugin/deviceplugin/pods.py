"""A pod as the scheduler extender placed it on this node: its vGPU containers and their cards."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from jupyter_vgpu.core import claims
from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import ContainerAllocation, Names, Request, RequestError

from .devices import CORE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Wanted:
    """One container of a pod placed on this node by the extender."""

    uid: str
    namespace: str
    pod: str
    index: int
    container: str
    request: Request
    cards: tuple[int, ...]  # from predicate-gpu-idx-<index>
    predicate_time: int
    record: ContainerAllocation | None  # our allocation annotation, when it agrees with the cards
    mig_device: str = ""  # the MIG slice from mig-slice-<index> ("" off MIG)

    def count(self, kind: str) -> int:
        return self.request.cores if kind == CORE else self.request.memory_units

    def describe(self) -> str:
        memory = f", {self.request.memory_units} vcuda-memory" if self.request.memory_units else ""
        cards = ",".join(map(str, self.cards))
        return f"{self.namespace}/{self.pod} container {self.container!r} ({self.request.cores} vcuda-core{memory}, card {cards})"


@dataclass
class PodView:
    uid: str
    namespace: str
    name: str
    assigned: bool  # gpu-assigned == "true"
    annotations: dict[str, str]
    containers: list[Wanted] = field(default_factory=list)
    problem: str | None = None  # why the pod cannot be served (shown in Allocate refusals)
    policy: str = "binpack"
    # container index -> what it asks, also for a pod with a problem; None: its requests are unreadable
    requests: dict[int, Request] | None = None


def parse_pod(pod: dict[str, Any], node: str, names: Names) -> PodView | None:
    """The pod as the extender placed it, or None when it is not a vGPU pod of this node.

    What it holds is its claim (``core.claims.pod_claim``: cards from the predicate keys,
    amounts from its requests, the record only where it agrees); on top of that the device
    plugin serves only pods placed for this node with a key for every vGPU container.
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = dict(meta.get("annotations") or {})
    if spec.get("nodeName") != node or meta.get("deletionTimestamp"):
        return None
    claim = claims.pod_claim(pod, names)
    if claim is None:  # finished
        return None
    view = PodView(uid=meta.get("uid") or "", namespace=meta.get("namespace") or "default",
                   name=meta.get("name") or "", assigned=annotations.get(names.gpu_assigned) == "true",
                   annotations=annotations)
    try:
        view.requests = c.pod_requests(pod, names)
    except RequestError as error:
        view.problem = str(error)
        return view
    if not claim.requests:
        return None
    if annotations.get(names.predicate_node) != node:
        placed = annotations.get(names.predicate_node)
        view.problem = (f"not placed by the vGPU scheduler extender for this node "
                        f"({names.predicate_node}={placed!r})")
        return view
    try:
        predicate_time = int(annotations.get(names.predicate_time) or 0)
    except ValueError as error:
        view.problem = str(error)
        return view
    if claim.problem is not None:
        view.problem = claim.problem
        return view
    if claim.note:
        log.warning("pod %s/%s: %s", view.namespace, view.name, claim.note)
    if claim.policy is not None:
        view.policy = claim.policy
    containers = spec.get("containers") or []
    keys = c.parse_predicate_indices(annotations, names)  # valid: the claim was read from them
    for index, request in sorted(claim.requests.items()):
        held = claim.allocation.container(index) if claim.allocation is not None else None
        if held is None or index not in keys:
            view.problem = f"no {names.predicate_gpu_idx(index)} annotation for container {index}"
            view.containers = []
            return view
        view.containers.append(Wanted(
            uid=view.uid, namespace=view.namespace, pod=view.name, index=index,
            container=str(containers[index].get("name", index)), request=request,
            cards=keys[index], predicate_time=predicate_time,
            record=held if index in claim.from_record else None,
            mig_device=next((s.mig_device for s in held.cards if s.mig_device), ""),
        ))
    return view
