"""Restart a single-user server with a new vGPU share, carried out by the Hub itself.

A server cannot restart itself through the ordinary REST API: stopping it revokes the very
token it would use to start it again (and on Kubernetes the pod, with the code that was
going to send the start, is gone). So the Hub does both steps:

    POST {JUPYTERHUB_API_URL}/vgpu/restart/<user>[/<server>]
         {"vgpu_cores": 30, "vgpu_memory_units": 32}      (vgpu_cores 0 releases the GPU)
      -> 400 with the reason (not such an object, bad share, over the user's limit together
         with their other servers) — nothing is stopped
      -> 409 when the server is starting or stopping
      -> 202 {"id", "state": "pending", "message", "cores", "memoryUnits", "userOptions"}
    GET  {JUPYTERHUB_API_URL}/vgpu/restart/<user>[/<server>]
      -> the latest restart: state "pending" | "scheduled" | "failed" and a message

The new share is merged into the server's current user_options (profile and other choices
are kept) and checked by VGPUHub before anything stops. If the server will not start with
it, the Hub starts it again with the previous options and says so in the state.

The caller needs the custom scope ``custom:jupyter-vgpu:restart`` on that server, which
``VGPUHub.configure`` gives to the server role (``custom:jupyter-vgpu:restart!server``).

The endpoint is registered through ``JupyterHub.extra_handlers``, which JupyterHub marks
deprecated (it logs a warning at start) but supports in 5.x and 6.x; it is the one way to
run this inside the Hub, where the restart must happen. Only the Hub imports this module
(``VGPUHub.configure`` does, in jupyterhub_config.py): it imports JupyterHub's handlers.

The body is what a user sent: anything but ``{"vgpu_cores": <count>, "vgpu_memory_units":
<count>}`` is a 400 with the reason, checked before anything else (a bad body is refused
even while the server is busy).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from jupyterhub.apihandlers.base import APIHandler
from tornado import web

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import Request, RequestError
from jupyter_vgpu.hub.quantities import shown
from jupyter_vgpu.hub.scopes import RESTART_SCOPE

if TYPE_CHECKING:  # the settings object is handed in by VGPUHub.configure, which imports this module
    from jupyter_vgpu.hub.vgpuhub import VGPUHub

RESTART_PATH = r"/api/vgpu/restart/([^/]+)/?([^/]*)"
STATE_KEY = "jupyter_vgpu_restarts"  # tornado settings key: (user, server) -> latest record
TASKS_KEY = STATE_KEY + "_tasks"  # running restarts, kept referenced until they finish
BODY_KEYS = (contract.HUB_OPTION_CORES, contract.HUB_OPTION_MEMORY_UNITS)
BODY_HELP = f"send {{{BODY_KEYS[0]!r}: int, {BODY_KEYS[1]!r}: int}} and nothing else"


class VGPURestartHandler(APIHandler):
    """``/hub/api/vgpu/restart/<user>[/<server>]``: restart a server with a new share (see module doc)."""

    def initialize(self, vgpu: VGPUHub) -> None:
        self.vgpu = vgpu

    def _target(self, user_name: str, server_name: str) -> Any:
        if self.current_user is None:
            raise web.HTTPError(403, "a token is required")
        allowed = {RESTART_SCOPE, f"{RESTART_SCOPE}!user={user_name}",
                   f"{RESTART_SCOPE}!server={user_name}/{server_name}"}
        if not allowed & set(self.expanded_scopes):
            raise web.HTTPError(403, f"this token may not restart {user_name}/{server_name} "
                                     f"(it needs the {RESTART_SCOPE} scope on that server)")
        user = self.find_user(user_name)
        # orm_spawners: every server the user has, started since the Hub started or not
        if user is None or server_name not in user.orm_spawners:
            raise web.HTTPError(404, f"{user_name} has no server {server_name!r}")
        return user

    def _records(self) -> dict[tuple[str, str], dict[str, Any]]:
        records: dict[tuple[str, str], dict[str, Any]] = self.settings.setdefault(STATE_KEY, {})
        return records

    def get(self, user_name: str, server_name: str = "") -> None:
        self._target(user_name, server_name)
        record = self._records().get((user_name, server_name))
        if record is None:
            raise web.HTTPError(404, "no vGPU restart was asked for this server since the Hub started")
        self.write(json.dumps(record))

    async def _share(self, user: Any, server_name: str, previous: dict[str, Any]) -> tuple[dict[str, Any], Request | None]:
        """The new user_options and the share they ask for; 400 with the reason when they are bad."""
        body = self.get_json_body()
        if not isinstance(body, dict):
            raise web.HTTPError(400, f"{BODY_HELP} (got {shown(body)})")
        unknown = set(body) - set(BODY_KEYS)
        if unknown:
            raise web.HTTPError(400, f"{BODY_HELP} (unknown keys: {shown(sorted(unknown))})")
        options = {**previous, **{key: body.get(key, 0) for key in BODY_KEYS}}
        try:
            return options, await self.vgpu.check_user_options(user.spawners[server_name], options)
        except RequestError as error:
            raise web.HTTPError(400, "%s", str(error)) from None

    async def post(self, user_name: str, server_name: str = "") -> None:
        user = self._target(user_name, server_name)
        spawner = user.spawners[server_name]
        previous = dict(spawner.user_options or {})
        options, share = await self._share(user, server_name, previous)
        latest = self._records().get((user_name, server_name))
        if latest is not None and latest["state"] == "pending":
            raise web.HTTPError(409, "a restart of this server is already under way")
        if spawner.pending:
            raise web.HTTPError(409, f"the server is busy ({spawner.pending}); try again when it is up")
        record = {
            "id": uuid.uuid4().hex[:12], "state": "pending", "message": "stopping the server",
            "cores": share.cores if share else 0, "memoryUnits": share.memory_units if share else 0,
            "userOptions": options, "startedAt": time.time(),
        }
        self._records()[(user_name, server_name)] = record
        task = asyncio.ensure_future(self._restart(user, server_name, options, previous, record))
        tasks: set[asyncio.Future[None]] = self.settings.setdefault(TASKS_KEY, set())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        self.set_status(202)
        self.write(json.dumps(record))

    async def _restart(self, user: Any, server_name: str, options: dict[str, Any],
                       previous: dict[str, Any], record: dict[str, Any]) -> None:
        spawner = user.spawners[server_name]
        try:
            if spawner.ready or spawner.active:
                stop = await self.stop_single_user(user, server_name)
                await stop
            record["message"] = "starting the server with the new share"
            error = await self._start(user, server_name, options)
            if error is None:
                record.update(state="scheduled", message="the server restarted with the new share")
                return
            self.log.warning("vGPU restart of %s/%s failed: %s", user.name, server_name, error)
            record["message"] = f"the new share did not start ({error}); restarting with the previous one"
            fallback = await self._start(user, server_name, previous)
            record.update(state="failed", message=(
                f"the server did not start with the new share: {error}; "
                + ("it runs again with the previous share" if fallback is None
                   else f"restarting with the previous share failed too: {fallback}")))
        except Exception as error:  # the record is what the user sees; the log has the trace
            self.log.exception("vGPU restart of %s/%s", user.name, server_name)
            record.update(state="failed", message=f"the restart failed: {error}")

    async def _start(self, user: Any, server_name: str, options: dict[str, Any]) -> str | None:
        """None when the server came up, else why not."""
        try:
            await self.spawn_single_user(user, server_name, options=options)
            await _spawn_finished(user.spawners[server_name])
        except Exception as error:
            return getattr(error, "jupyterhub_message", None) or getattr(error, "log_message", None) or str(error)
        if not user.spawners[server_name].ready:
            return "the server stopped while starting"
        return None


async def _spawn_finished(spawner: Any) -> None:
    """Wait for a spawn that outlived spawn_single_user's slow_spawn_timeout.

    JupyterHub has no public handle on a running spawn; its own REST handlers (server start,
    progress) await this same attribute, which it clears once the spawn is done."""
    future = getattr(spawner, "_spawn_future", None)
    if future is not None:
        await future


def restart_handlers(vgpu: VGPUHub) -> list[tuple[str, type, dict[str, Any]]]:
    """``c.JupyterHub.extra_handlers`` entries."""
    return [(RESTART_PATH, VGPURestartHandler, {"vgpu": vgpu})]
