"""PostFront (front.py) over real HTTP: POSTs to its paths answered on tornado's connection with
a RequestHandler's headers, everything else passed to the tornado Application behind it, failures
answered 500 as JSON with the traceback in the log only, tornado's body limit still applied."""

from __future__ import annotations

import asyncio
import email.utils
import http.client
import json
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import tornado
import tornado.httpserver
import tornado.netutil
import tornado.web
from vgpu_plugin.extender.front import INTERNAL_ERROR, Post, PostFront, Reply


class Served:
    """A PostFront on a real port, its own event loop on a thread, what it observed and logged."""

    def __init__(self, max_body_size: int) -> None:
        self.observed: list[str] = []
        self.logged: list[tuple[str, str, int]] = []
        self.bodies: list[bytes] = []

        def echo(body: bytes) -> Reply:
            self.bodies.append(body)
            return 200, json.dumps({"got": body.decode()}).encode()

        async def later(body: bytes) -> Reply:
            await asyncio.sleep(0)  # answered on a later turn of the loop, as bind is
            return 201, b'{"Error":""}'

        def broken(body: bytes) -> Reply:
            raise KeyError("a bug")

        async def broken_later(body: bytes) -> Reply:
            await asyncio.sleep(0)
            raise KeyError("a later bug")

        def refused(body: bytes) -> Reply:
            return 400, b'{"Error":"bad"}'

        class Other(tornado.web.RequestHandler):
            def get(self) -> None:
                self.finish("from the application")

        seen = self

        class Seen(tornado.web.RequestHandler):
            """What the front observed and logged, read on the server's loop (as a scrape reads it)."""

            def get(self) -> None:
                self.finish({"observed": seen.observed, "logged": seen.logged, "bodies": len(seen.bodies)})

        posts = {f"/v/{name}": Post(answer, lambda seconds, name=name: self.observed.append(name))
                 for name, answer in (("echo", echo), ("later", later), ("broken", broken),
                                      ("broken-later", broken_later), ("refused", refused))}
        application = tornado.web.Application([("/v/echo", Other), ("/other", Other), ("/seen", Seen)])
        self.front = PostFront(posts, application, lambda *line: self.logged.append(line))
        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        self.port = sockets[0].getsockname()[1]
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            server = tornado.httpserver.HTTPServer(self.front, max_body_size=max_body_size)
            server.add_sockets(sockets)
            self.loop.call_soon(ready.set)
            self.loop.run_forever()
            server.stop()
            self.loop.run_until_complete(server.close_all_connections())
            self.loop.close()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)

    def seen(self) -> dict[str, Any]:
        return json.loads(exchange(self.connection(), "GET", "/seen")[2])

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def served() -> Iterator[Served]:
    running = Served(max_body_size=4096)
    yield running
    running.stop()


