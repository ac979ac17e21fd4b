"""The Helm chart (deploy/helm/jupyter-vgpu) on the real control plane: ``helm install`` (Helm
built from its Go module by hack/helm), a vGPU pod Running, ``helm upgrade``, and ``helm
uninstall`` leaving nothing behind; a wrong value refused by the chart's schema before anything
reaches the cluster.

What is real and what stands in: helm creates every object of the chart in a real
kube-apiserver, which serves and enforces them as any cluster does: the RBAC the programs run
under, the ValidatingAdmissionPolicy and its params ConfigMap (the node daemon's writes pass
it only with the chart's account names), the scheduler's ConfigMap, the Services and
NetworkPolicies. The chart's two workloads, DaemonSet vgpu-node and Deployment vgpu-scheduler,
are stored but make no pods: this control plane runs no DaemonSet or Deployment controller
(and Kubernetes' fake CRI, under the kubelets, runs no container process). Their programs run
as local processes instead, exactly as for deploy/base (vgpu_plugin.realkube): the node
daemon with a token of the chart's vgpu-node account bound to its Node, the extender and
kube-scheduler with the chart's vgpu-scheduler account, kube-scheduler with the configuration
read from the chart's ConfigMap. So the pod reaching Running says the chart's objects are what
those programs need; what the chart's pod specs would do on a real node (images, host paths,
probes) is checked by tests/deploy instead.

The test builds its own one-node cluster (not the session's ``real`` cluster), and takes the
"nothing left" snapshot after namespaces vgpu-system (labelled for the privileged Pod Security
level, as docs/admin.md says to) and jhub (the Hub's, for the reclaimer's RBAC) exist.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from vgpu_plugin.realkube.control_plane import NAMESPACE, ControlPlane, repository

from jupyter_vgpu.core import contract as c

pytestmark = pytest.mark.slow

RELEASE = "jupyter-vgpu"
CHART = repository() / "deploy" / "helm" / "jupyter-vgpu"
VALUES = repository() / "deploy" / "helm" / "values"
HUB_NAMESPACE = "jhub"
NODE = "gpu-h"
INSTALL_VALUES = ("hami-core.yaml",)  # the node daemons here enforce with hami-core (RealCluster's default)
UPGRADE_VALUES = ("hami-core.yaml", "mig.yaml", "reclaimer.yaml")
Snapshot = frozenset[tuple[str, str, str, str]]


class Helm:
    """helm against one control plane, as an admin with its kubeconfig; also the ``deploy`` step
    of that control plane: namespaces, the baseline snapshot, then ``helm install``."""

    def __init__(self, program: Path) -> None:
        self.program = program
        self.plane: ControlPlane | None = None
        self.kinds: tuple[str, ...] = ()
        self.baseline: Snapshot = frozenset()
        self.installed = ""

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        assert self.plane is not None
        result = subprocess.run([str(self.program), *args, "--kubeconfig", str(self.plane.kubeconfig)],
                                capture_output=True, text=True, timeout=300)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
        return result

    def chart_args(self, values: tuple[str, ...]) -> list[str]:
        return [RELEASE, str(CHART), "--namespace", NAMESPACE, *(arg for v in values for arg in ("-f", str(VALUES / v)))]

    def __call__(self, plane: ControlPlane) -> None:
        self.plane = plane
        # the kinds of every object the chart makes here, install and upgrade, plus Helm's own
        # release records (Secrets) and the namespaces
        rendered = subprocess.run([str(self.program), "template", *self.chart_args(UPGRADE_VALUES)],
                                  capture_output=True, text=True, timeout=120, check=True).stdout
        kinds = {doc["kind"] for doc in yaml.safe_load_all(rendered) if doc}
        self.kinds = tuple(sorted(kinds | {"Secret", "Namespace"}))
        # the bootstrap RBAC the chart binds to (system:kube-scheduler, ...) is in place
        plane.wait_for(lambda: plane.kubectl("get", "clusterrole", "system:kube-scheduler", check=False),
                       what="the API server's bootstrap roles")
        plane.kubectl("create", "namespace", NAMESPACE)
        plane.kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=privileged")
        plane.kubectl("create", "namespace", HUB_NAMESPACE)
        self.baseline = self.settled_snapshot()
        self.installed = self.run("install", *self.chart_args(INSTALL_VALUES)).stdout

    def snapshot(self) -> Snapshot:
        """(kind, namespace, name, uid) of every object of those kinds, in every namespace."""
        assert self.plane is not None
        listed = json.loads(self.plane.kubectl("get", ",".join(self.kinds), "--all-namespaces", "-o", "json"))
        return frozenset((o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"], o["metadata"]["uid"])
                         for o in listed["items"])

    def settled_snapshot(self) -> Snapshot:
        """A snapshot once kube-controller-manager has given every namespace its own objects (the
        default ServiceAccount, ConfigMap kube-root-ca.crt): they must not look like leftovers."""
        assert self.plane is not None
        plane = self.plane

        def settled() -> Snapshot | None:
            taken = self.snapshot()
            namespaces = {name for kind, _, name, _ in taken if kind == "Namespace"}
            accounts = {ns for kind, ns, name, _ in taken if (kind, name) == ("ServiceAccount", "default")}
            roots = {ns for kind, ns, name, _ in taken if (kind, name) == ("ConfigMap", "kube-root-ca.crt")}
            return taken if namespaces <= accounts and namespaces <= roots else None

        snapshot: Snapshot = plane.wait_for(settled, what="every namespace's default account and root CA")
        return snapshot

    def manifest_objects(self) -> set[tuple[str, str, str]]:
        """(kind, namespace, name) of what the release holds now (helm get manifest)."""
        docs = yaml.safe_load_all(self.run("get", "manifest", RELEASE, "--namespace", NAMESPACE).stdout)
        return {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]) for d in docs if d}


@pytest.fixture(scope="module")
def helm_cluster(topology_fixtures: Any, helm_program: Path) -> Iterator[tuple[Any, Helm]]:
    from vgpu_plugin.demo.node import NodeSpec
    from vgpu_plugin.realkube.cluster import RealCluster

    helm = Helm(helm_program)
    with RealCluster([NodeSpec(NODE, "a100-sxm-4gpu-nv4.txt", seed=5)], fixtures_dir=topology_fixtures,
                     policy="fgd-filter", metrics_period=0.5, ready_timeout=120, deploy=helm) as cluster:
        yield cluster, helm


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def workload(cluster: Any, kind: str, name: str) -> dict[str, Any]:
    stored: dict[str, Any] = json.loads(cluster.kubectl("get", kind, "-n", NAMESPACE, name, "-o", "json"))
    return stored


def can(cluster: Any, verb: str, resource: str, namespace: str, account: str) -> bool:
    answer = cluster.kubectl("auth", "can-i", verb, resource, "-n", namespace, "--as", account, check=False)
    return answer.strip() == "yes"


def test_helm_install_runs_a_vgpu_pod_and_upgrade_and_uninstall_leave_nothing_behind(helm_cluster):
    cluster, helm = helm_cluster
    hub = f"system:serviceaccount:{HUB_NAMESPACE}:hub"

    # --- install: the release, its objects, the kube-scheduler of the live API server's minor ----
    assert "STATUS: deployed" in helm.installed and "REVISION: 1" in helm.installed
    assert "jupyter-vgpu doctor" in helm.installed and "deploy/examples/smoke-test.yaml" in helm.installed  # NOTES.txt
    objects = helm.manifest_objects()
    assert {("DaemonSet", NAMESPACE, "vgpu-node"), ("Deployment", NAMESPACE, "vgpu-scheduler"),
            ("ValidatingAdmissionPolicy", "", "vgpu-trusted-annotations"),
            ("ConfigMap", NAMESPACE, "vgpu-trusted-writers")} <= objects
    installed = {(kind, ns, name) for kind, ns, name, _ in helm.snapshot()}
    assert objects <= installed
    server = json.loads(cluster.kubectl("version", "-o", "json"))["serverVersion"]
    scheduler = workload(cluster, "deployment", "vgpu-scheduler")["spec"]["template"]["spec"]
    images = {k["name"]: k["image"] for k in scheduler["containers"]}
    minor = f"{server['major']}.{server['minor']}"
    assert images["kube-scheduler"] == f"registry.k8s.io/kube-scheduler:{server['gitVersion']}", (minor, images)
    daemon = workload(cluster, "daemonset", "vgpu-node")
    assert env_of(daemon["spec"]["template"]["spec"]["containers"][0])["VGPU_ENFORCEMENT"] == "hami-core"
    assert not workload(cluster, "daemonset", "vgpu-node").get("status", {}).get("desiredNumberScheduled")

    # --- a vGPU pod, through the chart's RBAC, admission policy and scheduler configuration -------
    cluster.create_notebook_pod("helm-a", cores=25, memory="4GiB")
    pod = cluster.wait_for_pod("default", "helm-a", timeout=90)
    assert pod["spec"]["nodeName"] == NODE
    assert c.DEFAULT_NAMES.allocation in pod["metadata"]["annotations"]

    # --- upgrade: MIG discovery and the reclaimer's RBAC on; the stack keeps working -------------
    upgraded = helm.run("upgrade", *helm.chart_args(UPGRADE_VALUES)).stdout
    assert "REVISION: 2" in upgraded
    node = workload(cluster, "daemonset", "vgpu-node")["spec"]["template"]["spec"]["containers"][0]
    assert env_of(node)["NVIDIA_MIG_MONITOR_DEVICES"] == "all" and node["securityContext"]["capabilities"]["add"] == [
        "SYS_ADMIN"]
    assert helm.manifest_objects() - objects == {
        ("Role", NAMESPACE, "vgpu-reclaimer-node-daemons"), ("RoleBinding", NAMESPACE, "vgpu-reclaimer-node-daemons"),
        ("Role", HUB_NAMESPACE, "vgpu-reclaimer-events"), ("RoleBinding", HUB_NAMESPACE, "vgpu-reclaimer-events")}
    assert can(cluster, "list", "pods", NAMESPACE, hub) and can(cluster, "create", "events", HUB_NAMESPACE, hub)
    assert not can(cluster, "list", "pods", "default", hub)
    cluster.create_notebook_pod("helm-b", cores=50, memory="8GiB")
    assert cluster.wait_for_pod("default", "helm-b", timeout=90)["spec"]["nodeName"] == NODE
    assert cluster.read_pod("default", "helm-a")["status"]["phase"] == "Running"
    history = json.loads(helm.run("history", RELEASE, "--namespace", NAMESPACE, "-o", "json").stdout)
    assert [(h["revision"], h["status"]) for h in history] == [(1, "superseded"), (2, "deployed")]

    # --- uninstall: every object of every kind the chart makes is gone, nothing else touched -----
    for name in ("helm-a", "helm-b"):
        cluster.kubectl("delete", "pod", "-n", "default", name, "--wait=false")
    cluster.wait_for(lambda: all(cluster.read_pod("default", n) is None for n in ("helm-a", "helm-b")),
                     timeout=60, what="the vGPU pods to be deleted")
    helm.run("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
    assert helm.snapshot() == helm.baseline
    assert not can(cluster, "list", "pods", NAMESPACE, hub)
    assert helm.run("status", RELEASE, "--namespace", NAMESPACE, check=False).returncode != 0

    # --- a wrong value fails helm install before anything reaches the cluster --------------------
    for wrong, says in ((("--set", "enforcement=foo"), "/enforcement"),
                        (("--set", "scheduler.extender.resources.limits.memory=-1Gi"), "/scheduler/extender/resources")):
        refused = helm.run("install", *helm.chart_args(INSTALL_VALUES), *wrong, check=False)
        assert refused.returncode != 0 and "schema" in refused.stderr and says in refused.stderr, refused.stderr
    assert helm.snapshot() == helm.baseline
