"""FGD's fragmentation measure with CPU-counted copies, for the ``fgd-filter`` policy.

Weng et al. (USENIX ATC '23) measure a node's GPU fragmentation as the free GPU compute
that a task drawn from the workload's typical pods could not use, and place each task
where that measure falls most (their score: ``int(100 * sigmoid(fall / 1000 milli-GPU))``),
the first node in a fixed order among equal scores. Two changes, measured on Alibaba's
openb trace (benchmarks/trace/README.md, "Third round"):

- a typical pod can use at most as much compute as the copies of it that the node's free
  CPU can host, blended ``FGD_BLEND`` : ``1 - FGD_BLEND`` with FGD's own count (one copy that
  fits is enough for all the node's fitting cards);
- the typical pods are learned online, by count, from the pods seen (``MixLearner``), each
  with its node selector: a typical pod whose selector the node's labels do not satisfy
  cannot use the node at all.

Compute only: a card's free memory decides where a share fits, not the measure. Units are
vcuda-core (100 per card; FGD's milli-GPU / 10). Pure functions, standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from jupyter_vgpu.core.contract import CORES_PER_CARD
from jupyter_vgpu.core.fragment import Mix, Shape

# The weight of FGD's own usable compute in the blend with the CPU-counted one.
FGD_BLEND = 0.85
# The learned mix: decay per pod seen, most shapes kept (MixLearner, by count).
FGD_DECAY = 0.9995
FGD_CAPACITY = 64
# A new snapshot of the learned mix replaces the one decisions use only once it has moved this
# far from it (total variation): a stable workload keeps one snapshot, so scores stay cached.
FGD_DRIFT = 0.05
# The score's scale: a fall of this many cores moves the sigmoid by one unit (FGD: 1000 milli).
_SCALE = CORES_PER_CARD


def admits(labels: Collection[str], shape: Shape) -> bool:
    """Whether a node with these ``key=value`` labels satisfies the shape's node selector."""
    return all(item in labels for item in shape.selector)


def usable(shape: Shape, free_cores: Sequence[int], cpu_milli: int | None, blend: float = FGD_BLEND) -> float:
    """The free compute (cores) a typical pod of ``shape`` could use on cards with ``free_cores``
    and ``cpu_milli`` CPU headroom (None: unknown, not counted). 0 when it cannot run there."""
    whole = shape.whole
    need = CORES_PER_CARD if whole else shape.cores
    fitting = [free for free in free_cores if free >= need]
    if len(fitting) < (shape.cards if whole else 1):
        return 0.0
    by_gpu = float(sum(fitting))
    if cpu_milli is None or shape.cpu_milli <= 0:
        return by_gpu
    copies = max(0, cpu_milli) // shape.cpu_milli
    if copies < 1:
        return 0.0
    by_cpu = float(copies * (shape.cards * CORES_PER_CARD if whole else shape.cores))
    return (1 - blend) * min(by_gpu, by_cpu) + blend * by_gpu


def node_fragment(free_cores: Sequence[int], cpu_milli: int | None, labels: Collection[str], mix: Mix,
                  blend: float = FGD_BLEND) -> float:
    """Expected free compute (cores) that a typical pod drawn from ``mix`` could not use on this node.

    ``free_cores``: each healthy card's free cores (0-100)."""
    total = float(sum(max(0, free) for free in free_cores))
    if total <= 0:
        return 0.0
    cards = [max(0, free) for free in free_cores]
    return sum(weight * (total - (usable(shape, cards, cpu_milli, blend) if admits(labels, shape) else 0.0))
               for shape, weight in mix.shapes)


def drifted(current: Mix, learned: Mix, threshold: float = FGD_DRIFT) -> bool:
    """Whether ``learned`` has moved ``threshold`` or more (total variation) from ``current``."""
    if not current.shapes:
        return bool(learned.shapes)
    old, new = dict(current.shapes), dict(learned.shapes)
    return sum(abs(old.get(s, 0.0) - new.get(s, 0.0)) for s in old.keys() | new.keys()) / 2 >= threshold


def fall_score(before: float, after: float) -> int:
    """FGD's score of a placement, 0-100: the fall of the fragment through a sigmoid, truncated."""
    return int(100 / (1 + math.exp(-(before - after) / _SCALE)))
