from __future__ import annotations

import pytest

from jupyter_vgpu.core.topology import parse_nvidia_smi_topo
from jupyter_vgpu.gpu import GPUBackend, GPUError, node_inventory, open_backend
from jupyter_vgpu.gpu.simulated import SimulatedGPUs


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make(fixtures, name="p40-7gpu-pix-phb.txt", **kwargs) -> SimulatedGPUs:
    kwargs.setdefault("model", "Tesla P40")
    kwargs.setdefault("memory_mib", 24576)
    return SimulatedGPUs.from_fixture(fixtures / name, **kwargs)


def test_inventory_and_topology_come_from_the_fixture(fixtures):
    gpus = make(fixtures, host="node-a")
    assert isinstance(gpus, GPUBackend)
    assert gpus.available() and gpus.problem() is None
    cards = gpus.inventory()
    assert [c.index for c in cards] == list(range(7))
    assert {c.model for c in cards} == {"Tesla P40"}
    assert {c.memory_mib for c in cards} == {24576}
    assert all(c.numa == 0 and c.healthy for c in cards)
    assert len({c.uuid for c in cards}) == 7 and all(c.uuid.startswith("GPU-") for c in cards)
    expected = parse_nvidia_smi_topo((fixtures / "p40-7gpu-pix-phb.txt").read_text())
    assert gpus.topology() == expected
    assert gpus.topology().links[0][1] == "PIX" and gpus.topology().links[0][3] == "PHB"


def test_uuids_are_stable_per_host_and_differ_between_hosts(fixtures):
    a1 = [c.uuid for c in make(fixtures, host="a").inventory()]
    a2 = [c.uuid for c in make(fixtures, host="a").inventory()]
    b = [c.uuid for c in make(fixtures, host="b").inventory()]
    assert a1 == a2
    assert not set(a1) & set(b)


def test_numa_comes_from_the_fixture(fixtures):
    gpus = make(fixtures, "a100-pcie-4gpu-2numa.txt")
    assert [c.numa for c in gpus.inventory()] == [0, 0, 1, 1]


def test_driven_usage_stays_within_limits_moves_and_is_deterministic(fixtures):
    clock = Clock()
    gpus = make(fixtures, clock=clock, seed=7)
    twin = make(fixtures, clock=clock, seed=7)
    for backend in (gpus, twin):
        backend.start_process(4242, 2, memory_limit_mib=4096, cores_limit=30)
        backend.start_process(4343, 2, memory_limit_mib=8192, cores_limit=50, pattern="training")
    seen_util, seen_mem = set(), set()
    for _ in range(240):
        clock.now += 2.5
        sample = gpus.sample()
        assert sample == twin.sample()  # same seed, same time -> same numbers
        assert sample.taken_at == clock.now
        procs = {p.pid: p for p in sample.processes}
        assert set(procs) == {4242, 4343}
        assert 0 <= procs[4242].utilization_percent <= 30
        assert 0 <= procs[4242].memory_used_mib <= 4096
        assert 0 <= procs[4343].utilization_percent <= 50
        assert procs[4343].memory_used_mib <= 8192
        card = sample.cards[2]
        assert card.memory_used_mib == procs[4242].memory_used_mib + procs[4343].memory_used_mib
        assert card.utilization_percent == pytest.approx(
            procs[4242].utilization_percent + procs[4343].utilization_percent, abs=0.11)
        assert all(c.memory_used_mib == 0 and c.utilization_percent == 0 for c in sample.cards if c.index != 2)
        seen_util.add(procs[4242].utilization_percent)
        seen_mem.add(procs[4242].memory_used_mib)
    # a notebook has both busy and quiet stretches, and its memory changes
    assert max(seen_util) > 15 and min(seen_util) < 2
    assert len(seen_mem) > 20
    other_seed = make(fixtures, clock=clock, seed=8)
    other_seed.start_process(4242, 2, memory_limit_mib=4096, cores_limit=30)
    assert other_seed.sample().processes != [p for p in gpus.sample().processes if p.pid == 4242]


