"""Expected fragmentation of a node under the workload's task mix (the FGD idea, in 2-D).

Weng et al. (USENIX ATC '23) measure a node's GPU fragmentation as the GPU capacity that a
task drawn from the workload's typical mix could not use, and place each task where that
expectation grows least. Here the measure has this project's two GPU dimensions (compute
in vcuda-core, memory in vcuda-memory units) and the node's CPU and memory headroom: a
card on a node whose CPU is gone is stranded for every task, however free the card is.

- ``Shape``: what one pod asks for (share or whole cards, and its CPU and memory).
- ``Mix``: an immutable weighted set of shapes, the view a placement decision uses.
- ``MixLearner``: learns the mix online from the pods the extender sees, with exponential
  decay and a fixed number of shapes (bounded memory), so the policy follows the workload
  rather than a trace.
- ``node_fragment``: the expected fragment of a node under a mix, in cards.

Pure functions of their inputs, standard library only.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from jupyter_vgpu.core.contract import CORES_PER_CARD, Request

# A learned shape whose weight decays below this share of the total is forgotten.
_FORGET_BELOW = 1e-4


@dataclass(frozen=True)
class Shape:
    """One pod's demand: ``cores`` 1-99 with ``memory_units`` on one card, or ``cards`` whole cards.

    ``cpu_milli`` and ``memory_mib`` are the pod's CPU and memory requests (0: unknown);
    ``selector`` the node labels it needs (its node selector, sorted ``key=value`` items; empty: any node).
    """

    cores: int
    memory_units: int = 0
    cards: int = 1
    cpu_milli: int = 0
    memory_mib: int = 0
    selector: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.cards < 1 or self.cpu_milli < 0 or self.memory_mib < 0 or self.memory_units < 0:
            raise ValueError(f"invalid shape {self!r}")
        if any(not m for m in self.selector) or list(self.selector) != sorted(set(self.selector)):
            raise ValueError(f"shape selector {self.selector!r} must be distinct, non-empty and sorted")
        if not 1 <= self.cores <= CORES_PER_CARD:
            raise ValueError(f"shape cores {self.cores} must be 1-{CORES_PER_CARD} per card")
        if self.cards > 1 and self.cores != CORES_PER_CARD:
            raise ValueError("a shape of several cards takes them whole")

    @property
    def whole(self) -> bool:
        return self.cores >= CORES_PER_CARD

    @property
    def gpu(self) -> float:
        """The GPU capacity it takes, in cards."""
        return float(self.cards) if self.whole else self.cores / CORES_PER_CARD

    @classmethod
    def of_pod(cls, requests: Mapping[int, Request], cpu_milli: int = 0, memory_mib: int = 0) -> Shape | None:
        """The pod's shape: its largest container's GPU demand (None: it asks for no GPU)."""
        if not requests:
            return None
        biggest = max(requests.values(), key=lambda r: (r.cards, r.cores, r.memory_units))
        if biggest.is_share:
            return cls(biggest.cores, biggest.memory_units, 1, max(0, cpu_milli), max(0, memory_mib))
        return cls(CORES_PER_CARD, 0, biggest.cards, max(0, cpu_milli), max(0, memory_mib))


@dataclass(frozen=True)
class Mix:
    """Shapes with weights summing to 1 (empty: nothing learned yet)."""

    shapes: tuple[tuple[Shape, float], ...] = ()

    @classmethod
    def of(cls, weights: Iterable[tuple[Shape, float]]) -> Mix:
        kept = [(shape, float(w)) for shape, w in weights if w > 0]
        total = sum(w for _, w in kept)
        if total <= 0:
            return cls()
        return cls(tuple(sorted(((s, w / total) for s, w in kept), key=lambda sw: -sw[1])))


class MixLearner:
    """The task mix, learned online: exponentially decayed weights of at most ``capacity`` shapes.

    Each observation multiplies every weight by ``decay`` and adds the shape's GPU demand
    (in cards; ``by="count"``: 1) to it (by rescaling the increment, not the table).
    Weighting by demand makes the expected fragment the share of GPU demand that could not
    use the node: an 8-card job is rare but asks for a whole node. FGD's typical pods are
    counted, which its measure needs (README of benchmarks/trace, "Second round").
    When a new shape would exceed ``capacity`` the lightest one is dropped. Thread-safe.
    """

    def __init__(self, capacity: int = 32, decay: float = 0.999, by: str = "demand") -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        if not 0 < decay <= 1:
            raise ValueError("decay must be in (0, 1]")
        if by not in ("demand", "count"):
            raise ValueError("by must be 'demand' or 'count'")
        self.capacity = capacity
        self.decay = decay
        self.by = by
        self._weights: dict[Shape, float] = {}
        self._increment = 1.0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._weights)

    def observe(self, shape: Shape) -> None:
        with self._lock:
            self._increment /= self.decay
            if self._increment > 1e100:  # renormalise before floats overflow
                self._weights = {s: w / self._increment for s, w in self._weights.items()}
                self._increment = 1.0
            if shape not in self._weights and len(self._weights) >= self.capacity:
                lightest = min(self._weights, key=self._weights.__getitem__)
                del self._weights[lightest]
            amount = shape.gpu if self.by == "demand" else 1.0
            self._weights[shape] = self._weights.get(shape, 0.0) + self._increment * amount
            total = sum(self._weights.values())
            for s in [s for s, w in self._weights.items() if w < _FORGET_BELOW * total]:
                del self._weights[s]

    def mix(self, coverage: float = 0.95) -> Mix:
        """The heaviest shapes that together hold ``coverage`` of the weight (as FGD's typical
        pods), renormalised: rare shapes cost time on every decision and change little."""
        with self._lock:
            ranked = sorted(self._weights.items(), key=lambda sw: -sw[1])
        total, held = sum(w for _, w in ranked), 0.0
        kept: list[tuple[Shape, float]] = []
        for shape, weight in ranked:
            if kept and held >= coverage * total:
                break
            kept.append((shape, weight))
            held += weight
        return Mix.of(kept)


@dataclass(frozen=True)
class Headroom:
    """A node's CPU and memory not requested by the pods bound to it."""

    cpu_milli: int
    memory_mib: int

    def fits(self, cpu_milli: int, memory_mib: int) -> bool:
        return self.cpu_milli >= cpu_milli and self.memory_mib >= memory_mib

    def minus(self, cpu_milli: int, memory_mib: int) -> Headroom:
        return Headroom(self.cpu_milli - cpu_milli, self.memory_mib - memory_mib)


