"""Placement on MIG slices: which free slice of one node each share container of a pod gets. Pure.

A slice is held whole, so placing is choosing, never splitting. Rules:

- only free, placeable slices (healthy, their GPU instance not split into several compute
  instances) on cards the node's sharing mode lets serve this request (``core.mig.Sharing``);
- the smallest slice that fits: size is the slice's fraction of its card's compute plus
  its fraction of the card's memory, so a 3g.20gb is never spent on a 1g request while a
  fitting 1g slice is free;
- among equal sizes, the card left with the fewest free slices (fill a partitioned card
  before starting on another, keeping whole slice sets together for larger requests),
  then the lowest card index and GPU instance;
- a pod's containers together: the assignment with the smallest total size, found by a
  branch-and-bound search (exact within a generous budget).

Whole-card requests never take a slice, and a MIG-mode card is never a whole card.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from jupyter_vgpu.core.contract import CORES_PER_CARD, Request, format_mib
from jupyter_vgpu.core.inventory import NodeInventory
from jupyter_vgpu.core.mig import MigSlice

_SEARCH_BUDGET = 20_000


@dataclass(frozen=True)
class NodeSlice:
    """A slice with the card it is on."""

    card: int
    card_memory_mib: int
    slice: MigSlice

    @property
    def uuid(self) -> str:
        return self.slice.uuid

    @property
    def size(self) -> Fraction:
        """Fraction of the card's compute plus fraction of its memory (0 < size <= 2)."""
        s = self.slice
        return Fraction(s.slices, s.card_slices) + Fraction(s.memory_mib, max(1, self.card_memory_mib))

    def describe(self) -> str:
        return f"MIG {self.slice.profile} on GPU {self.card}"


@dataclass(frozen=True)
class SlicePlacement:
    containers: Mapping[int, NodeSlice]
    """Container index -> the slice it gets."""

    @property
    def size(self) -> Fraction:
        return sum((s.size for s in self.containers.values()), Fraction(0))


@dataclass(frozen=True)
class SliceRefusal:
    reason: str


def node_slices(inventory: NodeInventory) -> tuple[NodeSlice, ...]:
    """Every slice the node publishes (on cards in MIG mode), in card and GPU-instance order."""
    return tuple(NodeSlice(card.index, card.memory_mib, s)
                 for card in sorted(inventory.cards, key=lambda c: c.index)
                 for s in sorted(card.slices, key=lambda s: (s.gpu_instance, s.compute_instance, s.uuid)))


def free_slices(slices: Iterable[NodeSlice], held: Collection[str],
                eligible: Callable[[int], bool] = lambda card: True) -> tuple[NodeSlice, ...]:
    return tuple(s for s in slices if s.slice.placeable and s.uuid not in held and eligible(s.card))


def _ranked(free: Sequence[NodeSlice], request: Request) -> list[NodeSlice]:
    """The free slices that fit, best first."""
    left = Counter(s.card for s in free)
    fitting = [s for s in free if s.slice.fits(request)]
    return sorted(fitting, key=lambda s: (s.size, left[s.card], s.card, s.slice.gpu_instance,
                                          s.slice.compute_instance, s.uuid))


def place_slices(slices: Sequence[NodeSlice], held: Collection[str], requests: Mapping[int, Request],
                 eligible: Callable[[int], bool] = lambda card: True) -> SlicePlacement | SliceRefusal:
    """A free slice for every container in ``requests`` (all shares), or why not."""
    free = free_slices(slices, held, eligible)
    whole = [i for i, r in requests.items() if not r.is_share]
    if whole:
        return SliceRefusal(f"container {whole[0]} asks for whole cards; MIG slices serve shares only")
    order = sorted(requests, key=lambda i: (-requests[i].cores, -requests[i].memory_units, i))
    options = {i: _ranked(free, requests[i]) for i in order}
    for i in order:
        if not options[i]:
            prefix = f"container {i}: " if len(requests) > 1 else ""
            return SliceRefusal(prefix + _refusal(slices, free, requests[i]))
    floor = {i: options[i][0].size for i in order}
    best: tuple[Fraction, dict[int, NodeSlice]] | None = None
    budget = [_SEARCH_BUDGET]

    def search(position: int, taken: frozenset[str], total: Fraction, chosen: dict[int, NodeSlice]) -> None:
        nonlocal best
        if best is not None and total + sum((floor[i] for i in order[position:]), Fraction(0)) >= best[0]:
            return
        if position == len(order):
            best = (total, dict(chosen))
            return
        index = order[position]
        for candidate in options[index]:
            if candidate.uuid in taken:
                continue
            budget[0] -= 1
            if budget[0] < 0:
                return
            chosen[index] = candidate
            search(position + 1, taken | {candidate.uuid}, total + candidate.size, chosen)
            del chosen[index]

    search(0, frozenset(), Fraction(0), {})
    if best is None:
        asks = "; ".join(f"container {i}: {requests[i].describe()}" for i in sorted(requests))
        return SliceRefusal(f"each container fits a free MIG slice on its own but not all together ({asks})")
    return SlicePlacement({i: best[1][i] for i in sorted(best[1])})


def _refusal(slices: Sequence[NodeSlice], free: Sequence[NodeSlice], request: Request) -> str:
    asked = f"needs a MIG slice with {request.cores} cores and {format_mib(request.memory_mib)}"
    if not slices:
        return f"{asked}; this node has no MIG slices"
    if not free:
        return f"{asked}; no MIG slice this pod may use is free on this node ({len(slices)} slices)"
    largest = max(free, key=lambda s: (s.slice.cores, s.slice.memory_mib))
    return (f"{asked}; the largest free one is {largest.describe()} "
            f"({largest.slice.cores} cores, {format_mib(largest.slice.memory_mib)})")


def score_slices(placement: SlicePlacement, requests: Mapping[int, Request]) -> int:
    """1..10 for prioritize: how closely the slices match what was asked (10: no waste)."""
    need = Fraction(0)
    for index, s in placement.containers.items():
        request = requests[index]
        need += Fraction(request.cores, CORES_PER_CARD) + Fraction(request.memory_mib, max(1, s.card_memory_mib))
    got = placement.size
    ratio = need / got if got else Fraction(1)
    return 1 + round(9 * min(Fraction(1), ratio))
