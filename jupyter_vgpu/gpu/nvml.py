"""The NVML backend (nvidia-ml-py's ``pynvml``), imported and initialised on first use.

A node without the NVIDIA driver is a normal state, not a crash: ``available()`` is
False and ``problem()`` says what is missing ("no NVIDIA driver: ..."), which the node
daemon publishes on the Node.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from jupyter_vgpu.gpu.base import (
    APPLICATION_XIDS,
    CardSample,
    GPUError,
    HealthEvent,
    ProcessSample,
    Sample,
    SliceSample,
    describe_xid,
    mig_reason,
)
from jupyter_vgpu.gpu.nvml_processes import FAMILIES, ProcessLister

if TYPE_CHECKING:
    from jupyter_vgpu.core.inventory import Card
    from jupyter_vgpu.core.mig import MigSlice
    from jupyter_vgpu.core.topology import Topology

log = logging.getLogger(__name__)

_MIB = 1024 * 1024
_NVML_SUCCESS = 0


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _normal_bus_id(bus_id: str) -> str:
    """'00000000:07:00.0' and '0000:07:00.0' -> '0000:07:00.0' (NVML pads the domain to 8 digits)."""
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        try:
            return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
        except ValueError:
            return text
    return text


class NVMLBackend:
    """A GPUBackend over NVML.

    ``library`` is the ``pynvml`` module; it defaults to importing the real one on first
    use. Tests pass a small fake module object here because this machine has no GPU.
    """

    name = "nvml"

    def __init__(self, library: Any = None, *, ignored_xids: frozenset[int] = APPLICATION_XIDS,
                 sysfs_root: str = "/sys") -> None:
        self._library = library
        self._ignored_xids = ignored_xids
        self._sysfs_root = sysfs_root
        self._lock = threading.RLock()
        self._initialised = False
        self._tried = False
        self._problem: str | None = None
        self._driver: str | None = None
        self._handles: list[Any] = []
        self._cards: list[Card] = []
        self._topology: Topology | None = None
        self._topology_done = False
        self._unhealthy: dict[int, str] = {}
        self._last_process_ts: dict[int, int] = {}
        self._listers: dict[str, ProcessLister] = {}
        self._event_set: Any = None
        self._events_ready = False
        self._pending: queue.Queue[HealthEvent] = queue.Queue()

    # --- lazy initialisation ----------------------------------------------------------

    def _nvml(self) -> Any:
        """The initialised library, or None (with ``self._problem`` set) when there is none."""
        with self._lock:
            if self._tried:
                return self._library if self._initialised else None
            self._tried = True
            try:
                if self._library is None:
                    import pynvml

                    self._library = pynvml
                nv = self._library
                nv.nvmlInit()
            except ImportError as error:
                self._problem = f"no NVIDIA driver: cannot import pynvml ({error}); install nvidia-ml-py"
                return None
            except Exception as error:  # pynvml raises NVMLError subclasses
                self._problem = self._describe_init_error(error)
                log.info("NVML unavailable: %s", self._problem)
                return None
            self._initialised = True
            try:
                self._driver = _text(nv.nvmlSystemGetDriverVersion())
            except Exception as error:
                log.warning("cannot read the driver version: %s", error)
            try:
                count = int(nv.nvmlDeviceGetCount())
                self._handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
                self._cards = [self._read_card_or_placeholder(i, h) for i, h in enumerate(self._handles)]
            except Exception as error:
                self._problem = f"NVML is loaded but listing GPUs failed: {error}"
                log.error("%s", self._problem)
                self._handles, self._cards = [], []
                return nv
            if not self._cards:
                self._problem = "no GPUs"
            log.info("NVML: driver %s, %d GPU(s)", self._driver, len(self._cards))
            return nv

    def _describe_init_error(self, error: Exception) -> str:
        nv = self._library
        value = getattr(error, "value", None)
        if value == getattr(nv, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
            return "no NVIDIA driver: the NVML library (libnvidia-ml.so.1) is not installed"
        if value == getattr(nv, "NVML_ERROR_DRIVER_NOT_LOADED", 9):
            return "no NVIDIA driver: the kernel driver is not loaded"
        if value == getattr(nv, "NVML_ERROR_NO_PERMISSION", 4):
            return f"NVIDIA driver present but access was refused: {error}"
        return f"no usable NVIDIA driver: {error}"

    def _read_card_or_placeholder(self, index: int, handle: Any) -> Card:
        """A card that cannot be read at start keeps its index, unhealthy, so others keep theirs."""
        from jupyter_vgpu.core.inventory import Card

        try:
            return self._read_card(index, handle)
        except Exception as error:
            if getattr(error, "value", None) is None:
                raise
            reason = f"unreadable at start: {error}"
            log.error("GPU%d %s", index, reason)
            self._unhealthy[index] = reason
            return Card(index=index, uuid=f"GPU-unreadable-{index}", model="unknown", memory_mib=0)

    def _read_card(self, index: int, handle: Any) -> Card:
        from jupyter_vgpu.core.inventory import Card

        nv = self._library
        uuid = _text(nv.nvmlDeviceGetUUID(handle))
        name = _text(nv.nvmlDeviceGetName(handle))
        memory = nv.nvmlDeviceGetMemoryInfo(handle)
        minor = self._optional(lambda: int(nv.nvmlDeviceGetMinorNumber(handle)))
        bus_id = self._optional(lambda: _text(nv.nvmlDeviceGetPciInfo(handle).busId))
        # sysfs names the CPU node the card hangs off; on Grace-Hopper NVML's NUMA id is the
        # node of the GPU's own memory, so NVML is only the fallback
        numa = self._sysfs_numa(bus_id) if bus_id else None
        if numa is None or numa < 0:
            numa = self._optional(lambda: int(nv.nvmlDeviceGetNumaNodeId(handle)))
        if numa is not None and numa < 0:
            numa = None
        mig = self._mig_mode(handle)
        reason = mig_reason(*mig) if mig else None
        total_mib = int(memory.total) // _MIB
        slices: tuple[MigSlice, ...] = ()
        if mig and mig[0]:  # slices exist only while MIG mode is on now (not merely pending)
            from jupyter_vgpu.gpu.nvml_mig import read_slices

            slices, _ = read_slices(nv, handle, name, total_mib)
        if reason:
            log.warning("GPU%d (%s) %s; it is kept out of sharing as a whole card, %d MIG device(s) found",
                        index, uuid, reason, len(slices))
        return Card(index=index, uuid=uuid, model=name, memory_mib=total_mib,
                    minor=minor, bus_id=bus_id, numa=numa, mig=reason is not None, unavailable=reason,
                    slices=slices)

    def _mig_mode(self, handle: Any) -> tuple[bool, bool] | None:
        """(current, pending) MIG mode; None for a card or driver without MIG."""
        nv = self._library
        try:
            current, pending = nv.nvmlDeviceGetMigMode(handle)
        except Exception as error:
            if getattr(error, "value", None) is None and not isinstance(error, AttributeError):
                raise
            return None  # NOT_SUPPORTED (no MIG on this card), FUNCTION_NOT_FOUND (driver before R450)
        enabled = getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1)
        return int(current) == enabled, int(pending) == enabled

    def _optional(self, query: Any) -> Any:
        """A value NVML may not support on this card or driver (None then)."""
        try:
            return query()
        except Exception as error:
            if getattr(error, "value", None) is None and not isinstance(error, AttributeError):
                raise
            return None

    def _sysfs_numa(self, bus_id: str) -> int | None:
        path = os.path.join(self._sysfs_root, "bus", "pci", "devices", _normal_bus_id(bus_id), "numa_node")
        try:
            with open(path, encoding="ascii") as handle:
                return int(handle.read().strip())
        except (OSError, ValueError):
            return None

    # --- GPUBackend -------------------------------------------------------------------

    def available(self) -> bool:
        return self._nvml() is not None and bool(self._cards)

    def problem(self) -> str | None:
        self._nvml()
        return self._problem

    def driver_version(self) -> str | None:
        self._nvml()
        return self._driver

    def inventory(self) -> list[Card]:
        if not self.available():
            return []
        with self._lock:
            return [replace(card, healthy=card.index not in self._unhealthy and card.unavailable is None)
                    for card in self._cards]

    def topology(self) -> Topology | None:
        if not self.available():
            return None
        with self._lock:
            if not self._topology_done:
                self._topology = self._read_topology()
                self._topology_done = True
            return self._topology

    def _read_topology(self) -> Topology:
        from jupyter_vgpu.core.topology import from_pairwise, nvml_level_to_link

        nv = self._library
        count = len(self._handles)
        by_bus = {_normal_bus_id(card.bus_id): card.index for card in self._cards if card.bus_id}
        direct = [[0] * count for _ in range(count)]
        via_switch = [0] * count  # NVSwitch systems (DGX): every GPU reaches every other through the switches
        switch_type = getattr(nv, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
        for a, handle in enumerate(self._handles):
            for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
                try:
                    if nv.nvmlDeviceGetNvLinkState(handle, link) != getattr(nv, "NVML_FEATURE_ENABLED", 1):
                        continue
                    remote_type = self._optional(lambda: nv.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))  # noqa: B023
                    if remote_type == switch_type:
                        via_switch[a] += 1
                        continue
                    remote = _normal_bus_id(_text(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
                except Exception as error:
                    if getattr(error, "value", None) is None:
                        raise
                    break  # NOT_SUPPORTED: no NVLink on this card, or no more links
                b = by_bus.get(remote)
                if b is not None and b != a:
                    direct[a][b] += 1
        levels: dict[tuple[int, int], str] = {}
        for a in range(count):
            for b in range(a + 1, count):
                links = max(direct[a][b], direct[b][a]) + min(via_switch[a], via_switch[b])
                if links:
                    levels[(a, b)] = f"NV{links}"
                    continue
                try:
                    level = nv.nvmlDeviceGetTopologyCommonAncestor(self._handles[a], self._handles[b])
                    levels[(a, b)] = nvml_level_to_link(int(level))
                except Exception as error:
                    if getattr(error, "value", None) is None:
                        raise
                    log.warning("no topology between GPU%d and GPU%d (%s); assuming SYS", a, b, error)
                    levels[(a, b)] = "SYS"

        def link(a: int, b: int) -> str:
            return levels[(min(a, b), max(a, b))]

        return from_pairwise(count, link, [card.numa for card in self._cards])

    def sample(self) -> Sample:
        nv = self._nvml()
        if nv is None or not self._cards:
            raise GPUError(self._problem or "no GPUs")
        now = time.time()
        cards: list[CardSample] = []
        processes: list[ProcessSample] = []
        slices: list[SliceSample] = []
        for card, handle in zip(self._cards, self._handles, strict=True):
            try:
                memory = nv.nvmlDeviceGetMemoryInfo(handle)
                busy = self._utilization(nv, card, handle)
                per_process = self._process_samples(nv, card, handle, int(memory.total))
            except Exception as error:
                if getattr(error, "value", None) is None:
                    raise
                self._card_error(card, error)
                cards.append(CardSample(card.index, card.uuid, 0, card.memory_mib, 0.0, healthy=False))
                continue
            cards.append(CardSample(
                index=card.index, uuid=card.uuid, memory_used_mib=int(memory.used) // _MIB,
                memory_total_mib=int(memory.total) // _MIB,
                utilization_percent=busy,
                healthy=card.index not in self._unhealthy and card.unavailable is None,
            ))
            if card.slices:
                found, on_slice = self._slice_samples(nv, card, handle)
                slices.extend(found)
                per_process = [replace(p, mig_device=on_slice.get(p.pid)) for p in per_process]
            processes.extend(per_process)
        return Sample(taken_at=now, cards=cards, processes=processes, slices=slices)

    def _slice_samples(self, nv: Any, card: Card, handle: Any) -> tuple[list[SliceSample], dict[int, str]]:
        """Memory of each MIG device of a card, and which device each process runs on.

        A device that cannot be read is reported unhealthy with nothing used; utilisation per
        MIG device is not available through NVML (None).
        """
        from jupyter_vgpu.gpu.nvml_mig import layout_changed, slice_handles

        handles, unreadable = slice_handles(nv, handle)
        if layout_changed({s.uuid for s in card.slices}, set(handles), unreadable):
            card = self._relayout(nv, card, handle)
        found: list[SliceSample] = []
        on_slice: dict[int, str] = {}
        lister = self._listers.get("Compute")
        if lister is None:
            lister = self._listers["Compute"] = ProcessLister(nv, "Compute")
        for mig in card.slices:
            device = handles.get(mig.uuid)
            try:
                if device is None:
                    raise GPUError(f"MIG device {mig.uuid} is gone")
                memory = nv.nvmlDeviceGetMemoryInfo(device)
                for proc in lister.running(device, int(memory.total)):
                    on_slice[proc.pid] = mig.uuid
            except Exception as error:
                if getattr(error, "value", None) is None and not isinstance(error, GPUError):
                    raise
                found.append(SliceSample(card.index, mig.uuid, 0, mig.memory_mib, None, healthy=False))
                continue
            found.append(SliceSample(card.index, mig.uuid, int(memory.used) // _MIB, int(memory.total) // _MIB,
                                     None, healthy=mig.healthy))
        return found, on_slice

    def _relayout(self, nv: Any, card: Card, handle: Any) -> Card:
        """The admin made another MIG layout (nvidia-smi mig, mig-parted): serve the new slices and
        report it as a health event, so the node daemon re-reads the inventory and re-advertises."""
        from jupyter_vgpu.gpu.nvml_mig import read_slices

        slices, _ = read_slices(nv, handle, card.model, card.memory_mib)
        reason = (f"MIG layout changed: {' + '.join(s.profile for s in card.slices) or 'no slices'} -> "
                  f"{' + '.join(s.profile for s in slices) or 'no slices'}")
        log.warning("GPU%d (%s): %s", card.index, card.uuid, reason)
        with self._lock:
            card = replace(card, slices=slices)
            self._cards = [card if c.index == card.index else c for c in self._cards]
        self._pending.put(HealthEvent(card.index, card.uuid, False, reason))  # the card stays out of sharing
        return card

    def _utilization(self, nv: Any, card: Card, handle: Any) -> float:
        try:
            return float(nv.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception as error:
            # a MIG parent has no whole-card utilisation: that is its nature, not a fault
            if card.mig and getattr(error, "value", None) == getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3):
                return 0.0
            raise

    def _process_samples(self, nv: Any, card: Card, handle: Any, total_bytes: int) -> list[ProcessSample]:
        # MPS clients appear only in the MPS list (the compute list shows the MPS server instead)
        memory_by_pid: dict[int, int] = {}
        for family in FAMILIES:
            lister = self._listers.get(family)
            if lister is None:
                lister = self._listers[family] = ProcessLister(nv, family)
            try:
                running = lister.running(handle, total_bytes)
            except Exception as error:
                if getattr(error, "value", None) == getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3):
                    continue
                raise
            for proc in running:
                used = proc.used_bytes
                memory_by_pid[proc.pid] = max(memory_by_pid.get(proc.pid, 0), used // _MIB if used is not None else 0)
        utilization_by_pid: dict[int, float] = {}
        since = self._last_process_ts.get(card.index, 0)
        try:
            utilization_samples = nv.nvmlDeviceGetProcessUtilization(handle, since)
        except Exception as error:
            code = getattr(error, "value", None)
            if code not in (getattr(nv, "NVML_ERROR_NOT_FOUND", 6), getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3)):
                raise
            utilization_samples = []  # no process ran kernels since the last sample
        latest = since
        for sample in utilization_samples:
            pid = int(sample.pid)
            utilization_by_pid[pid] = max(utilization_by_pid.get(pid, 0.0), float(sample.smUtil))
            latest = max(latest, int(sample.timeStamp))
        self._last_process_ts[card.index] = latest
        return [
            ProcessSample(pid=pid, card_index=card.index, uuid=card.uuid, memory_used_mib=memory_by_pid[pid],
                          utilization_percent=utilization_by_pid.get(pid, 0.0))
            for pid in sorted(memory_by_pid)
        ]

    def _card_error(self, card: Card, error: Exception) -> None:
        nv = self._library
        if getattr(error, "value", None) == getattr(nv, "NVML_ERROR_GPU_IS_LOST", 15):
            reason = "card lost (" + describe_xid(79) + ")"
            if self._set_health(card.index, False, reason):
                self._pending.put(HealthEvent(card.index, card.uuid, False, reason))
        else:
            log.warning("sampling GPU%d failed: %s", card.index, error)

    def _set_health(self, index: int, healthy: bool, reason: str) -> bool:
        """Record a card's health; True when it changed."""
        with self._lock:
            was_healthy = index not in self._unhealthy
            if healthy:
                self._unhealthy.pop(index, None)
            else:
                self._unhealthy[index] = reason
            return was_healthy != healthy

    def next_health_event(self, timeout: float) -> HealthEvent | None:
        deadline = time.monotonic() + max(0.0, timeout)
        try:
            return self._pending.get_nowait()
        except queue.Empty:
            pass
        nv = self._nvml()
        if nv is None or not self._cards or not self._ensure_event_set(nv):
            try:
                return self._pending.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
        while True:
            remaining_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
            try:
                # wait in short slices so events found by sample() are not held up
                data = nv.nvmlEventSetWait(self._event_set, min(remaining_ms, 500))
            except Exception as error:
                if getattr(error, "value", None) != getattr(nv, "NVML_ERROR_TIMEOUT", 10):
                    log.warning("waiting for NVML events failed: %s", error)
                data = None
            if data is not None:
                event = self._xid_event(nv, data)
                if event is not None:
                    return event
            try:
                return self._pending.get_nowait()
            except queue.Empty:
                pass
            if remaining_ms <= 0 or time.monotonic() >= deadline:
                return None

    def _ensure_event_set(self, nv: Any) -> bool:
        with self._lock:
            if self._events_ready:
                return self._event_set is not None
            self._events_ready = True
            try:
                event_set = nv.nvmlEventSetCreate()
            except Exception as error:
                log.warning("NVML events unavailable (%s); XID health checks are off", error)
                return False
            registered = 0
            for card, handle in zip(self._cards, self._handles, strict=True):
                try:
                    nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, event_set)
                    registered += 1
                except Exception as error:
                    log.warning("GPU%d does not report XID events (%s)", card.index, error)
            self._event_set = event_set
            log.info("watching XID events on %d of %d GPU(s)", registered, len(self._cards))
            return True

    def _xid_event(self, nv: Any, data: Any) -> HealthEvent | None:
        if int(data.eventType) != int(nv.nvmlEventTypeXidCriticalError):
            return None
        xid = int(data.eventData)
        reason = describe_xid(xid)
        try:
            uuid = _text(nv.nvmlDeviceGetUUID(data.device))
        except Exception:
            uuid = ""
        matching = [card for card in self._cards if card.uuid == uuid]
        if not matching:
            # NVML could not say which card: every card is suspect, as NVIDIA's plugin does
            log.error("%s without a known device; marking every GPU unhealthy", reason)
            for card in self._cards:
                if self._set_health(card.index, False, reason):
                    self._pending.put(HealthEvent(card.index, card.uuid, False, reason))
            try:
                return self._pending.get_nowait()
            except queue.Empty:
                return None
        card = matching[0]
        if xid in self._ignored_xids:
            log.info("GPU%d: %s, an application error; the card stays healthy", card.index, reason)
            return HealthEvent(card.index, uuid, card.index not in self._unhealthy and card.unavailable is None,
                               reason)
        self._set_health(card.index, False, reason)
        return HealthEvent(card.index, uuid, False, reason)

    def close(self) -> None:
        with self._lock:
            if not self._initialised:
                return
            nv = self._library
            if self._event_set is not None:
                try:
                    nv.nvmlEventSetFree(self._event_set)
                except Exception as error:
                    log.debug("freeing the NVML event set: %s", error)
                self._event_set = None
            try:
                nv.nvmlShutdown()
            except Exception as error:
                log.debug("NVML shutdown: %s", error)
            self._initialised = False
            self._tried = False
            self._events_ready = False
