"""The simulated backend's MIG: NVIDIA's geometries, a mixed node, layout changes at run time, faults."""

from __future__ import annotations

import pytest

from jupyter_vgpu.core.inventory import NodeInventory
from jupyter_vgpu.core.topology import TopoGPU, Topology
from jupyter_vgpu.gpu.base import node_inventory
from jupyter_vgpu.gpu.simulated import SimulatedGPUs


def four_cards(model: str = "NVIDIA A100-SXM4-40GB", memory: int = 40960) -> SimulatedGPUs:
    topology = Topology(tuple(TopoGPU(i, 0) for i in range(4)),
                        tuple(tuple("X" if a == b else "NODE" for b in range(4)) for a in range(4)))
    return SimulatedGPUs(topology, model=model, memory_mib=memory, clock=lambda: 1000.0)


def test_the_fixture_node_mixes_one_mig_card_with_whole_cards() -> None:
    gpus = four_cards()
    made = gpus.set_mig_layout(0, ["2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"])
    cards = gpus.inventory()
    assert cards[0].mig and not cards[0].healthy and cards[0].slices == made
    assert [s.profile for s in made] == ["2g.10gb"] * 3 + ["1g.5gb"]
    assert [(s.cores, s.memory_units) for s in made] == [(28, 40)] * 3 + [(14, 20)]
    assert all(c.healthy and not c.mig and not c.slices for c in cards[1:])
    published = NodeInventory.from_json(node_inventory(gpus, "n").to_json())
    assert published.cards[0].slices == made
    event = gpus.next_health_event(0)
    assert event is not None and event.card_index == 0 and "MIG layout" in event.reason


@pytest.mark.parametrize(("model", "memory", "layout"), [
    ("NVIDIA A100-SXM4-80GB", 81920, ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]),
    ("NVIDIA H100 80GB HBM3", 81920, ["4g.40gb", "3g.40gb"]),
    ("NVIDIA A30", 24576, ["2g.12gb", "1g.6gb", "1g.6gb"]),
])
def test_other_geometries(model: str, memory: int, layout: list[str]) -> None:
    gpus = four_cards(model, memory)
    assert [s.profile for s in gpus.set_mig_layout(2, layout)] == layout


def test_impossible_layouts_and_cards_without_mig_are_refused() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        four_cards().set_mig_layout(0, ["4g.20gb", "3g.20gb", "1g.5gb"])
    with pytest.raises(ValueError, match="no MIG"):
        four_cards("Tesla T4", 15360).set_mig_layout(0, ["1g.5gb"])


def test_layout_changes_at_run_time_give_new_uuids_and_refuse_while_in_use() -> None:
    gpus = four_cards()
    first = gpus.set_mig_layout(1, ["3g.20gb", "3g.20gb"])
    gpus.start_process(10, 1, 50_000, 100, mig_device=first[0].uuid)
    with pytest.raises(ValueError, match="in use"):
        gpus.set_mig_layout(1, ["7g.40gb"])
    gpus.stop_process(10)
    second = gpus.set_mig_layout(1, ["7g.40gb"])
    assert second[0].uuid not in {s.uuid for s in first}
    assert gpus.inventory()[1].slices == second
    gpus.set_mig_mode(1, False)
    assert gpus.inventory()[1].slices == () and gpus.inventory()[1].healthy


def test_processes_on_a_slice_are_sampled_within_it_and_utilisation_is_not_available() -> None:
    gpus = four_cards()
    two, _, _, one = gpus.set_mig_layout(0, ["2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"])
    gpus.start_process(20, 0, 99_999, 90, mig_device=one.uuid)
    gpus.set_usage(20, 4000, None)
    sample = gpus.sample()
    by_uuid = {s.uuid: s for s in sample.slices}
    assert by_uuid[one.uuid].memory_used_mib == 4000 and by_uuid[one.uuid].memory_total_mib == 5120
    assert by_uuid[two.uuid].memory_used_mib == 0
    assert all(s.utilization_percent is None for s in sample.slices)
    assert [(p.pid, p.mig_device) for p in sample.processes] == [(20, one.uuid)]
    with pytest.raises(ValueError, match="no MIG device"):
        gpus.start_process(21, 1, 1000, 10, mig_device=one.uuid)


def test_slice_faults_are_health_events_and_show_in_the_inventory() -> None:
    gpus = four_cards()
    made = gpus.set_mig_layout(0, ["3g.20gb", "3g.20gb"])
    gpus.next_health_event(0)
    gpus.fail_slice(made[1].uuid)
    event = gpus.next_health_event(0)
    assert event is not None and made[1].uuid in event.reason
    assert [s.healthy for s in gpus.inventory()[0].slices] == [True, False]
    assert [s.healthy for s in gpus.sample().slices] == [True, False]
    gpus.restore_slice(made[1].uuid)
    assert all(s.healthy for s in gpus.inventory()[0].slices)
    gpus.lose_card(0)
    assert not any(s.healthy for s in gpus.inventory()[0].slices)
    with pytest.raises(ValueError, match="no MIG device"):
        gpus.fail_slice("MIG-nope")
