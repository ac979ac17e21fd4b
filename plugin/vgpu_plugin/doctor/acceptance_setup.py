"""What the acceptance checks share: the options, the NVML backend, the time budget, the card under test."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .acceptance_worker import worker_command, worker_env
from .gpu_checks import mig_modes, nvml_library

# nvml.h's nvmlComputeMode_t
COMPUTE_MODES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}


@dataclass
class AcceptanceOptions:
    proc_root: str = "/proc"
    allow_mps: bool = False  # may the kit start a private MPS control daemon (for a few seconds)?
    cuda_worker: str | None = None  # the command that runs the CUDA worker; None: the bundled one
    budget_seconds: float = 270.0  # the whole run, so it ends within 5 minutes with start-up
    hold_mib: int = 256  # what the CUDA process allocates
    busy_seconds: float = 8.0  # how long it keeps the card busy (and the sampler watches)
    ready_timeout: float = 120.0  # a cold PyTorch import and CUDA start-up
    result_timeout: float = 120.0  # a guard or MPS client's whole run
    command_timeout: float = 30.0  # one nvidia-smi or nvidia-cuda-mps-control command
    sample_period: float = 1.0  # the metrics sampler's period

    def public(self) -> dict[str, Any]:
        """What the report records of the options."""
        return {"allowMps": self.allow_mps, "cudaWorker": self.cuda_worker or "bundled",
                "procRoot": self.proc_root, "budgetSeconds": self.budget_seconds, "holdMib": self.hold_mib,
                "busySeconds": self.busy_seconds}


class Budget:
    """The run's deadline: each step gets its own timeout, cut to what is left."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._end = clock() + seconds

    def left(self) -> float:
        return max(0.0, self._end - self._clock())

    def allow(self, wanted: float) -> float:
        return min(wanted, self.left())


@dataclass
class AcceptanceRun:
    gpus: Any  # an NVML backend (jupyter_vgpu.gpu.nvml.NVMLBackend)
    options: AcceptanceOptions
    budget: Budget
    smi: str | None  # nvidia-smi's path, None when it is not installed
    python_path: str | None = None  # for a --cuda-worker run by another Python: where our packages are
    facts: dict[str, Any] = field(default_factory=dict)

    def worker(self, mode: str, *args: str) -> list[str]:
        """The CUDA worker's command line for one mode (acceptance_cuda's protocol)."""
        return [*worker_command(self.options.cuda_worker), mode, *args, "--exit-on-eof"]

    def worker_env(self, extra: dict[str, str]) -> dict[str, str]:
        return worker_env(extra, self.python_path)

    def nvml(self) -> Any:
        """The initialised pynvml module behind the backend (None without a driver)."""
        return nvml_library(self.gpus)

    def cards(self) -> list[Any]:
        return list(self.gpus.inventory()) if self.gpus.available() else []

    def test_card(self) -> Any:
        """The card the CUDA checks run on: the first healthy one not in MIG mode (None if none)."""
        for card in self.cards():
            if card.healthy and not card.mig:
                return card
        return None

    def no_test_card(self) -> str:
        if not self.gpus.available():
            return f"no cards: {self.gpus.problem() or 'no GPUs'}"
        return "no card to run CUDA on: every card is unhealthy or in MIG mode"

    def compute_mode(self, index: int) -> str | None:
        """``nvmlDeviceGetComputeMode``, read only; None where NVML cannot say."""
        nv = self.nvml()
        if nv is None:
            return None
        try:
            mode = nv.nvmlDeviceGetComputeMode(nv.nvmlDeviceGetHandleByIndex(index))
        except Exception as error:  # NVMLError (NOT_SUPPORTED), or bindings without the call
            if getattr(error, "value", None) is None and not isinstance(error, AttributeError):
                raise
            return None
        return COMPUTE_MODES.get(int(mode), str(mode))

    def mig_mode(self, index: int) -> tuple[bool, bool] | None:
        """``nvmlDeviceGetMigMode`` (current, pending), read only; None for a card without MIG."""
        nv = self.nvml()
        return None if nv is None else mig_modes(nv, index)
