"""deploy/z2jh/values.yaml run the way Zero to JupyterHub runs it, and the image recipes."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import tomllib
import yaml
from deploy_support import DEPLOY, KUSTOMIZATIONS, REPO, render
from traitlets.config import Config

from jupyter_vgpu.core import contract

VALUES = DEPLOY / "z2jh" / "values.yaml"
USER_SCHEDULER = "jhub-user-scheduler"  # what the chart sets with scheduling.userScheduler.enabled


pytestmark = pytest.mark.usefixtures("kubespawner_kubeconfig")


def chart_config(values: dict) -> Config:
    """The parts of the chart's jupyterhub_config.py our values touch, then hub.extraConfig."""
    c = Config()
    c.KubeSpawner.profile_list = values["singleuser"]["profileList"]
    if values["scheduling"]["userScheduler"]["enabled"]:
        c.KubeSpawner.scheduler_name = USER_SCHEDULER
    for key in sorted(values["hub"]["extraConfig"]):
        exec(compile(values["hub"]["extraConfig"][key], f"hub.extraConfig.{key}", "exec"), {"c": c})
    return c


async def spawn(c: Config, user, user_options: dict):
    from kubespawner import KubeSpawner

    spawner = KubeSpawner(_mock=True, config=c, user=user, namespace="jhub")
    spawner.user_options = user_options
    await spawner._run_apply_user_options(user_options)
    await spawner.load_user_options()
    return spawner, await spawner.modify_pod_hook(spawner, await spawner.get_pod_manifest())


def person(name, *groups):
    return SimpleNamespace(name=name, id=1, url=f"/user/{name}/", groups=[SimpleNamespace(name=g) for g in groups])


async def test_values_give_cpu_and_vgpu_profiles_with_the_right_schedulers():
    c = chart_config(yaml.safe_load(VALUES.read_text()))
    spawner, pod = await spawn(c, person("ann"), {"profile": "cpu"})
    assert pod.spec.scheduler_name == USER_SCHEDULER
    form = await spawner.options_form(spawner)
    assert "CPU only" in form and '"vgpu-quarter"' in form and '"vgpu-two"' not in form  # default limit: 50 %
    _, pod = await spawn(c, person("ann"), {"profile": "vgpu-quarter"})
    assert pod.spec.scheduler_name == contract.SCHEDULER_NAME
    limits = pod.spec.containers[0].resources.limits
    assert contract.parse_container_request(limits) == contract.Request(25, 80)
    _, pod = await spawn(c, person("bo", "gpu-power-users"), {"profile": "vgpu-two"})
    assert pod.spec.containers[0].resources.limits[contract.DEFAULT_NAMES.core_resource] == "200"
    assert any(r["name"] == "server" for r in c.JupyterHub.load_roles)


def test_values_network_policy_opens_the_node_api_and_not_the_scrape_port():
    from vgpu_plugin.metrics.flags import DEFAULT_SCRAPE_PORT

    values = yaml.safe_load(VALUES.read_text())
    egress = values["singleuser"]["networkPolicy"]["egress"]
    ports = [p["port"] for rule in egress for p in rule["ports"]]
    assert contract.DEFAULT_METRICS_PORT in ports and DEFAULT_SCRAPE_PORT not in ports
    for rule in egress:
        # whatever addresses a rule opens, it opens the node API's port alone
        assert [p["port"] for p in rule["ports"]] == [contract.DEFAULT_METRICS_PORT], rule


def _dockerfile(path):
    text = (REPO / path).read_text()
    return text, re.findall(r"^(\w+)\s+(.*)$", text, re.M)


@pytest.mark.parametrize("path", ["plugin/Dockerfile", "deploy/z2jh/hub.Dockerfile", "deploy/z2jh/singleuser.Dockerfile"])
def test_image_recipes_build_the_wheel_from_this_repository(path):
    text, instructions = _dockerfile(path)
    assert ("COPY", ". .") in instructions and any("pip wheel" in args for op, args in instructions if op == "RUN")
    ignored = [line.strip() for line in (REPO / f"{path}.dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    wheel = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]
    needed = list(wheel["packages"]) + list(wheel.get("force-include", {})) + ["labextension/src", "labextension/package.json", "pyproject.toml"]
    needed += [src for src in wheel.get("shared-data", {}) if src != "jupyter_vgpu/labextension"]  # built in the image
    for source in needed:
        assert not any(source == pattern or source.startswith(pattern.rstrip("/") + "/") for pattern in ignored), (
            f"{path}: the build context ignores {source}, which the wheel needs")


def test_manifests_use_the_node_image_at_the_package_version():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    _, instructions = _dockerfile("plugin/Dockerfile")
    assert instructions[-2:] == [("ENTRYPOINT", '["jupyter-vgpu"]'), ("CMD", '["--help"]')]
    for kustomization in KUSTOMIZATIONS:
        images = {c["image"] for o in render(kustomization) if o["kind"] in ("DaemonSet", "Deployment")
                  for c in o["spec"]["template"]["spec"]["containers"] + o["spec"]["template"]["spec"].get("initContainers", [])
                  if c["name"] != "kube-scheduler"}
        assert images == {f"ghcr.io/jupyter-vgpu/jupyter-vgpu-node:{version}"}
