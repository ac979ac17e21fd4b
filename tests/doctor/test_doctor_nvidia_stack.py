"""`jupyter-vgpu doctor` against NVIDIA's own stack on the node: its device plugin serving the same
cards (GPU Operator, GKE), and the container toolkit letting any pod pick cards by
NVIDIA_VISIBLE_DEVICES."""

from __future__ import annotations

import json

import pytest
from doctor_support import NODE, TOOLKIT_HARDENED, argv
from vgpu_plugin.doctor.checks import run_checks
from vgpu_plugin.doctor.main import main
from vgpu_plugin.doctor.report import FAIL, OK, WARN, exit_code

from jupyter_vgpu.core.contract import Names

ENVVAR_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"
TOOLKIT = "etc/nvidia-container-runtime/config.toml"
OPERATOR_TOOLKIT = "usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml"


def finding(setup, name):
    (found,) = [f for f in run_checks(setup) if f.check == name]
    return found


def advertise(node, resources: dict[str, str]) -> None:
    """kubelet's node status with another device plugin's resources beside ours."""
    status = node.core.read_node(NODE).status
    node.core.patch_node_status(NODE, {"status": {"capacity": {**status.capacity, **resources},
                                                  "allocatable": {**status.allocatable, **resources}}})


# --- NVIDIA's device plugin on a vGPU node ---------------------------------------------------


@pytest.mark.parametrize("resources", [
    {"nvidia.com/gpu": "4"},                 # the GPU Operator's / GKE's plugin
    {"nvidia.com/gpu.shared": "16"},         # NVIDIA's time-slicing with renamed resources
    {"nvidia.com/mig-1g.5gb": "7"},          # NVIDIA's mixed MIG strategy
])
def test_nvidia_device_plugin_beside_ours_fails_with_how_to_turn_it_off(healthy, resources):
    advertise(healthy, resources)
    result = finding(healthy.setup, "nvidia-plugin")
    (name, count), = resources.items()
    assert result.status == FAIL, result
    assert f"{name}: {count}" in result.detail and "next to 400 tencent.com/vcuda-core" in result.detail
    assert "nvidia.com/gpu.deploy.device-plugin=false" in result.remedy
    assert "devicePlugin.enabled=false" in result.remedy
    assert "gke-no-default-nvidia-gpu-device-plugin=true" in result.remedy
    assert exit_code(run_checks(healthy.setup)) == 1


def test_nvidia_gpu_only_in_capacity_still_fails(healthy):
    """Registered but not yet allocatable (or the other way round): either table counts."""
    status = healthy.core.read_node(NODE).status
    healthy.core.patch_node_status(NODE, {"status": {"capacity": {**status.capacity, "nvidia.com/gpu": "4"}}})
    assert finding(healthy.setup, "nvidia-plugin").status == FAIL


def test_a_removed_nvidia_plugin_leaving_zero_is_ok(healthy):
    """kubelet keeps a gone plugin's resource at 0 until it restarts: nothing hands those cards out."""
    advertise(healthy, {"nvidia.com/gpu": "0"})
    result = finding(healthy.setup, "nvidia-plugin")
    assert result.status == OK and "only this device plugin" in result.detail


def test_the_rival_check_uses_the_configured_resource_domain(healthy):
    healthy.setup.names = Names(domain="example.org")
    status = healthy.core.read_node(NODE).status
    healthy.core.patch_node_status(NODE, {"status": {"allocatable": {
        **status.allocatable, "example.org/vcuda-core": "200", "nvidia.com/gpu": "2"}}})
    result = finding(healthy.setup, "nvidia-plugin")
    assert result.status == FAIL and "next to 200 example.org/vcuda-core" in result.detail


def test_without_the_api_the_rival_check_is_left_to_the_skipped_cluster_checks(healthy):
    healthy.setup.api = None
    assert not [f for f in run_checks(healthy.setup) if f.check == "nvidia-plugin"]


# --- the container toolkit: NVIDIA_VISIBLE_DEVICES from unprivileged pods --------------------


def test_a_hardened_toolkit_with_cdi_is_ok(healthy):
    result = finding(healthy.setup, "toolkit-config")
    assert result.status == OK, result
    assert f"/{TOOLKIT}: {ENVVAR_KEY} = false" in result.detail


