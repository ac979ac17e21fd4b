"""Parsers and small pieces of the adapters and requesters, with bad input."""

from __future__ import annotations

import json

import pytest
from vgpu_plugin.demo.requester import ENV_SHARE_REQUEST, KubeRecreateRequester, next_pod_name

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import RequestError
from jupyter_vgpu.requesters.base import parse_share
from jupyter_vgpu.sources.base import SourceSettings, env_allocation
from jupyter_vgpu.sources.gpu_manager import (
    VCUDA_CONFIG_MIN_SIZE,
    GpuManagerSource,
    VcudaConfig,
    encode_vcuda_config,
    parse_prometheus,
    parse_vcuda_config,
)
from jupyter_vgpu.sources.local_nvml import backend_factory
from jupyter_vgpu.sources.registry import detect, make_source

NAMES = contract.DEFAULT_NAMES


def test_vcuda_config_round_trip_and_bad_files():
    config = VcudaConfig("uid", "nb", "0000:3B:00.0", 3 * 1024**3, 40, False)
    assert parse_vcuda_config(encode_vcuda_config(config)) == config
    with pytest.raises(ValueError, match=f"shorter than vcuda-controller's {VCUDA_CONFIG_MIN_SIZE}-byte"):
        parse_vcuda_config(b"\0" * 100)
    broken = bytearray(encode_vcuda_config(config))
    broken[8216:8220] = (250).to_bytes(4, "little")
    with pytest.raises(ValueError, match="utilization 250 is not a percentage"):
        parse_vcuda_config(bytes(broken))


def test_gpu_manager_with_a_corrupt_config_says_which_file(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / contract.GM_VCUDA_CONFIG_NAME).write_bytes(b"garbage")
    answer = GpuManagerSource(SourceSettings(vcuda_config_dir=str(tmp_path), environ={})).allocation()
    assert answer["state"] == "none" and str(tmp_path / "x") in answer["message"]
    usage = GpuManagerSource(SourceSettings(vcuda_config_dir=str(tmp_path), environ={})).usage()
    assert usage["state"] == "unreachable" and "HOST_IP" in usage["message"]


def test_prometheus_text_parser():
    text = '\n'.join([
        "# HELP x help", "# TYPE x gauge",
        'x{pod_name="a\\"b",namespace="n"} 1.5',
        "y 2", "not a sample", 'z{a="1"} NaN-ish',
    ])
    assert parse_prometheus(text) == [("x", {"pod_name": 'a"b', "namespace": "n"}, 1.5), ("y", {}, 2.0)]


@pytest.mark.parametrize(("cores", "memory", "expected"), [
    (25, "4GiB", (25, 16)), ("25", "4096MiB", (25, 16)), (25, 16, (25, 16)), (25, "16", (25, 16)),
    (100, None, (100, 0)), (0, None, (0, 0)),
])
def test_parse_share(cores, memory, expected):
    assert parse_share(cores, memory) == expected


@pytest.mark.parametrize(("cores", "memory", "words"), [
    (0, "4GiB", "releases the share"), (25, None, "needs vcuda-memory"), (25, "1000MiB", "multiple of 256 MiB"),
    ("lots", "4GiB", "not a quantity"), (True, "4GiB", "not a count"), (101, None, "did you mean 100 or 200"),
    (25, "4PiB", "unknown unit"), (25, [16], "use a size such as"), (25, 4.5, "use a size such as"),
    ({"n": 1}, "4GiB", "not a count"),
])
def test_parse_share_refuses(cores, memory, words):
    with pytest.raises(RequestError, match=words):
        parse_share(cores, memory)


def test_parse_share_enforces_the_hub_ceiling():
    env = {contract.ENV_HUB_MAX_CORES: "50", contract.ENV_HUB_MAX_MEMORY_MIB: "8192"}
    assert parse_share(50, "8GiB", env) == (50, 32)
    with pytest.raises(RequestError, match="more than your limit of 50"):
        parse_share(100, None, env)


