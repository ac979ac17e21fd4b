"""The decision caches, beside the decisions they hold and told of every ledger change.

Two layers, both forgotten node by node through ``Ledger.subscribe``:

- per node, a ``NodeMemo``: answers derived from that node's accounting (its placement
  state, verdicts and scores per request shape) in ``live``, cleared on every change, and
  answers that depend only on its cards (whether a shape could ever fit) in ``static``,
  cleared when the cards change;
- per request shape, a ``VerdictCache`` (filter) or ``ScoreCache`` (prioritize) over all
  nodes, so a filter over a thousand names is a few C-level passes plus deciding the
  nodes that changed since (least recently used shapes are dropped).

Each node the filter decided gets a slot (a small integer, kept for the process's life: the
nodes a ledger ever knew), and a ``VerdictCache`` mirrors its verdicts in an array by slot,
so the filter turns the names into slots once and finds the passed, failed and undecided
names with array operations instead of one pass over the names per set.

Every method is called under the ledger's lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from .ledger import Ledger

MEMO_LIMIT = 512
"""Entries a node's memo keeps before starting over: request shapes are many over a long life."""

MAX_CACHED_SHAPES = 64
"""Request shapes whose per-node answers are kept (least recently used dropped first)."""

T = TypeVar("T", "VerdictCache", "ScoreCache")


def remember(memo: dict[Any, Any], key: Any, value: Any) -> None:
    """``memo[key] = value``, starting over when the memo is full."""
    if len(memo) >= MEMO_LIMIT:
        memo.clear()
    memo[key] = value


class NodeMemo:
    """Answers derived from one node: ``live`` (its accounting) and ``static`` (its cards only)."""

    __slots__ = ("live", "static")

    def __init__(self) -> None:
        self.live: dict[Any, Any] = {}
        self.static: dict[Any, Any] = {}


UNDECIDED, PASSES, FAILS, NEVER = 0, 1, 2, 3
"""A ``VerdictCache``'s states by slot: not decided (or forgotten), passes, fails now, can never fit."""


class VerdictCache:
    """Per node, the filter verdict for one request shape, and the nodes it passes.

    Sets and dicts so that a filter over a thousand names is a few C-level loops, and
    ``state``: the verdict's kind by the node's slot (``DecisionCache.slots``) whose last
    element is always ``UNDECIDED``, so that slot -1 (a name without a slot) reads as
    undecided; ``forget(node, slot)`` runs whenever that node's accounting changes.
    """

    __slots__ = ("values", "passing", "failed", "unresolvable", "state")

    def __init__(self) -> None:
        self.values: dict[str, tuple[str | None, bool]] = {}
        self.passing: set[str] = set()
        self.failed: dict[str, str] = {}
        self.unresolvable: dict[str, str] = {}
        self.state = np.zeros(1, dtype=np.int8)

    def set(self, name: str, verdict: tuple[str | None, bool], slot: int) -> None:
        self.values[name] = verdict
        reason, never = verdict
        if reason is None:
            self.passing.add(name)
            kind = PASSES
        elif never:
            self.unresolvable[name] = reason
            kind = NEVER
        else:
            self.failed[name] = reason
            kind = FAILS
        self.reserve(slot + 1)
        self.state[slot] = kind

    def forget(self, name: str, slot: int) -> None:
        if self.values.pop(name, None) is not None:
            self.passing.discard(name)
            self.failed.pop(name, None)
            self.unresolvable.pop(name, None)
            if 0 <= slot < len(self.state) - 1:
                self.state[slot] = UNDECIDED

    def reserve(self, slots: int) -> None:
        """Room for ``slots`` slots besides the last (always undecided) element."""
        if slots > len(self.state) - 1:
            grown = np.zeros(max(slots, 2 * len(self.state)) + 1, dtype=np.int8)
            grown[:len(self.state) - 1] = self.state[:-1]
            self.state = grown

    def states(self, slots: np.ndarray, count: int) -> np.ndarray:
        """The state of each slot (-1 reads as undecided); ``count``: slots handed out so far."""
        self.reserve(count)
        return self.state[slots]


class ScoreCache(dict[str, int]):
    """Per node, the prioritize score for one request shape and policy."""

    def forget(self, name: str, slot: int) -> None:
        self.pop(name, None)


class DecisionCache:
    """Every cached decision of one extender, kept in step with ``ledger``."""

    def __init__(self, ledger: Ledger) -> None:
        self._shapes: OrderedDict[Any, VerdictCache | ScoreCache] = OrderedDict()
        self._nodes: dict[str, NodeMemo] = {}
        self.slots: dict[str, int] = {}  # node name -> slot, for the verdict arrays
        ledger.subscribe(self.forget)

    def slot(self, name: str) -> int:
        """The node's slot (handed out on first use; only for nodes the ledger knows)."""
        found = self.slots.get(name)
        if found is None:
            found = self.slots[name] = len(self.slots)
        return found

    def node(self, name: str) -> NodeMemo:
        """The memo of a node the ledger knows (created on first use)."""
        memo = self._nodes.get(name)
        if memo is None:
            memo = self._nodes[name] = NodeMemo()
        return memo

    def shape(self, key: Any, factory: Callable[[], T]) -> T:
        """The per-node answers for one request shape (LRU over shapes)."""
        found = self._shapes.get(key)
        if found is None:
            made = factory()
            self._shapes[key] = made
            if len(self._shapes) > MAX_CACHED_SHAPES:
                self._shapes.popitem(last=False)
            return made
        self._shapes.move_to_end(key)
        return found  # type: ignore[return-value]

    def shapes(self) -> int:
        return len(self._shapes)

    def forget(self, name: str, cards_changed: bool) -> None:
        """The ledger changed ``name``: nothing computed from its old state may be answered again."""
        memo = self._nodes.get(name)
        if memo is not None:
            memo.live.clear()
            if cards_changed:
                memo.static.clear()
        slot = self.slots.get(name, -1)
        for cache in self._shapes.values():
            cache.forget(name, slot)
