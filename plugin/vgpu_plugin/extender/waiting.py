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
from functools import cached_property
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


def room_of(free: Sequence[FreeCard]) -> Room:
    """One node's ``Room`` from its free cards."""
    distinct = {(f.free_cores, f.free_memory_units) for f in free}
    pairs = tuple(sorted(p for p in distinct
                         if not any(q != p and q[0] >= p[0] and q[1] >= p[1] for q in distinct)))
    return pairs, tuple(sorted((f.free_memory_units for f in free if f.whole), reverse=True))


def node_line(name: str, free: Sequence[FreeCard]) -> dict[str, Any]:
    """One node's entry in the report's ``nodes``: whole cards free and the largest share one card gives."""
    best = max(free, key=lambda f: (f.free_cores * f.free_memory_units, f.free_cores), default=None)
    return {"name": name, "wholeCardsFree": sum(f.whole for f in free),
            "largestShare": None if best is None else {
                "cores": best.free_cores, "memoryMib": best.free_memory_units * MEMORY_UNIT_MIB}}


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
        return cls.counted({name: room_of(free) for name, free in free_by_node.items()})

    @classmethod
    def counted(cls, rooms: dict[str, Room]) -> FreeRoom:
        counts: dict[Room, int] = {}
        for room in rooms.values():
            counts[room] = counts.get(room, 0) + 1
        return cls(rooms, counts)

    @staticmethod
    def room_fits(room: Room, request: Request) -> bool:
        pairs, intact = room
        if request.is_share:
            return any(c >= request.cores and u >= request.memory_units for c, u in pairs)
        n = request.cards
        return len(intact) >= n and (not request.memory_units or sum(intact[:n]) >= request.memory_units)

    @cached_property
    def pairs(self) -> frozenset[tuple[int, int]]:
        """Every room's (free cores, free memory) pairs, once: a share fits on some node exactly
        when one of these holds it, so ``why`` and ``alternative`` look at each pair once, not
        once per room (5,000 distinct rooms share a few thousand pairs)."""
        return frozenset(pair for pairs, _ in self.counts for pair in pairs)

    def fits_somewhere(self, request: Request) -> bool:
        if request.is_share:
            cores, units = request.cores, request.memory_units
            return any(c >= cores and u >= units for c, u in self.pairs)
        return any(self.room_fits(each, request) for each in self.counts)

    def fits_on(self, node: str, request: Request) -> bool:
        return self.room_fits(self.rooms[node], request)

    def nodes_fitting(self, request: Request) -> int:
        if request.is_share:  # room_fits inlined: this is the per-shape pass over every distinct room
            cores, units = request.cores, request.memory_units
            return sum(count for (pairs, _), count in self.counts.items()
                       if any(c >= cores and u >= units for c, u in pairs))
        return sum(count for room, count in self.counts.items() if self.room_fits(room, request))


def why(request: Request, free_by_node: Mapping[str, Sequence[FreeCard]] | FreeRoom) -> str | None:
    """Why the request fits on no node now (None when it fits somewhere)."""
    room = free_by_node if isinstance(free_by_node, FreeRoom) else FreeRoom.of(free_by_node)
    if room.fits_somewhere(request):
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
        candidates = {(min(c, request.cores), min(u, request.memory_units)) for c, u in room.pairs}
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


class NodeRooms:
    """Each node's ``Room`` and report line, kept from one report to the next and recomputed only
    for a node whose free cards changed (issue 18: at 5,000 nodes the per-node work was most of
    a recompute, and between two reports a bind burst touches a few nodes, not all).

    "Changed" is "another object": the ledger's ``NodeEntry.free`` is one tuple until the node's
    accounting changes (``touch`` drops it), so the same tuple means the same cards. A node given
    as anything but a tuple (mutable) is computed afresh every time. The lines handed out are
    shared between reports: readers must not change them (the server only serialises them).
    """

    def __init__(self) -> None:
        self._known: dict[str, tuple[Sequence[FreeCard], Room, dict[str, Any]]] = {}

    def update(self, free_by_node: Mapping[str, Sequence[FreeCard]]) -> tuple[FreeRoom, list[dict[str, Any]]]:
        """The ``FreeRoom`` of ``free_by_node`` and its ``nodes`` lines in name order."""
        known = self._known
        kept: dict[str, tuple[Sequence[FreeCard], Room, dict[str, Any]]] = {}
        rooms: dict[str, Room] = {}
        lines: dict[str, dict[str, Any]] = {}
        for name, free in free_by_node.items():
            entry = known.get(name)
            if entry is None or entry[0] is not free:
                entry = (free, room_of(free), node_line(name, free))
            if isinstance(free, tuple):
                kept[name] = entry  # a node no longer given is forgotten
            rooms[name], lines[name] = entry[1], entry[2]
        self._known = kept
        return FreeRoom.counted(rooms), [lines[name] for name in sorted(free_by_node)]


def queue_report(pods: Iterable[Mapping[str, Any]], free_by_node: Mapping[str, Sequence[FreeCard]],
                 names: Names, schedulers: Collection[str], rooms: NodeRooms | None = None) -> dict[str, Any]:
    """``GET /queue``: every pending vGPU pod with its position, why it waits and what fits now;
    and per node the largest share one card can still give. ``rooms`` (kept by the caller between
    reports) spares the per-node work for nodes whose free cards did not change; the report is
    the same with or without it."""
    pending = pending_pods(pods, names, schedulers)
    if rooms is not None:
        room: FreeRoom | None
        room, nodes = rooms.update(free_by_node)
    else:
        room = FreeRoom.of(free_by_node) if pending else None  # only a waiting pod asks what fits
        nodes = [node_line(name, free_by_node[name]) for name in sorted(free_by_node)]
    # waiting pods share a few shapes: each is answered (and worded) once
    answers: dict[Request, tuple[str | None, dict[str, Any] | None]] = {}
    entries = []
    for position, pod in enumerate(pending, start=1):
        answer = answers.get(pod.request)
        if answer is None:
            assert room is not None
            reason = why(pod.request, room)
            other = alternative(pod.request, room) if reason else None
            answer = answers[pod.request] = (reason, None if other is None else {
                "cores": other.cores, "memoryMib": other.memory_units * MEMORY_UNIT_MIB, "nodes": other.nodes,
                "text": other.describe()})
        reason, described = answer
        entries.append({
            "namespace": pod.namespace, "pod": pod.name, "uid": pod.uid, "position": position,
            "priority": pod.priority, "cores": pod.request.cores,
            "memoryMib": pod.request.memory_units * MEMORY_UNIT_MIB, "why": reason,
            "alternative": None if described is None else dict(described),
        })
    return {"pending": entries, "nodes": nodes}
