"""Issue 17: every vGPU pod's usage history on the scrape listener, for the reclaimer only."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from metrics_support import NODE, SCRAPE_TOKEN, FakeNode, token_of, wait_for_samples
from vgpu_plugin.metrics import MetricsServer
from vgpu_plugin.tokens import TokenMinter

from jupyter_vgpu.reclaimer.nodes import parse_pods
from jupyter_vgpu.reclaimer.policy import HOARDING, UNKNOWN, Policy, classify


def get(url: str, token: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        text = error.read()
        try:
            return error.code, json.loads(text)
        except ValueError:
            return error.code, text.decode(errors="replace")


@pytest.fixture
def pods(fake_node: FakeNode) -> dict[str, dict[str, Any]]:
    busy = fake_node.pod("jupyter-busy", {"notebook": (25, 16, (0,)), "sidecar": (10, 8, (1,))})
    fake_node.run(busy, "notebook", 0, memory_mib=3000, utilization=20)
    fake_node.run(busy, "sidecar", 1, memory_mib=1000, utilization=5)
    quiet = fake_node.pod("jupyter-quiet", {"notebook": (50, 80, (2,))})
    fake_node.pod("cpu-only", {"notebook": (0, 0, ())})
    return {"busy": busy, "quiet": quiet}


@pytest.fixture
def server(fake_node: FakeNode, minter: TokenMinter, pods: dict[str, Any]) -> Iterator[MetricsServer]:
    server = MetricsServer(NODE, fake_node.gpus, fake_node, minter, address="127.0.0.1", port=0,
                           period=0.05, proc_root=fake_node.proc_root, scrape_token=SCRAPE_TOKEN)
    server.start()
    wait_for_samples(server.sampler, 3)
    yield server
    server.stop()


def test_every_vgpu_pod_with_its_summed_history(server: MetricsServer, pods: dict[str, Any]) -> None:
    status, body = get(server.scrape_url + "/api/v1/pods?since=0", SCRAPE_TOKEN)
    assert status == 200, body
    assert body["node"] == NODE and body["stale"] is False and body["periodSeconds"] == 0.05
    by_name = {p["pod"]: p for p in body["pods"]}
    assert set(by_name) == {"jupyter-busy", "jupyter-quiet"}  # the CPU-only pod holds nothing
    busy, quiet = by_name["jupyter-busy"], by_name["jupyter-quiet"]
    assert (busy["cores"], busy["memoryMib"], busy["uid"]) == (35, 24 * 256, pods["busy"]["metadata"]["uid"])
    assert (quiet["cores"], quiet["memoryMib"]) == (50, 80 * 256)
    assert len(busy["history"]) >= 2
    times = [p[0] for p in busy["history"]]
    assert times == sorted(times) and times[-1] <= body["now"]
    # both containers' processes, summed per sample
    assert busy["history"][-1][1:] == [4000.0, 25.0]
    # no process of it seen: unknown (null), never a 0 that reads as idle
    assert quiet["history"] and all(p[1:] == [None, None] for p in quiet["history"])


def test_since_limits_the_window(server: MetricsServer) -> None:
    _, first = get(server.scrape_url + "/api/v1/pods?since=0", SCRAPE_TOKEN)
    last = first["pods"][0]["history"][-1][0]
    _, later = get(server.scrape_url + f"/api/v1/pods?since={last + 1e-3}", SCRAPE_TOKEN)
    assert all(p[0] > last for pod in later["pods"] for p in pod["history"])


@pytest.mark.parametrize("since", ["soon", "-5", "nan", "inf"])
def test_a_bad_since_is_a_400(server: MetricsServer, since: str) -> None:
    status, body = get(server.scrape_url + f"/api/v1/pods?since={since}", SCRAPE_TOKEN)
    assert status == 400 and "since" in body["message"]


def test_only_the_scrape_token_reads_it(server: MetricsServer, minter: TokenMinter, pods: dict[str, Any]) -> None:
    assert get(server.scrape_url + "/api/v1/pods")[0] == 401
    status, body = get(server.scrape_url + "/api/v1/pods", token_of(minter, pods["busy"], 0))
    assert status == 403 and "jupyter" not in json.dumps(body)
    # not on the node API port the notebooks reach, whatever the token
    assert get(server.url + "/api/v1/pods", SCRAPE_TOKEN)[0] == 404


def test_a_share_with_no_process_seen_is_unknown_to_the_reclaimer_until_one_is(
        server: MetricsServer, fake_node: FakeNode, pods: dict[str, Any], minter: TokenMinter) -> None:
    """No process seen cannot be told from a process the daemon cannot see (another PID namespace):
    the points are null, the reclaimer's pass is unknown and acts on nothing; the panel's own
    history keeps showing 0. Once a process is seen its points are known again."""
    url = server.scrape_url + "/api/v1/pods?since=0"
    _, body = get(url, SCRAPE_TOKEN)
    _, usage = parse_pods(body, url)
    quiet = next(p for p in usage if p.pod == "jupyter-quiet")
    assert quiet.points and classify(quiet.points, Policy()) == UNKNOWN

    status, own = get(server.url + "/api/v1/usage?history=60", token_of(minter, pods["quiet"], 0))
    assert status == 200 and own["history"] and all(p["utilizationPercent"] == 0.0 for p in own["history"])

    fake_node.run(pods["quiet"], "notebook", 2, memory_mib=9000, utilization=0)
    wait_for_samples(server.sampler, 3)
    _, body = get(url, SCRAPE_TOKEN)
    history = next(p for p in body["pods"] if p["pod"] == "jupyter-quiet")["history"]
    assert history[-1][1:] == [9000.0, 0.0]
    _, usage = parse_pods(body, url)
    quiet = next(p for p in usage if p.pod == "jupyter-quiet")
    assert classify(quiet.points[-2:], Policy()) == HOARDING


def test_a_pod_point_sums_the_containers_seen(server: MetricsServer, fake_node: FakeNode) -> None:
    """Where one container's process is seen the daemon sees the pod's processes: a container
    without one adds nothing, and the point is known."""
    half = fake_node.pod("jupyter-half", {"notebook": (20, 16, (3,)), "sidecar": (10, 8, (4,))})
    fake_node.run(half, "notebook", 3, memory_mib=2000, utilization=12)
    wait_for_samples(server.sampler, 3)
    _, body = get(server.scrape_url + "/api/v1/pods?since=0", SCRAPE_TOKEN)
    history = next(p for p in body["pods"] if p["pod"] == "jupyter-half")["history"]
    assert history[-1][1:] == [2000.0, 12.0]
