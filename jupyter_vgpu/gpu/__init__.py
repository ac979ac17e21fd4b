"""GPU backends behind one interface: NVML (real cards) and simulated (topology fixture).

Importing this package imports neither pynvml nor anything heavy; backends load what
they need on first use.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from jupyter_vgpu.gpu.base import (
    APPLICATION_XIDS,
    CardSample,
    GPUBackend,
    GPUError,
    HealthEvent,
    ProcessSample,
    Sample,
    describe_xid,
    node_inventory,
)

if TYPE_CHECKING:
    from jupyter_vgpu.gpu.simulated import SimulatedGPUs

__all__ = [
    "APPLICATION_XIDS",
    "CardSample",
    "GPUBackend",
    "GPUError",
    "HealthEvent",
    "ProcessSample",
    "Sample",
    "describe_xid",
    "node_inventory",
    "open_backend",
    "resolve_fixture",
]


def resolve_fixture(name: str) -> str:
    """A topology fixture: an existing file path, or the name of a bundled capture."""
    if os.path.isfile(name):
        return name
    from jupyter_vgpu.data import topology_fixture

    return str(topology_fixture(name))


def open_backend(spec: str, *, model: str | None = None, memory_mib: int | None = None,
                 seed: int = 0, host: str = "") -> GPUBackend:
    """``"nvml"`` or ``"sim:FIXTURE"`` (a path or a bundled name like ``dgx-a100``).

    ``model``, ``memory_mib``, ``seed`` and ``host`` shape simulated cards only.
    Raises ValueError with the accepted forms when ``spec`` is neither.
    """
    if spec == "nvml":
        from jupyter_vgpu.gpu.nvml import NVMLBackend

        return NVMLBackend()
    if spec.startswith("sim:") and spec[4:]:
        return open_simulated(spec[4:], model=model, memory_mib=memory_mib, seed=seed, host=host)
    raise ValueError(f"GPU backend {spec!r}: use 'nvml' or 'sim:FIXTURE' (a topology file or a bundled name)")


def open_simulated(fixture: str, *, model: str | None = None, memory_mib: int | None = None,
                   seed: int = 0, host: str = "") -> SimulatedGPUs:
    from jupyter_vgpu.gpu.simulated import DEFAULT_MEMORY_MIB, DEFAULT_MODEL, SimulatedGPUs

    return SimulatedGPUs.from_fixture(
        resolve_fixture(fixture), model=model or DEFAULT_MODEL,
        memory_mib=memory_mib or DEFAULT_MEMORY_MIB, seed=seed, host=host,
    )
