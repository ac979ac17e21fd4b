"""Notebook-side latency: the server extension's REST API vs the node API it wraps, and widget refresh cost.

Starts the real node metrics server over simulated GPUs (tests/server/server_node_support.py) with one
notebook pod, and a real `jupyter server` subprocess with the extension pointed at it, then
times sequential GETs side by side in one run:

    .venv/bin/python benchmarks/notebook/bench_api.py [--requests 300]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from simkube.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "server"))

from server_node_support import RealNode  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(url: str, headers: dict[str, str], n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as response:
            response.read()
        out.append((time.perf_counter() - started) * 1000)
    return out


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[int(len(ordered) * 0.95) - 1]
    return f"median {statistics.median(ordered):6.2f} ms  p95 {p95:6.2f} ms"


def widget_refresh_cost(node: RealNode, env: dict[str, str], n: int) -> tuple[float, float]:
    """(ms per UsageChart.refresh with a 120 s history, ms per fetch of the newest samples alone).

    A refresh fetches the last few seconds, merges them into the widget's 120 s history and
    sends the new ``usage`` state over the comm (the front end redraws from it)."""
    import comm
    from comm.base_comm import BaseComm

    class Quiet(BaseComm):
        def publish_msg(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            pass

    comm.create_comm = lambda **kwargs: Quiet(**kwargs)
    from jupyter_vgpu.sources.base import SourceSettings
    from jupyter_vgpu.sources.node_api import NodeAPISource
    from jupyter_vgpu.widgets.views import UsageChart

    source = NodeAPISource(SourceSettings(environ=env))
    chart = UsageChart(source, live=False, window=120)
    started = time.perf_counter()
    for _ in range(n):
        chart.refresh()
    refresh = (time.perf_counter() - started) * 1000 / n
    started = time.perf_counter()
    for _ in range(n):
        source.usage(max(5.0, 3 * chart.interval))
    fetch = (time.perf_counter() - started) * 1000 / n
    chart.close()
    return refresh, fetch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vgbench-"))
    node = RealNode(tmp, period=0.5).start()
    env = node.add_notebook("bench", card=1, cores=25, memory_units=40)
    time.sleep(2)  # a few samples
    port, token = free_port(), "bench-token"
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", f"--port={port}", "--ip=127.0.0.1", "--no-browser", "--allow-root",
         f"--IdentityProvider.token={token}", "--ServerApp.jpserver_extensions={'jupyter_vgpu': True}",
         f"--ServerApp.root_dir={tmp}", "--VGPUSettings.source=node-api"],
        env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}/vgpu/api/"
        auth = {"Authorization": f"token {token}"}

        def answers() -> bool:
            try:
                json.loads(urllib.request.urlopen(urllib.request.Request(base + "allocation", headers=auth)).read())
            except OSError:
                return False
            return True

        wait_for(answers, timeout=60, interval=0.2, what="the notebook server to answer")
        bearer = {"Authorization": f"Bearer {env['VGPU_TOKEN']}"}
        n = args.requests
        print(f"{n} sequential GETs each, 127.0.0.1, node sampling every 0.5 s, one notebook pod")
        for what, node_path in (("allocation", "allocation"), ("usage?history=60", "usage?history=60"),
                                ("topology", "topology")):
            direct = timed(f"{node.server.url}/api/v1/{node_path}", bearer, n)
            via = timed(base + what, auth, n)
            ratio = statistics.median(via) / statistics.median(direct)
            print(f"{what:<18} node API     {summary(direct)}")
            print(f"{'':<18} extension    {summary(via)}   (x{ratio:.1f} of direct)")
        refresh, fetch = widget_refresh_cost(node, env, 100)
        print(f"UsageChart.refresh (fetch the newest samples + merge into 120 s + comm state): {refresh:.2f} ms; "
              f"fetch alone {fetch:.2f} ms")
    finally:
        server.terminate()
        server.wait(30)
        node.stop()


if __name__ == "__main__":
    main()
