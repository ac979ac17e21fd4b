"""The ledger: which pod holds which share of which card, per node.

Everything here is in memory and pure (no Kubernetes calls): ``node_cards`` and
``pod_holding`` read API objects (plain dicts); the ``Ledger`` keeps per-node card
accounting with a free-capacity summary per node, and per request shape caches of
each node's filter verdict and score. Every mutation bumps the node's generation,
clears its memo and makes every cache forget that node, so a cached decision never
outlives the state it was computed from.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import (
    CORES_PER_CARD,
    MEMORY_UNIT_MIB,
    CardShare,
    ContainerAllocation,
    Names,
    PodAllocation,
    RequestError,
)
from jupyter_vgpu.core.inventory import Card, NodeInventory
from jupyter_vgpu.core.topology import Topology

log = logging.getLogger(__name__)

TERMINATED_PHASES = ("Succeeded", "Failed")


# --- reading API objects ---------------------------------------------------------------

@dataclass(frozen=True)
class NodeCards:
    """A node's cards as the extender sees them."""

    cards: tuple[Card, ...]
    topology: Topology | None = None
    source: str = "none"            # "inventory" | "capacity" | "none"
    problem: str | None = None      # why a node has no usable cards, or a note on its annotation


def node_cards(node: Mapping[str, Any], names: Names) -> NodeCards:
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

    def shares(self) -> Iterable[tuple[int, CardShare]]:
        for container in self.containers:
            for share in container.cards:
                yield container.index, share

    def same_claim(self, other: Holding) -> bool:
        return self.node == other.node and _claims(self) == _claims(other)


def _claims(holding: Holding) -> list[tuple[int, int, int, int]]:
    return sorted((c, s.index, s.cores, s.memory_units) for c, s in holding.shares())


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


def resource_version(obj: Mapping[str, Any]) -> int | None:
    value = (obj.get("metadata") or {}).get("resourceVersion")
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def pod_holding(pod: Mapping[str, Any], names: Names,
                cards: Mapping[str, NodeCards] | None = None) -> Holding | Unattributed | None:
    """What a pod holds, from our allocation record or gpu-admission's predicate keys.

    None when the pod holds nothing: terminated, not placed, or asking for no vGPU.
    The node is ``spec.nodeName``, or the predicate node of a pod our bind annotated
    but did not get to bind (it keeps its claim until it is bound elsewhere or gone).
    """
    uid, namespace, name = pod_key(pod)
    spec = pod.get("spec") or {}
    if (pod.get("status") or {}).get("phase") in TERMINATED_PHASES:
        return None
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    bound = spec.get("nodeName") or ""
    record = annotations.get(names.allocation)
    indices_present = any(key.startswith(names.predicate_gpu_idx_prefix) for key in annotations)
    node = bound or annotations.get(names.predicate_node) or ""
    if not node:
        return None
    if record:
        try:
            allocation = PodAllocation.from_json(record)
        except ValueError as error:
            return Unattributed(uid, namespace, name, node, str(error))
        if allocation.node != node:
            return Unattributed(uid, namespace, name, node,
                                f"allocation record names node {allocation.node}, pod is on {node}")
        return Holding(uid, namespace, name, node, allocation.containers)
    if indices_present:
        return _holding_from_predicates(pod, names, uid, namespace, name, node)
    if not bound:
        return None
    try:
        requests = contract.pod_requests(pod, names)
    except RequestError as error:
        return Unattributed(uid, namespace, name, node, str(error))
    if requests:
        return Unattributed(uid, namespace, name, node,
                            "bound without a card assignment (no allocation or predicate annotations)")
    return None


def _holding_from_predicates(pod: Mapping[str, Any], names: Names, uid: str, namespace: str,
                             name: str, node: str) -> Holding | Unattributed:
    """gpu-admission's keys name the cards; the pod's requests say how much of each."""
    try:
        allocation = contract.allocation_from_predicates(pod, names)
    except ValueError as error:  # RequestError is a ValueError
        return Unattributed(uid, namespace, name, node, str(error))
    assert allocation is not None  # only called when the keys are present
    return Holding(uid, namespace, name, node, allocation.containers)


# --- the ledger ------------------------------------------------------------------------

