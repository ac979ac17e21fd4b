"""The NVML backend.

The "no driver" path runs for real (this machine has no NVIDIA driver, pynvml raises
NVMLError_LibraryNotFound). The rest of the logic runs against ``fake_pynvml``, a small
stand-in module object injected through ``NVMLBackend(library=...)`` for these tests only.
"""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
import time

import fake_pynvml
import pytest

from jupyter_vgpu.gpu import GPUError, node_inventory
from jupyter_vgpu.gpu.nvml import NVMLBackend


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None,
                    reason="this machine has an NVIDIA driver; the no-driver path cannot run here")
def test_no_driver_is_a_clean_reported_state():
    import pynvml

    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        pynvml.nvmlInit()  # what the backend meets on this machine
    backend = NVMLBackend()
    assert backend.available() is False
    assert backend.problem().startswith("no NVIDIA driver")
    assert "libnvidia-ml.so.1" in backend.problem()
    assert backend.inventory() == [] and backend.topology() is None
    with pytest.raises(GPUError, match="no NVIDIA driver"):
        backend.sample()
    assert backend.next_health_event(0.2) is None  # no driver: no health events, after the timeout
    inventory = node_inventory(backend, "cpu-node")
    assert inventory.cards == () and inventory.problem.startswith("no NVIDIA driver")
    backend.close()


