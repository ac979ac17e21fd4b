"""The driver, NVML, the cards, MIG mode and the device nodes."""

from __future__ import annotations

import os
import re
from typing import Any

from .report import FAIL, OK, WARN, Finding
from .setup import NodeSetup

# CUDA 11.0 and HAMi-core need at least R450; CUDA 12 frameworks (current PyTorch wheels)
# need R525, and older drivers lack the v3 process queries (the backend falls back).
MIN_DRIVER = (450, 36)
RECOMMENDED_DRIVER = (525, 60)
NO_DRIVER_REMEDY = ("install the NVIDIA driver on the node; in a pod, the NVIDIA container runtime must inject it: "
                    "make nvidia containerd's default runtime or run the pod with its RuntimeClass "
                    "(deploy/components/runtime-class)")
_NVML_MIG_ENABLE = 1


def _driver_tuple(version: str) -> tuple[int, int] | None:
    found = re.match(r"^(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else None


def nvml_library(backend: Any) -> Any:
    """The initialised pynvml module behind an NVML backend (None for other backends).

    A narrow accessor: the backend keeps the module it loaded, and NVML's init is
    reference-counted, so asking it directly needs no second initialisation.
    """
    if getattr(backend, "name", None) != "nvml" or not backend.available():
        return None
    return getattr(backend, "_library", None)


def nvml_version(backend: Any) -> str | None:
    nv = nvml_library(backend)
    if nv is None:
        return None
    try:
        value = nv.nvmlSystemGetNVMLVersion()
    except Exception:  # an NVMLError: the version is only informative
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def mig_modes(nv: Any, index: int) -> tuple[bool, bool] | None:
    """``nvmlDeviceGetMigMode`` (current, pending) of a card, read only, through the NVML module
    ``nv``; None where MIG does not exist."""
    try:
        current, pending = nv.nvmlDeviceGetMigMode(nv.nvmlDeviceGetHandleByIndex(index))
    except Exception as error:
        if getattr(error, "value", None) is None and not isinstance(error, AttributeError):
            raise
        return None  # NOT_SUPPORTED: a card without MIG, or a driver older than R450
    return int(current) == _NVML_MIG_ENABLE, int(pending) == _NVML_MIG_ENABLE


def nvml_mig_mode(backend: Any, index: int) -> bool | None:
    """``nvmlDeviceGetMigMode``'s current mode for a card; None where MIG does not exist."""
    nv = nvml_library(backend)
    modes = mig_modes(nv, index) if nv is not None else None
    return None if modes is None else modes[0]


def mig_accessor(setup: NodeSetup) -> Any:
    """The injected accessor, else the backend's own ``mig_mode`` if it has one, else NVML's."""
    if setup.mig_mode is not None:
        return setup.mig_mode
    own = getattr(setup.gpus, "mig_mode", None)
    if callable(own):
        return own
    return lambda index: nvml_mig_mode(setup.gpus, index)


def check_driver(setup: NodeSetup) -> Finding:
    gpus = setup.gpus
    if not gpus.available():
        problem = gpus.problem() or "no GPUs"
        if problem == "no GPUs":
            return Finding("driver", FAIL, f"driver {gpus.driver_version()} loaded but it sees no GPUs",
                           "check `nvidia-smi` on the host; in a pod, the NVIDIA runtime must expose the cards "
                           "(NVIDIA_VISIBLE_DEVICES=all)")
        return Finding("driver", FAIL, problem, NO_DRIVER_REMEDY)
    version = gpus.driver_version() or ""
    nvml = nvml_version(gpus)
    detail = f"driver {version or 'unknown'}" + (f", NVML {nvml}" if nvml else "")
    if version == "simulated":
        return Finding("driver", OK, "simulated cards (no driver to check)")
    parsed = _driver_tuple(version)
    if parsed is None:
        return Finding("driver", WARN, f"{detail}: cannot read the version",
                       f"check `nvidia-smi`; the driver must be at least {MIN_DRIVER[0]}")
    if parsed < MIN_DRIVER:
        return Finding("driver", FAIL, f"{detail}: older than R{MIN_DRIVER[0]}, which CUDA 11 and HAMi-core need",
                       f"upgrade the driver to R{RECOMMENDED_DRIVER[0]} or later (a production branch)")
    if parsed < RECOMMENDED_DRIVER:
        return Finding("driver", WARN, f"{detail}: CUDA 12 frameworks (current PyTorch, JAX wheels) need "
                                       f"{RECOMMENDED_DRIVER[0]}.{RECOMMENDED_DRIVER[1]} or later",
                       f"upgrade the driver to R{RECOMMENDED_DRIVER[0]} or later, or use CUDA 11 builds in notebooks")
    return Finding("driver", OK, detail)


def check_cards(setup: NodeSetup) -> Finding:
    if not setup.gpus.available():
        return Finding("cards", FAIL, "no cards visible", "fix the driver first")
    cards = setup.gpus.inventory()
    models = sorted({f"{c.model} ({c.memory_mib} MiB)" for c in cards})
    detail = f"{len(cards)} card(s): {', '.join(models)}"
    # a MIG card is out of sharing, not sick: check_mig reports it
    sick = [c.index for c in cards if not c.healthy and not getattr(c, "mig", False)]
    if sick:
        return Finding("cards", WARN, f"{detail}; unhealthy: {sick}",
                       "see the node daemon's log for the XID; reset or replace the card (nvidia-smi -r -i N)")
    return Finding("cards", OK, detail)


def check_mig(setup: NodeSetup) -> Finding:
    if not setup.gpus.available():
        return Finding("mig", WARN, "skipped: no cards visible", "fix the driver first")
    accessor = mig_accessor(setup)
    cards = setup.gpus.inventory()
    # the backend's own verdict (Card.mig, with pending MIG mode) where the inventory carries
    # one, and the accessor's current mode
    enabled = [c.index for c in cards if getattr(c, "mig", False) or accessor(c.index)]
    if not enabled:
        return Finding("mig", OK, "MIG mode off on every card")
    remedy = ("MIG cards are not shared by jupyter-vgpu; disable MIG where you want shares: "
              + "; ".join(f"nvidia-smi -i {i} -mig 0" for i in enabled) + " (then reset the card or reboot)")
    if len(enabled) == len(cards):
        return Finding("mig", FAIL, f"MIG mode on every card ({enabled}): nothing left to share", remedy)
    return Finding("mig", WARN, f"MIG mode on card(s) {enabled}: kept out of sharing", remedy)


def check_device_nodes(setup: NodeSetup) -> Finding:
    if not setup.gpus.available():
        return Finding("device-nodes", WARN, "skipped: no cards visible", "fix the driver first")
    needed = ["nvidiactl"] + [f"nvidia{c.minor if c.minor is not None else c.index}" for c in setup.gpus.inventory()]
    missing = [n for n in needed if not os.path.exists(os.path.join(setup.dev_root, n))]
    if missing:
        return Finding("device-nodes", FAIL, f"missing in {setup.dev_root}: {', '.join(missing)}",
                       "load the driver's kernel modules (nvidia-modprobe, or `nvidia-smi` once as root); in a pod, "
                       "run it with the NVIDIA runtime")
    if not os.path.exists(os.path.join(setup.dev_root, "nvidia-uvm")):
        return Finding("device-nodes", WARN, f"{setup.dev_root}/nvidia-uvm is missing: CUDA programs will fail",
                       "load nvidia-uvm: `nvidia-modprobe -u -c=0` on the host (the driver's persistence setup "
                       "does it at boot)")
    return Finding("device-nodes", OK, f"{', '.join(needed)}, nvidia-uvm in {setup.dev_root}")
