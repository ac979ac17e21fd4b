"""Issue 17: the Hub runs `jupyter-vgpu reclaimer` as a managed service with its own role."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from hub_support import ADMIN_TOKEN, free_port, running_hub


def get(url: str, token: str | None) -> tuple[int, object]:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
            return response.status, json.loads(text) if "json" in response.headers["Content-Type"] else text
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_hub_starts_the_reclaimer_and_it_answers_with_the_hub_s_tokens(tmp_path: Path) -> None:
    port = free_port()
    config = f"""
        from jupyter_vgpu.hub import VGPUHub
        from jupyter_vgpu.reclaimer.hubconfig import configure_reclaimer
        VGPUHub(config=c).configure(c)
        configure_reclaimer(c, url="http://127.0.0.1:{port}",
                            args=["--VGPUReclaimer.period_seconds=0.5", "--VGPUReclaimer.idle_minutes=30",
                                  "--VGPUReclaimer.dry_run=True", "--VGPUReclaimer.record_events=False"])
    """
    with running_hub(tmp_path, config, users=("alice",)) as hub:
        base = f"http://127.0.0.1:{port}/services/vgpu-reclaimer/"

        def listing():
            try:
                status, body = get(base + "api/v1/servers", ADMIN_TOKEN)
            except OSError:
                return None  # not listening yet
            return body if status == 200 else None

        body = hub.wait(listing, "the reclaimer service")
        assert body["dryRun"] is True and body["servers"] == []
        status, view = get(base + "api/v1/servers/alice", ADMIN_TOKEN)
        assert status == 200 and view["phase"] == "none" and view["lastReclaim"] is None
        assert get(base + "api/v1/servers/alice", None)[0] == 401
        assert get(base + "api/v1/servers/alice", "forged")[0] == 403
        # its passes run against the Hub with its own token and role (no failed pass in the log)
        hub.wait(lambda: "vgpu-reclaimer@127.0.0.1" in (hub.root / "hub.log").read_text(), "a reclaimer pass")
        log = (hub.root / "hub.log").read_text()
        assert "403 GET /hub/api/users" not in log and "pass failed" not in log
        status, text = get(base + "metrics", None)
        assert status == 200 and "vgpu_reclaimer_pass_seconds" in text
