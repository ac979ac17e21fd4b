"""Wall-clock timers around named methods, per process: profile_storm.py installs the node
side's in the benchmark's process and, with ``--control-plane-process``, the control
plane's in its child (through ``ControlPlaneProcess.call``) and, with ``--node-processes``,
the nodes' in each node process (``NodeProcess.call``), and reads them all back."""

from __future__ import annotations

import collections
import functools
import importlib
import threading
import time
from typing import Any

CONTROL_PLANE = (
    ("simkube.scheduler", "SimScheduler", "schedule_one", "scheduler: one scheduling cycle"),
    ("simkube.scheduler", "SimScheduler", "_node_fit", "scheduler: node resource fit"),
    ("simkube.scheduler", "SimScheduler", "_extender_filter", "scheduler: extender filter over HTTP"),
    ("simkube.scheduler", "SimScheduler", "_select", "scheduler: prioritize over HTTP and choice"),
    ("simkube.scheduler", "SimScheduler", "_bind", "scheduler: binding cycle (incl. event)"),
    ("simkube.scheduler", "SimScheduler", "_record", "scheduler: event POST"),
    ("vgpu_plugin.extender.decisions", "Decisions", "filter", "extender: filter decision"),
    ("vgpu_plugin.extender.decisions", "Decisions", "prioritize", "extender: prioritize decision"),
    ("vgpu_plugin.extender.decisions", "Decisions", "bind", "extender: bind (all of it)"),
    ("vgpu_plugin.extender.cluster", "KubePodAPI", "get_pod", "extender: API get_pod"),
    ("vgpu_plugin.extender.cluster", "KubePodAPI", "patch_annotations", "extender: API patch_annotations"),
    ("vgpu_plugin.extender.cluster", "KubePodAPI", "bind", "extender: API bind"),
)
NODES = (
    ("vgpu_plugin.deviceplugin.allocator", "Allocator", "allocate", "device plugin: Allocate (one resource)"),
    ("vgpu_plugin.deviceplugin.allocator", "Allocator", "preferred", "device plugin: GetPreferredAllocation"),
    ("vgpu_plugin.deviceplugin.allocator", "Allocator", "_fetch_fresh",
     "device plugin: list the node's pods (cache check)"),
    ("vgpu_plugin.deviceplugin.allocator", "Allocator", "desired_annotations", "device plugin: record to write"),
    ("vgpu_plugin.demo.kubelet", "SimKubelet", "_admit", "kubelet: admit one pod"),
    ("vgpu_plugin.demo.kubelet", "SimKubelet", "_allocate_one", "kubelet: one Allocate (+ preferred)"),
    ("vgpu_plugin.demo.kubelet", "SimKubelet", "_write_checkpoint", "kubelet: checkpoint write"),
    ("vgpu_plugin.demo.kubelet", "SimKubelet", "_run", "kubelet: status Running"),
)

_totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
_lock = threading.Lock()


def timed(owner: Any, name: str, label: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            with _lock:
                entry = _totals[label]
                entry[0] += 1
                entry[1] += time.perf_counter() - started

    setattr(owner, name, wrapper)


def install(stages: tuple[tuple[str, str, str, str], ...]) -> None:
    for module, cls, method, label in stages:
        timed(getattr(importlib.import_module(module), cls), method, label)


def install_control_plane() -> None:
    install(CONTROL_PLANE)


def install_nodes() -> None:
    install(NODES)


def totals() -> dict[str, tuple[int, float]]:
    with _lock:
        return {label: (int(calls), seconds) for label, (calls, seconds) in _totals.items()}
