"""The HTTP server's front: kube-scheduler's POSTs answered straight from tornado's connection.

A ``tornado.web.RequestHandler`` does per request work the scheduler's verbs never use: the
request object and its routing, a handler object with its UI namespaces, the default headers
(the Date formatted anew), the coroutine wrapping ``post``, the output transforms, ``finish``'s
checks. On cold caches, as between two of kube-scheduler's requests, that took 0.2–0.3 ms of a
filter's ~1 ms (benchmarks/extender/README.md, "Fourteenth step"). ``PostFront`` answers
``POST`` to a few exact paths itself, through tornado's public ``HTTPMessageDelegate`` and
``HTTPConnection`` interfaces, and hands every other request (other methods, other paths) to
the tornado ``Application`` behind it. The connection (keep-alive, Content-Length or chunked
bodies, ``max_body_size``, TLS) is still tornado's.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from http.client import responses

import tornado
import tornado.httputil as httputil
from tornado.web import Application

log = logging.getLogger(__name__)

Reply = tuple[int, bytes]
"""A status and a JSON body."""

Answer = Callable[[bytes], "Reply | Awaitable[Reply]"]
"""A verb: the request's body in, its reply out (now, or once awaited)."""

INTERNAL_ERROR = b'{"Error":"internal error in the extender (see its log)"}'

# RFC 3986's host characters (brackets and colons anywhere, as tornado simplifies it) and an
# optional port, without the comma: a comma means several Host headers (RFC 9112 §3.2)
_HOST = re.compile(r"(?:[\[\]:A-Za-z0-9\-._~!$&'()*+;=]|%[0-9A-Fa-f]{2})*(?::[0-9]*)?")
_SERVER = f"TornadoServer/{tornado.version}"  # what a RequestHandler sends


class Post:
    """One path's verb, and where its time goes (the request's whole time, reply written)."""

    __slots__ = ("answer", "observe")

    def __init__(self, answer: Answer, observe: Callable[[float], None]) -> None:
        self.answer = answer
        self.observe = observe


class PostFront(httputil.HTTPServerConnectionDelegate):
    """``POST`` to the paths in ``posts`` answered here; anything else to ``application``.

    ``log_reply(method, uri, status)`` is called for every reply written here, as the
    application's ``log_function`` is for its own.
    """

    def __init__(self, posts: Mapping[str, Post], application: Application,
                 log_reply: Callable[[str, str, int], None]) -> None:
        self.posts = dict(posts)
        self.application = application
        self.log_reply = log_reply
        self.pending: set[asyncio.Task[None]] = set()  # replies awaited: a task needs a reference

    def start_request(self, server_conn: object,
                      request_conn: httputil.HTTPConnection) -> httputil.HTTPMessageDelegate:
        return _Request(self, server_conn, request_conn)


class _Request(httputil.HTTPMessageDelegate):
    """One request on a connection: a verb's POST gathered and answered, or passed on whole."""

    def __init__(self, front: PostFront, server_conn: object, connection: httputil.HTTPConnection) -> None:
        self.front = front
        self.server_conn = server_conn
        self.connection = connection
        self.passed_on: httputil.HTTPMessageDelegate | None = None
        self.post: Post | None = None
        self.uri = ""
        self.chunks: list[bytes] = []

    def headers_received(self, start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
                         headers: httputil.HTTPHeaders) -> Awaitable[None] | None:
        assert isinstance(start_line, httputil.RequestStartLine)
        # the path as tornado's request object has it (the query string dropped)
        post = self.front.posts.get(start_line.path.partition("?")[0]) if start_line.method == "POST" else None
        if post is None:
            self.passed_on = self.front.application.start_request(self.server_conn, self.connection)
            return self.passed_on.headers_received(start_line, headers)
        _check_host(start_line.version, headers)
        self.post, self.uri = post, start_line.path
        return None

    def data_received(self, chunk: bytes) -> Awaitable[None] | None:
        if self.passed_on is not None:
            return self.passed_on.data_received(chunk)
        self.chunks.append(chunk)
        return None

    def finish(self) -> None:
        if self.passed_on is not None:
            return self.passed_on.finish()
        post, started = self.post, time.perf_counter()
        assert post is not None
        body, self.chunks = b"".join(self.chunks), []
        try:
            reply = post.answer(body)
        except Exception:
            log.exception("uncaught exception answering POST %s", self.uri)
            reply = (500, INTERNAL_ERROR)
        if isinstance(reply, tuple):
            try:
                self._write(reply)
            finally:
                post.observe(time.perf_counter() - started)
            return None
        task = asyncio.ensure_future(self._write_later(reply, started))
        self.front.pending.add(task)
        task.add_done_callback(self.front.pending.discard)
        return None

    async def _write_later(self, later: Awaitable[Reply], started: float) -> None:
        assert self.post is not None
        try:
            try:
                reply = await later
            except Exception:
                log.exception("uncaught exception answering POST %s", self.uri)
                reply = (500, INTERNAL_ERROR)
            self._write(reply)
        finally:
            self.post.observe(time.perf_counter() - started)

    def _write(self, reply: Reply) -> None:
        status, body = reply
        headers = httputil.HTTPHeaders()
        headers["Server"] = _SERVER
        headers["Content-Type"] = "application/json"
        headers["Date"] = _http_date()
        headers["Content-Length"] = str(len(body))
        self.connection.write_headers(
            httputil.ResponseStartLine("", status, responses.get(status, "Unknown")), headers, body)
        self.connection.finish()
        self.front.log_reply("POST", self.uri, status)

    def on_connection_close(self) -> None:
        if self.passed_on is not None:
            self.passed_on.on_connection_close()
        self.chunks = []


def _check_host(version: str, headers: httputil.HTTPHeaders) -> None:
    """The Host checks tornado's request object makes (RFC 9112 §3.2: 400 for an HTTP/1.1 request
    without one, with several, or with an invalid one); raised as ``HTTPInputError``, the
    connection answers 400 and closes, as it did for these paths before the front."""
    host = headers.get("Host")
    if host is None:
        if version != "HTTP/1.0":
            raise httputil.HTTPInputError("Missing Host header")
        return
    if not _HOST.fullmatch(host):
        raise httputil.HTTPInputError(f"Invalid Host header: {host!r}")


_date: tuple[int, str] = (0, "")


def _http_date() -> str:
    """The Date header, formatted once a second (a RequestHandler formats it per request)."""
    global _date
    now = int(time.time())
    second, text = _date
    if second != now:
        text = httputil.format_timestamp(now)
        _date = (now, text)
    return text

