"""The Helm chart deploy/helm/jupyter-vgpu, with the helm that hack/helm builds: helm lint,
helm template with each documented values file (and on each supported Kubernetes minor),
every rendered object valid against that minor's API schema, the values schema refusing wrong
values, NOTES.txt, the chart's README, and the kustomize tree under deploy/ being the chart's
current render and building exactly what the chart renders (docs/adr/0004-the-chart-is-the-source.md).
tests/realkube/test_real_helm.py installs it on a real control plane."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from deploy_support import DEPLOY, REPO, env_of, find, render
from test_manifests import SERVICE_MONITOR_SCHEMA
from test_scheduler_memory import doc_row, memory, mib
from test_z2jh_and_images import USER_SCHEDULER, chart_config, person, spawn
from vgpu_plugin.extender.version_skew import SCHEDULER_MINORS, SCHEDULER_TAG_UNSET

from jupyter_vgpu.core import contract

sys.path.insert(0, str(REPO / "scripts"))
import render_deploy  # noqa: E402 - scripts/ is no package

CHART = DEPLOY / "helm" / "jupyter-vgpu"
VALUES_DIR = DEPLOY / "helm" / "values"
DOCUMENTED = sorted(p.name for p in VALUES_DIR.glob("*.yaml"))
MINORS = [f"{major}.{minor}" for major, minor in SCHEDULER_MINORS]
SCHEMA_ERROR = "values don't meet the specifications of the schema"


def helm(program: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(program), *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


def template(program: Path, *args: str, values: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    files = [arg for v in values for arg in ("-f", str(VALUES_DIR / v))]
    out = helm(program, "template", "jupyter-vgpu", str(CHART), "--namespace", "vgpu-system", *files, *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_helm_is_the_pinned_release(helm_program):
    pinned = re.search(r"^\s*helm\.sh/helm/v4 (v\S+)", (REPO / "hack" / "helm" / "go.mod").read_text(), re.M)
    assert pinned and f'Version:"{pinned.group(1)}"' in helm(helm_program, "version").stdout


@pytest.mark.parametrize("values", [(), *[(v,) for v in DOCUMENTED]], ids=lambda v: "+".join(v) or "defaults")
def test_helm_lint_is_clean(helm_program, values):
    files = [arg for v in values for arg in ("-f", str(VALUES_DIR / v))]
    result = helm(helm_program, "lint", "--strict", str(CHART), *files)
    assert "0 chart(s) failed" in result.stdout, result.stdout


@pytest.mark.parametrize("minor", MINORS)
@pytest.mark.parametrize("values", [(), *[(v,) for v in DOCUMENTED],
                                    ("mps.yaml", "mig.yaml", "runtime-class.yaml", "monitoring.yaml", "reclaimer.yaml")],
                         ids=lambda v: "+".join(v) or "defaults")
def test_every_rendered_object_validates_on_each_supported_minor(helm_program, values, minor):
    objects = template(helm_program, "--kube-version", f"{minor}.0", values=values)
    assert {("DaemonSet", "vgpu-node"), ("Deployment", "vgpu-scheduler")} <= {(o["kind"], o["metadata"]["name"])
                                                                              for o in objects}
    for obj in objects:
        if obj["kind"] == "ServiceMonitor":
            import jsonschema

            jsonschema.validate(obj, SERVICE_MONITOR_SCHEMA)
            continue
        kubernetes_validate.validate(obj, f"{minor}.0", strict=True)
    namespaces = {o["metadata"].get("namespace") for o in objects} - {None}
    assert namespaces <= {"vgpu-system", "kube-system", "jhub"}, namespaces


@pytest.mark.parametrize("values, enforcement", [((), "none"), (("hami-core.yaml",), "hami-core"),
                                                 (("mps.yaml",), "mps")])
def test_enforcement_reaches_the_node_daemon(helm_program, values, enforcement):
    objects = template(helm_program, values=values)
    node = next(c for c in find(objects, "DaemonSet", "vgpu-node")["spec"]["template"]["spec"]["containers"])
    assert env_of(node)["VGPU_ENFORCEMENT"] == enforcement
    assert (enforcement == "mps") == any(o["metadata"]["name"] == "vgpu-mps-control-daemon" for o in objects)


@pytest.mark.parametrize("minor", MINORS)
def test_kube_scheduler_follows_the_api_servers_minor(helm_program, minor):
    objects = template(helm_program, "--kube-version", f"v{minor}.4")
    images = {c["name"]: c["image"] for c in find(objects, "Deployment", "vgpu-scheduler")["spec"]["template"]["spec"][
        "containers"]}
    tags = yaml.safe_load((CHART / "values.yaml").read_text())["images"]["kubeScheduler"]["tagsByMinor"]
    assert images["kube-scheduler"] == f"registry.k8s.io/kube-scheduler:{tags[minor]}"
    assert tags[minor].startswith(f"v{minor}.")


@pytest.mark.parametrize("version", ["1.34.2", "1.38.0"])
def test_an_unsupported_minor_fails_unless_the_tag_is_set(helm_program, version):
    refused = helm(helm_program, "template", "x", str(CHART), "--kube-version", version, check=False)
    minor = version.rsplit(".", 1)[0]
    assert refused.returncode != 0 and f"no kube-scheduler release for Kubernetes {minor}" in refused.stderr
    assert "images.kubeScheduler.tag" in refused.stderr
    objects = template(helm_program, "--kube-version", version, "--set", f"images.kubeScheduler.tag=v{minor}.1")
    (scheduler,) = [c for c in find(objects, "Deployment", "vgpu-scheduler")["spec"]["template"]["spec"]["containers"]
                    if c["name"] == "kube-scheduler"]
    assert scheduler["image"] == f"registry.k8s.io/kube-scheduler:v{minor}.1"


@pytest.mark.parametrize("setting, path", [
    ("enforcement=foo", "/enforcement"),
    ("nodeDaemon.resources.limits.memory=-256Mi", "/nodeDaemon/resources/limits/memory"),
    ("scheduler.extender.resources.requests.memory=lots", "/scheduler/extender/resources/requests/memory"),
    ("scheduler.kubeScheduler.resources.limits=null", "/scheduler/kubeScheduler/resources"),
    ("scheduler.policy=first-fit", "/scheduler/policy"),
    ("mps.maxThreadPercentage=150", "/mps/maxThreadPercentage"),
    ("mig.enabled=yes-please", "/mig/enabled"),
    ("runtimeClassName=NVIDIA", "/runtimeClassName"),
    ("images.node.tag=", "/images/node/tag"),
    ("images.kubeScheduler.tag=v1.37.2 ", "/images/kubeScheduler/tag"),
    ("images.node.repository=ghcr.io/x/y:1.0", "/images/node/repository"),
    ("enforcment=mps", "enforcment"),  # a misspelt key is an error, not a silent no-op
    ("admissionPolicy.admissionAccount=gpu-admission", "/admissionPolicy/admissionAccount"),
])
def test_the_schema_refuses_a_wrong_value(helm_program, setting, path):
    refused = helm(helm_program, "template", "x", str(CHART), "--set", setting, check=False)
    assert refused.returncode != 0 and SCHEMA_ERROR in refused.stderr and path in refused.stderr, refused.stderr
    linted = helm(helm_program, "lint", str(CHART), "--set", setting, check=False)
    assert linted.returncode != 0 and "[ERROR] values.yaml" in linted.stdout and path in linted.stdout, linted.stdout


def test_notes_say_the_next_steps_as_the_admin_guide_does(helm_program):
    notes = helm(helm_program, "install", "jupyter-vgpu", str(CHART), "--namespace", "vgpu-system",
                 "--dry-run=client", "-f", str(VALUES_DIR / "hami-core.yaml")).stdout.split("NOTES:", 1)[1]
    assert "enforcement hami-core" in notes and "kube-scheduler v1.37.2" in notes
    guide = (REPO / "docs" / "admin.md").read_text()
    (doctor_loop,) = [b for b in re.findall(r"```sh\n(.*?)```", guide, re.S) if "jupyter-vgpu doctor" in b]
    squash = " ".join
    assert squash(doctor_loop.split()) in squash(notes.split()), "NOTES.txt runs the doctor as docs/admin.md, section 7"
    smoke = "kubectl apply -f deploy/examples/smoke-test.yaml"
    assert smoke in notes and smoke in guide and (REPO / "deploy" / "examples" / "smoke-test.yaml").exists()
    assert "kubectl label node <node> vgpu.jupyter.org/node=true" in notes
    assert "reclaimer.rbac.enabled=true" in notes
    with_reclaimer = helm(helm_program, "install", "jupyter-vgpu", str(CHART), "--namespace", "vgpu-system",
                          "--dry-run=client", "-f", str(VALUES_DIR / "reclaimer.yaml")).stdout
    assert "reclaimer.rbac.enabled=true" not in with_reclaimer.split("NOTES:", 1)[1]


def _leaves(values: dict[str, Any], prefix: str = "") -> set[str]:
    """Documented granularity: mappings of free keys (tags per minor, selectors, resources) are one value."""
    found = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and key not in ("tagsByMinor", "nodeSelector", "resources"):
            found |= _leaves(value, path + ".")
        else:
            found.add(path)
    return found


def test_the_readme_documents_every_value_and_each_values_file():
    readme = (CHART / "README.md").read_text()
    table = set(re.findall(r"^\| `([\w.]+)` \|", readme, re.M))
    assert table == _leaves(yaml.safe_load((CHART / "values.yaml").read_text()))
    for name in DOCUMENTED:
        assert f"`{name}`" in readme


def test_the_readmes_large_cluster_values_size_vgpu_scheduler_as_the_admin_guide_says(helm_program, tmp_path):
    readme = (CHART / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", readme, re.S) if "896Mi" in b]
    (tmp_path / "large.yaml").write_text(block)
    objects = template(helm_program, "-f", str(tmp_path / "large.yaml"))
    row = doc_row("2,500 nodes, 50,000 pods")
    assert memory(objects, "kube-scheduler") == tuple(mib(q) for q in row[1].split(" / "))
    assert memory(objects, "extender") == tuple(mib(q) for q in row[2].split(" / "))


def _is_part_of(part: Any, whole: Any, where: str = "") -> None:
    if isinstance(part, dict):
        assert isinstance(whole, dict), where
        for key, value in part.items():
            assert key in whole, f"{where}.{key} is not in deploy/z2jh/values.yaml"
            _is_part_of(value, whole[key], f"{where}.{key}")
    else:
        assert part == whole, f"{where} differs from deploy/z2jh/values.yaml"


def _z2jh_snippet() -> dict[str, Any]:
    readme = (CHART / "README.md").read_text()
    section = readme.split("## With Zero to JupyterHub", 1)[1]
    (snippet,) = [b for b in re.findall(r"```yaml\n(.*?)```", section, re.S) if "extraConfig" in b]
    values: dict[str, Any] = yaml.safe_load(snippet)
    return values


def test_the_readmes_z2jh_snippet_is_part_of_the_tested_values():
    _is_part_of(_z2jh_snippet(), yaml.safe_load((DEPLOY / "z2jh" / "values.yaml").read_text()))


async def test_the_readmes_z2jh_snippet_gives_the_profiles_and_the_scheduler_override(kubespawner_kubeconfig):
    """The snippet alone, as Zero to JupyterHub runs it: CPU pods keep its user scheduler, vGPU
    profiles go to vgpu-scheduler with their share, and the reclaimer is a Hub service."""
    c = chart_config(_z2jh_snippet())
    spawner, pod = await spawn(c, person("ann"), {"profile": "cpu"})
    assert pod.spec.scheduler_name == USER_SCHEDULER
    assert '"vgpu-quarter"' in await spawner.options_form(spawner)
    _, pod = await spawn(c, person("ann"), {"profile": "vgpu-quarter"})
    assert pod.spec.scheduler_name == contract.SCHEDULER_NAME
    assert contract.parse_container_request(pod.spec.containers[0].resources.limits) == contract.Request(25, 80)
    assert [s["name"] for s in c.JupyterHub.services] == ["vgpu-reclaimer"]


# --- the kustomize tree: the chart's current render, and what kustomize builds from it ------------

def test_the_kustomize_tree_is_the_charts_current_render(helm_program):
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "render_deploy.py"), "--check",
                             "--helm", str(helm_program)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"


def test_the_render_check_names_a_hand_edit_and_a_stale_file(helm_program):
    rendered = render_deploy.render(str(helm_program))
    assert render_deploy.differences(rendered) == []
    edited = DEPLOY / "base" / "node-daemonset.yaml"
    stale = DEPLOY / "overlays" / "mps" / "kustomization.yaml"
    changed = {**rendered, edited: rendered[edited].replace("maxUnavailable: 1", "maxUnavailable: 2")}
    del changed[stale]
    assert render_deploy.differences(changed) == [
        "deploy/base/node-daemonset.yaml: differs from the chart's render",
        "deploy/overlays/mps/kustomization.yaml: not rendered from the chart (stale)"]
    text = rendered[DEPLOY / "overlays" / "hami-core" / "patch-daemonset-vgpu-node.yaml"]
    assert text.startswith("# Rendered by scripts/render_deploy.py from the Helm chart deploy/helm/jupyter-vgpu")


def _normal(value: Any, key: str = "") -> Any:
    """An object as the API server reads it: the items of a list kustomize merges by key (env,
    volumes, volumeMounts, containers, ports) in any order (kustomize puts a patch's items
    first), and CEL expressions' whitespace (kustomize re-folds `>-` scalars with an extra
    newline) ignored. Nothing else is loosened."""
    if isinstance(value, dict):
        return {k: _normal(v, k) for k, v in value.items()}
    if isinstance(value, list):
        items = [_normal(v) for v in value]
        merge_key = render_deploy.MERGE_KEYS.get(key)
        if merge_key and all(isinstance(i, dict) and merge_key in i for i in items):
            items.sort(key=lambda i: str(i[merge_key]))
        return items
    if key == "expression" and isinstance(value, str):
        return " ".join(value.split())
    return value


def _objects(objects) -> dict[tuple[str, str, str], Any]:
    return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): _normal(o) for o in objects}


def own_kustomization(tmp_path: Path, resource: str, components: tuple[str, ...]) -> str:
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY / resource, tmp_path)],
        "components": [os.path.relpath(DEPLOY / c, tmp_path) for c in components]}))
    return str(tmp_path)


@pytest.mark.parametrize("resource, components, values, minor", [
    ("base", (), (), None),
    ("overlays/hami-core", (), ("hami-core.yaml",), None),
    ("overlays/mps", (), ("mps.yaml",), None),
    ("overlays/monitoring", (), ("monitoring.yaml",), None),
    ("base", ("components/mig", "components/runtime-class"), ("mig.yaml", "runtime-class.yaml"), None),
    ("overlays/hami-core", ("components/scheduler-1.37", "components/mig"), ("hami-core.yaml", "mig.yaml"), "1.37"),
    ("overlays/mps", ("components/scheduler-1.35", "components/monitoring", "components/runtime-class"),
     ("mps.yaml", "monitoring.yaml", "runtime-class.yaml"), "1.35"),
    ("z2jh/reclaimer", (), ("reclaimer.yaml",), None),
], ids=lambda v: v if isinstance(v, str) else "+".join(v) if v else "-")
def test_kustomize_builds_what_helm_renders(tmp_path, helm_program, resource, components, values, minor):
    built = _objects(render(own_kustomization(tmp_path, resource, components)))
    extra = ["--kube-version", f"{minor}.0", "--set", "images.kubeScheduler.tag="] if minor else []
    docs = render_deploy.helm_template(str(helm_program), values, *extra)
    only = {"templates/reclaimer-rbac.yaml"} if resource == "z2jh/reclaimer" else None
    rendered = _objects(d.obj for d in docs if only is None or d.source in only)
    assert built.keys() == rendered.keys()
    for key in built:
        assert built[key] == rendered[key], key
    # the order-free comparison of env above is sound: no variable refers to another, $(VAR)
    for obj in render(own_kustomization(tmp_path, resource, components)):
        pod = (obj.get("spec") or {}).get("template", {}).get("spec", {})
        for c in pod.get("containers", []) + pod.get("initContainers", []):
            assert not any("$(" in (e.get("value") or "") for e in c.get("env") or []), (obj["metadata"]["name"], c)


def test_the_kustomize_base_names_no_usable_kube_scheduler():
    images = {c["name"]: c["image"] for c in find(render("base"), "Deployment", "vgpu-scheduler")["spec"]["template"][
        "spec"]["containers"]}
    assert images["kube-scheduler"] == f"registry.k8s.io/kube-scheduler:{SCHEDULER_TAG_UNSET}"
    assert render_deploy.SCHEDULER_TAG_UNSET == SCHEDULER_TAG_UNSET
