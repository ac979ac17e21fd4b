"""Wire the reclaimer into a Hub: ``configure_reclaimer(c)`` in jupyterhub_config.py.

    from jupyter_vgpu.reclaimer.hubconfig import configure_reclaimer
    configure_reclaimer(c, url="http://hub:10102", public_url="http://hub:10102",
                        args=["--VGPUReclaimer.node_selector=app.kubernetes.io/name=vgpu-node",
                              "--VGPUReclaimer.scrape_token_file=/etc/vgpu/scrape-token"])

adds the Hub-managed service ``vgpu-reclaimer`` (the Hub starts ``jupyter-vgpu reclaimer``
like jupyterhub-idle-culler), its role with exactly the scopes it needs, and
``VGPU_RECLAIMER_URL`` in every server's environment (where the notebook server asks for
its reclaim state with its own ``JUPYTERHUB_API_TOKEN``). Nothing else in the Hub changes.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

SERVICE_NAME = "vgpu-reclaimer"
ENV_RECLAIMER_URL = "VGPU_RECLAIMER_URL"
ROLE_SCOPES = ("list:users", "read:users", "read:users:groups", "read:servers", "admin:server_state",
               "admin:servers", "read:users:name")
"""Users, their groups and servers (with KubeSpawner's pod name), stopping and starting servers."""

ACCESS_SCOPE = f"access:services!service={SERVICE_NAME}"
"""What a token needs to be for this service (JupyterHub's HubAuthenticated contract): tokens
issued to anything else, e.g. an admin's OAuth token issued to a user's server, are refused."""


def acts_as_admin(model: dict[str, Any]) -> bool:
    """Whether a token for this service (it carries ACCESS_SCOPE) may see and keep every share:
    the unfiltered ``admin:servers`` scope, or a Hub admin's token issued to this service (the
    admin page's OAuth token, which carries only the access and identify scopes)."""
    return "admin:servers" in (model.get("scopes") or ()) or bool(model.get("admin"))


def service_api_url(public_url: str) -> str:
    """The reclaimer's API base, as a notebook server reaches it."""
    return f"{public_url.rstrip('/')}/services/{SERVICE_NAME}/api/v1/"


def configure_reclaimer(c: Any, *, url: str = "http://127.0.0.1:10102", public_url: str | None = None,
                        args: Sequence[str] = (), command: Sequence[str] | None = None,
                        environment: dict[str, str] | None = None, api_token: str | None = None) -> None:
    """``url``: where the service listens (the Hub proxies /services/vgpu-reclaimer/ there);
    ``public_url``: how notebook pods reach it (default ``url``). With ``api_token`` the
    service is external (run elsewhere with that token) and the Hub starts nothing."""
    hub = c.JupyterHub
    services = [s for s in hub.get("services", []) if s.get("name") != SERVICE_NAME]
    service: dict[str, Any] = {"name": SERVICE_NAME, "url": url, "display": False}
    if api_token is not None:
        service["api_token"] = api_token
    else:
        service["command"] = list(command or [sys.executable, "-m", "jupyter_vgpu.cli", "reclaimer", *args])
        service["environment"] = dict(environment or {})
    services.append(service)
    hub.services = services
    roles = [r for r in hub.get("load_roles", []) if r.get("name") != SERVICE_NAME]
    roles.append({"name": SERVICE_NAME, "description": "jupyter-vgpu: reclaim idle GPU shares",
                  "scopes": list(ROLE_SCOPES), "services": [SERVICE_NAME]})
    hub.load_roles = roles
    # c.KubeSpawner.environment, when set, hides c.Spawner.environment: add it to both (call this last)
    for spawner in (c.Spawner, c.KubeSpawner):
        spawner.environment = {**spawner.get("environment", {}), ENV_RECLAIMER_URL: service_api_url(public_url or url)}
