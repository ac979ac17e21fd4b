"""JupyterHub integration for KubeSpawner: vGPU profiles, the pod hook, user_options checks.

In ``jupyterhub_config.py`` (or Zero to JupyterHub's ``hub.extraConfig``)::

    from jupyter_vgpu.hub import VGPUHub
    c.VGPUHub.group_limits = {"gpu-users": {"cores": 100, "memory": "40GiB"}}
    VGPUHub(config=c).configure(c)

``configure`` appends the vGPU shares to ``c.KubeSpawner.profile_list`` (only those within
the user's limit are offered), and chains, after any hook the admin already set:

- ``apply_user_options``: checks a chosen share, a typed custom share and a runtime request
  (``user_options`` keys ``vgpu_cores`` / ``vgpu_memory_units``, sent by ``%vgpu request``)
  before anything starts, against the user's limit together with what their other servers
  hold, answering HTTP 400 with a sentence the user can act on;
- a Hub endpoint (jupyter_vgpu.hub.restart) that restarts a server with a new share, which
  is how ``%vgpu request`` works under JupyterHub;
- ``modify_pod_hook``: applies a runtime request to the notebook container, checks the final
  request against the user's limit, and, for pods that ask for a vGPU only, sets the vGPU
  scheduler (Zero to JupyterHub points every user pod at its own user-scheduler) and the
  ``VGPU_REQUESTED_*`` / ``VGPU_MAX_*`` hints.

One job per module: ``quantities`` (untrusted numbers read safely), ``shares`` (offered sizes,
typed shares), ``options`` (what user_options ask for), ``limits`` (ceilings over a user's
servers), ``profiles`` (KubeSpawner profile entries), ``pod`` (the pod's vGPU parts),
``scopes`` (roles for the restart), ``vgpuhub`` (the settings and the wiring), ``restart``
(the Hub-side endpoint; imported by ``configure`` only). Nothing here imports kubernetes at
module import; the Hub imports this package, the notebook side never does.
"""

from jupyter_vgpu.hub.limits import Limit, Usage
from jupyter_vgpu.hub.options import runtime_request
from jupyter_vgpu.hub.scopes import RESTART_SCOPE, SERVER_ROLE_SCOPES, server_role
from jupyter_vgpu.hub.shares import (
    CUSTOM_PROFILE_SLUG,
    DEFAULT_SHARE_SPECS,
    SHARE_OPTION,
    SHARE_TEXT_HELP,
    SHARE_TEXT_PATTERN,
    Share,
    parse_share_text,
)
from jupyter_vgpu.hub.vgpuhub import VGPUHub

__all__ = [
    "CUSTOM_PROFILE_SLUG",
    "DEFAULT_SHARE_SPECS",
    "RESTART_SCOPE",
    "SERVER_ROLE_SCOPES",
    "SHARE_OPTION",
    "SHARE_TEXT_HELP",
    "SHARE_TEXT_PATTERN",
    "Limit",
    "Share",
    "Usage",
    "VGPUHub",
    "parse_share_text",
    "runtime_request",
    "server_role",
]
