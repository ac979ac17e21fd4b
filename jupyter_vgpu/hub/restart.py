"""Restart a single-user server with a new vGPU share, carried out by the Hub itself.

A server cannot restart itself through the ordinary REST API: stopping it revokes the very
token it would use to start it again (and on Kubernetes the pod, with the code that was
going to send the start, is gone). So the Hub does both steps:

    POST {JUPYTERHUB_API_URL}/vgpu/restart/<user>[/<server>]
         {"vgpu_cores": 30, "vgpu_memory_units": 32}      (vgpu_cores 0 releases the GPU)
      -> 400 with the reason (bad share, over the user's limit) — nothing is stopped
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
run this inside the Hub, where the restart must happen.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import RequestError

RESTART_SCOPE = "custom:jupyter-vgpu:restart"
RESTART_PATH = r"/api/vgpu/restart/([^/]+)/?([^/]*)"
STATE_KEY = "jupyter_vgpu_restarts"  # tornado settings key: (user, server) -> latest record


def restart_handlers(vgpu: Any) -> list[tuple[str, type, dict[str, Any]]]:
    """``c.JupyterHub.extra_handlers`` entries (imports JupyterHub only when called)."""
    from jupyterhub.apihandlers.base import APIHandler
    from tornado import web

    class VGPURestartHandler(APIHandler):
        def initialize(self, vgpu: Any) -> None:
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
            if user is None or server_name not in user.orm_spawners:
                raise web.HTTPError(404, f"{user_name} has no server {server_name!r}")
            return user

        def get(self, user_name: str, server_name: str = "") -> None:
            self._target(user_name, server_name)
            record = self.settings.get(STATE_KEY, {}).get((user_name, server_name))
            if record is None:
                raise web.HTTPError(404, "no vGPU restart was asked for this server since the Hub started")
            self.write(json.dumps(record))

        async def post(self, user_name: str, server_name: str = "") -> None:
            user = self._target(user_name, server_name)
            body = self.get_json_body() or {}
            if not isinstance(body, dict) or set(body) - {contract.HUB_OPTION_CORES, contract.HUB_OPTION_MEMORY_UNITS}:
                raise web.HTTPError(400, f"send {{{contract.HUB_OPTION_CORES!r}: int, "
                                         f"{contract.HUB_OPTION_MEMORY_UNITS!r}: int}} and nothing else")
            spawner = user.spawners[server_name]
            latest = self.settings.get(STATE_KEY, {}).get((user_name, server_name))
            if latest is not None and latest["state"] == "pending":
                raise web.HTTPError(409, "a restart of this server is already under way")
            if spawner.pending:
                raise web.HTTPError(409, f"the server is busy ({spawner.pending}); try again when it is up")
            previous = dict(spawner.orm_spawner.user_options or {})
            options = {**previous, contract.HUB_OPTION_CORES: body.get(contract.HUB_OPTION_CORES, 0),
                       contract.HUB_OPTION_MEMORY_UNITS: body.get(contract.HUB_OPTION_MEMORY_UNITS, 0)}
            try:
                share = self.vgpu.check_user_options(user, options)
            except RequestError as error:
                raise web.HTTPError(400, "%s", str(error)) from None
            record = {
                "id": uuid.uuid4().hex[:12], "state": "pending", "message": "stopping the server",
                "cores": share.cores if share else 0, "memoryUnits": share.memory_units if share else 0,
                "userOptions": options, "startedAt": time.time(),
            }
            self.settings.setdefault(STATE_KEY, {})[(user_name, server_name)] = record
            task = asyncio.ensure_future(self._restart(user, server_name, options, previous, record))
            self.settings.setdefault(STATE_KEY + "_tasks", set()).add(task)
            task.add_done_callback(self.settings[STATE_KEY + "_tasks"].discard)
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
                spawner = user.spawners[server_name]
                if spawner._spawn_future is not None:
                    await spawner._spawn_future
            except Exception as error:
                return getattr(error, "jupyterhub_message", None) or getattr(error, "log_message", None) or str(error)
            spawner = user.spawners[server_name]
            if not spawner.ready:
                return "the server stopped while starting"
            return None

    return [(RESTART_PATH, VGPURestartHandler, {"vgpu": vgpu})]
