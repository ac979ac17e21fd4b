"""Every vGPU pod's usage history on this node, for services that reclaim idle shares.

``GET /api/v1/pods?since=<epoch seconds>`` on the scrape listener, behind the same bearer
token as ``/metrics`` (the Secret Prometheus and the reclaimer hold; no notebook has it):
it names every tenant on the node, so it must never be on the hostPort.

    {"node", "stale", "message", "now", "periodSeconds", "historySeconds",
     "pods": [{"namespace", "pod", "uid", "cores", "memoryMib",
               "history": [[t, memoryUsedMib, utilizationPercent], ...]}]}

``cores``/``memoryMib`` are what the pod holds on this node (all containers, a whole card
counting its memory); ``history`` is oldest first, one point per sample summed over the
pod's containers, since ``since`` (default: the last 600 s; never before the node's
history). Arrays rather than objects: a reclaimer reads every pod of every node.

A point is ``[t, null, null]`` (unknown) when the sample saw no GPU process of any of the pod's
containers: the driver lists only processes whose PID the daemon's namespace holds, so nothing
seen is not evidence of idleness. Where some container's process was seen the daemon sees the
pod's processes, and the point sums the containers seen.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

import tornado.web

from .sampler import ContainerKey, Sampler
from .scrape import ScrapeAuth

DEFAULT_WINDOW_SECONDS = 600.0


def pods_usage(sampler: Sampler, since: float, now: float) -> dict[str, Any]:
    """The answer body (pure reading of the sampler's snapshot and history)."""
    snapshot = sampler.snapshot()
    stale, message = snapshot.staleness(now)
    since = max(since, now - sampler.history_seconds)
    held: dict[str, dict[str, Any]] = {}
    containers: dict[str, set[int]] = {}
    for holding in snapshot.pods.holdings():
        pod = holding.pod
        entry = held.get(pod.uid)
        if entry is None:
            entry = held[pod.uid] = {"namespace": pod.namespace, "pod": pod.name, "uid": pod.uid,
                                     "cores": 0, "memoryMib": 0}
        entry["cores"] += holding.share.cores
        entry["memoryMib"] += holding.memory_mib
        containers.setdefault(pod.uid, set()).add(holding.container_index)
    for uid, entry in held.items():
        summed: dict[float, list[float] | None] = {}
        for index in sorted(containers[uid]):
            for point in sampler.history(ContainerKey(uid, index), now - since, now=now):
                totals = summed.setdefault(point.t, None)
                if point.known:
                    totals = summed[point.t] = totals or [0.0, 0.0]
                    totals[0] += point.memory_used_mib
                    totals[1] += point.utilization_percent
        entry["history"] = [[round(t, 3), round(v[0], 1), round(v[1], 2)] if v else [round(t, 3), None, None]
                            for t, v in sorted(summed.items())]
    return {"node": snapshot.node, "stale": stale, "message": message, "now": round(now, 3),
            "periodSeconds": sampler.period, "historySeconds": sampler.history_seconds,
            "pods": sorted(held.values(), key=lambda p: (p["namespace"], p["pod"]))}


class PodUsageHandler(tornado.web.RequestHandler):
    def initialize(self, sampler: Sampler, auth: ScrapeAuth, clock: Callable[[], float] = time.time) -> None:
        self.sampler = sampler
        self.auth = auth
        self.clock = clock

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))

    def prepare(self) -> None:
        refused = self.auth.check(self.request.headers.get("Authorization"))
        if refused is not None:
            status, reason = refused
            if status == 401:
                self.set_header("WWW-Authenticate", 'Bearer realm="vgpu-metrics"')
            self._reply(status, {"status": status, "message": reason})

    def get(self) -> None:
        now = self.clock()
        raw = self.get_query_argument("since", None)
        if raw is None:
            since = now - DEFAULT_WINDOW_SECONDS
        else:
            try:
                since = float(raw)
            except ValueError:
                since = math.nan
            if not math.isfinite(since) or since < 0:
                self._reply(400, {"status": 400, "message": "since must be a time in seconds since the epoch"})
                return
        self._reply(200, pods_usage(self.sampler, since, now))
