"""kubelet's checkpoint format, the command line, and the ledger across restarts and deletions."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys

import pytest
from deviceplugin_support import (
    CORE,
    MEMORY,
    NAMES,
    annotations,
    confirmed_record,
    make_node,
    place_pod,
)
from simkube.waiting import wait_for
from vgpu_plugin.demo.kubelet import SimKubelet
from vgpu_plugin.deviceplugin.checkpoint import (
    CheckpointError,
    PodDeviceEntry,
    parse_checkpoint,
    read_checkpoint,
    write_checkpoint,
)

from jupyter_vgpu.core.contract import Request

# as kubelet >= 1.20 writes it (NUMA map); the AllocResp bytes are a serialized ContainerAllocateResponse
KUBELET_CHECKPOINT = {
    "Data": {
        "PodDeviceEntries": [
            {"PodUID": "5b9d7c2e-1111-2222-3333-444455556666", "ContainerName": "notebook",
             "ResourceName": "tencent.com/vcuda-core", "DeviceIDs": {"0": ["gpu1-core-01", "gpu1-core-00"]},
             "AllocResp": base64.b64encode(b"\n\x0b\n\x03KEY\x12\x04val1").decode()},
            {"PodUID": "5b9d7c2e-1111-2222-3333-444455556666", "ContainerName": "notebook",
             "ResourceName": "nvidia.com/gpu", "DeviceIDs": {"-1": ["GPU-abc"]}, "AllocResp": ""},
        ],
        "RegisteredDevices": {"tencent.com/vcuda-core": ["gpu1-core-00", "gpu1-core-01"]},
    },
    "Checksum": 1234567,
}


def test_reads_kubelets_checkpoint():
    entries = parse_checkpoint(json.dumps(KUBELET_CHECKPOINT))
    assert entries[0] == PodDeviceEntry("5b9d7c2e-1111-2222-3333-444455556666", "notebook", CORE,
                                        ("gpu1-core-00", "gpu1-core-01"), b"\n\x0b\n\x03KEY\x12\x04val1")
    assert entries[1].resource == "nvidia.com/gpu" and entries[1].device_ids == ("GPU-abc",)


def test_reads_the_old_list_format():
    old = json.loads(json.dumps(KUBELET_CHECKPOINT))
    old["Data"]["PodDeviceEntries"][0]["DeviceIDs"] = ["gpu1-core-00"]
    assert parse_checkpoint(json.dumps(old))[0].device_ids == ("gpu1-core-00",)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: "not json", "not JSON"),
    (lambda d: {"Checksum": 1}, "no 'Data' object"),
    (lambda d: d["Data"]["PodDeviceEntries"][0].pop("PodUID") and d, "PodDeviceEntries[0] lacks PodUID"),
    (lambda d: d["Data"]["PodDeviceEntries"][0].update(DeviceIDs=5) or d, "neither a list nor a NUMA map"),
    (lambda d: d["Data"]["PodDeviceEntries"][0].update(AllocResp="%%") or d, "AllocResp is not base64"),
])
def test_malformed_checkpoints_are_refused_with_the_reason(mutate, message):
    data = mutate(json.loads(json.dumps(KUBELET_CHECKPOINT)))
    with pytest.raises(CheckpointError, match=re.escape(message)):
        parse_checkpoint(data if isinstance(data, str) else json.dumps(data))


def test_write_then_read_round_trips(tmp_path):
    path = str(tmp_path / "kubelet_internal_checkpoint")
    assert read_checkpoint(path) == []
    entry = PodDeviceEntry("uid-1", "c0", CORE, ("gpu0-core-00", "gpu2-core-00"), b"resp")
    write_checkpoint(path, [entry], {CORE: ["gpu0-core-00", "gpu2-core-00"]},
                     {"gpu0-core-00": 0, "gpu2-core-00": 1})
    raw = json.load(open(path))
    assert raw["Data"]["PodDeviceEntries"][0]["DeviceIDs"] == {"0": ["gpu0-core-00"], "1": ["gpu2-core-00"]}
    assert isinstance(raw["Checksum"], int)
    assert read_checkpoint(path) == [entry]
    assert [p for p in os.listdir(tmp_path)] == ["kubelet_internal_checkpoint"]


def test_help_explains_every_flag():
    out = subprocess.run([sys.executable, "-m", "vgpu_plugin.deviceplugin.main", "--help"], capture_output=True,
                         text=True, check=True).stdout
    for flag, env in [("--node", "$NODE_NAME"), ("--gpus", "$VGPU_GPUS"), ("--plugin-dir", "$VGPU_PLUGIN_DIR"),
                      ("--enforcement", "$VGPU_ENFORCEMENT"), ("--kubeconfig", "$KUBECONFIG"),
                      ("--domain", "$VGPU_RESOURCE_DOMAIN"), ("--state-dir", "$VGPU_STATE_DIR"),
                      ("--metrics-port", "$VGPU_METRICS_PORT"), ("--sim-memory", "$VGPU_SIM_MEMORY_MIB")]:
        assert flag in out and env in out, flag


def test_missing_node_is_a_clear_error():
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    result = subprocess.run([sys.executable, "-m", "vgpu_plugin.deviceplugin.main", "--gpus", "sim:dgx-a100"],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 2 and "--node (or $NODE_NAME) is required" in result.stderr


def test_bad_backend_is_a_clear_error(tmp_path):
    result = subprocess.run([sys.executable, "-m", "vgpu_plugin.deviceplugin.main", "--node", "n", "--gpus", "cuda",
                             "--kubeconfig", str(tmp_path / "none")], capture_output=True, text=True)
    assert result.returncode == 2 and "use 'nvml' or 'sim:FIXTURE'" in result.stderr


def test_the_command_runs_registers_and_stops_on_sigterm(kube, plugin_dir, tmp_path, core_v1):
    kubelet = SimKubelet("node-1", plugin_dir, kube.api_client()).start()
    try:
        env = {**os.environ, "NODE_NAME": "node-1", "VGPU_GPUS": "sim:a100-sxm-4gpu-nv4",
               "VGPU_PLUGIN_DIR": plugin_dir, "KUBECONFIG": kube.kubeconfig, "VGPU_STATE_DIR": str(tmp_path / "s"),
               "VGPU_SIM_MEMORY_MIB": "16384", "VGPU_METRICS_PORT": "0", "VGPU_METRICS_ADDRESS": "127.0.0.1"}
        daemon = subprocess.Popen([sys.executable, "-m", "vgpu_plugin.deviceplugin.main"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            kubelet.wait_for(lambda: kubelet.registered(CORE) and kubelet.registered(MEMORY), 60)
            assert len(kubelet.devices(MEMORY)) == 4 * 64  # --sim-memory from the environment
            assert (tmp_path / "s" / "token-secret").stat().st_mode & 0o777 == 0o600
        finally:
            daemon.send_signal(signal.SIGTERM)
            output, _ = daemon.communicate(timeout=30)
        assert daemon.returncode == 0, output
        assert "registered tencent.com/vcuda-core" in output and "node daemon for node-1 stopped" in output
    finally:
        kubelet.stop()


def test_restart_rebuilds_from_annotations_without_a_checkpoint(daemons, peer, gpus, core_v1):
    from deviceplugin_support import all_ids, serve_pod, wait_registered

    make_node(core_v1)
    first = daemons(gpus)
    wait_registered(peer)
    serve_pod(core_v1, gpus, peer)
    first.stop()
    second = daemons(gpus)  # this kubelet keeps no checkpoint: the annotations are the record
    wait_registered(peer, 4)
    assert second.wait_ready(10)
    assert second.allocator.usage() == {0: (70, 20)}
    place_pod(core_v1, gpus, "b", [(Request(40, 8), (0,))])  # would over-commit card 0
    import grpc

    with pytest.raises(grpc.RpcError) as caught:
        peer.allocate(CORE, [f"gpu1-core-{n:02d}" for n in range(40)])
    assert "card 0 cannot take 40 cores" in caught.value.details()
    # deleting "a" frees the card for "b"
    core_v1.delete_namespaced_pod("a", "default")
    wait_for(lambda: second.allocator.usage() == {}, timeout=20)
    _, answer = peer.admit(CORE, 40, all_ids("core"))
    assert answer.envs["VGPU_POD_NAME"] == "b"


def test_the_same_daemon_object_can_be_stopped_and_started_again(daemons, peer, gpus, core_v1):
    from deviceplugin_support import all_ids, wait_registered

    make_node(core_v1)
    daemon = daemons(gpus)
    wait_registered(peer)
    place_pod(core_v1, gpus, "a", [(Request(30, 10), (2,))])
    peer.admit(CORE, 30, all_ids("core"))
    peer.admit(MEMORY, 10, all_ids("memory"))
    wait_for(lambda: annotations(core_v1, "a").get(NAMES.gpu_assigned) == "true", timeout=20)
    daemon.stop()
    assert not os.path.exists(os.path.join(peer.plugin_dir, "vgpu-core.sock"))
    daemon.start()
    wait_registered(peer, 4)
    assert daemon.wait_ready(10)
    wait_for(lambda: daemon.allocator.usage() == {2: (30, 10)}, timeout=20)
    place_pod(core_v1, gpus, "b", [(Request(30, 10), (2,))])
    ids, answer = peer.admit(CORE, 30, [i for i in all_ids("core") if not i.startswith("gpu2-core-0")
                                        and not i.startswith("gpu2-core-1") and not i.startswith("gpu2-core-2")])
    assert answer.envs["VGPU_POD_NAME"] == "b" and {i[:4] for i in ids} == {"gpu2"}


def test_daemon_killed_with_sigkill_comes_back_with_the_same_assignments(kube, plugin_dir, tmp_path, core_v1):
    from deviceplugin_support import read_pod, sim_gpus

    from jupyter_vgpu.core.contract import PodAllocation

    kubelet = SimKubelet("node-1", plugin_dir, kube.api_client()).start()
    env = {**os.environ, "NODE_NAME": "node-1", "VGPU_GPUS": "sim:a100-sxm-4gpu-nv4", "VGPU_PLUGIN_DIR": plugin_dir,
           "KUBECONFIG": kube.kubeconfig, "VGPU_STATE_DIR": str(tmp_path / "s"), "VGPU_NO_METRICS": "true"}
    gpus = sim_gpus()  # same fixture and host name as the daemon's, so the same UUIDs
    command = [sys.executable, "-m", "vgpu_plugin.deviceplugin.main"]
    daemon = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        kubelet.wait_for(lambda: kubelet.registered(CORE) and kubelet.registered(MEMORY), 60)
        for i, card in enumerate((0, 1, 1, 3)):
            place_pod(core_v1, gpus, f"nb-{i}", [(Request(25, 16), (card,))])
        for i in range(4):
            confirmed_record(core_v1, f"nb-{i}", 60)
        before = {i: annotations(core_v1, f"nb-{i}") for i in range(4)}
        daemon.kill()  # no clean-up at all: stale sockets stay behind
        daemon.wait(10)
        kubelet.wait_for(lambda: not kubelet.registered(CORE), 30)
        daemon = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        kubelet.wait_for(lambda: kubelet.registered(CORE) and kubelet.registered(MEMORY), 60)
        place_pod(core_v1, gpus, "after", [(Request(50, 16), (1,))])  # card 1 has exactly 50 cores left
        wait_for(lambda: annotations(core_v1, "after").get(NAMES.gpu_assigned) == "true", timeout=60)
        assert {i: annotations(core_v1, f"nb-{i}") for i in range(4)} == before
        assert PodAllocation.from_json(annotations(core_v1, "after")[NAMES.allocation]).containers[0].cards[0].index == 1
        place_pod(core_v1, gpus, "too-much", [(Request(10, 4), (1,))])  # a broken placement: card 1 is full
        failed = wait_for(lambda: (lambda p: p if p["status"].get("phase") == "Failed" else None)(
            read_pod(core_v1, "too-much")), timeout=60)
        assert "card 1 cannot take 10 cores" in failed["status"]["message"]
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        kubelet.stop()


@pytest.mark.skipif(__import__("ctypes.util").util.find_library("nvidia-ml") is not None,
                    reason="this machine has an NVIDIA driver")
def test_nvml_node_without_driver_registers_nothing_and_says_why(daemons, peer, core_v1):
    from deviceplugin_support import wait_registered

    from jupyter_vgpu.core.inventory import NodeInventory
    from jupyter_vgpu.gpu.nvml import NVMLBackend

    make_node(core_v1)
    daemons(NVMLBackend())  # the real NVML backend on this GPU-less machine
    wait_registered(peer)
    assert peer.list_devices(CORE) == []
    text = wait_for(lambda: (json.loads(core_v1.read_node("node-1", _preload_content=False).data)["metadata"]
                             .get("annotations") or {}).get(NAMES.node_inventory), timeout=20)
    inventory = NodeInventory.from_json(text)
    assert inventory.problem.startswith("no NVIDIA driver") and inventory.cards == ()
    labels = json.loads(core_v1.read_node("node-1", _preload_content=False).data)["metadata"].get("labels") or {}
    assert NAMES.node_label_gpu not in labels


# The generators stamp their own versions into the stubs (grpcio-tools' GRPC_GENERATED_VERSION,
# protoc's "Protobuf Python Version" and its runtime check); a patch release of either changes
# only these, so the comparison reads past them and the floor test below pins them instead.
_GENERATOR_VERSIONS = [
    re.compile(r"^(GRPC_GENERATED_VERSION = ')[0-9.]+(?='$)", re.M),
    re.compile(r"^(# Protobuf Python Version: )[0-9.]+$", re.M),
    re.compile(r"(_runtime_version\.Domain\.PUBLIC,)\s+\d+,\s+\d+,\s+\d+,", re.M),
]


def _without_generator_versions(text: str) -> str:
    for pattern in _GENERATOR_VERSIONS:
        text, found = pattern.subn(lambda m: m.group(1) + "<version>", text)
        assert found <= 1
    return text


def test_committed_stubs_match_the_proto(tmp_path):
    """Whatever grpcio-tools the lock holds generates the committed stubs, versions aside."""
    from pathlib import Path

    plugin_root = Path(__file__).resolve().parents[2] / "plugin"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", str(plugin_root), f"--python_out={tmp_path}",
                    f"--grpc_python_out={tmp_path}", str(plugin_root / "vgpu_plugin/deviceplugin/api.proto")],
                   check=True)
    for name in ("api_pb2.py", "api_pb2_grpc.py"):
        fresh = _without_generator_versions((tmp_path / "vgpu_plugin/deviceplugin" / name).read_text())
        committed = _without_generator_versions((plugin_root / "vgpu_plugin/deviceplugin" / name).read_text())
        assert fresh == committed, f"run gen_stubs.sh ({name})"


def test_version_masking_still_sees_a_changed_stub():
    """The comparison above can fail: a changed message differs once the versions are read past."""
    from pathlib import Path

    committed = (Path(__file__).resolve().parents[2] / "plugin/vgpu_plugin/deviceplugin/api_pb2_grpc.py").read_text()
    assert "GRPC_GENERATED_VERSION = '<version>'" in _without_generator_versions(committed)
    changed = committed.replace("GRPC_GENERATED_VERSION = '", "GRPC_GENERATED_VERSION = '9").replace(
        "Registration", "Registrar", 1)
    assert _without_generator_versions(changed) != _without_generator_versions(committed)


def test_committed_stubs_need_no_newer_runtime_than_pyproject_allows():
    """The stubs refuse at import a grpcio or protobuf older than the one that generated them, so
    the generator's versions must be the floors pyproject.toml gives users."""
    from pathlib import Path

    import tomllib

    repo = Path(__file__).resolve().parents[2]
    stubs = repo / "plugin/vgpu_plugin/deviceplugin"
    node = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["optional-dependencies"]["node"]
    floors = dict(re.match(r"([a-z-]+)>=([0-9.]+)", spec).groups() for spec in node if spec.startswith(("grpcio", "protobuf")))
    grpc_generated = re.search(r"^GRPC_GENERATED_VERSION = '([0-9.]+)'$", (stubs / "api_pb2_grpc.py").read_text(), re.M)
    protobuf_generated = re.search(r"^# Protobuf Python Version: ([0-9.]+)$", (stubs / "api_pb2.py").read_text(), re.M)
    assert grpc_generated and grpc_generated.group(1) == floors["grpcio"]
    assert protobuf_generated and protobuf_generated.group(1) == floors["protobuf"]


