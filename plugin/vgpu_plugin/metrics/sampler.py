"""The one thread that talks to the GPU backend for metrics.

Every period it takes a backend sample, maps each GPU process to its pod and container,
adds up usage per container, records the containers' usage history, and publishes an
immutable Snapshot. A container holding a share with no GPU process seen in a sample gets an
unknown history point (NaN memory and utilisation), never a 0: the driver lists only processes
whose PID exists in the daemon's PID namespace (without hostPID, none of the pods'), so "no
process" cannot be told from "a process this daemon cannot see", and must not read as idle.
HTTP requests only ever read the latest snapshot, so a scrape never waits for NVML and a
slow or failing driver never takes the endpoint down: a failed sample keeps the last known
numbers and marks them stale, with the reason.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from jupyter_vgpu.core.contract import DEFAULT_NAMES, Names

from .cgroup import CgroupIdentity, read_process_identity
from .podmap import PodEntry, PodIndex

log = logging.getLogger(__name__)

STALE_AFTER_PERIODS = 3
"""Data older than this many periods (plus a second of slack) is stale even without an error."""


class PodSource(Protocol):
    def items(self) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class ContainerKey:
    pod_uid: str
    index: int


@dataclass(frozen=True)
class CardUsage:
    index: int
    memory_used_mib: float
    utilization_percent: float


@dataclass(frozen=True)
class ContainerUsage:
    memory_used_mib: float
    utilization_percent: float
    """Summed over the container's processes and cards, in percent of one card (= vcuda-core)."""
    cards: tuple[CardUsage, ...]
    pids: tuple[int, ...]


@dataclass(frozen=True)
class ProcessView:
    pid: int
    card_index: int
    uuid: str
    memory_used_mib: float
    utilization_percent: float
    pod: PodEntry | None
    container_index: int | None
    owner: str
    """"container", "pod" (container unknown), "unknown-pod" (a pod path this node's cache
    does not know), "host" (outside Kubernetes: real usage nonetheless) or "unreadable"."""


@dataclass(frozen=True)
class CardView:
    card: Any
    """core.inventory.Card (index, uuid, model, memory_mib, numa, healthy, ...)."""
    memory_used_mib: float | None
    utilization_percent: float | None
    allocated_cores: int
    allocated_memory_mib: int
    holders: tuple[ContainerKey, ...]
    healthy: bool = True
    """The inventory's health, and the latest sample's (which sees a lost card at once)."""


@dataclass(frozen=True)
class HistoryPoint:
    t: float
    memory_used_mib: float
    utilization_percent: float
    """Both NaN when no process of the container was seen in that sample: unknown, not idle."""

    @property
    def known(self) -> bool:
        return not math.isnan(self.memory_used_mib)


@dataclass(frozen=True)
class Snapshot:
    node: str
    period: float
    taken_at: float | None
    """Wall-clock time of the GPU data shown (None until the first good sample)."""
    failure: str | None
    """Why the latest sampling attempt failed; None when it worked."""
    cards: tuple[CardView, ...] = ()
    topology: Any = None
    topology_dict: Mapping[str, Any] | None = None
    """topology.to_dict(), computed once per inventory refresh (the tree is not free)."""
    pods: PodIndex = field(default_factory=lambda: PodIndex((), {}, {}))
    processes: tuple[ProcessView, ...] = ()
    usage: Mapping[ContainerKey, ContainerUsage] = field(default_factory=dict)
    slices: tuple[Any, ...] = ()
    """jupyter_vgpu.gpu.base.SliceSample per MIG slice of the last good sample."""

    def card(self, index: int) -> CardView | None:
        for view in self.cards:
            if view.card.index == index:
                return view
        return None

    def staleness(self, now: float) -> tuple[bool, str | None]:
        """(stale, message): stale after a failed sample or when the data has aged."""
        if self.failure:
            return True, self.failure
        if self.taken_at is None:
            return True, "no GPU sample taken yet"
        age = now - self.taken_at
        if age > STALE_AFTER_PERIODS * self.period + 1.0:
            return True, f"the last GPU sample is {age:.0f} s old (sampling every {self.period:g} s)"
        return False, None


class UsageRing:
    """The last ``size`` (t, memory, utilisation) points of one container, in three float
    arrays: 24 bytes a point instead of ~150 for tuples (64 containers x 15 min = 1.4 MB).
    An unknown point (no process seen) holds NaN memory and utilisation."""

    __slots__ = ("_t", "_memory", "_utilization", "_next", "_count")

    def __init__(self, size: int) -> None:
        self._t = array("d", bytes(8 * size))
        self._memory = array("d", bytes(8 * size))
        self._utilization = array("d", bytes(8 * size))
        self._next = 0
        self._count = 0

    def append(self, t: float, memory: float, utilization: float) -> None:
        i = self._next
        self._t[i], self._memory[i], self._utilization[i] = t, memory, utilization
        self._next = (i + 1) % len(self._t)
        self._count = min(self._count + 1, len(self._t))

    def since(self, since: float) -> list[HistoryPoint]:
        """Points with t >= since, oldest first."""
        size = len(self._t)
        start = (self._next - self._count) % size
        points = []
        for offset in range(self._count):
            i = (start + offset) % size
            if self._t[i] >= since:
                points.append(HistoryPoint(self._t[i], self._memory[i], self._utilization[i]))
        return points


