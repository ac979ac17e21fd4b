"""The metrics server over real HTTP: Prometheus text parsed with prometheus-client's parser,
values checked against what the simulated GPUs were told to produce; lifecycle."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from metrics_support import NODE, SCRAPE_TOKEN, FakeNode, FlakyGPUs, put_on_slice, wait_for_samples
from prometheus_client.parser import text_string_to_metric_families
from vgpu_plugin.metrics import MetricsServer
from vgpu_plugin.tokens import TokenMinter

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.data import TOPOLOGY_DIR

MIB = 1024 * 1024


@pytest.fixture
def server(fake_node: FakeNode, minter: TokenMinter) -> Iterator[MetricsServer]:
    server = MetricsServer(NODE, fake_node.gpus, fake_node, minter, address="127.0.0.1", port=0,
                           period=0.05, proc_root=fake_node.proc_root, enforcement="hami-core",
                           scrape_token=SCRAPE_TOKEN)
    server.start()
    yield server
    server.stop()


def scrape(server: MetricsServer, path: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """name -> {sorted labels: value} from the scrape port, through prometheus-client's own parser."""
    request = urllib.request.Request(server.scrape_url + path, headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = response.read().decode()
    result: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge", family.name
        for sample in family.samples:
            result.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return result


def labels(**values: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(values.items()))


def test_metrics_match_the_simulated_usage(server: MetricsServer, fake_node: FakeNode) -> None:
    alice = fake_node.pod("jupyter-alice", {"notebook": (25, 16, (2,))}, runtime="containerd")
    bob = fake_node.pod("jupyter-bob", {"notebook": (50, 40, (2,)), "helper": (20, 8, (7,))},
                        namespace="team-b", runtime="cri-o")
    trainer = fake_node.pod("trainer", {"main": (200, 0, (4, 5))}, namespace="ml", runtime="docker")
    fake_node.run(alice, "notebook", 2, memory_mib=3000, utilization=20)
    fake_node.run(bob, "notebook", 2, memory_mib=9000, utilization=45, driver="cgroupfs")
    fake_node.run(trainer, "main", 4, memory_mib=30000, utilization=90, qos="guaranteed")
    fake_node.run(trainer, "main", 5, memory_mib=31000, utilization=88, qos="guaranteed")
    host_pid = fake_node.run_outside(7, memory_mib=700, utilization=3)
    wait_for_samples(server.sampler, 2)

    metrics = scrape(server, "/metrics")
    uuid = {i: fake_node.card_uuid(i) for i in range(8)}
    model = "NVIDIA A100-SXM4-40GB"

    def card(i: int) -> tuple[tuple[str, str], ...]:
        return labels(node=NODE, gpu=str(i), uuid=uuid[i], model=model)

    assert metrics[c.METRIC_CARD_MEMORY_TOTAL] == {card(i): 40960 * MIB for i in range(8)}
    used = metrics[c.METRIC_CARD_MEMORY_USED]
    assert used[card(2)] == 12000 * MIB and used[card(4)] == 30000 * MIB and used[card(7)] == 700 * MIB
    assert used[card(0)] == 0
    util = metrics[c.METRIC_CARD_UTILIZATION]
    assert util[card(2)] == 65 and util[card(5)] == 88 and util[card(7)] == 3
    assert set(metrics[c.METRIC_CARD_HEALTHY].values()) == {1.0}
    cores = metrics[c.METRIC_CARD_ALLOCATED_CORES]
    assert (cores[card(2)], cores[card(4)], cores[card(7)], cores[card(0)]) == (75, 100, 20, 0)
    memory = metrics[c.METRIC_CARD_ALLOCATED_MEMORY]
    assert memory[card(2)] == 56 * 256 * MIB and memory[card(4)] == 40960 * MIB

    def container(pod: dict, name: str, i: int) -> tuple[tuple[str, str], ...]:
        return labels(node=NODE, namespace=pod["metadata"]["namespace"], pod=pod["metadata"]["name"],
                      container=name, gpu=str(i), uuid=uuid[i])

    assert metrics[c.METRIC_CONTAINER_MEMORY_USED] == {
        container(alice, "notebook", 2): 3000 * MIB,
        container(bob, "notebook", 2): 9000 * MIB,
        container(bob, "helper", 7): 0.0,  # holds a share, runs nothing
        container(trainer, "main", 4): 30000 * MIB,
        container(trainer, "main", 5): 31000 * MIB,
    }
    assert metrics[c.METRIC_CONTAINER_UTILIZATION][container(bob, "notebook", 2)] == 45
    assert metrics[c.METRIC_CONTAINER_REQUEST_CORES][container(trainer, "main", 5)] == 100
    assert metrics[c.METRIC_CONTAINER_REQUEST_MEMORY][container(alice, "notebook", 2)] == 16 * 256 * MIB
    processes = metrics[c.METRIC_PROCESS_MEMORY_USED]
    assert processes[labels(node=NODE, gpu="7", uuid=uuid[7], pid=str(host_pid), namespace="", pod="",
                            container="")] == 700 * MIB  # outside Kubernetes, still real usage
    assert len(processes) == 5
    assert metrics[c.METRIC_SAMPLE_STALE] == {labels(node=NODE): 0.0}
    assert 0 <= metrics[c.METRIC_SAMPLE_AGE][labels(node=NODE)] < 30


def test_gpu_manager_endpoint_names_labels_and_units(server: MetricsServer, fake_node: FakeNode) -> None:
    alice = fake_node.pod("jupyter-alice", {"notebook": (25, 16, (2,))})
    trainer = fake_node.pod("trainer", {"main": (200, 0, (4, 5))}, namespace="ml")
    fake_node.run(alice, "notebook", 2, memory_mib=3000, utilization=20)
    fake_node.run(trainer, "main", 4, memory_mib=30000, utilization=90)
    fake_node.run(trainer, "main", 5, memory_mib=31000, utilization=80)
    wait_for_samples(server.sampler, 2)
    metrics = scrape(server, "/metric")
    assert set(metrics) == {c.METRIC_GM_CONTAINER_UTILIZATION, c.METRIC_GM_CONTAINER_MEMORY_TOTAL,
                            c.METRIC_GM_CONTAINER_REQUEST_UTILIZATION, c.METRIC_GM_CONTAINER_REQUEST_MEMORY}

    def gm(pod: dict, container: str, **extra: str) -> tuple[tuple[str, str], ...]:
        return labels(pod_name=pod["metadata"]["name"], namespace=pod["metadata"]["namespace"], node=NODE,
                      container_name=container, **extra)

    assert metrics[c.METRIC_GM_CONTAINER_UTILIZATION] == {
        gm(alice, "notebook", gpu="gpu2"): 20, gm(alice, "notebook", gpu="total"): 20,
        gm(trainer, "main", gpu="gpu4"): 90, gm(trainer, "main", gpu="gpu5"): 80,
        gm(trainer, "main", gpu="total"): 170,
    }
    assert metrics[c.METRIC_GM_CONTAINER_MEMORY_TOTAL] == {  # MiB, as gpu-manager
        gm(alice, "notebook", gpu_memory="gpu2"): 3000, gm(alice, "notebook", gpu_memory="total"): 3000,
        gm(trainer, "main", gpu_memory="gpu4"): 30000, gm(trainer, "main", gpu_memory="gpu5"): 31000,
        gm(trainer, "main", gpu_memory="total"): 61000,
    }
    assert metrics[c.METRIC_GM_CONTAINER_REQUEST_UTILIZATION] == {  # in cards
        gm(alice, "notebook", req_of_gpu="total"): 0.25, gm(trainer, "main", req_of_gpu="total"): 2.0,
    }
    assert metrics[c.METRIC_GM_CONTAINER_REQUEST_MEMORY] == {
        gm(alice, "notebook", req_of_gpu_memory="total"): 4096, gm(trainer, "main", req_of_gpu_memory="total"): 81920,
    }


def test_usage_changes_show_up_in_the_next_scrape(server: MetricsServer, fake_node: FakeNode) -> None:
    pod = fake_node.pod("jupyter-alice", {"notebook": (25, 16, (1,))})
    pid = fake_node.run(pod, "notebook", 1, memory_mib=1000, utilization=10)
    key = labels(pod_name="jupyter-alice", namespace="hub", node=NODE, container_name="notebook", gpu="total")
    wait_for_samples(server.sampler, 2)
    assert scrape(server, "/metric")[c.METRIC_GM_CONTAINER_UTILIZATION][key] == 10
    fake_node.gpus.set_usage(pid, 2000, 23.5)
    wait_for_samples(server.sampler, 2)
    assert scrape(server, "/metric")[c.METRIC_GM_CONTAINER_UTILIZATION][key] == 23.5
    fake_node.gpus.stop_process(pid)
    wait_for_samples(server.sampler, 2)
    assert scrape(server, "/metric")[c.METRIC_GM_CONTAINER_UTILIZATION][key] == 0



def test_failing_driver_marks_data_stale_and_keeps_serving(tmp_path, minter: TokenMinter) -> None:
    gpus = FlakyGPUs.from_fixture(TOPOLOGY_DIR / "dgx-a100.txt")
    node = FakeNode(gpus, str(tmp_path))
    pod = node.pod("jupyter-alice", {"notebook": (25, 16, (0,))})
    node.run(pod, "notebook", 0, memory_mib=1500, utilization=15)
    server = MetricsServer(NODE, gpus, node, minter, address="127.0.0.1", port=0, period=0.05,
                           proc_root=node.proc_root, scrape_token=SCRAPE_TOKEN)
    server.start()
    try:
        wait_for_samples(server.sampler, 2)
        gpus.failing = "NVML_ERROR_GPU_IS_LOST"
        wait_for_samples(server.sampler, 2)
        metrics = scrape(server, "/metrics")
        assert metrics[c.METRIC_SAMPLE_STALE] == {labels(node=NODE): 1.0}
        # last known numbers, not a hole
        assert metrics[c.METRIC_CONTAINER_MEMORY_USED][labels(
            node=NODE, namespace="hub", pod="jupyter-alice", container="notebook", gpu="0",
            uuid=node.card_uuid(0))] == 1500 * MIB
        with urllib.request.urlopen(server.url + "/healthz", timeout=30) as response:
            body = response.read().decode()
        assert '"stale":true' in body and "NVML_ERROR_GPU_IS_LOST" in body
        gpus.failing = None
        wait_for_samples(server.sampler, 2)
        assert scrape(server, "/metrics")[c.METRIC_SAMPLE_STALE] == {labels(node=NODE): 0.0}
    finally:
        server.stop()


def test_port_in_use_raises_from_start_and_stop_frees_the_port(fake_node: FakeNode, minter: TokenMinter) -> None:
    first = MetricsServer(NODE, fake_node.gpus, fake_node, minter, address="127.0.0.1", port=0,
                          proc_root=fake_node.proc_root)
    first.start()
    port = first.port
    assert port
    clash = MetricsServer(NODE, fake_node.gpus, fake_node, minter, address="127.0.0.1", port=port,
                          proc_root=fake_node.proc_root)
    with pytest.raises(OSError):
        clash.start()
    first.stop()
    first.stop()  # idempotent
    with pytest.raises((urllib.error.URLError, ConnectionError, socket.timeout)):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)
    again = MetricsServer(NODE, fake_node.gpus, fake_node, minter, address="127.0.0.1", port=port,
                          proc_root=fake_node.proc_root)
    again.start()  # a restarted daemon gets its port back
    try:
        with urllib.request.urlopen(again.url + "/healthz", timeout=30) as response:
            assert response.status == 200
    finally:
        again.stop()


