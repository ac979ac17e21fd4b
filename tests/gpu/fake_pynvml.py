"""A small fake ``pynvml`` module object, for testing the NVML backend's logic only.

This machine has no GPU, so the NVML backend's queries are exercised against this
stand-in, injected through ``NVMLBackend(library=...)``. It mirrors pynvml's calling
conventions (handles, ``NVMLError`` with ``.value``, bytes from string queries,
``nvmlEventSetWait`` raising a timeout) for a 4-card box: cards 0-1 and 2-3 joined by
two NVLinks each, PCIe host bridge between the pairs inside one NUMA node... except that
card 3 is on NUMA 1, reached through SYS. It is never used by product code.
"""

from __future__ import annotations

import queue
import time
import types
from dataclasses import dataclass, field

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 18
NVML_NVLINK_DEVICE_TYPE_GPU = 0
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_SYSTEM = 50
nvmlEventTypeXidCriticalError = 0x8


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeCard:
    index: int
    uuid: str
    name: str
    total_mib: int
    bus_id: str
    numa: int
    nvlinks: list[str] = field(default_factory=list)  # remote bus id per active link
    used_mib: int = 0
    utilization: int = 0
    processes: dict[int, int] = field(default_factory=dict)  # pid -> MiB
    process_util: dict[int, int] = field(default_factory=dict)  # pid -> smUtil
    lost: bool = False


def make_module(*, init_error: int | None = None, cards: list[FakeCard] | None = None) -> types.ModuleType:
    """A module object with pynvml's function names over the given cards."""
    nv = types.ModuleType("fake_pynvml")
    for name, value in globals().items():
        if name.startswith(("NVML_", "nvmlEventType")):
            setattr(nv, name, value)
    nv.NVMLError = NVMLError
    if cards is None:
        cards = default_cards()
    nv.cards = cards
    nv.events = queue.Queue()
    nv.calls = []

    def check(handle: FakeCard) -> FakeCard:
        if handle.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return handle

    def nvmlInit() -> None:
        nv.calls.append("init")
        if init_error is not None:
            raise NVMLError(init_error)

    nv.nvmlInit = nvmlInit
    nv.nvmlShutdown = lambda: nv.calls.append("shutdown")
    nv.nvmlSystemGetDriverVersion = lambda: "550.54.15"
    nv.nvmlDeviceGetCount = lambda: len(cards)
    nv.nvmlDeviceGetHandleByIndex = lambda i: cards[i]
    nv.nvmlDeviceGetUUID = lambda h: h.uuid.encode()
    nv.nvmlDeviceGetName = lambda h: h.name
    nv.nvmlDeviceGetMinorNumber = lambda h: h.index
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=h.bus_id.encode())
    nv.nvmlDeviceGetNumaNodeId = lambda h: h.numa

    def memory(h: FakeCard) -> types.SimpleNamespace:
        check(h)
        mib = 1024 * 1024
        return types.SimpleNamespace(total=h.total_mib * mib, used=h.used_mib * mib,
                                     free=(h.total_mib - h.used_mib) * mib)

    nv.nvmlDeviceGetMemoryInfo = memory
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=check(h).utilization, memory=0)

    def compute_processes(h: FakeCard) -> list[types.SimpleNamespace]:
        check(h)
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=mib * 1024 * 1024) for pid, mib in h.processes.items()]

    def graphics_processes(h: FakeCard) -> list[types.SimpleNamespace]:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    nv.nvmlDeviceGetComputeRunningProcesses = compute_processes
    nv.nvmlDeviceGetGraphicsRunningProcesses = graphics_processes

    def process_utilization(h: FakeCard, since: int) -> list[types.SimpleNamespace]:
        check(h)
        if not h.process_util:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        stamp = int(time.time() * 1e6)
        return [types.SimpleNamespace(pid=pid, timeStamp=stamp, smUtil=util, memUtil=0)
                for pid, util in h.process_util.items()]

    nv.nvmlDeviceGetProcessUtilization = process_utilization

    def link_state(h: FakeCard, link: int) -> int:
        if link >= len(h.nvlinks):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return NVML_FEATURE_ENABLED

    nv.nvmlDeviceGetNvLinkState = link_state
    nv.nvmlDeviceGetNvLinkRemoteDeviceType = lambda h, link: NVML_NVLINK_DEVICE_TYPE_GPU
    nv.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(busId=h.nvlinks[link].encode())

    def common_ancestor(a: FakeCard, b: FakeCard) -> int:
        if a.numa != b.numa:
            return NVML_TOPOLOGY_SYSTEM
        return NVML_TOPOLOGY_HOSTBRIDGE

    nv.nvmlDeviceGetTopologyCommonAncestor = common_ancestor
    nv.nvmlEventSetCreate = lambda: "event-set"
    nv.registered = []
    nv.nvmlDeviceRegisterEvents = lambda h, types_, s: nv.registered.append((h.index, types_, s))

    def wait(event_set: str, timeout_ms: int) -> types.SimpleNamespace:
        try:
            return nv.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT) from None

    nv.nvmlEventSetWait = wait
    nv.nvmlEventSetFree = lambda s: nv.calls.append("free")

    def emit_xid(card_index: int | None, xid: int) -> None:
        device = cards[card_index] if card_index is not None else None
        nv.events.put(types.SimpleNamespace(device=device, eventType=nvmlEventTypeXidCriticalError,
                                            eventData=xid))

    nv.emit_xid = emit_xid
    return nv


def default_cards() -> list[FakeCard]:
    bus = ["00000000:07:00.0", "00000000:0F:00.0", "00000000:47:00.0", "00000000:87:00.0"]
    cards = [FakeCard(i, f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd", "NVIDIA A100-SXM4-80GB", 81920,
                      bus[i], 0 if i < 3 else 1) for i in range(4)]
    # two links 0<->1 and 2<->3, the remote side reported in NVML's shorter domain form too
    cards[0].nvlinks = ["0000:0f:00.0", "00000000:0F:00.0"]
    cards[1].nvlinks = ["00000000:07:00.0", "00000000:07:00.0"]
    cards[2].nvlinks = ["00000000:87:00.0", "00000000:87:00.0"]
    cards[3].nvlinks = ["00000000:47:00.0", "00000000:47:00.0"]
    return cards
