"""Which Kubernetes pod and container a process belongs to, from ``/proc/<pid>/cgroup``.

kubelet puts every container in a cgroup whose path names the pod UID and the runtime's
container ID. The spelling depends on the cgroup driver and the runtime:

cgroupfs driver   ``/kubepods/burstable/pod<uid>/<id>``            (containerd, Docker)
                  ``/kubepods/besteffort/pod<uid>/crio-<id>``       (CRI-O)
                  ``/kubepods/pod<uid>/<id>``                       (Guaranteed QoS)
systemd driver    ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope``
                  with ``crio-<id>.scope`` or ``docker-<id>.scope`` for the other runtimes

cgroup v1 files have one ``<id>:<controllers>:<path>`` line per hierarchy; cgroup v2 has the
single line ``0::<path>``. A reader in a private cgroup namespace (cgroup v2, the default for
containers) sees other containers' paths relative to its own root: ``0::/../../pod<uid>/<id>``
with the cgroupfs driver, the ``kubepods`` segments above the root out of sight. The paths may sit under a prefix (kind, Docker-in-Docker:
``/kubelet.slice/kubelet-kubepods.slice/...``, ``/docker/<id>/kubepods/...``) and may
continue below the container (a process in a nested cgroup), so the parser looks for the
pod segment anywhere and takes the segment after it as the container.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

QOS_CLASSES = ("guaranteed", "burstable", "besteffort")

# A pod UID is a UUID (36 chars) or, for static pods, a 32-hex-digit config hash.
_UID = r"[0-9a-f]{8}(?:[-_]?[0-9a-f]{4}){3}[-_]?[0-9a-f]{12}"
_CGROUPFS_POD = re.compile(rf"^pod({_UID})\Z")
_SYSTEMD_POD = re.compile(rf"^(?:[a-z0-9]+-)?kubepods(?:-(burstable|besteffort))?-pod({_UID})\.slice\Z")
_CONTAINER_ID = r"[0-9a-f]{12,64}"
# (runtime, pattern); the order matters: conmon before crio.
_CONTAINER_SEGMENTS = (
    ("conmon", re.compile(rf"^crio-conmon-({_CONTAINER_ID})(?:\.scope)?\Z")),
    ("cri-o", re.compile(rf"^crio-({_CONTAINER_ID})(?:\.scope)?\Z")),
    ("containerd", re.compile(rf"^cri-containerd-({_CONTAINER_ID})\.scope\Z")),
    ("docker", re.compile(rf"^docker-({_CONTAINER_ID})\.scope\Z")),
    (None, re.compile(rf"^({_CONTAINER_ID})\Z")),  # cgroupfs driver: containerd or Docker
)


@dataclass(frozen=True)
class CgroupIdentity:
    """The pod (and container) a cgroup path belongs to."""

    pod_uid: str
    """As the API server spells it (dashes restored from systemd's underscores)."""
    container_id: str | None
    """The runtime's container ID (as in ``status.containerStatuses[].containerID`` after
    ``<runtime>://``); None for a process in the pod's own cgroup or in CRI-O's conmon."""
    qos: str
    """"guaranteed", "burstable" or "besteffort"; "unknown" when a private cgroup namespace
    hides it (cgroupfs driver)."""
    runtime: str | None
    """"containerd", "cri-o", "docker", or None when the path does not say (cgroupfs IDs)."""
    driver: str
    """"systemd" or "cgroupfs"."""


def _canonical_uid(raw: str) -> str:
    return raw.replace("_", "-")


def parse_cgroup_path(path: str) -> CgroupIdentity | None:
    """The pod identity in one cgroup path, None when the path is not a pod's."""
    segments = [s for s in path.split("/") if s]
    for position, segment in enumerate(segments):
        systemd = _SYSTEMD_POD.match(segment)
        if systemd:
            qos = systemd.group(1) or "guaranteed"
            uid = systemd.group(2)
            driver = "systemd"
        else:
            cgroupfs = _CGROUPFS_POD.match(segment)
            if not cgroupfs:
                continue
            before = segments[:position]
            parent = before[-1] if before else ""
            if "kubepods" in before:
                qos = parent if parent in ("burstable", "besteffort") else "guaranteed"
            elif _outside_namespace(before):
                # a private cgroup namespace: the path climbs out of ours with "..", and the
                # kubepods (and maybe the QoS) segments are above its root, out of sight
                qos = parent if parent in ("burstable", "besteffort") else "unknown"
            else:
                continue
            uid = cgroupfs.group(1)
            driver = "cgroupfs"
        container_id, runtime = None, None
        if position + 1 < len(segments):
            container_id, runtime = _container(segments[position + 1])
        return CgroupIdentity(
            pod_uid=_canonical_uid(uid), container_id=container_id, qos=qos, runtime=runtime, driver=driver
        )
    return None


def _outside_namespace(before: list[str]) -> bool:
    """True for ``..`` segments (then at most a QoS segment) before the pod: the cgroup is
    outside the reader's cgroup namespace, seen relative to its root."""
    climbs = before[:-1] if before and before[-1] in ("burstable", "besteffort") else before
    return bool(climbs) and all(segment == ".." for segment in climbs)


def _container(segment: str) -> tuple[str | None, str | None]:
    for runtime, pattern in _CONTAINER_SEGMENTS:
        match = pattern.match(segment)
        if match:
            if runtime == "conmon":  # CRI-O's monitor process runs beside, not in, the container
                return None, "cri-o"
            return match.group(1), runtime
    return None, None


def parse_cgroup_file(text: str) -> CgroupIdentity | None:
    """The pod identity in the text of a ``/proc/<pid>/cgroup`` file, None outside Kubernetes.

    The unified (v2) line wins when it names a pod; otherwise the first v1 hierarchy that
    does (on a correctly set up node they all agree). Malformed lines are skipped.
    """
    unified: CgroupIdentity | None = None
    legacy: CgroupIdentity | None = None
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        identity = parse_cgroup_path(path)
        if identity is None:
            continue
        if hierarchy == "0" and controllers == "":
            unified = unified or identity
        else:
            legacy = _prefer_container(legacy, identity)
    return unified or legacy


def _prefer_container(current: CgroupIdentity | None, new: CgroupIdentity) -> CgroupIdentity:
    if current is None or (current.container_id is None and new.container_id is not None):
        return new
    return current


def read_process_identity(proc_root: str, pid: int) -> tuple[CgroupIdentity | None, bool]:
    """(identity, readable) for a process: readable is False when its cgroup file is gone, empty
    or cannot be read (the process exited, or the proc root is not the host's), so it is read again."""
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup"), encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None, False
    if not text.strip():  # a live process always has a line; empty means it is going or not there yet
        return None, False
    return parse_cgroup_file(text), True
