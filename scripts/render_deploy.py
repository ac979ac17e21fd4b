#!/usr/bin/env python3
"""Render deploy/'s kustomize tree from the Helm chart deploy/helm/jupyter-vgpu, its one source
(docs/adr/0004-the-chart-is-the-source.md).

    scripts/render_deploy.py            write the rendered files (and remove stale ones)
    scripts/render_deploy.py --check    exit 1 naming every file that differs from the chart

Each kustomization is ``helm template`` of the chart with a values file of deploy/helm/values/:
deploy/base with the chart's defaults; an overlay or component with its values file, as what
that file changes in the base: the objects it adds (their text as the chart renders it,
comments included) and a strategic-merge patch for each object it changes. The kube-scheduler
components set the tags of the chart's images.kubeScheduler.tagsByMinor. tests/deploy checks
both that these files are current and that kustomize builds from them what helm renders.
Helm comes from $VGPU_HELM_BIN, else hack/helm/build.sh.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
CHART = DEPLOY / "helm" / "jupyter-vgpu"
VALUES = DEPLOY / "helm" / "values"
RELEASE, NAMESPACE = "jupyter-vgpu", "vgpu-system"
# deploy/base names a kube-scheduler tag no registry has (docs/admin.md, "kube-scheduler
# version"): the admin adds the component of the cluster's minor. The doctor knows the tag.
SCHEDULER_TAG_UNSET = "unset-add-deploy-components-scheduler-1.minor"
# what every kustomize render sets beyond its values file: plain manifests carry their Namespace
KUSTOMIZE_SETTINGS = ("--set", "namespace.create=true", "--set", f"images.kubeScheduler.tag={SCHEDULER_TAG_UNSET}")
# lists kustomize merges item by item (strategic merge: the API types' patchMergeKey)
MERGE_KEYS = {"containers": "name", "initContainers": "name", "env": "name", "volumes": "name",
              "volumeMounts": "mountPath", "ports": "containerPort", "imagePullSecrets": "name"}
GENERATED_DIRS = ("base", "overlays/hami-core", "overlays/mps", "overlays/monitoring", "components/mig",
                  "components/runtime-class", "components/monitoring", "z2jh/reclaimer", "scheduler")


class RenderError(RuntimeError):
    """helm failed, or the chart changed something a kustomize patch cannot express."""


@dataclass
class Doc:
    """One object as ``helm template`` renders it: its template, its text (comments kept), its value."""

    source: str
    text: str
    obj: dict[str, Any]

    @property
    def key(self) -> tuple[str, str, str]:
        meta = self.obj["metadata"]
        return self.obj["kind"], meta.get("namespace", ""), meta["name"]


@dataclass
class Target:
    """A kustomization under deploy/: ``values`` (files of deploy/helm/values) over the chart."""

    path: str
    values: tuple[str, ...] = ()
    component: bool = False
    standalone: bool = False  # its own objects only (the template in ``only``), not on the base
    only: str = ""
    extra_resources: tuple[str, ...] = ()
    components: tuple[str, ...] = ()
    usage: str = ""
    outputs: dict[str, str] = field(default_factory=dict)


TARGETS = (
    Target("base"),
    Target("overlays/hami-core", ("hami-core.yaml",)),
    Target("overlays/mps", ("mps.yaml",)),
    Target("components/monitoring", ("monitoring.yaml",), component=True),
    Target("components/mig", ("mig.yaml",), component=True),
    Target("components/runtime-class", ("runtime-class.yaml",), component=True),
    Target("z2jh/reclaimer", ("reclaimer.yaml",), standalone=True, only="templates/reclaimer-rbac.yaml",
           usage="kubectl apply -k deploy/z2jh/reclaimer"),
)


def helm_program() -> str:
    sys.path.insert(0, str(REPO / "plugin"))
    from vgpu_plugin.realkube.binaries import helm_bin

    return str(helm_bin())


def helm_template(helm: str, values: Iterable[str | Path] = (), *extra: str) -> list[Doc]:
    """The chart's objects for these values files, as deploy/ renders it (namespace vgpu-system)."""
    argv = [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *KUSTOMIZE_SETTINGS]
    for path in values:
        argv += ["-f", str(VALUES / path)]
    result = subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RenderError(f"{' '.join(argv[:4])} ... failed:\n{result.stderr}")
    return split(result.stdout)