class Sampler:
    def __init__(
        self,
        node_name: str,
        backend: Any,
        pods: PodSource,
        names: Names = DEFAULT_NAMES,
        *,
        period: float = 1.0,
        history_seconds: float = 900.0,
        proc_root: str = "/proc",
        inventory_refresh: float = 30.0,
        lookup_rebuild_interval: float | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if period <= 0:
            raise ValueError(f"sample period must be positive, not {period!r}")
        if history_seconds < period:
            raise ValueError(f"history ({history_seconds} s) must cover at least one period ({period} s)")
        self.node = node_name
        self.backend = backend
        self.period = float(period)
        self.history_seconds = float(history_seconds)
        self._pods = pods
        self._names = names
        self._proc_root = proc_root
        self._inventory_refresh = inventory_refresh
        self._clock = clock
        self._monotonic = monotonic
        # a token lookup the snapshot cannot answer rebuilds the pod index from the live cache at
        # most this often: a genuine token whose pod is gone must not buy a rebuild per request
        self._lookup_interval = (min(self.period, 1.0) if lookup_rebuild_interval is None
                                 else float(lookup_rebuild_interval))
        self._lookup_lock = threading.Lock()
        self._lookup_index: PodIndex | None = None
        self._lookup_key: tuple[Any, ...] | None = None
        self._lookup_at = -math.inf
        self.lookup_rebuilds = 0
        self._history_len = math.ceil(history_seconds / period) + 1
        self._history: dict[ContainerKey, UsageRing] = {}
        self._history_lock = threading.Lock()
        self._sampling = threading.Lock()
        self._identities: dict[int, tuple[CgroupIdentity | None, bool]] = {}
        self._inventory: list[Any] = []
        self._topology: Any = None
        self._topology_dict: Mapping[str, Any] | None = None
        self._inventory_at = -math.inf
        self._inventory_problem: str | None = None
        self._inventory_generation = 0
        self._slices_refreshed_for: dict[str, bool] | None = None  # the sampled slices the last re-read was for
        self._pods_key: tuple[Any, ...] | None = None
        self._pods_index = PodIndex((), {}, {})
        self._snapshot = Snapshot(node_name, self.period, None, "the sampler has not run yet")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples_taken = 0
        self.failures = 0

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"vgpu-metrics-sampler-{self.node}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def thread(self) -> threading.Thread | None:
        """The sampling thread while running (for CPU accounting in benchmarks)."""
        return self._thread

    def _run(self) -> None:
        deadline = time.monotonic()
        while not self._stop.is_set():
            self.sample_once()
            deadline += self.period
            now = time.monotonic()
            if deadline < now:  # fell behind (slow driver): skip, do not burst
                deadline = now + self.period
            self._stop.wait(deadline - now)

    # --- reading -----------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        return self._snapshot

    def history(self, key: ContainerKey, seconds: float, now: float | None = None) -> list[HistoryPoint]:
        since = (self._clock() if now is None else now) - seconds
        with self._history_lock:
            ring = self._history.get(key)
            return ring.since(since) if ring else []

    def find_allocation(self, allocation_id: str) -> tuple[PodEntry, int] | None:
        """(pod, container index) holding an allocation id; falls back to the live cache for
        records newer than the snapshot (a container admitted since the last sample).

        The fallback rebuilds only when the cache changed since the last rebuild (by
        resourceVersions), and at most once per ``lookup_rebuild_interval`` either way.
        """
        found = self._snapshot.pods.by_allocation_id(allocation_id)
        if found is not None:
            return found
        return self._lookup_pods().by_allocation_id(allocation_id)

    def _lookup_pods(self) -> PodIndex:
        with self._lookup_lock:
            now = self._monotonic()
            if self._lookup_index is not None and now - self._lookup_at < self._lookup_interval:
                return self._lookup_index
            items = self._pods.items()
            key = _cache_key(items, self._inventory_generation)
            if self._lookup_index is None or key is None or key != self._lookup_key:
                self._lookup_index = PodIndex.build(items, self.node, self._names, self._cards_by_index())
                self._lookup_key = key
                self.lookup_rebuilds += 1
            self._lookup_at = now
            return self._lookup_index

    # --- sampling ----------------------------------------------------------------------

    def _cards_by_index(self) -> dict[int, Any]:
        return {card.index: card for card in self._inventory}

    def _current_pods(self) -> PodIndex:
        """The pod index, rebuilt only when a pod (its resourceVersion) or the inventory changed:
        parsing every allocation annotation each period would be most of the sampler's work."""
        items = self._pods.items()
        key = _cache_key(items, self._inventory_generation)
        if key is None or key != self._pods_key:
            self._pods_index = PodIndex.build(items, self.node, self._names, self._cards_by_index())
            self._pods_key = key
        return self._pods_index

    def _refresh_inventory(self, now: float, force: bool = False) -> None:
        if not force and now - self._inventory_at < self._inventory_refresh:
            return
        self._inventory_at = now
        self._inventory_generation += 1
        try:
            if not self.backend.available():
                self._inventory, self._topology, self._topology_dict = [], None, None
                self._inventory_problem = self.backend.problem() or "no GPUs on this node"
                return
            self._inventory = list(self.backend.inventory())
            topology = self.backend.topology()
            if topology is not self._topology:
                self._topology = topology
                self._topology_dict = topology.to_dict() if topology is not None else None
            self._inventory_problem = None
        except Exception as error:  # keep the previous inventory: a transient driver error
            log.warning("GPU inventory failed: %s", error)
            self._inventory_problem = f"GPU inventory failed: {error}"

    def sample_once(self) -> Snapshot:
        """Take one sample and publish the snapshot. Never raises."""
        with self._sampling:  # the thread and an explicit caller (benchmarks, tests) may overlap
            return self._sample_locked()

    def _sample_locked(self) -> Snapshot:
        try:
            snapshot = self._sample()
        except Exception as error:  # a bug or an odd pod must not stop sampling
            log.exception("metrics sampling failed")
            self.failures += 1
            previous = self._snapshot
            snapshot = Snapshot(
                previous.node, previous.period, previous.taken_at, f"sampling failed: {error}",
                previous.cards, previous.topology, previous.topology_dict, previous.pods, previous.processes,
                previous.usage,
            )
        self._snapshot = snapshot
        self.samples_taken += 1  # attempts, failed ones included
        return snapshot

    def _sample(self) -> Snapshot:
        now = self._clock()
        self._refresh_inventory(now)
        failure: str | None = None
        sample = None
        if self._inventory_problem and not self._inventory:
            failure = self._inventory_problem
        else:
            try:
                sample = self.backend.sample()
            except Exception as error:
                failure = f"GPU sampling failed: {error}"
                self.failures += 1
        if sample is not None and _inventory_disagrees(sample, self._inventory):
            self._refresh_inventory(now, force=True)  # a card came, went, failed or recovered
        elif sample is not None and _slices_disagree(sample, self._inventory, self._slices_refreshed_for):
            # a MIG card is published unhealthy either way: its slices say when it changed (a slice
            # failed, the card was lost, or the admin made another layout); once per new state
            self._slices_refreshed_for = _sampled_slices(sample)
            self._refresh_inventory(now, force=True)
        pods = self._current_pods()
        previous = self._snapshot
        if sample is None:
            # keep the last known GPU numbers, re-derive occupancy from the fresh pod cache
            cards = self._card_views(pods, {v.card.index: v for v in previous.cards}, None)
            return Snapshot(self.node, self.period, previous.taken_at, failure, cards, self._topology,
                            self._topology_dict, pods, previous.processes, previous.usage, previous.slices)

        processes = self._attribute(sample.processes, pods)
        usage = _usage_by_container(processes)
        cards = self._card_views(pods, {}, sample)
        taken_at = float(getattr(sample, "taken_at", now) or now)
        self._record_history(pods, usage, taken_at)
        return Snapshot(self.node, self.period, taken_at, None, cards, self._topology, self._topology_dict,
                        pods, processes, usage, tuple(getattr(sample, "slices", ()) or ()))

    def _attribute(self, samples: Any, pods: PodIndex) -> tuple[ProcessView, ...]:
        seen = set()
        views = []
        for process in samples:
            pid = int(process.pid)
            seen.add(pid)
            if pid not in self._identities:
                self._identities[pid] = read_process_identity(self._proc_root, pid)
            identity, readable = self._identities[pid]
            pod, container = (None, None)
            if not readable:
                owner = "unreadable"
            elif identity is None:
                owner = "host"
            else:
                pod, container = pods.resolve(identity)
                owner = "unknown-pod" if pod is None else ("pod" if container is None else "container")
            views.append(
                ProcessView(pid, int(process.card_index), str(process.uuid), float(process.memory_used_mib),
                            float(process.utilization_percent), pod, container, owner)
            )
        for gone in self._identities.keys() - seen:  # a reused PID is re-read
            del self._identities[gone]
        # an unreadable cgroup file may appear a moment later (process just started)
        for view in views:
            if view.owner == "unreadable":
                self._identities.pop(view.pid, None)
        return tuple(views)

    def _card_views(self, pods: PodIndex, previous: Mapping[int, CardView], sample: Any) -> tuple[CardView, ...]:
        measured = {c.index: c for c in sample.cards} if sample is not None else {}
        cores: dict[int, int] = {}
        memory: dict[int, int] = {}
        holders: dict[int, list[ContainerKey]] = {}
        for holding in pods.holdings():
            index = holding.share.index
            cores[index] = cores.get(index, 0) + holding.share.cores
            memory[index] = memory.get(index, 0) + holding.memory_mib
            holders.setdefault(index, []).append(ContainerKey(holding.pod.uid, holding.container_index))
        views = []
        for card in self._inventory:
            healthy = bool(card.healthy)
            if card.index in measured:
                used: float | None = float(measured[card.index].memory_used_mib)
                util: float | None = float(measured[card.index].utilization_percent)
                healthy = healthy and bool(getattr(measured[card.index], "healthy", True))
            elif card.index in previous:
                used, util = previous[card.index].memory_used_mib, previous[card.index].utilization_percent
                healthy = healthy and previous[card.index].healthy
            else:
                used, util = None, None
            if getattr(card, "mig", False):
                util = None  # NVML has no whole-card utilisation in MIG mode: not available, never a made-up 0
            views.append(CardView(card, used, util, cores.get(card.index, 0), memory.get(card.index, 0),
                                  tuple(holders.get(card.index, ())), healthy))
        return tuple(views)

    def _record_history(self, pods: PodIndex, usage: Mapping[ContainerKey, ContainerUsage], t: float) -> None:
        keys = {ContainerKey(h.pod.uid, h.container_index) for h in pods.holdings()}
        with self._history_lock:
            for key in keys:
                ring = self._history.get(key)
                if ring is None:
                    ring = self._history[key] = UsageRing(self._history_len)
                used = usage.get(key)
                ring.append(t, used.memory_used_mib if used else math.nan, used.utilization_percent if used else math.nan)
            for gone in self._history.keys() - keys:  # the pod ended or gave its share back
                del self._history[gone]


def _cache_key(items: list[dict[str, Any]], generation: int) -> tuple[Any, ...] | None:
    """What identifies this state of the pod cache: every pod's (uid, resourceVersion), and the
    inventory generation; None for pods not from an API server (no way to tell changes)."""
    versions = []
    for pod in items:
        metadata = pod.get("metadata") or {}
        if metadata.get("resourceVersion") is None:
            return None
        versions.append((metadata.get("uid"), metadata["resourceVersion"]))
    return (tuple(versions), generation)


def _inventory_disagrees(sample: Any, inventory: list[Any]) -> bool:
    health = {card.uuid: bool(card.healthy) for card in inventory}
    if {card.uuid for card in sample.cards} != health.keys():
        return True
    return any(bool(getattr(card, "healthy", True)) != health[card.uuid] for card in sample.cards)


def _sampled_slices(sample: Any) -> dict[str, bool]:
    return {s.uuid: bool(getattr(s, "healthy", True)) for s in getattr(sample, "slices", ()) or ()}


def _slices_disagree(sample: Any, inventory: list[Any], refreshed_for: dict[str, bool] | None) -> bool:
    """The sampled MIG slices (UUIDs, health) differ from the inventory's, in a state not re-read for
    yet (a backend whose inventory never learns a slice's sampled fault is not re-read every period)."""
    sampled = _sampled_slices(sample)
    published = {s.uuid: bool(s.healthy) for card in inventory for s in getattr(card, "slices", ())}
    return sampled != published and sampled != refreshed_for


def _usage_by_container(processes: tuple[ProcessView, ...]) -> dict[ContainerKey, ContainerUsage]:
    per_card: dict[ContainerKey, dict[int, list[float]]] = {}
    pids: dict[ContainerKey, list[int]] = {}
    for process in processes:
        if process.pod is None or process.container_index is None:
            continue
        key = ContainerKey(process.pod.uid, process.container_index)
        totals = per_card.setdefault(key, {}).setdefault(process.card_index, [0.0, 0.0])
        totals[0] += process.memory_used_mib
        totals[1] += process.utilization_percent
        pids.setdefault(key, []).append(process.pid)
    usage = {}
    for key, cards in per_card.items():
        card_usage = tuple(
            CardUsage(index, memory, min(util, 100.0)) for index, (memory, util) in sorted(cards.items())
        )
        usage[key] = ContainerUsage(
            memory_used_mib=sum(c.memory_used_mib for c in card_usage),
            utilization_percent=sum(c.utilization_percent for c in card_usage),
            cards=card_usage,
            pids=tuple(sorted(set(pids[key]))),
        )
    return usage
