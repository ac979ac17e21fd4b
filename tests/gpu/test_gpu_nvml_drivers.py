"""The NVML backend on the drivers real nodes have: old and buggy process queries, MPS clients,
MIG-enabled cards, and Grace-Hopper's NUMA ids.

The running-process queries are the installed nvidia-ml-py's own functions over ``FakeDriver``
(a stand-in for libnvidia-ml.so.1 exporting what a driver generation exports), so the errors and
the garbage are the ones a real node gives; the first tests pin that down.
"""

from __future__ import annotations

import logging

import fake_pynvml
import pynvml
import pytest

from jupyter_vgpu.core.inventory import NodeInventory
from jupyter_vgpu.gpu import node_inventory
from jupyter_vgpu.gpu.nvml import NVMLBackend
from jupyter_vgpu.gpu.nvml_processes import ProcessLister

# --- what nvidia-ml-py itself does on each driver --------------------------------------------------------


def test_on_an_r470_driver_nvidia_ml_py_raises_a_mismatch_without_a_value():
    nv = fake_pynvml.make_module(driver="r470")
    card = nv.cards[0]
    with pytest.raises(pynvml.NVMLLibraryMismatchError) as caught:
        nv.nvmlDeviceGetComputeRunningProcesses(card)
    assert not hasattr(caught.value, "value")
    with pytest.raises(pynvml.NVMLError_FunctionNotFound) as direct:
        nv.nvmlDeviceGetComputeRunningProcesses_v3(card)
    assert direct.value.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    assert nv.nvmlDeviceGetComputeRunningProcesses_v2(card) == []


def test_an_r525_driver_garbles_the_second_v3_record_in_nvidia_ml_py():
    cards = fake_pynvml.default_cards()
    cards[0].processes = {4242: 1000, 4243: 2000}
    nv = fake_pynvml.make_module(cards=cards, driver="r525")
    first, second = nv.nvmlDeviceGetComputeRunningProcesses_v3(cards[0])
    assert first.pid == 4242 and first.usedGpuMemory == 1000 * 1024 * 1024
    assert second.pid != 4243, "the larger _v3 record shifts every record after the first"
    assert [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses_v2(cards[0])] == [4242, 4243]


# --- the backend on those drivers --------------------------------------------------------------------------


def _sampled(driver: str, **processes: dict[int, int]) -> dict[int, int]:
    cards = fake_pynvml.default_cards()
    for field, value in processes.items():
        setattr(cards[1], field, value)
    backend = NVMLBackend(library=fake_pynvml.make_module(cards=cards, driver=driver))
    return {p.pid: p.memory_used_mib for p in backend.sample().processes if p.card_index == 1}


@pytest.mark.parametrize("driver", ["r418", "r470", "r525", "r550"])
def test_processes_are_listed_on_every_driver_generation(driver):
    assert _sampled(driver, processes={301: 1500, 302: 700, 303: 64}) == {301: 1500, 302: 700, 303: 64}


def test_the_version_that_works_is_remembered():
    cards = fake_pynvml.default_cards()
    cards[0].processes = {10: 100}
    nv = fake_pynvml.make_module(cards=cards, driver="r470")
    lister = ProcessLister(nv, "Compute")
    assert [p.pid for p in lister.running(cards[0], 80 << 30)] == [10]
    assert lister.version == "_v2"
    nv.driver.calls.clear()
    lister.running(cards[0], 80 << 30)
    assert set(nv.driver.calls) == {"nvmlDeviceGetComputeRunningProcesses_v2"}


def test_a_driver_without_any_version_of_a_query_lists_nothing_for_it():
    nv = fake_pynvml.make_module(driver="r550")
    del nv.driver.nvmlDeviceGetMPSComputeRunningProcesses_v3
    del nv.driver.nvmlDeviceGetMPSComputeRunningProcesses_v2
    del nv.driver.nvmlDeviceGetMPSComputeRunningProcesses
    lister = ProcessLister(nv, "MPSCompute")
    assert lister.running(nv.cards[0], 80 << 30) == [] and lister.exhausted


def test_a_lost_card_is_still_an_error_not_a_missing_function():
    nv = fake_pynvml.make_module(driver="r470")
    nv.cards[0].lost = True
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        ProcessLister(nv, "Compute").running(nv.cards[0], 80 << 30)


def test_mps_clients_are_listed_beside_the_mps_server():
    # under MPS the compute list shows only nvidia-cuda-mps-server; the clients are MPS processes
    listed = _sampled("r550", processes={900: 4600}, mps_clients={901: 3000, 902: 1600})
    assert listed == {900: 4600, 901: 3000, 902: 1600}
    assert _sampled("r470", processes={900: 100}, mps_clients={901: 60}) == {900: 100, 901: 60}


