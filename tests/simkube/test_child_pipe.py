"""``simkube.child.ask``: the parent's side of a request to a child server over its pipe.

The child's side runs in a thread here, on a real ``multiprocessing`` pipe, with the loop the
children use (``child.commands``)."""

from __future__ import annotations

import multiprocessing
import threading
from multiprocessing.connection import Connection

from simkube import child


def serve(conn: Connection) -> None:
    """Answer ("echo", x) with x, ("fail", why) with an error state, and close on "stop"."""
    for command in child.commands(conn):
        if command[0] == "echo":
            conn.send(("ok", command[1]))
        else:
            conn.send(("error", f"refused {command[1]}"))
    conn.close()


def test_answers_come_back_in_order_and_a_refusal_keeps_its_state_and_reason() -> None:
    ours, theirs = multiprocessing.Pipe()
    server = threading.Thread(target=serve, args=(theirs,), daemon=True)
    server.start()
    assert child.ask(ours, ("echo", {"n": 1})) == ("ok", {"n": 1})
    assert child.ask(ours, ("fail", "that")) == ("error", "refused that")
    assert child.ask(ours, ("echo", [2, 3])) == ("ok", [2, 3])
    ours.send("stop")
    server.join(10)
    assert not server.is_alive()
    state, reason = child.ask(ours, ("echo", 4))
    assert state == "gone" and "Error" in reason  # the child closed its end: EOF or a broken pipe


def test_no_pipe_means_the_child_is_not_running() -> None:
    assert child.ask(None, ("echo", 1)) == ("gone", "it is not running")
