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


def test_the_service_refuses_a_request_body_before_reading_it() -> None:
    """Every Hub user reaches the service through the proxy: a POST announcing 90 MB (nothing it
    serves reads a body) is refused at its headers, not buffered into the Hub's pod."""
    import asyncio
    import socket
    import threading

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    reclaimer = VGPUReclaimer(bind_url=f"http://127.0.0.1:{port}")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def listen():
        return reclaimer.listen()

    server = asyncio.run_coroutine_threadsafe(listen(), loop).result(30)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(f"POST {reclaimer.service_prefix}api/v1/servers/alice/keep HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         "Content-Length: 94371840\r\n\r\n".encode())
            answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    finally:
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(30)
        loop.call_soon_threadsafe(server.stop)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
