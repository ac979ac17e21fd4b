"""Helpers for the end-to-end tests: real HTTP to the extender and the node metrics servers,
the official client against the simulated API, and readings of every component's view."""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from http_support import http  # noqa: F401 - re-exported for this area's tests

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.inventory import NodeInventory

NAMES = c.DEFAULT_NAMES
DGX = "dgx"  # the e2e cluster's nodes (tests/e2e/conftest.py)
P40 = "p40"
_DEVICE = re.compile(r"^gpu([0-9]+)-(core|mem)-[0-9]+$")


def pod_body(cluster: Any, name: str, cores: int, memory_units: int | None, *, node: str | None = None,
             namespace: str = "default", labels: dict[str, str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = cluster.notebook_pod(name, cores=cores, memory=memory_units, namespace=namespace,
                                                labels=labels or {})
    if node:
        body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return body


def create_pod(cluster: Any, body: dict[str, Any]) -> None:
    cluster.core_v1.create_namespaced_pod(body["metadata"]["namespace"], body, _preload_content=False)


def delete_pod(cluster: Any, namespace: str, name: str) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        cluster.core_v1.delete_namespaced_pod(name, namespace, _preload_content=False)
    except ApiException as error:
        if error.status != 404:
            raise


def list_pods(cluster: Any, **kwargs: Any) -> list[dict[str, Any]]:
    answer = cluster.core_v1.list_pod_for_all_namespaces(_preload_content=False, **kwargs)
    return list(json.loads(answer.data).get("items") or [])


def allocation(pod: dict[str, Any]) -> c.PodAllocation | None:
    record = ((pod.get("metadata") or {}).get("annotations") or {}).get(NAMES.allocation)
    return _parsed_record(record) if record else None


@functools.lru_cache(maxsize=4096)
def _parsed_record(record: str) -> c.PodAllocation:
    """The invariant watchers re-read every pod's record on every event (the storm: 800 events x
    200 pods); a record is immutable text and PodAllocation a frozen value, so parse each once."""
    return c.PodAllocation.from_json(record)


def inventory(cluster: Any, node: str) -> NodeInventory:
    raw = json.loads(cluster.core_v1.read_node(node, _preload_content=False).data)
    return NodeInventory.from_json(raw["metadata"]["annotations"][NAMES.node_inventory])


def inspect_cards(cluster: Any, node: str) -> dict[int, dict[str, Any]]:
    """The extender's /inspect view of one node: card index -> card entry."""
    status, body = http(f"{cluster.extender.base_url}/inspect?node={node}")
    assert status == 200, body
    (entry,) = [n for n in body["nodes"] if n["name"] == node]
    return {card["index"]: card for card in entry["cards"]}


def free_cores(cluster: Any, node: str) -> dict[int, int]:
    return {i: card["cores"]["free"] for i, card in inspect_cards(cluster, node).items()}


def holdings_from_annotations(pods: Iterable[dict[str, Any]]) -> dict[tuple[str, int], tuple[int, int]]:
    """(node, card) -> (cores, memory units) summed over the allocation records of live pods."""
    held: dict[tuple[str, int], tuple[int, int]] = {}
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
            continue
        record = allocation(pod)
        if record is None:
            continue
        for container in record.containers:
            for share in container.cards:
                cores, units = held.get((record.node, share.index), (0, 0))
                held[(record.node, share.index)] = (cores + share.cores, units + share.memory_units)
    return held


def overcommitted(held: dict[tuple[str, int], tuple[int, int]], capacity: dict[tuple[str, int], int]) -> list[str]:
    """Cards holding more than 100 % of their compute or more memory units than they have."""
    problems = []
    for key, (cores, units) in sorted(held.items()):
        if cores > c.CORES_PER_CARD or units > capacity.get(key, 0):
            problems.append(f"{key[0]} card {key[1]}: {cores} cores, {units}/{capacity.get(key)} memory units")
    return problems


class AnnotationTally:
    """``holdings_from_annotations`` and the MIG slices live pods name, kept pod by pod: an
    invariant watcher checks after every pod event, and recounting every pod each time made
    the check O(pods) per event (the storm: 800 events x 200 pods, in the benchmark's process).
    ``update`` returns what the event made wrong: the over-committed cards among those the
    event touched (other cards did not change since they were last checked) and the slices
    it made named twice."""

    def __init__(self, capacity: dict[tuple[str, int], int]) -> None:
        self.capacity = capacity
        self.held: dict[tuple[str, int], tuple[int, int]] = {}  # (node, card) -> (cores, units), live pods
        self.slices: Counter[str] = Counter()  # MIG device -> live pods naming it
        self._pods: dict[str, tuple[dict[tuple[str, int], tuple[int, int]], tuple[str, ...]]] = {}

    def update(self, uid: str, pod: dict[str, Any] | None) -> tuple[list[str], list[str]]:
        """``pod``: its current object, None once deleted. Returns (over-committed cards, slices named twice)."""
        live = pod is not None and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        new_held = holdings_from_annotations([pod]) if pod is not None and live else {}
        new_slices = tuple(v for k, v in ((pod or {}).get("metadata") or {}).get("annotations", {}).items()
                           if k.startswith(NAMES.mig_slice_prefix)) if live else ()
        old_held, old_slices = self._pods.pop(uid, ({}, ()))
        if new_held or new_slices:
            self._pods[uid] = (new_held, new_slices)
        for sign, held in ((-1, old_held), (1, new_held)):
            for key, (cores, units) in held.items():
                total_cores, total_units = self.held.get(key, (0, 0))
                self.held[key] = (total_cores + sign * cores, total_units + sign * units)
                if self.held[key] == (0, 0):
                    del self.held[key]
        touched = set(old_held) | set(new_held)
        problems = overcommitted({k: v for k, v in self.held.items() if k in touched}, self.capacity)
        self.slices.subtract(old_slices)
        self.slices.update(new_slices)
        named = sorted(s for s in set(new_slices) if self.slices[s] > 1)
        for name in set(old_slices) - set(new_slices):
            if self.slices[name] <= 0:
                del self.slices[name]
        return problems, [f"MIG slice {s} named by {self.slices[s]} pods" for s in named]


def device_counts(ids: Iterable[str]) -> Counter[tuple[int, str]]:
    """(card, 'core'|'mem') -> how many of these device IDs name it."""
    counts: Counter[tuple[int, str]] = Counter()
    for device in ids:
        match = _DEVICE.match(device)
        assert match, f"unexpected device ID {device!r}"
        counts[(int(match.group(1)), match.group(2))] += 1
    return counts


def best_set_cost(topology: Any, free: Iterable[int], size: int) -> int:
    """The brute-force lowest pairwise link cost of ``size`` cards among ``free``."""
    return min(topology.set_cost(combo) for combo in itertools.combinations(sorted(free), size))
