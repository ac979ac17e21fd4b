"""The ledger: which pod holds which share of which card, per node. Accounting only.

Everything here is in memory and pure (no Kubernetes calls): ``node_cards`` and
``pod_holding`` read API objects (plain dicts) through ``jupyter_vgpu.core.claims``; the
``Ledger`` keeps per-node card accounting with a free-capacity summary per node. Every
mutation bumps the node's generation and tells the subscribers (the decision caches in
``cache.py``) which node changed, so nothing derived from it outlives the state it was
computed from.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Set
from dataclasses import dataclass, field, replace
from typing import Any

from jupyter_vgpu.core import claims, contract
from jupyter_vgpu.core.claims import FreeCard
from jupyter_vgpu.core.contract import (
    CORES_PER_CARD,
    MEMORY_UNIT_MIB,
    CardShare,
    ContainerAllocation,
    Names,
    RequestError,
)
from jupyter_vgpu.core.inventory import Card, NodeInventory
from jupyter_vgpu.core.mig import Sharing, read_sharing
from jupyter_vgpu.core.mig_placement import NodeSlice, node_slices
from jupyter_vgpu.core.topology import Topology

log = logging.getLogger(__name__)

MAX_INFERRED_CARDS = 1024
"""Most cards a node's vcuda-core capacity may imply: more is a typo, not a machine."""


# --- reading API objects ---------------------------------------------------------------

@dataclass(frozen=True)
class NodeCards:
    """A node's cards as the extender sees them."""

    cards: tuple[Card, ...]
    topology: Topology | None = None
    source: str = "none"            # "inventory" | "capacity" | "none"
    problem: str | None = None      # why a node has no usable cards, or a note on its annotation
    sharing: Sharing = Sharing()    # the admin's time-shared / MIG choice (node annotation)


def node_cards(node: Mapping[str, Any], names: Names) -> NodeCards:
    """The node's cards (``_node_cards``) with its sharing mode; a malformed mode is logged, the default used."""
    found = _node_cards(node, names)
    sharing, problem = read_sharing((node.get("metadata") or {}).get("annotations") or {}, names)
    if problem:
        log.warning("node %s: %s", (node.get("metadata") or {}).get("name", "?"), problem)
    return replace(found, sharing=sharing)


def _node_cards(node: Mapping[str, Any], names: Names) -> NodeCards:
    """Cards from the device plugin's inventory annotation, else from node capacity.

    Without the annotation (a gpu-manager node), cards are inferred as gpu-admission
    does: vcuda-core capacity / 100 cards of equal size, memory split equally.
    """
    metadata = node.get("metadata") or {}
    name = metadata.get("name", "?")
    annotation = (metadata.get("annotations") or {}).get(names.node_inventory)
    note = None
    if annotation:
        try:
            inventory = NodeInventory.from_json(annotation)
        except ValueError as error:
            note = f"annotation {names.node_inventory} is malformed ({error}); cards inferred from capacity"
            log.warning("node %s: %s", name, note)
        else:
            problem = inventory.problem
            if not inventory.cards and not problem:
                problem = "the device plugin found no GPUs"
            return NodeCards(inventory.cards, inventory.topology, "inventory", problem)
    capacity = (node.get("status") or {}).get("capacity") or {}
    try:
        cores = contract.parse_count(capacity.get(names.core_resource, 0), names.core_resource)
        memory = contract.parse_count(capacity.get(names.memory_resource, 0), names.memory_resource)
    except RequestError as error:
        return NodeCards((), None, "none", f"node capacity is unreadable: {error}")
    count = cores // CORES_PER_CARD
    if count > MAX_INFERRED_CARDS:
        return NodeCards((), None, "none", f"node capacity of {count} cards is not believable "
                                           f"(at most {MAX_INFERRED_CARDS}); publish the inventory annotation")
    if count == 0:
        problem = note or (f"no vGPU cards: no {names.node_inventory} annotation and no "
                           f"{names.core_resource} capacity")
        return NodeCards((), None, "none", problem)
    units = memory // count
    cards = tuple(Card(index=i, uuid="", model="", memory_mib=units * MEMORY_UNIT_MIB) for i in range(count))
    return NodeCards(cards, None, "capacity", note)


@dataclass(frozen=True)
class Holding:
    """One pod's claim on one node's cards."""

    uid: str
    namespace: str
    name: str
    node: str
    containers: tuple[ContainerAllocation, ...]
    assumed: bool = False                 # written by our bind, not yet seen through the watch
    min_resource_version: int | None = None   # watch events older than this are stale for it
    assumed_at: float = 0.0
    unserved: bool = False                # no gpu-assigned=true yet: kubelet may still call Allocate for it

    def shares(self) -> Iterable[tuple[int, CardShare]]:
        for container in self.containers:
            for share in container.cards:
                yield container.index, share

    def same_claim(self, other: Holding) -> bool:
        return self.node == other.node and _claims(self) == _claims(other)


