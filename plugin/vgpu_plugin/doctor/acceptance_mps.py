"""MPS with server-side limits: a private control daemon, and a client held to its pinned-memory limit.

Only with ``--allow-mps``: the kit then starts ``nvidia-cuda-mps-control -d`` with pipe and log
directories of its own in a new temporary directory (so it meets no other MPS daemon), sends
the same server-side ceilings the project's ``jupyter-vgpu mps-control-daemon`` sends
(``set_default_device_pinned_mem_limit`` per device, ``set_default_active_thread_percentage``),
starts a client (``acceptance_cuda alloc``) that allocates below the limit (must work) and above
it (must be refused), and always sends ``quit`` at the end. The compute mode is not touched: a
card in DEFAULT compute mode serves MPS clients and other processes side by side.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from jupyter_vgpu.core import contract

from ..deviceplugin.mps_daemon import CONTROL, MPSDaemonConfig, ceiling_commands
from .acceptance_report import FAIL, NA, PASS, CheckResult
from .acceptance_setup import AcceptanceRun
from .acceptance_signals import not_interrupted
from .acceptance_worker import Worker, describe_silence, worker_env

NAME = "mps"
THREAD_PERCENTAGE = 50
LIMIT_MAX_MIB = 2048
_MIB = 1024 * 1024


def limits(card_mib: int) -> tuple[int, int, int]:
    """(pinned-memory limit, an allocation below it, one above it) in MiB for a card of this size."""
    limit = max(contract.MEMORY_UNIT_MIB, min(LIMIT_MAX_MIB, card_mib // 4) // contract.MEMORY_UNIT_MIB
                * contract.MEMORY_UNIT_MIB)
    return limit, max(64, limit // 4), limit + max(512, limit // 2)


class PrivateControl:
    """A control daemon on pipe and log directories of its own; commands on its stdin protocol."""

    def __init__(self, control: str, root: Path, timeout: float) -> None:
        self.control = control
        self.pipe_dir, self.log_dir = root / "pipe", root / "log"
        self.timeout = max(1.0, timeout)
        self.env = worker_env({contract.ENV_MPS_PIPE_DIRECTORY: str(self.pipe_dir),
                               contract.ENV_MPS_LOG_DIRECTORY: str(self.log_dir)})
        self.started = False

    def start(self) -> None:
        for directory in (self.pipe_dir, self.log_dir):
            directory.mkdir(mode=0o700)
        with not_interrupted():  # started means quit() will stop it
            self.started = True  # from here on quit() is sent: a daemon half started is told to quit too
            done = subprocess.run([self.control, "-d"], env=self.env, capture_output=True, text=True,
                                  timeout=self.timeout)
        if done.returncode != 0:
            self.started = False
            raise RuntimeError(f"{self.control} -d failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")

    def send(self, command: str) -> str:
        done = subprocess.run([self.control], input=command + "\n", env=self.env, capture_output=True, text=True,
                              timeout=self.timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{command!r} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
        return done.stdout.strip()

    def quit(self) -> str | None:
        """Stop the daemon (and the servers it started); the problem, or None when it quit."""
        if not self.started:
            return None
        try:
            with not_interrupted():
                self.send("quit")
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
            return (f"{error}; stop it by hand: echo quit | {contract.ENV_MPS_PIPE_DIRECTORY}={self.pipe_dir} "
                    f"{self.control}")
        self.started = False
        return None

    def log_tail(self, limit: int = 1500) -> str | None:
        path = self.log_dir / "control.log"
        try:
            return path.read_text(encoding="utf-8", errors="replace")[-limit:].strip() or None
        except OSError:
            return None


def _free_mib(run: AcceptanceRun, index: int) -> int | None:
    nv = run.nvml()
    if nv is None:
        return None
    try:
        return int(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(index)).free) // _MIB
    except Exception as error:
        if getattr(error, "value", None) is None:
            raise
        return None


def check_mps(run: AcceptanceRun) -> CheckResult:
    if not run.options.allow_mps:
        return CheckResult(NAME, NA, "not started: pass --allow-mps to let the kit start a private MPS control "
                                     "daemon for a few seconds")
    control = shutil.which(CONTROL)
    if control is None:
        return CheckResult(NAME, NA, f"{CONTROL} is not installed")
    card = run.test_card()
    if card is None:
        return CheckResult(NAME, NA, run.no_test_card())
    limit, below, above = limits(card.memory_mib)
    free = _free_mib(run, card.index)
    details: dict[str, Any] = {"card": card.index, "uuid": card.uuid, "limitMib": limit, "belowMib": below,
                               "aboveMib": above, "freeMib": free, "threadPercentage": THREAD_PERCENTAGE,
                               "smCountAlone": run.facts.get("smCount")}
    if free is not None and free < above + 512:
        return CheckResult(NAME, NA, f"card {card.index} has {free} MiB free: too little to tell the limit "
                           f"({above} MiB asked) from a full card", details)
    root = Path(tempfile.mkdtemp(prefix="vgpu-acceptance-mps-"))
    daemon = PrivateControl(control, root, run.budget.allow(run.options.command_timeout))
    details["pipeDir"] = str(daemon.pipe_dir)
    message: dict[str, Any] | None = None
    worker: Worker | None = None
    timeout = 0.0
    failure: CheckResult | None = None
    try:
        daemon.start()
        failure = _set_limits(run, daemon, control, card.index, limit, details)
        if failure is None:
            argv = run.worker("alloc", "--below", str(below), "--above", str(above))
            details["worker"] = argv
            env = run.worker_env({"CUDA_VISIBLE_DEVICES": card.uuid, **{k: daemon.env[k] for k in (
                contract.ENV_MPS_PIPE_DIRECTORY, contract.ENV_MPS_LOG_DIRECTORY)}})
            with Worker(argv, env) as worker:
                timeout = run.budget.allow(run.options.result_timeout)
                message = worker.message(timeout)
                if message is None:
                    worker.stop()
                try:
                    details["servers"] = daemon.send("get_server_list").split()
                except (RuntimeError, subprocess.TimeoutExpired) as error:
                    details["servers"] = f"unknown: {error}"
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
        details["error"] = str(error)
        failure = CheckResult(NAME, FAIL, f"the private MPS daemon failed: {error}", details)
    finally:
        problem = daemon.quit()  # always, whatever happened above
        details["quit"] = problem or "ok"
        details["controlLog"] = daemon.log_tail()
        if worker is not None:
            details["workerEnded"] = worker.ended
            details["workerStderr"] = worker.stderr_tail() or None
        if problem is None:
            shutil.rmtree(root, ignore_errors=True)
    if problem is not None:
        before = f"{failure.summary}; and " if failure is not None else ""
        return CheckResult(NAME, FAIL, f"{before}the private MPS control daemon did not quit: {problem}", details)
    if failure is not None:
        return failure
    assert worker is not None
    return judge(message, worker, timeout, details)


def _set_limits(run: AcceptanceRun, daemon: PrivateControl, control: str, index: int, limit: int,
                details: dict[str, Any]) -> CheckResult | None:
    """The project's server-side ceilings, as ``jupyter-vgpu mps-control-daemon`` sends them; a failure
    when the card under test's memory limit was refused."""
    config = MPSDaemonConfig(pipe_dir=str(daemon.pipe_dir), log_dir=str(daemon.log_dir),
                             devices=len(run.cards()), thread_ceiling=THREAD_PERCENTAGE,
                             memory_ceiling=f"{limit}M", control=control)
    answers = {}
    for command in ceiling_commands(config):
        try:
            answers[command] = daemon.send(command) or "ok"
        except RuntimeError as error:
            answers[command] = f"refused: {error}"
    details["commands"] = answers
    mine = f"set_default_device_pinned_mem_limit {index} {limit}M"
    if answers.get(mine, "refused: not sent").startswith("refused"):
        return CheckResult(NAME, FAIL, f"the control daemon did not take {mine!r}: {answers.get(mine, 'not sent')}",
                           details)
    return None


