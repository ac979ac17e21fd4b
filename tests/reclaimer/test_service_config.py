"""Issue 17: the reclaimer's policy traits, group exemptions and overrides, checked at start."""

from __future__ import annotations

import pytest

from jupyter_vgpu.reclaimer.hubapi import servers_of
from jupyter_vgpu.reclaimer.service import VGPUReclaimer


def test_groups_pick_the_policy() -> None:
    reclaimer = VGPUReclaimer(idle_minutes=30, exempt_groups=["staff"],
                              group_overrides={"students": {"idle_minutes": 10, "action": "stop"},
                                               "night": {"max_postpones": 0}})
    assert reclaimer.policy_for([]).idle_seconds == 1800
    assert reclaimer.policy_for(["staff", "students"]).exempt  # exemption wins
    students = reclaimer.policy_for(["night", "students"])  # the first listed group applies
    assert (students.idle_seconds, students.action, students.max_postpones) == (600, "stop", 2)


@pytest.mark.parametrize("overrides, words", [
    ({"students": {"idle_mins": 10}}, "unknown keys"),
    ({"students": {"action": "delete"}}, "action"),
    ({"students": {"idle_minutes": -1}}, "idle_seconds"),
    ({"students": 10}, "must be a dict"),
])
def test_a_bad_override_fails_at_start(overrides: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        VGPUReclaimer(group_overrides=overrides)


def test_server_models_are_read_defensively() -> None:
    model = {"name": "alice", "groups": ["g"], "servers": {
        "": {"ready": True, "state": {"pod_name": "jupyter-alice", "namespace": "hub"},
             "user_options": {"profile": "vgpu-quarter"}},
        "odd": {"ready": True, "state": "not a dict", "user_options": None},
        "junk": "not a server"}}
    servers = {s.name: s for s in servers_of(model)}
    assert set(servers) == {"", "odd"}
    assert (servers[""].pod, servers[""].namespace, servers[""].groups) == ("jupyter-alice", "hub", ("g",))
    assert servers[""].path == "/users/alice/server" and servers["odd"].path == "/users/alice/servers/odd"
    assert servers["odd"].pod is None and servers["odd"].user_options == {}
