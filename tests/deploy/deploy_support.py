"""Rendering deploy/ with kubectl's built-in kustomize, once per overlay per session."""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUSTOMIZATIONS = ("base", "overlays/hami-core", "overlays/mps", "overlays/monitoring")
KUBECTL = shutil.which("kubectl")


@functools.cache
def render(path: str) -> tuple[dict, ...]:
    """Objects kubectl kustomize produces for a directory (absolute, or relative to deploy/)."""
    if KUBECTL is None:
        pytest.fail("kubectl is not installed; the deploy tests render with `kubectl kustomize`")
    target = Path(path) if Path(path).is_absolute() else DEPLOY / path
    result = subprocess.run([KUBECTL, "kustomize", str(target)], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        pytest.fail(f"kubectl kustomize {target} failed:\n{result.stderr}")
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def find(objects, kind: str, name: str) -> dict:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def container(objects, kind: str, name: str, container_name: str) -> dict:
    spec = find(objects, kind, name)["spec"]["template"]["spec"]
    (match,) = [c for c in spec["containers"] if c["name"] == container_name]
    return match


def env_of(c: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in c.get("env") or []}
