"""The acceptance kit's CUDA worker: a real CUDA process that the kit starts, watches and stops.

``python -m vgpu_plugin.doctor.acceptance_cuda MODE [options]``. The kit starts it with
``CUDA_VISIBLE_DEVICES`` naming the card under test by UUID (so that card is device 0 here)
and ``CUDA_DEVICE_ORDER=PCI_BUS_ID``. It writes one JSON object per line on stdout, each with
an ``event``: ``ready`` (hold), ``result`` (guard, alloc), ``done``, ``unavailable`` (no way
to run CUDA here: the check is then n/a) or ``error``. Modes:

``hold``   create a context, allocate ``--mib`` MiB, say ``ready`` (with its PID), then keep
           the card busy for ``--seconds`` and say ``done``;
``guard``  the framework guard rails: read the share from the ``VGPU_*`` variables as a
           notebook does (``jupyter_vgpu.sources.base.env_allocation``, with the card's total
           from ``--total-mib``), apply ``jupyter_vgpu.guards.GuardRails`` before PyTorch is
           imported, then allocate half the share (must work) and more than the share (must be
           refused by PyTorch); PyTorch only;
``alloc``  allocate ``--below`` MiB (must work), free it, then ``--above`` MiB (expected to be
           refused, e.g. by an MPS server's pinned-memory limit).

CUDA comes from PyTorch when importable, else CuPy, else the driver API itself (``libcuda.so.1``
through ctypes: cuInit, cuDeviceGet, cuCtxCreate_v2, cuMemAlloc_v2). The fallback launches no
kernels (it has no compiled code), only memsets, so NVML may count no utilisation for it;
``ready`` says so with ``"kernels": false``.

Only the standard library is imported at the top: the worker may run under another Python
(``--cuda-worker``) that has PyTorch but not this project's dependencies.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

MIB = 1024 * 1024
FRAMEWORKS = ("torch", "cupy", "cuda")
_CUDA_SUCCESS = 0
_CUDA_ERROR_OUT_OF_MEMORY = 2
_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16


class Unusable(Exception):
    """This framework cannot run CUDA here (not installed, a CPU-only build, no driver)."""


class CudaFailure(Exception):
    """A CUDA call failed; ``code`` is the driver API's CUresult, where there is one."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}, default=str), flush=True)


class Torch:
    name = "torch"
    kernels = True

    def __init__(self) -> None:
        if importlib.util.find_spec("torch") is None:
            raise Unusable("PyTorch is not installed")
        import torch

        if not torch.cuda.is_available():
            raise Unusable(f"PyTorch {torch.__version__} sees no CUDA device (a CPU-only build, or no driver)")
        self.torch = torch
        self.version = str(torch.__version__)
        self.device = torch.device("cuda", 0)
        self._a: Any = None

    def alloc(self, mib: int) -> Any:
        block = self.torch.empty(mib * MIB, dtype=self.torch.uint8, device=self.device)
        block.fill_(1)  # touch it
        self.torch.cuda.synchronize(self.device)
        return block

    def free(self, block: Any) -> None:
        del block
        self.torch.cuda.empty_cache()

    def warm(self) -> None:
        self._a = self.torch.rand(2048, 2048, device=self.device)
        self.step()

    def step(self) -> None:
        for _ in range(8):
            self._a = self.torch.matmul(self._a, self._a).clamp_(0.0, 1.0)
        self.torch.cuda.synchronize(self.device)

    def refused(self, error: BaseException) -> bool:
        oom = getattr(self.torch.cuda, "OutOfMemoryError", None)
        return (isinstance(oom, type) and isinstance(error, oom)) or "out of memory" in str(error).lower()

    def free_mib(self) -> int:
        free, _total = self.torch.cuda.mem_get_info(self.device)
        return int(free) // MIB

    def sm_count(self) -> int:
        return int(self.torch.cuda.get_device_properties(self.device).multi_processor_count)


