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
from collections.abc import Iterable, Sequence
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
        [T, N] (``admitted`` None: every typical pod everywhere), ``total`` [N]. A typical pod uses
        min(fitting, cap) of the cores of the capped rows (and none without one copy's CPU), its
        fitting cores elsewhere. Each typical pod's N values are one contiguous run (a long inner
        loop per operation, not T = 5 values per row), and the sum over the typical pods adds
        those runs in numpy's own order for a sum over T (``pairwise_sum``): the same numbers as
        the [N, T] layout's ``sum(-1)``."""
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
        left *= self.weight[:, None]
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


def fragment_before(free: np.ndarray, cpu: np.ndarray, admitted: np.ndarray | None, arrays: MixArrays,
                    counts: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Each row's fragment [K] before any pod, as ``falls_of`` computes it (row by row: the same
    numbers for a row whatever the others); ``admitted`` [K, T] or None (every typical pod)."""
    count, fitting = counts
    total = np.clip(free, 0, CORES_PER_CARD).sum(1).astype(float)
    return arrays.capped_fragment(total, np.ascontiguousarray(count.T), np.ascontiguousarray(fitting.T),
                                  None if admitted is None else np.ascontiguousarray(admitted.T),
                                  arrays.caps(cpu, fitting))


def falls_of(free: np.ndarray, memory: np.ndarray, whole: np.ndarray, cpu: np.ndarray, admitted: np.ndarray,
             request: Request, pod_cpu_milli: int, arrays: MixArrays,
             counts: tuple[np.ndarray, np.ndarray] | None = None,
             before: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(fall [K] float, fits [K] bool): ``levels_of`` before the level, the fragment each node's
    placement of the pod removes (0 where it does not fit). ``before``: ``fragment_before`` of the
    rows with ``counts`` (the same for every request, so the caller may keep it per snapshot)."""
    k = free.shape[0]
    if not arrays.mix.shapes:  # nothing learned yet: the pod's own shape, as FragmentView.mix_for
        own = Shape.of_pod({0: request}, pod_cpu_milli)
        arrays = MixArrays(Mix(((own, 1.0),)) if own is not None else Mix(), arrays.blend)
        admitted = np.ones((k, len(arrays.weight)), dtype=bool)
        counts = None
        before = None
    cores = np.clip(free, 0, CORES_PER_CARD)
    count, fitting = counts if counts is not None else counts_of(free, arrays)  # [K, T]
    total = cores.sum(1).astype(float)
    everyone = None if admitted.all() else np.ascontiguousarray(admitted.T)  # None: no pass per entry
    by_pod = np.ascontiguousarray(count.T), np.ascontiguousarray(fitting.T)  # [T, K], each pod one run
    if before is None:
        before = arrays.capped_fragment(total, *by_pod, everyone, arrays.caps(cpu, fitting))
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
        after_each = arrays.capped_fragment(np.repeat(total, each) - c, moved_count, moved_fitting,
                                            None if everyone is None else np.repeat(everyone, each, axis=1),
                                            None if caps is None else caps.repeated(each))
        after = np.full(k, np.inf)
        placed = each > 0
        if placed.any():
            after[placed] = np.minimum.reduceat(after_each, (np.cumsum(each) - each)[placed])
    else:
        n = request.cards
        fit = whole.sum(1) >= n
        taken = float(n * CORES_PER_CARD)  # whole free cards fit every typical pod
        after = arrays.capped_fragment(total - taken, by_pod[0] - n, by_pod[1] - taken, everyone, caps)
    return np.where(fit, before - np.where(fit, after, before), 0.0), np.asarray(fit)


