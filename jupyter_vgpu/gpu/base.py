"""The GPU backend interface shared by the NVML and the simulated backend.

Everything above this layer (device plugin, metrics sampler, notebook fact sources)
talks to a ``GPUBackend`` and never to NVML directly, so the simulated cluster runs
the same node code as a real GPU node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from jupyter_vgpu.core.inventory import Card, NodeInventory
    from jupyter_vgpu.core.topology import Topology


class GPUError(RuntimeError):
    """A GPU query failed (driver gone, card lost); the message says which card and why."""


# XIDs caused by the application running on the card (bad kernel, page fault in user
# code, ...). They are reported but leave the card healthy, as NVIDIA's device plugin does.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

XID_DESCRIPTIONS = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping",
    64: "ECC page retirement or row remapper failure",
    68: "NVDEC0 exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def mig_reason(current: bool, pending: bool) -> str | None:
    """Why a card in MIG mode (now, or after its next reset) is kept out of sharing; None otherwise."""
    if current:
        return "MIG mode is enabled; the card is served only as its MIG slices, never time-shared"
    if pending:
        return ("MIG mode is pending (enabled at the card's next reset); the card is neither time-shared "
                "nor served as slices until then")
    return None


def describe_xid(xid: int) -> str:
    """'XID 79 (GPU has fallen off the bus)'."""
    what = XID_DESCRIPTIONS.get(xid, "critical error")
    return f"XID {xid} ({what})"


@dataclass
class CardSample:
    index: int
    uuid: str
    memory_used_mib: int
    memory_total_mib: int
    utilization_percent: float
    healthy: bool = True


@dataclass
class ProcessSample:
    pid: int
    card_index: int
    uuid: str
    memory_used_mib: int
    utilization_percent: float  # of the whole card, as NVML's smUtil
    mig_device: str | None = None  # the MIG device (``MIG-...``) it runs on, on a card in MIG mode


@dataclass
class SliceSample:
    """One MIG device's memory; utilisation per MIG device is not available from NVML (it needs
    DCGM, or the GPM API on Hopper and newer drivers), so it is None, never a made-up 0."""

    card_index: int
    uuid: str  # "MIG-..."
    memory_used_mib: int
    memory_total_mib: int
    utilization_percent: float | None = None
    healthy: bool = True


@dataclass
class Sample:
    taken_at: float  # unix seconds
    cards: list[CardSample] = field(default_factory=list)
    processes: list[ProcessSample] = field(default_factory=list)
    slices: list[SliceSample] = field(default_factory=list)


@dataclass
class HealthEvent:
    card_index: int
    uuid: str
    healthy: bool  # the card's health after this event
    reason: str  # e.g. "XID 79 (GPU has fallen off the bus)"


@runtime_checkable
class GPUBackend(Protocol):
    """One node's GPUs.

    ``inventory()`` is cheap after the first call and its ``Card.healthy`` reflects every
    health event seen so far. ``next_health_event`` has one consumer (the node daemon's
    health watcher); everyone else reads health from ``inventory()`` or ``sample()``.
    """

    name: str

    def available(self) -> bool: ...

    def problem(self) -> str | None: ...

    def driver_version(self) -> str | None: ...

    def inventory(self) -> list[Card]: ...

    def topology(self) -> Topology | None: ...

    def sample(self) -> Sample: ...

    def next_health_event(self, timeout: float) -> HealthEvent | None: ...

    def close(self) -> None: ...


def node_inventory(backend: GPUBackend, node: str) -> NodeInventory:
    """The Node annotation's content for this backend: cards, topology, or the reason there are none."""
    from jupyter_vgpu.core.inventory import NodeInventory

    if not backend.available():
        return NodeInventory(
            node=node, cards=(), topology=None, driver=backend.driver_version(),
            problem=backend.problem() or "no GPUs",
        )
    cards = tuple(backend.inventory())
    return NodeInventory(
        node=node,
        cards=cards,
        topology=backend.topology() if cards else None,
        driver=backend.driver_version(),
        problem=None if cards else "no GPUs",
    )
