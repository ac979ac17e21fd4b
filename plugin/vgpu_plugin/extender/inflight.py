"""Binds under way whose claim is not in the ledger yet.

A bind queues behind its node's bind lock (one claim and Binding per node at a time), and until
it claims, the ledger does not show it: in a burst (a class starting its notebooks) the next
pods' filters would see that node as idle and queue there too. So a bind notes its node while
it waits for the lock and makes its claim, and the filter counts the noted binds with the pods
kubelet has still to admit (``Decisions._away_from_rivals``).
"""

from __future__ import annotations

import threading
from collections.abc import Set

Shapes = Set[tuple[int, int, bool]]  # ledger.answer_shape of each container


class InFlight:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, tuple[str, Shapes]] = {}  # uid -> (node, shapes)

    def note(self, uid: str, node: str, shapes: Shapes) -> None:
        if uid:
            with self._lock:
                self._pods[uid] = (node, shapes)

    def done(self, uid: str) -> None:
        with self._lock:
            self._pods.pop(uid, None)

    def by_node(self, without: str = "") -> dict[str, list[Shapes]]:
        """node -> the shapes of the binds under way there (``without`` that pod's)."""
        if not self._pods:  # the usual case outside a burst: no lock taken
            return {}
        found: dict[str, list[Shapes]] = {}
        with self._lock:
            for uid, (node, shapes) in self._pods.items():
                if uid != without:
                    found.setdefault(node, []).append(shapes)
        return found


def shapes_rival(mine: Shapes, theirs: Shapes) -> bool:
    """Some container of each asks for as many vcuda-core with another answer (``ledger.rival``)."""
    return any(a[0] == b[0] and a != b for a in mine for b in theirs)
