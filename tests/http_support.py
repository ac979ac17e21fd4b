"""A GET as the tests' clients make it, for every test area (tests/ is on the path of each)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def http(url: str, token: str | None = None, timeout: float = 15.0) -> tuple[int, Any]:
    """(status, body) of a GET with an optional bearer token; the body parsed as JSON when it is JSON."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")
