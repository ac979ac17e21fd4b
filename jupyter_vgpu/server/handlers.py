"""REST and websocket handlers under ``{base_url}vgpu/api/`` (shapes in docs/internals.md).

Every handler is authenticated and authorised by jupyter-server against the resource
``vgpu`` (read for GETs and the stream, write for requests); facts are read in the
extension's thread pool, never on the event loop.
"""

from __future__ import annotations

import json
import os
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.auth.decorator import authorized, ws_authenticated
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web, websocket

from jupyter_vgpu.core.contract import RequestError
from jupyter_vgpu.requesters.base import parse_share

AUTH_RESOURCE = "vgpu"
API = "vgpu/api"


class VGPUHandler(ExtensionHandlerMixin, APIHandler):
    auth_resource = AUTH_RESOURCE

    @property
    def app(self) -> Any:
        return self.extensionapp

    def reply(self, body: dict[str, Any], status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))


class AllocationHandler(VGPUHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.reply(await self.app.call("allocation"))


class TopologyHandler(VGPUHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.reply(await self.app.call("topology"))


class UsageHandler(VGPUHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        raw = self.get_query_argument("history", None)
        try:
            history = float(raw) if raw is not None else float(self.app.history_seconds)
            if not 0 <= history <= 7 * 24 * 3600:
                raise ValueError
        except ValueError:
            raise web.HTTPError(400, f"history={raw!r}: give a number of seconds between 0 and 604800") from None
        self.reply(await self.app.call("usage", history))


class RequestsHandler(VGPUHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        latest = await self.app.off_loop(self.app.tracker.latest)  # may ask the Hub about a restart
        if latest is None:  # no request yet is a normal state, not an error (no 404 in the browser's console)
            self.set_status(204)
            self.set_header("Cache-Control", "no-store")
            self.finish()
            return
        self.reply(latest.to_dict())

    @web.authenticated
    @authorized
    async def post(self) -> None:
        cores, units = share_from_body(self.request.body, '{"cores": 25, "memory": "4GiB"}',
                                       "; cores 0 releases the share")
        try:
            request = self.app.tracker.submit(cores, units)
        except RequestError as error:
            raise web.HTTPError(400, str(error)) from None
        self.set_header("Location", self.request.path.rstrip("/") + "/" + request.id)
        self.reply(request.to_dict(), status=202)


def share_from_body(raw: bytes | None, example: str, what: str) -> tuple[int, int]:
    """The (cores, memory units) a request body asks for, within the Hub's ceiling; a 400 saying
    what to send otherwise. ``example`` is a body to show, ``what`` ends the hint (what the share is for)."""
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the reader goes
        raise web.HTTPError(400, f"the body is not JSON; send {example}") from None
    if not isinstance(body, dict) or "cores" not in body:
        raise web.HTTPError(400, f'send {{"cores": N, "memory": "4GiB" | units}}{what}')
    try:
        return parse_share(body.get("cores"), body.get("memory"), os.environ)  # the Hub's ceiling
    except RequestError as error:
        raise web.HTTPError(400, str(error)) from None


class RequestHandler(VGPUHandler):
    @web.authenticated
    @authorized
    async def get(self, request_id: str) -> None:
        request = await self.app.off_loop(self.app.tracker.get, request_id)
        if request is None:
            raise web.HTTPError(404, f"no share request {request_id!r}")
        self.reply(request.to_dict())


class WaitingHandler(VGPUHandler):
    """Where a pending request waits for the scheduler: position, why, what would start now.
    204 while it is not waiting in the queue (placed, finished, or nothing to tell)."""

    @web.authenticated
    @authorized
    async def get(self, request_id: str) -> None:
        waiting = await self.app.off_loop(self.app.tracker.waiting, request_id)
        if waiting is None:
            self.set_status(204)
            self.set_header("Cache-Control", "no-store")
            self.finish()
            return
        self.reply(waiting.to_dict())


class SwitchHandler(VGPUHandler):
    """Withdraw a pending request and ask for another share instead (the waiting view's one click)."""

    @web.authenticated
    @authorized
    async def post(self, request_id: str) -> None:
        cores, units = share_from_body(self.request.body, '{"cores": 10, "memory": "8GiB"}',
                                       ": the share to switch to")
        try:
            request = await self.app.off_loop(self.app.tracker.switch, request_id, cores, units)
        except RequestError as error:
            raise web.HTTPError(409, str(error)) from None
        self.set_header("Location", self.request.path.rsplit("/", 2)[0] + "/" + request.id)
        self.reply(request.to_dict(), status=202)


class UsageStreamHandler(ExtensionHandlerMixin, JupyterHandler, websocket.WebSocketHandler):
    """One JSON message per sample: {"state", "source", "message", "current", "limits"}."""

    auth_resource = AUTH_RESOURCE

    @property
    def app(self) -> Any:
        return self.extensionapp

    async def pre_get(self) -> None:
        authorized_ = await ensure_async(self.authorizer.is_authorized(self, self.current_user, "read", AUTH_RESOURCE))
        if not authorized_:
            raise web.HTTPError(403, "not authorised to read vgpu")

    @ws_authenticated
    async def get(self, *args: Any, **kwargs: Any) -> None:
        await self.pre_get()
        result = super().get(*args, **kwargs)
        if result is not None:
            await result

    def open(self, *args: Any, **kwargs: Any) -> None:
        self.app.subscribe(self)

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.write_message(json.dumps(message))
        except websocket.WebSocketClosedError:
            self.app.unsubscribe(self)

    def on_message(self, message: str | bytes) -> None:
        pass  # the stream is one-way

    def on_close(self) -> None:
        self.app.unsubscribe(self)


def routes() -> list[tuple[str, type, dict[str, Any]] | tuple[str, type]]:
    return [
        (rf"{API}/allocation/?", AllocationHandler),
        (rf"{API}/topology/?", TopologyHandler),
        (rf"{API}/usage/?", UsageHandler),
        (rf"{API}/usage/stream/?", UsageStreamHandler),
        (rf"{API}/requests/?", RequestsHandler),
        (rf"{API}/requests/([A-Za-z0-9-]+)/?", RequestHandler),
        (rf"{API}/requests/([A-Za-z0-9-]+)/waiting/?", WaitingHandler),
        (rf"{API}/requests/([A-Za-z0-9-]+)/switch/?", SwitchHandler),
    ]