def _claims(holding: Holding) -> list[tuple[int, int, int, int]]:
    return sorted((c, s.index, s.cores, s.memory_units) for c, s in holding.shares())


def answer_shape(container: ContainerAllocation) -> tuple[int, int, bool]:
    """What the device plugin's vcuda-core answer to a container depends on besides its card(s):
    its vcuda-core count (all kubelet's Allocate tells containers apart by), a share's memory
    limit (a whole card's is the card's) and whether it is a MIG slice."""
    cores = sum(share.cores for share in container.cards)
    memory = container.cards[0].memory_units if len(container.cards) == 1 and not claims.is_whole_card(cores) else 0
    return cores, memory, any(share.mig_device for share in container.cards)


def rival(holding: Holding, others: Iterable[Holding]) -> tuple[Holding, str] | None:
    """The first of ``others`` (another pod kubelet may still admit on the node) with a container
    asking for as many vcuda-core as one of ``holding``'s but answered differently, and how."""
    return shape_rival({answer_shape(container) for container in holding.containers}, holding.uid, others)


def shape_rival(mine: Collection[tuple[int, int, bool]], uid: str,
                others: Iterable[Holding]) -> tuple[Holding, str] | None:
    """``rival`` for a pod (``uid``) whose containers' answers would have the shapes ``mine``."""
    for other in others:
        if other.uid == uid:
            continue
        for container in other.containers:
            theirs = answer_shape(container)
            ours = next((shape for shape in mine if shape[0] == theirs[0] and shape != theirs), None)
            if ours is not None:
                return other, f"{_describe_shape(theirs)} where this pod asks for {_describe_shape(ours)}"
    return None


def _describe_shape(shape: tuple[int, int, bool]) -> str:
    cores, memory, mig = shape
    return f"{cores} vcuda-core" + (f" with {memory} vcuda-memory" if memory else "") + (" on a MIG slice" if mig else "")


@dataclass(frozen=True)
class Unattributed:
    """A pod on a node asking for vGPU whose cards we cannot tell (or whose record is broken)."""

    uid: str
    namespace: str
    name: str
    node: str
    reason: str


def pod_key(pod: Mapping[str, Any]) -> tuple[str, str, str]:
    metadata = pod.get("metadata") or {}
    return metadata.get("uid") or "", metadata.get("namespace") or "", metadata.get("name") or ""


def pod_holding(pod: Mapping[str, Any], names: Names,
                schedulers: Collection[str] | None = None) -> Holding | Unattributed | None:
    """What a pod holds (``claims.pod_claim``), as the ledger records it.

    None when the pod holds nothing: finished, not placed, asking for no vGPU, or not bound
    and not a pod of ``schedulers`` (None: any). The node is ``spec.nodeName``, or the
    predicate node of a pod our bind annotated but did not get to bind (it keeps its claim
    until it is bound elsewhere or gone). A claim that cannot be read is Unattributed.
    """
    claim = claims.pod_claim(pod, names, schedulers=schedulers)
    if claim is None:
        return None
    uid, namespace, name = pod_key(pod)
    if claim.problem is not None:
        return Unattributed(uid, namespace, name, claim.node, claim.problem)
    if claim.allocation is None:
        return None
    served = ((pod.get("metadata") or {}).get("annotations") or {}).get(names.gpu_assigned) == "true"
    return Holding(uid, namespace, name, claim.node, claim.allocation.containers,
                   unserved=not (served or kubelet_started(pod)))


