"""Simulated GPUs: a real `nvidia-smi topo -m` capture plus a model, driven by a caller.

The simulated cluster (and tests) start and stop "processes" on cards; their usage
follows a plausible pattern within their limits that changes over time (so charts
move), and is a pure function of (seed, pid, card, time), so a run is reproducible.
The "measured" pattern instead follows a real process: a probe reports its CPU time and
resident memory, and the card shows them scaled into the process's share (one busy CPU
core is the whole compute share, resident memory counts as GPU memory up to the limit),
so work in a simulated notebook moves its charts.
Faults (an XID, a card falling off the bus) are injected and come out of
``next_health_event`` exactly as NVML's would.

PID namespaces are kept as the driver keeps them: it reports a process to an NVML caller only
if the process's PID exists in the caller's PID namespace (open-gpu-kernel-modules, gpu_rmapi.c,
``_gpuConvertPid``). Each process runs in one namespace (``start_process(pid_namespace=...)``;
a container runtime gives each container its own); ``sample()`` reads as a caller in the host
namespace (every process, host PIDs), and ``seen_from(namespace)`` as a caller elsewhere: only
that namespace's processes, with their PIDs there. Card and MIG-device memory and utilisation
are the same from everywhere.
"""

from __future__ import annotations

import hashlib
import math
import queue
import threading
import time
import uuid as uuid_module
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jupyter_vgpu.gpu.base import (
    APPLICATION_XIDS,
    CardSample,
    GPUBackend,
    GPUError,
    HealthEvent,
    ProcessSample,
    Sample,
    SliceSample,
    describe_xid,
    mig_reason,
)

if TYPE_CHECKING:
    from jupyter_vgpu.core.inventory import Card
    from jupyter_vgpu.core.mig import MigSlice
    from jupyter_vgpu.core.topology import Topology

DEFAULT_MODEL = "NVIDIA A100-SXM4-40GB"
DEFAULT_MEMORY_MIB = 40960
PATTERNS = ("notebook", "training", "idle", "measured")
# (CPU seconds, resident bytes) of a real process tree; None when it is gone
UsageProbe = Callable[[], "tuple[float, int] | None"]
# CPU time is turned into a rate over at least this long (samples closer together reuse it)
_RATE_WINDOW_SECONDS = 0.5

# how long a freshly started process takes to reach its working-set memory
_WARMUP_SECONDS = 8.0

HOST_PID_NAMESPACE = "host"
"""The node's own PID namespace: a caller there (hostPID) sees every process, by its host PID."""


@dataclass
class _Process:
    pid: int
    cards: tuple[int, ...]
    memory_limit_mib: int
    cores_limit: int
    pattern: str
    started_at: float
    pinned_memory_mib: int | None = None
    pinned_utilization: float | None = None
    slices: tuple[str, ...] = ()  # the MIG device it runs on (then ``cards`` is its parent card)
    probe: UsageProbe | None = None
    measured: tuple[float, float, float, int] | None = None  # (at, cpu seconds, utilisation, memory MiB)
    pid_namespace: str = HOST_PID_NAMESPACE
    namespace_pid: int = 0  # its PID inside ``pid_namespace`` (the host PID in the host's)


