"""``jupyter-vgpu mps-control-daemon``: NVIDIA's MPS control daemon, set up for shared notebooks.

It runs ``nvidia-cuda-mps-control -d`` the way NVIDIA's own Kubernetes integration does and
adds what makes limits hold against a tenant:

- the pipe and log directories are made root-owned 0755 (clients get the pipe directory
  read-only from the device plugin); the daemon's ``/dev/shm`` is the host directory the
  device plugin mounts as every client's ``/dev/shm``, so daemon, servers and clients share it;
- server-side ceilings: ``set_default_active_thread_percentage`` and
  ``set_default_device_pinned_mem_limit`` are sent to the control daemon before any client
  connects, so every MPS server it starts gets them. NVIDIA documents that a client's
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` only further constrains the daemon's setting; for the
  pinned-memory limit the documentation does not say whether a client's environment can exceed
  the server default, so that ceiling is the servers' default, not a proven bound;
- optionally the cards go to EXCLUSIVE_PROCESS compute mode (and back to DEFAULT at exit),
  so a process that drops the MPS environment cannot open its own context beside the server.

The per-allocation values (the notebook's share) are still given to each client as
environment variables: below the ceiling they are cooperative.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
_MEMORY = re.compile(r"^[1-9][0-9]{0,8}[MG]\Z")


@dataclass(frozen=True)
class MPSDaemonConfig:
    pipe_dir: str = "/mps/pipe"
    log_dir: str = "/mps/log"
    shm_dir: str = "/dev/shm"                # the host directory shared with every client as its /dev/shm
    devices: int = 0                         # cards the daemon sees (pinned-memory ceilings are per card)
    thread_ceiling: int | None = None        # percent of a card's SMs any one client may use
    memory_ceiling: str | None = None        # pinned device memory any one client may use per card, "16G"
    exclusive: bool = False                  # EXCLUSIVE_PROCESS compute mode while the daemon runs
    control: str = CONTROL
    smi: str = "nvidia-smi"
    check_period: float = 30.0

    def __post_init__(self) -> None:
        if self.thread_ceiling is not None and not 1 <= self.thread_ceiling <= 100:
            raise ValueError(f"the active thread percentage ceiling must be 1-100, not {self.thread_ceiling}")
        if self.memory_ceiling is not None and not _MEMORY.match(self.memory_ceiling):
            raise ValueError(f"the pinned memory ceiling {self.memory_ceiling!r} is not like 512M or 16G")
        if self.devices < 0:
            raise ValueError("devices must not be negative")

    def env(self) -> dict[str, str]:
        return {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": self.log_dir}


def ceiling_commands(config: MPSDaemonConfig) -> list[str]:
    """The control-daemon commands that set the server-side ceilings."""
    commands = []
    if config.thread_ceiling is not None:
        commands.append(f"set_default_active_thread_percentage {config.thread_ceiling}")
    if config.memory_ceiling is not None:
        commands += [f"set_default_device_pinned_mem_limit {i} {config.memory_ceiling}" for i in range(config.devices)]
    return commands


class MPSControlDaemon:
    def __init__(self, config: MPSDaemonConfig) -> None:
        self.config = config

    def send(self, command: str) -> str:
        """One command on the control daemon's stdin protocol; its answer."""
        done = subprocess.run([self.config.control], input=command + "\n", capture_output=True, text=True,
                              env=self.config.env(), timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"{self.config.control} {command!r} failed ({done.returncode}): "
                               f"{(done.stderr or done.stdout).strip()}")
        return done.stdout.strip()

    def start(self) -> None:
        cfg = self.config
        for directory in (cfg.pipe_dir, cfg.log_dir):
            os.makedirs(directory, exist_ok=True)
            os.chmod(directory, 0o755)  # after mkdir: the umask must not decide; only root writes here
        # kubelet creates a missing hostPath 0755: open it like /dev/shm, where every client's
        # uid creates its segments and none can remove another's
        os.chmod(cfg.shm_dir, 0o1777)
        if cfg.exclusive:
            self._compute_mode("EXCLUSIVE_PROCESS")
        started = subprocess.run([cfg.control, "-d"], env=cfg.env(), capture_output=True, text=True, timeout=60)
        if started.returncode != 0:
            raise RuntimeError(f"{cfg.control} -d failed ({started.returncode}): {started.stderr.strip()}")
        for command in ceiling_commands(cfg):
            self.send(command)
            log.info("MPS control daemon: %s", command)
        log.info("MPS control daemon running (pipes in %s, logs in %s)", cfg.pipe_dir, cfg.log_dir)

    def healthy(self) -> bool:
        try:
            self.send("get_default_active_thread_percentage")
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
            log.error("MPS control daemon does not answer: %s", error)
            return False
        return True

    def stop(self) -> None:
        try:
            self.send("quit")
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
            log.warning("stopping the MPS control daemon: %s", error)
        if self.config.exclusive:
            self._compute_mode("DEFAULT")

    def _compute_mode(self, mode: str) -> None:
        done = subprocess.run([self.config.smi, "-c", mode], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{self.config.smi} -c {mode} failed: {(done.stderr or done.stdout).strip()}")


def _count_devices(smi: str) -> int:
    done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"{smi} -L failed: {done.stderr.strip()}")
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU "))


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="jupyter-vgpu mps-control-daemon",
        description="Run NVIDIA's MPS control daemon with server-side per-client ceilings (overlays/mps).")
    parser.add_argument("--pipe-dir", default=env("VGPU_MPS_PIPE_DIR", "/mps/pipe"),
                        help="the control daemon's pipe directory [$VGPU_MPS_PIPE_DIR, default /mps/pipe]")
    parser.add_argument("--log-dir", default=env("VGPU_MPS_LOG_DIR", "/mps/log"),
                        help="the control daemon's log directory [$VGPU_MPS_LOG_DIR, default /mps/log]")
    parser.add_argument("--shm-dir", default=env("VGPU_MPS_SHM_DIR", "/dev/shm"),
                        help="the shared memory directory daemon, servers and clients share (the host "
                             "directory mounted here as /dev/shm) [$VGPU_MPS_SHM_DIR, default /dev/shm]")
    parser.add_argument("--max-thread-percentage", type=int, default=env("VGPU_MPS_MAX_THREAD_PERCENTAGE"),
                        help="server-side ceiling of any one client's active thread percentage (1-100); "
                             "set it to the largest share a notebook may get [$VGPU_MPS_MAX_THREAD_PERCENTAGE, "
                             "default: none]")
    parser.add_argument("--max-pinned-memory", default=env("VGPU_MPS_MAX_PINNED_MEMORY"),
                        help="server-side ceiling of any one client's device memory per card, e.g. 20G "
                             "[$VGPU_MPS_MAX_PINNED_MEMORY, default: none]")
    parser.add_argument("--exclusive", choices=["true", "false"], default=env("VGPU_MPS_EXCLUSIVE", "true"),
                        help="put the cards in EXCLUSIVE_PROCESS compute mode while the daemon runs, so no "
                             "process can bypass MPS [$VGPU_MPS_EXCLUSIVE, default true]")
    parser.add_argument("--check-period", type=float, default=float(env("VGPU_MPS_CHECK_PERIOD", "30")),
                        help="seconds between health checks; an unanswering daemon exits non-zero for "
                             "kubelet to restart [$VGPU_MPS_CHECK_PERIOD, default 30]")
    parser.add_argument("--control", default=env("VGPU_MPS_CONTROL", CONTROL), help=argparse.SUPPRESS)
    parser.add_argument("--smi", default=env("VGPU_NVIDIA_SMI", "nvidia-smi"), help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        devices = _count_devices(args.smi) if args.max_pinned_memory else 0
        config = MPSDaemonConfig(pipe_dir=args.pipe_dir, log_dir=args.log_dir, shm_dir=args.shm_dir, devices=devices,
                                 thread_ceiling=args.max_thread_percentage, memory_ceiling=args.max_pinned_memory,
                                 exclusive=args.exclusive == "true", control=args.control, smi=args.smi,
                                 check_period=args.check_period)
        daemon = MPSControlDaemon(config)
        daemon.start()
    except (ValueError, RuntimeError, OSError, subprocess.TimeoutExpired) as error:
        print(f"jupyter-vgpu mps-control-daemon: {error}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(config.check_period):
        if not daemon.healthy():
            return 1
    daemon.stop()
    return 0