class CuPy:
    name = "cupy"
    kernels = True

    def __init__(self) -> None:
        if importlib.util.find_spec("cupy") is None:
            raise Unusable("CuPy is not installed")
        try:
            import cupy

            cupy.cuda.runtime.getDeviceCount()
        except Exception as error:  # CUDARuntimeError and friends: no usable device
            raise Unusable(f"CuPy cannot use CUDA: {error}") from None
        self.cupy = cupy
        self.version = str(cupy.__version__)
        self._a: Any = None

    def alloc(self, mib: int) -> Any:
        block = self.cupy.ones((mib * MIB,), dtype=self.cupy.uint8)
        self.cupy.cuda.Device(0).synchronize()
        return block

    def free(self, block: Any) -> None:
        del block
        self.cupy.get_default_memory_pool().free_all_blocks()

    def warm(self) -> None:
        self._a = self.cupy.random.random((2048, 2048), dtype=self.cupy.float32)
        self.step()

    def step(self) -> None:
        for _ in range(8):
            self._a = self.cupy.clip(self._a @ self._a, 0.0, 1.0)
        self.cupy.cuda.Device(0).synchronize()

    def refused(self, error: BaseException) -> bool:
        oom = getattr(self.cupy.cuda.memory, "OutOfMemoryError", None)
        return (isinstance(oom, type) and isinstance(error, oom)) or "out of memory" in str(error).lower()

    def free_mib(self) -> int:
        free, _total = self.cupy.cuda.runtime.memGetInfo()
        return int(free) // MIB

    def sm_count(self) -> int:
        return int(self.cupy.cuda.Device(0).attributes["MultiProcessorCount"])


