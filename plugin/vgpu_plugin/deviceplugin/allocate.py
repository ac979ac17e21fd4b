"""Which container kubelet is admitting, and what it gets: pure functions over pod views and the ledger.

kubelet's Allocate names device IDs, never the pod. The pod is found the way
gpu-admission's partner (gpu-manager) finds it: bound to this node, placed by the
scheduler extender (``predicate-*`` annotations), not yet served, asking for exactly
that many devices; among several, the oldest predicate time.

``gpu-assigned=true`` is written by whoever creates the pod as easily as by this daemon,
so it hides a pod only when kubelet certainly admitted it already (the ledger holds all
its containers, or kubelet runs it): a pod marked assigned but never served is a candidate and a rival
like any other, never invisible (an invisible pod's Allocate would be answered with a
waiting pod's placement, identity and token).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import CardShare, ContainerAllocation, Names

from .devices import CORE, MEMORY, card_of, cards_in
from .pods import PodView, Wanted
from .served import Key, Ledger

if TYPE_CHECKING:
    from jupyter_vgpu.core.inventory import Card

log = logging.getLogger(__name__)


class AllocationError(Exception):
    """Allocate cannot be answered; the message is what kubelet puts on the pod."""


def settled_pods(views: Sequence[PodView], ledger: Ledger, running: Collection[str]) -> set[str]:
    """UIDs of the pods marked assigned that kubelet certainly admitted: the ledger holds every one
    of their containers, or kubelet runs them (a status only kubelet writes). No Allocate is for these."""
    started = ledger.started_pods()
    return {v.uid for v in views if v.assigned and (v.uid in running or (
        v.uid in started and all(ledger.container_complete(w) for w in v.containers)))}


def choose(ledger: Ledger, kind: str, count: int, ids: Sequence[str] | None, views: Sequence[PodView],
           settled: Collection[str]) -> Wanted | None:
    """The container kubelet is most likely admitting with ``count`` devices of ``kind``."""
    id_cards = set(cards_in(ids or ()))
    best: tuple[Any, ...] | None = None
    chosen = None
    same_count: list[Wanted] = []
    started = ledger.started_pods()
    for view in views:
        if view.uid in settled or view.problem:
            continue
        pod_started = view.uid in started
        for wanted in view.containers:
            key = (wanted.uid, wanted.index)
            if wanted.count(kind) != count or ledger.served_kind(key, kind):
                continue
            same_count.append(wanted)
            other = MEMORY if kind == CORE else CORE
            half_served = ledger.served_kind(key, other)
            planned = ledger.overrides.get(key)
            plan_cards = {s.index for s in planned.cards} if planned else set(wanted.cards)
            rank = (
                0 if half_served else 1,          # the other resource of this container came first
                0 if pod_started else 1,          # kubelet finishes a pod before the next
                wanted.predicate_time,            # then the oldest placement
                0 if id_cards and id_cards <= plan_cards else 1,
                wanted.namespace, wanted.pod, wanted.index,
            )
            if best is None or rank < best:
                best, chosen = rank, wanted
    if kind == CORE and ids is not None and chosen is not None and best is not None and best[0]:
        _warn_if_answers_differ(chosen, same_count, count)
    return chosen


def _answered_as(wanted: Wanted) -> tuple[int, bool]:
    """What a vcuda-core answer carries besides the card: a share's memory limit, a MIG slice."""
    return (wanted.request.memory_units if wanted.request.is_share else 0), bool(wanted.mig_device)


def _warn_if_answers_differ(chosen: Wanted, same_count: Sequence[Wanted], count: int) -> None:
    """A vcuda-core Allocate that came first is a guess among the containers asking for ``count``:
    when their answers differ, a wrong guess swaps their limits, and kubelet keeps the first answer."""
    others = [w for w in same_count if w is not chosen and _answered_as(w) != _answered_as(chosen)]
    if others:
        log.warning("Allocate of %d vcuda-core: guessing %s, but %s ask(s) for as many vcuda-core with other "
                    "limits; if kubelet is admitting that one, the two get each other's limits. The vGPU "
                    "scheduler extender binds such pods to a node one at a time: does another scheduler bind here?",
                    count, chosen.describe(), "; ".join(w.describe() for w in others[:3]))