def test_unknown_enforcement_is_refused(fake_node: FakeNode, minter: TokenMinter) -> None:
    with pytest.raises(ValueError, match="enforcement 'magic'"):
        MetricsServer(NODE, fake_node.gpus, fake_node, minter, enforcement="magic")


def test_scrape_does_not_call_the_backend(server: MetricsServer, fake_node: FakeNode) -> None:
    wait_for_samples(server.sampler, 1)
    server.sampler.stop()  # nothing samples any more
    calls = []
    original = fake_node.gpus.sample
    fake_node.gpus.sample = lambda: calls.append(1) or original()
    for _ in range(5):
        scrape(server, "/metrics")
        scrape(server, "/metric")
    assert calls == []


def test_lost_card_is_unhealthy_in_the_next_scrape(server: MetricsServer, fake_node: FakeNode) -> None:
    pod = fake_node.pod("jupyter-alice", {"notebook": (25, 16, (6,))})
    fake_node.run(pod, "notebook", 6, memory_mib=1000, utilization=10)
    wait_for_samples(server.sampler, 2)
    healthy = scrape(server, "/metrics")[c.METRIC_CARD_HEALTHY]
    assert set(healthy.values()) == {1.0}
    fake_node.gpus.lose_card(6)
    wait_for_samples(server.sampler, 2)
    metrics = scrape(server, "/metrics")
    card6 = labels(node=NODE, gpu="6", uuid=fake_node.card_uuid(6), model="NVIDIA A100-SXM4-40GB")
    assert metrics[c.METRIC_CARD_HEALTHY][card6] == 0.0
    assert sum(v == 0.0 for v in metrics[c.METRIC_CARD_HEALTHY].values()) == 1
    assert c.METRIC_PROCESS_MEMORY_USED not in metrics  # NVML cannot reach the card's processes
    # the share is still held: the pod has not given it back
    assert metrics[c.METRIC_CARD_ALLOCATED_CORES][card6] == 25