def test_env_allocation():
    assert env_allocation({}) is None and env_allocation({contract.ENV_CORES: "x"}) is None
    allocation = env_allocation({contract.ENV_CORES: "200", contract.ENV_MEMORY_MIB: "81920",
                                 contract.ENV_DEVICE_UUIDS: "GPU-a,GPU-b", contract.ENV_DEVICE_INDICES: "0,3"})
    assert [(c["index"], c["uuid"], c["cores"], c["memoryMib"]) for c in allocation["cards"]] == \
        [(0, "GPU-a", 100, 40960), (3, "GPU-b", 100, 40960)]
    # the container's env is the user's to change: an index int() cannot read is skipped, not a crash
    allocation = env_allocation({contract.ENV_CORES: "25", contract.ENV_MEMORY_MIB: "4096",
                                 contract.ENV_DEVICE_INDICES: "\u00b2,1"})
    assert [c["index"] for c in allocation["cards"]] == [1]


def test_source_choice(tmp_path):
    with pytest.raises(ValueError, match="unknown vGPU fact source 'nope'"):
        make_source(SourceSettings(source="nope", environ={}))
    with pytest.raises(ValueError, match="use 'nvml' or 'simulated:"):
        backend_factory("cuda")
    env = {contract.ENV_METRICS_URL: "http://x", contract.ENV_TOKEN: "t"}
    assert detect(SourceSettings(environ=env)) == "node-api"
    (tmp_path / contract.GM_VCUDA_CONFIG_NAME).write_bytes(b"")
    assert detect(SourceSettings(environ={}, vcuda_config_dir=str(tmp_path))) == "gpu-manager"
    assert make_source(SourceSettings(environ={contract.ENV_NOTEBOOK_SOURCE: "none"})).name == "none"


def test_next_pod_name():
    assert next_pod_name("alice") == "alice-v2" and next_pod_name("alice-v2") == "alice-v3"
    assert len(next_pod_name("a" * 63)) == 63


def test_recreated_pod_spec():
    old = {
        "metadata": {"name": "nb", "namespace": "jupyter", "uid": "u", "resourceVersion": "9",
                     "labels": {"app": "jupyter"},
                     "annotations": {NAMES.allocation: "{}", NAMES.predicate_gpu_idx(0): "1", NAMES.gpu_assigned: "true",
                                     NAMES.predicate_node: "n", NAMES.predicate_time: "1", "keep": "me",
                                     NAMES.mig_slice(0): "MIG-old", NAMES.isolation: "mig"}},
        "spec": {"nodeName": "n", "schedulerName": contract.SCHEDULER_NAME, "containers": [
            {"name": "sidecar"},
            {"name": "notebook", "resources": {"limits": {"cpu": "1", NAMES.core_resource: "25", NAMES.memory_resource: "16"},
                                               "requests": {"cpu": "1"}}}]},
        "status": {"phase": "Running"},
    }
    requester = KubeRecreateRequester("kc", "jupyter", "nb", "notebook")
    requester.request_id = "r1-0123abcd"  # as the tracker sets it before request()
    new = requester.new_pod(old, 50, 32)
    recorded = new["spec"]["containers"][1].pop("env")
    assert [e["name"] for e in recorded] == [ENV_SHARE_REQUEST]  # in the notebook container only
    asked = json.loads(recorded[0]["value"])
    assert (asked["from"], asked["cores"], asked["memoryUnits"], asked["id"]) == ("nb", 50, 32, "r1-0123abcd")
    assert new["metadata"] == {"name": "nb-v2", "namespace": "jupyter", "labels": {"app": "jupyter"},
                               "annotations": {"keep": "me", NAMES.isolation: "mig"}}  # asks for a slice again
    assert "nodeName" not in new["spec"] and "status" not in new
    limits = new["spec"]["containers"][1]["resources"]["limits"]
    assert limits == {"cpu": "1", NAMES.core_resource: "50", NAMES.memory_resource: "32"}
    assert new["spec"]["containers"][0] == {"name": "sidecar"}
    released = requester.new_pod(old, 0, 0)
    assert released["spec"]["containers"][1]["resources"] == {"limits": {"cpu": "1"}, "requests": {"cpu": "1"}}


def test_auto_on_a_machine_without_a_driver_degrades_cleanly(tmp_path):
    """NVML is real here (nvidia-ml-py, no driver): detection must not raise, and says none."""
    from jupyter_vgpu.gpu.nvml import NVMLBackend

    nvml = NVMLBackend()
    expected = "local-nvml" if nvml.available() else "none"
    source = make_source(SourceSettings(environ={}, vcuda_config_dir=str(tmp_path)))
    assert source.name == expected
    if expected == "none":
        assert "%vgpu request" in source.allocation()["message"] and nvml.problem()