def kubelet_started(pod: Mapping[str, Any]) -> bool:
    """Whether kubelet has admitted the pod and started (or ended) its containers: then it makes no
    more Allocate calls for it, marked ``gpu-assigned`` or not (the node daemon may be down, or its
    PATCH refused). Pod status is kubelet's to write, not the pod's creator's."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Running", "Succeeded", "Failed"):
        return True
    return any(("running" in (s.get("state") or {})) or ("terminated" in (s.get("state") or {}))
               for s in status.get("containerStatuses") or [])


# --- the ledger ------------------------------------------------------------------------

@dataclass
class NodeEntry:
    """Accounting for one node. Mutated only under the ledger lock."""

    name: str
    cards: tuple[Card, ...] = ()
    topology: Topology | None = None
    source: str = "none"
    problem: str | None = None
    known: bool = False           # a Node object was seen (or given in a request)
    pods: dict[str, Holding] = field(default_factory=dict)
    unserved: dict[str, Holding] = field(default_factory=dict)  # the pods' holdings that are ``unserved``
    unattributed: dict[str, Unattributed] = field(default_factory=dict)
    used_cores: list[int] = field(default_factory=list)
    used_memory: list[int] = field(default_factory=list)
    orphans: list[tuple[str, CardShare]] = field(default_factory=list)  # shares on cards the node lacks
    sharing: Sharing = field(default_factory=Sharing)
    held_slices: Counter[str] = field(default_factory=Counter)  # MIG device UUID -> pods holding it
    generation: int = 0
    _position: dict[int, int] = field(default_factory=dict)
    _free: tuple[FreeCard, ...] | None = None
    _slices: tuple[NodeSlice, ...] | None = None

    def recount(self) -> None:
        self._position = {card.index: i for i, card in enumerate(self.cards)}
        self.used_cores = [0] * len(self.cards)
        self.used_memory = [0] * len(self.cards)
        self.orphans = []
        self.held_slices = Counter()
        self._slices = None
        for holding in self.pods.values():
            self._apply(holding, +1)

    @property
    def slices(self) -> tuple[NodeSlice, ...]:
        """The MIG slices the node's cards publish."""
        if self._slices is None:
            self._slices = node_slices(NodeInventory(self.name, self.cards, None)) \
                if any(card.slices for card in self.cards) else ()
        return self._slices

    def _apply(self, holding: Holding, sign: int) -> None:
        for _, share in holding.shares():
            if share.mig_device:  # a slice is held whole; its card is never time-shared
                self.held_slices[share.mig_device] += sign
                if self.held_slices[share.mig_device] <= 0:
                    del self.held_slices[share.mig_device]
                continue
            position = self._position.get(share.index)
            if position is None:
                if sign > 0:
                    self.orphans.append((holding.uid, share))
                else:
                    self.orphans = [(u, s) for u, s in self.orphans if u != holding.uid]
                continue
            memory = claims.held_memory_units(share.cores, share.memory_units, self.cards[position].memory_units)
            self.used_cores[position] += sign * share.cores
            self.used_memory[position] += sign * memory

    def touch(self, generation: int) -> None:
        self.generation = generation
        self._free = None

    def without(self, uid: str) -> NodeEntry:
        """A throwaway copy of this entry as if pod ``uid`` held nothing here."""
        copy = NodeEntry(self.name, self.cards, self.topology, self.source, self.problem, self.known,
                         pods={u: h for u, h in self.pods.items() if u != uid}, sharing=self.sharing)
        copy.recount()
        return copy

    @property
    def free(self) -> tuple[FreeCard, ...]:
        """Free capacity of each healthy card (negative values clamp to zero)."""
        if self._free is None:
            self._free = claims.free_cards(
                (card.index, card.memory_units, card.healthy, self.used_cores[i], self.used_memory[i])
                for i, card in enumerate(self.cards))
        return self._free


Listener = Callable[[str, bool], None]
"""Told (node name, whether its cards changed) under the ledger's lock after every change."""


