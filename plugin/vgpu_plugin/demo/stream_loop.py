"""One asyncio loop thread per process, on which the kubelet stand-ins consume their ListAndWatch streams.

Why not a thread per stream: grpc's blocking stream iterator waits on a condition with a 0.1 s
timeout (so that signals get through) and its channel's spin thread polls the core every 0.2 s,
so each idle stream woke its process 15 times a second, ~1,200 a second on a storm's node
process. grpc.aio's poller thread waits in the core with no timeout, and the loop sleeps in
epoll, so an idle stream costs nothing.

Why one loop per process, not one per kubelet: grpc.aio's poller signals one socket that every
loop bound to it watches, so each event would wake every loop of the process.

``acquire`` starts the loop for its first user and ``release`` stops it (and its thread) after
its last, so a process with no kubelet has no loop left behind.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent import futures
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_users = 0
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def acquire() -> None:
    """One more user of the loop; the first starts it."""
    global _users, _loop, _thread
    with _lock:
        _users += 1
        if _loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="sim-kubelet-streams", daemon=True)
            thread.start()
            _loop, _thread = loop, thread


def release() -> None:
    """One user fewer; after the last, the loop stops, its default executor is shut down and its thread ends."""
    global _users, _loop, _thread
    with _lock:
        if _users == 0:
            raise RuntimeError("stream loop released more often than acquired")
        _users -= 1
        if _users or _loop is None:
            return
        loop, thread = _loop, _thread
        _loop = _thread = None
    assert thread is not None
    asyncio.run_coroutine_threadsafe(loop.shutdown_default_executor(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def start_task(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    """Start ``coro`` as a task on the loop, which the caller holds."""
    async def spawn() -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(coro, name=name)

    return _submit(spawn()).result(10)


def cancel_task(task: asyncio.Task[None], timeout: float = 5.0) -> None:
    """Cancel ``task`` and wait until it has ended, its ``finally`` blocks run. Not from the loop's thread."""
    async def cancel() -> None:
        task.cancel()
        await asyncio.wait([task])

    try:
        _submit(cancel()).result(timeout)
    except futures.TimeoutError:
        pass  # as a thread's join(timeout): the task goes on ending on its own


def _submit(coro: Coroutine[Any, Any, T]) -> futures.Future[T]:
    loop = _loop
    if loop is None:
        coro.close()
        raise RuntimeError("the stream loop is not running: acquire() it first")
    return asyncio.run_coroutine_threadsafe(coro, loop)
