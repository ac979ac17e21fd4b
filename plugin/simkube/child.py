"""A server in a spawned child process, spoken to over a pipe: start, await ready, stop.

``simkube.process`` (the API server), the demo's control plane and its node processes run
this way. The child sends ``("ready", detail)`` or ``("failed", reason)`` once, then serves
requests until it reads ``"stop"`` or the pipe closes.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["ask", "await_ready", "commands", "spawn", "stop"]


def spawn(target: Callable[..., None], args: tuple[Any, ...], name: str) -> tuple[Any, Connection]:
    """``target(conn, *args)`` in a spawned child; the process and the parent's end of the pipe."""
    context = multiprocessing.get_context("spawn")  # never fork a process full of threads
    ours, theirs = context.Pipe()
    process = context.Process(target=target, name=name, daemon=True, args=(theirs, *args))
    process.start()
    theirs.close()
    return process, ours


def await_ready(conn: Connection, timeout: float) -> tuple[str, Any]:
    """The child's first word: ``("ready", detail)``, ``("failed", reason)`` or ``("timeout", None)``."""
    if not conn.poll(timeout):
        return "timeout", None
    try:
        state, detail = conn.recv()
    except EOFError:
        return "failed", "it exited"
    return ("ready", detail) if state == "ready" else ("failed", detail)


def ask(conn: Connection | None, command: Any) -> tuple[str, Any]:
    """In the parent: one request and the child's answer, ``("ok", answer)`` or its own
    ``(state, reason)``; ``("gone", reason)`` when it is not running or its pipe broke. The
    caller keeps one request at a time on the pipe (answers come in order)."""
    if conn is None:
        return "gone", "it is not running"
    try:
        conn.send(command)
        state, detail = conn.recv()
    except (EOFError, BrokenPipeError, OSError) as error:
        return "gone", repr(error)
    return state, detail


def commands(conn: Connection) -> Iterator[Any]:
    """In the child: the parent's requests, one by one, until it says "stop" or is gone."""
    while True:
        try:
            command = conn.recv()
        except EOFError:
            return
        if command == "stop":
            return
        yield command


def stop(process: Any, conn: Connection | None, timeout: float) -> None:
    """Ask the child to stop, wait ``timeout``, then terminate it."""
    if conn is not None:
        try:
            conn.send("stop")
        except (BrokenPipeError, OSError):
            pass
        conn.close()
    if process is not None:
        process.join(timeout)
        if process.is_alive():
            process.terminate()
            process.join(timeout)
