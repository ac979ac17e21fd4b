"""``core.placement.fgd_level`` for many nodes at once, with numpy (the filter's 10 ms budget).

The core's measure is the reference (property-tested equal, ``tests/extender``); this is
the same arithmetic over arrays. A card's free cores take 101 values, so what a typical
pod can use of a node is a sum of table lookups over its cards, and a share's effect on one card is a table lookup per distinct free value
among the cards it fits. ``NodeRows`` keeps every node's cards (and its CPU headroom, and a
rank of the names for the tie rule) as array rows, rewritten only when the ledger (or the
headroom) says a node changed: a filter over thousands of names is array operations. For pods of one container; the caller scores
anything else (several containers, MIG slices) with the core.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from jupyter_vgpu.core import fgd
from jupyter_vgpu.core.contract import CORES_PER_CARD, Request
from jupyter_vgpu.core.fragment import Mix, Shape

_VALUES = np.arange(CORES_PER_CARD + 1)


@dataclass(frozen=True)
class BatchNode:
    """What the measure reads of one node: each healthy card's free cores and memory units
    and whether it is wholly free, the CPU headroom (None: unknown) and the labels."""

    free_cores: tuple[int, ...]
    free_memory: tuple[int, ...]
    whole_free: tuple[bool, ...]
    cpu_milli: int | None
    labels: frozenset[str]


class MixArrays:
    """A mix snapshot as arrays and per-value tables, with each label set's admitted pods."""

    def __init__(self, mix: Mix, blend: float = fgd.FGD_BLEND) -> None:
        shapes = [shape for shape, _ in mix.shapes]
        self.mix = mix
        self.blend = blend
        self.weight = np.array([w for _, w in mix.shapes], dtype=float)
        self.need = np.array([CORES_PER_CARD if s.whole else s.cores for s in shapes], dtype=np.int64)
        self.cards = np.array([s.cards if s.whole else 1 for s in shapes], dtype=np.int64)
        self.cpu = np.array([s.cpu_milli for s in shapes], dtype=np.int64)
        self.per_copy = np.array([s.cards * CORES_PER_CARD if s.whole else s.cores for s in shapes], dtype=float)
        # per free value v (0-100) and typical pod: whether a card with v free fits it, and v if so
        self.fits = (_VALUES[:, None] >= self.need[None, :]).astype(float)
        self.usable = self.fits * _VALUES[:, None]
        self.fits_by_pod = np.ascontiguousarray(self.fits.T)  # [T, 101]: typical pods first
        self.fits_and_usable = np.concatenate([self.fits, self.usable], axis=1)  # [101, 2T]
        self.usable_by_pod = np.ascontiguousarray(self.usable.T)
        self._asks = self.cpu > 0
        self._asking = bool(self._asks.any())
        self._shapes = shapes
        self._relevant = frozenset(item for s in shapes for item in s.selector)
        self._admitted: dict[frozenset[str], np.ndarray] = {}

    @property
    def reads_labels(self) -> bool:
        """Whether some typical pod has a node selector (else every node admits every typical pod)."""
        return bool(self._relevant)

    def admit_all(self, rows: int) -> np.ndarray:
        """``admitted`` of ``rows`` nodes when no typical pod has a node selector."""
        return np.ones((rows, len(self._shapes)), dtype=bool)

    def admitted(self, labels: Iterable[frozenset[str]]) -> np.ndarray:
        """[K, T]: which typical pods each node's labels admit."""
        label_sets = list(labels)
        if not self._relevant:
            return self.admit_all(len(label_sets))
        rows = []
        for node_labels in label_sets:
            key = node_labels & self._relevant
            row = self._admitted.get(key)
            if row is None:
                row = self._admitted[key] = np.array([fgd.admits(key, s) for s in self._shapes], dtype=bool)
            rows.append(row)
        return np.stack(rows) if rows else np.zeros((0, len(self._shapes)), dtype=bool)

    def fragment(self, total: np.ndarray, count: np.ndarray, fitting: np.ndarray, cpu: np.ndarray,
                 admitted: np.ndarray) -> np.ndarray:
        """Expected fragment (cores) [K]; ``count``/``fitting``: per typical pod, how many cards fit it
        and their free cores [K, T]; ``total`` free cores [K]; ``cpu`` headroom [K] (NaN: unknown)."""
        return self.capped_fragment(total, count.T, fitting.T, admitted.T, self.caps(cpu, fitting))

    def caps(self, cpu: np.ndarray, fitting: np.ndarray) -> Caps | None:
        """The CPU caps of the rows [K] whose headroom (NaN: unknown) may bind; None when none may.
        ``fitting`` [K, T]: the fitting cores the bound is taken at (the caller may pass more than
        it scores, never less). The same for every card value of a row, so the caller computes
        them per row, not per (row, card value)."""
        known = ~np.isnan(cpu)
        if not self._asking or not known.any():
            return None
        # a row binds below the CPU of as many copies of some typical pod as its fitting cores
        # hold (at least one); at or above it, min(fitting, copies x per copy) = fitting and
        # copies >= 1 for every typical pod, as without CPU (integers: floor's test exactly)
        need = np.maximum(np.ceil(fitting[:, self._asks] / self.per_copy[self._asks]), 1)
        rows = np.flatnonzero(known & ~(cpu >= (need * self.cpu[self._asks]).max(-1)))
        if not len(rows):
            return None
        copies = np.floor(np.where(self._asks, np.maximum(cpu[rows], 0)[:, None] / np.maximum(self.cpu, 1), np.inf))
        return Caps(rows, copies * self.per_copy, copies >= 1)

    def capped_fragment(self, total: np.ndarray, count: np.ndarray, fitting: np.ndarray,
                        admitted: np.ndarray | None, caps: Caps | None) -> np.ndarray:
        """``fragment`` [N] with ``caps`` given, typical pods first: ``count``/``fitting``/``admitted``
        [T, N] (``admitted`` None: every typical pod everywhere), ``total`` [N]: ``weigh`` of
        ``capped_left``."""
        return self.weigh(self.capped_left(total, count, fitting, admitted, caps))

    def capped_left(self, total: np.ndarray, count: np.ndarray, fitting: np.ndarray,
                    admitted: np.ndarray | None, caps: Caps | None) -> np.ndarray:
        """[T, N]: the cores each typical pod could not use, unweighted (``capped_fragment`` before
        ``weigh``). A typical pod uses min(fitting, cap) of the cores of the capped rows (and none
        without one copy's CPU), its fitting cores elsewhere. Each typical pod's N values are one
        contiguous run (a long inner loop per operation, not T = 5 values per row), and each
        depends on that typical pod alone (its caps too: a row outside ``caps`` has
        min(fitting, cap) = fitting for every typical pod), so a column is the same whatever
        the other typical pods of the mix."""
        use = (1 - self.blend) * fitting
        use += self.blend * fitting  # (1 - blend) x fitting + blend x fitting, element by element
        ok = count >= self.cards[:, None]
        if admitted is not None:
            ok &= admitted
        if caps is not None:  # the same expression on the rows whose CPU may bind, gathered
            fit = fitting[:, caps.rows]
            use[:, caps.rows] = (1 - self.blend) * np.minimum(fit, caps.cap.T) + self.blend * fit
            ok[:, caps.rows] &= caps.one.T
        left = np.subtract(total, use, out=use)
        np.copyto(left, total, where=~ok)  # where(ok, total - use, total): total broadcast
        return left

    def weigh(self, left: np.ndarray) -> np.ndarray:
        """[N, ...]: ``left`` [T, N, ...] (consumed) times each typical pod's weight, summed over the
        typical pods in numpy's own order for a sum over T (``pairwise_sum``): the same numbers as
        the [N, T] layout's ``sum(-1)``, element by element."""
        left *= self.weight.reshape((-1,) + (1,) * (left.ndim - 1))
        return np.asarray(pairwise_sum(list(left))) if len(left) else np.zeros(left.shape[1:])


