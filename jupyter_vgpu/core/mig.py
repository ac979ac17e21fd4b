"""MIG slices as a resource: NVIDIA's profile tables, one slice, and the admin's sharing modes. Pure, stdlib.

A MIG slice (one MIG device: a compute instance inside a GPU instance) is a unit that is
held whole. A share request (cores 1-99, memory units) fits a slice when the slice's
compute fraction, expressed in vcuda-core (``100 * slices // card slices``, so a
``2g`` of 7 is 28), and its memory (whole 256 MiB units) are both at least what was
asked. The holder gets the whole slice; accounting shows the slice's real size.

This project does not partition cards: it serves the layout an admin made (nvidia-smi
mig, nvidia-mig-parted, the GPU Operator's MIG manager). The profile tables below (from
NVIDIA's MIG user guide, "Supported MIG Profiles") name the geometries the simulated
backend builds and check profile names; real sizes come from NVML.

Which cards serve what is the admin's choice, per node (``Names.gpu_sharing`` node
annotation) with per-card overrides; see ``SHARING_MODES``. A pod can ask for isolation
(``Names.isolation`` pod annotation, user input: it can only narrow where the pod goes).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jupyter_vgpu.core.contract import (
    CORES_PER_CARD,
    MEMORY_UNIT_MIB,
    Names,
    Request,
    RequestError,
    check_mig_device,
    format_mib,
)

# --- NVIDIA's profile tables ----------------------------------------------------------------


@dataclass(frozen=True)
class MigProfile:
    """One GPU instance profile of a card model."""

    name: str            # "2g.10gb", "1g.5gb+me"
    slices: int          # compute slices (of ``MigGeometry.slices``)
    memory_parts: int    # memory slices (of ``MigGeometry.memory_parts``)
    max_instances: int   # how many a card can hold at once


@dataclass(frozen=True)
class MigGeometry:
    """A card model's MIG geometry: compute slices, memory slices and profiles."""

    model: str
    memory_mib: int
    slices: int          # 7 (A100, H100) or 4 (A30)
    memory_parts: int    # 8 (A100, H100) or 4 (A30)
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile:
        for profile in self.profiles:
            if profile.name == name:
                return profile
        raise KeyError(f"{self.model} has no MIG profile {name!r} (it has {', '.join(p.name for p in self.profiles)})")

    def memory_of(self, profile: MigProfile) -> int:
        """The profile's memory in MiB, as its fraction of this card's memory."""
        return self.memory_mib * profile.memory_parts // self.memory_parts


def _sevenths(gb: int) -> tuple[MigProfile, ...]:
    """A100/H100 profiles; ``gb`` is the memory of one memory slice in the profile names (5 or 10)."""
    return (
        MigProfile(f"1g.{gb}gb", 1, 1, 7),
        MigProfile(f"1g.{gb}gb+me", 1, 1, 1),
        MigProfile(f"1g.{2 * gb}gb", 1, 2, 4),
        MigProfile(f"2g.{2 * gb}gb", 2, 2, 3),
        MigProfile(f"3g.{4 * gb}gb", 3, 4, 2),
        MigProfile(f"4g.{4 * gb}gb", 4, 4, 1),
        MigProfile(f"7g.{8 * gb}gb", 7, 8, 1),
    )


GEOMETRIES: dict[str, MigGeometry] = {
    "A100-SXM4-40GB": MigGeometry("A100-SXM4-40GB", 40 * 1024, 7, 8, _sevenths(5)),
    "A100-SXM4-80GB": MigGeometry("A100-SXM4-80GB", 80 * 1024, 7, 8, _sevenths(10)),
    "H100-80GB": MigGeometry("H100-80GB", 80 * 1024, 7, 8, _sevenths(10)),
    "A30-24GB": MigGeometry("A30-24GB", 24 * 1024, 4, 4, (
        MigProfile("1g.6gb", 1, 1, 4),
        MigProfile("1g.6gb+me", 1, 1, 1),
        MigProfile("2g.12gb", 2, 2, 2),
        MigProfile("2g.12gb+me", 2, 2, 1),
        MigProfile("4g.24gb", 4, 4, 1),
    )),
}


def geometry_for(model: str, memory_mib: int) -> MigGeometry | None:
    """The geometry of a card as NVML names it ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"), or None."""
    text = model.upper()
    family = "A30" if "A30" in text else "H100" if "H100" in text else "A100" if "A100" in text else None
    if family is None:
        return None
    candidates = [g for g in GEOMETRIES.values() if g.model.startswith(family)]
    return min(candidates, key=lambda g: abs(g.memory_mib - memory_mib))


