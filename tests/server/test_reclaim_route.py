"""Issue 17: GET vgpu/api/reclaim and POST vgpu/api/reclaim/keep without a reclaimer, or with one
that does not answer (the watched path runs end to end in tests/hub/test_e2e_reclaim.py).
jp_fetch checks every answer against docs/server-api.yaml."""

from __future__ import annotations

import json
import socket

import pytest

from jupyter_vgpu.reclaimer.client import ENV_RECLAIMER_URL


def fetch(run, jp_fetch, *parts, **kwargs):
    return run(jp_fetch("vgpu", "api", *parts, raise_error=False, **kwargs))


def test_off_without_a_reclaimer(run, jp_fetch, monkeypatch):
    monkeypatch.delenv(ENV_RECLAIMER_URL, raising=False)
    answer = fetch(run, jp_fetch, "reclaim")
    assert answer.code == 200
    body = json.loads(answer.body)
    assert body["state"] == "off" and body["reclaim"] is None and "VGPU_RECLAIMER_URL" in body["message"]
    refused = fetch(run, jp_fetch, "reclaim", "keep", method="POST", body="")
    assert refused.code == 409 and "no GPU reclaimer" in json.loads(refused.body)["message"]


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_is_a_state_and_keep_a_502(run, jp_fetch, monkeypatch, closed_port):
    monkeypatch.setenv(ENV_RECLAIMER_URL, f"http://127.0.0.1:{closed_port}/services/vgpu-reclaimer/api/v1/")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "server-token")
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    body = json.loads(fetch(run, jp_fetch, "reclaim").body)
    assert body["state"] == "unreachable" and "does not answer" in body["message"]
    answer = fetch(run, jp_fetch, "reclaim", "keep", method="POST", body="")
    assert answer.code == 502 and "does not answer" in json.loads(answer.body)["message"]
