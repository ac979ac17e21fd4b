"""vgpu-scheduler's memory: requests and limits on both containers, sized from measured
numbers (docs/admin.md, "Memory of vgpu-scheduler"), and the documented way to change them.

Measured against a real kube-apiserver v1.37.2 (hack/kube) with kube-scheduler v1.37.2 and
`jupyter-vgpu extender --policy fgd-filter`, bench_extender's nodes (8 GPUs) and bound pods,
each program started after the objects existed; MiB of VmRSS / VmHWM."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from deploy_support import DEPLOY, KUSTOMIZATIONS, REPO, container, find, render

# nodes -> the highest of 2-3 runs: (kube-scheduler RSS, extender RSS after its list, extender
# peak during the list); pods = 20 x nodes
MEASURED_MIB = {1000: (387, 429, 604), 2500: (912, 909, 1346), 5000: (1632, 1716, 2597)}
# benchmarks/extender/README.md at 5,000 nodes x 100,000 pods: the extender in process (507 MB)
# and as installed against the simulated API (672-705 MB); below the real API server's figures
BENCHMARK_EXTENDER_MB = 705
HEADROOM = 1.5  # real pods are larger than the measured ones (kubelet's status, env, volumes)
DOC = REPO / "docs" / "admin.md"
_UNITS = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "K": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "": 1}


def mib(quantity: str) -> float:
    """A Kubernetes memory quantity ("448Mi", "4Gi", "1G") in MiB."""
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)([KMG]i?|)", str(quantity)).groups()
    return float(number) * _UNITS[unit] / 2 ** 20


def memory(objects, name: str) -> tuple[float, float]:
    resources = container(objects, "Deployment", "vgpu-scheduler", name)["resources"]
    return mib(resources["requests"]["memory"]), mib(resources["limits"]["memory"])


def doc_row(label: str) -> list[str]:
    """The cells of the sizing table's row that starts with ``label``."""
    (line,) = [line for line in DOC.read_text().splitlines() if line.startswith(f"| {label} |")]
    return [cell.strip() for cell in line.strip("|").split("|")]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_both_containers_have_requests_and_limits_from_the_measurements(kustomization):
    objects = render(kustomization)
    for name in ("kube-scheduler", "extender"):
        resources = container(objects, "Deployment", "vgpu-scheduler", name)["resources"]
        assert resources["requests"]["cpu"] and resources["requests"]["memory"] and resources["limits"]["memory"], name
    scheduler_request, scheduler_limit = memory(objects, "kube-scheduler")
    extender_request, extender_limit = memory(objects, "extender")
    largest = MEASURED_MIB[max(MEASURED_MIB)]
    # limits: no OOM kill up to the largest measured cluster, with headroom over the peak
    assert scheduler_limit >= HEADROOM * largest[0]
    assert extender_limit >= HEADROOM * largest[2]
    assert extender_limit >= HEADROOM * BENCHMARK_EXTENDER_MB * 10 ** 6 / 2 ** 20
    # requests: about the smallest measured cluster's steady state, never above the limit
    smallest = MEASURED_MIB[min(MEASURED_MIB)]
    assert 0.95 * smallest[0] <= scheduler_request <= scheduler_limit
    assert 0.95 * smallest[1] <= extender_request <= extender_limit


def test_kube_scheduler_gets_its_own_limit_as_gomemlimit():
    """Go's soft limit follows the container's limit wherever it is patched; a divisor would
    hand Go a number of MiB it reads as bytes."""
    env = {e["name"]: e for e in container(render("base"), "Deployment", "vgpu-scheduler", "kube-scheduler")["env"]}
    assert env["GOMEMLIMIT"]["valueFrom"]["resourceFieldRef"] == {"containerName": "kube-scheduler",
                                                                 "resource": "limits.memory"}


def test_the_sizing_table_matches_the_base_and_the_measurements():
    objects = render("base")
    scheduler, extender = memory(objects, "kube-scheduler"), memory(objects, "extender")
    rows = {1000: doc_row("1,000 nodes, 20,000 pods"), 2500: doc_row("2,500 nodes, 50,000 pods"),
            5000: doc_row("5,000 nodes, 100,000 pods")}
    for nodes, (_, scheduler_cell, extender_cell, source) in rows.items():
        assert source == "measured"
        measured = MEASURED_MIB[nodes]
        scheduler_row = [mib(q) for q in scheduler_cell.split(" / ")]
        extender_row = [mib(q) for q in extender_cell.split(" / ")]
        assert scheduler_row[1] >= HEADROOM * measured[0] and extender_row[1] >= HEADROOM * measured[2], nodes
        assert scheduler_row[0] >= 0.95 * measured[0] and extender_row[0] >= measured[1], nodes
    # deploy/base: the 5,000-node limits, the 1,000-node requests
    assert scheduler[1] == mib(rows[5000][1].split(" / ")[1]) and extender[1] == mib(rows[5000][2].split(" / ")[1])
    assert scheduler[0] == mib(rows[1000][1].split(" / ")[0]) and extender[0] == mib(rows[1000][2].split(" / ")[0])
    # the measurements in the docs (ranges over the runs) end at the ones these tests use
    for nodes, (scheduler_mib, extender_mib, peak_mib) in MEASURED_MIB.items():
        _, scheduler_cell, extender_cell, _ = doc_row(f"{nodes:,} × {nodes * 20:,}")
        assert re.search(rf"\b{scheduler_mib:,} MiB$", scheduler_cell), (nodes, scheduler_cell)
        assert re.search(rf"\b{extender_mib:,} MiB \((\S+–)?{peak_mib:,} MiB\)$", extender_cell), (nodes, extender_cell)


def test_the_documented_patch_resizes_both_containers(tmp_path: Path):
    """docs/admin.md's patch for 2,500 nodes, in an admin's overlay with a scheduler component."""
    (block,) = [b for b in re.findall(r"^```yaml\n(.*?)^```", DOC.read_text(), re.M | re.S)
                if "vgpu-scheduler for up to 2,500 nodes" in b]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY / "overlays" / "hami-core", tmp_path)],
        "components": [os.path.relpath(DEPLOY / "components" / "scheduler-1.37", tmp_path)],
        **yaml.safe_load(block)}))
    objects = render(str(tmp_path))
    row = doc_row("2,500 nodes, 50,000 pods")
    assert memory(objects, "kube-scheduler") == tuple(mib(q) for q in row[1].split(" / "))
    assert memory(objects, "extender") == tuple(mib(q) for q in row[2].split(" / "))
    scheduler = container(objects, "Deployment", "vgpu-scheduler", "kube-scheduler")
    assert scheduler["resources"]["requests"]["cpu"] == "50m"  # merged, not replaced
    assert scheduler["image"].endswith(":v1.37.2") and "GOMEMLIMIT" in {e["name"] for e in scheduler["env"]}
    assert len(find(objects, "Deployment", "vgpu-scheduler")["spec"]["template"]["spec"]["containers"]) == 2