def levels_of(free: np.ndarray, memory: np.ndarray, whole: np.ndarray, cpu: np.ndarray, admitted: np.ndarray,
              request: Request, pod_cpu_milli: int, arrays: MixArrays,
              counts: tuple[np.ndarray, np.ndarray] | None = None,
              before: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(level [K] int, fits [K] bool) for a pod of one container asking ``request``.

    ``free``/``memory`` [K, G]: each healthy card's free cores and memory units (-1: no card),
    ``whole`` [K, G]: the card is wholly free, ``cpu`` [K]: CPU headroom (NaN: unknown),
    ``admitted`` [K, T]: ``arrays.admitted`` of the nodes' labels; ``counts``: ``counts_of``
    (the same for every request, so the caller may keep it per mix snapshot), and ``before``
    likewise (``fragment_before``)."""
    fall, fit = falls_of(free, memory, whole, cpu, admitted, request, pod_cpu_milli, arrays, counts, before)
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
        self.free = np.full((0, 1), -1, dtype=np.int64)
        self.memory = np.full((0, 1), -1, dtype=np.int64)
        self.whole = np.zeros((0, 1), dtype=bool)
        self.plain = np.zeros(0, dtype=bool)
        self.generation = np.zeros(0, dtype=np.int64)  # bumped at every rewrite of the row
        self.cpu = np.zeros(0, dtype=float)  # the node's CPU headroom (NaN: unknown), kept by the caller
        self.stamp = np.zeros(0, dtype=np.int64)  # bumped at every rewrite and every CPU headroom change
        self.names: list[str] = []  # row -> name
        self._rank = np.zeros(0, dtype=np.int64)

    def set(self, name: str, free: Sequence[int], memory: Sequence[int], whole: Sequence[bool],
            plain: bool = True) -> None:
        row = self.index.get(name)
        if row is None:
            row = self.index[name] = len(self.index)
            self.names.append(name)
        rows, width = self.free.shape
        if row >= rows or len(free) > width:
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

    def set_cpu(self, row: int, cpu: float) -> None:
        """The row's CPU headroom (NaN: unknown); the stamp moves only when it changed."""
        old = float(self.cpu[row])
        if old != cpu and not (math.isnan(old) and math.isnan(cpu)):
            self.cpu[row] = cpu
            self.stamp[row] += 1

    def take(self, names: Sequence[str]) -> np.ndarray:
        return np.array([self.index[name] for name in names], dtype=np.int64)

    def first_by_name(self, picked: np.ndarray) -> int:
        """The row among ``picked`` (not empty) whose name sorts first, as ``min`` of the names would."""
        if len(self._rank) != len(self.names):  # rows were added: rank them again (Python's str order)
            rank = np.empty(len(self.names), dtype=np.int64)
            rank[sorted(range(len(self.names)), key=self.names.__getitem__)] = np.arange(len(self.names))
            self._rank = rank
        return int(picked[np.argmin(self._rank[picked])])


class CountMemo:
    """``counts_of`` per node row for one mix snapshot, with the row's generation; and each row's
    fragment before any pod (``fragment_before``: the same for every request, so the request
    shapes filtered after a snapshot moves share it), with the row's stamp and labels version."""

    def __init__(self, arrays: MixArrays) -> None:
        self.arrays = arrays
        width = len(arrays.weight)
        self.count = np.zeros((0, width))
        self.fitting = np.zeros((0, width))
        self.generation = np.full(0, -1, dtype=np.int64)
        self.before = np.zeros(0)
        self.before_stamp = np.full(0, -1, dtype=np.int64)
        self.labels_version: object = None

    def of(self, rows: NodeRows, picked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        size = len(rows.generation)
        if size > len(self.generation):
            grow = size - len(self.generation)
            self.count = np.concatenate([self.count, np.zeros((grow, self.count.shape[1]))])
            self.fitting = np.concatenate([self.fitting, np.zeros((grow, self.fitting.shape[1]))])
            self.generation = np.concatenate([self.generation, np.full(grow, -1, dtype=np.int64)])
            self.before = np.concatenate([self.before, np.zeros(grow)])
            self.before_stamp = np.concatenate([self.before_stamp, np.full(grow, -1, dtype=np.int64)])
        generation = rows.generation[picked]
        changed = picked[self.generation[picked] != generation]
        if len(changed):
            self.count[changed], self.fitting[changed] = counts_of(rows.free[changed], self.arrays)
            self.generation[changed] = rows.generation[changed]
        return self.count[picked], self.fitting[picked]

    def before_of(self, rows: NodeRows, picked: np.ndarray, admitted: np.ndarray | None,
                  labels_version: object) -> np.ndarray:
        """``fragment_before`` of the ``picked`` rows (after ``of`` for them) at their CPU headroom
        (``rows.cpu``); ``admitted`` [len(picked), T] (None: every typical pod everywhere) as of
        ``labels_version``."""
        if labels_version != self.labels_version:  # a label changed: what rows admit may have
            self.before_stamp[:] = -1
            self.labels_version = labels_version
        stamp = rows.stamp[picked]
        stale = self.before_stamp[picked] != stamp
        if stale.any():
            changed = picked[stale]
            self.before[changed] = fragment_before(rows.free[changed], rows.cpu[changed],
                                                   None if admitted is None else admitted[stale], self.arrays,
                                                   (self.count[changed], self.fitting[changed]))
            self.before_stamp[changed] = stamp[stale]
        return self.before[picked]


class LevelMemo:
    """Levels computed for one (request, pod CPU, mix snapshot), per node row, with the row's
    ``NodeRows.stamp`` they were computed at: stale once the row or its CPU headroom changed."""

    def __init__(self) -> None:
        self.level = np.zeros(0, dtype=np.int64)
        self.stamp = np.full(0, -1, dtype=np.int64)

    def stale(self, rows: np.ndarray, stamp: np.ndarray, size: int) -> np.ndarray:
        """Which of ``rows`` (indices below ``size``) were not computed at ``stamp``."""
        if size > len(self.level):
            grow = max(size, 2 * len(self.level))
            self.level = np.concatenate([self.level, np.zeros(grow - len(self.level), dtype=np.int64)])
            self.stamp = np.concatenate([self.stamp, np.full(grow - len(self.stamp), -1, dtype=np.int64)])
        return np.asarray(self.stamp[rows] != stamp)

    def store(self, rows: np.ndarray, stamp: np.ndarray, level: np.ndarray) -> None:
        self.level[rows], self.stamp[rows] = level, stamp


def _grown(array: np.ndarray, rows: int, width: int, fill: object) -> np.ndarray:
    out = np.full((rows, width), fill, dtype=array.dtype)
    out[:array.shape[0], :array.shape[1]] = array
    return out
