"""Helpers for the real-Kubernetes tier: its nodes, pods made as the Hub makes them, and
reads through kubectl and the official client."""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from http_support import http  # noqa: F401 - re-exported for this area's tests

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
    return real.wait_for_pod(namespace, name, timeout=60)


def annotations(pod: dict[str, Any]) -> dict[str, str]:
    return pod["metadata"].get("annotations") or {}


def held(pods: list[dict[str, Any]], names: Any) -> dict[tuple[str, str], list[tuple[int, int]]]:
    """(node, card uuid) -> the (cores, memory units) each bound pod's record holds there; a pod
    that ended (Failed, Succeeded) holds nothing, as the extender counts it."""
    from jupyter_vgpu.core import contract as c

    cards: dict[tuple[str, str], list[tuple[int, int]]] = collections.defaultdict(list)
    for pod in pods:
        if pod["status"].get("phase") in ("Failed", "Succeeded"):
            continue
        text = annotations(pod).get(names.allocation)
        if text and pod["spec"].get("nodeName"):
            for container in c.PodAllocation.from_json(text).containers:
                for share in container.cards:
                    cards[(pod["spec"]["nodeName"], share.uuid)].append((share.cores, share.memory_units))
    return cards


class OvercommitWatcher:
    """Reads every pod's allocation record every ``period`` seconds while it runs and keeps each
    card found holding more than 100 % of its compute or more than ``card_units(node)`` of memory."""

    def __init__(self, list_pods: Any, names: Any, card_units: Any, period: float = 0.3) -> None:
        self.list_pods, self.names, self.card_units, self.period = list_pods, names, card_units, period
        self.violations: list[str] = []
        self.checks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="overcommit-watcher", daemon=True)

    def start(self) -> OvercommitWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            for (node, uuid), shares in held(self.list_pods(), self.names).items():
                if sum(s[0] for s in shares) > 100 or sum(s[1] for s in shares) > self.card_units(node):
                    self.violations.append(f"{node} {uuid}: {shares}")
            self.checks += 1
            time.sleep(self.period)
