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
    # the chart appends each hub.services entry, named by its key, to c.JupyterHub.services
    c.JupyterHub.services = [{"name": name, **service} for name, service in values["hub"].get("services", {}).items()]
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
        if any("ipBlock" in peer for peer in rule["to"]):
            # whatever addresses a rule opens, it opens the node API's port alone
            assert [p["port"] for p in rule["ports"]] == [contract.DEFAULT_METRICS_PORT], rule
        else:  # the GPU reclaimer's API in the Hub's pod, nothing else there
            assert rule["to"] == [{"podSelector": {"matchLabels": {"app": "jupyterhub", "component": "hub"}}}]
            assert [p["port"] for p in rule["ports"]] == [RECLAIMER_PORT], rule


RECLAIMER_PORT = 10102


def test_values_run_the_reclaimer_as_a_hub_service_with_exactly_its_scopes(monkeypatch):
    from vgpu_plugin.metrics.flags import DEFAULT_SCRAPE_PORT

    from jupyter_vgpu.reclaimer.hubconfig import (
        ENV_RECLAIMER_URL,
        ROLE_SCOPES,
        SERVICE_NAME,
        service_api_url,
    )
    from jupyter_vgpu.reclaimer.service import VGPUReclaimer

    values = yaml.safe_load(VALUES.read_text())
    hub = values["hub"]
    service = hub["services"][SERVICE_NAME]
    assert service["command"][1:4] == ["-m", "jupyter_vgpu.cli", "reclaimer"]
    reclaimer = VGPUReclaimer()
    reclaimer.parse_command_line(service["command"][4:])  # every flag is a real trait with a valid value
    objects = render("base")
    daemon = [o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "vgpu-node"][0]
    key, _, value = reclaimer.node_selector.partition("=")
    assert daemon["spec"]["template"]["metadata"]["labels"][key] == value
    assert reclaimer.node_namespace == daemon["metadata"]["namespace"]
    assert reclaimer.node_scrape_port == DEFAULT_SCRAPE_PORT
    assert reclaimer.dry_run is True  # an admin turns it on after reading its log
    # the scrape token: the Secret the ServiceMonitor sends, mounted where the flag reads it
    mounts = {m["name"]: m["mountPath"] for m in hub["extraVolumeMounts"]}
    (volume,) = [v for v in hub["extraVolumes"] if v["secret"]["secretName"] == "vgpu-metrics-scrape-token"]
    assert reclaimer.scrape_token_file == mounts[volume["name"]] + "/token"
    # the scheduler's queue: the extender's queue Service and port, with the Secret the extender reads
    (queue,) = [v for v in hub["extraVolumes"] if v["secret"]["secretName"] == "vgpu-queue-token"]
    assert reclaimer.queue_token_file == mounts[queue["name"]] + "/token"
    queue_service = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "vgpu-scheduler-queue"][0]
    assert reclaimer.queue_url == (f"http://{queue_service['metadata']['name']}.{queue_service['metadata']['namespace']}"
                                   f":{queue_service['spec']['ports'][0]['port']}")
    # its role: exactly the scopes the reclaimer's own wiring names, for it alone
    role = hub["loadRoles"][SERVICE_NAME]
    assert (sorted(role["scopes"]), role["services"]) == (sorted(ROLE_SCOPES), [SERVICE_NAME])
    # where it listens is a port of the Hub's Service, open to notebooks and Prometheus only
    assert service["url"] == f"http://hub:{RECLAIMER_PORT}"
    assert reclaimer.bind_url == f"http://0.0.0.0:{RECLAIMER_PORT}"  # the Service's name is not the pod's address
    assert [(p["port"], p["targetPort"]) for p in hub["service"]["extraPorts"]] == [(RECLAIMER_PORT, RECLAIMER_PORT)]
    (ingress,) = hub["networkPolicy"]["ingress"]
    assert [p["port"] for p in ingress["ports"]] == [RECLAIMER_PORT]
    assert values["singleuser"]["extraEnv"][ENV_RECLAIMER_URL] == service_api_url(service["url"])
    # the chart's config plus hub.extraConfig: the service gets the in-cluster API address
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    c = chart_config(values)
    (started,) = [s for s in c.JupyterHub.services if s["name"] == SERVICE_NAME]
    assert started["environment"] == {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    # Prometheus scrapes its counters on that port of the Hub's Service, under the service prefix
    monitor = [o for o in render("overlays/monitoring")
               if o["kind"] == "ServiceMonitor" and o["metadata"]["name"] == SERVICE_NAME][0]
    assert monitor["spec"]["selector"]["matchLabels"] == {"app": "jupyterhub", "component": "hub"}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == hub["service"]["extraPorts"][0]["name"]
    assert endpoint["path"] == f"/services/{SERVICE_NAME}/metrics"
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}} in ingress["from"]


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
