"""The node's view of a card in MIG mode on the NVML backend (tests/gpu's stand-in pynvml): a slice
that stops answering shows as unavailable without re-reading the inventory every period, and a
layout the admin changes at run time reaches the topology at the next sample."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from metrics_support import NODE, FakeNode, put_on_slice
from vgpu_plugin.metrics.api import Caller, topology_view
from vgpu_plugin.metrics.sampler import Sampler

from jupyter_vgpu.core.inventory import Card
from jupyter_vgpu.gpu.nvml import NVMLBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import fake_pynvml  # noqa: E402


class CountingNVML(NVMLBackend):
    """The real NVML backend, counting how often the sampler re-reads its inventory."""

    reads = 0

    def inventory(self) -> list[Card]:
        self.reads += 1
        return super().inventory()


def slices_seen(sampler: Sampler, pod: dict[str, Any]) -> tuple[bool, list[tuple[str, str]]]:
    snapshot = sampler.sample_once()
    entry = snapshot.pods.by_uid(pod["metadata"]["uid"])
    assert entry is not None
    card = next(g for g in topology_view(snapshot, Caller(entry, 0), 0.0)["gpus"] if g["index"] == 0)
    return card["healthy"], [(s["profile"], s["state"]) for s in card.get("migSlices", [])]


def test_a_failing_slice_and_a_new_layout_reach_the_topology(fake_node: FakeNode) -> None:
    cards = fake_pynvml.default_cards()
    cards[0].name, cards[0].total_mib = "NVIDIA A100-SXM4-40GB", 40960
    card = fake_pynvml.mig_layout(cards[0], [("2g.10gb", 2), ("2g.10gb", 2), ("1g.5gb", 1)])
    backend = CountingNVML(library=fake_pynvml.make_module(cards=cards))
    carol = fake_node.pod("jupyter-carol", {"notebook": (20, 32, (0,))})
    put_on_slice(carol, card.mig_devices[0].uuid)
    sampler = Sampler(NODE, backend, fake_node, proc_root=fake_node.proc_root)
    assert slices_seen(sampler, carol) == (True, [("2g.10gb", "mine"), ("2g.10gb", "free"), ("1g.5gb", "free")])

    card.mig_devices[1].broken = fake_pynvml.NVML_ERROR_UNINITIALIZED  # the slice stops answering
    reads = backend.reads
    for _ in range(3):
        assert slices_seen(sampler, carol) == (True, [("2g.10gb", "mine"), ("2g.10gb", "unavailable"),
                                                      ("1g.5gb", "free")])
    assert backend.reads == reads + 1  # re-read once for the new state, not every period

    card.mig_devices[1].broken = None
    fake_pynvml.mig_layout(card, [("3g.20gb", 3), ("3g.20gb", 3)])  # the admin re-partitions
    assert slices_seen(sampler, carol) == (True, [("3g.20gb", "free"), ("3g.20gb", "free")])
    event = backend.next_health_event(0)
    assert event is not None and event.reason == "MIG layout changed: 2g.10gb + 2g.10gb + 1g.5gb -> 3g.20gb + 3g.20gb"
