"""The fact-source interface and what every adapter shares.

A ``FactSource`` answers three questions synchronously — what was I given
(``allocation``), where does it sit (``topology``) and how much am I using (``usage``) —
with plain dicts in the shapes the REST API serves (docs/server-api.yaml). The server
extension calls them in a thread pool; the kernel calls them directly. A source never
raises for an unreachable peer: it answers with state ``"unreachable"`` and a message
saying what it tried.

The adapters live beside this module (``node_api``, ``gpu_manager``, ``local_nvml``);
``registry`` maps the names users configure to them and detects the one that fits.
"""

from __future__ import annotations

import abc
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_vgpu.core import contract

HOW_TO_GET_ONE = (
    "No vGPU is allocated to this server. On JupyterHub, choose a GPU profile when you start "
    "your server, or ask for a share from here with `%vgpu request --cores 25 --memory 4GiB` "
    "(or the sidebar's Request button). On a workstation with NVIDIA GPUs, install the NVIDIA "
    "driver and nvidia-ml-py. Cluster admins: deploy jupyter-vgpu's device plugin and scheduler "
    "(deploy/ in the jupyter-vgpu repository)."
)


@dataclass
class SourceSettings:
    """What the adapters need, filled from traitlets (server) or the kernel's config."""

    source: str = "auto"
    metrics_url: str = ""  # node API base; default from VGPU_METRICS_URL
    token: str = ""  # node API read token; default from VGPU_TOKEN
    gpu_manager_metric_url: str = ""  # gpu-manager's /metric; default http://$HOST_IP:5678/metric
    vcuda_config_dir: str = contract.GM_VCUDA_CONFIG_DIR
    timeout: float = 5.0
    history_limit: int = 3600  # samples kept by sources that keep their own history
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    backend_factory: Callable[[], Any] | None = None  # local-nvml: a GPUBackend; default NVML


class FactSource(abc.ABC):
    """One way of reading the notebook's GPU facts; subclass it to add another.

    ``registry.make_source`` builds the configured class with ``from_settings``;
    ``detected`` says whether this environment is one the source serves, for ``auto``.
    """

    name = ""

    def __init__(self, settings: SourceSettings) -> None:  # noqa: B027 - the constructor every adapter has
        """Adapters read what they need from the settings here; none raise for a missing peer."""

    @classmethod
    def from_settings(cls, settings: SourceSettings) -> FactSource:
        return cls(settings)

    @classmethod
    def detected(cls, settings: SourceSettings) -> bool:
        """True when this environment is one this source serves (``auto`` asks in order)."""
        return False

    @abc.abstractmethod
    def allocation(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def topology(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def usage(self, history_seconds: float = 0) -> dict[str, Any]: ...

    def close(self) -> None:  # noqa: B027 - optional: most sources hold nothing
        """Release what the source holds (a GPU library handle); most hold nothing."""


# --- answers -------------------------------------------------------------------------


def allocation_answer(state: str, source: str, allocation: dict[str, Any] | None,
                      message: str | None = None) -> dict[str, Any]:
    return {"state": state, "source": source, "message": message, "allocation": allocation}


def topology_answer(state: str, source: str, topology: dict[str, Any] | None,
                    message: str | None = None) -> dict[str, Any]:
    return {"state": state, "source": source, "message": message, "topology": topology}


def usage_answer(state: str, source: str, *, message: str | None = None, period: float = 1.0,
                 limits: dict[str, Any] | None = None, current: dict[str, Any] | None = None,
                 history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "state": state,
        "source": source,
        "message": message,
        "periodSeconds": period,
        "limits": limits,
        "current": current,
        "history": history or [],
    }


class History:
    """A bounded, thread-safe record of usage points for sources whose peer keeps none."""

    def __init__(self, limit: int) -> None:
        self._points: deque[dict[str, Any]] = deque(maxlen=max(1, limit))
        self._lock = threading.Lock()

    def add(self, point: dict[str, Any]) -> None:
        with self._lock:
            if not self._points or self._points[-1]["t"] != point["t"]:
                self._points.append(point)

    def since(self, seconds: float, now: float | None = None) -> list[dict[str, Any]]:
        if seconds <= 0:
            return []
        cutoff = (time.time() if now is None else now) - seconds
        with self._lock:
            return [dict(p) for p in self._points if p["t"] >= cutoff]


# --- the allocation the device plugin wrote into our environment ----------------------


def env_allocation(environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The allocation from the VGPU_* variables alone (no card totals), None without them."""
    try:
        cores = int(environ.get(contract.ENV_CORES, ""))
        memory = int(environ.get(contract.ENV_MEMORY_MIB, "0") or 0)
    except ValueError:
        return None
    uuids = [u for u in environ.get(contract.ENV_DEVICE_UUIDS, "").split(",") if u]
    indices = [int(i) for i in environ.get(contract.ENV_DEVICE_INDICES, "").split(",") if i.strip().isdecimal()]
    count = max(len(uuids), len(indices), 1)
    per_card_cores = cores if cores < contract.CORES_PER_CARD else contract.CORES_PER_CARD
    profile = environ.get(contract.ENV_MIG_PROFILE, "")
    mig = {"migProfile": profile[:40]} if profile and count == 1 else {}
    cards = [
        {
            "index": indices[i] if i < len(indices) else None,
            "uuid": uuids[i] if i < len(uuids) else None,
            "model": environ.get(contract.ENV_DEVICE_MODEL) or None,
            "cores": per_card_cores,
            "memoryMib": memory // count,
            "memoryTotalMib": None,
            **mig,
        }
        for i in range(count)
    ]
    return {
        "node": environ.get(contract.ENV_NODE) or None,
        "namespace": environ.get(contract.ENV_POD_NAMESPACE) or None,
        "pod": environ.get(contract.ENV_POD_NAME) or None,
        "podUid": environ.get(contract.ENV_POD_UID) or None,
        "container": environ.get(contract.ENV_CONTAINER) or None,
        "cores": cores,
        "memoryMib": memory,
        "enforcement": environ.get(contract.ENV_ENFORCEMENT) or None,
        "cards": cards,
    }


def limits_of(allocation: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not allocation:
        return None
    return {"cores": allocation.get("cores"), "memoryMib": allocation.get("memoryMib")}


# --- no vGPU -----------------------------------------------------------------------------


class NoVGPUSource(FactSource):
    """Nothing allocated and nothing to show: say how to get a share."""

    name = "none"

    def __init__(self, reason: str | None = None) -> None:
        self.message = HOW_TO_GET_ONE if reason is None else f"{reason} {HOW_TO_GET_ONE}"

    @classmethod
    def from_settings(cls, settings: SourceSettings) -> FactSource:
        return cls()

    def allocation(self) -> dict[str, Any]:
        return allocation_answer("none", self.name, None, self.message)

    def topology(self) -> dict[str, Any]:
        return topology_answer("none", self.name, None, self.message)

    def usage(self, history_seconds: float = 0) -> dict[str, Any]:
        return usage_answer("none", self.name, message=self.message)
