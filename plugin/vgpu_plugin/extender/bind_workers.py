"""The threads bind runs on: it calls the Kubernetes API (blocking), so never on tornado's loop.

A fixed set of long-lived threads takes binds from one ``SimpleQueue`` and hands each answer
back to the loop as an asyncio future's result; answers that finish while the loop has not yet
taken the earlier ones ride the same wake-up of the loop. ``loop.run_in_executor`` did the same
with a ThreadPoolExecutor: per bind a concurrent Future with its Condition, a work item, the idle
semaphore taken and given back, the future chained to an asyncio one, and one wake-up of the loop
— 20–31 % of the server's GIL time at 1,000 binds/s (benchmarks/extender/README.md).

``stop()`` refuses new binds, drops those not started yet (none of them has claimed anything)
and waits for the running ones, which finish their claim or undo it: the guarantees the
executor's ``shutdown(wait=True, cancel_futures=True)`` gave.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

Item = TypeVar("Item")
Result = TypeVar("Result")


class WorkersStopped(RuntimeError):
    """The workers are stopping (or were never started): the item was not taken."""


class BindWorkers(Generic[Item, Result]):
    """``count`` threads calling ``work(item)``; ``submit`` (on the loop's thread) returns its future."""

    def __init__(self, work: Callable[[Item], Result], count: int, name: str = "extender-bind") -> None:
        if count < 1:
            raise ValueError("at least one bind worker is needed")
        self._work = work
        self._count = count
        self._name = name
        self._tasks: queue.SimpleQueue[tuple[asyncio.Future[Result], Item] | None] = queue.SimpleQueue()
        # answers waiting for the loop, and whether a wake-up of the loop is already on its way
        self._done: collections.deque[tuple[asyncio.Future[Result], Any, BaseException | None]] = \
            collections.deque()
        self._wake_pending = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the threads; answers go to ``loop`` (the one ``submit`` is called on)."""
        if self._threads:
            raise RuntimeError("the bind workers are already running")
        self._loop = loop
        self._stopping = False
        # answers left for a loop that has stopped, and its wake-up that never ran, go with it
        self._done.clear()
        self._wake_pending = False
        self._threads = [threading.Thread(target=self._run, name=f"{self._name}_{i}", daemon=True)
                         for i in range(self._count)]
        for thread in self._threads:
            thread.start()

    def submit(self, item: Item) -> asyncio.Future[Result]:
        """Queue ``item`` for a worker; on the loop's thread only. WorkersStopped once stopping."""
        loop = self._loop
        if loop is None or self._stopping:
            raise WorkersStopped("the extender is stopping")
        future: asyncio.Future[Result] = loop.create_future()
        self._tasks.put((future, item))
        return future

    def stop(self) -> None:
        """Refuse new items, drop the queued ones, wait for the running ones to finish."""
        if not self._threads:
            return
        self._stopping = True
        dropped = []
        while True:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                break
            if task is not None:
                dropped.append(task[0])
        for _ in self._threads:
            self._tasks.put(None)
        for thread in self._threads:
            thread.join()
        self._threads = []
        for future in dropped:
            self._call_on_loop(future.cancel)

    def _run(self) -> None:
        tasks, work = self._tasks, self._work
        while True:
            task = tasks.get()
            if task is None:
                return
            future, item = task
            try:
                answer: tuple[asyncio.Future[Result], Any, BaseException | None] = (future, work(item), None)
            except Exception as error:  # the handler raises it: a 500 with the extender's error JSON
                answer = (future, None, error)
            self._done.append(answer)
            if not self._wake_pending:
                # Set before the loop is asked to deliver; _deliver clears it before taking the
                # answers, so an answer appended while the flag is set is in the next delivery.
                self._wake_pending = True
                self._call_on_loop(self._deliver)

    def _call_on_loop(self, callback: Callable[[], object]) -> None:
        loop = self._loop
        try:
            if loop is not None:
                loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the loop has closed: nobody waits for this answer any more
            log.debug("an answer of %s came after its event loop closed", self._name)

    def _deliver(self) -> None:
        """On the loop: every answer that has come, to its future."""
        self._wake_pending = False
        done = self._done
        while done:
            future, result, error = done.popleft()
            if future.done():  # cancelled: the request went away
                continue
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