def rivals(ledger: Ledger, count: int, views: Sequence[PodView], settled: Collection[str]) -> list[Key]:
    """Every container kubelet could be admitting with ``count`` vcuda-core devices: those waiting,
    and those we answered by a guess kubelet's checkpoint has not confirmed (that guess may be wrong,
    and then the container it named is the one still waiting)."""
    found: list[Key] = []
    for view in views:
        if view.uid in settled:
            continue
        if view.problem:  # not served by its claim: a rival when it asks for as many, or its requests are unknown
            if view.requests is None or any(r.cores == count for r in view.requests.values()):
                found.append((view.uid, -1))
            continue
        for wanted in view.containers:
            key = (wanted.uid, wanted.index)
            served = ledger.served.get(key)
            if wanted.count(CORE) == count and (
                    not ledger.served_kind(key, CORE) or (served is not None and served.guessed)):
                found.append(key)
    return found


def unaccountable(ledger: Ledger, kind: str, count: int, views: Sequence[PodView], settled: Collection[str],
                  running: Collection[str]) -> list[PodView]:
    """Pods kubelet could be admitting with ``count`` devices of ``kind`` that we cannot account for:
    bound to this node, asking for vGPU, with no valid claim of the extender (bound by ``nodeName``
    or by another scheduler, or with a claim that does not hold), not running yet. Answering the
    waiting pod we can account for would be a guess, and when kubelet is admitting the other one
    it would get that pod's card, limits and token: Allocate refuses instead (issue 32)."""
    found = []
    for view in views:
        if not view.problem or view.uid in settled or view.uid in running:
            continue
        if view.requests is None or any(
                (r.cores if kind == CORE else r.memory_units) == count for r in view.requests.values()):
            found.append(view)
    return found


def refuse_unaccountable(wanted: Wanted, kind: str, count: int, names: Names,
                         others: Sequence[PodView]) -> AllocationError:
    resource = names.core_resource if kind == CORE else names.memory_resource
    listed = "; ".join(f"{v.namespace}/{v.name} ({v.problem})" for v in others[:3])
    more = f" and {len(others) - 3} more" if len(others) > 3 else ""
    return AllocationError(
        f"refusing to guess: kubelet asks for {count} {resource}, and besides {wanted.describe()} pod(s) "
        f"the vGPU scheduler extender did not place could be the one it is admitting: {listed}{more}. "
        f"A vGPU pod must be created with schedulerName and no nodeName so the extender places it; "
        f"once the pod(s) named are deleted or refused by kubelet, start the refused pod again")


def no_match(ledger: Ledger, node: str, names: Names, kind: str, count: int, views: Sequence[PodView],
             settled: Collection[str]) -> AllocationError:
    resource = names.core_resource if kind == CORE else names.memory_resource
    candidates = [v for v in views if v.uid not in settled]
    waiting = [w for v in candidates if not v.problem for w in v.containers
               if not ledger.served_kind((w.uid, w.index), kind) and w.count(kind)]
    problems = [f"{v.namespace}/{v.name}: {v.problem}" for v in candidates if v.problem]
    text = f"no pod bound to node {node} is waiting for exactly {count} {resource}"
    if waiting:
        listed = "; ".join(w.describe() for w in waiting[:5])
        more = f" and {len(waiting) - 5} more" if len(waiting) > 5 else ""
        text += f"; containers waiting here ask for: {listed}{more}"
    else:
        text += "; no vGPU container is waiting on this node"
    if problems:
        text += "; ignored: " + "; ".join(problems[:5])
    text += (f". A pod must be placed by the vGPU scheduler extender ({names.predicate_node}="
             f"{node} and {names.predicate_gpu_idx_prefix}<i> annotations) before kubelet admits it")
    return AllocationError(text)


def placement(wanted: Wanted, override: ContainerAllocation | None, cards: Mapping[int, Card],
              node: str) -> ContainerAllocation:
    """What the container gets: a placement moved to it, else its record, else the scheduler's cards."""
    planned = override or wanted.record
    if planned is not None:
        return replace(planned, name=wanted.container, cards=tuple(
            replace(s, uuid=cards[s.index].uuid) if s.index in cards else s for s in planned.cards))
    request = wanted.request
    missing = [i for i in wanted.cards if i not in cards]
    if missing:
        raise AllocationError(
            f"{wanted.describe()}: card(s) {missing} assigned by the scheduler do not exist on node "
            f"{node} (it has {sorted(cards)})")
    if request.is_share:
        if len(wanted.cards) != 1:
            raise AllocationError(f"{wanted.describe()}: a share must be on one card, the scheduler chose "
                                  f"{len(wanted.cards)}")
        index = wanted.cards[0]
        shares: tuple[CardShare, ...] = (CardShare(index, cards[index].uuid, request.cores, request.memory_units,
                                                   wanted.mig_device),)
    else:
        if len(set(wanted.cards)) != request.cards:
            raise AllocationError(f"{wanted.describe()}: {request.cards} whole card(s) requested but the "
                                  f"scheduler chose {len(set(wanted.cards))}")
        shares = tuple(CardShare(i, cards[i].uuid, c.CORES_PER_CARD, cards[i].memory_units)
                       for i in sorted(set(wanted.cards)))
    return ContainerAllocation(index=wanted.index, name=wanted.container, cards=shares)


