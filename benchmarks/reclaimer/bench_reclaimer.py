"""The reclaimer's cost: CPU seconds of its own process for one pass over N vGPU servers.

Target (issue 17): one pass over 1,000 servers in under 2 s of the reclaimer's CPU. The Hub
and the nodes are canned responders in another process (peers.py), so only the
reclaimer's work counts: paging the Hub's users, reading every node's pods with their
history since the last pass, classifying and stepping each share.

    .venv/bin/python benchmarks/reclaimer/bench_reclaimer.py --servers 1000 --nodes 50 --points 60
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from simkube.waiting import wait_for  # noqa: E402

from jupyter_vgpu.reclaimer.service import VGPUReclaimer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--points", type=int, default=60, help="history points per pod per pass (period / sample)")
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        portfile = os.path.join(tmp, "port")
        peers = subprocess.Popen([sys.executable, str(HERE / "peers.py"), str(args.servers), str(args.nodes),
                                  str(args.points), portfile])
        try:
            wait_for(lambda: os.path.exists(portfile) and Path(portfile).read_text(), timeout=30,
                     what="the peers to start")
            base = f"http://127.0.0.1:{Path(portfile).read_text()}"
            clock = [time.time()]
            reclaimer = VGPUReclaimer(
                clock=lambda: clock[0], hub_api_url=base + "/hub/api", api_token="x", record_events=False,
                node_urls=[f"{base}/node/{i}" for i in range(args.nodes)], scrape_token="t" * 16,
                idle_minutes=10, hoard_minutes=20, grace_minutes=5, dry_run=True)
            loop = asyncio.new_event_loop()
            cpu, wall = [], []
            for _ in range(args.passes):
                clock[0] += 60
                started_cpu, started = time.process_time(), time.perf_counter()
                loop.run_until_complete(reclaimer.run_once())
                cpu.append(time.process_time() - started_cpu)
                wall.append(time.perf_counter() - started)
            tracked = len(reclaimer.shares)
        finally:
            peers.terminate()
            peers.wait(10)
    print(f"servers {args.servers}, nodes {args.nodes}, {args.points} history points per pod per pass; "
          f"{tracked} shares tracked")
    print("pass CPU s: " + ", ".join(f"{c:.3f}" for c in cpu) + f"  (median {statistics.median(cpu):.3f}, "
          f"max {max(cpu):.3f}; target < 2 s)")
    print("pass wall s: " + ", ".join(f"{w:.3f}" for w in wall))


if __name__ == "__main__":
    main()