def test_mig_slices_have_memory_and_health_but_no_made_up_utilisation(fake_node: FakeNode, minter: TokenMinter) -> None:
    made = fake_node.gpus.set_mig_layout(5, ["2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"])
    fake_node.gpus.start_process(900, 5, 4096, 14, mig_device=made[3].uuid)
    fake_node.gpus.set_usage(900, 3000, 50)
    erin = fake_node.pod("jupyter-erin", {"notebook": (20, 32, (5,))})
    put_on_slice(erin, made[1].uuid)
    fake_node.pod("jupyter-frank", {"notebook": (30, 16, (2,))})  # a time-shared neighbour on a whole card
    server = MetricsServer(NODE, fake_node.gpus, fake_node, minter, address="127.0.0.1", port=0, period=0.05,
                           proc_root=fake_node.proc_root, enforcement="hami-core", scrape_token=SCRAPE_TOKEN)
    server.start()
    try:
        wait_for_samples(server.sampler, 2)
        fake_node.gpus.fail_slice(made[0].uuid)
        wait_for_samples(server.sampler, 3)
        metrics = scrape(server, "/metrics")
    finally:
        server.stop()
    one_g = labels(node=NODE, gpu="5", uuid=made[3].uuid, profile="1g.5gb")
    assert metrics[c.METRIC_SLICE_MEMORY_USED][one_g] == 3000 * MIB
    assert metrics[c.METRIC_SLICE_MEMORY_TOTAL][one_g] == 5120 * MIB
    assert len(metrics[c.METRIC_SLICE_MEMORY_TOTAL]) == 4
    assert sorted(metrics[c.METRIC_SLICE_HEALTHY].values()) == [0.0, 1.0, 1.0, 1.0]
    assert c.METRIC_SLICE_UTILIZATION not in metrics   # "not available", never a 0 nobody measured
    # nor for the card in MIG mode as a whole, nor for the container on a slice; whole cards as before
    assert {key for key in metrics[c.METRIC_CARD_UTILIZATION] if ("gpu", "5") in key} == set()
    assert len(metrics[c.METRIC_CARD_UTILIZATION]) == len(metrics[c.METRIC_CARD_HEALTHY]) - 1
    containers = {dict(key)["pod"] for key in metrics[c.METRIC_CONTAINER_UTILIZATION]}
    assert "jupyter-frank" in containers and "jupyter-erin" not in containers
    assert "jupyter-erin" in {dict(key)["pod"] for key in metrics[c.METRIC_CONTAINER_MEMORY_USED]}
