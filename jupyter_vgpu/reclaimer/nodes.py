"""Every vGPU pod's usage, read from the node daemons' scrape listeners.

``GET <node>/api/v1/pods?since=T`` with the scrape token (docs/internals.md, node metrics
server): the credential Prometheus holds, which no notebook has. Each node is asked for
the points since the last answer it gave (its own clock), so no point is read twice and
none is missed while the node keeps them (its history, 900 s by default: the reclaimer's
period must stay below it). A node that does not answer leaves its pods *unknown*.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PodUsage:
    node: str
    namespace: str
    pod: str
    uid: str
    cores: int
    memory_mib: int
    points: tuple[tuple[float, float, float], ...]
    """(t, memory MiB, utilisation %) since the previous read, oldest first; NaN where the node
    sent null (no GPU process of the pod seen: unknown, never idle)."""


def parse_pods(body: Any, url: str) -> tuple[float, list[PodUsage]]:
    """(the node's now, its pods) from an answer; ValueError for a malformed one."""
    if not isinstance(body, Mapping) or not isinstance(body.get("pods"), list):
        raise ValueError(f"{url}: not a pods answer")
    now = body.get("now")
    if not isinstance(now, (int, float)) or not math.isfinite(now):
        raise ValueError(f"{url}: no 'now' in the answer")
    node = str(body.get("node") or url)
    pods = []
    for entry in body["pods"]:
        try:
            points = tuple((float(p[0]), _number(p[1]), _number(p[2])) for p in entry.get("history") or ())
            pods.append(PodUsage(node, str(entry["namespace"]), str(entry["pod"]), str(entry["uid"]),
                                 int(entry["cores"]), int(entry["memoryMib"]), points))
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise ValueError(f"{url}: malformed pod entry ({error})") from None
    if body.get("stale"):  # numbers the node could not refresh: not evidence of idleness
        pods = [PodUsage(p.node, p.namespace, p.pod, p.uid, p.cores, p.memory_mib, ()) for p in pods]
    return float(now), pods


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


class ScrapeToken:
    """The scrape token, literal or from a mounted Secret file (re-read when it changes)."""

    def __init__(self, token: str = "", token_file: str = "") -> None:
        self._token, self._file = token.strip(), token_file
        self._stamp: tuple[float, int] | None = None

    def value(self) -> str:
        if self._token and not self._file:
            return self._token
        if not self._file:
            return ""
        try:
            status = os.stat(self._file)
            if (status.st_mtime, status.st_size) != self._stamp:
                with open(self._file, encoding="utf-8") as handle:
                    self._token = handle.read().strip()
                self._stamp = (status.st_mtime, status.st_size)
        except OSError as error:
            log.warning("cannot read the scrape token file %s: %s", self._file, error)
        return self._token


class NodeReader:
    def __init__(self, token: ScrapeToken, *, timeout: float = 10.0) -> None:
        self.token = token
        self.timeout = timeout
        self.http = AsyncHTTPClient()
        self._since: dict[str, float] = {}
        self.problems: dict[str, str] = {}
        """Per node URL, why its last read failed (for the admin view and logs)."""

    async def _read(self, url: str) -> list[PodUsage] | None:
        since = self._since.get(url, 0.0)
        request = HTTPRequest(f"{url.rstrip('/')}/api/v1/pods?since={since!r}", request_timeout=self.timeout,
                              headers={"Authorization": f"Bearer {self.token.value()}"})
        try:
            response = await self.http.fetch(request)
            now, pods = parse_pods(json.loads(response.body), url)
        except (HTTPClientError, OSError, ValueError) as error:
            if self.problems.get(url) != str(error):
                log.warning("node %s: cannot read pod usage: %s", url, error)
            self.problems[url] = str(error)
            return None
        self.problems.pop(url, None)
        last = max((p[0] for pod in pods for p in pod.points), default=None)
        self._since[url] = math.nextafter(last, math.inf) if last is not None else since
        if last is None and not pods:
            self._since[url] = now
        return pods

    async def read(self, urls: Iterable[str]) -> dict[tuple[str, str], PodUsage]:
        """(namespace, pod) -> usage, for the nodes that answered."""
        answers = await asyncio.gather(*(self._read(url) for url in urls))
        found: dict[tuple[str, str], PodUsage] = {}
        for pods in answers:
            for pod in pods or ():
                found[(pod.namespace, pod.pod)] = pod
        return found
