"""Waiting, made visible: the pending vGPU pods in order, why each waits, and what would start now.

Pure functions over pod dicts and each node's free cards (``Ledger`` ``NodeEntry.free()``),
so the order and the words are tested without a cluster, and the extender's ``GET /queue``
is one pass over its caches:

- order: priority (``spec.priority``, higher first), then age (``creationTimestamp``,
  older first), then namespace/name — what kube-scheduler's default queue sort does, and
  a total order, so every reader computes the same positions;
- why: in the extender's words, for the whole cluster ("no card on any node has 50
  cores and 20 GiB free");
- alternative: the largest share no larger than the request that fits now, and on how
  many nodes ("a 25 % share with 8 GiB fits on 3 nodes").
"""

from __future__ import annotations

import datetime
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jupyter_vgpu.core.claims import FreeCard, fits_alone, is_finished
from jupyter_vgpu.core.contract import (
    CORES_PER_CARD,
    MEMORY_UNIT_MIB,
    Names,
    Request,
    RequestError,
    format_mib,
    pod_requests,
)


@dataclass(frozen=True)
class Pending:
    uid: str
    namespace: str
    name: str
    priority: int
    created: float
    request: Request
    """The pod's total: one container's share, or its whole cards (multi-container pods: the sum)."""

    @property
    def order_key(self) -> tuple[int, float, str, str, str]:
        return (-self.priority, self.created, self.namespace, self.name, self.uid)


@dataclass(frozen=True)
class Alternative:
    cores: int
    memory_units: int
    nodes: int

    def describe(self) -> str:
        if self.cores >= CORES_PER_CARD:
            n = self.cores // CORES_PER_CARD
            what = f"{n} whole card{'s' if n > 1 else ''}"
        else:
            what = f"a {self.cores} % share with {format_mib(self.memory_units * MEMORY_UNIT_MIB)}"
        return f"{what} fits on {self.nodes} node{'s' if self.nodes != 1 else ''}"


def _created(pod: Mapping[str, Any]) -> float:
    text = (pod.get("metadata") or {}).get("creationTimestamp")
    if isinstance(text, datetime.datetime):
        return text.timestamp()
    try:
        return datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return float("inf")  # no valid time: last among its priority


def pending_pods(pods: Iterable[Mapping[str, Any]], names: Names,
                 schedulers: Collection[str]) -> list[Pending]:
    """The unbound vGPU pods of ``schedulers``, in queue order."""
    found = []
    for pod in pods:
        spec = pod.get("spec") or {}
        if spec.get("nodeName") or is_finished(pod) or (spec.get("schedulerName") or "default-scheduler") \
                not in schedulers:
            continue
        try:
            asked = pod_requests(pod, names)
        except (RequestError, ValueError, TypeError):
            continue  # the extender refuses it with the reason; it is not waiting in the queue
        if not asked:
            continue
        requests = list(asked.values())
        if len(requests) == 1:
            request = requests[0]
        else:
            request = Request(sum(r.cores for r in requests), sum(r.memory_units for r in requests))
        priority = spec.get("priority")
        metadata = pod.get("metadata") or {}
        found.append(Pending(str(metadata.get("uid", "")), str(metadata.get("namespace", "")),
                             str(metadata.get("name", "")),
                             priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
                             _created(pod), request))
    return sorted(found, key=lambda p: p.order_key)


def fits(free: Sequence[FreeCard], request: Request) -> bool:
    """The extender's own fit rule for one request on one node's free cards."""
    return fits_alone(free, request)


Room = tuple[tuple[tuple[int, int], ...], tuple[int, ...]]
"""One node's free room: its (free cores, free memory) pairs no other of its cards beats, and its
untouched cards' memory, largest first."""


@dataclass(frozen=True)
class FreeRoom:
    """Every node's free cards, reduced once per report to what the fit rule looks at, with nodes
    of the same room counted together (full nodes, empty nodes: most of a cluster). ``fits_on``
    is ``fits_alone`` exactly; asking it for 500 waiting pods over 1,000 nodes costs a pass over
    the distinct rooms, not over every card each time."""

    rooms: Mapping[str, Room]
    counts: Mapping[Room, int]

    @classmethod
    def of(cls, free_by_node: Mapping[str, Sequence[FreeCard]]) -> FreeRoom:
        rooms: dict[str, Room] = {}
        counts: dict[Room, int] = {}
        for name, free in free_by_node.items():
            distinct = {(f.free_cores, f.free_memory_units) for f in free}
            pairs = tuple(sorted(p for p in distinct
                                 if not any(q != p and q[0] >= p[0] and q[1] >= p[1] for q in distinct)))
            room = (pairs, tuple(sorted((f.free_memory_units for f in free if f.whole), reverse=True)))
            rooms[name] = room
            counts[room] = counts.get(room, 0) + 1
        return cls(rooms, counts)

    @staticmethod
    def room_fits(room: Room, request: Request) -> bool:
        pairs, intact = room
        if request.is_share:
            return any(c >= request.cores and u >= request.memory_units for c, u in pairs)
        n = request.cards
        return len(intact) >= n and (not request.memory_units or sum(intact[:n]) >= request.memory_units)

    def fits_on(self, node: str, request: Request) -> bool:
        return self.room_fits(self.rooms[node], request)

    def nodes_fitting(self, request: Request) -> int:
        return sum(count for room, count in self.counts.items() if self.room_fits(room, request))


