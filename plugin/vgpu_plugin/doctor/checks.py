"""Every check, in the order a person fixes things: driver, runtime, kubelet, enforcement,
cgroups and GPU process visibility, then what the cluster sees."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .cgroup_checks import check_cgroups
from .cluster_checks import (
    check_node_annotation,
    check_nvidia_plugin,
    check_scheduler_version,
    check_vgpu_contract,
    pod_names_by_uid,
)
from .enforcement_checks import check_enforcement
from .gpu_checks import check_cards, check_device_nodes, check_driver, check_mig
from .kubelet_checks import check_checkpoint, check_plugin_dir
from .report import FAIL, Finding
from .setup import NodeSetup

log = logging.getLogger(__name__)


def _cgroups(setup: NodeSetup) -> Finding:
    return check_cgroups(setup, pod_names_by_uid(setup))


def _process_visibility(setup: NodeSetup) -> Finding:
    from .process_checks import check_process_visibility

    return check_process_visibility(setup, pod_names_by_uid(setup))


def _runtime(setup: NodeSetup) -> Finding:
    from .runtime_checks import check_runtime

    return check_runtime(setup)


def _toolkit(setup: NodeSetup) -> Finding:
    from .runtime_checks import check_toolkit_config

    return check_toolkit_config(setup)


def _injection(setup: NodeSetup) -> Finding:
    from .runtime_checks import check_injection

    return check_injection(setup)


CHECKS: tuple[tuple[str, Callable[[NodeSetup], Any]], ...] = (
    ("driver", check_driver),
    ("cards", check_cards),
    ("mig", check_mig),
    ("device-nodes", check_device_nodes),
    ("runtime", _runtime),
    ("toolkit-config", _toolkit),
    ("injection", _injection),
    ("notebook-runtime", check_vgpu_contract),
    ("kubelet", check_plugin_dir),
    ("checkpoint", check_checkpoint),
    ("enforcement", check_enforcement),
    ("cgroups", _cgroups),
    ("process-visibility", _process_visibility),
    ("node-annotation", check_node_annotation),
    ("nvidia-plugin", check_nvidia_plugin),
    ("scheduler-version", check_scheduler_version),
)


def run_checks(setup: NodeSetup) -> list[Finding]:
    """Every finding; a check that raises becomes a failure naming the error, and the rest still run."""
    findings: list[Finding] = []
    for name, check in CHECKS:
        try:
            result = check(setup)
        except Exception as error:  # a doctor that crashes tells nobody anything
            log.debug("check %s raised", name, exc_info=True)
            findings.append(Finding(name, FAIL, f"the check itself failed: {type(error).__name__}: {error}",
                                    "run with --log-level DEBUG and report it"))
            continue
        findings.extend(result if isinstance(result, list) else [result])
    return findings