@pytest.mark.parametrize(("text", "how"), [
    ("", "is not set (the toolkit's default is true)"),  # nvidia-ctk's generated file leaves it commented out
    (f"#{ENVVAR_KEY} = true\n", "is not set (the toolkit's default is true)"),
    (f"{ENVVAR_KEY} = true\n", "= true"),
    (f"{ENVVAR_KEY} = true\naccept-nvidia-visible-devices-as-volume-mounts = true\n", "= true"),
])
def test_a_toolkit_accepting_the_variable_from_unprivileged_pods_warns(healthy, text, how):
    (healthy.root / TOOLKIT).write_text(text + '\n[nvidia-container-cli]\nload-kmods = true\n')
    result = finding(healthy.setup, "toolkit-config")
    assert result.status == WARN, result
    assert f"{ENVVAR_KEY} {how}" in result.detail and "NVIDIA_VISIBLE_DEVICES=all" in result.detail
    assert f"{ENVVAR_KEY} = false" in result.remedy and "--cdi" in result.remedy


def test_no_toolkit_config_is_not_available_rather_than_ok(healthy):
    """The vgpu-node pod does not mount the host's /etc: say so, and that the default accepts the variable."""
    (healthy.root / TOOLKIT).unlink()
    result = finding(healthy.setup, "toolkit-config")
    assert result.status == WARN and result.detail.startswith("not available:")
    assert "without the file the toolkit accepts it" in result.detail and "--host-root" in result.remedy


def test_the_gpu_operators_toolkit_config_is_found_and_a_given_path_wins(healthy):
    (healthy.root / TOOLKIT).unlink()
    operator = healthy.root / OPERATOR_TOOLKIT
    operator.parent.mkdir(parents=True)
    operator.write_text(f"{ENVVAR_KEY} = true\n")
    result = finding(healthy.setup, "toolkit-config")
    assert result.status == WARN and result.detail.startswith(f"/{OPERATOR_TOOLKIT}: {ENVVAR_KEY} = true")
    elsewhere = healthy.root / "opt/toolkit/config.toml"
    elsewhere.parent.mkdir(parents=True)
    elsewhere.write_text(TOOLKIT_HARDENED)
    healthy.setup.toolkit_config = "/opt/toolkit/config.toml"
    result = finding(healthy.setup, "toolkit-config")
    assert result.status == OK and result.detail.startswith("/opt/toolkit/config.toml:")


def test_hardened_toolkit_without_cdi_warns_that_vgpu_pods_lose_their_cards(healthy):
    """The device plugin hands cards by NVIDIA_VISIBLE_DEVICES unless --cdi: refused in unprivileged pods."""
    healthy.setup.cdi = False
    result = finding(healthy.setup, "toolkit-config")
    assert result.status == WARN and "vGPU pods get no GPU" in result.detail
    assert "--cdi=true" in result.remedy


def test_a_malformed_toolkit_config_warns(healthy):
    (healthy.root / TOOLKIT).write_text(f"{ENVVAR_KEY} = = false\n")
    result = finding(healthy.setup, "toolkit-config")
    assert result.status == WARN and "not valid TOML" in result.detail


def test_toolkit_flags_and_environment(healthy, kube, capsys, monkeypatch):
    """--toolkit-config / $VGPU_DOCTOR_TOOLKIT_CONFIG under --host-root; --cdi falls back to the daemon's $VGPU_CDI."""
    (healthy.root / TOOLKIT).unlink()
    moved = healthy.root / "srv/toolkit.toml"
    moved.parent.mkdir(parents=True)
    moved.write_text(TOOLKIT_HARDENED)
    args = argv(healthy, kube)
    del args[args.index("--cdi"):args.index("--cdi") + 2]
    monkeypatch.setenv("VGPU_CDI", "true")
    assert main([*args, "--toolkit-config", "/srv/toolkit.toml", "--json"]) == 0
    checks = {c["check"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["toolkit-config"]["status"] == "ok" and checks["toolkit-config"]["detail"].startswith("/srv/toolkit.toml")
    monkeypatch.setenv("VGPU_DOCTOR_TOOLKIT_CONFIG", "/srv/toolkit.toml")
    monkeypatch.setenv("VGPU_CDI", "false")
    main([*args, "--json"])
    checks = {c["check"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["toolkit-config"]["status"] == "warn" and "vGPU pods get no GPU" in checks["toolkit-config"]["detail"]
