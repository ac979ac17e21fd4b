"""MIG devices of a card in MIG mode, read through nvidia-ml-py (the ``pynvml`` module given).

What the admin created (GPU instances, and compute instances inside them) is read, never
changed. For each populated MIG device index of a card:

- ``nvmlDeviceGetMaxMigDeviceCount(card)`` bounds the indices;
  ``nvmlDeviceGetMigDeviceHandleByIndex(card, i)`` raises ``NVML_ERROR_NOT_FOUND`` (or
  ``INVALID_ARGUMENT``) for an index no instance occupies, which is normal;
- ``nvmlDeviceGetUUID`` gives the ``MIG-<uuid>`` that ``NVIDIA_VISIBLE_DEVICES`` takes,
  ``nvmlDeviceGetGpuInstanceId`` / ``nvmlDeviceGetComputeInstanceId`` the instance ids,
  ``nvmlDeviceGetAttributes`` the GPU instance's and compute instance's slice counts and
  the GPU instance's memory;
- the profile's name comes from the card's GPU instance profile table
  (``nvmlDeviceGetGpuInstanceProfileInfo(card, NVML_GPU_INSTANCE_PROFILE_*)``, whose v2
  record carries "MIG 2g.10gb"), matched on slice count and memory; without it, from
  NVIDIA's published tables (``core.mig``).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from typing import Any

from jupyter_vgpu.core.mig import MigSlice, check_profile_name, geometry_for

log = logging.getLogger(__name__)

_ABSENT = ("NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT")
_ABSENT_DEFAULTS = {"NVML_ERROR_NOT_FOUND": 6, "NVML_ERROR_INVALID_ARGUMENT": 2}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _code(nv: Any, name: str) -> int:
    return int(getattr(nv, name, _ABSENT_DEFAULTS.get(name, -1)))


def _nvml_error(error: Exception) -> bool:
    return getattr(error, "value", None) is not None


def profile_table(nv: Any, handle: Any) -> list[tuple[int, int, str]]:
    """(slice count, memory MiB, name) of each GPU instance profile the card supports."""
    found = []
    count = int(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))
    for profile in range(count):
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
        except Exception as error:
            if not _nvml_error(error) and not isinstance(error, AttributeError):
                raise
            continue  # NOT_SUPPORTED / INVALID_ARGUMENT: this card has no such profile
        name = _text(getattr(info, "name", b"")).removeprefix("MIG ").strip()
        found.append((int(info.sliceCount), int(info.memorySizeMB), name))
    return found


def _profile_name(table: list[tuple[int, int, str]], gi_slices: int, memory_mib: int, model: str,
                  card_memory_mib: int) -> str:
    named = [(abs(mem - memory_mib), "+" in name, name) for slices, mem, name in table
             if slices == gi_slices and name]
    if named:
        return min(named)[2]
    geometry = geometry_for(model, card_memory_mib)
    if geometry is not None:
        candidates = [(abs(geometry.memory_of(p) - memory_mib), "+" in p.name, p.name)
                      for p in geometry.profiles if p.slices == gi_slices]
        if candidates:
            return min(candidates)[2]
    return f"{gi_slices}g.{max(1, round(memory_mib / 1024))}gb"


def read_slices(nv: Any, handle: Any, model: str, card_memory_mib: int) -> tuple[tuple[MigSlice, ...], list[str]]:
    """The card's MIG devices, and a problem per device that could not be read (skipped)."""
    problems: list[str] = []
    count = int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))
    table = profile_table(nv, handle)
    geometry = geometry_for(model, card_memory_mib)
    card_slices = max((s for s, _, _ in table), default=geometry.slices if geometry is not None else 7)
    absent = {_code(nv, name) for name in _ABSENT}
    slices: list[MigSlice] = []
    for index in range(count):
        try:
            device = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        except Exception as error:
            if getattr(error, "value", None) in absent:
                continue  # no MIG device at this index
            if not _nvml_error(error):
                raise
            problems.append(f"MIG device {index}: {error}")
            continue
        try:
            uuid = _text(nv.nvmlDeviceGetUUID(device))
            gi = int(nv.nvmlDeviceGetGpuInstanceId(device))
            ci = int(nv.nvmlDeviceGetComputeInstanceId(device))
            attributes = nv.nvmlDeviceGetAttributes(device)
            gi_slices = int(attributes.gpuInstanceSliceCount)
            ci_slices = int(attributes.computeInstanceSliceCount) or gi_slices
            memory = int(attributes.memorySizeMB)
            name = _profile_name(table, gi_slices, memory, model, card_memory_mib)
            if ci_slices < gi_slices:
                name = f"{ci_slices}c.{name}"
            check_profile_name(name)
            slices.append(MigSlice(uuid=uuid, profile=name, gpu_instance=gi, compute_instance=ci,
                                   slices=ci_slices, card_slices=card_slices, memory_mib=memory))
        except Exception as error:
            if not _nvml_error(error) and not isinstance(error, ValueError):
                raise
            problems.append(f"MIG device {index}: {error}")
    per_instance = Counter(s.gpu_instance for s in slices)
    marked = tuple(replace(s, memory_shared=per_instance[s.gpu_instance] > 1) for s in slices)
    for problem in problems:
        log.warning("%s: %s", model, problem)
    return marked, problems


def slice_handles(nv: Any, handle: Any) -> tuple[dict[str, Any], int]:
    """MIG UUID -> its device handle, for sampling (indices without a device skipped), and how
    many devices could not be read (a failing device, as opposed to one the admin removed)."""
    found: dict[str, Any] = {}
    unreadable = 0
    absent = {_code(nv, name) for name in _ABSENT}
    for index in range(int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            device = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            found[_text(nv.nvmlDeviceGetUUID(device))] = device
        except Exception as error:
            if getattr(error, "value", None) in absent:
                continue
            if _nvml_error(error):
                unreadable += 1
                continue
            raise
    return found, unreadable


def layout_changed(known: set[str], found: set[str], unreadable: int) -> bool:
    """Whether the admin re-partitioned the card: a MIG device we do not know appeared, or (when
    every device could be read) one we know is gone. A device that fails to answer is a fault of
    that slice (reported unhealthy), not a new layout."""
    return bool(found - known) or (unreadable == 0 and found != known)
