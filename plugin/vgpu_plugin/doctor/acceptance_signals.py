"""SIGTERM during an acceptance run: unwind like Ctrl-C, so that the ``finally`` blocks stop what
the kit started (CUDA workers, the private MPS daemon), but never in the middle of such a cleanup
(or of a start whose cleanup depends on it having finished): there the signal waits for its end."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_depth = 0
_pending: int | None = None


def _exit_now(signum: int, frame: Any) -> None:
    global _pending
    if _depth:
        _pending = signum
        return
    raise SystemExit(128 + signum)


@contextmanager
def terminate_as_exit() -> Iterator[None]:
    """While inside, SIGTERM raises SystemExit (outside a ``not_interrupted`` section)."""
    try:
        previous = signal.signal(signal.SIGTERM, _exit_now)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def not_interrupted() -> Iterator[None]:
    """A start or a cleanup that must run to its end; a SIGTERM meanwhile takes effect after it."""
    global _depth, _pending
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _pending is not None:
            signum, _pending = _pending, None
            raise SystemExit(128 + signum)