class DriverAPI:
    """The CUDA driver API through ctypes: a context, memory, memsets; no kernels."""

    name = "cuda"
    kernels = False

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as error:
            raise Unusable(f"no CUDA driver library (libcuda.so.1): {error}") from None
        self.lib = lib
        self.version = self._driver_version()
        c = ctypes
        signatures: dict[str, list[Any]] = {
            "cuInit": [c.c_uint],
            "cuDeviceGet": [c.POINTER(c.c_int), c.c_int],
            "cuCtxSynchronize": [],
            "cuMemAlloc_v2": [c.POINTER(c.c_uint64), c.c_size_t],
            "cuMemFree_v2": [c.c_uint64],
            "cuMemsetD32_v2": [c.c_uint64, c.c_uint, c.c_size_t],
            "cuMemGetInfo_v2": [c.POINTER(c.c_size_t), c.POINTER(c.c_size_t)],
        }
        for name, argtypes in signatures.items():
            function = getattr(lib, name)
            function.argtypes = argtypes
            function.restype = c.c_int
        # the driver is there: from here on a failure is the machine's (an error, the check fails)
        self._check("cuInit", lib.cuInit(0))
        device = c.c_int(0)
        self._check("cuDeviceGet", lib.cuDeviceGet(c.byref(device), 0))
        self.device = device.value
        self.context = c.c_void_p()
        create = getattr(lib, "cuCtxCreate_v2", None)
        if create is not None:
            create.argtypes, create.restype = [c.POINTER(c.c_void_p), c.c_uint, c.c_int], c.c_int
            self._check("cuCtxCreate_v2", create(c.byref(self.context), 0, device))
        else:  # a driver without the old entry point: the device's primary context, as the runtime uses
            lib.cuDevicePrimaryCtxRetain.argtypes = [c.POINTER(c.c_void_p), c.c_int]
            lib.cuCtxSetCurrent.argtypes = [c.c_void_p]
            self._check("cuDevicePrimaryCtxRetain", lib.cuDevicePrimaryCtxRetain(c.byref(self.context), device))
            self._check("cuCtxSetCurrent", lib.cuCtxSetCurrent(self.context))
        self._busy: int | None = None

    def _driver_version(self) -> str | None:
        version = ctypes.c_int(0)
        try:
            if self.lib.cuDriverGetVersion(ctypes.byref(version)) == _CUDA_SUCCESS:
                return f"{version.value // 1000}.{version.value % 1000 // 10}"
        except AttributeError:
            pass
        return None

    def _error(self, result: int) -> str:
        name = ctypes.c_char_p()
        try:
            self.lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
            if self.lib.cuGetErrorName(result, ctypes.byref(name)) == _CUDA_SUCCESS and name.value:
                return f"{name.value.decode()} ({result})"
        except AttributeError:
            pass
        return f"CUresult {result}"

    def _check(self, call: str, result: int) -> None:
        if result != _CUDA_SUCCESS:
            raise CudaFailure(f"{call} failed: {self._error(result)}", result)

    def alloc(self, mib: int) -> int:
        pointer = ctypes.c_uint64(0)
        self._check("cuMemAlloc_v2", self.lib.cuMemAlloc_v2(ctypes.byref(pointer), mib * MIB))
        self._check("cuMemsetD32_v2", self.lib.cuMemsetD32_v2(pointer.value, 0x01010101, mib * MIB // 4))
        self._check("cuCtxSynchronize", self.lib.cuCtxSynchronize())
        return int(pointer.value)

    def free(self, block: int) -> None:
        self._check("cuMemFree_v2", self.lib.cuMemFree_v2(block))

    def warm(self) -> None:
        self._busy = self.alloc(64)

    def step(self) -> None:
        assert self._busy is not None
        for value in range(16):
            self._check("cuMemsetD32_v2", self.lib.cuMemsetD32_v2(self._busy, value, 64 * MIB // 4))
        self._check("cuCtxSynchronize", self.lib.cuCtxSynchronize())

    def refused(self, error: BaseException) -> bool:
        return getattr(error, "code", None) == _CUDA_ERROR_OUT_OF_MEMORY

    def free_mib(self) -> int:
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        self._check("cuMemGetInfo_v2", self.lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)))
        return int(free.value) // MIB

    def sm_count(self) -> int:
        count = ctypes.c_int(0)
        self.lib.cuDeviceGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
        self._check("cuDeviceGetAttribute", self.lib.cuDeviceGetAttribute(
            ctypes.byref(count), _CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.device))
        return int(count.value)


_MAKERS: dict[str, Any] = {"torch": Torch, "cupy": CuPy, "cuda": DriverAPI}


def open_framework(choice: str) -> Any:
    """The first usable framework of ``choice`` ("auto": PyTorch, CuPy, then the driver API)."""
    tried: list[str] = []
    for name in (FRAMEWORKS if choice == "auto" else (choice,)):
        try:
            framework = _MAKERS[name]()
        except Unusable as error:
            tried.append(f"{name}: {error}")
            continue
        framework.skipped = tried  # why the ones before it were not used, for the report
        return framework
    raise Unusable("; ".join(tried))


def _sm_count(framework: Any) -> int | None:
    """The SMs this process may use (under MPS, an active thread percentage may lower it); None if unknown."""
    try:
        return int(framework.sm_count())
    except Exception:  # informational only
        return None


def _attempt(framework: Any, mib: int) -> dict[str, Any]:
    """Allocate ``mib`` MiB and free it: {"ok": True} or {"ok": False, "refused": ..., "error": ...}."""
    try:
        block = framework.alloc(mib)
    except Exception as error:  # the framework's out-of-memory error, or another CUDA error
        return {"ok": False, "refused": bool(framework.refused(error)), "error": f"{type(error).__name__}: {error}"[:600]}
    framework.free(block)
    return {"ok": True}


def hold(args: argparse.Namespace) -> int:
    framework = open_framework(args.framework)
    block = framework.alloc(args.mib)
    framework.warm()
    emit("ready", pid=os.getpid(), framework=framework.name, version=framework.version, kernels=framework.kernels,
         allocatedMib=args.mib, device=os.environ.get("CUDA_VISIBLE_DEVICES"), smCount=_sm_count(framework),
         skipped=framework.skipped)
    started = time.monotonic()
    while time.monotonic() - started < args.seconds:
        framework.step()
    framework.free(block)
    emit("done", pid=os.getpid())
    return 0


def guard(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("torch") is None:
        raise Unusable(f"PyTorch is not installed for {sys.executable}")
    from jupyter_vgpu.guards import GuardRails
    from jupyter_vgpu.sources.base import env_allocation

    allocation = env_allocation(os.environ)
    if allocation is None:
        raise CudaFailure("no share in the environment (VGPU_CORES, VGPU_MEMORY_MIB)")
    for card in allocation["cards"]:
        card["memoryTotalMib"] = args.total_mib  # what the node API adds to the device plugin's variables
    rails = GuardRails(allocation)
    armed = {g.framework: g.state for g in rails.apply()}
    framework = Torch()  # imports torch: the rails' import hook sets the fraction now
    rail = rails.guards.get("torch")
    share_mib = int(allocation["memoryMib"])
    below, above = share_mib // 2, share_mib + max(256, share_mib // 4)
    result: dict[str, Any] = {
        "framework": "torch", "version": framework.version, "armed": armed.get("torch"),
        "guard": {"state": rail.state, "detail": rail.detail} if rail else None,
        "fraction": rails.share.fraction if rails.share else None, "shareMib": share_mib,
        "belowMib": below, "aboveMib": above, "freeMib": framework.free_mib(),
        "allocConf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    }
    if result["freeMib"] < above + 256:
        raise Unusable(f"the card has {result['freeMib']} MiB free: too little to tell the share's limit "
                       f"({above} MiB asked) from a full card")
    result["below"] = _attempt(framework, below)
    result["above"] = _attempt(framework, above)
    emit("result", **result)
    return 0


def alloc(args: argparse.Namespace) -> int:
    framework = open_framework(args.framework)
    free = framework.free_mib()
    result: dict[str, Any] = {"framework": framework.name, "version": framework.version,
                              "belowMib": args.below, "aboveMib": args.above, "freeMib": free,
                              "smCount": _sm_count(framework), "skipped": framework.skipped}
    result["below"] = _attempt(framework, args.below)
    result["above"] = _attempt(framework, args.above)
    emit("result", **result)
    return 0


def _exit_when_the_kit_goes(stream: Any) -> None:
    """The kit holds our stdin open; when it closes (the kit ended, however), stop at once."""

    def watch() -> None:
        try:
            while stream.read(4096):
                pass
        except (OSError, ValueError):
            pass
        os._exit(0)

    threading.Thread(target=watch, name="stdin-watch", daemon=True).start()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m vgpu_plugin.doctor.acceptance_cuda",
                                     description="The CUDA process of `jupyter-vgpu doctor --acceptance`.")
    parser.add_argument("mode", choices=["hold", "guard", "alloc"])
    parser.add_argument("--framework", choices=["auto", *FRAMEWORKS], default="auto")
    parser.add_argument("--mib", type=int, default=256, help="hold: MiB to allocate")
    parser.add_argument("--seconds", type=float, default=8.0, help="hold: how long to keep the card busy")
    parser.add_argument("--total-mib", type=int, default=0, help="guard: the card's memory (MiB)")
    parser.add_argument("--below", type=int, default=256, help="alloc: MiB that must be allowed")
    parser.add_argument("--above", type=int, default=0, help="alloc: MiB expected to be refused")
    parser.add_argument("--exit-on-eof", action="store_true", help="exit when stdin closes (the kit's pipe)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.exit_on_eof:
        _exit_when_the_kit_goes(sys.stdin)
    try:
        return {"hold": hold, "guard": guard, "alloc": alloc}[args.mode](args)
    except Unusable as error:
        emit("unavailable", reason=str(error))
        return 3
    except Exception as error:  # a CUDA error: say it on the protocol, the kit judges
        emit("error", error=f"{type(error).__name__}: {error}"[:1000])
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