_BLOCK = 128  # numpy's PW_BLOCKSIZE


def pairwise_sum(terms: Sequence[Any], start: int = 0, count: int | None = None) -> Any:
    """``np.add.reduce`` over float64 ``terms`` in numpy's order (``pairwise_sum`` in its loops:
    fewer than 8 in a row, else 8 running sums, blocks over 128 split in two), of floats or
    element by element of equal arrays (the sum over the typical pods of many rows at once)."""
    n = len(terms) - start if count is None else count
    if n < 8:
        total: Any = 0.0
        for i in range(start, start + n):
            total = total + terms[i]
        return total
    if n <= _BLOCK:
        r = list(terms[start:start + 8])
        i = 8
        whole = n - n % 8
        while i < whole:
            at = start + i
            r = [r[j] + terms[at + j] for j in range(8)]
            i += 8
        total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        while i < n:
            total = total + terms[start + i]
            i += 1
        return total
    half = n // 2
    half -= half % 8
    return pairwise_sum(terms, start, half) + pairwise_sum(terms, start + half, n - half)


@dataclass(frozen=True)
class Caps:
    """Per row that may bind (``rows``, indices) and typical pod: the cores as many copies as its
    CPU headroom holds can use (inf where the typical pod asks no CPU), whether one copy fits."""

    rows: np.ndarray
    cap: np.ndarray
    one: np.ndarray

    def repeated(self, each: np.ndarray) -> Caps:
        """The caps of each row's ``each`` consecutive entries (a row's card values, in row order)."""
        start = np.cumsum(each) - each
        count = each[self.rows]
        entries = np.repeat(start[self.rows], count) + (np.arange(count.sum()) - np.repeat(np.cumsum(count) - count,
                                                                                              count))
        return Caps(entries, np.repeat(self.cap, count, axis=0), np.repeat(self.one, count, axis=0))


