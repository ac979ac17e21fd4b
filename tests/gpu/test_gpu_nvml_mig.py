"""MIG discovery through NVML: the stand-in pynvml speaks nvidia-ml-py's real MIG function names,
structures (c_nvmlDeviceAttributes, c_nvmlGpuInstanceProfileInfo[_v2]_t) and error codes."""

from __future__ import annotations

import fake_pynvml
import pynvml

from jupyter_vgpu.core.inventory import NodeInventory
from jupyter_vgpu.gpu.base import node_inventory
from jupyter_vgpu.gpu.nvml import NVMLBackend
from jupyter_vgpu.gpu.nvml_mig import read_slices


def a100_40(card: fake_pynvml.FakeCard) -> fake_pynvml.FakeCard:
    card.name, card.total_mib = "NVIDIA A100-SXM4-40GB", 40960
    return card


def test_the_stand_in_uses_nvidia_ml_pys_names_and_codes() -> None:
    for name in ("nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceId",
                 "nvmlDeviceGetComputeInstanceId", "nvmlDeviceGetAttributes", "nvmlDeviceGetGpuInstanceProfileInfo",
                 "nvmlDeviceGetMigMode", "nvmlDeviceIsMigDeviceHandle"):
        assert hasattr(pynvml, name), name
        assert hasattr(fake_pynvml.make_module(), name), name
    for code in ("NVML_ERROR_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_NOT_SUPPORTED",
                 "NVML_GPU_INSTANCE_PROFILE_COUNT", "NVML_DEVICE_MIG_ENABLE"):
        assert getattr(fake_pynvml, code) == getattr(pynvml, code), code


def test_the_fixture_layout_is_discovered() -> None:
    cards = fake_pynvml.default_cards()
    fake_pynvml.mig_layout(a100_40(cards[1]), [("2g.10gb", 2), ("2g.10gb", 2), ("2g.10gb", 2), ("1g.5gb", 1)])
    cards[1].mig_devices[3].slot = 5          # indices need not be dense: 3 and 4 are NOT_FOUND
    backend = NVMLBackend(library=fake_pynvml.make_module(cards=cards))
    card = backend.inventory()[1]
    assert card.mig and not card.healthy
    assert [s.profile for s in card.slices] == ["2g.10gb"] * 3 + ["1g.5gb"]
    two = card.slices[0]
    assert two.uuid.startswith("MIG-") and (two.gpu_instance, two.compute_instance) == (1, 0)
    assert (two.slices, two.card_slices, two.memory_mib) == (2, 7, 9984)   # NVML's real size, not the name's
    assert (two.cores, two.memory_units) == (28, 39)
    assert all(not s.memory_shared for s in card.slices)
    assert all(c.slices == () for i, c in enumerate(backend.inventory()) if i != 1)
    published = NodeInventory.from_json(node_inventory(backend, "n").to_json())
    assert published.cards[1].slices == card.slices


def test_profile_names_without_the_v2_record_come_from_nvidias_tables() -> None:
    card = fake_pynvml.mig_layout(a100_40(fake_pynvml.default_cards()[0]), [("3g.20gb", 3), ("1g.10gb", 1)])
    card.profile_names = False
    nv = fake_pynvml.make_module(cards=[card])
    slices, problems = read_slices(nv, card, card.name, card.total_mib)
    assert problems == []
    assert [s.profile for s in slices] == ["3g.20gb", "1g.10gb"]


def test_compute_instances_sharing_a_gpu_instance_are_published_but_not_placeable() -> None:
    card = fake_pynvml.mig_layout(a100_40(fake_pynvml.default_cards()[0]), [("3g.20gb", 1), ("3g.20gb", 2)])
    card.mig_devices[1].gpu_instance = 1          # two compute instances in GPU instance 1
    card.mig_devices[1].compute_instance = 1
    slices, _ = read_slices(fake_pynvml.make_module(cards=[card]), card, card.name, card.total_mib)
    assert [s.profile for s in slices] == ["1c.3g.20gb", "2c.3g.20gb"]
    assert all(s.memory_shared and not s.placeable for s in slices)


def test_a_mig_device_that_fails_is_skipped_with_a_problem() -> None:
    card = fake_pynvml.mig_layout(a100_40(fake_pynvml.default_cards()[0]), [("2g.10gb", 2), ("1g.5gb", 1)])
    card.mig_devices[0].broken = fake_pynvml.NVML_ERROR_UNINITIALIZED
    slices, problems = read_slices(fake_pynvml.make_module(cards=[card]), card, card.name, card.total_mib)
    assert [s.profile for s in slices] == ["1g.5gb"]
    assert len(problems) == 1 and "MIG device 0" in problems[0]


