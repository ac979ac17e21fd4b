"""Device IDs and device lists for the two resources.

A card advertises 100 ``vcuda-core`` devices and one ``vcuda-memory`` device per
256 MiB. Device IDs encode the card (``gpu<index>-core-<nn>``, ``gpu<index>-mem-<nnnn>``)
so any set of IDs kubelet hands over says which cards it came from.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from jupyter_vgpu.core.contract import CORES_PER_CARD

from . import api_pb2

if TYPE_CHECKING:
    from jupyter_vgpu.core.inventory import Card

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT_FILE = "kubelet_internal_checkpoint"
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

CORE = "core"
MEMORY = "memory"
KINDS = (CORE, MEMORY)
SOCKETS = {CORE: "vgpu-core.sock", MEMORY: "vgpu-memory.sock"}

_ID = re.compile(r"^gpu(\d+)-(core|mem)-(\d+)\Z")


def device_id(kind: str, card: int, number: int) -> str:
    if kind == CORE:
        return f"gpu{card}-core-{number:02d}"
    return f"gpu{card}-mem-{number:04d}"


@functools.lru_cache(maxsize=1 << 15)
def parse_device_id(text: str) -> tuple[str, int, int] | None:
    """(kind, card, number) for one of our IDs, None for anything else.

    Remembered (a pure function of the text): kubelet names every available ID in each
    GetPreferredAllocation, ~2,000 of them on an 8-card node, and the regex per ID was the
    node's largest CPU cost in the classroom storm. The cache is bounded, as the text comes from kubelet."""
    match = _ID.match(text)
    if not match:
        return None
    return (CORE if match.group(2) == "core" else MEMORY), int(match.group(1)), int(match.group(3))


@functools.lru_cache(maxsize=1 << 15)
def card_of(text: str) -> int | None:
    parsed = parse_device_id(text)
    return parsed[1] if parsed else None


def cards_in(ids: Iterable[str]) -> Counter[int]:
    """How many of the IDs sit on each card (IDs that are not ours are ignored)."""
    return Counter(card for card in (card_of(i) for i in ids) if card is not None)


def devices_per_card(kind: str, card: Card) -> int:
    """100 cores and all memory units; a card in MIG mode advertises what its slices hold together,
    so kubelet's count of a slice pod's request (never more than its slice) always finds room."""
    if card.mig:
        placeable = [s for s in card.slices if s.placeable]
        return sum(s.cores if kind == CORE else s.memory_units for s in placeable)
    return CORES_PER_CARD if kind == CORE else card.memory_units


def serves(card: Card) -> bool:
    """Whether the card's devices are Healthy: a healthy card, or a MIG card with healthy slices."""
    return card.healthy or (card.mig and any(s.placeable for s in card.slices))


def card_device_ids(kind: str, card: Card) -> list[str]:
    return [device_id(kind, card.index, n) for n in range(devices_per_card(kind, card))]


def device_list(kind: str, cards: Sequence[Card]) -> list[api_pb2.Device]:
    """Every device of every card, with the card's health and NUMA node."""
    devices = []
    for card in cards:
        health = HEALTHY if serves(card) else UNHEALTHY
        topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=card.numa)]) if card.numa is not None else None
        for device in card_device_ids(kind, card):
            devices.append(api_pb2.Device(ID=device, health=health, topology=topology))
    return devices


def minor_mismatches(cards: Sequence[Card]) -> list[str]:
    """Cards whose NVML index differs from their /dev/nvidia<minor> number, as "index 2 = /dev/nvidia5".

    ``predicate-gpu-idx-<i>`` holds NVML indices wherever this device plugin runs; TKEStack
    gpu-manager reads the same key as a minor number. Both agree only where these match.
    """
    return [f"index {card.index} = /dev/nvidia{card.minor}" for card in cards
            if card.minor is not None and card.minor != card.index]
