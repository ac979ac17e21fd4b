"""Each node's CPU and memory headroom: allocatable minus what the pods bound to it request.

Fed by the extender's node and pod informers (every live pod, with or without a vGPU),
read by the ``fragment`` and ``fgd-filter`` placement policies: a card on a node whose CPU
is gone is stranded. The node informer also gives each node's labels, which ``fgd-filter``
matches against the node selectors of the pods it has learned.
Objects come from the API server but their fields are still checked: a quantity that
does not parse counts as 0 and is logged, never raised into the informer's thread.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from jupyter_vgpu.core.fragment import Headroom

log = logging.getLogger(__name__)

_SUFFIX: dict[str, int | Decimal] = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
           "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": 10**3, "M": 10**6,
           "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}


_SUFFIXES = sorted(_SUFFIX, key=len, reverse=True)  # "Mi" before "M"


def quantity(value: Any) -> Decimal | None:
    """A Kubernetes resource quantity ("500m", "2", "1Gi", "1e3") as a number; None if invalid."""
    if isinstance(value, bool) or value is None:
        return None
    return _quantity(str(value).strip())


@functools.lru_cache(maxsize=4096)
def _quantity(text: str) -> Decimal | None:
    # memoised: the same few texts ("2", "8Gi") repeat over every pod of a 100,000-pod list
    if not text or len(text) > 64:
        return None
    for suffix in _SUFFIXES:
        if text.endswith(suffix):
            number, scale = text[: -len(suffix)], Decimal(_SUFFIX[suffix])
            break
    else:
        number, scale = text, Decimal(1)
    try:
        parsed = Decimal(number) * scale
    except InvalidOperation:
        return None
    return parsed if parsed.is_finite() and parsed >= 0 else None


def _cpu_memory(resources: Any) -> tuple[int, int]:
    requests = (resources or {}).get("requests") or {} if isinstance(resources, Mapping) else {}
    if not isinstance(requests, Mapping):
        return 0, 0
    cpu_text, memory_text = requests.get("cpu", 0), requests.get("memory", 0)
    if type(cpu_text) is str and type(memory_text) is str and len(cpu_text) + len(memory_text) <= 64:
        return _texts_cpu_memory(cpu_text, memory_text)  # what the API sends: the same few pairs
    return _cpu_memory_of(cpu_text, memory_text)


def _cpu_memory_of(cpu_value: Any, memory_value: Any) -> tuple[int, int]:
    cpu, memory = quantity(cpu_value), quantity(memory_value)
    return int((cpu or 0) * 1000), int((memory or 0) / 2**20)


_texts_cpu_memory = functools.lru_cache(maxsize=4096)(_cpu_memory_of)


def pod_cpu_memory(pod: Mapping[str, Any]) -> tuple[int, int]:
    """The pod's effective CPU (milli) and memory (MiB) requests, as kube-scheduler counts them:
    the larger of the containers' sum and any one init container, plus the pod overhead."""
    spec = pod.get("spec") or {}
    if not isinstance(spec, Mapping):
        return 0, 0
    cpu = memory = 0
    for container in spec.get("containers") or []:
        if isinstance(container, Mapping):
            c, m = _cpu_memory(container.get("resources"))
            cpu, memory = cpu + c, memory + m
    for container in spec.get("initContainers") or []:
        if isinstance(container, Mapping):
            c, m = _cpu_memory(container.get("resources"))
            cpu, memory = max(cpu, c), max(memory, m)
    overhead = spec.get("overhead")
    if isinstance(overhead, Mapping):
        c, m = _cpu_memory({"requests": overhead})
        cpu, memory = cpu + c, memory + m
    return cpu, memory


class HostHeadroom:
    """Per node: allocatable CPU/memory, the sum of the bound live pods' requests, and its labels."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._allocatable: dict[str, tuple[int, int]] = {}
        self._labels: dict[str, frozenset[str]] = {}
        self.labels_version = 0  # bumped whenever a node's labels change
        self._pods: dict[str, tuple[str, int, int]] = {}  # uid -> (node, cpu milli, memory MiB)
        self._used: dict[str, list[int]] = {}
        self._listeners: list[Callable[[str], None]] = []

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(node)`` (under this object's lock) after the node's CPU headroom or labels changed."""
        with self._lock:
            self._listeners.append(listener)

    def _changed(self, node: str) -> None:
        for listener in self._listeners:
            listener(node)

    def on_node(self, kind: str, node: Mapping[str, Any] | None) -> None:
        if not isinstance(node, Mapping):
            return
        name = (node.get("metadata") or {}).get("name") or ""
        with self._lock:
            if kind == "DELETED":
                gone = self._allocatable.pop(name, None) is not None
                if self._labels.pop(name, None):
                    self.labels_version += 1
                    gone = True
                if gone:
                    self._changed(name)
                return
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            cpu, memory = _cpu_memory({"requests": allocatable})
            changed = self._allocatable.get(name) != (cpu, memory)
            self._allocatable[name] = (cpu, memory)
            labels = (node.get("metadata") or {}).get("labels") or {}
            items = frozenset(
                f"{k}={v}" for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)
            ) if isinstance(labels, Mapping) else frozenset()
            if self._labels.get(name) != items:
                self._labels[name] = items
                self.labels_version += 1
                changed = True
            if changed:
                self._changed(name)

    def on_pod(self, kind: str, pod: Mapping[str, Any] | None) -> None:
        if not isinstance(pod, Mapping):
            return
        metadata = pod.get("metadata") or {}
        uid = str(metadata.get("uid") or f"{metadata.get('namespace')}/{metadata.get('name')}")
        node = (pod.get("spec") or {}).get("nodeName") or ""
        phase = (pod.get("status") or {}).get("phase")
        with self._lock:
            self._forget(uid)
            if kind == "DELETED" or not node or phase in ("Succeeded", "Failed"):
                return
            cpu, memory = pod_cpu_memory(pod)
            self._pods[uid] = (node, cpu, memory)
            used = self._used.setdefault(node, [0, 0])
            used[0] += cpu
            used[1] += memory
            self._changed(node)

    def _forget(self, uid: str) -> None:
        old = self._pods.pop(uid, None)
        if old is not None:
            used = self._used[old[0]]
            used[0] -= old[1]
            used[1] -= old[2]
            self._changed(old[0])

    def facts(self, nodes: list[str]) -> tuple[list[float], list[frozenset[str]]]:
        """Per node, in one lock: CPU headroom in millicores (NaN: allocatable unknown) and labels."""
        nan = float("nan")
        with self._lock:
            cpu = []
            for node in nodes:
                allocatable = self._allocatable.get(node)
                cpu.append(nan if allocatable is None else allocatable[0] - self._used.get(node, (0, 0))[0])
            return cpu, [self._labels.get(node, frozenset()) for node in nodes]

    def cpu_milli(self, node: str) -> float:
        """The node's CPU headroom in millicores, NaN while its allocatable is unknown."""
        with self._lock:
            allocatable = self._allocatable.get(node)
            return float("nan") if allocatable is None else allocatable[0] - self._used.get(node, (0, 0))[0]

    def labels(self, node: str) -> frozenset[str]:
        """The node's labels as ``key=value`` items (empty until the node is seen)."""
        with self._lock:
            return self._labels.get(node, frozenset())

    def headroom(self, node: str) -> Headroom | None:
        """None until the node's allocatable is known."""
        with self._lock:
            allocatable = self._allocatable.get(node)
            if allocatable is None:
                return None
            used = self._used.get(node, [0, 0])
            return Headroom(allocatable[0] - used[0], allocatable[1] - used[1])
