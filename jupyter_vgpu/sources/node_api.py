"""Facts from this project's node metrics server (per-pod JSON API, bearer read token)."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from jupyter_vgpu.core import contract
from jupyter_vgpu.sources.base import (
    FactSource,
    SourceSettings,
    allocation_answer,
    env_allocation,
    limits_of,
    topology_answer,
    usage_answer,
)


class Unreachable(Exception):
    """The node API did not answer usefully; the message says what happened."""


class NodeAPISource(FactSource):
    name = "node-api"

    @classmethod
    def detected(cls, settings: SourceSettings) -> bool:
        """The device plugin gave this container the node API's URL and a read token."""
        env = settings.environ
        return bool((settings.metrics_url or env.get(contract.ENV_METRICS_URL))
                    and (settings.token or env.get(contract.ENV_TOKEN)))

    def __init__(self, settings: SourceSettings) -> None:
        env = settings.environ
        self.base_url = (settings.metrics_url or env.get(contract.ENV_METRICS_URL, "")).rstrip("/")
        self._token = settings.token or env.get(contract.ENV_TOKEN, "")
        self._timeout = settings.timeout
        self._env_allocation = env_allocation(env)

    def _get(self, path: str, query: dict[str, Any] | None = None) -> dict[str, Any]:
        if not self.base_url:
            raise Unreachable(f"no node metrics URL (${contract.ENV_METRICS_URL} is not set)")
        url = f"{self.base_url}/api/v1/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {self._token}"})
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                body = json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as error:
            detail = _error_detail(error)
            if error.code in (401, 403):
                raise Unreachable(
                    f"the node metrics server at {self.base_url} refused this pod's read token "
                    f"(HTTP {error.code}{detail}); the pod may have been re-created — restart the server"
                ) from None
            raise Unreachable(f"the node metrics server at {self.base_url} answered HTTP {error.code}{detail}") from None
        except (OSError, ValueError, http.client.HTTPException) as error:  # refused, timeouts, cut off, bad JSON
            reason = getattr(error, "reason", error)
            raise Unreachable(f"the node metrics server at {self.base_url} is unreachable: {reason}") from None
        if not isinstance(body, dict):
            raise Unreachable(f"the node metrics server at {self.base_url} sent {type(body).__name__}, not an object")
        return body

    def allocation(self) -> dict[str, Any]:
        try:
            return allocation_answer("allocated", self.name, self._get("allocation"))
        except Unreachable as error:
            # what the device plugin put in our environment is still true; show it, marked
            return allocation_answer("unreachable", self.name, self._env_allocation, str(error))

    def topology(self) -> dict[str, Any]:
        try:
            return topology_answer("available", self.name, self._get("topology"))
        except Unreachable as error:
            return topology_answer("unreachable", self.name, None, str(error))

    def usage(self, history_seconds: float = 0) -> dict[str, Any]:
        query = {"history": int(history_seconds)} if history_seconds > 0 else None
        try:
            body = self._get("usage", query)
        except Unreachable as error:
            return usage_answer("unreachable", self.name, message=str(error),
                                limits=limits_of(self._env_allocation))
        return usage_answer(
            "stale" if body.get("stale") else "live",
            self.name,
            message=body.get("message"),
            period=body.get("periodSeconds") or 1.0,
            limits=body.get("limits") or limits_of(self._env_allocation),
            current=body.get("current"),
            history=body.get("history") or [],
        )



def _error_detail(error: Any) -> str:
    try:
        text = error.read().decode("utf-8", "replace").strip()
    except Exception:  # noqa: BLE001 - the status code is what matters
        return ""
    try:
        message = json.loads(text).get("message")
    except (ValueError, AttributeError):
        message = text[:200]
    return f": {message}" if message else ""
