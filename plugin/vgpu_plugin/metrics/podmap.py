"""Who holds which share on this node, and which container a GPU process runs in.

Built from the pod cache (plain dicts as the API server sends them) once per sample: the
allocation of each pod is its claim as ``jupyter_vgpu.core.claims.pod_claim`` reads it
(cards from the ``predicate-gpu-idx-<i>`` keys, amounts from the containers' requests,
UUIDs and allocation ids from the project's record where it agrees). Processes are matched by the pod UID in their
cgroup path and the container ID in ``status.containerStatuses[].containerID``. A read
token is matched by the allocation id the device plugin recorded for the container that
holds it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from jupyter_vgpu.core import claims
from jupyter_vgpu.core.contract import (
    DEFAULT_NAMES,
    MEMORY_UNIT_MIB,
    CardShare,
    ContainerAllocation,
    Names,
    PodAllocation,
)

from .cgroup import CgroupIdentity

log = logging.getLogger(__name__)

# kubelet sets this on a static pod's mirror: the UID the node (and the cgroup path) uses
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


class CardLike(Protocol):
    index: int
    uuid: str
    memory_mib: int


@dataclass(frozen=True)
class PodEntry:
    uid: str
    namespace: str
    name: str
    container_names: tuple[str, ...]
    """``spec.containers`` names, in order (the container index is the position)."""
    allocation: PodAllocation | None
    problem: str | None = None
    """Why the pod's allocation could not be read, for logs; None when fine."""
    container_ids: Mapping[str, int] = field(default_factory=dict)

    def container_name(self, index: int) -> str:
        if 0 <= index < len(self.container_names):
            return self.container_names[index]
        return f"#{index}"


@dataclass(frozen=True)
class Holding:
    """One container's share of one card, with the memory it holds in MiB."""

    pod: PodEntry
    container_index: int
    share: CardShare
    memory_mib: int


def _container_id(status_id: str | None) -> str | None:
    """'containerd://4c01...' -> '4c01...' (the runtime prefix does not appear in cgroups)."""
    if not status_id:
        return None
    return status_id.split("://", 1)[-1] or None