@dataclass(frozen=True)
class CardFree:
    """What one healthy card has left."""

    cores: int
    memory_units: int
    capacity_units: int

    @property
    def amount(self) -> float:
        """Free capacity in cards: the mean of the free compute and free memory fractions."""
        return (min(self.cores, CORES_PER_CARD) / CORES_PER_CARD
                + self.memory_units / max(1, self.capacity_units)) / 2

    @property
    def whole(self) -> bool:
        return self.cores >= CORES_PER_CARD and self.memory_units >= self.capacity_units

    def hosts(self, shape: Shape) -> bool:
        if shape.whole:
            return self.whole
        return self.cores >= shape.cores and self.memory_units >= shape.memory_units


def node_fragment(cards: Iterable[CardFree], headroom: Headroom | None, mix: Mix) -> float:
    """Expected free card capacity (in cards) that a task drawn from ``mix`` could not use.

    For each shape: if the node's CPU or memory headroom cannot take it, or too few cards
    can host it, all the node's free card capacity is fragment; otherwise the free capacity
    of the cards that cannot host it is. ``headroom`` None means unknown (not checked).
    """
    free = [(card.cores, card.memory_units, card.whole, card.amount) for card in cards if card.amount > 0]
    total = sum(amount for *_, amount in free)
    if total <= 0:
        return 0.0
    expected = 0.0
    for shape, weight in mix.shapes:
        if headroom is not None and (headroom.cpu_milli < shape.cpu_milli or headroom.memory_mib < shape.memory_mib):
            expected += weight * total
            continue
        hosting, stranded = 0, 0.0
        if shape.whole:
            for _, _, whole, amount in free:
                if whole:
                    hosting += 1
                else:
                    stranded += amount
        else:
            need_cores, need_units = shape.cores, shape.memory_units
            for cores, units, _, amount in free:
                if cores >= need_cores and units >= need_units:
                    hosting += 1
                else:
                    stranded += amount
        expected += weight * (total if hosting < shape.cards else stranded)
    return expected
