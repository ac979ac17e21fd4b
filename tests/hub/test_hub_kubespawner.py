"""jupyter_vgpu.hub against real KubeSpawner objects (no Hub, no cluster).

Each test goes the way a spawn goes: the rendered options form, the form data JupyterHub
parses into user_options, JupyterHub's apply_user_options step, KubeSpawner's profile
loading, its pod manifest, then the modify_pod_hook.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
from hub_spawn_support import (
    CORE,
    MEM,
    NAMES,
    hub_config,
    make_spawner,
    make_user,
    notebook_env,
    spawn_pod,
)
from tornado import web
from traitlets.config import Config

from jupyter_vgpu.core import contract
from jupyter_vgpu.hub import (
    CUSTOM_PROFILE_SLUG,
    SHARE_OPTION,
    VGPUHub,
    parse_share_text,
)


async def test_form_offers_shares_with_readable_labels():
    spawner = make_spawner(hub_config())
    form = await spawner.options_form(spawner)
    for label in ("CPU only", "¼ GPU · 20 GiB", "½ GPU · 40 GiB", "1 GPU", "2 GPUs (NVLink)", "Custom vGPU share", "Other…"):
        assert label in form
    assert f'name="profile-option-{CUSTOM_PROFILE_SLUG}--{SHARE_OPTION}"' in form


async def test_quarter_profile_sets_limits_scheduler_and_hints():
    c = hub_config(default_limit={"cores": 100, "memory": "40GiB"})
    pod = await spawn_pod(make_spawner(c), formdata={"profile": ["vgpu-quarter"]})
    limits = pod.spec.containers[0].resources.limits
    assert limits[CORE] == "25" and limits[MEM] == "80"  # 80 x 256 MiB = 20 GiB
    assert contract.parse_container_request(limits, pod.spec.containers[0].resources.requests) == contract.Request(25, 80)
    assert pod.spec.scheduler_name == contract.SCHEDULER_NAME
    env = notebook_env(pod)
    assert env[contract.ENV_HUB_REQUESTED_CORES] == "25"
    assert env[contract.ENV_HUB_REQUESTED_MEMORY_MIB] == str(20 * 1024)
    assert env[contract.ENV_HUB_MAX_CORES] == "100"
    assert env[contract.ENV_HUB_MAX_MEMORY_MIB] == str(40 * 1024)


async def test_cpu_profile_keeps_the_admins_scheduler():
    c = hub_config()
    c.KubeSpawner.scheduler_name = "jhub-user-scheduler"  # what Zero to JupyterHub sets
    pod = await spawn_pod(make_spawner(c), formdata={"profile": ["cpu"]})
    assert pod.spec.scheduler_name == "jhub-user-scheduler"
    assert not (pod.spec.containers[0].resources.limits or {}).keys() & {CORE, MEM}
    assert contract.ENV_HUB_REQUESTED_CORES not in notebook_env(pod)


async def test_switching_profiles_on_one_spawner_drops_old_memory():
    """KubeSpawner merges dict overrides into the spawner; a whole-card profile after a share
    must not keep the share's vcuda-memory."""
    spawner = make_spawner(hub_config())
    await spawn_pod(spawner, formdata={"profile": ["vgpu-quarter"]})
    pod = await spawn_pod(spawner, formdata={"profile": ["vgpu-two"]})
    limits = pod.spec.containers[0].resources.limits
    assert limits[CORE] == "200" and MEM not in limits


async def test_custom_share_from_the_form():
    spawner = make_spawner(hub_config())
    form = {"profile": [CUSTOM_PROFILE_SLUG], f"profile-option-{CUSTOM_PROFILE_SLUG}--{SHARE_OPTION}--unlisted-choice": ["30% 8GiB"]}
    pod = await spawn_pod(spawner, formdata=form)
    limits = pod.spec.containers[0].resources.limits
    assert (limits[CORE], limits[MEM]) == ("30", "32")
    assert pod.spec.scheduler_name == contract.SCHEDULER_NAME


async def test_listed_choice_inside_the_custom_profile():
    spawner = make_spawner(hub_config())
    form = {"profile": [CUSTOM_PROFILE_SLUG], f"profile-option-{CUSTOM_PROFILE_SLUG}--{SHARE_OPTION}": ["vgpu-half"]}
    pod = await spawn_pod(spawner, formdata=form)
    assert pod.spec.containers[0].resources.limits[CORE] == "50"


