"""The served ledger: which container kubelet admitted with which device IDs, and what it was given.

Plain data with read-only questions; who changes it is the allocator shell (at Allocate)
and the reconciliation plan (``reconcile.py``, on a copy it hands back).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from jupyter_vgpu.core.contract import ContainerAllocation

from .devices import CORE, MEMORY
from .pods import Wanted

Key = tuple[str, int]  # (pod UID, container index)


@dataclass
class Served:
    key: Key
    namespace: str
    pod: str
    container: str
    allocation: ContainerAllocation  # its allocation_id only once kubelet's checkpoint confirmed it
    devices: dict[str, tuple[str, ...]] = field(default_factory=dict)  # kind -> device IDs
    identity_uid: str = ""  # whose identity the container's env carries (normally its own pod)
    since: float = field(default_factory=time.monotonic)
    answered_at: float = 0.0  # when its vcuda-core answer was given (monotonic); 0: before this process
    # its vcuda-core answer was a guess among several containers kubelet could have been admitting,
    # until kubelet's checkpoint confirms who holds it
    guessed: bool = False


@dataclass
class Ledger:
    served: dict[Key, Served] = field(default_factory=dict)
    # placements moved to a container not admitted yet (the answer prepared for it went to another)
    overrides: dict[Key, ContainerAllocation] = field(default_factory=dict)
    # core IDs -> what that answer gave (with the answer's allocation id) and whom it was prepared for
    given: dict[tuple[str, ...], tuple[ContainerAllocation, Key]] = field(default_factory=dict)

    def copy(self) -> Ledger:
        """An independent copy: changing it, or its Served records, leaves this one as it was."""
        return Ledger(served={k: replace(s, devices=dict(s.devices)) for k, s in self.served.items()},
                      overrides=dict(self.overrides), given=dict(self.given))

    def served_kind(self, key: Key, kind: str) -> bool:
        served = self.served.get(key)
        return served is not None and kind in served.devices

    def started_pods(self) -> set[str]:
        """The UIDs of the pods with a container in the ledger (asked once per decision, not per pod)."""
        return {key[0] for key in self.served}

    def container_complete(self, wanted: Wanted) -> bool:
        served = self.served.get((wanted.uid, wanted.index))
        if served is None or CORE not in served.devices:
            return False
        return wanted.request.memory_units == 0 or MEMORY in served.devices

    def slice_holder(self, device: str, *, besides: Key | None = None) -> str | None:
        """Who holds the MIG slice among admitted containers other than ``besides`` ("ns/pod container"), or None."""
        for served in self.served.values():
            if served.key == besides or CORE not in served.devices:
                continue
            if any(held.mig_device == device for held in served.allocation.cards):
                return f"{served.namespace}/{served.pod} {served.container}"
        return None

    def used_on(self, card: int, *, besides: Key | None = None) -> tuple[int, int]:
        """(cores, memory units) of the card given out to admitted containers other than ``besides``."""
        cores = units = 0
        for served in self.served.values():
            if served.key == besides or CORE not in served.devices:
                continue
            for held in served.allocation.cards:
                if held.index == card:
                    cores += held.cores
                    units += held.memory_units
        return cores, units

    def usage(self) -> dict[int, tuple[int, int]]:
        """Card -> (cores, memory units) given out to admitted containers."""
        used: dict[int, tuple[int, int]] = {}
        for served in self.served.values():
            if CORE not in served.devices:
                continue
            for share in served.allocation.cards:
                cores, units = used.get(share.index, (0, 0))
                used[share.index] = (cores + share.cores, units + share.memory_units)
        return used

    def drop_devices(self, key: Key, kind: str) -> None:
        """The container does not hold these devices after all; a record holding nothing goes."""
        served = self.served.get(key)
        if served is None:
            return
        served.devices.pop(kind, None)
        if not served.devices:
            del self.served[key]


def same_cards(a: ContainerAllocation, b: ContainerAllocation) -> bool:
    return sorted((s.index, s.cores, s.memory_units, s.mig_device) for s in a.cards) == \
        sorted((s.index, s.cores, s.memory_units, s.mig_device) for s in b.cards)
