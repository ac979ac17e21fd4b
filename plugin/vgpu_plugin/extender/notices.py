"""Tell each waiting vGPU pod where it stands, as a core/v1 Event on the pod.

Every ``interval`` seconds the queue (waiting.py) is computed from the extender's caches;
a pending pod whose line changed gets an Event ``VGPUWaiting``:

    "position 3 of 7 waiting for a vGPU: no card on any node has 50 % and 20 GiB free;
     a 25 % share with 8 GiB fits on 3 nodes now"

KubeSpawner shows a pod's Events on the spawn progress page (``events_enabled``, its
default), and ``kubectl describe pod`` lists them: the user learns why and how long, in
the extender's words, with no Hub change. The scheduler's account may create Events
(``system:kube-scheduler``). Only changed lines are written; pods that start, or fit and
wait only for the scheduler's next try, get none.
"""

from __future__ import annotations

import datetime
import logging
import secrets
import threading
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)

REASON = "VGPUWaiting"
COMPONENT = "vgpu-scheduler-extender"


def waiting_line(entry: Mapping[str, Any], total: int) -> str | None:
    """The Event message for one ``queue_report`` entry (None when it fits now)."""
    if not entry.get("why"):
        return None
    line = f"position {entry['position']} of {total} waiting for a vGPU: {entry['why']}"
    other = entry.get("alternative")
    if other:
        line += f"; {other['text']} now"
    return line


class QueueNotifier:
    """``report()`` returns the queue report; ``api_client`` the official client's. start()/stop()."""

    def __init__(self, report: Callable[[], dict[str, Any]], api_client: Any, interval: float = 5.0) -> None:
        from kubernetes import client

        self._report = report
        self._core = client.CoreV1Api(api_client)
        self.interval = interval
        self._said: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.events_written = 0

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="extender-queue-notices", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.notify_once()
            except Exception:  # a failed round must not end the thread
                log.exception("queue notices failed")

    def notify_once(self) -> int:
        """Write the changed lines; returns how many Events were written."""
        report = self._report()
        pending = report["pending"]
        written = 0
        current = set()
        for entry in pending:
            uid = entry["uid"]
            current.add(uid)
            line = waiting_line(entry, len(pending))
            if line is None or self._said.get(uid) == line:
                continue
            try:
                self._event(entry, line)
            except Exception as error:  # the API refused: say it next round
                log.warning("could not tell %s/%s where it waits: %s", entry["namespace"], entry["pod"], error)
                continue
            self._said[uid] = line
            written += 1
        for gone in self._said.keys() - current:
            del self._said[gone]
        self.events_written += written
        return written

    def _event(self, entry: Mapping[str, Any], line: str) -> None:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        namespace = entry["namespace"]
        self._core.create_namespaced_event(namespace, {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{entry['pod']}.{secrets.token_hex(8)}", "namespace": namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": entry["pod"], "namespace": namespace,
                               "uid": entry["uid"]},
            "reason": REASON, "message": line, "type": "Normal",
            "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        })
