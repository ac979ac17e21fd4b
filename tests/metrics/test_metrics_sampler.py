"""The sampler: process -> container attribution, usage sums, occupancy, history, staleness."""

from __future__ import annotations

import math
import os
import threading
import time

import pytest
from metrics_support import NODE, FakeNode, FlakyGPUs
from simkube.waiting import wait_for
from vgpu_plugin.metrics.podmap import PodIndex
from vgpu_plugin.metrics.sampler import ContainerKey, Sampler

from jupyter_vgpu.core.contract import DEFAULT_NAMES
from jupyter_vgpu.data import TOPOLOGY_DIR
from jupyter_vgpu.gpu.simulated import SimulatedGPUs


def make_sampler(node: FakeNode, **kwargs) -> Sampler:
    return Sampler(NODE, node.gpus, node, proc_root=node.proc_root, **kwargs)


@pytest.mark.parametrize("runtime", ["containerd", "cri-o", "docker"])
@pytest.mark.parametrize("driver", ["systemd", "cgroupfs"])
def test_processes_are_attributed_to_their_container(fake_node: FakeNode, runtime: str, driver: str) -> None:
    pod = fake_node.pod("jupyter-alice", {"notebook": (25, 16, (2,)), "sidecar": (0, 0, ())}, runtime=runtime)
    pid = fake_node.run(pod, "notebook", 2, memory_mib=3000, utilization=20, driver=driver)
    snapshot = make_sampler(fake_node).sample_once()
    (process,) = snapshot.processes
    assert (process.pid, process.owner, process.container_index) == (pid, "container", 0)
    assert process.pod is not None and process.pod.name == "jupyter-alice"
    usage = snapshot.usage[ContainerKey(pod["metadata"]["uid"], 0)]
    assert (usage.memory_used_mib, usage.utilization_percent, usage.pids) == (3000, 20, (pid,))


def test_usage_sums_processes_and_cards_of_a_container(fake_node: FakeNode) -> None:
    pod = fake_node.pod("trainer", {"main": (200, 0, (4, 5))})
    fake_node.run(pod, "main", 4, memory_mib=10000, utilization=70)
    fake_node.run(pod, "main", 4, memory_mib=2000, utilization=50)  # two processes on one card
    fake_node.run(pod, "main", 5, memory_mib=5000, utilization=40)
    snapshot = make_sampler(fake_node).sample_once()
    usage = snapshot.usage[ContainerKey(pod["metadata"]["uid"], 0)]
    per_card = {c.index: (c.memory_used_mib, c.utilization_percent) for c in usage.cards}
    assert per_card == {4: (12000, 100.0), 5: (5000, 40)}  # a card is at most 100 %
    assert (usage.memory_used_mib, usage.utilization_percent) == (17000, 140.0)
    card4 = snapshot.card(4)
    assert card4 is not None and (card4.allocated_cores, card4.allocated_memory_mib) == (100, 40960)


def test_unknown_processes_are_reported_as_such(fake_node: FakeNode) -> None:
    fake_node.pod("jupyter-bob", {"notebook": (50, 40, (1,))})
    host = fake_node.run_outside(1, memory_mib=800, utilization=5)
    stranger_cgroup = "0::/kubepods/besteffort/pod0b9e3c1a-1111-4222-8333-944455556666/" + "c" * 64 + "\n"
    stranger = fake_node.run_outside(1, memory_mib=100, utilization=1, cgroup=stranger_cgroup)
    vanished = 99999
    fake_node.gpus.start_process(vanished, 1, 1000, 10)  # no cgroup file: cannot be read
    owners = {p.pid: p.owner for p in make_sampler(fake_node).sample_once().processes}
    assert owners == {host: "host", stranger: "unknown-pod", vanished: "unreadable"}


def test_a_cgroup_file_caught_empty_is_read_again_not_taken_for_the_host(fake_node: FakeNode) -> None:
    pod = fake_node.pod("jupyter-carol", {"notebook": (25, 16, (2,))})
    pid = fake_node.run(pod, "notebook", 2, memory_mib=1000, utilization=10)
    with open(os.path.join(fake_node.proc_root, str(pid), "cgroup"), encoding="ascii") as handle:
        text = handle.read()
    fake_node.write_cgroup(pid, "")  # the sampler looks between the file's creation and its write
    sampler = make_sampler(fake_node)
    assert [p.owner for p in sampler.sample_once().processes] == ["unreadable"]
    fake_node.write_cgroup(pid, text)
    (process,) = sampler.sample_once().processes
    assert (process.owner, process.pod and process.pod.name) == ("container", "jupyter-carol")