def split(rendered: str) -> list[Doc]:
    docs = []
    for chunk in re.split(r"^---\s*$\n?", rendered, flags=re.M):
        match = re.match(r"# Source: [^/]+/(\S+)\n", chunk)
        if not match:
            if chunk.strip():
                raise RenderError(f"helm template printed a document without its # Source: {chunk[:200]!r}")
            continue
        text = chunk[match.end():].strip("\n") + "\n"
        obj = yaml.safe_load(text)
        if obj:
            docs.append(Doc(match.group(1), text, obj))
    return docs


def template_order(doc: Doc) -> int:
    """Where the object's document sits in its template (helm sorts by kind; files keep the chart's order)."""
    chunks = re.split(r"^---\s*$", (CHART / doc.source).read_text(), flags=re.M)
    kind, _, name = doc.key
    for index, chunk in enumerate(chunks):
        if re.search(rf"^kind: {kind}\s*$", chunk, re.M) and re.search(rf"^  name: {re.escape(name)}\s*$", chunk, re.M):
            return index
    return len(chunks)


def header(target: Target, what: str) -> str:
    values = ", ".join(f"deploy/helm/values/{v}" for v in target.values) or "the chart's defaults"
    text = (f"Rendered by scripts/render_deploy.py from the Helm chart deploy/helm/jupyter-vgpu: do not "
            f"edit, change the chart and run the script. From: {what}; values: {values}.")
    return "".join(f"# {line}\n" for line in textwrap.wrap(text, 94, break_on_hyphens=False, break_long_words=False))


class Dumper(yaml.SafeDumper):
    """Block style with indented sequences, as the chart's templates are written."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def dump(value: Any) -> str:
    return yaml.dump(value, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=100)


def files_of(docs: Sequence[Doc], target: Target) -> dict[str, str]:
    """One file per template, named as it, its documents in the template's order."""
    by_source: dict[str, list[Doc]] = {}
    for doc in docs:
        by_source.setdefault(doc.source, []).append(doc)
    files = {}
    for source, group in by_source.items():
        group.sort(key=template_order)
        files[Path(source).name] = header(target, source) + "---\n".join(d.text for d in group)
    return files


def values_comment(target: Target) -> str:
    """The leading comment of the target's values file: what it is for, said once."""
    lines = []
    for line in (VALUES / target.values[0]).read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines) + "\n"


def merge_patch(old: Any, new: Any, where: str) -> dict[str, Any]:
    """The strategic-merge patch that turns mapping ``old`` into ``new`` (additions and changes only)."""
    gone = [k for k in old if k not in new]
    if gone:
        raise RenderError(f"{where}: the values remove {gone}, which a generated patch does not do")
    patch: dict[str, Any] = {}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            if isinstance(value, dict) and isinstance(old[key], dict):
                patch[key] = merge_patch(old[key], value, f"{where}.{key}")
            elif isinstance(value, list) and key in MERGE_KEYS and isinstance(old[key], list):
                patch[key] = list_patch(old[key], value, MERGE_KEYS[key], f"{where}.{key}")
            else:
                patch[key] = value
    return patch


def list_patch(old: list[dict[str, Any]], new: list[dict[str, Any]], key: str, where: str) -> list[dict[str, Any]]:
    """Items of ``new`` that are new or changed, each with its merge key (kustomize puts a patch's
    items first: the order of these lists carries no meaning in a pod spec, see tests/deploy)."""
    before = {item[key]: item for item in old}
    if not set(before) <= {item[key] for item in new}:
        raise RenderError(f"{where}: the values remove items, which a generated patch does not do")
    items = []
    for item in new:
        if item[key] not in before:
            items.append(item)
        elif before[item[key]] != item:
            items.append({key: item[key], **merge_patch(before[item[key]], item, f"{where}[{item[key]}]")})
    return items