def exchange(conn: http.client.HTTPConnection, method: str, path: str, body: Any = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn.request(method, path, body, headers or {})
    response = conn.getresponse()
    return response.status, dict(response.getheaders()), response.read()


def test_posts_are_answered_with_a_request_handlers_headers(served):
    conn = served.connection()
    status, headers, body = exchange(conn, "POST", "/v/echo", b'{"a": 1}', {"Content-Type": "application/json"})
    assert status == 200 and json.loads(body) == {"got": '{"a": 1}'}
    assert headers["Content-Type"] == "application/json"
    assert headers["Content-Length"] == str(len(body))
    assert headers["Server"] == f"TornadoServer/{tornado.version}"
    assert email.utils.parsedate_to_datetime(headers["Date"]).tzname() == "UTC"
    # the query string does not change the path, as tornado's routing reads it
    status, _, body = exchange(conn, "POST", "/v/echo?x=1", b"q")
    assert status == 200 and json.loads(body) == {"got": "q"}
    status, _, body = exchange(conn, "POST", "/v/refused", b"{}")
    assert (status, body) == (400, b'{"Error":"bad"}')
    assert served.seen() == {"observed": ["echo", "echo", "refused"], "bodies": 2, "logged": [
        ["POST", "/v/echo", 200], ["POST", "/v/echo?x=1", 200], ["POST", "/v/refused", 400]]}


def test_other_methods_and_paths_go_to_the_application_on_the_same_connection(served):
    conn = served.connection()
    assert exchange(conn, "GET", "/v/echo")[::2] == (200, b"from the application")
    assert exchange(conn, "POST", "/v/echo", b"x")[::2] == (200, b'{"got": "x"}')
    assert exchange(conn, "GET", "/other")[::2] == (200, b"from the application")
    assert exchange(conn, "POST", "/other", b"x")[0] == 405  # the application's handler has no post
    assert exchange(conn, "POST", "/nowhere", b"x")[0] == 404
    assert exchange(conn, "POST", "/v/echo/", b"x")[0] == 404  # exact paths only
    assert exchange(conn, "POST", "/v/later", b"x")[::2] == (201, b'{"Error":""}')
    assert served.seen()["observed"] == ["echo", "later"]


def test_a_chunked_body_is_answered_whole(served):
    conn = served.connection()
    conn.putrequest("POST", "/v/echo")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for part in (b"abc", b"def"):
        conn.send(b"%x\r\n%s\r\n" % (len(part), part))
    conn.send(b"0\r\n\r\n")
    response = conn.getresponse()
    assert response.status == 200 and json.loads(response.read()) == {"got": "abcdef"}


def test_failures_answer_500_as_json_and_log_the_traceback(served, caplog):
    conn = served.connection()
    with caplog.at_level(logging.ERROR, logger="vgpu_plugin.extender.front"):
        for path in ("/v/broken", "/v/broken-later"):
            status, headers, body = exchange(conn, "POST", path, b"{}")
            assert (status, body) == (500, INTERNAL_ERROR) and headers["Content-Type"] == "application/json"
            assert b"Traceback" not in body and b"bug" not in body
        # the connection still serves the next request
        assert exchange(conn, "POST", "/v/echo", b"y")[::2] == (200, b'{"got": "y"}')
    failures = [record for record in caplog.records if record.exc_info]
    assert [str(record.exc_info[1]) for record in failures] == ["'a bug'", "'a later bug'"]
    seen = served.seen()
    assert seen["observed"] == ["broken", "broken-later", "echo"]
    assert seen["logged"][:2] == [["POST", "/v/broken", 500], ["POST", "/v/broken-later", 500]]


def test_tornados_body_limit_still_applies(served):
    # the headers alone: tornado refuses at Content-Length and closes; a body sent after them would be
    # unread at the close, and the client's read could then meet the reset instead of the 400
    status = raw_status(served.port, b"POST /v/echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5000\r\n\r\n")
    assert status == 400  # tornado's own refusal; the verb never saw the body
    assert served.seen() == {"observed": [], "logged": [], "bodies": 0}
    assert exchange(served.connection(), "POST", "/v/echo", b"x" * 4000)[0] == 200
    assert served.seen()["observed"] == ["echo"]


def raw_status(port: int, request: bytes) -> int:
    """The status line's code of the one reply to ``request`` sent over a fresh socket."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        reply = b""
        while b"\r\n" not in reply and (data := sock.recv(4096)):
            reply += data
    return int(reply.split(b" ", 2)[1])


@pytest.mark.parametrize(("version", "host", "status"), [
    ("HTTP/1.1", None, 400),          # RFC 9112 §3.2: an HTTP/1.1 request must name its host
    ("HTTP/1.1", "a,b", 400),         # several Host headers (or a proxy's folding of them)
    ("HTTP/1.1", "a b", 400),         # not a host
    ("HTTP/1.1", "127.0.0.1:80", 200),
    ("HTTP/1.1", "[::1]:8080", 200),
    ("HTTP/1.0", None, 200),          # HTTP/1.0 needs none
])
def test_the_host_header_is_checked_as_tornados_request_object_checks_it(served, version, host, status):
    head = f"POST /v/echo {version}\r\n" + (f"Host: {host}\r\n" if host is not None else "")
    assert raw_status(served.port, head.encode() + b"Content-Length: 2\r\n\r\n{}") == status
    # the application's paths answer the same
    head = f"GET /other {version}\r\n" + (f"Host: {host}\r\n" if host is not None else "")
    assert raw_status(served.port, head.encode() + b"\r\n") == status
    assert served.seen()["observed"] == (["echo"] if status == 200 else [])
