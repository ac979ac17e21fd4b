"""deploy/components/mig: the node container gets what NVIDIA's device plugin gets for MIG
(SYS_ADMIN and NVIDIA_MIG_MONITOR_DEVICES=all), nothing else changes, and nothing without it does."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from deploy_support import DEPLOY, KUSTOMIZATIONS, container, env_of, find, render

K8S_VERSION = "1.35.0"  # as test_manifests.py: the oldest minor deploy/components has a kube-scheduler for
MIG_ENV = {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"}


def with_mig(tmp_path: Path, overlay: str) -> str:
    """An admin's kustomization: a backend overlay plus the mig component."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY / overlay, tmp_path)],
        "components": [os.path.relpath(DEPLOY / "components" / "mig", tmp_path)],
    }))
    return str(tmp_path)


@pytest.mark.parametrize("overlay", ["base", "overlays/hami-core", "overlays/mps"])
def test_the_mig_component_gives_the_node_container_sys_admin_and_the_mig_monitor(tmp_path, overlay):
    objects = render(with_mig(tmp_path, overlay))
    node = container(objects, "DaemonSet", "vgpu-node", "node")
    assert node["securityContext"]["capabilities"] == {"add": ["SYS_ADMIN"], "drop": ["ALL"]}
    assert env_of(node)["NVIDIA_MIG_MONITOR_DEVICES"] == "all"
    assert env_of(node)["NVIDIA_VISIBLE_DEVICES"] == "all"  # the base's, kept
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", ["base", "overlays/hami-core", "overlays/mps"])
def test_the_mig_component_changes_nothing_else(tmp_path, overlay):
    """Without the env entry and the added capability, every object is the overlay's own."""
    objects = render(with_mig(tmp_path, overlay))
    patched = copy.deepcopy(find(objects, "DaemonSet", "vgpu-node"))
    node = next(c for c in patched["spec"]["template"]["spec"]["containers"] if c["name"] == "node")
    node["env"].remove(MIG_ENV)
    del node["securityContext"]["capabilities"]["add"]
    assert patched == find(render(overlay), "DaemonSet", "vgpu-node")
    others = [o for o in objects if (o["kind"], o["metadata"]["name"]) != ("DaemonSet", "vgpu-node")]
    assert others == [o for o in render(overlay) if (o["kind"], o["metadata"]["name"]) != ("DaemonSet", "vgpu-node")]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_without_the_mig_component_no_container_asks_for_sys_admin_or_the_mig_monitor(kustomization):
    for obj in render(kustomization):
        if obj["kind"] not in ("DaemonSet", "Deployment"):
            continue
        pod = obj["spec"]["template"]["spec"]
        for c in pod["containers"] + pod.get("initContainers", []):
            where = f"{kustomization}: {obj['metadata']['name']}/{c['name']}"
            assert "NVIDIA_MIG_MONITOR_DEVICES" not in env_of(c), where
            assert "SYS_ADMIN" not in ((c.get("securityContext") or {}).get("capabilities") or {}).get("add", []), where
