"""ProcessTree reads a real process tree from /proc: a child's CPU time and memory count."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

from simkube.waiting import wait_for
from vgpu_plugin.demo.proctree import ProcessTree

# a parent that only waits, and a child that spins for a bounded time holding ~200 MiB
_PARENT = ("import subprocess, sys; subprocess.run([sys.executable, '-c', "
           "'import time\\nb = bytearray(200 * 2**20)\\nt = time.time()\\nwhile time.time() - t < 60: pass'])")


def test_the_tree_counts_its_childrens_cpu_time_and_memory() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT])
    try:
        tree = ProcessTree(parent.pid)
        wait_for(lambda: len(tree.members()) >= 2, timeout=30, what="the child under its parent")
        first = tree.usage()
        assert first is not None

        def accrued() -> tuple[float, int] | None:  # the busy child's CPU time (however loaded the machine)
            later = tree.usage()
            assert later is not None
            return later if later[0] - first[0] >= 0.3 else None

        later = wait_for(accrued, timeout=60, what=f"CPU time to accrue from {first}")
        assert later[1] >= 200 * 2**20, "the child's 200 MiB count as the tree's memory"
    finally:
        for member in ProcessTree(parent.pid).members():
            with contextlib.suppress(ProcessLookupError):
                os.kill(member, signal.SIGTERM)
        parent.wait(30)
    assert ProcessTree(parent.pid).usage() is None  # gone (and reaped): nothing to measure
