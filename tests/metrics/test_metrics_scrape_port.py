"""Issue 12, items 1 and 8, over real HTTP.

1. Every tenant's series (/metrics, /metric) live on the scrape port behind a bearer token;
   the node API port (the hostPort notebooks reach) serves only /healthz and each caller's
   own container.
8. A genuine token whose pod is gone does not make the server rebuild its pod index on
   every request.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from metrics_support import NODE, SCRAPE_TOKEN, FakeNode, token_of, wait_for_samples
from metrics_support import http_get as fetch
from prometheus_client.parser import text_string_to_metric_families
from vgpu_plugin.metrics import MetricsServer
from vgpu_plugin.tokens import TokenMinter

from jupyter_vgpu.core import contract as c


@pytest.fixture
def alice(fake_node: FakeNode) -> dict[str, Any]:
    pod = fake_node.pod("jupyter-alice", {"notebook": (25, 16, (2,))})
    fake_node.run(pod, "notebook", 2, memory_mib=3000, utilization=20)
    return pod


@pytest.fixture
def server(fake_node: FakeNode, minter: TokenMinter, alice: dict[str, Any]) -> Iterator[MetricsServer]:
    server = MetricsServer(NODE, fake_node.gpus, fake_node, minter, address="127.0.0.1", port=0,
                           period=0.05, proc_root=fake_node.proc_root, scrape_token=SCRAPE_TOKEN)
    server.start()
    wait_for_samples(server.sampler, 2)
    yield server
    server.stop()


def test_two_ports(server: MetricsServer) -> None:
    assert server.port and server.scrape_port and server.port != server.scrape_port


@pytest.mark.parametrize("path", ["/metrics", "/metric"])
def test_unauthenticated_scrape_is_refused(server: MetricsServer, path: str, minter: TokenMinter,
                                          alice: dict[str, Any]) -> None:
    status, headers, body = fetch(server.scrape_url + path)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    assert "jupyter-alice" not in body and "vgpu_" not in body
    status, _, body = fetch(server.scrape_url + path, "not-the-scrape-token")
    assert status == 403 and "jupyter-alice" not in body
    # a tenant's own read token is not a scrape token
    status, _, _ = fetch(server.scrape_url + path, token_of(minter, alice, 0))
    assert status == 403


@pytest.mark.parametrize("path, family, label", [
    ("/metrics", c.METRIC_CONTAINER_REQUEST_CORES, "pod"),
    ("/metric", c.METRIC_GM_CONTAINER_REQUEST_UTILIZATION, "pod_name"),
])
def test_scrape_with_the_token_parses(server: MetricsServer, path: str, family: str, label: str) -> None:
    status, headers, text = fetch(server.scrape_url + path, SCRAPE_TOKEN)
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=")
    pods = {s.labels[label] for f in text_string_to_metric_families(text) if f.name == family for s in f.samples}
    assert pods == {"jupyter-alice"}


@pytest.mark.parametrize("path", ["/metrics", "/metric"])
def test_the_node_api_port_serves_no_tenant_series(server: MetricsServer, path: str) -> None:
    for token in (None, SCRAPE_TOKEN):
        status, _, body = fetch(server.url + path, token)
        assert status == 404 and "jupyter-alice" not in body


def test_the_json_api_is_unchanged_on_the_node_port(server: MetricsServer, minter: TokenMinter,
                                                    alice: dict[str, Any]) -> None:
    status, _, body = fetch(server.url + "/api/v1/allocation", token_of(minter, alice, 0))
    assert status == 200 and json.loads(body)["pod"] == "jupyter-alice"
    assert fetch(server.url + "/api/v1/allocation")[0] == 401
    assert fetch(server.url + "/healthz")[0] == 200
    # and the JSON API is not on the scrape port
    assert fetch(server.scrape_url + "/api/v1/allocation", token_of(minter, alice, 0))[0] == 404


def test_token_file_is_reread_when_the_secret_changes(fake_node: FakeNode, minter: TokenMinter,
                                                       alice: dict[str, Any], tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    server = MetricsServer(NODE, fake_node.gpus, fake_node, minter, address="127.0.0.1", port=0,
                           period=0.05, proc_root=fake_node.proc_root, scrape_token_file=str(token_file))
    server.start()
    try:
        status, _, body = fetch(server.scrape_url + "/metrics", SCRAPE_TOKEN)
        assert status == 401 and "cannot be read" in body  # Secret not created yet: closed, not open
        token_file.write_text(SCRAPE_TOKEN + "\n")
        assert fetch(server.scrape_url + "/metrics", SCRAPE_TOKEN)[0] == 200
        rotated = "a-rotated-scrape-token-9876543210"
        token_file.write_text(rotated)
        os.utime(token_file, (1, 1))  # a new mtime even within the filesystem's timestamp granularity
        assert fetch(server.scrape_url + "/metrics", SCRAPE_TOKEN)[0] == 403
        assert fetch(server.scrape_url + "/metrics", rotated)[0] == 200
        token_file.write_text("short")
        status, _, body = fetch(server.scrape_url + "/metrics", "short")
        assert status == 401 and "fewer than" in body
    finally:
        server.stop()


def test_no_token_configured_refuses_every_scrape(fake_node: FakeNode, minter: TokenMinter,
                                                   alice: dict[str, Any]) -> None:
    server = MetricsServer(NODE, fake_node.gpus, fake_node, minter, address="127.0.0.1", port=0,
                           period=0.05, proc_root=fake_node.proc_root)
    server.start()
    try:
        for token in (None, "", "anything-at-all-long-enough"):
            status, _, body = fetch(server.scrape_url + "/metrics", token or None)
            assert status == 401 and "no scrape token configured" in body
    finally:
        server.stop()


def test_tokens_off_opens_the_scrape_port_for_debugging(fake_node: FakeNode, minter: TokenMinter,
                                                        alice: dict[str, Any]) -> None:
    server = MetricsServer(NODE, fake_node.gpus, fake_node, minter, address="127.0.0.1", port=0,
                           period=0.05, proc_root=fake_node.proc_root, require_token=False)
    server.start()
    try:
        wait_for_samples(server.sampler, 1)
        assert fetch(server.scrape_url + "/metrics")[0] == 200
    finally:
        server.stop()


@pytest.mark.parametrize("kwargs, words", [
    ({"port": 5678, "scrape_port": 5678}, "different ports"),
    ({"scrape_token": "short"}, "at least 16"),
    ({"scrape_token": SCRAPE_TOKEN, "scrape_token_file": "/x"}, "not both"),
])
def test_bad_scrape_settings_are_refused(fake_node: FakeNode, minter: TokenMinter, kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        MetricsServer(NODE, fake_node.gpus, fake_node, minter, proc_root=fake_node.proc_root, **kwargs)


# --- item 8: a gone pod's token buys no rebuild per request ---------------------------------------


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_gone_pods_token_rebuilds_the_index_at_most_once_per_interval(
        fake_node: FakeNode, minter: TokenMinter) -> None:
    gone = fake_node.pod("jupyter-gone", {"notebook": (25, 16, (3,))})
    token = token_of(minter, gone, 0)  # genuine: minted by this node for a real record
    fake_node.pods.remove(gone)
    monotonic = FakeMonotonic()
    server = MetricsServer(NODE, fake_node.gpus, fake_node, minter, address="127.0.0.1", port=0,
                           period=3600, history_seconds=3600, proc_root=fake_node.proc_root, monotonic=monotonic)
    server.start()
    try:
        wait_for_samples(server.sampler, 1, since=0)  # the only sample for an hour: the pod is not in it
        before = server.sampler.lookup_rebuilds
        for _ in range(25):
            assert fetch(server.url + "/api/v1/usage", token)[0] == 403
        assert server.sampler.lookup_rebuilds - before == 1
        monotonic.now += 1.0  # one interval later (min(period, 1 s)), nothing changed in the pod cache
        for _ in range(25):
            assert fetch(server.url + "/api/v1/allocation", token)[0] == 403
        assert server.sampler.lookup_rebuilds - before == 1
        # a pod admitted meanwhile is still found, once the interval has passed
        late = fake_node.pod("jupyter-late", {"notebook": (10, 4, (6,))})
        assert fetch(server.url + "/api/v1/allocation", token_of(minter, late, 0))[0] == 403  # within the interval
        monotonic.now += 1.0
        status, _, body = fetch(server.url + "/api/v1/allocation", token_of(minter, late, 0))
        assert status == 200 and json.loads(body)["pod"] == "jupyter-late"
        assert server.sampler.lookup_rebuilds - before == 2
    finally:
        server.stop()


def _raw_exchange(port: int, request: bytes, timeout: float = 5.0) -> bytes:
    """Send ``request`` as is and read until the server closes the connection (or ``timeout``)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        answer = b""
        with contextlib.suppress(TimeoutError):
            while chunk := sock.recv(65536):
                answer += chunk
    return answer


@pytest.mark.parametrize("port_of", ["port", "scrape_port"])
def test_a_large_body_is_refused_before_it_is_read(server: MetricsServer, port_of: str) -> None:
    """Any tenant reaches the node API's hostPort: a request announcing 90 MB (nothing here takes a
    body) is refused at its headers and the connection closed, not buffered into the daemon's memory."""
    port = getattr(server, port_of)
    request = (b"POST /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\n"
               b"Content-Length: 94371840\r\n\r\n")  # the headers alone: the answer must not wait for the body
    answer = _raw_exchange(port, request)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    # a chunked body is cut off when a chunk's size takes it past the limit (nothing sent is left unread,
    # so the close is not a reset that could beat the 400 to the client)
    chunk = b"x" * 3000
    request = (b"POST /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"%x\r\n" % len(chunk) + chunk + b"\r\n" + b"%x\r\n" % len(chunk))  # the second announced, unsent
    answer = _raw_exchange(port, request)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    # and the server goes on answering
    status, _, _ = fetch(server.url + "/healthz")
    assert status == 200