def test_set_usage_pins_and_releases(fixtures):
    clock = Clock()
    gpus = make(fixtures, clock=clock)
    gpus.start_process(10, 0, memory_limit_mib=2048, cores_limit=10, pattern="idle")
    gpus.set_usage(10, 3000, 55.5)  # over its share: visible, not clamped
    sample = gpus.sample()
    assert (sample.processes[0].memory_used_mib, sample.processes[0].utilization_percent) == (3000, 55.5)
    gpus.set_usage(10, None, None)
    clock.now += 60
    assert gpus.sample().processes[0].utilization_percent == 0.0
    assert gpus.stop_process(10) is True
    assert gpus.stop_process(10) is False
    assert gpus.sample().processes == []
    with pytest.raises(KeyError):
        gpus.set_usage(10, 1, 1)


def test_multi_card_process_appears_on_each_card(fixtures):
    gpus = make(fixtures)
    gpus.start_process(77, [0, 1], memory_limit_mib=24576, cores_limit=100, pattern="training")
    sample = gpus.sample()
    assert sorted((p.pid, p.card_index) for p in sample.processes) == [(77, 0), (77, 1)]


@pytest.mark.parametrize(
    "args, message",
    [
        ((1, 9, 1024, 10), "no such card"),
        ((1, 0, 1024, 10, "mining"), "unknown usage pattern"),
        ((1, 0, 0, 10), "limits must be positive"),
        ((1, 0, 1024, 101), "limits must be positive"),
    ],
)
def test_bad_process_requests_are_refused(fixtures, args, message):
    gpus = make(fixtures)
    with pytest.raises(ValueError, match=message):
        gpus.start_process(*args)
    assert gpus.process_ids() == []


def test_duplicate_pid_is_refused(fixtures):
    gpus = make(fixtures)
    gpus.start_process(1, 0, 1024, 10)
    with pytest.raises(ValueError, match="already running"):
        gpus.start_process(1, 1, 1024, 10)


def test_critical_xid_makes_the_card_unhealthy_application_xid_does_not(fixtures):
    gpus = make(fixtures)
    assert gpus.next_health_event(0.01) is None
    gpus.inject_xid(3, 43)
    event = gpus.next_health_event(1)
    assert (event.card_index, event.healthy) == (3, True) and "XID 43" in event.reason
    assert gpus.inventory()[3].healthy
    gpus.inject_xid(3, 48)
    event = gpus.next_health_event(1)
    assert (event.card_index, event.healthy, event.uuid) == (3, False, gpus.inventory()[3].uuid)
    assert "XID 48" in event.reason
    assert [c.healthy for c in gpus.inventory()] == [True, True, True, False, True, True, True]
    assert not gpus.sample().cards[3].healthy
    gpus.restore_card(3)
    assert gpus.next_health_event(1).healthy and gpus.inventory()[3].healthy


def test_lost_card_drops_its_processes_until_restored(fixtures):
    gpus = make(fixtures)
    gpus.start_process(5, 1, 4096, 20)
    gpus.lose_card(1)
    event = gpus.next_health_event(1)
    assert (event.card_index, event.healthy) == (1, False) and "fallen off the bus" in event.reason
    sample = gpus.sample()
    assert sample.processes == [] and not sample.cards[1].healthy and sample.cards[1].memory_used_mib == 0
    gpus.restore_card(1)
    assert gpus.next_health_event(1).healthy
    assert [p.pid for p in gpus.sample().processes] == [5]


def test_a_node_without_driver(fixtures):
    text = (fixtures / "a100-sxm-4gpu-nv4.txt").read_text()
    gpus = SimulatedGPUs(parse_nvidia_smi_topo(text), driver_problem="no NVIDIA driver: simulated")
    assert not gpus.available() and gpus.inventory() == [] and gpus.topology() is None
    with pytest.raises(GPUError, match="no NVIDIA driver"):
        gpus.sample()
    inventory = node_inventory(gpus, "n1")
    assert inventory.cards == () and inventory.problem == "no NVIDIA driver: simulated"


def test_node_inventory_round_trips(fixtures):
    from jupyter_vgpu.core.inventory import NodeInventory

    gpus = make(fixtures, "dgx-a100.txt", model="NVIDIA A100-SXM4-80GB", memory_mib=81920)
    inventory = node_inventory(gpus, "dgx-1")
    assert inventory.problem is None and len(inventory.cards) == 8
    assert NodeInventory.from_json(inventory.to_json()) == inventory
    assert inventory.topology.links[0][7] == "NV12"