def judge(message: dict[str, Any] | None, worker: Worker, timeout: float, details: dict[str, Any]) -> CheckResult:
    limit, below, above = details["limitMib"], details["belowMib"], details["aboveMib"]
    if message is None:
        return CheckResult(NAME, FAIL, f"MPS client: {describe_silence(worker, timeout)}", details)
    if message.get("event") == "unavailable":
        return CheckResult(NAME, NA, f"no way to run a CUDA client here: {message.get('reason')}", details)
    if message.get("event") != "result":
        return CheckResult(NAME, FAIL, f"the MPS client failed: {message.get('error')}", details)
    details["result"] = {k: v for k, v in message.items() if k != "event"}
    details["smCountUnderMps"] = message.get("smCount")
    allowed, refused = message.get("below") or {}, message.get("above") or {}
    servers = details.get("servers")
    if not allowed.get("ok"):
        return CheckResult(NAME, FAIL, f"an MPS client could not allocate {below} MiB under a {limit} MiB limit: "
                           f"{allowed.get('error')}", details)
    if refused.get("ok"):
        through = "" if servers else " (no MPS server was listed: the client may not have gone through MPS)"
        return CheckResult(NAME, FAIL, f"an MPS client allocated {above} MiB past the server's {limit} MiB pinned-"
                           f"memory limit{through}", details)
    if not refused.get("refused"):
        return CheckResult(NAME, FAIL, f"the allocation past the limit failed, but not as out of memory: "
                           f"{refused.get('error')}", details)
    return CheckResult(NAME, PASS, f"a {message.get('framework')} client under a private MPS server (limit {limit} "
                       f"MiB, set_default_device_pinned_mem_limit): {below} MiB allowed, {above} MiB refused",
                       details)
