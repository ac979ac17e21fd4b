"""Share requests under JupyterHub: the Hub restarts this server with the new share."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from jupyter_vgpu.core import contract
from jupyter_vgpu.requesters.base import (
    Outcome,
    Progress,
    Requester,
    RequesterSettings,
    RequesterUnavailable,
    ShareRequest,
)
from jupyter_vgpu.sources.base import env_allocation

NOT_UNDER_HUB = (
    "this server cannot ask for a different share by itself: it is not running under JupyterHub "
    "(JUPYTERHUB_API_URL, JUPYTERHUB_API_TOKEN or JUPYTERHUB_USER is missing). "
    "Ask your admin for a vGPU profile, or restart your server with a different one."
)
HUB_RESTART_SCOPE = "custom:jupyter-vgpu:restart"
HUB_SETUP_HINT = "VGPUHub(config=c).configure(c) in jupyterhub_config.py (see jupyter-vgpu's admin guide)"
HANDED_OVER = ("the Hub is restarting your server with the new share; this server stops now — "
               "the outcome shows here (and in `%vgpu status`) once it is back")


class HubRequester(Requester):
    """Ask the Hub to restart this server with a new share (jupyter_vgpu.hub's restart endpoint).

    A server cannot restart itself through the plain REST API — stopping it revokes its
    token and, on Kubernetes, deletes the pod that would send the start — so the Hub does
    it: ``POST {hub api}/vgpu/restart/<user>[/<server>]``. This server is stopped during the
    restart; the restarted server reads the outcome with ``recover()``.
    """

    name = "jupyterhub"

    def __init__(self, api_url: str, token: str, user: str, server_name: str = "", *,
                 timeout: float = 300.0, poll_interval: float = 0.5, http_timeout: float = 10.0,
                 environ: Mapping[str, str] | None = None) -> None:
        self.api_url = api_url.rstrip("/")
        self._token = token
        self.user = user
        self.server_name = server_name
        self._timeout = timeout
        self._poll = poll_interval
        self._http_timeout = http_timeout
        self._environ = environ if environ is not None else {}

    @classmethod
    def from_settings(cls, settings: RequesterSettings) -> HubRequester:
        requester = cls.from_environ(settings.environ, timeout=settings.timeout)
        if requester is None:
            raise RequesterUnavailable(NOT_UNDER_HUB)
        return requester

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], **kwargs: Any) -> HubRequester | None:
        api, token, user = (environ.get(k) for k in ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_USER"))
        if not (api and token and user):
            return None
        return cls(api, token, user, environ.get("JUPYTERHUB_SERVER_NAME", ""), environ=environ, **kwargs)

    @property
    def restart_path(self) -> str:
        path = f"/vgpu/restart/{urllib.parse.quote(self.user, safe='')}"
        return path + (f"/{urllib.parse.quote(self.server_name, safe='')}" if self.server_name else "")

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.api_url + path, data=data, method=method,
            headers={"Authorization": f"token {self._token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self._http_timeout) as response:
                status, text = response.status, response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read().decode("utf-8", "replace")
        try:
            return status, json.loads(text) if text.strip() else None
        except ValueError:
            return status, text

    def request(self, cores: int, memory_units: int, progress: Progress) -> Outcome:
        progress("asking the Hub to restart your server with the new share")
        try:
            status, body = self._call("POST", self.restart_path,
                                      {contract.HUB_OPTION_CORES: cores, contract.HUB_OPTION_MEMORY_UNITS: memory_units})
        except OSError as error:
            return Outcome("failed", f"the Hub at {self.api_url} is unreachable: {getattr(error, 'reason', error)}")
        if status == 403:
            return Outcome("failed", f"this server's Hub token may not restart it ({_hub_message(body)}); ask your "
                                     f"admin to grant the server role {HUB_RESTART_SCOPE}!server — {HUB_SETUP_HINT} does")
        if status == 404:
            return Outcome("failed", f"the Hub cannot restart servers with a new share ({_hub_message(body)}); "
                                     f"ask your admin to enable it: {HUB_SETUP_HINT}")
        if status != 202 or not isinstance(body, dict):
            return Outcome("failed", f"the Hub refused the new share (HTTP {status}): {_hub_message(body)}")
        progress(str(body.get("message") or "the Hub accepted the request"))
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            time.sleep(self._poll)
            try:
                status, record = self._call("GET", self.restart_path)
            except OSError:
                continue  # the Hub is busy restarting us; ask again
            if status in (401, 403):  # stopping this server revoked its token: the Hub carries on
                return Outcome("pending", HANDED_OVER)
            if status == 200 and isinstance(record, dict):
                if record.get("state") in ("scheduled", "failed"):
                    return Outcome(str(record["state"]), str(record.get("message") or ""))
                progress(str(record.get("message") or "restarting"))
        return Outcome("failed", f"the Hub did not finish the restart within {self._timeout:.0f} s")

    def recover(self) -> ShareRequest | None:
        """After a restart: the Hub's record of the latest one, with where the new share landed."""
        try:
            status, record = self._call("GET", self.restart_path)
        except OSError:
            return None
        if status != 200 or not isinstance(record, dict) or record.get("state") not in ("pending", "scheduled", "failed"):
            return None
        request = ShareRequest(id=f"hub-{record.get('id', 'latest')}", cores=int(record.get("cores") or 0),
                               memoryUnits=int(record.get("memoryUnits") or 0), state=str(record["state"]),
                               message=str(record.get("message") or ""), created=float(record.get("startedAt") or time.time()))
        request.progress = [request.message]
        if request.state == "scheduled":
            allocation = env_allocation(self._environ)
            if allocation and allocation.get("cores") == request.cores:
                request.node = allocation.get("node")
                request.cards = [{k: c.get(k) for k in ("index", "uuid", "cores", "memoryMib")}
                                 for c in allocation.get("cards") or []]
                where = ", ".join(f"card {c['index']} ({c['uuid']})" for c in request.cards)
                request.message = f"{request.message}: on {request.node}, {where}"
        return request


def _hub_message(body: Any) -> str:
    if isinstance(body, dict):
        return str(body.get("message") or body)
    return str(body)[:200] if body else "no details"
