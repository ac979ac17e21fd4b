"""A small fake ``pynvml`` module object, for testing the NVML backend's logic only.

This machine has no GPU, so the NVML backend's queries are exercised against this
stand-in, injected through ``NVMLBackend(library=...)``. It mirrors pynvml's calling
conventions (handles, bytes from string queries, ``nvmlEventSetWait`` raising a timeout)
for a 4-card box: cards 0-1 and 2-3 joined by two NVLinks each, PCIe host bridge between
the pairs inside one NUMA node... except that card 3 is on NUMA 1, reached through SYS.
It is never used by product code.

What nvidia-ml-py raises is not imitated but used: errors are the installed ``pynvml``'s
own classes (``pynvml.NVMLError(value)`` gives the ``NVMLError_*`` subclass, and
``NVMLLibraryMismatchError`` has no ``.value``). The running-process queries go further:
they ARE the installed nvidia-ml-py's functions (``nvmlDeviceGet*RunningProcesses``,
``_v2``, ``_v3`` and ``_nvmlGetFunctionPointer``), run over ``FakeDriver``, a stand-in for
``libnvidia-ml.so.1`` that exports only the C symbols a driver generation has and fills the
caller's buffer with the struct layout that driver really writes. So "an R470 driver under
nvidia-ml-py 13" raises exactly what it raises on a real node, and an R525-era driver's
larger ``_v3`` records come out of the real wrapper as the same garbage.

PID namespaces as the driver keeps them (open-gpu-kernel-modules, gpu_rmapi.c): a process is
reported to a caller only if its PID exists in the caller's PID namespace, by its PID there.
``FakeDriver.caller_pid_namespace`` is the caller's (``HOST``: hostPID, every process by host
PID) and ``FakeDriver.pid_namespaces`` each process's (host PID -> (namespace, PID there); absent:
a host process); card memory and utilisation are the same from everywhere.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import queue
import threading
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass, field

import pynvml as _real

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
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
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
nvmlEventTypeXidCriticalError = 0x8
# GPU instance profile ids (nvml.h NVML_GPU_INSTANCE_PROFILE_*), the installed nvidia-ml-py's values
NVML_GPU_INSTANCE_PROFILE_1_SLICE = _real.NVML_GPU_INSTANCE_PROFILE_1_SLICE
NVML_GPU_INSTANCE_PROFILE_2_SLICE = _real.NVML_GPU_INSTANCE_PROFILE_2_SLICE
NVML_GPU_INSTANCE_PROFILE_3_SLICE = _real.NVML_GPU_INSTANCE_PROFILE_3_SLICE
NVML_GPU_INSTANCE_PROFILE_4_SLICE = _real.NVML_GPU_INSTANCE_PROFILE_4_SLICE
NVML_GPU_INSTANCE_PROFILE_7_SLICE = _real.NVML_GPU_INSTANCE_PROFILE_7_SLICE
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 = _real.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 = _real.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
NVML_GPU_INSTANCE_PROFILE_COUNT = _real.NVML_GPU_INSTANCE_PROFILE_COUNT

NVMLError = _real.NVMLError
NVMLLibraryMismatchError = _real.NVMLLibraryMismatchError

# --- a stand-in libnvidia-ml.so.1 for the running-process queries -------------------------------------


class _V1(ctypes.Structure):  # nvmlProcessInfo_v1_t
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _V2(ctypes.Structure):  # nvmlProcessInfo_v2_t, also what nvidia-ml-py >= 12.535 reads for _v3
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class _V3CC(ctypes.Structure):  # the _v3 record R525-R535 drivers write (with confidential-computing memory)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint),
                ("usedGpuCcProtectedMemory", ctypes.c_ulonglong)]


HOST = "host"
NO_INSTANCE = 0xFFFFFFFF
FAMILIES = ("Compute", "Graphics", "MPSCompute")
# which process-query symbols a driver generation exports, and the record it writes for each
DRIVERS: dict[str, dict[str, type[ctypes.Structure]]] = {
    "r418": {"": _V1},                                  # before the versioned functions
    "r470": {"": _V1, "_v2": _V2},                      # what nvidia-ml-py >= 12.535 meets on R470
    "r525": {"": _V1, "_v2": _V2, "_v3": _V3CC},        # _v3 with the larger record
    "r550": {"": _V1, "_v2": _V2, "_v3": _V2},
}


class FakeDriver:
    """Exports ``nvmlDeviceGet<family>RunningProcesses<suffix>`` for the suffixes its generation has.

    Each export follows the C contract: ``fn(device, unsigned int *count, nvmlProcessInfo *infos)``;
    with too small a count it sets the count and returns NVML_ERROR_INSUFFICIENT_SIZE.
    """

    def __init__(self, generation: str) -> None:
        self.generation = generation
        self.calls: list[str] = []
        self.caller_pid_namespace = HOST
        self.pid_namespaces: dict[int, tuple[str, int]] = {}
        for family in FAMILIES:
            for suffix, record in DRIVERS[generation].items():
                name = f"nvmlDeviceGet{family}RunningProcesses{suffix}"
                setattr(self, name, self._export(name, family, record))

    def _export(self, name: str, family: str, record: type[ctypes.Structure]):  # noqa: ANN202
        def query(device: FakeCard, count_ref, infos) -> int:  # noqa: ANN001
            self.calls.append(name)
            if device.lost:
                return NVML_ERROR_GPU_IS_LOST
            processes = self.visible(device.running(family))
            count = count_ref._obj  # ctypes.byref(c_uint)
            if not processes:
                count.value = 0
                return _real.NVML_SUCCESS
            if infos is None or count.value < len(processes):
                count.value = len(processes)
                return _real.NVML_ERROR_INSUFFICIENT_SIZE
            rows = (record * len(processes))()
            for row, (pid, mib) in zip(rows, processes, strict=True):
                row.pid, row.usedGpuMemory = pid, mib * 1024 * 1024
                if hasattr(row, "gpuInstanceId"):
                    row.gpuInstanceId = row.computeInstanceId = NO_INSTANCE
                if hasattr(row, "usedGpuCcProtectedMemory"):
                    row.usedGpuCcProtectedMemory = 0
            ctypes.memmove(infos, rows, ctypes.sizeof(rows))  # the caller's buffer is big enough: 2n+5 entries
            count.value = len(processes)
            return _real.NVML_SUCCESS

        return query

    def visible(self, processes: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """(pid, value) of the processes the caller's PID namespace holds, by their PIDs there."""
        if self.caller_pid_namespace == HOST:
            return processes
        seen = []
        for pid, value in processes:
            namespace, local = self.pid_namespaces.get(pid, (HOST, pid))
            if namespace == self.caller_pid_namespace:
                seen.append((local, value))
        return seen


