"""``GET vgpu/api/reclaim`` and ``POST vgpu/api/reclaim/keep``: this server's GPU reclaim state.

The reclaimer service (jupyter_vgpu.reclaimer) is asked with this server's Hub token; the
answer is passed on for the panel's banner (countdown, "keep my GPU") and for what the
panel says after a reclaim. Without a reclaimer the state is "off", never an error.
"""

from __future__ import annotations

import os
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from jupyter_vgpu.reclaimer.client import NOT_WATCHED, KeepRefused, ReclaimClient, off_state

from .handlers import VGPUHandler


def reclaim_client(app: Any) -> ReclaimClient | None:
    if not hasattr(app, "_reclaim_client"):
        app._reclaim_client = ReclaimClient.from_environ(os.environ)
    return app._reclaim_client  # type: ignore[no-any-return]


class ReclaimHandler(VGPUHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        client = reclaim_client(self.app)
        self.reply(off_state(NOT_WATCHED) if client is None else await self.app.off_loop(client.state))


class ReclaimKeepHandler(VGPUHandler):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        client = reclaim_client(self.app)
        if client is None:
            raise web.HTTPError(409, NOT_WATCHED)
        try:
            self.reply(await self.app.off_loop(client.keep))
        except KeepRefused as error:
            raise web.HTTPError(409, str(error)) from None
        except OSError as error:
            raise web.HTTPError(502, f"the GPU reclaimer does not answer: {error}") from None


def routes() -> list[tuple[str, type]]:
    from .handlers import API

    return [(rf"{API}/reclaim/?", ReclaimHandler), (rf"{API}/reclaim/keep/?", ReclaimKeepHandler)]