def test_wire_names_are_kubelets():
    from vgpu_plugin.deviceplugin import api_pb2

    service = api_pb2.DESCRIPTOR.services_by_name
    assert service["Registration"].full_name == "v1beta1.Registration"
    assert [m.name for m in service["DevicePlugin"].methods] == [
        "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate", "PreStartContainer"]
    fields = {f.name: f.number for f in api_pb2.ContainerAllocateResponse.DESCRIPTOR.fields}
    assert fields == {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}
    request = {f.name: f.number for f in api_pb2.ContainerPreferredAllocationRequest.DESCRIPTOR.fields}
    assert request == {"available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3}


def test_allocation_record_carries_the_allocation_id_and_reads_older_records():
    from jupyter_vgpu.core.contract import CardShare, ContainerAllocation, PodAllocation

    share = (CardShare(1, "GPU-1", 25, 16),)
    record = PodAllocation("node-1", (ContainerAllocation(0, "nb", share, allocation_id="a-Z_09"),
                                      ContainerAllocation(1, "side", share)))
    text = record.to_json()
    assert PodAllocation.from_json(text) == record
    assert [c.get("allocationId") for c in json.loads(text)["containers"]] == ["a-Z_09", None]  # the scheduler's has none
    older = json.loads(text)
    del older["containers"][0]["allocationId"]
    assert PodAllocation.from_json(json.dumps(older)).containers[0].allocation_id == ""
    for bad in ("a.b", "x y", "é", 7):
        older["containers"][0]["allocationId"] = bad
        with pytest.raises(ValueError, match="allocationId"):
            PodAllocation.from_json(json.dumps(older))