@dataclass(frozen=True)
class FreeCard:
    index: int
    free_cores: int
    free_memory_units: int
    whole: bool      # nothing held on it


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
    unattributed: dict[str, Unattributed] = field(default_factory=dict)
    used_cores: list[int] = field(default_factory=list)
    used_memory: list[int] = field(default_factory=list)
    orphans: list[tuple[str, CardShare]] = field(default_factory=list)  # shares on cards the node lacks
    generation: int = 0
    memo: dict[Any, Any] = field(default_factory=dict)          # cleared on every change
    static_memo: dict[Any, Any] = field(default_factory=dict)   # cleared when the cards change
    _position: dict[int, int] = field(default_factory=dict)
    _free: tuple[FreeCard, ...] | None = None

    def recount(self) -> None:
        self._position = {card.index: i for i, card in enumerate(self.cards)}
        self.used_cores = [0] * len(self.cards)
        self.used_memory = [0] * len(self.cards)
        self.orphans = []
        for holding in self.pods.values():
            self._apply(holding, +1)

    def _apply(self, holding: Holding, sign: int) -> None:
        for _, share in holding.shares():
            position = self._position.get(share.index)
            if position is None:
                if sign > 0:
                    self.orphans.append((holding.uid, share))
                else:
                    self.orphans = [(u, s) for u, s in self.orphans if u != holding.uid]
                continue
            card = self.cards[position]
            memory = card.memory_units if share.cores >= CORES_PER_CARD else share.memory_units
            self.used_cores[position] += sign * share.cores
            self.used_memory[position] += sign * memory

    def touch(self, generation: int) -> None:
        self.generation = generation
        self.memo.clear()
        self._free = None

    @property
    def free(self) -> tuple[FreeCard, ...]:
        """Free capacity of each healthy card (negative values clamp to zero)."""
        if self._free is None:
            self._free = tuple(
                FreeCard(card.index, max(0, CORES_PER_CARD - self.used_cores[i]),
                         max(0, card.memory_units - self.used_memory[i]),
                         self.used_cores[i] == 0 and self.used_memory[i] == 0)
                for i, card in enumerate(self.cards) if card.healthy
            )
        return self._free


class VerdictCache:
    """Per node, the filter verdict for one request shape, and the nodes it passes.

    Sets and dicts so that a filter over a thousand names is a few C-level loops;
    ``forget(node)`` runs whenever that node's accounting changes.
    """

    __slots__ = ("values", "passing", "failed", "unresolvable")

    def __init__(self) -> None:
        self.values: dict[str, tuple[str | None, bool]] = {}
        self.passing: set[str] = set()
        self.failed: dict[str, str] = {}
        self.unresolvable: dict[str, str] = {}

    def set(self, name: str, verdict: tuple[str | None, bool]) -> None:
        self.values[name] = verdict
        reason, never = verdict
        if reason is None:
            self.passing.add(name)
        elif never:
            self.unresolvable[name] = reason
        else:
            self.failed[name] = reason

    def forget(self, name: str) -> None:
        if self.values.pop(name, None) is not None:
            self.passing.discard(name)
            self.failed.pop(name, None)
            self.unresolvable.pop(name, None)


class ScoreCache(dict[str, int]):
    """Per node, the prioritize score for one request shape and policy."""

    def forget(self, name: str) -> None:
        self.pop(name, None)


class Ledger:
    """Nodes' cards and pods' holdings. Thread-safe: every method takes ``lock``."""

    MAX_CACHED_SHAPES = 64

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._nodes: dict[str, NodeEntry] = {}
        self._holdings: dict[str, Holding] = {}
        self._unattributed: dict[str, Unattributed] = {}
        self._generation = 0
        self._caches: OrderedDict[Any, Any] = OrderedDict()

    def cache(self, key: Any, factory: Callable[[], Any]) -> Any:
        """A per-request-shape cache of per-node answers, forgotten node by node on change (LRU)."""
        found = self._caches.get(key)
        if found is None:
            found = self._caches[key] = factory()
            if len(self._caches) > self.MAX_CACHED_SHAPES:
                self._caches.popitem(last=False)
        else:
            self._caches.move_to_end(key)
        return found

    @property
    def nodes(self) -> Mapping[str, NodeEntry]:
        """Live entries by name (read under ``lock``)."""
        return self._nodes

    # nodes
    def set_node(self, name: str, cards: NodeCards) -> None:
        with self.lock:
            entry = self._entry(name)
            if (entry.known and entry.cards == cards.cards and entry.topology == cards.topology
                    and entry.problem == cards.problem and entry.source == cards.source):
                return
            entry.cards, entry.topology = cards.cards, cards.topology
            entry.source, entry.problem, entry.known = cards.source, cards.problem, True
            entry.static_memo.clear()
            entry.recount()
            self._touch(entry)

    def remove_node(self, name: str) -> None:
        with self.lock:
            entry = self._nodes.get(name)
            if entry is None:
                return
            if entry.pods or entry.unattributed:
                # pods still point at it; keep their claims, forget the cards
                entry.cards, entry.topology, entry.known = (), None, False
                entry.source, entry.problem = "none", "node is gone"
                entry.static_memo.clear()
                entry.recount()
                self._touch(entry)
            else:
                del self._nodes[name]
                for cache in self._caches.values():
                    cache.forget(name)

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

    def _touch(self, entry: NodeEntry) -> None:
        self._generation += 1
        entry.touch(self._generation)
        for cache in self._caches.values():
            cache.forget(entry.name)

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

    def stats(self) -> dict[str, int]:
        with self.lock:
            return {"nodes": sum(1 for e in self._nodes.values() if e.known),
                    "pods": len(self._holdings),
                    "assumed": sum(1 for h in self._holdings.values() if h.assumed),
                    "unattributed": len(self._unattributed)}