def check_fits(ledger: Ledger, wanted: Wanted, allocation: ContainerAllocation, cards: Mapping[int, Card],
               node: str, reason: Callable[[int], str | None]) -> None:
    """AllocationError when a card is missing, unhealthy, or would be over-committed."""
    key = (wanted.uid, wanted.index)
    for share in allocation.cards:
        card = cards.get(share.index)
        if card is None:
            raise AllocationError(f"{wanted.describe()}: card {share.index} does not exist on node {node}")
        if share.mig_device:
            check_slice(ledger, wanted, share, card, key)
            continue
        if not card.healthy:
            why = reason(share.index) or "unhealthy"
            raise AllocationError(f"{wanted.describe()}: card {share.index} is unhealthy ({why})")
        used_cores, used_units = ledger.used_on(share.index, besides=key)
        if used_cores + share.cores > c.CORES_PER_CARD or used_units + share.memory_units > card.memory_units:
            raise AllocationError(
                f"{wanted.describe()}: card {share.index} cannot take {share.cores} cores and "
                f"{share.memory_units} memory units: {used_cores} cores and {used_units} of "
                f"{card.memory_units} units are already given out on this node")


def check_slice(ledger: Ledger, wanted: Wanted, share: CardShare, card: Card, key: Key) -> None:
    """AllocationError unless the MIG slice exists on the card, is healthy, fits and no one else holds it."""
    found = next((s for s in card.slices if s.uuid == share.mig_device), None)
    if found is None:
        raise AllocationError(f"{wanted.describe()}: MIG slice {share.mig_device} does not exist on card "
                              f"{share.index} (the layout may have changed; the pod must be placed again)")
    if not found.placeable:
        raise AllocationError(f"{wanted.describe()}: MIG slice {found.profile} ({found.uuid}) is unhealthy "
                              f"or shares its memory")
    if found.cores < share.cores or found.memory_units < share.memory_units:
        raise AllocationError(f"{wanted.describe()}: MIG slice {found.profile} is smaller than the request")
    holder = ledger.slice_holder(share.mig_device, besides=key)
    if holder is not None:
        raise AllocationError(f"{wanted.describe()}: MIG slice {found.profile} ({found.uuid}) is already "
                              f"given to another container ({holder})")


def quota(kind: str, allocation: ContainerAllocation, size: int) -> dict[int, int]:
    """How many of ``size`` devices of a kind each card of the allocation should supply."""
    if kind == CORE:
        return {s.index: s.cores for s in allocation.cards}
    shares = sorted(allocation.cards, key=lambda s: s.index)
    if len(shares) == 1:
        return {shares[0].index: size}
    per, extra = divmod(size, len(shares))  # whole cards with declared memory: spread it evenly
    return {s.index: per + (1 if i < extra else 0) for i, s in enumerate(shares)}


def preferred_ids(available: Sequence[str], must_include: Sequence[str], size: int,
                  per_card: Mapping[int, int]) -> list[str]:
    """kubelet's must-include IDs, then IDs on the planned cards up to each card's quota, then any.

    In the order of ``_id_order`` (card, then ID): the planned cards' IDs are sorted card by card,
    and the whole pool only when those do not fill the request (kubelet names ~2,000 IDs a call)."""
    chosen = list(dict.fromkeys(must_include))[:size] if size > 0 else []
    picked = set(chosen)
    taken = cards_in(chosen)
    on_planned: dict[int, set[str]] = {}
    if per_card:
        for device in available:
            card = card_of(device)
            if card is not None and card in per_card and taken[card] < per_card[card] and device not in picked:
                on_planned.setdefault(card, set()).add(device)
    for card in sorted(on_planned):
        room = min(per_card[card] - taken[card], size - len(chosen))
        if room <= 0:
            continue
        some = sorted(on_planned[card])[:room]
        chosen.extend(some)
        taken[card] += len(some)
    if len(chosen) < size:  # kubelet's accounting may differ from ours: fill up from the rest
        picked = set(chosen)
        chosen.extend(sorted((d for d in set(available) if d not in picked), key=_id_order)[:size - len(chosen)])
    return chosen


def _id_order(device: str) -> tuple[int, str]:
    card = card_of(device)
    return (card if card is not None else 1 << 30, device)