_PROFILE_NAME = re.compile(r"^(?:([1-7])c\.)?([1-7])g\.([0-9]{1,4})gb(\+me)?\Z")


def check_profile_name(name: str) -> str:
    """The name if it reads like a MIG profile ("2g.10gb", "1g.5gb+me", "1c.3g.20gb"); ValueError otherwise."""
    if not _PROFILE_NAME.match(name):
        raise ValueError(f"{name!r} is not a MIG profile name (like '2g.10gb')")
    return name


# --- one slice --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MigSlice:
    """One MIG device of a card, as published in the node's inventory."""

    uuid: str             # "MIG-<uuid>": what NVIDIA_VISIBLE_DEVICES names
    profile: str          # "2g.10gb"
    gpu_instance: int
    compute_instance: int
    slices: int           # compute slices of this MIG device
    card_slices: int      # compute slices of the whole card (7, or 4 on an A30)
    memory_mib: int       # the GPU instance's memory
    healthy: bool = True
    memory_shared: bool = False
    """Its GPU instance holds other compute instances too: memory is shared, not isolated, so
    the slice is published but never placed."""

    def __post_init__(self) -> None:
        check_mig_device(self.uuid)
        check_profile_name(self.profile)
        if not 0 < self.slices <= self.card_slices <= 8:
            raise ValueError(f"slice {self.uuid}: {self.slices} of {self.card_slices} compute slices")
        if self.memory_mib <= 0:
            raise ValueError(f"slice {self.uuid}: memory {self.memory_mib} MiB")

    @property
    def cores(self) -> int:
        """The compute fraction in vcuda-core, rounded down (a request of more does not fit)."""
        return CORES_PER_CARD * self.slices // self.card_slices

    @property
    def memory_units(self) -> int:
        return self.memory_mib // MEMORY_UNIT_MIB

    @property
    def placeable(self) -> bool:
        return self.healthy and not self.memory_shared

    def fits(self, request: Request) -> bool:
        """Whether a share request fits this slice (whole cards never take a slice)."""
        return (self.placeable and request.is_share and self.cores >= request.cores
                and self.memory_units >= request.memory_units)

    def describe(self) -> str:
        return f"MIG {self.profile} ({self.cores} cores, {format_mib(self.memory_mib)})"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "uuid": self.uuid, "profile": self.profile, "gi": self.gpu_instance, "ci": self.compute_instance,
            "slices": self.slices, "cardSlices": self.card_slices, "memoryMib": self.memory_mib,
            "healthy": self.healthy,
        }
        if self.memory_shared:
            data["memoryShared"] = True
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "slice") -> MigSlice:
        if not isinstance(data, dict):
            raise ValueError(f"{where} is not an object")
        try:
            return cls(uuid=_str(data["uuid"], f"{where}.uuid"), profile=_str(data["profile"], f"{where}.profile"),
                       gpu_instance=_int(data["gi"], f"{where}.gi"), compute_instance=_int(data["ci"], f"{where}.ci"),
                       slices=_int(data["slices"], f"{where}.slices"),
                       card_slices=_int(data["cardSlices"], f"{where}.cardSlices"),
                       memory_mib=_int(data["memoryMib"], f"{where}.memoryMib"),
                       healthy=_bool(data.get("healthy", True), f"{where}.healthy"),
                       memory_shared=_bool(data.get("memoryShared", False), f"{where}.memoryShared"))
        except KeyError as error:
            raise ValueError(f"{where} lacks {error.args[0]!r}") from None
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None


def slices_of(geometry: MigGeometry, layout: Mapping[str, int] | list[str], card_uuid: str) -> tuple[MigSlice, ...]:
    """The slices of a card partitioned as ``layout`` (profile names, in GPU instance order).

    Raises ValueError when the layout cannot exist on this card: an unknown profile, more
    instances of a profile than the card holds, or more compute or memory slices in total.
    Used by the simulated backend; UUIDs are derived from the card's.
    """
    names = [n for n, k in layout.items() for _ in range(k)] if isinstance(layout, Mapping) else list(layout)
    profiles = [geometry.profile(n) for n in names]
    for profile in set(profiles):
        if profiles.count(profile) > profile.max_instances:
            raise ValueError(f"{geometry.model} holds at most {profile.max_instances} x {profile.name}")
    if sum(p.slices for p in profiles) > geometry.slices or sum(p.memory_parts for p in profiles) > geometry.memory_parts:
        raise ValueError(f"{' + '.join(names)} does not fit on one {geometry.model}")
    base = card_uuid.removeprefix("GPU-")
    return tuple(
        MigSlice(uuid=f"MIG-{base}-gi{i + 1}", profile=p.name, gpu_instance=i + 1, compute_instance=0,
                 slices=p.slices, card_slices=geometry.slices, memory_mib=geometry.memory_of(p))
        for i, p in enumerate(profiles)
    )


