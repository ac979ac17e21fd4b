"""cgroup version and driver, and a live process mapped to its pod (what the metrics need)."""

from __future__ import annotations

import os

from ..metrics.cgroup import read_process_identity
from .report import FAIL, OK, WARN, Finding
from .setup import NodeSetup


def cgroup_version(setup: NodeSetup) -> str:
    """"v2" when the unified hierarchy is mounted, else "v1"."""
    return "v2" if os.path.exists(os.path.join(setup.sysfs_root, "fs", "cgroup", "cgroup.controllers")) else "v1"


def check_cgroups(setup: NodeSetup, pod_names: dict[str, str]) -> Finding:
    version = cgroup_version(setup)
    try:
        pids = sorted((int(e) for e in os.listdir(setup.proc_root) if e.isdigit()), reverse=True)
    except OSError as error:
        return Finding("cgroups", FAIL, f"cannot list {setup.proc_root}: {error}",
                       "run in the host's PID namespace (the DaemonSet's hostPID), or pass the host's /proc "
                       "with --proc-root")
    readable = 0
    for pid in pids:
        identity, ok = read_process_identity(setup.proc_root, pid)
        readable += ok
        if identity is None:
            continue
        name = pod_names.get(identity.pod_uid)
        where = f"pod {name} ({identity.pod_uid})" if name else f"pod {identity.pod_uid}"
        detail = (f"cgroup {version}, {identity.driver} driver" + (f", {identity.runtime}" if identity.runtime else "")
                  + f": pid {pid} -> {where}")
        if pod_names and name is None:
            return Finding("cgroups", WARN, detail + ", which the API server does not list on this node",
                           "is --proc-root the host's /proc of this node?")
        return Finding("cgroups", OK, detail)
    if readable == 0:
        return Finding("cgroups", FAIL, f"no readable /proc/<pid>/cgroup under {setup.proc_root}",
                       "mount the host's /proc read-only and pass it with --proc-root")
    return Finding("cgroups", FAIL, f"cgroup {version}: none of {readable} processes maps to a pod; GPU usage "
                                    "cannot be attributed to notebooks",
                   "check that --proc-root is the host's /proc (not the container's); else report the cgroup "
                   f"paths ({setup.proc_root}/<pid>/cgroup) of a pod's process")
