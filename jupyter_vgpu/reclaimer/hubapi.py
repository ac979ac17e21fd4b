"""The Hub's REST API as the reclaimer uses it: active servers, stop, start with user_options.

The reclaimer's token needs (see ``hubconfig.ROLE_SCOPES``): ``list:users`` and
``read:users`` (names, groups), ``read:servers`` and ``admin:server_state`` (which pod a
server runs in: KubeSpawner's ``pod_name`` / ``namespace`` state, the Hub's own record,
never anything the notebook wrote), ``admin:servers`` (stop and start servers).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

log = logging.getLogger(__name__)

PAGINATION = "application/jupyterhub-pagination+json"


class HubError(RuntimeError):
    """A Hub API call failed; the message names the call and the Hub's answer."""


@dataclass(frozen=True)
class Server:
    user: str
    name: str
    """"" for the default server."""
    groups: tuple[str, ...]
    ready: bool
    pending: str | None
    namespace: str | None
    pod: str | None
    user_options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.user, self.name)

    @property
    def path(self) -> str:
        """The server's API path under /users/."""
        user = quote(self.user, safe="")
        return f"/users/{user}/servers/{quote(self.name, safe='')}" if self.name else f"/users/{user}/server"


def servers_of(model: Mapping[str, Any]) -> list[Server]:
    """A user model's servers (those with a pod name in their spawner state)."""
    found = []
    groups = tuple(str(g) for g in model.get("groups") or ())
    for name, server in (model.get("servers") or {}).items():
        if not isinstance(server, Mapping):
            continue
        raw_state, raw_options = server.get("state"), server.get("user_options")
        state: Mapping[str, Any] = raw_state if isinstance(raw_state, Mapping) else {}
        options: Mapping[str, Any] = raw_options if isinstance(raw_options, Mapping) else {}
        pod, namespace = state.get("pod_name"), state.get("namespace")
        found.append(Server(str(model.get("name")), str(name), groups, bool(server.get("ready")),
                            server.get("pending"), namespace if isinstance(namespace, str) else None,
                            pod if isinstance(pod, str) else None, dict(options)))
    return found


class HubClient:
    def __init__(self, api_url: str, token: str, *, timeout: float = 30.0) -> None:
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.http = AsyncHTTPClient()

    async def call(self, method: str, path: str, body: Any = None, accept: str = "application/json",
                   ok: tuple[int, ...] = ()) -> tuple[int, Any]:
        request = HTTPRequest(self.api_url + path, method=method,
                              headers={"Authorization": f"token {self.token}", "Accept": accept,
                                       "Content-Type": "application/json"},
                              body=None if body is None else json.dumps(body),
                              allow_nonstandard_methods=True, request_timeout=self.timeout)
        try:
            response = await self.http.fetch(request)
        except HTTPClientError as error:
            if error.code in ok:
                return error.code, None
            said = error.response.body.decode(errors="replace")[:500] if error.response else str(error)
            raise HubError(f"{method} {path}: {error.code} {said}") from None
        except OSError as error:
            raise HubError(f"{method} {path}: {error}") from None
        body = response.body or b""
        return response.code, json.loads(body) if body.strip() else None

    async def active_servers(self) -> list[Server]:
        """Every user's running or starting servers, page by page."""
        servers: list[Server] = []
        offset = 0
        while True:
            _, page = await self.call("GET", f"/users?state=active&offset={offset}&limit=200", accept=PAGINATION)
            if isinstance(page, list):  # a Hub that ignores the pagination request
                items, following = page, None
            else:
                items, following = page.get("items") or [], (page.get("_pagination") or {}).get("next")
            for model in items:
                servers.extend(servers_of(model))
            if not following or not items:
                return servers
            offset = int(following.get("offset", offset + len(items)))

    async def server(self, user: str, name: str) -> Server | None:
        status, model = await self.call("GET", f"/users/{quote(user, safe='')}", ok=(404,))
        if status == 404 or not isinstance(model, Mapping):
            return None
        return next((s for s in servers_of(model) if s.name == name), None)

    async def stop(self, server: Server) -> None:
        await self.call("DELETE", server.path, ok=(400,))  # 400: already stopping

    async def start(self, server: Server, user_options: Mapping[str, Any]) -> None:
        await self.call("POST", server.path, body=dict(user_options))
