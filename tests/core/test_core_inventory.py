"""NodeInventory: the node annotation's JSON, round trip and refusal of malformed input."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from jupyter_vgpu.core.inventory import Card, NodeInventory
from jupyter_vgpu.core.topology import Topology


def p40_inventory(topology_of: Callable[[str], Topology]) -> NodeInventory:
    topo = topology_of("p40-7gpu-pix-phb.txt")
    cards = tuple(
        Card(i, f"GPU-{i:08d}-aaaa-bbbb-cccc-000000000000", "Tesla P40", 24451, minor=i,
             bus_id=f"00000000:{0x04 + i:02X}:00.0", numa=0, healthy=i != 5)
        for i in range(7)
    )
    return NodeInventory("gpu-node-1", cards, topo, driver="535.104.05")


def test_round_trip_keeps_everything(topology_of: Callable[[str], Topology]) -> None:
    inventory = p40_inventory(topology_of)
    text = inventory.to_json()
    again = NodeInventory.from_json(text)
    assert again == inventory
    assert again.to_json() == text
    data = json.loads(text)
    assert data["version"] == 1 and data["node"] == "gpu-node-1"
    assert data["cards"][5] == {
        "index": 5, "uuid": "GPU-00000005-aaaa-bbbb-cccc-000000000000", "model": "Tesla P40", "memoryMib": 24451,
        "minor": 5, "busId": "00000000:09:00.0", "numa": 0, "healthy": False,
    }
    assert data["topology"]["links"][0][1] == "PIX"
    assert inventory.card(3) is not None and inventory.card(3).memory_units == 24451 // 256
    assert inventory.card(9) is None


def test_node_without_gpus_says_why() -> None:
    inventory = NodeInventory("cpu-node", (), None, problem="no NVIDIA driver: libnvidia-ml.so.1 not found")
    again = NodeInventory.from_json(inventory.to_json())
    assert again.problem == "no NVIDIA driver: libnvidia-ml.so.1 not found"
    assert again.cards == () and again.topology is None and again.driver is None


GOOD_CARD = {"index": 0, "uuid": "GPU-1", "model": "A100", "memoryMib": 40960}


@pytest.mark.parametrize(("text", "pattern"), [
    ("", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({"version": 2, "node": "n", "cards": []}), "version 2 is not supported"),
    (json.dumps({"node": "n"}), "lacks 'node' or 'cards'"),
    (json.dumps({"node": "n", "cards": {}}), "'cards' is not a list"),
    (json.dumps({"node": "n", "cards": [{"index": 0}]}), r"cards\[0\] lacks 'uuid'"),
    (json.dumps({"node": "n", "cards": [dict(GOOD_CARD, memoryMib="40GiB")]}), r"cards\[0\].memoryMib '40GiB' is not an integer"),
    (json.dumps({"node": "n", "cards": [dict(GOOD_CARD, index=-1)]}), r"cards\[0\].index -1 is below 0"),
    (json.dumps({"node": "n", "cards": [dict(GOOD_CARD, healthy="yes")]}), r"cards\[0\].healthy 'yes' is not true or false"),
    (json.dumps({"node": "n", "cards": [GOOD_CARD, GOOD_CARD]}), "card indices repeat"),
    (json.dumps({"node": "n", "cards": [GOOD_CARD], "topology": {"gpus": [], "links": []}}),
     "topology has 0 cards but the inventory 1"),
    (json.dumps({"node": "n", "cards": [GOOD_CARD], "topology": {"gpus": [{"index": 0}], "links": [["PIX"]]}}),
     "GPU inventory topology: .*'X' belongs on the diagonal"),
    (json.dumps({"node": 7, "cards": []}), "node 7 is not a string"),
    (json.dumps({"node": "n", "cards": [dict(GOOD_CARD, index=1)],
                 "topology": {"gpus": [{"index": 0}], "links": [["X"]]}}), r"card indices must be 0\.\.0: \[1\]"),
])
def test_malformed_annotations_are_refused_with_the_reason(text: str, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        NodeInventory.from_json(text)


def test_a_mig_card_carries_its_reason_and_older_annotations_still_read() -> None:
    reason = "MIG mode is enabled; MIG partitions are not shared by jupyter-vgpu"
    mig = Card(0, "GPU-0", "A100", 40960, healthy=False, mig=True, unavailable=reason)
    inventory = NodeInventory("n", (mig, Card(1, "GPU-1", "A100", 40960)), None)
    data = json.loads(inventory.to_json())
    assert data["cards"][0]["mig"] is True and data["cards"][0]["unavailable"] == reason
    assert data["cards"][0]["healthy"] is False, "readers that know only 'healthy' must skip it too"
    assert "mig" not in data["cards"][1] and "unavailable" not in data["cards"][1]
    assert NodeInventory.from_json(inventory.to_json()) == inventory
    older = NodeInventory.from_json(json.dumps({"node": "n", "cards": [GOOD_CARD]}))
    assert older.cards[0].mig is False and older.cards[0].unavailable is None


@pytest.mark.parametrize(("field", "value", "message"), [
    ("mig", "yes", r"cards\[0\].mig 'yes' is not true or false"),
    ("unavailable", 5, r"cards\[0\].unavailable 5 is not a string"),
])
def test_malformed_mig_fields_are_refused(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NodeInventory.from_json(json.dumps({"node": "n", "cards": [dict(GOOD_CARD, **{field: value})]}))