def test_pending_mig_mode_has_no_slices_yet() -> None:
    card = a100_40(fake_pynvml.default_cards()[0])
    card.mig = (fake_pynvml.NVML_DEVICE_MIG_DISABLE, fake_pynvml.NVML_DEVICE_MIG_ENABLE)
    inventory = NVMLBackend(library=fake_pynvml.make_module(cards=[card])).inventory()
    assert inventory[0].mig and inventory[0].slices == ()


def test_sampling_reads_each_slices_memory_and_processes_and_no_utilisation() -> None:
    cards = fake_pynvml.default_cards()
    card = fake_pynvml.mig_layout(a100_40(cards[0]), [("2g.10gb", 2), ("1g.5gb", 1)])
    card.processes = {700: 3000, 701: 1000}            # the parent lists every process of every instance
    card.mig_devices[0].processes = {700: 3000}
    card.mig_devices[0].used_mib = 3000
    card.mig_devices[1].processes = {701: 1000}
    card.mig_devices[1].used_mib = 1000
    backend = NVMLBackend(library=fake_pynvml.make_module(cards=cards))
    sample = backend.sample()
    by_uuid = {s.uuid: s for s in sample.slices}
    first, second = (d.uuid for d in card.mig_devices)
    assert (by_uuid[first].memory_used_mib, by_uuid[first].memory_total_mib) == (3000, 9984)
    assert by_uuid[second].memory_used_mib == 1000
    assert all(s.utilization_percent is None and s.healthy for s in sample.slices)   # "not available", not 0
    assert {p.pid: p.mig_device for p in sample.processes if p.card_index == 0} == {700: first, 701: second}
    assert all(p.mig_device is None for p in sample.processes if p.card_index != 0)


def test_a_slice_that_fails_while_sampling_is_reported_unhealthy() -> None:
    cards = fake_pynvml.default_cards()
    card = fake_pynvml.mig_layout(a100_40(cards[0]), [("2g.10gb", 2), ("1g.5gb", 1)])
    backend = NVMLBackend(library=fake_pynvml.make_module(cards=cards))
    backend.inventory()
    card.mig_devices[1].broken = fake_pynvml.NVML_ERROR_UNINITIALIZED
    sample = backend.sample()
    assert [(s.healthy, s.memory_used_mib) for s in sample.slices] == [(True, 0), (False, 0)]
    # a device that fails to answer is that slice's fault, not a new layout: it stays published
    assert [s.uuid for s in backend.inventory()[0].slices] == [d.uuid for d in card.mig_devices]
    assert backend.next_health_event(0) is None


def test_a_layout_the_admin_changes_at_run_time_is_served_and_reported() -> None:
    cards = fake_pynvml.default_cards()
    card = fake_pynvml.mig_layout(a100_40(cards[0]), [("2g.10gb", 2), ("1g.5gb", 1)])
    backend = NVMLBackend(library=fake_pynvml.make_module(cards=cards))
    before = [s.uuid for s in backend.inventory()[0].slices]
    backend.sample()
    assert backend.next_health_event(0) is None  # nothing changed yet
    fake_pynvml.mig_layout(card, [("3g.20gb", 3), ("3g.20gb", 3)])  # nvidia-smi mig -dci/-dgi, then -cgi 9,9 -C
    sample = backend.sample()
    after = backend.inventory()[0]
    assert [s.profile for s in after.slices] == ["3g.20gb", "3g.20gb"] and not set(before) & {s.uuid for s in after.slices}
    assert {s.uuid for s in sample.slices if s.card_index == 0} == {s.uuid for s in after.slices}
    event = backend.next_health_event(0)
    assert event is not None and (event.card_index, event.healthy) == (0, False)  # still out of time-sharing
    assert event.reason == "MIG layout changed: 2g.10gb + 1g.5gb -> 3g.20gb + 3g.20gb"
    # the admin destroys one instance: the card serves the one left
    card.mig_devices.pop()
    backend.sample()
    assert [s.profile for s in backend.inventory()[0].slices] == ["3g.20gb"]
    assert backend.next_health_event(0).reason == "MIG layout changed: 3g.20gb + 3g.20gb -> 3g.20gb"
    assert all(c.slices == () for c in backend.inventory()[1:])