_DRIVER_LOCK = threading.RLock()


@contextlib.contextmanager
def _loaded(driver: FakeDriver) -> Iterator[None]:
    """The installed nvidia-ml-py with ``driver`` as its loaded library, for one call."""
    with _DRIVER_LOCK:
        cache = _real._nvmlGetFunctionPointer_cache
        saved_lib, saved_cache = _real.nvmlLib, dict(cache)
        _real.nvmlLib = driver
        cache.clear()
        try:
            yield
        finally:
            _real.nvmlLib = saved_lib
            cache.clear()
            cache.update(saved_cache)


def _through(driver: FakeDriver, function):  # noqa: ANN001, ANN202
    def call(*args):  # noqa: ANN002, ANN202
        with _loaded(driver):
            return function(*args)

    return call


# An A100-SXM4-40GB's GPU instance profiles as `nvidia-smi mig -lgip` lists them:
# profile id -> (name, slice count, instance count, memory MiB)
A100_40GB_PROFILES = {
    NVML_GPU_INSTANCE_PROFILE_1_SLICE: ("1g.5gb", 1, 7, 4864),
    NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: ("1g.5gb+me", 1, 1, 4864),
    NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2: ("1g.10gb", 1, 4, 9984),
    NVML_GPU_INSTANCE_PROFILE_2_SLICE: ("2g.10gb", 2, 3, 9984),
    NVML_GPU_INSTANCE_PROFILE_3_SLICE: ("3g.20gb", 3, 2, 20096),
    NVML_GPU_INSTANCE_PROFILE_4_SLICE: ("4g.20gb", 4, 1, 20096),
    NVML_GPU_INSTANCE_PROFILE_7_SLICE: ("7g.40gb", 7, 1, 40320),
}


