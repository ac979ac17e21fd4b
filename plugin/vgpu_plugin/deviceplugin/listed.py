"""This node's pods: the informer's copies, or a fresher LIST's until the watch catches up.

The allocator reads the node's pods from its informer (a watch on ``spec.nodeName``).
kubelet's watch and ours are independent, so kubelet may admit a pod our watch has not
delivered yet; the allocator then lists the node's pods from the API. That list is kept
here and stands in for the informer's view until the watch has caught up with it, so
the next call of the same admission (the other resource, the next container) finds the
pod without listing again.

Per pod, the newer copy wins (resourceVersions are compared as integers, as the
extender's ledger does; a version that is not one keeps the list out). A pod the
informer holds, absent from the list and not changed since the list was taken, is gone.
Once the informer's resourceVersion reaches the list's, the list has nothing newer to say
and is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ..informer import resource_version

__all__ = ["ListedPods"]


def _uid(pod: dict[str, Any]) -> str:
    return (pod.get("metadata") or {}).get("uid") or ""


class ListedPods:
    """The last LIST of this node's pods, until the informer's watch has passed it. Not locked:
    the allocator calls it under its own lock."""

    def __init__(self) -> None:
        self._version: int | None = None  # the list's resourceVersion (None: no list stands)
        self._pods: dict[str, dict[str, Any]] = {}

    @property
    def standing(self) -> bool:
        return self._version is not None

    def replace(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """Keep a LIST reply (``{"metadata": {"resourceVersion"}, "items"}``); its items."""
        items = [p for p in body.get("items") or [] if isinstance(p, dict)]
        version = resource_version(body)
        if version is None or any(resource_version(p) is None for p in items):
            self._version, self._pods = None, {}  # not comparable: the list serves this call only
        else:
            self._version, self._pods = version, {_uid(p): p for p in items}
        return items

    def merged(self, cached: Sequence[dict[str, Any]], informer_version: Any) -> Iterable[dict[str, Any]]:
        """The node's pods: ``cached`` (the informer's, read after ``informer_version``) with the list's
        newer copies, without the pods the list showed gone."""
        if self._version is None:
            return cached
        reached = informer_version if isinstance(informer_version, int) else resource_version(
            {"metadata": {"resourceVersion": informer_version}})
        if reached is not None and reached >= self._version:
            self._version, self._pods = None, {}  # the watch delivered everything the list saw
            return cached
        listed = self._pods
        merged: dict[str, dict[str, Any]] = {}
        for pod in cached:
            uid = _uid(pod)
            version = resource_version(pod)
            fresher = listed.get(uid)
            if fresher is not None:
                merged[uid] = pod if version is not None and version > (resource_version(fresher) or 0) else fresher
            elif version is not None and version > self._version:
                merged[uid] = pod  # bound here after the list was taken
            # else: the list, newer than this copy, no longer has the pod (deleted, or moved off)
        for uid, pod in listed.items():
            merged.setdefault(uid, pod)
        return list(merged.values())
