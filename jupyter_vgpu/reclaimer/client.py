"""The notebook side's view of the reclaimer: this server's reclaim state and "keep my GPU".

Used by the server extension (``GET/POST vgpu/api/reclaim``) and ``%vgpu status``. It asks
the reclaimer service at ``$VGPU_RECLAIMER_URL`` (set by ``hubconfig.configure_reclaimer``)
with the server's own ``$JUPYTERHUB_API_TOKEN``; the service checks that token with the
Hub, so a server can read and postpone only its own user's shares. Stdlib only: the
kernel imports it too. Never raises for an unreachable service: that is a state.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

ENV_RECLAIMER_URL = "VGPU_RECLAIMER_URL"


class KeepRefused(ValueError):
    """The reclaimer refused "keep my GPU"; the message is for the user."""


class ReclaimClient:
    def __init__(self, url: str, token: str, user: str, server: str = "", timeout: float = 5.0) -> None:
        self.url = url.rstrip("/") + "/"
        self.token, self.user, self.server, self.timeout = token, user, server, timeout

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ReclaimClient | None:
        """None outside a Hub with the reclaimer (no URL, token or user)."""
        url, token, user = (environ.get(ENV_RECLAIMER_URL, ""), environ.get("JUPYTERHUB_API_TOKEN", ""),
                            environ.get("JUPYTERHUB_USER", ""))
        if not (url and token and user):
            return None
        return cls(url, token, user, environ.get("JUPYTERHUB_SERVER_NAME", ""))

    def _path(self) -> str:
        path = "servers/" + urllib.parse.quote(self.user, safe="")
        return path + ("/" + urllib.parse.quote(self.server, safe="") if self.server else "")

    def _call(self, path: str, method: str = "GET") -> tuple[int, Any]:
        request = urllib.request.Request(self.url + path, method=method, data=b"" if method == "POST" else None,
                                         headers={"Authorization": f"token {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as error:
            try:
                body = json.loads(error.read())
            except ValueError:
                body = None
            return error.code, body

    def state(self) -> dict[str, Any]:
        """``{"state": "watched"|"unreachable", "message", "reclaim": {...}|null}``."""
        try:
            status, body = self._call(self._path())
        except (OSError, ValueError) as error:
            return {"state": "unreachable", "message": f"the GPU reclaimer does not answer: {error}", "reclaim": None}
        if status != 200 or not isinstance(body, dict):
            message = body.get("message") if isinstance(body, dict) else None
            return {"state": "unreachable", "message": f"the GPU reclaimer answered {status}: {message or ''}".strip(),
                    "reclaim": None}
        return {"state": "watched", "message": None, "reclaim": body}

    def keep(self) -> dict[str, Any]:
        """"Keep my GPU"; KeepRefused with the reclaimer's reason, OSError when unreachable."""
        status, body = self._call(self._path() + "/keep", "POST")
        if status == 200 and isinstance(body, dict):
            return {"state": "watched", "message": None, "reclaim": body}
        message = body.get("message") if isinstance(body, dict) else None
        raise KeepRefused(message or f"the GPU reclaimer answered {status}")


def off_state(reason: str) -> dict[str, Any]:
    return {"state": "off", "message": reason, "reclaim": None}


NOT_WATCHED = "no GPU reclaimer on this hub (VGPU_RECLAIMER_URL is not set), or not under JupyterHub"


_DONE = {"cpu": "restarted without a GPU", "shrink": "restarted on a smaller share", "stop": "stopped"}


def _minutes(seconds: Any) -> str:
    return f"{max(0.0, float(seconds)) / 60:.0f} min"


def reclaim_text(answer: Mapping[str, Any]) -> str | None:
    """One or two lines for ``%vgpu status``; None when there is nothing to say."""
    if answer.get("state") == "unreachable":
        return f"GPU reclaimer: {answer.get('message')}"
    view = answer.get("reclaim")
    if answer.get("state") != "watched" or not isinstance(view, Mapping):
        return None
    lines = []
    last = view.get("lastReclaim")
    if isinstance(last, Mapping):
        lines.append(f"GPU share reclaimed ({last.get('reason')}): {last.get('message')}. "
                     "Ask for a GPU again with `%vgpu request` or the panel.")
    phase = view.get("phase")
    if view.get("dryRun"):
        pass  # the reclaimer only logs: nothing will happen
    elif phase == "warned":
        action = _DONE.get(str(view.get("action")), "reclaimed")
        lines.append(f"WARNING: this GPU share has been {view.get('reason')} for {_minutes(view.get('quietSeconds'))}; "
                     f"the server will be {action} in {_minutes(view.get('secondsLeft'))} unless it computes "
                     f"again. Keep it from the panel ({view.get('postponesLeft')} postpone(s) left).")
    elif phase in ("idle", "hoarding") and view.get("quietSeconds"):
        lines.append(f"GPU share {phase} for {_minutes(view.get('quietSeconds'))} "
                     "(idle shares are given back after a warning)")
    return "\n".join(lines) or None
