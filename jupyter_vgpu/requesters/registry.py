"""The requesters jupyter-vgpu ships, by name, and the tracker over the configured one."""

from __future__ import annotations

from jupyter_vgpu.requesters.base import Requester, RequesterSettings, RequesterUnavailable
from jupyter_vgpu.requesters.hub import HubRequester
from jupyter_vgpu.requesters.tracker import RequestTracker

# the values of the former ``requester`` setting ("kube" moved out with the simulated cluster)
REQUESTERS: dict[str, type[Requester] | None] = {"auto": HubRequester, HubRequester.name: HubRequester, "none": None}

TURNED_OFF = (
    "share requests are turned off on this server (c.VGPUSettings.requester_class = None). "
    "Ask your admin for a vGPU profile, or restart your server with a different one."
)


def make_tracker(requester_class: type[Requester] | None, settings: RequesterSettings) -> RequestTracker:
    """A tracker over ``requester_class`` built for this server; without one, every request
    fails at once with the reason."""
    if requester_class is None:
        return RequestTracker(None, TURNED_OFF)
    try:
        return RequestTracker(requester_class.from_settings(settings))
    except RequesterUnavailable as error:
        return RequestTracker(None, str(error))
