"""Framework guard rails: keep PyTorch, JAX, CuPy and TensorFlow inside the share's memory.

Enforcement belongs to the cluster (HAMi-core, MPS); these rails make the frameworks
*cooperate* even with enforcement ``none``, the way each allows it:

- JAX reads ``XLA_PYTHON_CLIENT_MEM_FRACTION`` when its GPU backend starts;
- CuPy reads ``CUPY_GPU_MEMORY_LIMIT`` at import, and its pool limit can be set later;
- TensorFlow: ``TF_FORCE_GPU_ALLOW_GROWTH`` at start, then a logical-device memory limit
  set by an import hook (before TensorFlow initialises the GPUs);
- PyTorch: ``torch.cuda.set_per_process_memory_fraction`` for every visible device, by an
  import hook when ``torch`` is imported (or at once if it already is).

A variable already set (by the device plugin at container start, or by the user) is left
alone; it is reported as in force when it is within the share, else as the user's.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from jupyter_vgpu.core import contract

FRAMEWORKS = ("torch", "jax", "cupy", "tensorflow")


@dataclass
class Guard:
    framework: str
    state: str  # "in force" | "armed" (applies on import) | "yours" (user's value is looser) | "not applied" | "not needed"
    detail: str

    def line(self) -> str:
        return f"{self.framework:<10} {self.state:<12} {self.detail}"


@dataclass(frozen=True)
class MemoryShare:
    memory_mib: int  # per card
    fraction: float | None  # of each card, None when the card's size is unknown

    @classmethod
    def from_allocation(cls, allocation: Mapping[str, Any] | None) -> MemoryShare | None:
        """The per-card memory limit of a share; None when there is nothing to limit."""
        if not allocation or not allocation.get("cards"):
            return None
        cards = allocation["cards"]
        limits = [c.get("memoryMib") or 0 for c in cards]
        totals = [c.get("memoryTotalMib") for c in cards]
        memory = min(limits)
        if memory <= 0:
            return None
        if all(totals) and all(limit >= total for limit, total in zip(limits, totals, strict=True)):
            return None  # whole cards: nothing to hold back
        fraction = None
        if all(totals):
            fraction = min(contract.memory_fraction(lim, tot) for lim, tot in zip(limits, totals, strict=True))
        return cls(memory, fraction)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Runs a callback right after a watched top-level module finishes importing."""

    def __init__(self) -> None:
        self.callbacks: dict[str, Callable[[ModuleType], None]] = {}
        self._local = threading.local()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        callback = self.callbacks.get(fullname)
        if callback is None or getattr(self._local, "busy", False):
            return None
        self._local.busy = True
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None:
                for finder in sys.meta_path:
                    if finder is self or not hasattr(finder, "find_spec"):
                        continue
                    spec = finder.find_spec(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            self._local.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _CallbackLoader(spec.loader, callback)
        return spec


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, callback: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._callback(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)


_finder = _PostImportFinder()


class GuardRails:
    """Apply and report the rails for one share. ``environ`` is the kernel's os.environ."""

    def __init__(self, allocation: Mapping[str, Any] | None, environ: MutableMapping[str, str] | None = None,
                 modules: Mapping[str, ModuleType] | None = None) -> None:
        self.allocation = allocation
        self.share = MemoryShare.from_allocation(allocation)
        self.environ = os.environ if environ is None else environ
        self.modules = sys.modules if modules is None else modules
        self.guards: dict[str, Guard] = {}
        self._ours: dict[str, str] = {}

    # --- applying ---------------------------------------------------------------------

    def apply(self) -> list[Guard]:
        if self.share is None:
            why = _why_not_needed(self.allocation)
            for name in FRAMEWORKS:
                self.guards[name] = Guard(name, "not needed", why)
            return self.status()
        self._jax()
        self._cupy()
        self._tensorflow()
        self._torch()
        return self.status()

    def _set_env(self, name: str, value: str) -> bool:
        """Set a variable unless the user already did; True when ours is in force."""
        current = self.environ.get(name)
        if current is not None and self._ours.get(name) != current:
            return False
        self.environ[name] = value
        self._ours[name] = value
        return True

    def _jax(self) -> None:
        share = self.share
        assert share is not None
        if share.fraction is None:
            self.guards["jax"] = Guard("jax", "not applied", "the card's total memory is unknown, so no fraction")
            return
        name, value = contract.ENV_XLA_MEM_FRACTION, contract.format_fraction(share.fraction)
        if not self._set_env(name, value):
            self.guards["jax"] = self._preset("jax", name, share.fraction)
        elif "jax" in self.modules and _jax_backend_started(self.modules["jax"]):
            self.guards["jax"] = Guard("jax", "not applied", "JAX's GPU backend started before the rails; restart the kernel")
        else:
            self.guards["jax"] = Guard("jax", "in force", f"{name}={value}")

    def _preset(self, framework: str, name: str, share: float) -> Guard:
        """A variable set before the kernel started (by the device plugin, or by the user)."""
        value = self.environ[name]
        try:
            number = float(value)
        except ValueError:
            return Guard(framework, "yours", f"{name}={value!r} is not a number; the framework may ignore it")
        if number > share * 1.001 + 0.001:
            return Guard(framework, "yours", f"{name}={value} is above your share ({share:g}); set it lower or unset it")
        return Guard(framework, "in force", f"{name}={value} (set when the container started)")

    def _cupy(self) -> None:
        share = self.share
        assert share is not None
        limit = share.memory_mib * 1024 * 1024
        if not self._set_env(contract.ENV_CUPY_MEMORY_LIMIT, str(limit)):
            self.guards["cupy"] = self._preset("cupy", contract.ENV_CUPY_MEMORY_LIMIT, limit)
            return
        detail = f"{contract.ENV_CUPY_MEMORY_LIMIT}={limit} ({contract.format_mib(share.memory_mib)})"
        if "cupy" in self.modules:
            try:
                self.modules["cupy"].get_default_memory_pool().set_limit(size=limit)
            except Exception as error:  # noqa: BLE001 - report, never break the kernel
                self.guards["cupy"] = Guard("cupy", "not applied", f"setting the pool limit failed: {error}")
                return
        self.guards["cupy"] = Guard("cupy", "in force", detail)

    def _tensorflow(self) -> None:
        share = self.share
        assert share is not None
        self._set_env(contract.ENV_TF_FORCE_GROWTH, "true")

        def limit(tf: ModuleType) -> None:
            try:
                gpus = tf.config.list_physical_devices("GPU")
                for gpu in gpus:
                    tf.config.set_logical_device_configuration(
                        gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=share.memory_mib)])
                self.guards["tensorflow"] = Guard("tensorflow", "in force",
                                                  f"memory_limit={share.memory_mib} MiB on {len(gpus)} GPU(s)")
            except Exception as error:  # noqa: BLE001 - RuntimeError once GPUs are initialised
                self.guards["tensorflow"] = Guard("tensorflow", "not applied", f"TensorFlow refused: {error}")

        self._on_import("tensorflow", limit, f"memory_limit={share.memory_mib} MiB when imported")

    def _torch(self) -> None:
        share = self.share
        assert share is not None
        if share.fraction is None:
            self.guards["torch"] = Guard("torch", "not applied", "the card's total memory is unknown, so no fraction")
            return
        fraction = share.fraction

        def limit(torch: ModuleType) -> None:
            try:
                if not torch.cuda.is_available():
                    self.guards["torch"] = Guard("torch", "not applied", "torch sees no CUDA device")
                    return
                count = torch.cuda.device_count()
                for device in range(count):
                    torch.cuda.set_per_process_memory_fraction(fraction, device)
                self.guards["torch"] = Guard("torch", "in force",
                                             f"set_per_process_memory_fraction({fraction}) on {count} device(s)")
            except Exception as error:  # noqa: BLE001
                self.guards["torch"] = Guard("torch", "not applied", f"torch refused: {error}")

        self._on_import("torch", limit, f"set_per_process_memory_fraction({fraction}) when imported")

    def _on_import(self, name: str, callback: Callable[[ModuleType], None], armed: str) -> None:
        if name in self.modules:
            callback(self.modules[name])
            return
        self.guards[name] = Guard(name, "armed", armed)
        _finder.callbacks[name] = callback
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)

    # --- reporting --------------------------------------------------------------------

    def status(self) -> list[Guard]:
        return [self.guards[name] for name in FRAMEWORKS if name in self.guards]

    def status_text(self) -> str:
        return "\n".join(g.line() for g in self.status())

    def remove(self) -> None:
        """Disarm the import hooks (for %unload_ext)."""
        for name in ("torch", "tensorflow"):
            _finder.callbacks.pop(name, None)
        if not _finder.callbacks and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)


def _why_not_needed(allocation: Mapping[str, Any] | None) -> str:
    """Why a notebook without a memory share to hold to needs no rails, in its own case's words."""
    cards = (allocation or {}).get("cards") or []
    slices = [card for card in cards if card.get("migProfile")]
    if slices:
        profile, memory = slices[0]["migProfile"], slices[0].get("memoryMib") or 0
        size = f" ({contract.format_mib(memory)})" if memory else ""
        return (f"your MIG slice {profile} is isolated in hardware: its memory{size} is all yours and no framework "
                "can use more")
    if cards and all(card.get("memoryTotalMib") and (card.get("memoryMib") or 0) >= card["memoryTotalMib"]
                     for card in cards):
        return "whole cards: all of each card's memory is yours"
    return "the share sets no memory limit" if cards else "no vGPU in this session"


def _jax_backend_started(jax: ModuleType) -> bool:
    try:
        from jax._src import xla_bridge  # type: ignore[import-not-found]

        return bool(getattr(xla_bridge, "_backends", {}))
    except Exception:  # noqa: BLE001 - an unknown JAX: assume the env still counts
        return False
