"""The scheduler's queue for the admin page: the extender's ``GET /queue`` with the queue token.

Read once per pass (the extender caches its answer; one call per pass is cheap) and shown to
admins only: it names every waiting pod. A queue that does not answer leaves the last answer
out and says why, never failing the pass.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from .nodes import ScrapeToken

log = logging.getLogger(__name__)


class QueueReader:
    def __init__(self, url: str, token: ScrapeToken, *, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/") + "/queue"
        self.token = token
        self.timeout = timeout
        self.http = AsyncHTTPClient()
        self.latest: dict[str, Any] | None = None
        self.problem: str | None = None

    async def read(self) -> None:
        request = HTTPRequest(self.url, request_timeout=self.timeout,
                              headers={"Authorization": f"Bearer {self.token.value()}"})
        try:
            response = await self.http.fetch(request)
            body = json.loads(response.body)
            if not isinstance(body, Mapping) or not isinstance(body.get("pending"), list):
                raise ValueError("not a queue answer")
        except HTTPClientError as error:
            self.latest, self.problem = None, f"HTTP {error.code}"
        except (OSError, ValueError) as error:
            self.latest, self.problem = None, str(error) or type(error).__name__
        else:
            self.latest, self.problem = dict(body), None
        if self.problem:
            log.warning("cannot read the scheduler's queue at %s: %s", self.url, self.problem)