def test_open_backend_accepts_bundled_names_and_paths(fixtures):
    assert len(open_backend("sim:dgx-a100").inventory()) == 8
    assert len(open_backend(f"sim:{fixtures / 'p40-7gpu-pix-phb.txt'}").inventory()) == 7
    with pytest.raises(ValueError, match="use 'nvml' or 'sim:FIXTURE'"):
        open_backend("cuda")
    with pytest.raises(FileNotFoundError, match="no bundled topology"):
        open_backend("sim:no-such-box")


def test_mig_mode_keeps_a_simulated_card_out_of_sharing_with_its_reason(fixtures):
    gpus = make(fixtures)
    gpus.set_mig_mode(2, current=False, pending=True)
    card = gpus.inventory()[2]
    assert (card.mig, card.healthy) == (True, False) and "pending" in card.unavailable
    assert not gpus.sample().cards[2].healthy
    published = node_inventory(gpus, "n").cards[2]
    assert published.unavailable == card.unavailable
    gpus.inject_xid(2, 13)  # an application XID reports the card as it is: still not shareable
    assert gpus.next_health_event(1.0).healthy is False
    gpus.set_mig_mode(2, current=False)
    card = gpus.inventory()[2]
    assert (card.mig, card.healthy, card.unavailable) == (False, True, None)


def test_a_measured_process_shows_its_real_work_scaled_into_its_share(fixtures):
    """The probe's CPU seconds become utilisation (one busy core = the whole share) and its
    resident memory GPU memory, capped at the limits; a gone process shows nothing."""
    clock = Clock()
    gpus = make(fixtures, clock=clock)
    reading: list[tuple[float, int] | None] = [(10.0, 300 * 2**20)]
    gpus.start_process(9, 2, memory_limit_mib=4096, cores_limit=25, pattern="measured", probe=lambda: reading[0])

    def current() -> tuple[int, float]:
        (process,) = gpus.sample().processes
        return process.memory_used_mib, process.utilization_percent

    assert current() == (300, 0.0)  # the first reading has no rate yet
    clock.now += 2
    reading[0] = (10.1, 300 * 2**20)  # idle: 5 % of a core
    assert current() == (300, 1.2)
    clock.now += 2
    reading[0] = (12.1, 1324 * 2**20)  # a busy loop: one whole core, and a GiB more
    assert current() == (1324, 25.0)
    assert gpus.sample().cards[2].utilization_percent == 25.0
    clock.now += 0.1  # too soon for a new rate: the last one stands
    assert current()[1] == 25.0
    clock.now += 2
    reading[0] = (20.1, 9000 * 2**20)  # several cores and more than the share's memory: capped
    assert current() == (4096, 25.0)
    clock.now += 2
    reading[0] = None
    assert current() == (0, 0.0)


def test_measured_and_probe_go_together(fixtures):
    gpus = make(fixtures)
    with pytest.raises(ValueError, match="probe"):
        gpus.start_process(1, 0, 1024, 10, pattern="measured")
    with pytest.raises(ValueError, match="probe"):
        gpus.start_process(1, 0, 1024, 10, pattern="notebook", probe=lambda: (0.0, 0))
    assert gpus.process_ids() == []


def test_processes_are_listed_only_to_callers_whose_pid_namespace_holds_them(fixtures):
    """The driver's rule: the host's namespace sees every process by its host PID, another
    namespace only its own processes by their PIDs there; card memory is the same from everywhere."""
    gpus = make(fixtures)
    gpus.start_process(40001, 0, memory_limit_mib=4096, cores_limit=30, pid_namespace="container a")
    gpus.start_process(40002, 0, memory_limit_mib=4096, cores_limit=30, pid_namespace="container b")
    gpus.start_process(40003, 1, memory_limit_mib=4096, cores_limit=30, pid_namespace="container a")
    for pid in (40001, 40002, 40003):
        gpus.set_usage(pid, 1000, 10)

    assert [p.pid for p in gpus.sample().processes] == [40001, 40002, 40003]
    daemon = gpus.seen_from("vgpu-node container")  # no hostPID
    assert isinstance(daemon, GPUBackend)
    blind = daemon.sample()
    assert blind.processes == []
    assert blind.cards[0].memory_used_mib == 2000 and blind.cards[1].memory_used_mib == 1000
    assert [(p.pid, p.card_index) for p in gpus.seen_from("container a").sample().processes] == [(1, 0), (2, 1)]
    assert daemon.inventory() == gpus.inventory() and daemon.available()
