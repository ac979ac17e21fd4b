"""Placement: which card(s) of one node get a pod's vGPU requests. Pure functions.

Inputs are a node's state (cards, what is held on them, topology) and a pod's requests
(container index -> Request). Policies:

- shares (1-99 cores + memory) go on one card. ``binpack`` (default) fills used cards
  first; ``spread`` picks the emptiest card. Both are fragmentation-aware, and the
  damage is measured, not guessed: a choice is ranked by whether it breaks a whole free
  card, how much of the tree's fully free groups it breaks, and how many share sizes
  (cores x memory units) the node could still host afterwards but could not before.
- whole cards (100 * n) take the set of n free cards with the lowest sum of pairwise
  link costs, found by exact search (NVLink meshes are not trees), tie-broken by NUMA
  locality and then by how much intact capacity (fully free tree groups) is left.
- a pod's containers are placed one after another on the same state, largest first,
  backtracking if a later container does not fit, so a pod is refused only when no
  combination fits (within a generous search budget).

- ``fgd-filter`` (``core.fgd``): a share goes on the card whose use leaves the least of
  FGD's expected fragment under the learned typical pods (then the tightest); whole cards
  as above. The extender's filter returns only the node of the best ``fgd_level``.

Every refusal carries a reason a person can act on.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache

from jupyter_vgpu.core import fgd
from jupyter_vgpu.core.claims import held_memory_units
from jupyter_vgpu.core.contract import (
    CORES_PER_CARD,
    MEMORY_UNIT_MIB,
    CardShare,
    Request,
    format_mib,
)
from jupyter_vgpu.core.fragment import CardFree, Headroom, Mix, Shape, node_fragment
from jupyter_vgpu.core.inventory import Card, NodeInventory
from jupyter_vgpu.core.topology import Topology, link_cost

POLICIES = ("binpack", "spread", "fragment", "fgd-filter")
MAX_SCORE = 10

# Multi-container pods: how many partial placements the backtracking search may try.
_SEARCH_BUDGET = 20_000
# Pair cost when a node's topology is unknown: every pair is as far apart as can be.
_UNKNOWN_PAIR_COST = link_cost("SYS")

Assignment = tuple[tuple[int, int, int], ...]  # ((card index, cores, memory units), ...)


@dataclass(frozen=True)
class CardState:
    index: int
    memory_units: int
    healthy: bool = True
    used_cores: int = 0
    used_memory_units: int = 0

    @property
    def free_cores(self) -> int:
        return max(0, CORES_PER_CARD - self.used_cores)

    @property
    def free_memory_units(self) -> int:
        return max(0, self.memory_units - self.used_memory_units)

    @property
    def is_free(self) -> bool:
        """Healthy and holding nothing: can be handed out as a whole card."""
        return self.healthy and self.used_cores == 0 and self.used_memory_units == 0

    def fits_share(self, cores: int, memory_units: int) -> bool:
        return self.healthy and self.free_cores >= cores and self.free_memory_units >= memory_units

    def holding(self, cores: int, memory_units: int) -> CardState:
        # the constructor, not dataclasses.replace: the same card, several times cheaper (bind's hot path)
        return CardState(self.index, self.memory_units, self.healthy, self.used_cores + cores,
                         self.used_memory_units + memory_units)


@dataclass(frozen=True)
class NodeState:
    """A node's cards with what is held on them, its topology (None when unknown), its
    CPU and memory headroom: allocatable minus what bound pods request (None when unknown),
    and its labels as ``key=value`` items (what the learned pods' node selectors match)."""

    cards: tuple[CardState, ...]
    topology: Topology | None = None
    headroom: Headroom | None = None
    labels: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        indices = [card.index for card in self.cards]
        if len(set(indices)) != len(indices):
            raise ValueError(f"card indices repeat: {indices}")
        topology = self.topology
        if topology is not None and any(not 0 <= i < topology.count for i in indices):
            raise ValueError(f"card indices {indices} do not match a topology of {topology.count} cards")

    @classmethod
    def build(cls, inventory_or_cards: NodeInventory | Sequence[Card], holdings: Iterable[CardShare] = (),
              topology: Topology | None = None, headroom: Headroom | None = None) -> NodeState:
        """The state of a node given what existing allocations hold.

        A holding of 100 cores takes the whole card, all its memory included. Holdings
        on cards the node does not have are ignored: they hold nothing that exists.
        Over-committed holdings are kept as they are (free capacity never goes below 0).
        """
        if isinstance(inventory_or_cards, NodeInventory):
            cards: Sequence[Card] = inventory_or_cards.cards
            topology = topology or inventory_or_cards.topology
        else:
            cards = inventory_or_cards
        states = {card.index: CardState(card.index, card.memory_units, card.healthy) for card in cards}
        for share in holdings:
            card = states.get(share.index)
            if card is None:
                continue
            memory = held_memory_units(share.cores, share.memory_units, card.memory_units)
            states[share.index] = card.holding(share.cores, memory)
        return cls(tuple(states[i] for i in sorted(states)), topology, headroom)

    def card(self, index: int) -> CardState:
        for card in self.cards:
            if card.index == index:
                return card
        raise KeyError(f"no card {index} on this node")

    def apply(self, placement: PodPlacement) -> NodeState:
        """The state after a placement's holdings are added."""
        state = self
        for assignment in placement.containers.values():
            state = state._with(assignment)
        return state

    def release(self, placement: PodPlacement) -> NodeState:
        """The state after a placement's holdings are given back."""
        cards = {card.index: card for card in self.cards}
        for assignment in placement.containers.values():
            for index, cores, memory in assignment:
                card = cards[index]
                cards[index] = replace(card, used_cores=max(0, card.used_cores - cores),
                                       used_memory_units=max(0, card.used_memory_units - memory))
        return replace(self, cards=tuple(cards[c.index] for c in self.cards))

    def emptied(self) -> NodeState:
        """The same node holding nothing."""
        return replace(self, cards=tuple(replace(c, used_cores=0, used_memory_units=0) for c in self.cards))

    def _with(self, assignment: Assignment) -> NodeState:
        held = {index: (cores, memory) for index, cores, memory in assignment}
        return replace(self, cards=tuple(
            card.holding(*held[card.index]) if card.index in held else card for card in self.cards
        ))

    def pair_cost(self, a: int, b: int) -> int:
        return self.topology.cost(a, b) if self.topology is not None else _UNKNOWN_PAIR_COST

    def set_cost(self, indices: Iterable[int]) -> int:
        chosen = sorted(set(indices))
        return sum(self.pair_cost(a, b) for i, a in enumerate(chosen) for b in chosen[i + 1:])

    def numa(self, index: int) -> int | None:
        return self.topology.numa(index) if self.topology is not None else None

    @cached_property
    def groups(self) -> tuple[frozenset[int], ...]:
        """The topology tree's inner groups (not the root, not single cards)."""
        if self.topology is None:
            return ()
        return _tree_groups(self.topology, frozenset(card.index for card in self.cards))

    def free_cards(self) -> tuple[int, ...]:
        return tuple(card.index for card in self.cards if card.is_free)


@lru_cache(maxsize=256)
def _tree_groups(topology: Topology, present: frozenset[int]) -> tuple[frozenset[int], ...]:
    """``NodeState.groups``, once per topology and set of cards (a state is built per decision;
    a cluster has a few topologies)."""
    return tuple(frozenset(node.gpus) & present for _, node in topology.tree.walk()
                 if node.level not in ("ROOT", "GPU") and len(node.gpus) > 1)


@dataclass(frozen=True)
class PodPlacement:
    containers: dict[int, Assignment]
    """Container index -> ((card index, cores, memory units), ...)."""
    link_cost: int = 0
    """Sum over containers of the pairwise link cost of their multi-card sets (0 otherwise)."""

    def cards(self, container: int) -> tuple[int, ...]:
        return tuple(index for index, _, _ in self.containers[container])


@dataclass(frozen=True)
class Refusal:
    reason: str


# --- shares --------------------------------------------------------------------------------


def _share_area(cards: Iterable[CardState]) -> int:
    """How many share sizes (cores 1-99 x memory units) fit on at least one card.

    The union of the rectangles [1..free cores] x [1..free memory] over healthy cards,
    a staircase: the number of distinct share requests the node can still host.
    """
    return _staircase_area([(min(c.free_cores, CORES_PER_CARD - 1), c.free_memory_units) for c in cards if c.healthy])


def _staircase_area(boxes: list[tuple[int, int]]) -> int:
    """``_share_area`` of the healthy cards' (usable cores, free memory) boxes."""
    boxes.sort(reverse=True)
    area, tallest = 0, 0
    for width, height in boxes:  # widest first; each adds the part above what is covered
        if height > tallest:
            area += width * (height - tallest)
            tallest = height
    return area


def _intact(state: NodeState, taken: frozenset[int]) -> int:
    """Capacity left in fully free tree groups once ``taken`` cards are used (by size)."""
    free = set(state.free_cards()) - taken
    return sum(len(group) for group in state.groups if group <= free)


@dataclass(frozen=True)
class FragmentView:
    """What the ``fragment`` policy weighs a choice against: the workload's task mix and the
    placed pod's own CPU and memory requests (taken from the node's headroom)."""

    mix: Mix = Mix()
    cpu_milli: int = 0
    memory_mib: int = 0

    def mix_for(self, requests: Mapping[int, Request]) -> Mix:
        """The learned mix, or the pod's own shape while nothing has been learned."""
        if self.mix.shapes:
            return self.mix
        own = Shape.of_pod(requests, self.cpu_milli, self.memory_mib)
        return Mix(((own, 1.0),)) if own is not None else Mix()


def fragment_of(state: NodeState, mix: Mix, headroom: Headroom | None = None) -> float:
    """The node's expected fragment (in cards) under ``mix`` with this headroom (default: its own)."""
    cards = [CardFree(c.free_cores, c.free_memory_units, c.memory_units) for c in state.cards if c.healthy]
    return node_fragment(cards, state.headroom if headroom is None else headroom, mix)


def _headroom_after(state: NodeState, view: FragmentView) -> Headroom | None:
    return state.headroom.minus(view.cpu_milli, view.memory_mib) if state.headroom is not None else None


def _share_candidates(state: NodeState, request: Request, policy: str,
                      view: FragmentView | None = None) -> list[Assignment]:
    cores, memory = request.cores, request.memory_units
    fitting = [card for card in state.cards if card.fits_share(cores, memory)]
    if not fitting:
        return []
    if policy == "fgd-filter":  # none of the other policies' measures below
        return [((card.index, cores, memory),) for card in _fgd_share_order(state, fitting, request, view)]
    # each healthy card's (usable cores, free memory) box, for the share area with one card taken
    boxes = {c.index: (min(c.free_cores, CORES_PER_CARD - 1), c.free_memory_units) for c in state.cards if c.healthy}
    area_before = _staircase_area(list(boxes.values())) if policy != "fragment" else 0
    intact_before = _intact(state, frozenset())
    mix = (view or FragmentView()).mix_for({0: request}) if policy == "fragment" else None
    headroom = _headroom_after(state, view or FragmentView())

    fragments: dict[tuple[int, int, int, bool], float] = {}

    def fragment_rank(card: CardState) -> tuple[float, ...]:
        # cards in the same state leave the same fragment: computed once per state
        key = (card.free_cores, card.free_memory_units, card.memory_units, card.is_free)
        frag = fragments.get(key)
        if frag is None:
            after = tuple(c.holding(cores, memory) if c.index == card.index else c for c in state.cards)
            frag = fragments[key] = round(fragment_of(replace(state, cards=after), mix or Mix(), headroom), 9)
        broken = intact_before - _intact(state, frozenset({card.index})) if card.is_free and state.groups else 0
        left = (card.free_cores - cores) / CORES_PER_CARD + (card.free_memory_units - memory) / max(1, card.memory_units)
        return (frag, card.is_free, broken, left, card.index)

    # Cards in the same state strand the same share sizes (the share area depends only on the
    # cards' free capacity), so it is computed once per distinct state: on a node of idle cards
    # once instead of once per card (a prioritize scores every candidate node this way).
    stranded_by_state: dict[tuple[bool, int, int], int] = {}
    free_now = frozenset(state.free_cards())

    def rank(card: CardState) -> tuple[float, ...]:
        same = (card.healthy, card.free_cores, card.free_memory_units)
        stranded = stranded_by_state.get(same)
        if stranded is None:
            # _share_area of the cards with this one holding the share: only its box changes
            after = dict(boxes)
            after[card.index] = (min(max(0, CORES_PER_CARD - (card.used_cores + cores)), CORES_PER_CARD - 1),
                                 max(0, card.memory_units - (card.used_memory_units + memory)))
            stranded = stranded_by_state[same] = area_before - _staircase_area(list(after.values()))
        # _intact(state, {card}) with the free set computed once
        broken = (intact_before - sum(len(group) for group in state.groups if group <= free_now - {card.index})
                  if card.is_free else 0)
        left_cores = (card.free_cores - cores) / CORES_PER_CARD
        left_memory = (card.free_memory_units - memory) / max(1, card.memory_units)
        if policy == "spread":
            # emptiest card first (most left on it), then the least damage
            return (-min(left_cores, left_memory), -(left_cores + left_memory), stranded, broken, card.index)
        # binpack: keep whole cards, then whole groups, then the most share sizes; best fit last
        return (card.is_free, broken, stranded, left_cores + left_memory, card.index)

    # fragment: the card whose use leaves the least expected fragment; then keep whole cards
    # and tree groups, then the tightest fit (binpack's order without its share-area count)
    key = fragment_rank if policy == "fragment" else rank
    return [((card.index, cores, memory),) for card in sorted(fitting, key=key)]


def _fgd_free(cards: Iterable[CardState]) -> list[int]:
    return [card.free_cores for card in cards if card.healthy]


def _fgd_cpu_after(state: NodeState, view: FragmentView) -> int | None:
    return state.headroom.cpu_milli - view.cpu_milli if state.headroom is not None else None


def _fgd_share_order(state: NodeState, fitting: Sequence[CardState], request: Request,
                     view: FragmentView | None) -> list[CardState]:
    """fgd-filter: the card leaving the least fragment first, then the tightest, then by index."""
    view = view or FragmentView()
    mix, cpu = view.mix_for({0: request}), _fgd_cpu_after(state, view)
    by_free: dict[int, float] = {}  # cards with the same free cores leave the same fragment
    healthy = [c for c in state.cards if c.healthy]
    free_now = [c.free_cores for c in healthy]
    position = {c.index: i for i, c in enumerate(healthy)}

    def rank(card: CardState) -> tuple[float, int, int, int]:
        after = by_free.get(card.free_cores)
        if after is None:
            # _fgd_free of the cards with this one holding the share's cores (it fits: it is healthy)
            free = list(free_now)
            free[position[card.index]] = max(0, CORES_PER_CARD - (card.used_cores + request.cores))
            after = by_free[card.free_cores] = round(fgd.node_fragment(free, cpu, state.labels, mix), 6)
        return (after, card.free_cores, card.free_memory_units, card.index)

    return sorted(fitting, key=rank)


def fgd_level(state: NodeState, requests: Mapping[int, Request], view: FragmentView | None = None) -> int | None:
    """fgd-filter's score of the pod on this node, 0-100 (FGD's resolution), None when it does not fit.

    The fall of FGD's expected fragment (``core.fgd``) under the view's learned mix once the
    pod's cards (as ``place_pod`` chooses them) and its CPU are taken."""
    view = view or FragmentView()
    placement = place_pod(state, requests, "fgd-filter", view=view)
    if isinstance(placement, Refusal):
        return None
    mix = view.mix_for(requests)
    cpu = state.headroom.cpu_milli if state.headroom is not None else None
    before = fgd.node_fragment(_fgd_free(state.cards), cpu, state.labels, mix)
    after = fgd.node_fragment(_fgd_free(state.apply(placement).cards), _fgd_cpu_after(state, view),
                              state.labels, mix)
    return fgd.fall_score(before, after)


def _share_refusal(state: NodeState, request: Request) -> str:
    want = f"needs {request.cores} cores and {format_mib(request.memory_mib)} on one card"
    healthy = [card for card in state.cards if card.healthy]
    if not state.cards:
        return f"{want}; this node has no GPUs"
    if not healthy:
        return f"{want}; no card on this node is healthy"
    biggest = max(healthy, key=lambda c: c.memory_units)
    if request.memory_units > biggest.memory_units:
        return f"{want}; the largest card on this node has {format_mib(biggest.memory_units * MEMORY_UNIT_MIB)}"
    if all(card.free_cores == 0 or card.free_memory_units == 0 for card in healthy):
        return f"{want}; all {len(healthy)} healthy cards are fully taken"
    best = max(healthy, key=lambda c: (min(c.free_cores, request.cores) * max(1, request.memory_units)
                                        + min(c.free_memory_units, request.memory_units) * request.cores,
                                        c.free_cores, c.free_memory_units))
    text = f"{want}; largest free share is {_describe_free(best)}"
    most_memory = max(healthy, key=lambda c: (c.free_memory_units, c.free_cores))
    most_cores = max(healthy, key=lambda c: (c.free_cores, c.free_memory_units))
    others = [c for c in (most_cores, most_memory) if c.index != best.index]
    if others:
        text += " (" + ", ".join(dict.fromkeys(_describe_free(c) for c in others)) + ")"
    return text


def _describe_free(card: CardState) -> str:
    return f"{card.free_cores} cores / {format_mib(card.free_memory_units * MEMORY_UNIT_MIB)} on card {card.index}"


# --- whole cards -----------------------------------------------------------------------------


def _card_sets(state: NodeState, request: Request) -> Iterator[tuple[int, ...]]:
    """Every set of ``request.cards`` free cards whose memory covers a declared amount."""
    for cards in itertools.combinations(state.free_cards(), request.cards):
        if sum(state.card(i).memory_units for i in cards) >= request.memory_units:
            yield cards


def _set_rank(state: NodeState, cards: tuple[int, ...], cost: int) -> tuple[int, int, int, tuple[int, ...]]:
    numa = {state.numa(i) for i in cards}
    return (cost, len(numa), -_intact(state, frozenset(cards)), cards)


def _interchangeable(state: NodeState, a: int, b: int) -> bool:
    """Cards a and b are alike for every set choice: same NUMA node, memory and links to all others."""
    if state.numa(a) != state.numa(b) or state.card(a).memory_units != state.card(b).memory_units:
        return False
    return all(state.pair_cost(a, c.index) == state.pair_cost(b, c.index)
               for c in state.cards if c.index not in (a, b))


def best_card_set(state: NodeState, request: Request) -> tuple[int, ...] | None:
    """The n free cards with the lowest pairwise link cost; ties by NUMA, then intact capacity.

    Exact. Free cards are first grouped into classes of interchangeable cards (an NVSwitch
    box is a few classes, not 16 cards), then a depth-first search chooses how many cards
    to take from each class, abandoning a branch once its cost exceeds the best complete
    choice (costs only grow as cards are added). Within a class the lowest indices are taken.
    """
    n = request.cards
    classes: list[list[int]] = []
    for card in state.free_cards():
        for members in classes:
            if _interchangeable(state, members[0], card):
                members.append(card)
                break
        else:
            classes.append([card])
    if sum(len(members) for members in classes) < n:
        return None
    first = [members[0] for members in classes]
    within = [state.pair_cost(m[0], m[1]) if len(m) > 1 else 0 for m in classes]
    across = [[state.pair_cost(a, b) for b in first] for a in first]
    room_after = [sum(len(m) for m in classes[i:]) for i in range(len(classes) + 1)]
    cheapest = min([c for c in within if c] + [c for row in across for c in row if c], default=0)
    best_cost: int | None = None
    best: list[tuple[int, ...]] = []

    def search(i: int, counts: list[int], left: int, partial: int) -> None:
        nonlocal best_cost, best
        if left == 0:
            cards = tuple(sorted(c for members, k in zip(classes, counts, strict=False) for c in members[:k]))
            if sum(state.card(c).memory_units for c in cards) < request.memory_units:
                return
            if best_cost is None or partial < best_cost:
                best_cost, best = partial, [cards]
            elif partial == best_cost:
                best.append(cards)
            return
        if room_after[i] < left:
            return
        for k in range(min(left, len(classes[i])), -1, -1):
            added = k * (k - 1) // 2 * within[i] + k * sum(counts[j] * across[j][i] for j in range(i))
            rest = left - k  # every pair still to come costs at least the cheapest link
            bound = (rest * (rest - 1) // 2 + rest * (n - rest)) * cheapest
            if best_cost is not None and partial + added + bound > best_cost:
                continue
            counts.append(k)
            search(i + 1, counts, left - k, partial + added)
            counts.pop()

    search(0, [], n, 0)
    if best_cost is None:
        return None
    final_cost = best_cost
    return min(best, key=lambda s: _set_rank(state, s, final_cost))


def _whole_candidates(state: NodeState, request: Request) -> Iterator[Assignment]:
    """The best set first; the others, ranked, only if a caller asks for more (backtracking)."""
    first = best_card_set(state, request)
    if first is None:
        return
    memory = {card.index: card.memory_units for card in state.cards}
    yield tuple((i, CORES_PER_CARD, memory[i]) for i in first)
    rest = sorted((s for s in _card_sets(state, request) if s != first),
                  key=lambda s: _set_rank(state, s, state.set_cost(s)))
    for cards in rest:
        yield tuple((i, CORES_PER_CARD, memory[i]) for i in cards)


def _whole_refusal(state: NodeState, request: Request) -> str:
    n = request.cards
    asked = f"asked for {n} whole card{'s' if n > 1 else ''}"
    free = state.free_cards()
    unhealthy = [card.index for card in state.cards if not card.healthy]
    sick = f"; card{'s' if len(unhealthy) > 1 else ''} {_list(unhealthy)} unhealthy" if unhealthy else ""
    if not state.cards:
        return f"{asked}; this node has no GPUs"
    if len(free) < n:
        if not free:
            return f"no whole card free on this node ({len(state.cards)} cards, all partly or fully taken{sick}); {asked}"
        return f"only {len(free)} whole card{'s' if len(free) != 1 else ''} free ({_list(free)}); {asked}{sick}"
    most = sorted((state.card(i).memory_units for i in free), reverse=True)[:n]
    return (f"{asked} with {format_mib(request.memory_mib)} in total, but the {n} largest free cards "
            f"have {format_mib(sum(most) * MEMORY_UNIT_MIB)}")


def _list(indices: Sequence[int]) -> str:
    return ", ".join(str(i) for i in indices)


# --- pods ----------------------------------------------------------------------------------


def _candidates(state: NodeState, request: Request, policy: str,
                view: FragmentView | None = None) -> Iterator[Assignment]:
    if request.is_share:
        yield from _share_candidates(state, request, policy, view)
    else:
        yield from _whole_candidates(state, request)


def _fits_alone(state: NodeState, request: Request) -> bool:
    """Whether ``_candidates`` would yield anything, without ranking them: a share fits
    when one card has room for it; whole cards when a set of them does."""
    if request.is_share:
        return any(card.fits_share(request.cores, request.memory_units) for card in state.cards)
    return best_card_set(state, request) is not None


def _refusal(state: NodeState, request: Request) -> str:
    return _share_refusal(state, request) if request.is_share else _whole_refusal(state, request)


def _check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise ValueError(f"unknown placement policy {policy!r}; use one of {', '.join(POLICIES)}")


def place_pod(state: NodeState, requests: Mapping[int, Request], policy: str = "binpack",
              reserved: frozenset[int] = frozenset(), view: FragmentView | None = None) -> PodPlacement | Refusal:
    """Cards for every container of a pod on this node, or the reason it does not fit.

    ``reserved`` cards (see ``reserve``) are treated as absent unless the pod fits on
    this node only by using them; ``uses_reserved`` tells the caller when that happened.
    ``view`` is the ``fragment`` policy's task mix and the pod's CPU/memory (ignored by
    the others). The node's CPU/memory headroom ranks choices; it never refuses a pod
    (kube-scheduler's own filter owns CPU and memory fit).
    """
    _check_policy(policy)
    if reserved & {card.index for card in state.cards}:
        kept = place_pod(_without(state, reserved), requests, policy, view=view)
        if isinstance(kept, PodPlacement):
            return kept
    return _place(state, requests, policy, view)


def _without(state: NodeState, cards: frozenset[int]) -> NodeState:
    """The node with these cards out of play (unhealthy: no share fits, never free)."""
    return replace(state, cards=tuple(replace(c, healthy=False) if c.index in cards else c for c in state.cards))


def uses_reserved(placement: PodPlacement, reserved: frozenset[int]) -> bool:
    return any(i in reserved for assignment in placement.containers.values() for i, _, _ in assignment)


def _place(state: NodeState, requests: Mapping[int, Request], policy: str,
           view: FragmentView | None = None) -> PodPlacement | Refusal:
    # Biggest first: whole-card sets need untouched cards, big shares need roomy cards.
    order = sorted(requests, key=lambda i: (-requests[i].cards, requests[i].is_share,
                                            -requests[i].cores, -requests[i].memory_units, i))
    for index in order:  # a container that does not fit even alone explains the refusal best
        if not _fits_alone(state, requests[index]):
            prefix = f"container {index}: " if len(requests) > 1 else ""
            return Refusal(prefix + _refusal(state, requests[index]))

    budget = [_SEARCH_BUDGET]
    last = len(order) - 1

    def search(position: int, current: NodeState) -> dict[int, Assignment] | None:
        if position > last:
            return {}
        index = order[position]
        for assignment in _candidates(current, requests[index], policy, view):
            budget[0] -= 1
            if budget[0] < 0:
                return None
            if position == last:  # nothing left to place on the state this assignment leaves
                return {index: assignment}
            rest = search(position + 1, current._with(assignment))
            if rest is not None:
                rest[index] = assignment
                return rest
        return None

    found = search(0, state)
    if found is None:
        asks = "; ".join(f"container {i}: {requests[i].describe()}" for i in sorted(requests))
        return Refusal(f"each container fits on its own but not all together on this node ({asks})")
    containers = {i: found[i] for i in sorted(found)}
    cost = sum(state.set_cost(i for i, _, _ in assignment) for assignment in containers.values()
               if len(assignment) > 1)
    return PodPlacement(containers, cost)


def could_ever_fit(state: NodeState, requests: Mapping[int, Request]) -> bool:
    """Whether the pod would fit if this node held nothing (with its cards' current health)."""
    return isinstance(place_pod(state.emptied(), requests), PodPlacement)


def best_possible_cost(state: NodeState, cards: int) -> int:
    """The lowest pairwise link cost any ``cards`` healthy cards of this node could have."""
    empty = state.emptied()
    found = best_card_set(empty, Request(cards * CORES_PER_CARD))
    return empty.set_cost(found) if found is not None else 0


# A node left with this many free whole cards or more counts as wide open.
_ROOMY_NODE = 8


# fragment: a change of expected fragment of this many cards spans the whole score range
FRAGMENT_SPAN = 1.0
# fragment: the share of the score given to keeping whole cards free (binpack's whole-card
# rule), which also outweighs kube-scheduler's own spreading between equally fragmenting nodes
FRAGMENT_PACKING = 0.15


def score_node(state: NodeState, requests: Mapping[int, Request], policy: str = "binpack",
               reserved: frozenset[int] = frozenset(), view: FragmentView | None = None) -> int:
    """0..10 for the extender's prioritize; 0 when the pod does not fit, 1..10 when it does.

    A pod that fits only by taking ``reserved`` cards scores 1, below every other fit.

    binpack prefers fuller nodes and cards (measured after the placement): a share that
    fits on a card already in use (no whole card broken) always scores above one that
    breaks a whole card (6..10 against 1..5); whole cards go where the fewest free whole
    cards are left. spread prefers emptier nodes and cards.
    fgd-filter: FGD's 0-100 score (``fgd_level``) over the 1..10 range (its filter already
    returned the one node of the best full-resolution score).
    fragment prefers the node whose expected fragment under the task mix grows least
    (falls most) once the pod and its CPU/memory are placed (a change of -FRAGMENT_SPAN/2
    cards or better is its best, +FRAGMENT_SPAN/2 or worse its worst), and, for a
    FRAGMENT_PACKING share of the score, the node left with the fewest free whole cards.
    For pods with multi-card containers, half the score is topology quality: the best
    link cost this node could ever offer over the link cost of the chosen sets.
    """
    placement = place_pod(state, requests, policy, reserved, view)
    if isinstance(placement, Refusal):
        return 0
    if uses_reserved(placement, reserved):
        return 1
    after = state.apply(placement)
    healthy = [card for card in after.cards if card.healthy]
    node_full = sum(_fullness(card) for card in healthy) / max(1, len(healthy))
    chosen = {i for assignment in placement.containers.values() for i, _, _ in assignment}
    cards_full = sum(_fullness(after.card(i)) for i in chosen) / max(1, len(chosen))
    packed = (node_full + cards_full) / 2
    if policy == "spread":
        fit = 1 - packed
    elif policy == "fgd-filter":  # the filter decides at full resolution; this is for prioritize
        fit = (fgd_level(state, requests, view) or 0) / 100
    elif policy == "fragment":
        view = view or FragmentView()
        mix = view.mix_for(requests)
        grown = fragment_of(after, mix, _headroom_after(state, view)) - fragment_of(state, mix)
        kept_whole = 1 - min(len(after.free_cards()), _ROOMY_NODE) / _ROOMY_NODE
        fit = ((1 - FRAGMENT_PACKING) * min(1.0, max(0.0, 0.5 - grown / FRAGMENT_SPAN))
               + FRAGMENT_PACKING * kept_whole)
    elif any(r.is_share for r in requests.values()):
        taken_whole = sum(len(a) for i, a in placement.containers.items() if not requests[i].is_share)
        broken = len(state.free_cards()) - len(after.free_cards()) - taken_whole
        fit = 0.45 * packed + (0.55 if broken == 0 else 0.0)
    else:
        # whole cards only: best fit on the free whole cards left, counted, not as a
        # fraction, so a big free node stays free for a big request
        fit = 1 - min(len(after.free_cards()), _ROOMY_NODE) / _ROOMY_NODE
    multi = [len(a) for a in placement.containers.values() if len(a) > 1]
    if multi:
        best = sum(best_possible_cost(state, n) for n in multi)
        quality = best / placement.link_cost if placement.link_cost else 1.0
        fit = 0.5 * quality + 0.5 * fit
    return 1 + round((MAX_SCORE - 1) * min(1.0, max(0.0, fit)))


def _fullness(card: CardState) -> float:
    return max(card.used_cores / CORES_PER_CARD, card.used_memory_units / max(1, card.memory_units))


# --- reservations for pending whole-card pods ------------------------------------------------


@dataclass(frozen=True)
class Reservation:
    """Cards held back on one node for a pending pod that asks for whole cards."""

    holder: int
    """The pod's position in the pending sequence given to ``reserve``."""
    node: str
    cards: frozenset[int]
    busy: int
    """How many of these cards still hold something (0: the pod fits now)."""


def reserve(nodes: Mapping[str, NodeState], pending: Sequence[Mapping[int, Request]], *,
            min_cards: int = 2, limit: int | None = 1) -> tuple[Reservation, ...]:
    """Reservations for pending pods asking for ``min_cards`` whole cards or more, oldest first.

    ``pending`` is oldest first. Each of the first ``limit`` such pods (None: all) gets the
    cards it would take on the node where it is closest to fitting: the fewest cards still
    busy, then the least held on them, then the lowest link cost, then the node's order in
    ``nodes``. Free cards are taken as the best set it would get; busy ones are the least
    used, so that shares kept off them let them drain. A pod that could not fit on any
    node even with every unreserved card free gets nothing. Pods with share containers
    get nothing; a multi-container pod reserves its cards together on one node.
    """
    taken: dict[str, frozenset[int]] = {name: frozenset() for name in nodes}
    out: list[Reservation] = []
    for position, requests in enumerate(pending):
        if limit is not None and len(out) >= limit:
            break
        if not requests or any(r.is_share for r in requests.values()):
            continue
        need = sum(r.cards for r in requests.values())
        if need < min_cards:
            continue
        best: tuple[tuple[int, float, int, int], str, frozenset[int]] | None = None
        for order, (name, state) in enumerate(nodes.items()):
            chosen = _closest_set(_without(state, taken[name]), need)
            if chosen is None:
                continue
            cards = [state.card(i) for i in chosen]
            key = (sum(not c.is_free for c in cards), sum(_fullness(c) for c in cards),
                   state.set_cost(chosen), order)
            if best is None or key < best[0]:
                best = key, name, chosen
        if best is not None:
            key, name, chosen = best
            taken[name] = taken[name] | chosen
            out.append(Reservation(position, name, chosen, key[0]))
    return tuple(out)


def _closest_set(state: NodeState, need: int) -> frozenset[int] | None:
    healthy = [card for card in state.cards if card.healthy]
    if len(healthy) < need:
        return None
    free = state.free_cards()
    if len(free) >= need:
        found = best_card_set(state, Request(need * CORES_PER_CARD))
        return frozenset(found) if found is not None else None
    busy = sorted((c for c in healthy if not c.is_free), key=lambda c: (_fullness(c), c.index))
    return frozenset(free) | {c.index for c in busy[: need - len(free)]}


def reserved_cards(reservations: Iterable[Reservation], node: str, holder: int | None = None) -> frozenset[int]:
    """The cards reserved on ``node`` for pods other than ``holder``."""
    return frozenset(i for r in reservations if r.node == node and r.holder != holder for i in r.cards)