def test_nothing_imports_pynvml_before_first_use():
    code = (
        "import sys, jupyter_vgpu.gpu, jupyter_vgpu.gpu.nvml;"
        "from jupyter_vgpu.gpu.nvml import NVMLBackend; NVMLBackend();"
        "print('pynvml' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_initialisation_is_lazy_and_once():
    nv = fake_pynvml.make_module()
    backend = NVMLBackend(library=nv)
    assert nv.calls == []
    assert backend.available()
    backend.inventory()
    backend.sample()
    assert nv.calls.count("init") == 1


def test_driver_not_loaded_is_reported():
    nv = fake_pynvml.make_module(init_error=fake_pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    backend = NVMLBackend(library=nv)
    assert not backend.available()
    assert backend.problem() == "no NVIDIA driver: the kernel driver is not loaded"


def test_no_gpus_is_reported():
    backend = NVMLBackend(library=fake_pynvml.make_module(cards=[]))
    assert not backend.available() and backend.problem() == "no GPUs"
    assert backend.driver_version() == "550.54.15"
    assert node_inventory(backend, "n").problem == "no GPUs"


def test_inventory_reads_every_field():
    backend = NVMLBackend(library=fake_pynvml.make_module())
    cards = backend.inventory()
    assert [c.index for c in cards] == [0, 1, 2, 3]
    first = cards[0]
    assert first.uuid == "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"  # bytes from NVML decoded
    assert first.model == "NVIDIA A100-SXM4-80GB"
    assert first.memory_mib == 81920 and first.memory_units == 320
    assert (first.minor, first.bus_id, first.numa) == (0, "00000000:07:00.0", 0)
    assert [c.numa for c in cards] == [0, 0, 0, 1]
    assert backend.driver_version() == "550.54.15"


def test_numa_falls_back_to_sysfs(tmp_path):
    nv = fake_pynvml.make_module()

    def unsupported(handle):
        raise fake_pynvml.NVMLError(fake_pynvml.NVML_ERROR_NOT_SUPPORTED)

    nv.nvmlDeviceGetNumaNodeId = unsupported
    for card in nv.cards:
        domain, bus, rest = card.bus_id.lower().split(":")
        device_dir = tmp_path / "bus" / "pci" / "devices" / f"0000:{bus}:{rest}"
        device_dir.mkdir(parents=True)
        (device_dir / "numa_node").write_text("-1\n" if card.index == 3 else "1\n")
    cards = NVMLBackend(library=nv, sysfs_root=str(tmp_path)).inventory()
    assert [c.numa for c in cards] == [1, 1, 1, None]


def test_topology_counts_nvlinks_and_uses_common_ancestors():
    topology = NVMLBackend(library=fake_pynvml.make_module()).topology()
    links = topology.links
    assert links[0][1] == links[1][0] == "NV2"
    assert links[2][3] == "NV2"
    assert links[0][2] == links[1][2] == "PHB"
    assert links[0][3] == links[1][3] == "SYS"
    assert [g.numa for g in topology.gpus] == [0, 0, 0, 1]


def test_topology_through_nvswitch():
    nv = fake_pynvml.make_module()
    for card in nv.cards:
        card.nvlinks = ["00000000:C0:00.0"] * 12
    nv.nvmlDeviceGetNvLinkRemoteDeviceType = lambda h, link: fake_pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    links = NVMLBackend(library=nv).topology().links
    assert {links[a][b] for a in range(4) for b in range(4) if a != b} == {"NV12"}


def test_sample_reports_cards_and_processes():
    nv = fake_pynvml.make_module()
    card = nv.cards[1]
    card.used_mib, card.utilization = 9000, 63
    card.processes = {1234: 6000, 5678: 3000}
    card.process_util = {1234: 50}
    sample = NVMLBackend(library=nv).sample()
    assert sample.taken_at == pytest.approx(time.time(), abs=5)
    assert [(c.index, c.memory_used_mib, c.utilization_percent) for c in sample.cards] == [
        (0, 0, 0.0), (1, 9000, 63.0), (2, 0, 0.0), (3, 0, 0.0)]
    procs = {(p.pid, p.card_index): p for p in sample.processes}
    assert set(procs) == {(1234, 1), (5678, 1)}
    assert procs[(1234, 1)].memory_used_mib == 6000 and procs[(1234, 1)].utilization_percent == 50
    assert procs[(5678, 1)].utilization_percent == 0.0  # no kernels since the last sample
    assert procs[(1234, 1)].uuid == card.uuid


def test_critical_xid_marks_the_card_unhealthy():
    nv = fake_pynvml.make_module()
    backend = NVMLBackend(library=nv)
    assert backend.next_health_event(0.05) is None
    assert {(i, t) for i, t, _ in nv.registered} == {(i, nv.nvmlEventTypeXidCriticalError) for i in range(4)}
    nv.emit_xid(2, 79)
    event = backend.next_health_event(2)
    assert (event.card_index, event.healthy) == (2, False)
    assert event.reason == "XID 79 (GPU has fallen off the bus)"
    assert [c.healthy for c in backend.inventory()] == [True, True, False, True]
    assert backend.next_health_event(0.05) is None  # reported once


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_application_xids_leave_the_card_healthy(xid):
    nv = fake_pynvml.make_module()
    backend = NVMLBackend(library=nv)
    nv.emit_xid(0, xid)
    event = backend.next_health_event(2)
    assert event.healthy and event.card_index == 0 and f"XID {xid}" in event.reason
    assert all(c.healthy for c in backend.inventory())


def test_xid_without_a_device_marks_every_card():
    nv = fake_pynvml.make_module()
    backend = NVMLBackend(library=nv)
    nv.emit_xid(None, 48)
    events = [backend.next_health_event(1) for _ in range(4)]
    assert sorted(e.card_index for e in events) == [0, 1, 2, 3]
    assert not any(c.healthy for c in backend.inventory())


def test_lost_card_found_while_sampling_becomes_a_health_event():
    nv = fake_pynvml.make_module()
    backend = NVMLBackend(library=nv)
    assert backend.available()
    nv.cards[3].lost = True
    sample = backend.sample()
    assert [c.healthy for c in sample.cards] == [True, True, True, False]
    event = backend.next_health_event(1)
    assert (event.card_index, event.healthy) == (3, False) and "lost" in event.reason
    backend.sample()
    assert backend.next_health_event(0.05) is None  # no second event for the same loss


def test_close_frees_events_and_shuts_down():
    nv = fake_pynvml.make_module()
    backend = NVMLBackend(library=nv)
    backend.next_health_event(0.01)
    backend.close()
    assert nv.calls[-2:] == ["free", "shutdown"]


def test_card_lost_before_start_keeps_the_other_cards_usable():
    nv = fake_pynvml.make_module()
    nv.cards[1].lost = True

    def uuid(handle):
        if handle.lost:
            raise fake_pynvml.NVMLError(fake_pynvml.NVML_ERROR_GPU_IS_LOST)
        return handle.uuid

    nv.nvmlDeviceGetUUID = uuid
    backend = NVMLBackend(library=nv)
    cards = backend.inventory()
    assert [c.healthy for c in cards] == [True, False, True, True]
    assert cards[1].memory_mib == 0 and cards[0].memory_mib == 81920
    assert [c.healthy for c in backend.sample().cards] == [True, False, True, True]


def test_a_caller_outside_the_host_pid_namespace_is_shown_only_its_own_processes():
    """As the driver does: a process is listed only where its PID exists, by its PID there; card
    memory and utilisation are the same from every namespace."""
    nv = fake_pynvml.make_module()
    card = nv.cards[2]
    card.used_mib, card.utilization = 7000, 40
    card.processes = {40001: 4000, 40002: 3000}
    card.process_util = {40001: 30, 40002: 10}
    nv.driver.pid_namespaces = {40001: ("notebook-a", 7), 40002: ("notebook-b", 7)}

    host = NVMLBackend(library=nv).sample()
    assert sorted(p.pid for p in host.processes) == [40001, 40002]

    nv.driver.caller_pid_namespace = "vgpu-node container"  # a daemon without hostPID
    blind = NVMLBackend(library=nv).sample()
    assert blind.processes == []
    assert (blind.cards[2].memory_used_mib, blind.cards[2].utilization_percent) == (7000, 40.0)

    nv.driver.caller_pid_namespace = "notebook-a"
    own = NVMLBackend(library=nv).sample().processes
    assert [(p.pid, p.memory_used_mib, p.utilization_percent) for p in own] == [(7, 4000, 30.0)]