class SimulatedGPUs:
    """A GPUBackend whose cards come from a topology and whose load a caller drives."""

    name = "sim"

    def __init__(
        self,
        topology: Topology,
        *,
        model: str = DEFAULT_MODEL,
        memory_mib: int = DEFAULT_MEMORY_MIB,
        seed: int = 0,
        host: str = "",
        clock: Callable[[], float] = time.time,
        driver_problem: str | None = None,
    ) -> None:
        """``host`` salts the card UUIDs so two simulated nodes built from one fixture differ.

        ``driver_problem`` simulates a node without a working driver: the backend is then
        unavailable and reports that text, as the NVML backend does on such a node.
        """
        if memory_mib <= 0:
            raise ValueError(f"memory_mib must be positive, got {memory_mib}")
        if not model.strip():
            raise ValueError("model must not be empty")
        self._topology = topology
        self._model = model
        self._memory_mib = memory_mib
        self._seed = seed
        self._clock = clock
        self._driver_problem = driver_problem
        count = len(topology.gpus)
        self._uuids = [
            "GPU-" + str(uuid_module.UUID(bytes=_digest(f"{seed}:{host}:{i}")[:16], version=4))
            for i in range(count)
        ]
        self._lock = threading.Lock()
        self._processes: dict[int, _Process] = {}
        self._lost: set[int] = set()
        self._failed: dict[int, str] = {}  # card -> reason for a non-application XID
        self._mig: dict[int, tuple[bool, bool]] = {}  # card -> (current, pending) MIG mode, as NVML reports it
        self._slices: dict[int, tuple[MigSlice, ...]] = {}  # card -> the MIG devices an admin created
        self._slice_faults: dict[str, str] = {}  # MIG device UUID -> why it is unhealthy
        self._layouts = 0
        self._namespace_pids: dict[str, int] = {}  # namespace -> the last PID it handed out
        self._events: queue.Queue[HealthEvent] = queue.Queue()

    @classmethod
    def from_fixture(
        cls,
        path: str | Path,
        *,
        model: str = DEFAULT_MODEL,
        memory_mib: int = DEFAULT_MEMORY_MIB,
        seed: int = 0,
        host: str = "",
        clock: Callable[[], float] = time.time,
    ) -> SimulatedGPUs:
        """Build from an `nvidia-smi topo -m` capture; TopologyError names a bad line."""
        from jupyter_vgpu.core.topology import parse_nvidia_smi_topo

        text = Path(path).read_text(encoding="utf-8")
        return cls(parse_nvidia_smi_topo(text), model=model, memory_mib=memory_mib, seed=seed,
                   host=host, clock=clock)

    # --- GPUBackend -------------------------------------------------------------------

    def available(self) -> bool:
        return self._driver_problem is None and bool(self._topology.gpus)

    def problem(self) -> str | None:
        if self._driver_problem is not None:
            return self._driver_problem
        return None if self._topology.gpus else "no GPUs"

    def driver_version(self) -> str | None:
        return None if self._driver_problem else "simulated"

    def inventory(self) -> list[Card]:
        from jupyter_vgpu.core.inventory import Card

        if not self.available():
            return []
        with self._lock:
            unhealthy = self._lost | set(self._failed)
            mig = {index: mig_reason(*mode) for index, mode in self._mig.items()}
            slices = {index: tuple(replace(s, healthy=False) if s.uuid in self._slice_faults or index in unhealthy
                                   else s for s in layout)
                      for index, layout in self._slices.items() if self._mig.get(index, (False, False))[0]}
        return [
            Card(
                index=gpu.index,
                uuid=self._uuids[i],
                model=self._model,
                memory_mib=self._memory_mib,
                minor=gpu.index,
                bus_id=f"00000000:{0x10 + 0x10 * i:02X}:00.0",
                numa=gpu.numa,
                healthy=gpu.index not in unhealthy and mig.get(gpu.index) is None,
                mig=mig.get(gpu.index) is not None,
                unavailable=mig.get(gpu.index),
                slices=slices.get(gpu.index, ()),
            )
            for i, gpu in enumerate(self._topology.gpus)
        ]

    def topology(self) -> Topology | None:
        return self._topology if self.available() else None

    def sample(self) -> Sample:
        return self.sample_from(HOST_PID_NAMESPACE)

    def seen_from(self, pid_namespace: str) -> GPUBackend:
        """These cards as a caller in ``pid_namespace`` reads them (a node daemon without hostPID)."""
        return PidNamespaceView(self, pid_namespace)

    def sample_from(self, pid_namespace: str) -> Sample:
        """A sample as a caller in ``pid_namespace`` gets it: the processes whose PID exists there."""
        if not self.available():
            raise GPUError(self.problem() or "no GPUs")
        now = self._clock()
        with self._lock:
            processes = list(self._processes.values())
            lost = set(self._lost)
            failed = set(self._failed) | {index for index, mode in self._mig.items() if any(mode)}
        per_card: dict[int, list[ProcessSample]] = {}
        for proc in processes:
            for card in proc.cards:
                if card in lost:
                    continue  # a lost card reports nothing, as NVML cannot reach it
                memory, utilization = self._usage(proc, card, now)
                per_card.setdefault(card, []).append(
                    ProcessSample(pid=proc.pid, card_index=card, uuid=self._uuid(card),
                                  memory_used_mib=memory, utilization_percent=utilization,
                                  mig_device=proc.slices[0] if proc.slices else None)
                )
        cards = []
        for i, gpu in enumerate(self._topology.gpus):
            procs = per_card.get(gpu.index, [])
            used = min(self._memory_mib, sum(p.memory_used_mib for p in procs))
            utilization = min(100.0, round(sum(p.utilization_percent for p in procs), 1))
            cards.append(
                CardSample(index=gpu.index, uuid=self._uuids[i], memory_used_mib=used,
                           memory_total_mib=self._memory_mib, utilization_percent=utilization,
                           healthy=gpu.index not in lost and gpu.index not in failed)
            )
        every = [p for procs in per_card.values() for p in procs]
        slices = [
            SliceSample(card_index=card.index, uuid=s.uuid,
                        memory_used_mib=min(s.memory_mib, sum(p.memory_used_mib for p in every if p.mig_device == s.uuid)),
                        memory_total_mib=s.memory_mib, utilization_percent=None, healthy=s.healthy)
            for card in self.inventory() if card.index not in lost for s in card.slices
        ]
        flat = _visible(every, {proc.pid: proc for proc in processes}, pid_namespace)
        flat.sort(key=lambda p: (p.card_index, p.pid))
        return Sample(taken_at=now, cards=cards, processes=flat, slices=slices)

    def next_health_event(self, timeout: float) -> HealthEvent | None:
        try:
            return self._events.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None

    def close(self) -> None:
        pass

    # --- driving it -------------------------------------------------------------------

    def start_process(
        self,
        pid: int,
        card_index: int | Sequence[int],
        memory_limit_mib: int,
        cores_limit: int,
        pattern: str = "notebook",
        mig_device: str | None = None,
        probe: UsageProbe | None = None,
        pid_namespace: str = HOST_PID_NAMESPACE,
    ) -> None:
        """A process appears on one card (or several) and uses it within the given limits.

        ``memory_limit_mib`` is per card, ``cores_limit`` in percent of a card (1-100). With
        ``mig_device`` it runs on that MIG device of ``card_index``, within the slice's size.
        The "measured" pattern needs ``probe``, which reports the real process's usage.
        ``pid`` is its host PID; in another ``pid_namespace`` it also gets that namespace's next
        PID (1, 2, ...), and only callers there or in the host's see it.
        """
        cards = (card_index,) if isinstance(card_index, int) else tuple(card_index)
        indices = {gpu.index for gpu in self._topology.gpus}
        unknown = [c for c in cards if c not in indices]
        if not cards or unknown:
            raise ValueError(f"no such card(s) {unknown or 'given'}; this node has {sorted(indices)}")
        if pattern not in PATTERNS:
            raise ValueError(f"unknown usage pattern {pattern!r}; choose one of {', '.join(PATTERNS)}")
        if (pattern == "measured") != (probe is not None):
            raise ValueError("the measured pattern, and only it, takes a probe of the real process")
        if memory_limit_mib <= 0 or not 0 < cores_limit <= 100:
            raise ValueError(
                f"limits must be positive (memory {memory_limit_mib} MiB, cores {cores_limit} % of 1-100)"
            )
        with self._lock:
            if pid in self._processes:
                raise ValueError(f"process {pid} is already running")
            slices: tuple[str, ...] = ()
            if mig_device is not None:
                found = [s for s in self._slices.get(cards[0], ()) if s.uuid == mig_device]
                if len(cards) != 1 or not found:
                    raise ValueError(f"no MIG device {mig_device} on card {cards[0]}")
                slices = (mig_device,)
                memory_limit_mib = min(memory_limit_mib, found[0].memory_mib)
                cores_limit = min(cores_limit, found[0].cores)
            namespace_pid = pid
            if pid_namespace != HOST_PID_NAMESPACE:
                namespace_pid = self._namespace_pids[pid_namespace] = self._namespace_pids.get(pid_namespace, 0) + 1
            self._processes[pid] = _Process(
                pid=pid, cards=cards, memory_limit_mib=min(memory_limit_mib, self._memory_mib),
                cores_limit=cores_limit, pattern=pattern, started_at=self._clock(), slices=slices,
                probe=probe, pid_namespace=pid_namespace, namespace_pid=namespace_pid,
            )

    def stop_process(self, pid: int) -> bool:
        """The process exits; False when it was not running."""
        with self._lock:
            return self._processes.pop(pid, None) is not None

    def set_usage(self, pid: int, memory_mib: int | None, utilization: float | None) -> None:
        """Pin a process's usage (per card); None returns that value to the pattern.

        Pinned values are not clamped to the process's limits: with enforcement ``none``
        nothing stops a process from going over its share, and that must be visible.
        """
        with self._lock:
            proc = self._processes.get(pid)
            if proc is None:
                raise KeyError(f"process {pid} is not running")
            proc.pinned_memory_mib = None if memory_mib is None else max(0, int(memory_mib))
            proc.pinned_utilization = None if utilization is None else max(0.0, min(100.0, float(utilization)))

    def process_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._processes)

    def inject_xid(self, card_index: int, xid: int) -> None:
        """An XID on a card. Application XIDs are reported and leave the card healthy."""
        self._check_card(card_index)
        reason = describe_xid(xid)
        with self._lock:
            if xid not in APPLICATION_XIDS:
                self._failed[card_index] = reason
            healthy = card_index not in self._failed and card_index not in self._lost and card_index not in self._mig
        self._events.put(HealthEvent(card_index, self._uuid(card_index), healthy, reason))

    def set_mig_mode(self, card_index: int, current: bool, pending: bool | None = None) -> None:
        """Turn MIG mode on or off for a card (``pending`` defaults to ``current``, as after a reset).

        Like the NVML backend, the inventory then keeps the card out of sharing and says why.
        """
        self._check_card(card_index)
        with self._lock:
            mode = (current, current if pending is None else pending)
            if any(mode):
                self._mig[card_index] = mode
            else:
                self._mig.pop(card_index, None)
            if not mode[0]:
                self._slices.pop(card_index, None)

    def set_mig_layout(self, card_index: int, layout: Sequence[str]) -> tuple[MigSlice, ...]:
        """The admin (re)partitions a card: MIG mode on, GPU instances of these profiles (names from
        NVIDIA's table for this model, ``core.mig.GEOMETRIES``), one compute instance each.

        ValueError when the model has no MIG, the layout cannot exist on it, or a process still
        runs on a card whose layout changes (the driver refuses to destroy an instance in use).
        A health event (card still unhealthy as a whole card) tells the node daemon to re-read.
        """
        from jupyter_vgpu.core.mig import geometry_for, slices_of

        self._check_card(card_index)
        geometry = geometry_for(self._model, self._memory_mib)
        if geometry is None:
            raise ValueError(f"{self._model} has no MIG mode")
        card_uuid = self._uuid(card_index)
        made = slices_of(geometry, list(layout), card_uuid)
        with self._lock:
            self._layouts += 1  # fresh UUIDs per layout, as the driver gives new instances new UUIDs
            salt = _digest(f"{self._seed}:{card_uuid}:{self._layouts}").hex()[:8]
            made = tuple(replace(s, uuid=f"{s.uuid}-{salt}") for s in made)
            busy = sorted(p.pid for p in self._processes.values() if card_index in p.cards)
            if busy:
                raise ValueError(f"card {card_index} is in use by process(es) {busy}; its MIG layout cannot change")
            self._mig[card_index] = (True, True)
            self._slices[card_index] = made
        self._events.put(HealthEvent(card_index, card_uuid, False, f"MIG layout is now {' + '.join(layout) or 'empty'}"))
        return made

    def fail_slice(self, uuid: str, reason: str = "XID 48 (double-bit ECC error)") -> None:
        """A MIG device turns unhealthy (its card stays as it was)."""
        card = self._slice_card(uuid)
        with self._lock:
            self._slice_faults[uuid] = reason
        self._events.put(HealthEvent(card, self._uuid(card), False, f"{uuid}: {reason}"))

    def restore_slice(self, uuid: str) -> None:
        card = self._slice_card(uuid)
        with self._lock:
            self._slice_faults.pop(uuid, None)
        self._events.put(HealthEvent(card, self._uuid(card), False, f"{uuid}: restored"))

    def _slice_card(self, uuid: str) -> int:
        with self._lock:
            for card, layout in self._slices.items():
                if any(s.uuid == uuid for s in layout):
                    return card
        raise ValueError(f"no MIG device {uuid} on this node")

    def lose_card(self, card_index: int) -> None:
        """The card falls off the bus: unhealthy, and its processes vanish from samples."""
        self._check_card(card_index)
        with self._lock:
            self._lost.add(card_index)
        self._events.put(HealthEvent(card_index, self._uuid(card_index), False,
                                     "card lost (" + describe_xid(79) + ")"))

    def restore_card(self, card_index: int) -> None:
        """The card is back (reset or replaced) and healthy again."""
        self._check_card(card_index)
        with self._lock:
            self._lost.discard(card_index)
            self._failed.pop(card_index, None)
        self._events.put(HealthEvent(card_index, self._uuid(card_index), True, "card restored"))

    # --- internals --------------------------------------------------------------------

    def _check_card(self, card_index: int) -> None:
        if not any(gpu.index == card_index for gpu in self._topology.gpus):
            raise ValueError(f"no card {card_index} on this node")

    def _uuid(self, card_index: int) -> str:
        for i, gpu in enumerate(self._topology.gpus):
            if gpu.index == card_index:
                return self._uuids[i]
        raise ValueError(f"no card {card_index} on this node")

    def _usage(self, proc: _Process, card: int, now: float) -> tuple[int, float]:
        """(memory MiB, utilization % of the card) of a process on one card at time ``now``."""
        key = f"{self._seed}:{proc.pid}:{card}"
        limit_mem, limit_util = proc.memory_limit_mib, float(proc.cores_limit)
        if proc.pattern == "training":
            util = limit_util * (0.85 + 0.15 * _smooth(key + ":u", now, 3.0))
            mem_fraction = 0.88 + 0.08 * _smooth(key + ":m", now, 60.0)
        elif proc.pattern == "idle":
            util = 0.0
            mem_fraction = min(1.0, 300.0 / limit_mem)
        else:  # notebook: bursts of work between think time; memory held between cells
            busy = _smooth(key + ":b", now, 20.0)
            if busy > 0.45:
                util = limit_util * (0.55 + 0.45 * _smooth(key + ":u", now, 4.0))
            else:
                util = limit_util * 0.04 * _smooth(key + ":u", now, 4.0)
            mem_fraction = 0.2 + 0.6 * _smooth(key + ":m", now, 90.0)
        warmup = min(1.0, max(0.0, (now - proc.started_at) / _WARMUP_SECONDS))
        memory = int(limit_mem * mem_fraction * (0.3 + 0.7 * warmup))
        if proc.probe is not None:  # measured: what the real process does, scaled into its share
            util, memory = self._measured(proc, now)
        if proc.pinned_memory_mib is not None:
            memory = proc.pinned_memory_mib
        if proc.pinned_utilization is not None:
            util = proc.pinned_utilization
        return min(memory, self._memory_mib), round(min(util, 100.0), 1)

    def _measured(self, proc: _Process, now: float) -> tuple[float, int]:
        """(utilisation % of the card, memory MiB) of a measured process: its CPU rate since the
        previous reading (one busy core = the whole share) and its resident memory, both capped."""
        assert proc.probe is not None
        reading = proc.probe()
        with self._lock:
            last = proc.measured
            if reading is None:  # the process is gone: nothing runs on the card
                proc.measured = (now, last[1] if last else 0.0, 0.0, 0)
                return 0.0, 0
            cpu, rss = float(reading[0]), max(0, int(reading[1]))
            memory = min(proc.memory_limit_mib, rss // (1024 * 1024))
            if last is None:
                proc.measured = (now, cpu, 0.0, memory)
                return 0.0, memory
            elapsed = now - last[0]
            if elapsed < _RATE_WINDOW_SECONDS:
                return last[2], memory
            rate = min(1.0, max(0.0, (cpu - last[1]) / elapsed))
            util = proc.cores_limit * rate
            proc.measured = (now, cpu, util, memory)
            return util, memory


class PidNamespaceView:
    """A ``SimulatedGPUs`` as read from one PID namespace: the same driver, cards and health events;
    ``sample()`` lists only the processes whose PID exists there. Anything else is the driver's."""

    def __init__(self, gpus: SimulatedGPUs, pid_namespace: str) -> None:
        self.gpus = gpus
        self.pid_namespace = pid_namespace
        self.name = gpus.name

    def available(self) -> bool:
        return self.gpus.available()

    def problem(self) -> str | None:
        return self.gpus.problem()

    def driver_version(self) -> str | None:
        return self.gpus.driver_version()

    def inventory(self) -> list[Card]:
        return self.gpus.inventory()

    def topology(self) -> Topology | None:
        return self.gpus.topology()

    def sample(self) -> Sample:
        return self.gpus.sample_from(self.pid_namespace)

    def next_health_event(self, timeout: float) -> HealthEvent | None:
        return self.gpus.next_health_event(timeout)

    def close(self) -> None:
        self.gpus.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.gpus, name)


def _visible(samples: list[ProcessSample], processes: dict[int, _Process], pid_namespace: str) -> list[ProcessSample]:
    """What the driver tells a caller in ``pid_namespace``: the host's sees every process by its host
    PID; any other sees its own processes by their PIDs there, and no one else's."""
    if pid_namespace == HOST_PID_NAMESPACE:
        return list(samples)
    return [replace(p, pid=processes[p.pid].namespace_pid) for p in samples
            if processes[p.pid].pid_namespace == pid_namespace]


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def _noise(key: str, step: int) -> float:
    """Deterministic value in [0, 1) for (key, step)."""
    return int.from_bytes(_digest(f"{key}:{step}")[:8], "big") / 2**64


def _smooth(key: str, now: float, period: float) -> float:
    """Value noise in [0, 1): cosine-interpolated between per-period random points."""
    position = now / period
    step = math.floor(position)
    frac = position - step
    a, b = _noise(key, step), _noise(key, step + 1)
    weight = (1 - math.cos(math.pi * frac)) / 2
    return a + (b - a) * weight
