"""Polling until something is true: the one loop the simulated cluster and the tests share."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(condition: Callable[[], Any], *, timeout: float, interval: float = 0.05,
             what: str = "a condition", error: type[Exception] = TimeoutError) -> Any:
    """Call ``condition`` every ``interval`` seconds until it returns something truthy; return that.

    After ``timeout`` seconds raise ``error`` saying what was awaited. The condition is
    always tried at least once, and once more after the deadline passes.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
