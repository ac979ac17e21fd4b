"""Helpers for the real-Kubernetes tier: its nodes, pods made as the Hub makes them, and
reads through kubectl and the official client."""

from __future__ import annotations

import collections
import threading
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


def pod_shares(pod: dict[str, Any], names: Any) -> list[tuple[tuple[str, str], int, int]]:
    """((node, card uuid), cores, memory units) of each share a bound pod's record holds; none for
    a pod that ended (Failed, Succeeded), as the extender counts it."""
    from jupyter_vgpu.core import contract as c

    if (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
        return []
    text = annotations(pod).get(names.allocation)
    node = pod["spec"].get("nodeName")
    if not (text and node):
        return []
    return [((node, share.uuid), share.cores, share.memory_units)
            for container in c.PodAllocation.from_json(text).containers for share in container.cards]


def held(pods: list[dict[str, Any]], names: Any) -> dict[tuple[str, str], list[tuple[int, int]]]:
    """(node, card uuid) -> the (cores, memory units) each bound pod's record holds there."""
    cards: dict[tuple[str, str], list[tuple[int, int]]] = collections.defaultdict(list)
    for pod in pods:
        for card, cores, memory in pod_shares(pod, names):
            cards[card].append((cores, memory))
    return cards


class OvercommitWatcher:
    """Watches pods (``list_func``, the official client's list call, with its ``selectors``) and on
    every event checks each card the changed pod holds: more than 100 % of its compute, or more
    than ``card_units(node)`` of memory, is kept as a violation. A watch, not polling: a storm
    measured beside it must not pay for whole LISTs every fraction of a second."""

    def __init__(self, list_func: Any, names: Any, card_units: Any, *, keep: Any = None, **selectors: Any) -> None:
        from vgpu_plugin.informer import Informer

        self.names, self.card_units = names, card_units
        self.keep = keep or (lambda pod: True)  # pods that hold their cards (e.g. not being deleted)
        self.violations: list[str] = []
        self.checks = 0
        self._lock = threading.Lock()
        self._shares: dict[str, list[tuple[tuple[str, str], int, int]]] = {}
        self._cards: dict[tuple[str, str], dict[str, tuple[int, int]]] = collections.defaultdict(dict)
        self._informer = Informer(list_func, on_event=self._on_event, **selectors)
        self._informer.name = "overcommit-watcher"

    def start(self) -> OvercommitWatcher:
        self._informer.start()
        assert self._informer.wait_synced(30), "the over-commit watcher could not list the pods"
        return self

    def stop(self) -> None:
        self._informer.stop()

    def _on_event(self, kind: str, pod: dict[str, Any] | None) -> None:
        if pod is None:
            return  # RELISTED: the differences came as events before it
        uid = pod["metadata"]["uid"]
        shares = [] if kind == "DELETED" or not self.keep(pod) else pod_shares(pod, self.names)
        with self._lock:
            for card, _, _ in self._shares.pop(uid, []):
                self._cards[card].pop(uid, None)
            self._shares[uid] = shares
            for card, cores, memory in shares:
                holders = self._cards[card]
                holders[uid] = (cores, memory)
                if sum(h[0] for h in holders.values()) > 100 or \
                        sum(h[1] for h in holders.values()) > self.card_units(card[0]):
                    self.violations.append(f"{card[0]} {card[1]}: {sorted(holders.values())}")
            self.checks += 1
