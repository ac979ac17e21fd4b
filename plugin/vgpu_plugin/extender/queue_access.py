"""Who may read ``GET /queue``, and the one-pod view of it.

The queue names every waiting pod (namespace, pod, its ask), so it is answered only to
the bearer of the queue token (a Secret the admin creates; the holders are the Hub's
services and the simulated cluster's single-user lab, never a notebook under JupyterHub).
``?namespace=&pod=`` narrows the answer to that pod's own entry, the number waiting and
the nodes' largest free shares: what a caller shows one person, with no other pod named.
The answer is cached for ``QueueCache.max_age`` seconds so callers polling it (the Hub,
panels, the Event notifier) cost one pass over the pod cache per interval, not per call.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

from vgpu_plugin.metrics.scrape import ScrapeAuth

_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")


class QueueAuth(ScrapeAuth):
    """The bearer check of ``GET /queue`` (constant-time, re-read when the Secret changes)."""

    WHAT = "queue token"
    NOT_CONFIGURED = "the extender has no queue token configured (--queue-token-file); the queue is closed"
    HOW = "send 'Authorization: Bearer <queue token>' (Secret vgpu-queue-token)"


class QueueCache:
    """The latest queue report, recomputed when older than ``max_age`` seconds."""

    def __init__(self, compute: Callable[[], dict[str, Any]], max_age: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._compute = compute
        self.max_age = max_age
        self._clock = clock
        self._lock = threading.Lock()
        self._at: float | None = None
        self._report: dict[str, Any] = {}
        self.computed = 0  # how many passes over the pod cache (the benchmark and tests read it)

    def report(self) -> dict[str, Any]:
        with self._lock:
            now = self._clock()
            if self._at is None or now - self._at >= self.max_age:
                self._report, self._at = self._compute(), now
                self.computed += 1
            return self._report


def valid_name(text: str) -> bool:
    """A Kubernetes namespace or pod name (RFC 1123 subdomain), the only thing ``?pod=`` takes."""
    return bool(_DNS_NAME.match(text))


def one_pod(report: dict[str, Any], namespace: str, pod: str) -> dict[str, Any]:
    """That pod's entry (``pending`` holds it or nothing), how many wait, and the nodes' free room."""
    mine = [e for e in report.get("pending", ()) if e["namespace"] == namespace and e["pod"] == pod]
    return {"pending": mine, "waiting": len(report.get("pending", ())), "nodes": report.get("nodes", [])}
