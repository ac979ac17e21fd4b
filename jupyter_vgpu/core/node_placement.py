"""A pod on one node with both kinds of capacity: time-shared cards and MIG slices. Pure.

Whole-card containers always go on whole (non-MIG) cards through ``core.placement``. The
pod's share containers go all on MIG slices or all on time-shared cards, by route:

- a pod that asks for isolation: slices only, on cards whose sharing mode offers them;
- otherwise, the node's sharing mode (``core.mig.Sharing``) orders the routes: time-shared
  cards first (``isolated``, ``prefer-time-shared``, ``time-shared``), or slices first
  (``prefer-mig``, ``mig``); a route whose cards may not serve this pod is skipped.

A node without slices and a pod that does not ask for isolation take exactly the
time-shared placement (``placement.place_pod`` / ``score_node``) and nothing else.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from jupyter_vgpu.core import placement
from jupyter_vgpu.core.contract import Request
from jupyter_vgpu.core.mig import Sharing
from jupyter_vgpu.core.mig_placement import NodeSlice, SlicePlacement, place_slices, score_slices
from jupyter_vgpu.core.placement import NodeState, PodPlacement, Refusal

SLICES = "slices"
TIME_SHARED = "time-shared"


@dataclass(frozen=True)
class NodePlacement:
    cards: PodPlacement       # containers on whole or time-shared cards (possibly none)
    slices: SlicePlacement    # containers on MIG slices (possibly none)


def plain(slices: Sequence[NodeSlice], sharing: Sharing, isolated: bool) -> bool:
    """Whether the pod is placed exactly as without MIG (no slice could serve it, nothing restricts cards)."""
    return not isolated and not sharing.cards and sharing.mode != "mig" and \
        not any(sharing.slices_serve(s.card, False) for s in slices)


def routes(sharing: Sharing, isolated: bool) -> tuple[str, ...]:
    if isolated:
        return (SLICES,)
    return (SLICES, TIME_SHARED) if sharing.prefers_slices else (TIME_SHARED, SLICES)


def place(state: NodeState, slices: Sequence[NodeSlice], held: Collection[str], requests: Mapping[int, Request],
          policy: str, sharing: Sharing, isolated: bool) -> NodePlacement | Refusal:
    """Where every container of the pod goes on this node, or why it cannot."""
    if plain(slices, sharing, isolated):
        found = placement.place_pod(state, requests, policy)
        return found if isinstance(found, Refusal) else NodePlacement(found, SlicePlacement({}))
    shares = {i: r for i, r in requests.items() if r.is_share}
    wholes = {i: r for i, r in requests.items() if not r.is_share}
    reasons = []
    for route in routes(sharing, isolated):
        if route == SLICES and shares:
            on_cards = placement.place_pod(state, wholes, policy)
            if isinstance(on_cards, Refusal):
                return on_cards
            on_slices = place_slices(slices, held, shares, lambda card: sharing.slices_serve(card, isolated))
            if isinstance(on_slices, SlicePlacement):
                return NodePlacement(on_cards, on_slices)
            reasons.append(f"on MIG slices: {on_slices.reason}")
        elif route == TIME_SHARED:
            found = _time_shared(state, requests, wholes, shares, policy, sharing)
            if isinstance(found, PodPlacement):
                return NodePlacement(found, SlicePlacement({}))
            reasons.append(f"on time-shared cards: {found.reason}" if shares else found.reason)
    if not shares:
        found = placement.place_pod(state, wholes, policy)
        return found if isinstance(found, Refusal) else NodePlacement(found, SlicePlacement({}))
    return Refusal("; ".join(reasons) or "no card on this node may serve this pod's shares")


def _time_shared(state: NodeState, requests: Mapping[int, Request], wholes: Mapping[int, Request],
                 shares: Mapping[int, Request], policy: str, sharing: Sharing) -> PodPlacement | Refusal:
    banned = {c.index for c in state.cards if not sharing.time_shares_serve(c.index, False)}
    if not banned or not shares:
        return placement.place_pod(state, requests, policy)
    on_cards = placement.place_pod(state, wholes, policy)
    if isinstance(on_cards, Refusal):
        return on_cards
    after = state.apply(on_cards)
    allowed = replace(after, cards=tuple(replace(c, healthy=False) if c.index in banned else c for c in after.cards))
    on_shares = placement.place_pod(allowed, shares, policy)
    if isinstance(on_shares, Refusal):
        return on_shares
    containers = {**on_cards.containers, **on_shares.containers}
    return PodPlacement({i: containers[i] for i in sorted(containers)}, on_cards.link_cost)


def score(state: NodeState, slices: Sequence[NodeSlice], held: Collection[str], requests: Mapping[int, Request],
          policy: str, sharing: Sharing, isolated: bool) -> int:
    """0..10 for prioritize: 0 when the pod does not fit; slices score by how closely they fit."""
    if plain(slices, sharing, isolated):
        return placement.score_node(state, requests, policy)
    found = place(state, slices, held, requests, policy, sharing, isolated)
    if isinstance(found, Refusal):
        return 0
    if found.slices.containers:
        on_slices = {i: requests[i] for i in found.slices.containers}
        value = score_slices(found.slices, on_slices)
        if found.cards.containers:
            value = min(value, placement.score_node(state, {i: requests[i] for i in found.cards.containers}, policy))
        return value
    return max(1, placement.score_node(state, requests, policy))

