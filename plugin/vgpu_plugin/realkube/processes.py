"""The real cluster's programs as child processes: each logs to a file of its own, dies with
the process that started it (``PR_SET_PDEATHSIG``: a killed test run leaves no kubelet
behind), and stops with SIGTERM, then SIGKILL after a grace period."""

from __future__ import annotations

import ctypes
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1


_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a program that takes its port as
    a flag and binds it a moment later. It is chosen below the kernel's ephemeral range: a port
    from that range (what binding port 0 gives) can be taken meanwhile by any outgoing
    connection, and with forty nodes' programs connecting, one was."""
    low, _ = _ephemeral_range()
    for _ in range(1000):
        port = random.randrange(10000, max(low, 10001))
        if port in _handed_out:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise OSError(f"no free port on 127.0.0.1 between 10000 and {low}")


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Program:
    """One program of the cluster: ``start()``, ``stop()``, ``restart()``, its log."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, *, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None, grace: float = 10.0) -> None:
        self.name, self.argv, self.log, self.grace = name, list(argv), log, grace
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Program:
        if self.alive:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        with open(self.log, "ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} {self.name}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            env=self.env, cwd=self.cwd, start_new_session=True,
                                            preexec_fn=_die_with_parent)
        return self

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, *, kill: bool = False) -> None:
        """SIGTERM (SIGKILL with ``kill``: a crash), then SIGKILL if it outlives the grace period."""
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL if kill else signal.SIGTERM)
                self.process.wait(self.grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            except ProcessLookupError:
                pass
        self.process = None

    def restart(self, *, kill: bool = False) -> Program:
        self.stop(kill=kill)
        return self.start()

    def tail(self, lines: int = 20) -> str:
        """The end of its log, for an error message."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def exited(self) -> str | None:
        """None while it runs; else how it ended and the end of its log."""
        if self.process is None or self.process.poll() is None:
            return None
        return f"{self.name} exited with status {self.process.returncode}:\n{self.tail()}"
