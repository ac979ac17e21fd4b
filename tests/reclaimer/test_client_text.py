"""Issue 17: what %vgpu status says about the reclaimer (the answers are the service's real shapes,
checked against docs/server-api.yaml)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from server_api_support import check_schema  # noqa: E402

from jupyter_vgpu.reclaimer.client import ReclaimClient, reclaim_text  # noqa: E402

VIEW = {"user": "alice", "server": "", "dryRun": False, "now": 1000.0, "phase": "warned", "reason": "idle",
        "quietSeconds": 3600.0, "deadline": 1900.0, "secondsLeft": 900.0, "postponesLeft": 2,
        "postponeSeconds": 3600.0, "action": "cpu", "cores": 25, "memoryMib": 20480, "lastReclaim": None}


def test_a_warning() -> None:
    answer = {"state": "watched", "message": None, "reclaim": VIEW}
    check_schema("ReclaimReply", answer)
    assert reclaim_text(answer) == ("WARNING: this GPU share has been idle for 60 min; the server will be "
                                    "restarted without a GPU in 15 min unless it computes again. Keep it from "
                                    "the panel (2 postpone(s) left).")
    assert reclaim_text({**answer, "reclaim": {**VIEW, "dryRun": True}}) is None


def test_after_a_reclaim_and_other_states() -> None:
    last = {"at": 900.0, "reason": "hoarding", "action": "stop", "message": "GPU share reclaimed: ...",
            "outcome": "done", "cores": 25, "memoryMib": 20480, "quietSeconds": 7300.0, "postpones": 0,
            "policyAction": "stop"}
    answer = {"state": "watched", "message": None,
              "reclaim": {**VIEW, "phase": "none", "reason": None, "deadline": None, "secondsLeft": None,
                          "quietSeconds": None, "lastReclaim": last}}
    check_schema("ReclaimReply", answer)
    assert reclaim_text(answer).startswith("GPU share reclaimed (hoarding): GPU share reclaimed: ...")
    assert reclaim_text({"state": "unreachable", "message": "no answer", "reclaim": None}) == \
        "GPU reclaimer: no answer"
    assert reclaim_text({"state": "off", "message": "x", "reclaim": None}) is None
    assert reclaim_text({"state": "watched", "message": None,
                         "reclaim": {**VIEW, "phase": "active", "quietSeconds": None}}) is None


def test_the_client_needs_the_hub_environment() -> None:
    assert ReclaimClient.from_environ({}) is None
    assert ReclaimClient.from_environ({"VGPU_RECLAIMER_URL": "http://r/", "JUPYTERHUB_API_TOKEN": "t"}) is None
    client = ReclaimClient.from_environ({"VGPU_RECLAIMER_URL": "http://r/api/v1", "JUPYTERHUB_API_TOKEN": "t",
                                         "JUPYTERHUB_USER": "a b", "JUPYTERHUB_SERVER_NAME": "gpu"})
    assert client is not None and client.url == "http://r/api/v1/" and client._path() == "servers/a%20b/gpu"