@dataclass
class FakeMigDevice:
    """One MIG device (a compute instance in a GPU instance) at a MIG device index of its card."""

    slot: int                 # its index for nvmlDeviceGetMigDeviceHandleByIndex
    uuid: str                 # "MIG-..."
    gpu_instance: int
    compute_instance: int
    gi_slices: int
    ci_slices: int
    memory_mib: int
    used_mib: int = 0
    processes: dict[int, int] = field(default_factory=dict)  # pid -> MiB
    lost: bool = False
    broken: int | None = None  # an NVML error code its queries raise

    def running(self, family: str) -> list[tuple[int, int]]:
        return sorted(self.processes.items()) if family == "Compute" else []


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
    mps_clients: dict[int, int] = field(default_factory=dict)  # pid -> MiB, listed only as MPS processes
    process_util: dict[int, int] = field(default_factory=dict)  # pid -> smUtil
    lost: bool = False
    mig: tuple[int, int] | None = None  # (current, pending); None: the card has no MIG (NOT_SUPPORTED)
    mig_devices: list[FakeMigDevice] = field(default_factory=list)  # while MIG mode is on
    profiles: dict[int, tuple[str, int, int, int]] = field(default_factory=lambda: dict(A100_40GB_PROFILES))
    profile_names: bool = True  # False: a v1 profile record, without names (older drivers)

    def running(self, family: str) -> list[tuple[int, int]]:
        if family == "Compute":
            return sorted(self.processes.items())
        if family == "MPSCompute":
            return sorted(self.mps_clients.items())
        return []


