"""The GPU-node taint docs/admin.md ("8. Keep GPUs from being stranded") tells admins to set
(GKE sets the same on GPU pools itself): everything meant to run on GPU nodes tolerates it.
The taint is read from the doc, so the manifests and the doc cannot drift apart."""

from __future__ import annotations

import re

import pytest
import yaml
from deploy_support import DEPLOY, KUSTOMIZATIONS, REPO, render

ADMIN_DOC = REPO / "docs" / "admin.md"
SMOKE_TEST = DEPLOY / "examples" / "smoke-test.yaml"
TAINT_COMMAND = re.compile(r"kubectl taint nodes? \S+ ([\w./-]+)(?:=([\w.-]*))?:(NoSchedule|PreferNoSchedule|NoExecute)")


def documented_taint() -> dict[str, str]:
    """The one taint docs/admin.md's `kubectl taint nodes` command puts on GPU nodes."""
    sections = re.split(r"^## ", ADMIN_DOC.read_text(), flags=re.M)
    found = {match for section in sections for match in TAINT_COMMAND.findall(section)}
    assert len(found) == 1, f"docs/admin.md should name one GPU-node taint, not {sorted(found)}"
    ((key, value, effect),) = found
    # the section VGPUHub.gpu_node_tolerations' help points to
    (heading,) = [s.splitlines()[0] for s in sections if TAINT_COMMAND.search(s)]
    assert heading.endswith("Keep GPUs from being stranded"), f"the taint moved to section {heading!r}"
    return {"key": key, "value": value, "effect": effect}


def tolerates(tolerations: list[dict] | None, taint: dict[str, str]) -> bool:
    """Kubernetes' matching (k8s.io/api/core/v1 Toleration.ToleratesTaint)."""
    for toleration in tolerations or []:
        if toleration.get("effect") and toleration["effect"] != taint["effect"]:
            continue
        operator = toleration.get("operator", "Equal")
        if not toleration.get("key"):
            if operator == "Exists":
                return True
            continue
        if toleration["key"] != taint["key"]:
            continue
        if operator == "Exists" or (operator == "Equal" and toleration.get("value", "") == taint["value"]):
            return True
    return False


def test_the_doc_names_the_taint_gke_puts_on_gpu_pools():
    assert documented_taint() == {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def test_smoke_test_job_tolerates_the_gpu_node_taint():
    """The first test on a real cluster must land on a tainted GPU node (section 7 runs it
    after section 8's taint, and GKE taints GPU pools without being asked)."""
    (job,) = [d for d in yaml.safe_load_all(SMOKE_TEST.read_text()) if d and d["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    assert tolerates(pod.get("tolerations"), documented_taint()), pod.get("tolerations")
    # as narrow as a notebook's: that taint's key only, not every taint
    assert all(t.get("key") for t in pod["tolerations"]), pod["tolerations"]


def test_notebooks_tolerate_the_gpu_node_taint_by_default():
    from jupyter_vgpu.hub.vgpuhub import VGPUHub

    assert tolerates(VGPUHub().gpu_node_tolerations, documented_taint())


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_gpu_node_daemons_tolerate_the_gpu_node_taint(kustomization):
    """Every DaemonSet runs on GPU nodes (vgpu-node, the MPS control daemon)."""
    daemon_sets = [o for o in render(kustomization) if o["kind"] == "DaemonSet"]
    assert daemon_sets
    for daemon_set in daemon_sets:
        assert tolerates(daemon_set["spec"]["template"]["spec"].get("tolerations"), documented_taint()), (
            daemon_set["metadata"]["name"])


@pytest.mark.parametrize("tolerations, tolerated", [
    ([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], True),
    ([{"key": "nvidia.com/gpu", "operator": "Exists"}], True),
    ([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}], True),
    ([{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}], False),
    ([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}], False),
    ([{"key": "example.com/gpu", "operator": "Exists"}], False),
    ([{"operator": "Exists"}], True),
    ([], False),
    (None, False),
])
def test_toleration_matching_is_kubernetes(tolerations, tolerated):
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    assert tolerates(tolerations, taint) is tolerated
