"""Facts on a workstation: the NVIDIA cards this process can see, through a GPU backend.

No Kubernetes, no shares: the visible cards are "yours" whole. The backend is NVML by
default (imported lazily; no driver means "none"), or any GPUBackend such as the
simulated one.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any

from jupyter_vgpu.core import contract
from jupyter_vgpu.sources.base import (
    FactSource,
    History,
    SourceSettings,
    allocation_answer,
    topology_answer,
    usage_answer,
)


def backend_factory(spec: str) -> Callable[[], Any] | None:
    """'nvml' (the default, None here) or 'simulated:<topology capture>' for the local source."""
    if spec in ("", "nvml"):
        return None
    kind, _, path = spec.partition(":")
    if kind != "simulated" or not path:
        raise ValueError(f"local backend {spec!r}: use 'nvml' or 'simulated:<path to nvidia-smi topo -m text>'")

    def simulated() -> Any:
        from jupyter_vgpu.gpu.simulated import SimulatedGPUs

        return SimulatedGPUs.from_fixture(path)

    return simulated


def make_backend(settings: SourceSettings) -> Any:
    if settings.backend_factory is not None:
        return settings.backend_factory()
    from jupyter_vgpu.gpu.nvml import NVMLBackend

    return NVMLBackend()


def visible_filter(environ: Mapping[str, str]) -> list[str] | None:
    """Card selectors from CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES; None means all."""
    for name in ("CUDA_VISIBLE_DEVICES", contract.ENV_NVIDIA_VISIBLE_DEVICES):
        value = environ.get(name)
        if value is not None and value.strip().lower() not in ("", "all"):
            return [v.strip() for v in value.split(",") if v.strip()]
    return None


class LocalGPUSource(FactSource):
    name = "local-nvml"

    @classmethod
    def detected(cls, settings: SourceSettings) -> bool:
        """The GPU backend (NVML unless configured) sees a card."""
        backend = make_backend(settings)
        try:
            return bool(backend.available())
        finally:
            backend.close()

    def __init__(self, settings: SourceSettings) -> None:
        self._backend = make_backend(settings)
        self._visible = visible_filter(settings.environ)
        self._history = History(settings.history_limit)
        self._lock = threading.Lock()  # backends are not promised to be thread-safe
        self._node = socket.gethostname()

    def _mine(self, cards: list[Any]) -> list[Any]:
        if self._visible is None:
            return list(cards)
        wanted = set(self._visible)
        return [c for c in cards if str(c.index) in wanted or c.uuid in wanted
                or any(w.startswith("GPU-") and c.uuid.startswith(w) for w in wanted)]

    def _unavailable(self) -> str | None:
        if self._backend.available():
            return None
        return f"no local NVIDIA GPU: {self._backend.problem() or 'no GPUs'}."

    def allocation(self) -> dict[str, Any]:
        with self._lock:
            problem = self._unavailable()
            if problem:
                return allocation_answer("none", self.name, None, problem)
            cards = self._mine(self._backend.inventory())
        if not cards:
            return allocation_answer("none", self.name, None,
                                     f"this process sees none of the node's cards (visible devices: {self._visible})")
        allocation = {
            "node": self._node,
            "namespace": None,
            "pod": None,
            "podUid": None,
            "container": None,
            "cores": contract.CORES_PER_CARD * len(cards),
            "memoryMib": sum(c.memory_mib for c in cards),
            "enforcement": "none",
            "cards": [
                {"index": c.index, "uuid": c.uuid, "model": c.model, "cores": contract.CORES_PER_CARD,
                 "memoryMib": c.memory_mib, "memoryTotalMib": c.memory_mib}
                for c in cards
            ],
        }
        return allocation_answer("allocated", self.name, allocation,
                                 "whole cards on this machine (no Kubernetes, no shares)")

    def topology(self) -> dict[str, Any]:
        with self._lock:
            problem = self._unavailable()
            if problem:
                return topology_answer("none", self.name, None, problem)
            cards = self._backend.inventory()
            topology = self._backend.topology()
            try:
                sample = self._backend.sample()
            except Exception:  # noqa: BLE001 - occupancy is decoration; the tree still shows
                sample = None
        mine = {c.index for c in self._mine(cards)}
        pids: dict[int, set[int]] = {}
        for process in sample.processes if sample else []:
            pids.setdefault(process.card_index, set()).add(process.pid)
        gpus = [
            {"index": c.index, "uuid": c.uuid, "model": c.model, "memoryMib": c.memory_mib, "numa": c.numa,
             "healthy": c.healthy, "mine": c.index in mine,
             "allocatedCores": contract.CORES_PER_CARD if c.index in mine else 0,
             "allocatedMemoryMib": c.memory_mib if c.index in mine else 0,
             "tenants": len(pids.get(c.index, ()))}
            for c in cards
        ]
        body: dict[str, Any] = {"node": self._node, "gpus": gpus, "links": None, "tree": None}
        if topology is not None:
            data = topology.to_dict()
            body["links"], body["tree"] = data["links"], data["tree"]
        return topology_answer("available", self.name, body)

    def usage(self, history_seconds: float = 0) -> dict[str, Any]:
        with self._lock:
            problem = self._unavailable()
            if problem:
                return usage_answer("none", self.name, message=problem)
            mine = self._mine(self._backend.inventory())
            try:
                sample = self._backend.sample()
            except Exception as error:  # noqa: BLE001 - GPUError, driver trouble: show it as stale
                return usage_answer("stale", self.name, message=f"reading the GPUs failed: {error}",
                                    history=self._history.since(history_seconds))
        indices = {c.index for c in mine}
        cards = [c for c in sample.cards if c.index in indices]
        limits = {"cores": contract.CORES_PER_CARD * len(mine), "memoryMib": sum(c.memory_mib for c in mine)}
        used = sum(c.memory_used_mib for c in cards)
        utilization = sum(c.utilization_percent for c in cards) / max(1, len(cards))
        point = {"t": sample.taken_at, "memoryUsedMib": used, "utilizationPercent": round(utilization, 1)}
        self._history.add(point)
        current = dict(point, cards=[
            {"index": c.index, "memoryUsedMib": c.memory_used_mib, "utilizationPercent": c.utilization_percent}
            for c in cards
        ])
        return usage_answer("live", self.name, limits=limits, current=current,
                            history=self._history.since(history_seconds))

    def close(self) -> None:
        with self._lock:
            self._backend.close()