def kustomization(target: Target, resources: Sequence[str], patches: Sequence[str]) -> str:
    body: dict[str, Any] = {"apiVersion": "kustomize.config.k8s.io/v1alpha1" if target.component
                            else "kustomize.config.k8s.io/v1beta1",
                            "kind": "Component" if target.component else "Kustomization"}
    if resources:
        body["resources"] = list(resources)
    if target.components:
        body["components"] = list(target.components)
    if patches:
        body["patches"] = [{"path": p} for p in patches]
    comment = values_comment(target) if target.values else ""
    if target.component:
        comment += f"# Add to your overlay with:\n#   components: [../../{target.path}]\n"
    if target.usage:
        comment += f"#   {target.usage}\n"
    return comment + header(target, "the chart's templates") + dump(body)


def render_target(helm: str, target: Target, base: list[Doc]) -> dict[str, str]:
    docs = helm_template(helm, target.values)
    if target.standalone:
        own = [d for d in docs if d.source == target.only]
        files = files_of(own, target)
        return {**files, "kustomization.yaml": kustomization(target, sorted(files), ())}
    before = {d.key: d for d in base}
    keys = {d.key for d in docs}
    missing = [k for k in before if k not in keys]
    if missing:
        raise RenderError(f"{target.path}: the values remove {missing} from the base")
    added = [d for d in docs if d.key not in before]
    files = files_of(added, target)
    resources = ([] if target.component else ["../../base"]) + sorted(files)
    patches = []
    for doc in docs:
        old = before.get(doc.key)
        if old is None or old.obj == doc.obj:
            continue
        kind, namespace, name = doc.key
        spec = merge_patch(old.obj, doc.obj, f"{kind}/{name}")
        metadata = {"name": name, **({"namespace": namespace} if namespace else {}), **spec.pop("metadata", {})}
        patch = {"apiVersion": doc.obj["apiVersion"], "kind": kind, "metadata": metadata, **spec}
        filename = f"patch-{kind.lower()}-{name}.yaml"
        files[filename] = (header(target, f"{doc.source}, as a strategic-merge patch of the base's {kind} {name}")
                           + dump(patch))
        patches.append(filename)
    return {**files, "kustomization.yaml": kustomization(target, resources, patches)}


