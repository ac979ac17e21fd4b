"""How long the simulated cluster and `jupyter-vgpu demo` take, as a user meets them.

    .venv/bin/python benchmarks/demo/bench_demo.py [--starts 10] [--demos 3]

- cluster: `start_cluster()` (the demo's two nodes, no processes) then `stop()`, N times;
- demo: `jupyter-vgpu demo --no-browser` as a subprocess: seconds until the lab URL is
  printed and answers, until a share request (50 cores, 8 GiB) has the lab back at the same
  URL on the new pod, and from SIGINT to exit.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cluster_starts(count: int) -> list[float]:
    from vgpu_plugin.demo.lab import start_cluster

    times = []
    for _ in range(count):
        began = time.perf_counter()
        start_cluster(run_processes=False).stop()
        times.append(time.perf_counter() - began)
    return times


def one_demo() -> tuple[float, float, float]:
    port = _port()
    began = time.perf_counter()
    process = subprocess.Popen([str(BIN / "jupyter-vgpu"), "demo", "--no-browser", "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(line.strip() for line in process.stdout), daemon=True).start()
    pattern = re.compile(rf"http://127\.0\.0\.1:{port}/lab\?token=(\w+)")
    token = None
    while token is None:
        token = next((m.group(1) for line in list(lines) if (m := pattern.fullmatch(line))), None)
        if process.poll() is not None:
            raise SystemExit("\n".join(lines))
        time.sleep(0.05)

    def api(path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/{path}", method="POST" if body else "GET",
                                         data=json.dumps(body).encode() if body else None,
                                         headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    api("api/status")
    ready = time.perf_counter() - began
    asked = time.perf_counter()
    api("vgpu/api/requests", {"cores": 50, "memory": "8GiB"})
    while True:
        try:
            if (api("vgpu/api/allocation").get("allocation") or {}).get("pod") == "notebook-v2":
                break
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    moved = time.perf_counter() - asked
    stopping = time.perf_counter()
    process.send_signal(signal.SIGINT)
    process.wait(120)
    return ready, moved, time.perf_counter() - stopping


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--demos", type=int, default=3)
    args = parser.parse_args()
    starts = cluster_starts(args.starts)
    print(f"cluster start+stop ({args.starts}x): median {statistics.median(starts):.2f} s, max {max(starts):.2f} s")
    runs = [one_demo() for _ in range(args.demos)]
    for label, values in zip(("demo ready (URL answers)", "share request -> lab back on new pod", "SIGINT -> exit"),
                             zip(*runs, strict=True), strict=True):
        print(f"{label} ({args.demos}x): median {statistics.median(values):.2f} s, max {max(values):.2f} s")


if __name__ == "__main__":
    main()