@pytest.mark.parametrize(
    "text, words",
    [
        ("150% 8GiB", "1-99 %"),
        ("30% 100MiB", "multiple of 256 MiB"),
        ("30%", "not understood"),
        ("lots", "not understood"),
        ("30% 8Ti", "not understood"),  # the form's pattern refuses it; KubeSpawner would, at start
        ("30% " + "9" * 40 + "GiB", "too large or malformed"),
        ("1" * 70 + " GPUs", "characters is not a share"),
    ],
)
async def test_bad_custom_share_is_refused_with_a_reason(text, words):
    spawner = make_spawner(hub_config())
    form = {"profile": [CUSTOM_PROFILE_SLUG], f"profile-option-{CUSTOM_PROFILE_SLUG}--{SHARE_OPTION}--unlisted-choice": [text]}
    with pytest.raises(web.HTTPError) as info:
        await spawn_pod(spawner, formdata=form)
    assert info.value.status_code == 400
    assert words in info.value.jupyterhub_message


async def test_share_profile_without_a_choice_is_a_400():
    """Through the API (the form always sends a choice): KubeSpawner has no default share."""
    spawner = make_spawner(hub_config())
    with pytest.raises(web.HTTPError) as info:
        await spawn_pod(spawner, user_options={"profile": CUSTOM_PROFILE_SLUG})
    assert info.value.status_code == 400 and "needs a share" in info.value.jupyterhub_message


async def test_group_limit_filters_the_form_and_refuses_over_limit_requests():
    c = hub_config(default_limit={"cores": 50, "memory": "20GiB"}, group_limits={"gpu-power": {"cores": 200}})
    plain = make_spawner(c, make_user("bob"))
    form = await plain.options_form(plain)
    assert '"vgpu-quarter"' in form and '"vgpu-half"' not in form and '"vgpu-two"' not in form
    with pytest.raises(web.HTTPError) as info:
        await spawn_pod(plain, user_options={"profile": CUSTOM_PROFILE_SLUG, f"{SHARE_OPTION}--unlisted-choice": "1 GPU"})
    assert "the default limit" in info.value.jupyterhub_message
    power = make_spawner(c, make_user("carol", groups=("gpu-power", "students")))
    pod = await spawn_pod(power, formdata={"profile": ["vgpu-two"]})
    assert pod.spec.containers[0].resources.limits[CORE] == "200"


async def test_user_limit_wins_over_groups():
    c = hub_config(group_limits={"gpu-power": {"cores": 200}}, user_limits={"dave": {"cores": 25, "memory": "4GiB"}})
    spawner = make_spawner(c, make_user("dave", groups=("gpu-power",)))
    with pytest.raises(web.HTTPError) as info:
        await spawn_pod(spawner, user_options={"profile": "vgpu-quarter"})
    assert "user dave's limit" in info.value.jupyterhub_message


async def test_runtime_request_replaces_the_profile_share():
    """What %vgpu request sends: the server's user_options plus vgpu_cores/vgpu_memory_units."""
    spawner = make_spawner(hub_config())
    options = {"profile": "vgpu-quarter", contract.HUB_OPTION_CORES: 40, contract.HUB_OPTION_MEMORY_UNITS: 48}
    pod = await spawn_pod(spawner, user_options=options)
    limits = pod.spec.containers[0].resources.limits
    assert (limits[CORE], limits[MEM]) == ("40", "48")
    assert notebook_env(pod)[contract.ENV_HUB_REQUESTED_MEMORY_MIB] == str(48 * 256)


async def test_runtime_release_drops_the_gpu_and_the_scheduler():
    c = hub_config()
    c.KubeSpawner.scheduler_name = "jhub-user-scheduler"
    spawner = make_spawner(c)
    pod = await spawn_pod(spawner, user_options={"profile": "vgpu-quarter", contract.HUB_OPTION_CORES: 0})
    assert not (pod.spec.containers[0].resources.limits or {}).keys() & {CORE, MEM}
    assert pod.spec.scheduler_name == "jhub-user-scheduler"


@pytest.mark.parametrize(
    "options, words",
    [
        ({contract.HUB_OPTION_CORES: 30}, "needs vgpu_memory_units"),
        ({contract.HUB_OPTION_CORES: 150}, "did you mean 100 or 200"),
        ({contract.HUB_OPTION_CORES: "a lot"}, "not a quantity"),
        ({contract.HUB_OPTION_CORES: 300}, "more than the default limit allows"),
    ],
)
async def test_bad_runtime_request_is_a_400(options, words):
    spawner = make_spawner(hub_config(default_limit={"cores": 200}))
    with pytest.raises(web.HTTPError) as info:
        await spawn_pod(spawner, user_options=options)
    assert info.value.status_code == 400 and words in info.value.jupyterhub_message


async def test_runtime_requests_can_be_turned_off():
    spawner = make_spawner(hub_config(allow_runtime_requests=False))
    pod = await spawn_pod(spawner, user_options={"profile": "vgpu-quarter", contract.HUB_OPTION_CORES: 90, contract.HUB_OPTION_MEMORY_UNITS: 8})
    assert pod.spec.containers[0].resources.limits[CORE] == "25"


