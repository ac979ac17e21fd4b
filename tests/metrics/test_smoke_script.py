"""The smoke test's node-API half (deploy/examples/smoke-test.yaml) against the real metrics
server: the script, read out of the manifest, reads its allocation and finds its own memory
in the per-pod usage with the container's token, as it will in a pod on a GPU node."""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from metrics_support import NODE, FakeNode, token_of, wait_for_samples
from vgpu_plugin.metrics import MetricsServer
from vgpu_plugin.tokens import TokenMinter

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "smoke-test.yaml"


def smoke_script() -> types.ModuleType:
    (config,) = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d["kind"] == "ConfigMap"]
    module = types.ModuleType("smoke")
    exec(compile(config["data"]["smoke.py"], "smoke.py", "exec"), module.__dict__)
    return module


@pytest.fixture
def smoke_pod(fake_node: FakeNode) -> dict[str, Any]:
    """The Job's pod as the device plugin left it: a quarter of card 1 with 4 GiB, 1.5 GiB in use."""
    pod = fake_node.pod("vgpu-smoke-test-x2x9c", {"smoke": (25, 16, (1,))}, namespace="default")
    fake_node.run(pod, "smoke", 1, memory_mib=1500, utilization=22)
    return pod


@pytest.fixture
def server(fake_node: FakeNode, minter: TokenMinter, smoke_pod: dict[str, Any]) -> Iterator[MetricsServer]:
    server = MetricsServer(NODE, fake_node.gpus, fake_node, minter, address="127.0.0.1", port=0, period=0.05,
                           proc_root=fake_node.proc_root, enforcement="hami-core")
    server.start()
    yield server
    server.stop()


def pod_env(server: MetricsServer, minter: TokenMinter, pod: dict[str, Any], fake_node: FakeNode) -> dict[str, str]:
    return {"VGPU_CORES": "25", "VGPU_MEMORY_MIB": "4096", "VGPU_DEVICE_UUIDS": fake_node.card_uuid(1),
            "VGPU_METRICS_URL": server.url, "VGPU_TOKEN": token_of(minter, pod, 0), "VGPU_ENFORCEMENT": "hami-core"}


def test_script_reads_its_allocation_and_sees_its_usage(server, minter, smoke_pod, fake_node):
    smoke = smoke_script()
    env = pod_env(server, minter, smoke_pod, fake_node)
    share = smoke.share_from_env(env)
    allocation = smoke.check_allocation(env, share)
    assert (allocation["pod"], allocation["cores"], allocation["memoryMib"]) == ("vgpu-smoke-test-x2x9c", 25, 4096)
    usage = smoke.wait_for_usage(env, 1024, work=lambda: wait_for_samples(server.sampler, 1))
    assert usage["current"]["memoryUsedMib"] == 1500 and usage["limits"] == {"cores": 25, "memoryMib": 4096}


def test_script_reports_a_usage_that_never_shows(server, minter, smoke_pod, fake_node):
    smoke = smoke_script()
    env = pod_env(server, minter, smoke_pod, fake_node)
    ticks = iter(range(1000))
    with pytest.raises(smoke.SmokeError, match="never showed this container's memory: last 1500"):
        smoke.wait_for_usage(env, 8000, work=lambda: wait_for_samples(server.sampler, 1), timeout=3,
                             clock=lambda: float(next(ticks)))


def test_script_reports_a_mismatch_a_refused_token_and_an_unreachable_port(server, minter, smoke_pod, fake_node):
    smoke = smoke_script()
    env = pod_env(server, minter, smoke_pod, fake_node)
    with pytest.raises(smoke.SmokeError, match="the environment says 50, 4096 MiB"):
        smoke.check_allocation(env, {**smoke.share_from_env(env), "cores": 50})
    with pytest.raises(smoke.SmokeError, match="answered HTTP 403.*not valid on this node"):
        smoke.node_api({**env, "VGPU_TOKEN": "forged"}, "allocation")
    closed = "http://127.0.0.1:9"
    with pytest.raises(smoke.SmokeError, match="hostPort needs the CNI portmap plugin"):
        smoke.node_api({**env, "VGPU_METRICS_URL": closed}, "allocation")
    with pytest.raises(smoke.SmokeError, match="did not set VGPU_TOKEN"):
        smoke.share_from_env({k: v for k, v in env.items() if k != "VGPU_TOKEN"})