def test_occupancy_counts_shares_of_every_pod_on_this_node_only(fake_node: FakeNode) -> None:
    a = fake_node.pod("a", {"nb": (25, 16, (3,))})
    b = fake_node.pod("b", {"nb": (50, 40, (3,))}, namespace="other")
    fake_node.pod("elsewhere", {"nb": (25, 16, (3,))}, node="gpu-node-2")
    fake_node.pod("done", {"nb": (25, 16, (3,))}, phase="Succeeded")
    card = make_sampler(fake_node).sample_once().card(3)
    assert card is not None
    assert (card.allocated_cores, card.allocated_memory_mib) == (75, 56 * 256)
    assert set(card.holders) == {ContainerKey(a["metadata"]["uid"], 0), ContainerKey(b["metadata"]["uid"], 0)}


def test_history_ring_keeps_the_configured_window(tmp_path) -> None:
    now = [1_000_000.0]
    gpus = SimulatedGPUs.from_fixture(TOPOLOGY_DIR / "dgx-a100.txt", clock=lambda: now[0])
    fake_node = FakeNode(gpus, str(tmp_path))
    pod = fake_node.pod("a", {"nb": (25, 16, (0,))})
    pid = fake_node.run(pod, "nb", 0, memory_mib=1000, utilization=10)
    sampler = make_sampler(fake_node, period=1.0, history_seconds=600.0, clock=lambda: now[0])
    key = ContainerKey(pod["metadata"]["uid"], 0)
    for step in range(700):
        fake_node.gpus.set_usage(pid, 1000 + step, 10)
        now[0] = 1_000_000.0 + step
        sampler.sample_once()
    everything = sampler.history(key, 10_000)
    assert len(everything) == 601  # 10 minutes at 1 s, both ends
    assert everything[-1].memory_used_mib == 1699 and everything[0].memory_used_mib == 1099
    last_minute = sampler.history(key, 60)
    assert [p.memory_used_mib for p in last_minute] == list(range(1639, 1700))
    # the pod gives its share back: its history goes with it
    fake_node.pods.remove(pod)
    sampler.sample_once()
    assert sampler.history(key, 10_000) == []


def test_a_container_with_no_process_seen_records_an_unknown_point_not_zero(fake_node: FakeNode) -> None:
    """No process seen may be a process in a PID namespace the daemon cannot see: unknown, not idle."""
    pod = fake_node.pod("idle", {"nb": (10, 8, (6,))})
    sampler = make_sampler(fake_node)
    sampler.sample_once()
    key = ContainerKey(pod["metadata"]["uid"], 0)
    (point,) = sampler.history(key, 60)
    assert not point.known and math.isnan(point.memory_used_mib) and math.isnan(point.utilization_percent)
    fake_node.run(pod, "nb", 6, memory_mib=300, utilization=0)  # a process that computes nothing: a known 0
    sampler.sample_once()
    assert [(p.known, p.utilization_percent) for p in sampler.history(key, 60)][1:] == [(True, 0.0)]



def test_failed_sample_keeps_last_numbers_and_says_stale(tmp_path) -> None:
    gpus = FlakyGPUs.from_fixture(TOPOLOGY_DIR / "dgx-a100.txt")
    node = FakeNode(gpus, str(tmp_path))
    pod = node.pod("a", {"nb": (25, 16, (0,))})
    node.run(pod, "nb", 0, memory_mib=1234, utilization=12)
    sampler = make_sampler(node)
    good = sampler.sample_once()
    assert good.staleness(good.taken_at) == (False, None)
    gpus.failing = "NVML_ERROR_UNKNOWN on card 3"
    node.pod("b", {"nb": (25, 16, (0,))})  # pod changes still show while GPU data is stale
    bad = sampler.sample_once()
    stale, message = bad.staleness(time.time())
    assert stale and "NVML_ERROR_UNKNOWN on card 3" in message
    assert bad.taken_at == good.taken_at
    assert bad.usage == good.usage
    card = bad.card(0)
    assert card is not None and card.memory_used_mib == 1234 and card.allocated_cores == 50
    gpus.failing = None
    assert sampler.sample_once().staleness(time.time()) == (False, None)


def test_data_goes_stale_when_the_sampler_stops(fake_node: FakeNode) -> None:
    sampler = make_sampler(fake_node, period=1.0)
    snapshot = sampler.sample_once()
    assert not snapshot.staleness(snapshot.taken_at + 3)[0]
    stale, message = snapshot.staleness(snapshot.taken_at + 10)
    assert stale and "10 s old" in message


def test_node_without_driver_is_stale_with_the_reason(tmp_path) -> None:
    from jupyter_vgpu.core.topology import parse_nvidia_smi_topo

    topology = parse_nvidia_smi_topo((TOPOLOGY_DIR / "dgx-a100.txt").read_text())
    gpus = SimulatedGPUs(topology, driver_problem="no NVIDIA driver: libnvidia-ml.so.1 not found")
    snapshot = Sampler(NODE, gpus, FakeNode(gpus, str(tmp_path)), proc_root=str(tmp_path)).sample_once()
    assert snapshot.cards == ()
    assert snapshot.staleness(time.time()) == (True, "no NVIDIA driver: libnvidia-ml.so.1 not found")