async def test_admin_hooks_are_chained():
    calls = []

    async def admin_hook(spawner, pod):
        calls.append("pod")
        pod.metadata.labels["team"] = "ml"
        return pod

    def admin_apply(spawner, options):
        calls.append("options")

    c = Config()
    c.KubeSpawner.modify_pod_hook = admin_hook
    c.KubeSpawner.apply_user_options = admin_apply
    VGPUHub(config=c).configure(c)
    spawner = make_spawner(c)
    pod = await spawn_pod(spawner, user_options={"profile": "vgpu-one"})
    assert calls == ["options", "pod"]
    assert pod.metadata.labels["team"] == "ml" and pod.spec.scheduler_name == contract.SCHEDULER_NAME


async def test_admin_hook_can_add_a_vgpu_and_still_be_checked():
    def admin_hook(spawner, pod):
        pod.spec.containers[0].resources.limits = {CORE: "400"}
        return pod

    c = Config()
    c.KubeSpawner.modify_pod_hook = admin_hook
    c.VGPUHub.default_limit = {"cores": 200}
    VGPUHub(config=c).configure(c)
    with pytest.raises(contract.RequestError, match="4 whole cards is more than the default limit"):
        await spawn_pod(make_spawner(c))


async def test_option_style_and_a_custom_domain():
    c = hub_config(profile_style="option", resource_domain="example.org")
    spawner = make_spawner(c)
    form = await spawner.options_form(spawner)
    assert "vGPU notebook" in form and "Custom vGPU share" not in form
    pod = await spawn_pod(spawner, formdata={"profile": ["vgpu"], f"profile-option-vgpu--{SHARE_OPTION}": ["vgpu-half"]})
    assert pod.spec.containers[0].resources.limits["example.org/vcuda-core"] == "50"


def test_server_role_is_loaded():
    c = hub_config()
    (role,) = [r for r in c.JupyterHub.load_roles if r["name"] == "server"]
    assert role["scopes"] == ["users:activity!user", "access:servers!server", "custom:jupyter-vgpu:restart!server"]
    assert "custom:jupyter-vgpu:restart" in c.JupyterHub.custom_scopes
    (users,) = [r for r in c.JupyterHub.load_roles if r["name"] == "user"]
    assert users["scopes"] == ["self", "custom:jupyter-vgpu:restart!user"]
    assert any("vgpu/restart" in pattern for pattern, *_ in c.JupyterHub.extra_handlers)


@pytest.mark.parametrize(
    "spec, words",
    [
        ({"slug": "x", "display_name": "X", "cores": 150}, "did you mean 100 or 200"),
        ({"slug": "Bad Slug", "display_name": "X", "cores": 25, "memory": "4GiB"}, "lowercase"),
        ({"slug": "x", "display_name": "X", "cores": 25}, "needs vcuda-memory"),
        ({"slug": "x", "display_name": "X", "cores": 25, "memroy": "4GiB"}, "unknown keys"),
    ],
)
def test_bad_share_config_fails_at_hub_start(spec, words):
    c = Config()
    c.VGPUHub.shares = [spec]
    with pytest.raises(ValueError, match=words):
        VGPUHub(config=c).configure(c)


def test_bad_limit_config_fails_at_hub_start():
    c = Config()
    c.VGPUHub.group_limits = {"g": {"cores": 50, "mem": "4GiB"}}
    with pytest.raises(ValueError, match="group g's limit: unknown keys"):
        VGPUHub(config=c).configure(c)


@pytest.mark.parametrize(
    "text, cores, units",
    [("30% 8GiB", 30, 32), ("30 8 GiB", 30, 32), ("30, 8192MiB", 30, 32), ("5/1GB", 5, 4), ("1 GPU", 100, 0), ("2 gpus", 200, 0)],
)
def test_share_text(text, cores, units):
    assert parse_share_text(text) == contract.Request(cores, units)


async def test_vgpu_pods_tolerate_the_gpu_node_taint_and_cpu_pods_do_not():
    """GPU nodes tainted nvidia.com/gpu keep CPU-only pods off (docs/admin.md): vGPU pods tolerate it."""
    pod = await spawn_pod(make_spawner(hub_config()), formdata={"profile": ["vgpu-quarter"]})
    assert [(t.key, t.operator, t.effect) for t in pod.spec.tolerations or []
            if t.key == "nvidia.com/gpu"] == [("nvidia.com/gpu", "Exists", "NoSchedule")]
    pod = await spawn_pod(make_spawner(hub_config()), formdata={"profile": ["cpu"]})
    assert not [t for t in pod.spec.tolerations or [] if getattr(t, "key", None) == "nvidia.com/gpu"]
    pod = await spawn_pod(make_spawner(hub_config(gpu_node_tolerations=[])), formdata={"profile": ["vgpu-quarter"]})
    assert not [t for t in pod.spec.tolerations or [] if getattr(t, "key", None) == "nvidia.com/gpu"]
    with pytest.raises(Exception, match="string values"):
        hub_config(gpu_node_tolerations=[{"key": "x", "tolerationSeconds": 5}])


