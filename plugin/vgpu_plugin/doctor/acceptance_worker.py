"""Starting the acceptance kit's CUDA worker, reading what it says, and always stopping it.

The worker runs in a session of its own (its process group is its PID), with our pipe as its
stdin: leaving the ``with`` block terminates the group (SIGTERM, then SIGKILL), whatever
happened inside, and a worker whose kit died sees its stdin close and exits by itself.
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from jupyter_vgpu.core import contract

from .acceptance_signals import not_interrupted

WORKER_MODULE = "vgpu_plugin.doctor.acceptance_cuda"
# variables of a vGPU container or a framework limit that must not leak from the kit's own
# environment into a worker: each check sets the ones it tests
_SCRUBBED = (*contract.VGPU_ENV_NAMES, contract.ENV_MPS_PIPE_DIRECTORY, contract.ENV_MPS_LOG_DIRECTORY,
             contract.ENV_MPS_PINNED_MEMORY_LIMIT, contract.ENV_MPS_ACTIVE_THREAD_PERCENTAGE,
             contract.ENV_XLA_MEM_FRACTION, contract.ENV_CUPY_MEMORY_LIMIT, contract.ENV_HAMI_SM_LIMIT,
             "CUDA_VISIBLE_DEVICES")


def worker_command(option: str | None) -> list[str]:
    """``--cuda-worker`` split like a shell would, else this Python running the bundled worker."""
    if option:
        return shlex.split(option)
    return [sys.executable, "-m", WORKER_MODULE]


def package_shim(directory: Path) -> str:
    """A directory holding only ``vgpu_plugin`` and ``jupyter_vgpu`` (links), for the PYTHONPATH of a
    worker run by another Python (``--cuda-worker``): this install's site-packages on that path
    would shadow that Python's own packages (numpy for another Python version, ...)."""
    import jupyter_vgpu
    import vgpu_plugin

    for package in (vgpu_plugin, jupyter_vgpu):
        source = Path(package.__file__ or "").resolve().parent
        (directory / source.name).symlink_to(source, target_is_directory=True)
    return str(directory)


def worker_env(extra: Mapping[str, str], python_path: str | None = None,
               base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The kit's environment without any share, limit or card selection of its own, plus ``extra``."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in _SCRUBBED and not k.startswith(contract.ENV_HAMI_MEMORY_LIMIT_PREFIX)}
    if python_path:
        env["PYTHONPATH"] = os.pathsep.join([python_path, *filter(None, [env.get("PYTHONPATH")])])
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's device order is NVML's
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


_EOF = object()


class Worker:
    """One worker process: ``with Worker(argv, env) as w: w.message(timeout)``."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.process: subprocess.Popen[str] | None = None
        self.messages: list[dict[str, Any]] = []
        self.ended: str | None = None  # how it ended: "exited 0", "terminated", "killed"
        self._lines: queue.Queue[object] = queue.Queue()
        self._stderr: IO[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._stderr_text = ""

    def __enter__(self) -> Worker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self) -> None:
        self._stderr = tempfile.TemporaryFile()
        with not_interrupted():  # a worker started is a worker known, so stop() finds it
            self.process = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=self.env,
                text=True, start_new_session=True,
            )
        stdout = self.process.stdout
        assert stdout is not None
        self._reader = threading.Thread(target=self._read, args=(stdout,), name="acceptance-worker-out", daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str]) -> None:
        try:
            for line in stream:
                self._lines.put(line)
        except (OSError, ValueError):
            pass
        self._lines.put(_EOF)

    def message(self, timeout: float,
                events: Sequence[str] = ("ready", "result", "unavailable", "error")) -> dict[str, Any] | None:
        """The next protocol message with one of ``events``; None at the timeout or when the worker's
        output ended. Lines that are not JSON objects (a framework's chatter) are skipped."""
        started = time.monotonic()
        while True:
            left = timeout - (time.monotonic() - started)
            if left <= 0:
                return None
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                return None
            if line is _EOF:
                self._lines.put(_EOF)  # later calls see the end too
                return None
            try:
                message = json.loads(str(line))
            except ValueError:
                continue
            if isinstance(message, dict):
                self.messages.append(message)
                if message.get("event") in events:
                    return message

    def exit_status(self) -> int | None:
        return self.process.poll() if self.process is not None else None

    def stop(self, grace: float = 5.0) -> None:
        """Terminate the worker's process group, then kill it; wait for it (no zombie left)."""
        with not_interrupted():
            self._stop(grace)

    def _stop(self, grace: float) -> None:
        process = self.process
        if process is None or self.ended is not None:
            return
        if process.poll() is not None:
            self.ended = f"exited {process.returncode}"
        else:
            for sig, how in ((signal.SIGTERM, "terminated"), (signal.SIGKILL, "killed")):
                try:
                    os.killpg(process.pid, sig)  # its children too (a framework's helpers)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    process.wait(grace)
                except subprocess.TimeoutExpired:
                    continue
                self.ended = how
                break
            else:
                process.wait()
                self.ended = "killed"
        if process.stdin is not None:
            try:
                process.stdin.close()
            except OSError:
                pass
        if self._reader is not None:
            self._reader.join(2.0)
        if process.stdout is not None:
            process.stdout.close()
        self._stderr_text = self.stderr_tail()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def stderr_tail(self, limit: int = 1500) -> str:
        """The end of what the worker wrote on stderr (kept once it is stopped)."""
        if self._stderr is None:
            return self._stderr_text
        try:
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - limit))
            return self._stderr.read().decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""


def describe_silence(worker: Worker, timeout: float) -> str:
    """Why no message came: the worker exited by itself, or it said nothing in time (and was stopped)."""
    ended = worker.ended
    if ended is None and worker.exit_status() is not None:
        ended = f"exited {worker.exit_status()}"
    if ended is not None and ended.startswith("exited"):
        return f"the CUDA worker {ended} without a result"
    return f"the CUDA worker said nothing within {timeout:.0f} s" + (f" and was {ended}" if ended else "")
