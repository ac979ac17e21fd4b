"""The demo's lab as a test drives it: its REST API with the demo's token, and a share request
followed through the move to the new pod (the simulated and the real control plane alike)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from simkube.waiting import wait_for


def lab_api(demo: Any) -> Callable[..., Any]:
    """``api(path, method="GET", body=None)``: the lab's ``vgpu/api/<path>`` as JSON."""
    def api(path: str, method: str = "GET", body: Any = None) -> Any:
        request = urllib.request.Request(demo.server_url + "vgpu/api/" + path, method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"token {demo.token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
    return api


def request_and_follow(api: Callable[..., Any], body: dict[str, Any], new_pod: str) -> tuple[str, dict[str, Any],
                                                                                             dict[str, Any]]:
    """POST the share request, wait until it is scheduled as ``new_pod`` and that pod's lab answers
    on the same URL and token; (request id, the request's final state, the new allocation)."""
    request_id = api("requests", "POST", body)["id"]
    state = wait_for(lambda: (s := api(f"requests/{request_id}"))["state"] != "pending" and s, timeout=120,
                     interval=0.2, what="the request to leave pending")
    assert state["state"] == "scheduled" and state["message"].startswith(f"pod {new_pod} was scheduled on "), \
        state["message"]

    def new_lab() -> dict[str, Any] | None:
        try:  # the old lab goes away with its pod; the new pod's lab answers on the same URL and token
            after = api("allocation")["allocation"]
        except (urllib.error.URLError, OSError, ValueError):
            return None
        return after if after and after["pod"] == new_pod else None

    return request_id, state, wait_for(new_lab, timeout=180, interval=0.5, what="the new pod's lab to answer")
