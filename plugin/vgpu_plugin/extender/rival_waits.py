"""Binds waiting, on the server's loop, for a rival pod on their node to be admitted by kubelet.

A bind that must wait (``decisions.RivalWait``) holds no bind worker: its request awaits a future
here, filed under the node, and goes back to a worker once its rival has settled. The ledger's
listener, called under the ledger's lock on whichever thread changed a node, only asks the loop to
wake that node's waiters (it never blocks); each then asks again, under the ledger's lock, whether
its rival has settled. A waiter is filed before it first asks, so no change is missed in between.

A wait costs a future, a coroutine and its request's connection, so only memory bounds them:
``WAITING_BINDS`` at once; one more is refused at once (docs/design.md).
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable

from .ledger import Ledger

WAITING_BINDS = 1000
"""Most binds waiting at once on the loop (a future and a coroutine each, and their connection)."""


class RivalWaitsClosed(RuntimeError):
    """The extender is stopping: the bind waits no more."""


class Waited(enum.Enum):
    SETTLED = enum.auto()  # the rival was admitted, or left the node
    LATE = enum.auto()     # the deadline passed first
    FULL = enum.auto()     # ``limit`` binds wait already: not waited at all


class RivalWaits:
    """Per node, the futures of the binds waiting there; ``wait`` and ``close`` on the loop's thread."""

    def __init__(self, ledger: Ledger, limit: int = WAITING_BINDS) -> None:
        self.limit = limit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._nodes: dict[str, set[asyncio.Future[None]]] = {}
        self._tasks: set[asyncio.Task[object]] = set()  # the requests waiting, to finish at close
        ledger.subscribe(self._changed)

    @property
    def waiting(self) -> int:
        return len(self._tasks)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # what a stopped loop left unfinished went with it
        self._nodes, self._tasks = {}, set()

    async def close(self, timeout: float = 1.0) -> None:
        """Refuse new waits, end the current ones (``RivalWaitsClosed``), and give their requests up
        to ``timeout`` seconds to write their replies."""
        self._loop = None
        for futures in self._nodes.values():
            for woken in futures:
                if not woken.done():
                    woken.set_result(None)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)

    async def wait(self, node: str, settled: Callable[[], bool], deadline: float) -> Waited:
        """Until ``settled()`` (asked now, then after each change of ``node`` in the ledger) or
        ``time.monotonic()`` reaches ``deadline``. RivalWaitsClosed when the extender stops."""
        loop = self._loop
        task = asyncio.current_task()
        if loop is None or task is None:
            raise RivalWaitsClosed("the extender is stopping")
        if len(self._tasks) >= self.limit:
            return Waited.FULL
        self._tasks.add(task)
        futures = self._nodes.setdefault(node, set())  # filed before the first ask: no change missed
        try:
            while not settled():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return Waited.LATE
                woken = loop.create_future()
                futures.add(woken)
                try:
                    await asyncio.wait((woken,), timeout=remaining)
                finally:
                    futures.discard(woken)
                if self._loop is not loop:
                    raise RivalWaitsClosed("the extender is stopping")
            return Waited.SETTLED
        finally:
            self._tasks.discard(task)
            if not futures and self._nodes.get(node) is futures:
                del self._nodes[node]

    def _changed(self, node: str, _cards_changed: bool) -> None:
        """The ledger's listener: on the thread that changed ``node``, under the ledger's lock."""
        loop = self._loop
        if loop is not None and node in self._nodes:
            try:
                loop.call_soon_threadsafe(self._wake, node)
            except RuntimeError:  # the loop has closed: nobody waits any more
                pass

    def _wake(self, node: str) -> None:
        for woken in self._nodes.get(node, ()):
            if not woken.done():
                woken.set_result(None)
