"""A pod as the scheduler extender placed it on this node: its vGPU containers and their cards."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import (
    ContainerAllocation,
    Names,
    PodAllocation,
    Request,
    RequestError,
)

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


def parse_pod(pod: dict[str, Any], node: str, names: Names) -> PodView | None:
    """The pod as the extender placed it, or None when it is not a vGPU pod of this node."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = dict(meta.get("annotations") or {})
    if spec.get("nodeName") != node or meta.get("deletionTimestamp"):
        return None
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    view = PodView(uid=meta.get("uid") or "", namespace=meta.get("namespace") or "default",
                   name=meta.get("name") or "", assigned=annotations.get(names.gpu_assigned) == "true",
                   annotations=annotations)
    try:
        requests = c.pod_requests(pod, names)
    except RequestError as error:
        view.problem = str(error)
        return view
    if not requests:
        return None
    if annotations.get(names.predicate_node) != node:
        placed = annotations.get(names.predicate_node)
        view.problem = (f"not placed by the vGPU scheduler extender for this node "
                        f"({names.predicate_node}={placed!r})")
        return view
    try:
        indices = c.parse_predicate_indices(annotations, names)
        predicate_time = int(annotations.get(names.predicate_time) or 0)
    except ValueError as error:
        view.problem = str(error)
        return view
    record = None
    if names.allocation in annotations:
        try:
            record = PodAllocation.from_json(annotations[names.allocation])
            view.policy = record.policy
        except ValueError as error:
            log.warning("pod %s/%s: ignoring its %s annotation: %s", view.namespace, view.name,
                        names.allocation, error)
    containers = spec.get("containers") or []
    for index, request in sorted(requests.items()):
        cards = indices.get(index)
        if not cards:
            view.problem = f"no {names.predicate_gpu_idx(index)} annotation for container {index}"
            view.containers = []
            return view
        mine = record.container(index) if record else None
        if mine is not None and (sorted(s.index for s in mine.cards) != sorted(cards) or not _agrees(mine, request)):
            mine = None  # the gpu-admission keys and the container's own request win
        view.containers.append(Wanted(
            uid=view.uid, namespace=view.namespace, pod=view.name, index=index,
            container=str(containers[index].get("name", index)), request=request, cards=tuple(cards),
            predicate_time=predicate_time, record=mine,
        ))
    return view


def _agrees(record: ContainerAllocation, request: Request) -> bool:
    """The record gives exactly what the container asks for (kubelet counted the request, not the record)."""
    if request.is_share:
        return len(record.cards) == 1 and record.cores == request.cores and record.memory_units == request.memory_units
    return len(record.cards) == request.cards and all(s.cores == c.CORES_PER_CARD for s in record.cards)
