"""``fgd_batch.levels_of`` for a few rows, in plain Python: the same numbers, bit for bit.

A steady-state filter re-scores the one or two rows changed since the same request shape
was last seen; the numpy batch costs ~90 small array calls whatever the rows (0.2-0.4 ms),
this a few dozen float operations per row. Every operation is the batch's, in its order:
elementwise IEEE float arithmetic is the same in Python and numpy, counts and free cores
are integers (exact in either), and a sum over the typical pods follows numpy's pairwise
summation (``pairwise_sum``). The level from the fall takes numpy's ``exp``, as the batch
(``level_of_fall``): ``math.exp`` is not numpy's SIMD ``exp`` (on this machine they differ in
the last bit for ~5 % of values), and numpy's gives each element the same result whatever
the array's length (``tests/extender/test_fgd_few_rows.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from jupyter_vgpu.core.contract import CORES_PER_CARD, Request

from .fgd_batch import MixArrays, pairwise_sum


class MixScalars:
    """A ``MixArrays``' per typical pod values as Python floats and ints, with the per-row
    counts and per-value changes it has computed (a cluster's rows repeat a few card layouts)."""

    def __init__(self, arrays: MixArrays) -> None:
        self.blend = arrays.blend
        self.rest = 1 - arrays.blend
        self.weight = arrays.weight.tolist()
        self.need = arrays.need.tolist()
        self.cards = arrays.cards.tolist()
        self.cpu = arrays.cpu.tolist()
        self.per_copy = arrays.per_copy.tolist()
        self.asks = [c > 0 for c in self.cpu]
        self.asking = any(self.asks)
        self.size = len(self.weight)
        self.fits = arrays.fits.tolist()  # per free value (0-100) and typical pod, as the batch's tables
        self.usable = arrays.usable.tolist()
        self._counts: dict[tuple[int, ...], tuple[list[float], list[float]]] = {}
        self._changes: dict[tuple[int, int], tuple[list[float], list[float]]] = {}
        self._ceilings: dict[float, float] = {}  # by a row's free cores: ``_bound`` of that many fitting

    def counts(self, cores: Sequence[int]) -> tuple[list[float], list[float]]:
        """``counts_of`` of one row: per typical pod, how many cards fit it and their free cores
        (integer-valued: exact in any order)."""
        key = tuple(cores)
        found = self._counts.get(key)
        if found is None:
            if key:  # per typical pod, a sum over the cards (of whole numbers: exact in any order)
                count = [float(n) for n in map(sum, zip(*[self.fits[v] for v in key], strict=True))]
                fitting = [float(n) for n in map(sum, zip(*[self.usable[v] for v in key], strict=True))]
            else:
                count, fitting = [0.0] * self.size, [0.0] * self.size
            if len(self._counts) >= _MEMO:
                self._counts.clear()
            found = self._counts[key] = (count, fitting)
        return found

    def change(self, cores: int, value: int) -> tuple[list[float], list[float]]:
        """What taking ``cores`` off a card with ``value`` free changes, per typical pod (the batch's
        ``fits_change``/``usable_change``)."""
        key = (cores, value)
        found = self._changes.get(key)
        if found is None:
            left = max(value - cores, 0)
            found = self._changes[key] = (
                [a - b for a, b in zip(self.fits[left], self.fits[value], strict=True)],
                [a - b for a, b in zip(self.usable[left], self.usable[value], strict=True)])
        return found

    def caps(self, cpu: float, fitting: Sequence[float], total: float | None = None
             ) -> tuple[list[float], list[bool]] | None:
        """``MixArrays.caps`` of one row: (cap, one) per typical pod, None when its CPU cannot bind.
        ``total``: the row's free cores, which no typical pod's fitting cores exceed, so a CPU at or
        above the bound taken at ``total`` for every typical pod is above the row's own bound
        (``ceil`` and multiplying by a positive number keep the order, rounding included)."""
        if not self.asking or math.isnan(cpu):
            return None
        if total is not None:
            ceiling = self._ceilings.get(total)
            if ceiling is None:
                if len(self._ceilings) >= _MEMO:
                    self._ceilings.clear()
                ceiling = self._ceilings[total] = self._bound([total] * self.size)
            if cpu >= ceiling:
                return None
        if cpu >= self._bound(fitting):
            return None
        free = max(cpu, 0)
        cap, one = [], []
        for t in range(self.size):
            copies = float(math.floor(free / float(max(self.cpu[t], 1)))) if self.asks[t] else math.inf
            cap.append(copies * self.per_copy[t])
            one.append(copies >= 1)
        return cap, one

    def _bound(self, fitting: Sequence[float]) -> float:
        """The CPU below which a row of these fitting cores may bind (``MixArrays.caps``)."""
        return max(float(max(math.ceil(fitting[t] / self.per_copy[t]), 1)) * float(self.cpu[t])
                   for t in range(self.size) if self.asks[t])

    def fragment(self, total: float, count: Sequence[float], fitting: Sequence[float], admitted: Sequence[bool],
                 caps: tuple[list[float], list[bool]] | None) -> float:
        """``MixArrays.capped_fragment`` of one row."""
        blend, rest = self.blend, self.rest
        if caps is None and self.size < 8:  # numpy's sum of fewer than 8: a running sum from 0.0
            summed = 0.0
            for f, n, a, k, w in zip(fitting, count, admitted, self.cards, self.weight, strict=True):
                summed += (total - (rest * f + blend * f) if a and n >= k else total) * w
            return summed
        if caps is None:
            terms = [(total - (rest * f + blend * f) if a and n >= k else total) * w
                     for f, n, a, k, w in zip(fitting, count, admitted, self.cards, self.weight, strict=True)]
        else:
            terms = [(total - (rest * min(f, c) + blend * f) if a and n >= k and o else total) * w
                     for f, n, a, k, w, c, o in zip(fitting, count, admitted, self.cards, self.weight, *caps,
                                                    strict=True)]
        return pairwise_sum(terms)

    def fragment_moved(self, total: float, count: Sequence[float], moved_count: Sequence[float],
                       fitting: Sequence[float], moved_fitting: Sequence[float], admitted: Sequence[bool],
                       caps: tuple[list[float], list[bool]] | None) -> float:
        """``fragment(total, count + moved_count, fitting + moved_fitting, ...)``, the sums taken
        term by term as the lists would be (the same additions), without building them."""
        if caps is not None or self.size >= 8:
            return self.fragment(total, [a + b for a, b in zip(count, moved_count, strict=True)],
                                 [a + b for a, b in zip(fitting, moved_fitting, strict=True)], admitted, caps)
        blend, rest = self.blend, self.rest
        summed = 0.0
        for f0, df, n0, dn, a, k, w in zip(fitting, moved_fitting, count, moved_count, admitted, self.cards,
                                           self.weight, strict=True):
            f = f0 + df
            summed += (total - (rest * f + blend * f) if a and n0 + dn >= k else total) * w
        return summed


_MEMO = 4096  # card layouts kept per mix snapshot


def _scalars(arrays: MixArrays) -> MixScalars:
    found = arrays.__dict__.get("_scalars")
    if found is None:
        found = arrays.__dict__["_scalars"] = MixScalars(arrays)
    return found


def falls_few(free: np.ndarray, memory: np.ndarray, whole: np.ndarray, cpu: np.ndarray, admitted: np.ndarray | None,
              request: Request, pod_cpu_milli: int, arrays: MixArrays) -> tuple[list[float], list[bool]]:
    """``fgd_batch.falls_of`` row by row (the mix not empty; ``admitted`` None: every row admits
    every typical pod), as Python floats and bools."""
    return falls_few_lists(free.tolist(), memory.tolist(), whole.tolist(), cpu.tolist(),
                           admitted.tolist() if admitted is not None else None, request, pod_cpu_milli, arrays)


def falls_few_lists(free: list[list[int]], memory: list[list[int]], whole: list[list[bool]], cpu: list[float],
                    allowed: list[list[bool]] | None, request: Request, pod_cpu_milli: int,
                    arrays: MixArrays) -> tuple[list[float], list[bool]]:
    """``falls_few`` of the rows as Python lists (as ``tolist`` gives them)."""
    mix = _scalars(arrays)
    everyone = [True] * mix.size
    falls, fits = [], []
    for row, (frees, memories, wholes, headroom) in enumerate(zip(free, memory, whole, cpu, strict=True)):
        admits = everyone if allowed is None else allowed[row]
        cores = [min(max(v, 0), CORES_PER_CARD) for v in frees]
        count, fitting = mix.counts(cores)
        total = float(sum(cores))
        before = mix.fragment(total, count, fitting, admits, mix.caps(headroom, fitting, total))
        caps = mix.caps(headroom - pod_cpu_milli, fitting, total)
        if request.is_share:
            c, u = request.cores, request.memory_units
            values = sorted({v for v, f, m in zip(cores, frees, memories, strict=True) if f >= c and m >= u})
            fit = bool(values)
            after = math.inf
            for v in values:  # same value, same fragment; the batch's minimum over them
                moved_count, moved_fitting = mix.change(c, v)
                after = min(after, mix.fragment_moved(total - c, count, moved_count, fitting, moved_fitting,
                                                      admits, caps))
        else:
            n = request.cards
            fit = sum(wholes) >= n
            taken = float(n * CORES_PER_CARD)
            after = mix.fragment(total - taken, [x - n for x in count], [x - taken for x in fitting], admits, caps)
        falls.append(before - after if fit else 0.0)
        fits.append(fit)
    return falls, fits


def stored_levels_few(free: np.ndarray, memory: np.ndarray, whole: np.ndarray, cpu: np.ndarray,
                      admitted: np.ndarray | None, request: Request, pod_cpu_milli: int,
                      arrays: MixArrays) -> list[int]:
    """``fgd_batch.levels_of`` of a few rows (see ``falls_few``) as the filter keeps them: each
    row's level, -1 where the pod does not fit (``np.where(fit, level, -1)``), as a list."""
    return stored_levels_lists(*falls_few(free, memory, whole, cpu, admitted, request, pod_cpu_milli, arrays))


def stored_levels_lists(falls: list[float], fits: list[bool]) -> list[int]:
    """``stored_levels_few`` from ``falls_few``'s (or ``falls_few_lists``') answer."""
    return [level if fit else -1 for level, fit in zip(levels_of_falls(falls), fits, strict=True)]


def levels_of_falls(falls: Sequence[float]) -> list[int]:
    """``fgd_batch.level_of_fall`` of a few falls: numpy's exp (one call), then IEEE add and
    divide, the same in Python (negating and dividing by a power of two are exact), and
    truncation as ``astype(int)``."""
    grown = np.exp(np.array([-fall / CORES_PER_CARD for fall in falls], dtype=float)).tolist()
    return [int(100 / (1 + e)) for e in grown]