def render(helm: str) -> dict[Path, str]:
    """Every generated file under deploy/ and its content."""
    base = helm_template(helm)
    out: dict[Path, str] = {}
    base_target = TARGETS[0]
    files = files_of(base, base_target)
    base_comment = (
        "# The base: node daemon, vgpu-scheduler (kube-scheduler + extender), least-privilege RBAC,\n"
        "# the admission policy that trusts only the stack's own annotations, NetworkPolicies for\n"
        "# vgpu-system, the metrics Service. Enforcement backend \"none\" (scheduling-only sharing +\n"
        "# framework guard rails); overlays/hami-core and overlays/mps switch it; components/monitoring\n"
        "# adds the ServiceMonitors and the Grafana dashboards. Every tag comes from the chart's\n"
        "# values.yaml; kube-scheduler's here is one no registry has: add the component of your\n"
        "# cluster's minor, deploy/components/scheduler-<minor> (docs/admin.md, \"kube-scheduler\n"
        "# version\"). Render: kubectl kustomize deploy/base\n")
    files["kustomization.yaml"] = base_comment + header(base_target, "the chart's templates") + dump(
        {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": sorted(files)})
    out.update({DEPLOY / "base" / name: text for name, text in files.items()})
    for target in TARGETS[1:]:
        for name, text in render_target(helm, target, base).items():
            out[DEPLOY / target.path / name] = text
    monitoring = Target("overlays/monitoring", ("monitoring.yaml",), components=("../../components/monitoring",))
    out[DEPLOY / monitoring.path / "kustomization.yaml"] = (
        "# The base plus the ServiceMonitors and the Grafana dashboards (needs the Prometheus Operator CRDs).\n"
        + header(monitoring, "the chart's templates")
        + dump({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                 "resources": ["../../base"], "components": list(monitoring.components)}))
    # the dashboards as files too, for an import into Grafana by hand
    for name, target in (("jupyter-vgpu.json", "dashboard.json"), ("jupyter-vgpu-reclaimer.json", "reclaimer-dashboard.json")):
        out[DEPLOY / "components" / "monitoring" / target] = (CHART / "files" / "dashboards" / name).read_text()
    # vgpu-scheduler's configuration as a file (the simulated cluster, the real-cluster tests, the wheel)
    (config,) = [d for d in base if d.key == ("ConfigMap", NAMESPACE, "vgpu-scheduler-config")]
    out[DEPLOY / "scheduler" / "config.yaml"] = config.obj["data"]["config.yaml"]
    out.update(scheduler_components())
    return out


def scheduler_components() -> dict[Path, str]:
    images = yaml.safe_load((CHART / "values.yaml").read_text())["images"]["kubeScheduler"]
    out = {}
    for minor, tag in images["tagsByMinor"].items():
        target = Target(f"components/scheduler-{minor}")
        comment = (
            f"# vgpu-scheduler's kube-scheduler for a Kubernetes {minor} API server: add this directory to\n"
            "# your overlay's `components:`, exactly one scheduler-* component per overlay. Kubernetes'\n"
            "# version-skew policy lets kube-scheduler be the API server's minor or one older, never\n"
            "# newer; deploy/base names no usable tag, so an overlay without one of these components\n"
            "# runs no scheduler (docs/admin.md, \"kube-scheduler version\"). `jupyter-vgpu doctor`\n"
            "# fails (scheduler-version) when the tag and the API server's version break the policy.\n")
        body = {"apiVersion": "kustomize.config.k8s.io/v1alpha1", "kind": "Component",
                "images": [{"name": images["repository"], "newTag": tag}]}
        out[DEPLOY / target.path / "kustomization.yaml"] = (
            comment + header(target, f"images.kubeScheduler.tagsByMinor[\"{minor}\"]")
            + dump(body))
    return out


def generated_dirs() -> list[Path]:
    dirs = [DEPLOY / d for d in GENERATED_DIRS]
    dirs += sorted((DEPLOY / "components").glob("scheduler-*"))
    return dirs


def differences(rendered: dict[Path, str]) -> list[str]:
    problems = []
    for path, text in sorted(rendered.items()):
        if not path.exists():
            problems.append(f"{path.relative_to(REPO)}: missing")
        elif path.read_text() != text:
            problems.append(f"{path.relative_to(REPO)}: differs from the chart's render")
    for directory in generated_dirs():
        for path in sorted(directory.glob("*")):
            if path.is_file() and path not in rendered:
                problems.append(f"{path.relative_to(REPO)}: not rendered from the chart (stale)")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report files that differ from the chart")
    parser.add_argument("--helm", help="the helm program (default: $VGPU_HELM_BIN, else hack/helm/build.sh's)")
    args = parser.parse_args(argv)
    try:
        rendered = render(args.helm or helm_program())
    except RenderError as error:
        print(f"render_deploy: {error}", file=sys.stderr)
        return 2
    problems = differences(rendered)
    if args.check:
        for problem in problems:
            print(problem)
        if problems:
            print("deploy/ is not the chart's render: run scripts/render_deploy.py (edit the chart, "
                  "deploy/helm/jupyter-vgpu, not the rendered files)", file=sys.stderr)
        return 1 if problems else 0
    for directory in generated_dirs():
        for path in directory.glob("*"):
            if path.is_file() and path not in rendered:
                path.unlink()
    for path, text in rendered.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"render_deploy: {len(rendered)} files under deploy/ rendered from {CHART.relative_to(REPO)}"
          + (f" ({len(problems)} changed)" if problems else ", none changed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