def make_module(*, init_error: int | None = None, cards: list[FakeCard] | None = None,
                driver: str = "r550") -> types.ModuleType:
    """A module object with pynvml's function names over the given cards, on a driver generation."""
    nv = types.ModuleType("fake_pynvml")
    for name, value in globals().items():
        if name.startswith(("NVML_", "nvmlEventType")):
            setattr(nv, name, value)
    nv.NVMLError = NVMLError
    nv.NVMLLibraryMismatchError = NVMLLibraryMismatchError
    nv.driver = FakeDriver(driver)
    for family in FAMILIES:
        for suffix in ("", "_v2", "_v3"):
            name = f"nvmlDeviceGet{family}RunningProcesses{suffix}"
            if hasattr(_real, name):
                setattr(nv, name, _through(nv.driver, getattr(_real, name)))
    nv._nvmlGetFunctionPointer = _through(nv.driver, _real._nvmlGetFunctionPointer)
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
    nv.nvmlDeviceGetUUID = lambda h: on_mig(h).uuid.encode() if isinstance(h, FakeMigDevice) else h.uuid.encode()
    nv.nvmlDeviceGetName = lambda h: h.name
    nv.nvmlDeviceGetMinorNumber = lambda h: h.index
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=h.bus_id.encode())
    nv.nvmlDeviceGetNumaNodeId = lambda h: h.numa

    def mig_mode(h: FakeCard) -> list[int]:
        if h.mig is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return list(h.mig)

    nv.nvmlDeviceGetMigMode = mig_mode

    def mig_enabled(h: FakeCard) -> bool:
        return h.mig is not None and h.mig[0] == NVML_DEVICE_MIG_ENABLE

    def max_mig_devices(h: object) -> int:
        if not isinstance(h, FakeCard) or h.mig is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return 7

    def mig_device(h: FakeCard, index: int) -> FakeMigDevice:
        check(h)
        if not mig_enabled(h) or not 0 <= index < 7:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        for device in h.mig_devices:
            if device.slot == index:
                return device
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def on_mig(h: object) -> FakeMigDevice:
        if not isinstance(h, FakeMigDevice):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # a whole card has no instance ids
        if h.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if h.broken is not None:
            raise NVMLError(h.broken)
        return h

    def profile_info(h: FakeCard, profile: int) -> ctypes.Structure:
        if profile not in h.profiles:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        name, slices, instances, memory = h.profiles[profile]
        info = _real.c_nvmlGpuInstanceProfileInfo_v2_t() if h.profile_names else _real.c_nvmlGpuInstanceProfileInfo_t()
        info.id, info.sliceCount, info.instanceCount, info.memorySizeMB = profile, slices, instances, memory
        if h.profile_names:
            info.name = f"MIG {name}".encode()
        return info

    def attributes(h: object) -> ctypes.Structure:
        device = on_mig(h)
        found = _real.c_nvmlDeviceAttributes()
        found.gpuInstanceSliceCount, found.computeInstanceSliceCount = device.gi_slices, device.ci_slices
        found.memorySizeMB = device.memory_mib
        return found

    nv.nvmlDeviceGetMaxMigDeviceCount = max_mig_devices
    nv.nvmlDeviceGetMigDeviceHandleByIndex = mig_device
    nv.nvmlDeviceGetGpuInstanceId = lambda h: on_mig(h).gpu_instance
    nv.nvmlDeviceGetComputeInstanceId = lambda h: on_mig(h).compute_instance
    nv.nvmlDeviceGetAttributes = attributes
    nv.nvmlDeviceGetGpuInstanceProfileInfo = profile_info
    nv.nvmlDeviceIsMigDeviceHandle = lambda h: int(isinstance(h, FakeMigDevice))

    def memory(h: FakeCard | FakeMigDevice) -> types.SimpleNamespace:
        mib = 1024 * 1024
        if isinstance(h, FakeMigDevice):
            on_mig(h)
            return types.SimpleNamespace(total=h.memory_mib * mib, used=h.used_mib * mib,
                                         free=(h.memory_mib - h.used_mib) * mib)
        check(h)
        return types.SimpleNamespace(total=h.total_mib * mib, used=h.used_mib * mib,
                                     free=(h.total_mib - h.used_mib) * mib)

    nv.nvmlDeviceGetMemoryInfo = memory

    def utilization(h: FakeCard | FakeMigDevice) -> types.SimpleNamespace:
        if isinstance(h, FakeMigDevice):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # per-MIG-device utilisation needs DCGM or GPM
        check(h)
        if h.mig is not None and h.mig[0] == NVML_DEVICE_MIG_ENABLE:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # a MIG parent has no whole-card utilisation
        return types.SimpleNamespace(gpu=h.utilization, memory=0)

    nv.nvmlDeviceGetUtilizationRates = utilization

    def process_utilization(h: FakeCard, since: int) -> list[types.SimpleNamespace]:
        check(h)
        samples = nv.driver.visible(list(h.process_util.items()))
        if not samples:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        stamp = int(time.time() * 1e6)
        return [types.SimpleNamespace(pid=pid, timeStamp=stamp, smUtil=util, memUtil=0)
                for pid, util in samples]

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


_MIG_GENERATIONS = itertools.count()


def mig_layout(card: FakeCard, layout: list[tuple[str, int]]) -> FakeCard:
    """Put ``card`` in MIG mode with GPU instances of these profiles, one compute instance each
    (``(name, compute slices)``: fewer compute slices than the profile splits the instance)."""
    by_name = {name: (slices, memory) for name, slices, _, memory in card.profiles.values()}
    card.mig = (NVML_DEVICE_MIG_ENABLE, NVML_DEVICE_MIG_ENABLE)
    card.mig_devices = []
    # the driver gives every instance it creates a new UUID, also one in the slot of a destroyed one
    generation = next(_MIG_GENERATIONS)
    for slot, (name, ci_slices) in enumerate(layout):
        slices, memory = by_name[name]
        gi = slot + 1
        card.mig_devices.append(FakeMigDevice(slot, f"MIG-{slot:08x}-{card.uuid[4:12]}-4000-{8000 + generation:04x}-{gi:012d}", gi, 0,
                                              slices, ci_slices, memory))
    return card


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