def test_lost_card_shows_unhealthy_in_the_next_sample(fake_node: FakeNode) -> None:
    sampler = make_sampler(fake_node)  # the inventory is not re-read for 30 s
    assert all(view.healthy for view in sampler.sample_once().cards)
    fake_node.gpus.lose_card(5)
    snapshot = sampler.sample_once()
    assert [view.card.index for view in snapshot.cards if not view.healthy] == [5]
    assert snapshot.card(5).card.healthy is False  # the inventory was re-read at once
    fake_node.gpus.restore_card(5)
    snapshot = sampler.sample_once()
    assert all(view.healthy for view in snapshot.cards) and snapshot.card(5).card.healthy is True


def test_thread_samples_on_its_period_and_stops(fake_node: FakeNode) -> None:
    sampler = make_sampler(fake_node, period=0.05)
    sampler.start()
    try:
        wait_for(lambda: sampler.samples_taken >= 5, timeout=30, interval=0.01, what="five samples")
    finally:
        sampler.stop()
    assert not any(t.name.startswith("vgpu-metrics-sampler") for t in threading.enumerate())


def test_pod_cache_edge_cases() -> None:
    uid = "5c8e9d1a-2b3c-4d5e-8f90-a1b2c3d4e5f6"
    mirror_hash = "0f5b6f5d0c8e4f1b9a2c3d4e5f6a7b8c"
    pods = [
        {"metadata": {"name": "static", "namespace": "kube-system", "uid": uid,
                      "annotations": {"kubernetes.io/config.mirror": mirror_hash,
                                      DEFAULT_NAMES.allocation: "{not json"}},
         "spec": {"nodeName": NODE, "containers": [{"name": "a"}, {"name": "b"}]},
         "status": {"phase": "Running", "containerStatuses": [
             {"name": "b", "containerID": "cri-o://" + "b" * 64}]}},
        {"metadata": {"name": "no-uid"}, "spec": {"nodeName": NODE}},
    ]
    index = PodIndex.build(pods, NODE)
    assert len(index) == 1
    entry = index.by_uid(uid)
    assert entry is not None and entry.allocation is None and "not JSON" in (entry.problem or "")
    from vgpu_plugin.metrics.cgroup import CgroupIdentity

    # the static pod's cgroup carries the config hash, not the API UID
    pod, container = index.resolve(CgroupIdentity(mirror_hash, "b" * 64, "burstable", "cri-o", "systemd"))
    assert pod is entry and container == 1
    pod, container = index.resolve(CgroupIdentity(mirror_hash, "e" * 64, "burstable", "cri-o", "systemd"))
    assert pod is entry and container is None  # two containers, unknown ID: pod known only


def test_gpu_admission_annotations_without_our_record(fake_node: FakeNode) -> None:
    # A pod placed by gpu-admission carries only predicate-gpu-idx-<i>: read its share from the limits.
    pod = fake_node.pod("legacy", {"init": (0, 0, ()), "nb": (30, 20, (6,)), "big": (200, 0, (1, 2))},
                        annotate=False)
    pod["metadata"]["annotations"].update({
        DEFAULT_NAMES.predicate_gpu_idx(1): "6", DEFAULT_NAMES.predicate_gpu_idx(2): "1,2",
        DEFAULT_NAMES.gpu_assigned: "true",
    })
    snapshot = make_sampler(fake_node).sample_once()
    entry = snapshot.pods.by_uid(pod["metadata"]["uid"])
    assert entry is not None and entry.allocation is not None
    shares = {(c.index, s.index): (s.cores, s.memory_units) for c in entry.allocation.containers for s in c.cards}
    assert shares == {(1, 6): (30, 20), (2, 1): (100, 160), (2, 2): (100, 160)}
    card = snapshot.card(6)
    assert card is not None and (card.allocated_cores, card.allocated_memory_mib) == (30, 20 * 256)


def test_pod_index_is_rebuilt_exactly_when_a_pod_changes(fake_node: FakeNode) -> None:
    pod = fake_node.pod("a", {"nb": (25, 16, (0,))})
    pod["metadata"]["resourceVersion"] = "10"
    sampler = make_sampler(fake_node)
    first = sampler.sample_once().pods
    assert sampler.sample_once().pods is first  # nothing changed: no re-parse
    moved = PodIndex.build([pod], NODE).by_uid(pod["metadata"]["uid"])
    assert moved is not None and moved.allocation is not None
    pod["metadata"]["annotations"][DEFAULT_NAMES.allocation] = moved.allocation.to_json().replace(
        '"index":0,"memoryUnits"', '"index":5,"memoryUnits"')
    pod["metadata"]["resourceVersion"] = "11"
    snapshot = sampler.sample_once()
    assert snapshot.pods is not first
    card = snapshot.card(5)
    assert card is not None and card.allocated_cores == 25
    fake_node.pods.remove(pod)
    assert len(sampler.sample_once().pods) == 0
