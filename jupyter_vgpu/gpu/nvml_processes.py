"""Running GPU processes from NVML, on whatever driver the node has.

nvidia-ml-py's unversioned ``nvmlDeviceGet*RunningProcesses`` call only the ``_v3`` C symbol
(since 12.535). A driver older than R510 has no ``_v3``: the unversioned call then raises
``NVMLLibraryMismatchError`` (which has no ``.value``), ``_v3`` itself raises
``NVMLError_FunctionNotFound``. Drivers before R450 have no ``_v2`` either, and nvidia-ml-py
no longer wraps the original (v1) symbol. Some R525-R535 drivers write a larger ``_v3`` record
than nvidia-ml-py reads, so every record after the first comes out as garbage.

``ProcessLister`` asks ``_v3``, then ``_v2``, then the v1 symbol directly (through ctypes, with
the v1 record), and remembers the first version that answers with plausible data.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

FAMILIES = ("Compute", "Graphics", "MPSCompute")
VERSIONS = ("_v3", "_v2", "_v1")
PID_MAX = 4194304  # Linux's PID_MAX_LIMIT on 64-bit: no real PID is larger
_FUNCTION_NOT_FOUND = 13
_NOT_SUPPORTED = 3
_SUCCESS = 0
_INSUFFICIENT_SIZE = 7
_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF  # usedGpuMemory when the driver cannot say (NVML_VALUE_NOT_AVAILABLE)


class _ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_v1_t, written by the unsuffixed C symbol."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


@dataclass(frozen=True)
class RunningProcess:
    pid: int
    used_bytes: int | None  # None when the driver cannot say (WDDM, or an unprivileged MIG query)


class ImplausibleData(ValueError):
    """A driver answered with records no real process has (a struct layout mismatch)."""


def _absent(error: Exception, nv: Any) -> bool:
    """True when the error says this version of the function is not in the driver or the bindings."""
    if isinstance(error, AttributeError):
        return True
    mismatch = getattr(nv, "NVMLLibraryMismatchError", None)
    if isinstance(mismatch, type) and isinstance(error, mismatch):
        return True
    return getattr(error, "value", None) == getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", _FUNCTION_NOT_FOUND)


class ProcessLister:
    """One family of running processes (``Compute``, ``Graphics`` or ``MPSCompute``) of any card."""

    def __init__(self, nv: Any, family: str) -> None:
        if family not in FAMILIES:
            raise ValueError(f"unknown process family {family!r}; one of {', '.join(FAMILIES)}")
        self._nv = nv
        self.family = family
        self._candidates = list(VERSIONS)
        self.version: str | None = None  # the version that answered, once one has

    def running(self, handle: Any, total_bytes: int) -> list[RunningProcess]:
        """The processes on one card; [] when no version of the query exists on this node.

        NVML errors other than a missing function (NOT_SUPPORTED, GPU_IS_LOST, ...) are raised
        as they come, for the caller to judge.
        """
        while self._candidates:
            version = self._candidates[0]
            try:
                found = self._query(version, handle)
                _check_plausible(found, total_bytes)  # a bad layout shows only with two or more records
            except ImplausibleData as error:
                log.warning("nvmlDeviceGet%sRunningProcesses%s returned implausible data (%s); "
                            "using an older version of the call", self.family, version, error)
            except Exception as error:
                if not _absent(error, self._nv):
                    raise
                log.info("nvmlDeviceGet%sRunningProcesses%s is not available here (%s)",
                         self.family, version, type(error).__name__)
            else:
                if version != self.version:
                    log.info("listing %s processes with nvmlDeviceGet%sRunningProcesses%s",
                             self.family, self.family, version)
                    self.version = version
                return found
            self._candidates.pop(0)
            self.version = None
        return []

    @property
    def exhausted(self) -> bool:
        """True when no version of the query works on this node."""
        return not self._candidates

    def _query(self, version: str, handle: Any) -> list[RunningProcess]:
        if version == "_v1":
            return self._query_v1(handle)
        function = getattr(self._nv, f"nvmlDeviceGet{self.family}RunningProcesses{version}")
        return [RunningProcess(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
                for p in function(handle)]

    def _query_v1(self, handle: Any) -> list[RunningProcess]:
        """The original symbol with its two-field record; nvidia-ml-py no longer wraps it."""
        nv = self._nv
        function = nv._nvmlGetFunctionPointer(f"nvmlDeviceGet{self.family}RunningProcesses")
        count = ctypes.c_uint(0)
        result = function(handle, ctypes.byref(count), None)
        if result == _SUCCESS:
            return []
        if result != getattr(nv, "NVML_ERROR_INSUFFICIENT_SIZE", _INSUFFICIENT_SIZE):
            raise nv.NVMLError(result)
        count.value = count.value * 2 + 5  # room for processes started meanwhile
        records = (_ProcessInfoV1 * count.value)()
        result = function(handle, ctypes.byref(count), records)
        if result != _SUCCESS:
            raise nv.NVMLError(result)
        return [RunningProcess(int(r.pid), None if r.usedGpuMemory == _NOT_AVAILABLE else int(r.usedGpuMemory))
                for r in records[:count.value]]


def _check_plausible(processes: list[RunningProcess], total_bytes: int) -> None:
    for process in processes:
        if not 0 < process.pid <= PID_MAX:
            raise ImplausibleData(f"pid {process.pid}")
        if process.used_bytes is not None and total_bytes and process.used_bytes > total_bytes:
            raise ImplausibleData(f"pid {process.pid} uses {process.used_bytes} bytes of a {total_bytes}-byte card")