async def test_runtime_class_goes_on_vgpu_pods_only():
    """Where nvidia is not containerd's default runtime, vGPU pods need its RuntimeClass;
    CPU pods keep whatever the admin set (none here)."""
    c = hub_config(runtime_class_name="nvidia")
    pod = await spawn_pod(make_spawner(c), formdata={"profile": ["vgpu-quarter"]})
    assert pod.spec.runtime_class_name == "nvidia"
    pod = await spawn_pod(make_spawner(c), formdata={"profile": ["cpu"]})
    assert pod.spec.runtime_class_name is None
    pod = await spawn_pod(make_spawner(hub_config()), formdata={"profile": ["vgpu-quarter"]})
    assert pod.spec.runtime_class_name is None  # default: the cluster's default runtime


async def test_containers_of_one_pod_count_together_against_the_limit():
    """A hook that adds a vGPU sidecar: the notebook's share and the sidecar's add up."""
    def admin_hook(spawner, pod):
        sidecar = copy.deepcopy(pod.spec.containers[0])
        sidecar.name, sidecar.env = "sidecar", []
        sidecar.resources.limits = {CORE: "60", MEM: "16"}
        pod.spec.containers.append(sidecar)
        return pod

    c = Config()
    c.KubeSpawner.modify_pod_hook = admin_hook
    c.VGPUHub.default_limit = {"cores": 100}
    VGPUHub(config=c).configure(c)
    with pytest.raises(contract.RequestError, match="container 'notebook'.* is more than the default limit"):
        await spawn_pod(make_spawner(c), user_options={"profile": "vgpu-half"})  # 50 + 60 > 100
    pod = await spawn_pod(make_spawner(c), user_options={"profile": "vgpu-quarter"})  # 25 + 60
    assert pod.spec.containers[1].resources.limits[CORE] == "60"


def test_only_the_hub_imports_the_restart_endpoint():
    """Importing jupyter_vgpu.hub (docs, tests, the notebook side by accident) loads neither the
    restart handler nor JupyterHub's handlers; configure() does, inside the Hub."""
    code = ("import sys, jupyter_vgpu.hub as hub; "
            "assert 'jupyter_vgpu.hub.restart' not in sys.modules and 'jupyterhub.apihandlers' not in sys.modules; "
            "from traitlets.config import Config; c = Config(); hub.VGPUHub(config=c).configure(c); "
            "from jupyter_vgpu.hub.restart import VGPURestartHandler; "
            "assert c.JupyterHub.extra_handlers[0][1] is VGPURestartHandler")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


ISOLATED_SHARES = [
    {"slug": "vgpu-quarter", "display_name": "¼ GPU · 20 GiB", "cores": 25, "memory": "20GiB"},
    {"slug": "mig-1g10", "display_name": "1g.10gb — isolated", "cores": 14, "memory": "9GiB", "isolated": True},
]


async def test_an_isolated_profile_asks_for_a_mig_slice():
    c = hub_config(shares=ISOLATED_SHARES)
    spawner = make_spawner(c)
    form = await spawner.options_form(spawner)
    assert "1g.10gb — isolated" in form and "hardware-isolated MIG slice" in form
    pod = await spawn_pod(spawner, formdata={"profile": ["mig-1g10"]})
    assert pod.metadata.annotations[NAMES.isolation] == "mig"
    assert pod.spec.containers[0].resources.limits[CORE] == "14"
    # the same spawner, a time-shared profile next: nothing left over
    again = await spawn_pod(spawner, formdata={"profile": ["vgpu-quarter"]})
    assert NAMES.isolation not in (again.metadata.annotations or {})


async def test_an_isolated_choice_in_the_share_dropdown_asks_for_a_mig_slice():
    c = hub_config(shares=ISOLATED_SHARES)
    pod = await spawn_pod(make_spawner(c), formdata={"profile": [CUSTOM_PROFILE_SLUG],
                                                     f"profile-option-{CUSTOM_PROFILE_SLUG}--{SHARE_OPTION}": ["mig-1g10"]})
    assert pod.metadata.annotations[NAMES.isolation] == "mig"


def test_isolation_is_only_for_shares():
    with pytest.raises(ValueError, match="isolated"):
        VGPUHub(shares=[{"slug": "one", "display_name": "1 GPU", "cores": 100, "isolated": True}]).share_list()
    with pytest.raises(ValueError, match="isolated"):
        VGPUHub(shares=[{"slug": "q", "display_name": "q", "cores": 25, "memory": "4GiB", "isolated": "yes"}]).share_list()