def counts_of(free: np.ndarray, arrays: MixArrays) -> tuple[np.ndarray, np.ndarray]:
    """Per node and typical pod [K, T]: how many cards fit it, and their free cores."""
    width = len(arrays.weight)
    cards = np.clip(free, 0, CORES_PER_CARD).T.copy()  # [G, K]: each card position one run
    if not len(cards):
        return np.zeros((free.shape[0], width)), np.zeros((free.shape[0], width))
    # both tables' rows of each card, card by card, summed (integer-valued: exact in any order;
    # no BLAS: its threads only contend on a busy node)
    both = np.take(arrays.fits_and_usable, cards[0], axis=0)
    for card in cards[1:]:
        both += np.take(arrays.fits_and_usable, card, axis=0)
    return both[:, :width], both[:, width:]


@dataclass(frozen=True)
class FallParts:
    """``falls_of`` before the weights: per typical pod [T, ...] the cores it could not use of
    each row before the pod (``before`` [T, K]) and after it (``after`` [T, E]: a share's entries
    are each row's distinct free values among the cards it fits, row by row, ``each`` [K] of
    them; a whole-card request's one per row, ``each`` None), and whether the pod fits
    (``fit`` [K]). The weights only enter in ``MixArrays.weigh``."""

    before: np.ndarray
    after: np.ndarray
    each: np.ndarray | None
    fit: np.ndarray

    def falls(self, arrays: MixArrays) -> np.ndarray:
        """The fall [K] of each row under ``arrays``' weights (0 where the pod does not fit);
        consumes ``before`` and ``after``."""
        before = arrays.weigh(self.before)
        after_each = arrays.weigh(self.after)
        if self.each is None:
            after = after_each
        else:
            after = np.full(len(self.fit), np.inf)
            placed = self.each > 0
            if placed.any():
                after[placed] = np.minimum.reduceat(after_each, (np.cumsum(self.each) - self.each)[placed])
        return np.where(self.fit, before - np.where(self.fit, after, before), 0.0)


def fall_parts(free: np.ndarray, memory: np.ndarray, whole: np.ndarray, cpu: np.ndarray, admitted: np.ndarray | None,
               request: Request, pod_cpu_milli: int, arrays: MixArrays,
               counts: tuple[np.ndarray, np.ndarray] | None = None) -> FallParts:
    """``falls_of``'s numbers before the weights, for a mix that is not empty; ``admitted``
    [K, T] or None (every typical pod everywhere)."""
    cores = np.clip(free, 0, CORES_PER_CARD)
    count, fitting = counts if counts is not None else counts_of(free, arrays)  # [K, T]
    total = cores.sum(1).astype(float)
    everyone = None if admitted is None or admitted.all() else np.ascontiguousarray(admitted.T)
    by_pod = np.ascontiguousarray(count.T), np.ascontiguousarray(fitting.T)  # [T, K], each pod one run
    before = arrays.capped_left(total, *by_pod, everyone, arrays.caps(cpu, fitting))
    # the node's CPU once the pod is on it; the pod only takes fitting cores, so the bound is
    # taken at the row's fitting cores before it
    caps = arrays.caps(cpu - pod_cpu_milli, fitting)
    if request.is_share:
        c, u = request.cores, request.memory_units
        ok = (free >= c) & (memory >= u)
        fit = ok.any(1)
        # each node's distinct free values among the cards the share fits: same value, same fragment
        values = np.sort(np.where(ok, cores, -1), axis=1)
        first = np.ones(values.shape, dtype=bool)
        first[:, 1:] = values[:, 1:] != values[:, :-1]
        first &= values >= 0
        v = values[first]  # row by row, so each node's values are consecutive: repeat, not gather
        each = first.sum(1)
        # what taking c cores off a card with v free changes, per typical pod and v (integer-valued: exact)
        shifted = np.maximum(_VALUES - c, 0)
        fits_change = arrays.fits_by_pod[:, shifted] - arrays.fits_by_pod
        usable_change = arrays.usable_by_pod[:, shifted] - arrays.usable_by_pod
        # [T, E] per (row, value) entry, typical pods first
        moved_count = np.repeat(by_pod[0], each, axis=1)
        moved_count += np.take(fits_change, v, axis=1)
        moved_fitting = np.repeat(by_pod[1], each, axis=1)
        moved_fitting += np.take(usable_change, v, axis=1)
        after = arrays.capped_left(np.repeat(total, each) - c, moved_count, moved_fitting,
                                   None if everyone is None else np.repeat(everyone, each, axis=1),
                                   None if caps is None else caps.repeated(each))
        return FallParts(before, after, each, fit)
    n = request.cards
    taken = float(n * CORES_PER_CARD)  # whole free cards fit every typical pod
    after = arrays.capped_left(total - taken, by_pod[0] - n, by_pod[1] - taken, everyone, caps)
    return FallParts(before, after, None, whole.sum(1) >= n)


