"""``core.placement.fgd_level`` for many nodes at once, with numpy (the filter's 10 ms budget).

The core's measure is the reference (property-tested equal, ``tests/extender``); this is
the same arithmetic over arrays: nodes x typical pods x cards. For a pod with one
container; the caller scores anything else (several containers, MIG slices) with the core.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from jupyter_vgpu.core import fgd
from jupyter_vgpu.core.contract import CORES_PER_CARD, Request
from jupyter_vgpu.core.fragment import Mix, Shape


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
    """A mix snapshot as arrays, with each label set's admitted typical pods remembered."""

    def __init__(self, mix: Mix, blend: float = fgd.FGD_BLEND) -> None:
        shapes = [shape for shape, _ in mix.shapes]
        self.mix = mix
        self.blend = blend
        self.weight = np.array([w for _, w in mix.shapes], dtype=float)
        self.need = np.array([CORES_PER_CARD if s.whole else s.cores for s in shapes], dtype=np.int64)
        self.cards = np.array([s.cards if s.whole else 1 for s in shapes], dtype=np.int64)
        self.cpu = np.array([s.cpu_milli for s in shapes], dtype=np.int64)
        self.per_copy = np.array([s.cards * CORES_PER_CARD if s.whole else s.cores for s in shapes], dtype=float)
        self._shapes = shapes
        self._admitted: dict[frozenset[str], np.ndarray] = {}

    def admitted(self, labels: frozenset[str]) -> np.ndarray:
        row = self._admitted.get(labels)
        if row is None:
            row = self._admitted[labels] = np.array([fgd.admits(labels, s) for s in self._shapes], dtype=bool)
        return row

    def fragment(self, total: np.ndarray, count: np.ndarray, fitting: np.ndarray, cpu: np.ndarray,
                 admitted: np.ndarray) -> np.ndarray:
        """Expected fragment (cores); ``count``/``fitting``: per typical pod, how many cards fit it
        and their free cores [..., T]; ``total`` free cores [...]; ``cpu`` headroom [...] (NaN: unknown)."""
        hosts = count >= self.cards
        counted = ~np.isnan(cpu)[..., None] & (self.cpu > 0)
        copies = np.floor(np.where(counted, np.maximum(np.nan_to_num(cpu), 0)[..., None] / np.maximum(self.cpu, 1),
                                   np.inf))
        by_cpu = copies * self.per_copy
        use = (1 - self.blend) * np.minimum(fitting, by_cpu) + self.blend * fitting
        ok = admitted & hosts & (copies >= 1)
        return np.asarray((np.where(ok, total[..., None] - use, total[..., None]) * self.weight).sum(-1))


def levels(nodes: Sequence[BatchNode], request: Request, pod_cpu_milli: int, arrays: MixArrays) -> list[int | None]:
    """Each node's ``fgd_level`` for a pod of one container asking ``request`` (None: it does not fit)."""
    k = len(nodes)
    if k == 0:
        return []
    if not arrays.mix.shapes:  # nothing learned yet: the pod's own shape, as FragmentView.mix_for
        own = Shape.of_pod({0: request}, pod_cpu_milli)
        arrays = MixArrays(Mix(((own, 1.0),)) if own is not None else Mix(), arrays.blend)
    width = max(1, max(len(n.free_cores) for n in nodes))
    free = np.full((k, width), -1, dtype=np.int64)
    memory = np.full((k, width), -1, dtype=np.int64)
    whole = np.zeros((k, width), dtype=bool)
    for i, node in enumerate(nodes):
        n = len(node.free_cores)
        free[i, :n] = node.free_cores
        memory[i, :n] = node.free_memory
        whole[i, :n] = node.whole_free
    cpu = np.array([np.nan if n.cpu_milli is None else n.cpu_milli for n in nodes], dtype=float)
    cpu_after = cpu - pod_cpu_milli
    admitted = np.stack([arrays.admitted(n.labels) for n in nodes]) if len(arrays.weight) else \
        np.zeros((k, 0), dtype=bool)
    cores = np.maximum(free, 0)
    fits = cores[:, None, :] >= arrays.need[None, :, None]  # [K,T,G]
    count = fits.sum(2)
    fitting = (cores[:, None, :] * fits).sum(2).astype(float)
    total = cores.sum(1).astype(float)
    before = arrays.fragment(total, count, fitting, cpu, admitted)
    if request.is_share:
        c, u = request.cores, request.memory_units
        ok = (free >= c) & (memory >= u)
        left = np.maximum(cores - c, 0)
        fits_after = left[:, None, :] >= arrays.need[None, :, None]  # [K,T,G]: card g after the share
        count_g = count[:, :, None] - fits + fits_after
        fitting_g = fitting[:, :, None] - cores[:, None, :] * fits + left[:, None, :] * fits_after
        total_g = total[:, None] - c
        after_g = arrays.fragment(total_g, count_g.transpose(0, 2, 1), fitting_g.transpose(0, 2, 1),
                                  np.repeat(cpu_after[:, None], width, 1), admitted[:, None, :])  # [K,G]
        # the card core.placement chooses: least fragment, then the tightest (cores, memory), then index
        key = np.lexsort((np.broadcast_to(np.arange(width), (k, width)), memory, free,
                          np.where(ok, np.round(after_g, 6), np.inf)), axis=1)[:, 0]
        fit = ok.any(1)
        after = after_g[np.arange(k), key]
    else:
        n = request.cards
        fit = whole.sum(1) >= n
        taken = float(n * CORES_PER_CARD)
        after = arrays.fragment(total - taken, count - n, fitting - taken, cpu_after, admitted)
    fall = before - after
    score = (100 / (1 + np.exp(-fall / CORES_PER_CARD))).astype(int)
    return [int(s) if f else None for s, f in zip(score.tolist(), np.asarray(fit).tolist(), strict=True)]


def batch_node(free_cores: Sequence[int], free_memory: Sequence[int], whole_free: Sequence[bool],
               cpu_milli: int | None, labels: Collection[str]) -> BatchNode:
    return BatchNode(tuple(free_cores), tuple(free_memory), tuple(whole_free), cpu_milli, frozenset(labels))
