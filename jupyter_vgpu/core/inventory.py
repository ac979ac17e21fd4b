"""A node's GPU inventory: its cards and topology, as published in the node annotation."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from jupyter_vgpu.core.contract import MEMORY_UNIT_MIB
from jupyter_vgpu.core.mig import MigSlice
from jupyter_vgpu.core.topology import Topology, TopologyError

INVENTORY_VERSION = 1


@dataclass(frozen=True)
class Card:
    index: int
    uuid: str
    model: str
    memory_mib: int
    minor: int | None = None
    bus_id: str | None = None
    numa: int | None = None
    healthy: bool = True
    mig: bool = False
    """MIG mode is on (or pending) on this card."""
    unavailable: str | None = None
    """Why a card that is not faulty is still kept out of sharing (MIG mode); such a card is
    published with ``healthy`` false too, so readers that know only ``healthy`` skip it."""
    slices: tuple[MigSlice, ...] = ()
    """The MIG devices the admin created on a card in MIG mode (``core.mig``); placed by
    ``core.mig_placement``, never by time-shared placement."""

    def __post_init__(self) -> None:
        uuids = [s.uuid for s in self.slices]
        if len(set(uuids)) != len(uuids):
            raise ValueError(f"card {self.index}: MIG device UUIDs repeat")
        if self.slices and not self.mig:
            raise ValueError(f"card {self.index}: MIG slices on a card that is not in MIG mode")

    @property
    def memory_units(self) -> int:
        """Whole vcuda-memory units (256 MiB) the card advertises."""
        return self.memory_mib // MEMORY_UNIT_MIB

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "index": self.index,
            "uuid": self.uuid,
            "model": self.model,
            "memoryMib": self.memory_mib,
            "minor": self.minor,
            "busId": self.bus_id,
            "numa": self.numa,
            "healthy": self.healthy,
        }
        # written only when set: the annotation of a node without MIG stays as it was
        if self.mig:
            data["mig"] = True
        if self.unavailable is not None:
            data["unavailable"] = self.unavailable
        if self.slices:
            data["slices"] = [s.to_dict() for s in self.slices]
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "card") -> Card:
        if not isinstance(data, dict):
            raise ValueError(f"{where} is not an object")
        try:
            return cls(
                index=_int(data["index"], f"{where}.index", minimum=0),
                uuid=_str(data["uuid"], f"{where}.uuid"),
                model=_str(data["model"], f"{where}.model"),
                memory_mib=_int(data["memoryMib"], f"{where}.memoryMib", minimum=0),
                minor=_opt_int(data.get("minor"), f"{where}.minor"),
                bus_id=_opt_str(data.get("busId"), f"{where}.busId"),
                numa=_opt_int(data.get("numa"), f"{where}.numa"),
                healthy=_bool(data.get("healthy", True), f"{where}.healthy"),
                mig=_bool(data.get("mig", False), f"{where}.mig"),
                unavailable=_opt_str(data.get("unavailable"), f"{where}.unavailable"),
                slices=_slices(data.get("slices"), f"{where}.slices"),
            )
        except KeyError as error:
            raise ValueError(f"{where} lacks {error.args[0]!r}") from None


@dataclass(frozen=True)
class NodeInventory:
    """What a node's device plugin knows about its GPUs.

    ``problem`` says why a node has no usable GPUs ("no NVIDIA driver: ...", "no GPUs");
    it is None when all is well.
    """

    node: str
    cards: tuple[Card, ...]
    topology: Topology | None
    driver: str | None = None
    problem: str | None = None
    version: int = INVENTORY_VERSION

    def __post_init__(self) -> None:
        indices = [card.index for card in self.cards]
        if len(set(indices)) != len(indices):
            raise ValueError(f"node {self.node}: card indices repeat: {indices}")
        if self.topology is not None and self.topology.count != len(self.cards):
            raise ValueError(
                f"node {self.node}: topology has {self.topology.count} cards but the inventory {len(self.cards)}"
            )
        if self.topology is not None and sorted(indices) != list(range(len(indices))):
            raise ValueError(f"node {self.node}: with a topology, card indices must be 0..{len(indices) - 1}: {indices}")

    def card(self, index: int) -> Card | None:
        return next((card for card in self.cards if card.index == index), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "node": self.node,
            "driver": self.driver,
            "problem": self.problem,
            "cards": [card.to_dict() for card in self.cards],
            "topology": self.topology.to_dict() if self.topology is not None else None,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> NodeInventory:
        """Parse a node annotation; ValueError saying what is wrong when it is malformed."""
        try:
            data = json.loads(text)
        except (TypeError, json.JSONDecodeError, RecursionError) as error:  # nested past the reader's depth too
            raise ValueError(f"GPU inventory is not JSON: {error}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> NodeInventory:
        if not isinstance(data, dict):
            raise ValueError("GPU inventory is not a JSON object")
        version = data.get("version", INVENTORY_VERSION)
        if version != INVENTORY_VERSION:
            raise ValueError(f"GPU inventory version {version!r} is not supported (expected {INVENTORY_VERSION})")
        if "node" not in data or "cards" not in data:
            raise ValueError("GPU inventory lacks 'node' or 'cards'")
        raw_cards = data["cards"]
        if not isinstance(raw_cards, list):
            raise ValueError("GPU inventory 'cards' is not a list")
        cards = tuple(Card.from_dict(item, f"cards[{i}]") for i, item in enumerate(raw_cards))
        raw_topology = data.get("topology")
        try:
            topology = Topology.from_dict(raw_topology) if raw_topology is not None else None
        except TopologyError as error:
            raise ValueError(f"GPU inventory topology: {error}") from None
        return cls(
            node=_str(data["node"], "node"),
            cards=cards,
            topology=topology,
            driver=_opt_str(data.get("driver"), "driver"),
            problem=_opt_str(data.get("problem"), "problem"),
            version=INVENTORY_VERSION,
        )


def _slices(value: Any, what: str) -> tuple[MigSlice, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > 64:
        raise ValueError(f"{what} is not a list of at most 64 slices")
    return tuple(MigSlice.from_dict(item, f"{what}[{i}]") for i, item in enumerate(value))


def _int(value: Any, what: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} {value!r} is not an integer")
    if minimum is not None and value < minimum:
        raise ValueError(f"{what} {value!r} is below {minimum}")
    return value


def _opt_int(value: Any, what: str) -> int | None:
    return None if value is None else _int(value, what)


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} {value!r} is not a string")
    return value


def _opt_str(value: Any, what: str) -> str | None:
    return None if value is None else _str(value, what)


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what} {value!r} is not true or false")
    return value