def falls_of(free: np.ndarray, memory: np.ndarray, whole: np.ndarray, cpu: np.ndarray, admitted: np.ndarray,
             request: Request, pod_cpu_milli: int, arrays: MixArrays,
             counts: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(fall [K] float, fits [K] bool): ``levels_of`` before the level, the fragment each node's
    placement of the pod removes (0 where it does not fit)."""
    k = free.shape[0]
    if not arrays.mix.shapes:  # nothing learned yet: the pod's own shape, as FragmentView.mix_for
        own = Shape.of_pod({0: request}, pod_cpu_milli)
        arrays = MixArrays(Mix(((own, 1.0),)) if own is not None else Mix(), arrays.blend)
        admitted = np.ones((k, len(arrays.weight)), dtype=bool)
        counts = None
    parts = fall_parts(free, memory, whole, cpu, admitted, request, pod_cpu_milli, arrays, counts)
    return parts.falls(arrays), np.asarray(parts.fit)


def levels_of(free: np.ndarray, memory: np.ndarray, whole: np.ndarray, cpu: np.ndarray, admitted: np.ndarray,
              request: Request, pod_cpu_milli: int, arrays: MixArrays,
              counts: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(level [K] int, fits [K] bool) for a pod of one container asking ``request``.

    ``free``/``memory`` [K, G]: each healthy card's free cores and memory units (-1: no card),
    ``whole`` [K, G]: the card is wholly free, ``cpu`` [K]: CPU headroom (NaN: unknown),
    ``admitted`` [K, T]: ``arrays.admitted`` of the nodes' labels; ``counts``: ``counts_of``
    (the same for every request, so the caller may keep it per mix snapshot)."""
    fall, fit = falls_of(free, memory, whole, cpu, admitted, request, pod_cpu_milli, arrays, counts)
    return level_of_fall(fall), fit


def level_of_fall(fall: np.ndarray) -> np.ndarray:
    """The level [K] int of each fragment fall, numpy's ``exp`` for every path (``math.exp`` is
    not numpy's SIMD ``exp``: they differ in the last bit for some values)."""
    return (100 / (1 + np.exp(-fall / CORES_PER_CARD))).astype(int)


def levels(nodes: Sequence[BatchNode], request: Request, pod_cpu_milli: int, arrays: MixArrays) -> list[int | None]:
    """Each node's ``fgd_level`` (None: the pod does not fit), from node descriptions."""
    if not nodes:
        return []
    rows = NodeRows()
    for i, node in enumerate(nodes):
        rows.set(str(i), node.free_cores, node.free_memory, node.whole_free)
    index = rows.take([str(i) for i in range(len(nodes))])
    cpu = np.array([np.nan if n.cpu_milli is None else n.cpu_milli for n in nodes], dtype=float)
    level, fit = levels_of(rows.free[index], rows.memory[index], rows.whole[index], cpu,
                           arrays.admitted(n.labels for n in nodes), request, pod_cpu_milli, arrays)
    return [int(s) if f else None for s, f in zip(level.tolist(), fit.tolist(), strict=True)]


class NodeRows:
    """Every node's healthy cards as rows of growing arrays (free cores, free memory, wholly free),
    and whether the node places pods as without MIG (``plain``: the batch may score it)."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        # room for one row from the start: the last row is always a spare one (``usable``)
        self.free = np.full((1, 1), -1, dtype=np.int64)
        self.memory = np.full((1, 1), -1, dtype=np.int64)
        self.whole = np.zeros((1, 1), dtype=bool)
        self.plain = np.zeros(1, dtype=bool)
        self.generation = np.zeros(1, dtype=np.int64)  # bumped at every rewrite of the row
        self.cpu = np.full(1, np.nan)  # the node's CPU headroom (NaN: unknown), kept by the caller
        self.stamp = np.zeros(1, dtype=np.int64)  # bumped at every rewrite and every CPU headroom change
        self.names: list[str] = []  # row -> name
        # row -> its cards (free cores, memory, wholly free) and CPU headroom as Python values: the
        # few rows a filter re-scores are read from here, without array calls (cold caches)
        self.cards: list[tuple[list[int], list[int], list[bool]]] = []
        self.cpus: list[float] = []
        self._rank = np.zeros(0, dtype=np.int64)

    def set(self, name: str, free: Sequence[int], memory: Sequence[int], whole: Sequence[bool],
            plain: bool = True) -> None:
        row = self.index.get(name)
        if row is None:
            row = self.index[name] = len(self.index)
            self.names.append(name)
            self.cards.append(([], [], []))
            self.cpus.append(math.nan)
        self.cards[row] = ([int(v) for v in free], [int(v) for v in memory], [bool(v) for v in whole])
        rows, width = self.free.shape
        if row + 1 >= rows or len(free) > width:  # a spare row always: ``plain[-1]`` is False (``usable``)
            grow_rows, grow_width = max(rows, 2 * row + 16), max(width, len(free))
            self.free = _grown(self.free, grow_rows, grow_width, -1)
            self.memory = _grown(self.memory, grow_rows, grow_width, -1)
            self.whole = _grown(self.whole, grow_rows, grow_width, False)
            plains = np.zeros(grow_rows, dtype=bool)
            plains[:len(self.plain)] = self.plain
            self.plain = plains
            generations = np.zeros(grow_rows, dtype=np.int64)
            generations[:len(self.generation)] = self.generation
            self.generation = generations
            cpus = np.full(grow_rows, np.nan)
            cpus[:len(self.cpu)] = self.cpu
            self.cpu = cpus
            stamps = np.zeros(grow_rows, dtype=np.int64)
            stamps[:len(self.stamp)] = self.stamp
            self.stamp = stamps
        self.free[row] = -1
        self.memory[row] = -1
        self.whole[row] = False
        self.free[row, :len(free)] = free
        self.memory[row, :len(memory)] = memory
        self.whole[row, :len(whole)] = whole
        self.plain[row] = plain
        self.generation[row] += 1
        self.stamp[row] += 1

    def set_cpu(self, row: int, cpu: float) -> bool:
        """The row's CPU headroom (NaN: unknown); the stamp moves only when it changed (True)."""
        old = float(self.cpu[row])
        if old != cpu and not (math.isnan(old) and math.isnan(cpu)):
            self.cpu[row] = cpu
            self.cpus[row] = float(self.cpu[row])
            self.stamp[row] += 1
            return True
        return False

    def usable(self, index: np.ndarray) -> np.ndarray:
        """Whether each row of ``index`` (-1: none) may be scored by the batch: one gather, as
        the last row is always a spare one, not plain (``set``)."""
        usable: np.ndarray = self.plain[index]
        return usable

    def rows_as_lists(self, rows: Sequence[int]) -> tuple[list[list[int]], list[list[int]], list[list[bool]], list[float]]:
        """``free[rows]``, ``memory[rows]``, ``whole[rows]`` and ``cpu[rows]`` as ``tolist`` gives them
        (padded to the arrays' width as their rows are), read from the Python copies."""
        width = self.free.shape[1]
        frees, memories, wholes = [], [], []
        for row in rows:
            free, memory, whole = self.cards[row]
            pad = width - len(free)
            frees.append(free + [-1] * pad)
            memories.append(memory + [-1] * pad)
            wholes.append(whole + [False] * pad)
        return frees, memories, wholes, [self.cpus[row] for row in rows]

    def take(self, names: Sequence[str]) -> np.ndarray:
        return np.array([self.index[name] for name in names], dtype=np.int64)

    def ranks(self) -> np.ndarray:
        """Each row's place among the names in Python's str order, ranked again when rows were added
        (its length tells which rows it ranked)."""
        if len(self._rank) != len(self.names):
            rank = np.empty(len(self.names), dtype=np.int64)
            rank[sorted(range(len(self.names)), key=self.names.__getitem__)] = np.arange(len(self.names))
            self._rank = rank
        return self._rank


class CountMemo:
    """``counts_of`` per node row for one mix snapshot, with the row's generation."""

    def __init__(self, arrays: MixArrays) -> None:
        self.arrays = arrays
        width = len(arrays.weight)
        self.count = np.zeros((0, width))
        self.fitting = np.zeros((0, width))
        self.generation = np.full(0, -1, dtype=np.int64)

    def of(self, rows: NodeRows, picked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        size = len(rows.generation)
        if size > len(self.generation):
            grow = size - len(self.generation)
            self.count = np.concatenate([self.count, np.zeros((grow, self.count.shape[1]))])
            self.fitting = np.concatenate([self.fitting, np.zeros((grow, self.fitting.shape[1]))])
            self.generation = np.concatenate([self.generation, np.full(grow, -1, dtype=np.int64)])
        generation = rows.generation[picked]
        changed = picked[self.generation[picked] != generation]
        if len(changed):
            self.count[changed], self.fitting[changed] = counts_of(rows.free[changed], self.arrays)
            self.generation[changed] = rows.generation[changed]
        return self.count[picked], self.fitting[picked]


class _Column:
    """One typical pod's unweighted numbers per row for one request: before the pod [R], after
    it [W, R] (a share's entries by position, a whole-card request's in position 0; positions
    first, so the minimum over them is W long runs), and the row's ``NodeRows.stamp`` they were
    computed at (-1: never)."""

    def __init__(self, size: int, width: int) -> None:
        self.stamp = np.full(size, -1, dtype=np.int64)
        self.before = np.zeros(size)
        self.after = np.zeros((width, size))

    def grow(self, size: int, width: int) -> None:
        rows = size - len(self.stamp)
        if rows:
            self.stamp = np.concatenate([self.stamp, np.full(rows, -1, dtype=np.int64)])
            self.before = np.concatenate([self.before, np.zeros(rows)])
        self.after = _grown(self.after, width, size, 0.0)


class _Request:
    """``RequestColumns`` of one request: each typical pod's ``_Column``, and per row which
    positions hold an entry (as many positions as the most entries of a row so far) and whether
    the pod fits, with the stamp they were computed at."""

    def __init__(self, size: int) -> None:
        self.width = 1
        self.stamp = np.full(size, -1, dtype=np.int64)
        self.valid = np.zeros((1, size), dtype=bool)  # positions first, as the columns
        self.fit = np.zeros(size, dtype=bool)
        self.columns: dict[Shape, _Column] = {}

    def grow(self, size: int, width: int) -> None:
        rows = size - len(self.stamp)
        if rows:
            self.stamp = np.concatenate([self.stamp, np.full(rows, -1, dtype=np.int64)])
            self.fit = np.concatenate([self.fit, np.zeros(rows, dtype=bool)])
        self.valid = _grown(self.valid, width, size, False)
        self.width = width
        for column in self.columns.values():
            column.grow(size, width)

    def store(self, at: np.ndarray, stamp: np.ndarray, shapes: Sequence[Shape], parts: FallParts,
              layout: bool) -> None:
        """``parts`` of the rows ``at`` (computed at ``stamp``) for ``shapes``, in their order;
        ``layout``: also the rows' entry positions and fit (the same for every typical pod)."""
        if parts.each is None:
            rows, position = at, np.zeros(len(at), dtype=np.int64)
        else:
            start = np.cumsum(parts.each) - parts.each
            rows = np.repeat(at, parts.each)
            position = np.arange(len(rows)) - np.repeat(start, parts.each)
            widest = int(parts.each.max(initial=1))
            if widest > self.width:
                self.grow(len(self.stamp), widest)
        flat = position * len(self.stamp) + rows  # into [W, R] arrays, C order
        if layout:
            self.valid[:, at] = False
            np.put(self.valid, flat, True)
            self.fit[at] = parts.fit
            self.stamp[at] = stamp
        for t, shape in enumerate(shapes):
            column = self.columns.get(shape)
            if column is None:
                column = self.columns[shape] = _Column(len(self.stamp), self.width)
            column.before[at] = parts.before[t]
            np.put(column.after, flat, parts.after[t])
            column.stamp[at] = stamp

    def weighed(self, picked: np.ndarray, shapes: Sequence[Shape], arrays: MixArrays
                ) -> tuple[np.ndarray, np.ndarray]:
        """(before, after) [len(picked)] under ``arrays``' weights, every picked row's columns current.
        Over most rows the columns are copied whole and the picked rows read from the results
        (a copy costs less than a gather); over a few they are gathered."""
        span = int(picked.max()) + 1 if len(picked) else 0
        whole = 2 * len(picked) >= span
        size = span if whole else len(picked)
        before = np.empty((len(shapes), size))
        after = np.empty((len(shapes), self.width, size))
        for t, shape in enumerate(shapes):
            column = self.columns[shape]
            if whole:
                before[t] = column.before[:span]
                after[t] = column.after[:, :span]
            else:
                np.take(column.before, picked, out=before[t])
                np.take(column.after, picked, axis=1, out=after[t])
        before = arrays.weigh(before)
        after = arrays.weigh(after)
        np.copyto(after, np.inf, where=~(self.valid[:, :span] if whole else np.take(self.valid, picked, axis=1)))
        after = np.minimum.reduce(after) if len(after) > 1 else after[0]  # [size]: the least entry of each row
        if whole:
            return before[picked], after[picked]
        return before, after


# request columns kept (a few request shapes; each ~2 MB at 5,000 rows, 8 cards, 5 typical pods)
_REQUESTS_KEPT = 8
# typical pods kept per request beyond the snapshot's (a shape that leaves the mix and returns)
_SHAPES_SPARE = 8


class RequestColumns:
    """fgd-filter's levels per request, kept across mix snapshots: per request (``key``) and
    typical pod, each row's unweighted numbers (``FallParts``), with the row's stamp.

    A snapshot that moves changes the weights (and perhaps some typical pods), not what each
    typical pod could use of a row: a row whose columns were computed at its current stamp is
    scored for the new snapshot by weighing them (``MixArrays.weigh``: the same operations, in
    the same order, as the batch's; so the same levels), not by the whole batch. Rows changed
    since go through the batch for every typical pod; a typical pod new to the request through
    the batch for that typical pod alone (a column depends on its own typical pod only)."""

    def __init__(self) -> None:
        self._requests: OrderedDict[Hashable, _Request] = OrderedDict()

    def levels(self, key: Hashable, rows: NodeRows, picked: np.ndarray, admitted: np.ndarray | None,
               request: Request, pod_cpu_milli: int, arrays: MixArrays,
               counts: CountMemo) -> tuple[np.ndarray, np.ndarray]:
        """``levels_of`` of the ``picked`` rows at their CPU headroom (``rows.cpu``); ``admitted``
        [len(picked), T] (None: every typical pod everywhere); ``counts`` for ``arrays``; ``key``:
        what the levels depend on besides the rows' stamps and the mix: the request, the pod's
        CPU and the version of the nodes' labels (a label change keeps the stamps)."""
        fall, fit = self.falls(key, rows, picked, admitted, request, pod_cpu_milli, arrays, counts)
        return level_of_fall(fall), fit

    def falls(self, key: Hashable, rows: NodeRows, picked: np.ndarray, admitted: np.ndarray | None,
              request: Request, pod_cpu_milli: int, arrays: MixArrays,
              counts: CountMemo) -> tuple[np.ndarray, np.ndarray]:
        """``falls_of`` of the ``picked`` rows (see ``levels``), the same numbers bit for bit."""
        shapes = arrays._shapes
        if not shapes:  # nothing learned yet: the batch's own stand-in mix
            return falls_of(rows.free[picked], rows.memory[picked], rows.whole[picked], rows.cpu[picked],
                            arrays.admit_all(len(picked)) if admitted is None else admitted,
                            request, pod_cpu_milli, arrays)
        kept = self._request((key, arrays.blend), len(rows.stamp))
        stamp = rows.stamp[picked]
        current = kept.stamp[picked] == stamp
        new = [t for t, shape in enumerate(shapes) if shape not in kept.columns]
        for shape in shapes:
            column = kept.columns.get(shape)
            if column is not None:
                current &= column.stamp[picked] == stamp
        stale = np.flatnonzero(~current)
        if len(stale):  # rows changed since (or never seen): every typical pod, through the batch
            at = picked[stale]
            count, fitting = counts.of(rows, at)
            parts = fall_parts(rows.free[at], rows.memory[at], rows.whole[at], rows.cpu[at],
                               None if admitted is None else admitted[stale], request, pod_cpu_milli, arrays,
                               (count, fitting))
            kept.store(at, stamp[stale], shapes, parts, True)
        if new and len(stale) < len(picked):  # the other rows: the new typical pods alone
            at, fresh = picked[current], np.asarray(new)
            alone = MixArrays(Mix(tuple((shapes[t], 1.0) for t in new)), arrays.blend)
            parts = fall_parts(rows.free[at], rows.memory[at], rows.whole[at], rows.cpu[at],
                               None if admitted is None else admitted[current][:, fresh], request, pod_cpu_milli,
                               alone)
            kept.store(at, stamp[current], [shapes[t] for t in new], parts, False)
        if len(kept.columns) > len(shapes) + _SHAPES_SPARE:
            for shape in set(kept.columns) - set(shapes):
                del kept.columns[shape]
        # every picked row's columns are current: weigh them as the batch does
        before, after = kept.weighed(picked, shapes, arrays)
        fit = kept.fit[picked]
        return np.where(fit, before - np.where(fit, after, before), 0.0), fit

    def _request(self, key: Hashable, size: int) -> _Request:
        kept = self._requests.get(key)
        if kept is None:
            kept = self._requests[key] = _Request(size)
            while len(self._requests) > _REQUESTS_KEPT:
                self._requests.popitem(last=False)
        else:
            self._requests.move_to_end(key)
            if size > len(kept.stamp):
                kept.grow(size, kept.width)
        return kept


class LevelMemo:
    """Levels computed for one (request, pod CPU, mix snapshot), per node row, each kept joined
    with the row's rank by name (``keyed``: the level above, the rank's complement below), so
    the best row of many, the first by name among equals, is one gather and one ``argmax``.
    ``STALE`` (above every key) where the level is not known: not computed yet, or the row or
    its CPU headroom changed since (``forget``, told by whoever changes the row)."""

    STALE = np.iinfo(np.int64).max
    _SHIFT = 32  # rank bits: fewer than 2**32 rows

    def __init__(self) -> None:
        self.level = np.zeros(0, dtype=np.int64)
        self.keyed = np.full(0, self.STALE, dtype=np.int64)
        self._ranked = 0  # how many rows the ranks the keys were joined with had

    def reserve(self, size: int, rank: np.ndarray) -> None:
        """Room for ``size`` rows, and the kept keys joined again when ``rank`` ranked more rows
        (adding rows moves the ranks of others)."""
        if size > len(self.level):
            grow = max(size, 2 * len(self.level)) - len(self.level)
            self.level = np.concatenate([self.level, np.zeros(grow, dtype=np.int64)])
            self.keyed = np.concatenate([self.keyed, np.full(grow, self.STALE, dtype=np.int64)])
        if len(rank) != self._ranked:
            known = np.flatnonzero(self.keyed != self.STALE)
            self.keyed[known] = self._keys(self.level[known], rank[known])
            self._ranked = len(rank)

    def store(self, rows: np.ndarray, level: np.ndarray, rank: np.ndarray) -> None:
        self.level[rows] = level
        self.keyed[rows] = self._keys(level, rank[rows])

    def store_few(self, rows: Sequence[int], level: Sequence[int], rank: np.ndarray) -> None:
        """``store`` of a few rows, element by element (no array calls)."""
        for row, value in zip(rows, level, strict=True):
            self.level[row] = value
            self.keyed[row] = value * (1 << self._SHIFT) + ((1 << self._SHIFT) - 1 - int(rank[row]))

    def forget(self, row: int) -> None:
        if row < len(self.keyed):
            self.keyed[row] = self.STALE

    @classmethod
    def level_of(cls, key: int) -> int:
        return key >> cls._SHIFT

    @classmethod
    def _keys(cls, level: np.ndarray, rank: np.ndarray) -> np.ndarray:
        keys: np.ndarray = level * (1 << cls._SHIFT) + ((1 << cls._SHIFT) - 1 - rank)
        return keys


def _grown(array: np.ndarray, rows: int, width: int, fill: object) -> np.ndarray:
    out = np.full((rows, width), fill, dtype=array.dtype)
    out[:array.shape[0], :array.shape[1]] = array
    return out