def allocation_of(
    pod: Mapping[str, Any], names: Names, cards: Mapping[int, CardLike]
) -> tuple[PodAllocation | None, str | None]:
    """(allocation, problem) for a pod: its claim, with the card UUIDs and whole cards' memory filled in."""
    claim = claims.pod_claim(pod, names)
    if claim is None or claim.allocation is None:
        return None, claim.problem if claim is not None else None
    # what gpu-admission's keys cannot say: the card's UUID and a whole card's memory
    containers = tuple(
        ContainerAllocation(container.index, container.name, tuple(
            CardShare(share.index, share.uuid or (card.uuid if card else ""), share.cores,
                      claims.held_memory_units(share.cores, share.memory_units,
                                               card.memory_mib // MEMORY_UNIT_MIB if card else None),
                      share.mig_device)
            for share in container.cards for card in [cards.get(share.index)]),
            container.allocation_id)
        for container in claim.allocation.containers)
    return PodAllocation(claim.allocation.node, containers, claim.allocation.assigned_at_ns,
                         claim.allocation.policy), None


def held_memory_mib(share: CardShare, card: CardLike | None) -> int:
    """A whole card holds all its memory; a share holds its units."""
    if card is not None and claims.is_whole_card(share.cores):
        return card.memory_mib  # to the MiB: a card's size need not be a whole number of units
    return share.memory_mib


class PodIndex:
    """The pods on one node, looked up by UID, container ID and allocation id. Immutable once built."""

    def __init__(self, entries: Iterable[PodEntry], cards: Mapping[int, CardLike], mirrors: Mapping[str, str]) -> None:
        self._by_uid: dict[str, PodEntry] = {}
        self._by_container: dict[str, tuple[PodEntry, int]] = {}
        self._by_allocation: dict[str, tuple[PodEntry, int]] = {}
        claimed_twice: set[str] = set()
        for entry in entries:
            self._by_uid[entry.uid] = entry
            for cid, index in entry.container_ids.items():
                self._by_container[cid] = (entry, index)
            for container in entry.allocation.containers if entry.allocation else ():
                if not container.allocation_id:
                    continue
                if container.allocation_id in self._by_allocation:
                    claimed_twice.add(container.allocation_id)
                self._by_allocation[container.allocation_id] = (entry, container.index)
        for allocation_id in claimed_twice:  # records being rewritten: answer no one rather than maybe the wrong one
            del self._by_allocation[allocation_id]
            log.warning("two containers' records claim one allocation id; its token reads nothing until they agree")
        self._mirrors = dict(mirrors)  # cgroup UID of a static pod -> API UID
        self._cards = cards

    @classmethod
    def build(
        cls,
        pods: Iterable[Mapping[str, Any]],
        node: str,
        names: Names = DEFAULT_NAMES,
        cards: Mapping[int, CardLike] | None = None,
    ) -> PodIndex:
        cards = cards or {}
        entries = []
        mirrors: dict[str, str] = {}
        for pod in pods:
            metadata = pod.get("metadata") or {}
            spec = pod.get("spec") or {}
            status = pod.get("status") or {}
            uid = metadata.get("uid")
            if not uid or spec.get("nodeName") != node or claims.is_finished(pod):
                continue
            names_in_order = tuple(str(c.get("name", "")) for c in spec.get("containers") or [])
            position = {name: i for i, name in enumerate(names_in_order)}
            container_ids = {}
            for container_status in status.get("containerStatuses") or []:
                cid = _container_id(container_status.get("containerID"))
                index = position.get(container_status.get("name"))
                if cid and index is not None:
                    container_ids[cid] = index
            allocation, problem = allocation_of(pod, names, cards)
            if problem:
                log.debug("pod %s/%s: %s", metadata.get("namespace"), metadata.get("name"), problem)
            entries.append(
                PodEntry(
                    uid=uid,
                    namespace=str(metadata.get("namespace", "")),
                    name=str(metadata.get("name", "")),
                    container_names=names_in_order,
                    allocation=allocation,
                    problem=problem,
                    container_ids=container_ids,
                )
            )
            mirror = (metadata.get("annotations") or {}).get(MIRROR_ANNOTATION)
            if mirror:
                mirrors[mirror] = uid
        return cls(entries, cards, mirrors)

    def __len__(self) -> int:
        return len(self._by_uid)

    def by_uid(self, uid: str) -> PodEntry | None:
        return self._by_uid.get(uid)

    def by_allocation_id(self, allocation_id: str) -> tuple[PodEntry, int] | None:
        """(pod, container index) whose record holds this allocation id (the subject of its read token)."""
        return self._by_allocation.get(allocation_id)

    def pods(self) -> Iterator[PodEntry]:
        return iter(self._by_uid.values())

    def resolve(self, identity: CgroupIdentity) -> tuple[PodEntry | None, int | None]:
        """(pod, container index) for a process's cgroup identity; either may be None.

        A container ID not (yet) in the pod's status still names the pod; when the pod
        has a single container that is the one.
        """
        if identity.container_id:
            found = self._by_container.get(identity.container_id)
            if found:
                return found
        pod = self._by_uid.get(identity.pod_uid) or self._by_uid.get(self._mirrors.get(identity.pod_uid, ""))
        if pod is None:
            return None, None
        if identity.container_id and len(pod.container_names) == 1:
            return pod, 0
        return pod, None

    def holdings(self) -> Iterator[Holding]:
        """Every (container, card share) held on this node."""
        for pod in self._by_uid.values():
            if pod.allocation is None:
                continue
            for container in pod.allocation.containers:
                for share in container.cards:
                    card = self._cards.get(share.index)
                    yield Holding(pod, container.index, share, held_memory_mib(share, card))