# --- MIG -----------------------------------------------------------------------------------------------------


def test_a_mig_enabled_card_is_kept_out_of_sharing_with_its_reason(caplog):
    cards = fake_pynvml.default_cards()
    cards[1].mig = (fake_pynvml.NVML_DEVICE_MIG_ENABLE, fake_pynvml.NVML_DEVICE_MIG_ENABLE)
    cards[1].used_mib = 5000
    cards[2].mig = (fake_pynvml.NVML_DEVICE_MIG_DISABLE, fake_pynvml.NVML_DEVICE_MIG_DISABLE)
    backend = NVMLBackend(library=fake_pynvml.make_module(cards=cards))
    with caplog.at_level(logging.WARNING):
        inventory = backend.inventory()
    card = inventory[1]
    assert (card.mig, card.healthy) == (True, False)
    assert "MIG mode is enabled" in card.unavailable
    assert all(c.healthy and not c.mig and c.unavailable is None for i, c in enumerate(inventory) if i != 1)
    assert "GPU1" in caplog.text and "kept out of sharing" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        sample = backend.sample()
    sampled = sample.cards[1]
    assert sampled.memory_used_mib == 5000, "the card's memory is still read, not reported as 0 MiB"
    assert (sampled.utilization_percent, sampled.healthy) == (0.0, False)
    assert "sampling GPU1 failed" not in caplog.text
    published = NodeInventory.from_json(node_inventory(backend, "n").to_json())
    assert published.cards[1].mig and published.cards[1].unavailable == card.unavailable


def test_pending_mig_mode_is_also_kept_out():
    cards = fake_pynvml.default_cards()
    cards[0].mig = (fake_pynvml.NVML_DEVICE_MIG_DISABLE, fake_pynvml.NVML_DEVICE_MIG_ENABLE)
    card = NVMLBackend(library=fake_pynvml.make_module(cards=cards)).inventory()[0]
    assert card.mig and not card.healthy and "pending" in card.unavailable


def test_an_application_xid_on_a_mig_card_does_not_make_it_shareable():
    cards = fake_pynvml.default_cards()
    cards[0].mig = (1, 1)
    nv = fake_pynvml.make_module(cards=cards)
    backend = NVMLBackend(library=nv)
    backend.inventory()
    nv.emit_xid(0, 13)
    event = backend.next_health_event(5.0)
    assert event is not None and event.card_index == 0 and event.healthy is False


# --- NUMA ------------------------------------------------------------------------------------------------------


def _sysfs(tmp_path, bus_id: str, numa: str):
    device = tmp_path / "bus" / "pci" / "devices" / bus_id
    device.mkdir(parents=True)
    (device / "numa_node").write_text(numa + "\n")


def test_sysfs_numa_node_wins_over_nvml_on_grace_hopper(tmp_path):
    cards = fake_pynvml.default_cards()[:1]
    cards[0].numa = 1  # NVML on GH200: the node of the GPU's own memory
    _sysfs(tmp_path, "0000:07:00.0", "0")
    backend = NVMLBackend(library=fake_pynvml.make_module(cards=cards), sysfs_root=str(tmp_path))
    assert backend.inventory()[0].numa == 0


@pytest.mark.parametrize("sysfs", [None, "-1"])
def test_nvml_numa_is_the_fallback_when_sysfs_has_none(tmp_path, sysfs):
    cards = fake_pynvml.default_cards()[:1]
    cards[0].numa = 1
    if sysfs is not None:
        _sysfs(tmp_path, "0000:07:00.0", sysfs)
    backend = NVMLBackend(library=fake_pynvml.make_module(cards=cards), sysfs_root=str(tmp_path))
    assert backend.inventory()[0].numa == 1


def test_bindings_whose_newest_call_raises_the_version_mismatch_fall_back_too():
    # older nvidia-ml-py releases expose only the unversioned wrapper for the newest version
    cards = fake_pynvml.default_cards()
    cards[0].processes = {77: 512}
    nv = fake_pynvml.make_module(cards=cards, driver="r470")
    nv.nvmlDeviceGetComputeRunningProcesses_v3 = nv.nvmlDeviceGetComputeRunningProcesses
    lister = ProcessLister(nv, "Compute")
    assert [(p.pid, p.used_bytes) for p in lister.running(cards[0], 80 << 30)] == [(77, 512 << 20)]
    assert lister.version == "_v2"