class Ledger:
    """Nodes' cards and pods' holdings. Thread-safe: every method takes ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._nodes: dict[str, NodeEntry] = {}
        self._holdings: dict[str, Holding] = {}
        self._unattributed: dict[str, Unattributed] = {}
        self._awaiting: set[str] = set()  # nodes with an ``unserved`` holding: kubelet may still call Allocate
        self._generation = 0
        self._listeners: list[Listener] = []
        self._changed = threading.Condition(self.lock)
        self._waiting = 0  # threads in wait_for: only then does a change notify

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(node, cards_changed)`` whenever a node's accounting changes."""
        with self.lock:
            self._listeners.append(listener)

    @property
    def nodes(self) -> Mapping[str, NodeEntry]:
        """Live entries by name (read under ``lock``)."""
        return self._nodes

    @property
    def awaiting_admission(self) -> Set[str]:
        """The nodes holding a pod kubelet has not admitted yet (read under ``lock``); few at a
        time, so a filter can look at them without walking every node."""
        return self._awaiting

    # nodes
    def set_node(self, name: str, cards: NodeCards) -> None:
        with self.lock:
            entry = self._entry(name)
            if (entry.known and entry.cards == cards.cards and entry.topology == cards.topology
                    and entry.problem == cards.problem and entry.source == cards.source
                    and entry.sharing == cards.sharing):
                return
            entry.cards, entry.topology, entry.sharing = cards.cards, cards.topology, cards.sharing
            entry.source, entry.problem, entry.known = cards.source, cards.problem, True
            entry.recount()
            self._touch(entry, cards_changed=True)

    def remove_node(self, name: str) -> None:
        with self.lock:
            entry = self._nodes.get(name)
            if entry is None:
                return
            if entry.pods or entry.unattributed:
                # pods still point at it; keep their claims, forget the cards
                entry.cards, entry.topology, entry.known = (), None, False
                entry.source, entry.problem = "none", "node is gone"
                entry.recount()
                self._touch(entry, cards_changed=True)
            else:
                del self._nodes[name]
                for listener in self._listeners:
                    listener(name, True)

    def node(self, name: str) -> NodeEntry | None:
        """The live entry (read it under ``lock``)."""
        return self._nodes.get(name)

    def node_names(self) -> list[str]:
        with self.lock:
            return list(self._nodes)

    # holdings
    def holding(self, uid: str) -> Holding | None:
        with self.lock:
            return self._holdings.get(uid)

    def holdings(self) -> list[Holding]:
        with self.lock:
            return list(self._holdings.values())

    def put(self, holding: Holding) -> Holding | None:
        """Record a pod's holding, replacing what it held before; returns the previous one."""
        with self.lock:
            previous = self._drop(holding.uid)
            self._holdings[holding.uid] = holding
            entry = self._entry(holding.node)
            entry.pods[holding.uid] = holding
            if holding.unserved:
                entry.unserved[holding.uid] = holding
                self._awaiting.add(entry.name)
            entry._apply(holding, +1)
            self._touch(entry)
            return previous

    def put_unattributed(self, item: Unattributed) -> None:
        with self.lock:
            self._drop(item.uid)
            self._unattributed[item.uid] = item
            entry = self._entry(item.node)
            entry.unattributed[item.uid] = item
            self._touch(entry)

    def drop(self, uid: str) -> Holding | None:
        with self.lock:
            return self._drop(uid)

    def _drop(self, uid: str) -> Holding | None:
        previous = self._holdings.pop(uid, None)
        if previous is not None:
            entry = self._nodes[previous.node]
            del entry.pods[uid]
            if entry.unserved.pop(uid, None) is not None and not entry.unserved:
                self._awaiting.discard(entry.name)
            entry._apply(previous, -1)
            self._touch(entry)
        stray = self._unattributed.pop(uid, None)
        if stray is not None:
            entry = self._nodes[stray.node]
            entry.unattributed.pop(uid, None)
            self._touch(entry)
        return previous

    def _entry(self, name: str) -> NodeEntry:
        entry = self._nodes.get(name)
        if entry is None:
            entry = self._nodes[name] = NodeEntry(name)
            entry.recount()
        return entry

    def _touch(self, entry: NodeEntry, cards_changed: bool = False) -> None:
        self._generation += 1
        entry.touch(self._generation)
        for listener in self._listeners:
            listener(entry.name, cards_changed)
        if self._waiting:
            self._changed.notify_all()

    def wait_for(self, done: Callable[[], bool], timeout: float) -> bool:
        """Block (GIL released) until ``done()``, asked under the lock after each change, holds or
        ``timeout`` seconds pass; returns its last answer."""
        with self.lock:
            self._waiting += 1
            try:
                return self._changed.wait_for(done, max(0.0, timeout))
            finally:
                self._waiting -= 1

    # views
    def claims(self) -> dict[str, dict[str, list[tuple[int, int, int, int]]]]:
        """node -> pod uid -> sorted (container, card, cores, memory units): for comparing ledgers."""
        with self.lock:
            result: dict[str, dict[str, list[tuple[int, int, int, int]]]] = {}
            for holding in self._holdings.values():
                result.setdefault(holding.node, {})[holding.uid] = _claims(holding)
            return result

    def overcommitted(self) -> list[str]:
        """Cards holding more than they have, as sentences (empty when all is well)."""
        with self.lock:
            problems = []
            for entry in self._nodes.values():
                for i, card in enumerate(entry.cards):
                    if entry.used_cores[i] > CORES_PER_CARD or entry.used_memory[i] > card.memory_units:
                        problems.append(
                            f"{entry.name} card {card.index}: {entry.used_cores[i]} cores / "
                            f"{entry.used_memory[i]} memory units held of {CORES_PER_CARD} / {card.memory_units}"
                        )
            return problems

    def slices_held_more_than_once(self) -> list[tuple[str, str, int]]:
        """(node, MIG device UUID, pods holding it) for every slice held twice or more (empty when all is well)."""
        with self.lock:
            return [(entry.name, uuid, count) for entry in self._nodes.values()
                    for uuid, count in entry.held_slices.items() if count > 1]

    def stats(self) -> dict[str, int]:
        with self.lock:
            return {"nodes": sum(1 for e in self._nodes.values() if e.known),
                    "pods": len(self._holdings),
                    "assumed": sum(1 for h in self._holdings.values() if h.assumed),
                    "unattributed": len(self._unattributed)}
