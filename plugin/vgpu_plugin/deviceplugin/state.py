"""The node's cards and their health, shared by the gRPC servers, the allocator and the publisher."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jupyter_vgpu.core.inventory import Card


class CardsState:
    """Current cards with health; ``version`` goes up on every change and wakes waiters."""

    def __init__(self, cards: list[Card] | None = None) -> None:
        self._cond = threading.Condition()
        self._cards: list[Card] = list(cards or [])
        self._reasons: dict[int, str] = {}
        self.version = 0

    def cards(self) -> list[Card]:
        with self._cond:
            return list(self._cards)

    def by_index(self) -> dict[int, Card]:
        with self._cond:
            return {card.index: card for card in self._cards}

    def reason(self, index: int) -> str | None:
        """Why a card is unhealthy (the last health event), None when healthy or unknown."""
        with self._cond:
            return self._reasons.get(index)

    def replace_cards(self, cards: list[Card]) -> None:
        with self._cond:
            if cards != self._cards:
                self._cards = list(cards)
                self._bump()

    def set_health(self, index: int, healthy: bool, reason: str) -> bool:
        """True when the card's health changed."""
        with self._cond:
            for i, card in enumerate(self._cards):
                if card.index != index:
                    continue
                healthy = healthy and card.unavailable is None  # a MIG card stays out of sharing
                if healthy:
                    self._reasons.pop(index, None)
                else:
                    self._reasons[index] = reason
                if card.healthy == healthy:
                    return False
                self._cards[i] = replace(card, healthy=healthy)
                self._bump()
                return True
            return False

    def refresh_mig(self, current: list[Card]) -> bool:
        """Take the MIG mode and slices (layout, slice health) from a fresh inventory; True when they changed.

        Only MIG fields change here: a card's own health follows health events (``set_health``).
        """
        fresh = {card.index: card for card in current}
        with self._cond:
            changed = False
            for i, card in enumerate(self._cards):
                new = fresh.get(card.index)
                if new is None or (new.mig, new.unavailable, new.slices) == (card.mig, card.unavailable, card.slices):
                    continue
                healthy = card.healthy and new.unavailable is None
                self._cards[i] = replace(card, mig=new.mig, unavailable=new.unavailable, slices=new.slices,
                                         healthy=healthy)
                changed = True
            if changed:
                self._bump()
            return changed

    def wait_for_change(self, seen_version: int, timeout: float) -> int:
        """Block until the version differs from ``seen_version`` or the timeout passes; the version."""
        with self._cond:
            self._cond.wait_for(lambda: self.version != seen_version, timeout)
            return self.version

    def poke(self) -> None:
        """Wake every waiter without a change (used at shutdown)."""
        with self._cond:
            self._cond.notify_all()

    def _bump(self) -> None:
        self.version += 1
        self._cond.notify_all()
