"""The Hub scope and roles that let a single-user server ask for its own restart with a new share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RESTART_SCOPE = "custom:jupyter-vgpu:restart"

SERVER_ROLE_SCOPES = (
    "users:activity!user",
    "access:servers!server",
    f"{RESTART_SCOPE}!server",
)
"""The single-user server role: JupyterHub's default two scopes plus asking the Hub to restart
this one server with a new share (jupyter_vgpu.hub.restart). Not start/stop scopes: a server
cannot restart itself through the REST API, since stopping it revokes its token."""


def server_role() -> dict[str, Any]:
    """``c.JupyterHub.load_roles`` entry for single-user servers that may restart themselves."""
    return {
        "name": "server",
        "description": "single-user server that may restart itself with a new vGPU share (jupyter-vgpu)",
        "scopes": list(SERVER_ROLE_SCOPES),
    }


def custom_scopes(existing: Mapping[str, Any]) -> dict[str, Any]:
    """``c.JupyterHub.custom_scopes`` with the restart scope added."""
    return {**existing, RESTART_SCOPE: {"description": "Restart a server with a new vGPU share (jupyter-vgpu)."}}


def roles_with_restart(load_roles: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``c.JupyterHub.load_roles`` with the restart scope for users (own servers) and servers (themselves).

    A token never holds more than its owner, so the user role needs the scope too."""
    roles = [dict(r) for r in load_roles if r.get("name") != "server"]
    users = next((r for r in roles if r.get("name") == "user"), None)
    if users is None:
        roles.append({"name": "user", "scopes": ["self", f"{RESTART_SCOPE}!user"]})
    else:
        users["scopes"] = [*users.get("scopes", ["self"]), f"{RESTART_SCOPE}!user"]
    roles.append(server_role())
    return roles