def why(request: Request, free_by_node: Mapping[str, Sequence[FreeCard]] | FreeRoom) -> str | None:
    """Why the request fits on no node now (None when it fits somewhere)."""
    room = free_by_node if isinstance(free_by_node, FreeRoom) else FreeRoom.of(free_by_node)
    if any(room.room_fits(each, request) for each in room.counts):
        return None
    if not room.rooms:
        return "no GPU node is known to the scheduler"
    if request.is_share:
        return (f"no card on any node has {request.cores} % and "
                f"{format_mib(request.memory_units * MEMORY_UNIT_MIB)} free")
    n = request.cards
    return f"no node has {n} whole card{'s' if n > 1 else ''} free"


def alternative(request: Request, free_by_node: Mapping[str, Sequence[FreeCard]] | FreeRoom) -> Alternative | None:
    """The largest share (or fewest whole cards) no larger than ``request`` that fits now on at
    least one node, and the number of nodes it fits on; None when nothing smaller fits."""
    room = free_by_node if isinstance(free_by_node, FreeRoom) else FreeRoom.of(free_by_node)
    if request.is_share:
        # a pair another card of the same node beats never gives a larger candidate
        candidates = {(min(c, request.cores), min(u, request.memory_units))
                      for pairs, _ in room.counts for c, u in pairs}
        candidates = {(c, u) for c, u in candidates if c > 0 and u > 0}
        if not candidates:
            return None
        cores, units = max(candidates, key=lambda cu: (cu[0] * cu[1], cu[0], cu[1]))
        wanted = Request(cores, units)
    else:
        most = max((len(intact) for _, intact in room.counts), default=0)
        if most == 0:
            return None
        most = min(most, request.cards)
        wanted = Request(most * CORES_PER_CARD, 0)
    nodes = room.nodes_fitting(wanted)
    return Alternative(wanted.cores, wanted.memory_units, nodes) if nodes else None


def queue_report(pods: Iterable[Mapping[str, Any]], free_by_node: Mapping[str, Sequence[FreeCard]],
                 names: Names, schedulers: Collection[str]) -> dict[str, Any]:
    """``GET /queue``: every pending vGPU pod with its position, why it waits and what fits now;
    and per node the largest share one card can still give."""
    pending = pending_pods(pods, names, schedulers)
    room = FreeRoom.of(free_by_node) if pending else None  # only a waiting pod asks what fits
    answers: dict[Request, tuple[str | None, Alternative | None]] = {}  # waiting pods share a few shapes
    entries = []
    for position, pod in enumerate(pending, start=1):
        if pod.request not in answers:
            assert room is not None
            reason = why(pod.request, room)
            answers[pod.request] = (reason, alternative(pod.request, room) if reason else None)
        reason, other = answers[pod.request]
        entries.append({
            "namespace": pod.namespace, "pod": pod.name, "uid": pod.uid, "position": position,
            "priority": pod.priority, "cores": pod.request.cores,
            "memoryMib": pod.request.memory_units * MEMORY_UNIT_MIB, "why": reason,
            "alternative": None if other is None else {
                "cores": other.cores, "memoryMib": other.memory_units * MEMORY_UNIT_MIB, "nodes": other.nodes,
                "text": other.describe()},
        })
    nodes = []
    for name in sorted(free_by_node):
        free = free_by_node[name]
        best = max(free, key=lambda f: (f.free_cores * f.free_memory_units, f.free_cores), default=None)
        nodes.append({"name": name, "wholeCardsFree": sum(f.whole for f in free),
                      "largestShare": None if best is None else {
                          "cores": best.free_cores, "memoryMib": best.free_memory_units * MEMORY_UNIT_MIB}})
    return {"pending": entries, "nodes": nodes}
