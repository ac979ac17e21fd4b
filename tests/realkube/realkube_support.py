"""Helpers for the real-Kubernetes tier: its nodes, pods made as the Hub makes them, and
reads through kubectl and the official client."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

GPU_A = "gpu-a"  # 4 x A100 40GB, NVLink (a100-sxm-4gpu-nv4)
GPU_B = "gpu-b"  # 7 x Tesla P40 24GB, PCIe (p40-7gpu-pix-phb)
MIG = "mig"      # 4 x A100 40GB, card 0 in MIG mode
MIG_LAYOUT = ("2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb")


def notebook(real: Any, pods: list[tuple[str, str]], name: str, *, cores: int, memory: str | None = None,
             pool: str | None = None, namespace: str = "default", annotations: dict[str, str] | None = None,
             wait: bool = True) -> dict[str, Any]:
    """A notebook pod as the Hub's profiles make it, created, and (``wait``) Running."""
    body = real.notebook_pod(name, cores=cores, memory=memory, namespace=namespace, annotations=annotations)
    if pool:
        body["spec"]["nodeSelector"] = {"pool": pool}
    real.core_v1.create_namespaced_pod(namespace, body, _preload_content=False)
    pods.append((namespace, name))
    if not wait:
        return body
    return real.wait_for_pod(namespace, name, timeout=60)  # type: ignore[no-any-return]


def annotations(pod: dict[str, Any]) -> dict[str, str]:
    return pod["metadata"].get("annotations") or {}


def http(url: str, token: str | None = None, timeout: float = 15.0) -> tuple[int, Any]:
    """(status, body) of a GET; the body parsed as JSON when it is JSON."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")