# --- the admin's sharing modes ----------------------------------------------------------------

ISOLATED = "isolated"
TIME_SHARED = "time-shared"
MIG_ONLY = "mig"
PREFER_MIG = "prefer-mig"
PREFER_TIME_SHARED = "prefer-time-shared"
SHARING_MODES = (ISOLATED, TIME_SHARED, MIG_ONLY, PREFER_MIG, PREFER_TIME_SHARED)
"""Per node or per card:

- ``isolated`` (the default): MIG slices serve only pods that ask for isolation; other
  share requests go on time-shared cards.
- ``time-shared``: MIG slices are not offered at all.
- ``mig``: share requests are served only by MIG slices (time-shared cards take none).
- ``prefer-mig`` / ``prefer-time-shared``: both serve every share request, the named one first.
"""

ISOLATION_MIG = "mig"
ISOLATION_VALUES = (ISOLATION_MIG, "none")


@dataclass(frozen=True)
class Sharing:
    """A node's sharing mode and per-card overrides, from ``Names.gpu_sharing``."""

    mode: str = ISOLATED
    cards: Mapping[int, str] = field(default_factory=dict)

    def of(self, card: int) -> str:
        return self.cards.get(card, self.mode)

    def slices_serve(self, card: int, isolated: bool) -> bool:
        """Whether this card's MIG slices may take a share request (isolated or not)."""
        mode = self.of(card)
        return mode != TIME_SHARED and (isolated or mode != ISOLATED)

    def time_shares_serve(self, card: int, isolated: bool) -> bool:
        """Whether this (non-MIG) card may take a time-shared share request."""
        return not isolated and self.of(card) != MIG_ONLY

    @property
    def prefers_slices(self) -> bool:
        """For requests that did not ask for isolation: try slices before time-shared cards."""
        return self.mode in (PREFER_MIG, MIG_ONLY)


def parse_sharing(text: str | None) -> Sharing:
    """``"prefer-mig"`` or ``"isolated; 0=mig, 3=time-shared"``; ValueError naming what is wrong.

    The annotation is the admin's (nodes are not writable by tenants); an empty or missing
    one is the default.
    """
    if text is None or not text.strip():
        return Sharing()
    head, _, rest = text.partition(";")
    mode = head.strip() or ISOLATED
    if mode not in SHARING_MODES:
        raise ValueError(f"GPU sharing mode {mode!r} is not one of {', '.join(SHARING_MODES)}")
    cards: dict[int, str] = {}
    for part in (p.strip() for p in rest.split(",")):
        if not part:
            continue
        index, eq, value = (s.strip() for s in part.partition("="))
        if not eq or not index.isdigit() or len(index) > 4 or value not in SHARING_MODES:
            raise ValueError(f"GPU sharing override {part!r} is not '<card index>=<mode>' with a mode of "
                             f"{', '.join(SHARING_MODES)}")
        cards[int(index)] = value
    return Sharing(mode, cards)


def read_sharing(node_annotations: Mapping[str, Any], names: Names) -> tuple[Sharing, str | None]:
    """A node's sharing, and a problem when its annotation is malformed (then the default applies)."""
    raw = node_annotations.get(names.gpu_sharing)
    try:
        return parse_sharing(raw if isinstance(raw, str) else None), None
    except ValueError as error:
        return Sharing(), f"{names.gpu_sharing} ignored: {error}"


def wants_isolation(pod_annotations: Mapping[str, Any], names: Names) -> bool:
    """Whether the pod asks to be placed only on a MIG slice; RequestError for a value we do not know.

    User input: it only narrows where the pod may go, never says which slice it holds.
    """
    raw = pod_annotations.get(names.isolation)
    if raw is None:
        return False
    if raw not in ISOLATION_VALUES:
        raise RequestError(f"annotation {names.isolation}={str(raw)[:40]!r} is not one of "
                           f"{', '.join(ISOLATION_VALUES)}")
    return bool(raw == ISOLATION_MIG)


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} {value!r} is not a non-negative integer")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} {value!r} is not a string")
    return value


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what} {value!r} is not true or false")
    return value
