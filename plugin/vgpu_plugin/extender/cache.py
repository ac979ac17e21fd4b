"""The decision caches, beside the decisions they hold and told of every ledger change.

Two layers, both forgotten node by node through ``Ledger.subscribe``:

- per node, a ``NodeMemo``: answers derived from that node's accounting (its placement
  state, verdicts and scores per request shape) in ``live``, cleared on every change, and
  answers that depend only on its cards (whether a shape could ever fit) in ``static``,
  cleared when the cards change;
- per request shape, a ``VerdictCache`` (filter) or ``ScoreCache`` (prioritize) over all
  nodes, so a filter over a thousand names is a few array operations plus deciding the
  nodes that changed since (least recently used shapes are dropped).

Each node the filter decided gets a slot (a small integer, kept for the process's life: the
nodes a ledger ever knew), and a ``VerdictCache`` keeps its verdicts in arrays by slot, so
the filter turns the names into slots once and finds the passed, failed and undecided names
with array operations.

Every method is called under the ledger's lock.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from .ledger import Ledger

MEMO_LIMIT = 512
"""Entries a node's memo keeps before starting over: request shapes are many over a long life."""

MAX_CACHED_SHAPES = 64
"""Request shapes whose per-node answers are kept (least recently used dropped first)."""

NAME_LISTS = 16
"""Lists of names whose slots are kept (least recently used dropped first): kube-scheduler
sends the same lists again (every node, or the same rotation of its sample of them)."""

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
    """Per node, the filter verdict for one request shape, by the node's slot.

    ``state``: the verdict's kind by slot (``DecisionCache.slots``), whose last element is
    always ``UNDECIDED``, so that slot -1 (a name without a slot) reads as undecided;
    ``reason``: why it fails, by slot (None: passes or undecided). ``forget(node, slot)``
    runs whenever that node's accounting changes.
    """

    __slots__ = ("state", "reason")

    def __init__(self) -> None:
        self.state = np.zeros(1, dtype=np.int8)
        self.reason = np.full(1, None, dtype=object)

    def set(self, verdict: tuple[str | None, bool], slot: int) -> None:
        reason, never = verdict
        self.reserve(slot + 1)
        self.state[slot] = PASSES if reason is None else NEVER if never else FAILS
        self.reason[slot] = reason

    def forget(self, name: str, slot: int) -> None:
        if 0 <= slot < len(self.state) - 1:
            self.state[slot] = UNDECIDED
            self.reason[slot] = None

    def reserve(self, slots: int) -> None:
        """Room for ``slots`` slots besides the last (always undecided) element."""
        if slots > len(self.state) - 1:
            size = max(slots, 2 * len(self.state)) + 1
            grown = np.zeros(size, dtype=np.int8)
            grown[:len(self.state) - 1] = self.state[:-1]
            self.state = grown
            reasons = np.full(size, None, dtype=object)
            reasons[:len(self.reason) - 1] = self.reason[:-1]
            self.reason = reasons

    def states(self, slots: np.ndarray, count: int) -> np.ndarray:
        """The state of each slot (-1 reads as undecided), a new array; ``count``: slots handed out so far."""
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
        # recent lists of names -> (the list, its slots, how many slots there were then)
        self._lists: OrderedDict[tuple[int, str, str], tuple[list[str], np.ndarray, int]] = OrderedDict()
        ledger.subscribe(self.forget)

    def slot(self, name: str) -> int:
        """The node's slot (handed out on first use; only for nodes the ledger knows)."""
        found = self.slots.get(name)
        if found is None:
            found = self.slots[name] = len(self.slots)
        return found

    def slots_of(self, names: list[str]) -> np.ndarray:
        """Each name's slot (-1: none yet), a new array. A list met lately is found by comparing
        strings (no hash per name: a request's names are new strings); it is still right only
        while no slot was handed out since, when a name without one might have got one."""
        if not names:
            return np.zeros(0, dtype=np.int64)
        key = (len(names), names[0], names[-1])
        seen = self._lists.get(key)
        if seen is not None and seen[2] == len(self.slots) and seen[0] == names:
            self._lists.move_to_end(key)
            copied: np.ndarray = seen[1].copy()  # the method: no Python wrapper to run (cold caches)
            return copied
        slots = np.fromiter(map(self.slots.get, names, itertools.repeat(-1)), dtype=np.int64, count=len(names))
        if len(names) <= len(self.slots):  # bounded: no list longer than the nodes ever known is kept
            self._lists[key] = (names, slots.copy(), len(self.slots))
            self._lists.move_to_end(key)
            if len(self._lists) > NAME_LISTS:
                self._lists.popitem(last=False)
        return slots

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
