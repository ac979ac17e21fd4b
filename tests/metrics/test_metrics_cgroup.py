"""The cgroup parser over the path formats real nodes produce (each runtime, driver, cgroup version)."""

from __future__ import annotations

import os

import pytest
from vgpu_plugin.metrics.cgroup import (
    CgroupIdentity,
    parse_cgroup_file,
    parse_cgroup_path,
    read_process_identity,
)

UID = "8f3b6d1e-2c4a-4b7e-9f0a-1d2e3c4b5a69"
UID_ = UID.replace("-", "_")
CID = "4c01db0b339c7a8c2e1fa0f1d3b9e0b6a3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8"
PAUSE = "9d2a6f7e1b0c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6a7b8c9d0e1f2a"


def v1(path: str, hybrid_unified: str = "/") -> str:
    """A cgroup v1 file as a kubelet-managed process sees it (hybrid: a trailing 0:: line)."""
    return "\n".join(
        [
            f"12:hugetlb:{path}",
            f"11:memory:{path}",
            f"10:cpu,cpuacct:{path}",
            f"9:devices:{path}",
            f"8:pids:{path}",
            f"7:perf_event:{path}",
            f"6:freezer:{path}",
            f"5:net_cls,net_prio:{path}",
            f"4:blkio:{path}",
            f"3:cpuset:{path}",
            "2:rdma:/",
            f"1:name=systemd:{path}",
            f"0::{hybrid_unified}",
        ]
    ) + "\n"


def v2(path: str) -> str:
    return f"0::{path}\n"


CASES = {
    # cgroup v1, cgroupfs driver (containerd or Docker: bare 64-hex container directory)
    "v1 cgroupfs burstable": (
        v1(f"/kubepods/burstable/pod{UID}/{CID}"),
        CgroupIdentity(UID, CID, "burstable", None, "cgroupfs"),
    ),
    "v1 cgroupfs besteffort": (
        v1(f"/kubepods/besteffort/pod{UID}/{CID}"),
        CgroupIdentity(UID, CID, "besteffort", None, "cgroupfs"),
    ),
    "v1 cgroupfs guaranteed": (
        v1(f"/kubepods/pod{UID}/{CID}"),
        CgroupIdentity(UID, CID, "guaranteed", None, "cgroupfs"),
    ),
    "v1 cgroupfs cri-o": (
        v1(f"/kubepods/burstable/pod{UID}/crio-{CID}"),
        CgroupIdentity(UID, CID, "burstable", "cri-o", "cgroupfs"),
    ),
    # cgroup v1, systemd driver
    "v1 systemd containerd burstable": (
        v1(f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope"),
        CgroupIdentity(UID, CID, "burstable", "containerd", "systemd"),
    ),
    "v1 systemd cri-o besteffort": (
        v1(f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{CID}.scope"),
        CgroupIdentity(UID, CID, "besteffort", "cri-o", "systemd"),
    ),
    "v1 systemd docker guaranteed": (
        v1(f"/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope"),
        CgroupIdentity(UID, CID, "guaranteed", "docker", "systemd"),
    ),
    # cgroup v2 (unified), both drivers
    "v2 systemd containerd burstable": (
        v2(f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope"),
        CgroupIdentity(UID, CID, "burstable", "containerd", "systemd"),
    ),
    "v2 systemd cri-o guaranteed": (
        v2(f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope"),
        CgroupIdentity(UID, CID, "guaranteed", "cri-o", "systemd"),
    ),
    "v2 systemd docker besteffort": (
        v2(f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/docker-{CID}.scope"),
        CgroupIdentity(UID, CID, "besteffort", "docker", "systemd"),
    ),
    "v2 cgroupfs containerd": (
        v2(f"/kubepods/burstable/pod{UID}/{CID}"),
        CgroupIdentity(UID, CID, "burstable", None, "cgroupfs"),
    ),
    "v2 cgroupfs cri-o guaranteed": (
        v2(f"/kubepods/pod{UID}/crio-{CID}"),
        CgroupIdentity(UID, CID, "guaranteed", "cri-o", "cgroupfs"),
    ),
    # nested: kind nodes run kubelet under its own slice, Docker-in-Docker under /docker/<id>
    "v2 kind (kubelet.slice prefix)": (
        v2(
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
            f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope"
        ),
        CgroupIdentity(UID, CID, "besteffort", "containerd", "systemd"),
    ),
    "v1 docker-in-docker prefix": (
        v1(f"/docker/{PAUSE}/kubepods/burstable/pod{UID}/{CID}"),
        CgroupIdentity(UID, CID, "burstable", None, "cgroupfs"),
    ),
    # a process in a sub-cgroup of its container (systemd inside the container, nested v2 leaf)
    "v2 nested below the container": (
        v2(f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope/init.scope"),
        CgroupIdentity(UID, CID, "burstable", "containerd", "systemd"),
    ),
    # static pod: the UID is the 32-hex config hash (the mirror pod's config.mirror annotation)
    "v1 static pod hash uid": (
        v1(f"/kubepods/burstable/pod0f5b6f5d0c8e4f1b9a2c3d4e5f6a7b8c/{CID}"),
        CgroupIdentity("0f5b6f5d0c8e4f1b9a2c3d4e5f6a7b8c", CID, "burstable", None, "cgroupfs"),
    ),
    # CRI-O's conmon sits in the pod, not in the container
    "v2 cri-o conmon": (
        v2(f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-conmon-{CID}.scope"),
        CgroupIdentity(UID, None, "burstable", "cri-o", "systemd"),
    ),
    "v1 pod cgroup itself": (
        v1(f"/kubepods/burstable/pod{UID}"),
        CgroupIdentity(UID, None, "burstable", None, "cgroupfs"),
    ),
    # the reader (the node daemon) in a private cgroup namespace, cgroupfs driver: paths relative
    # to its own root, which is /kubepods/burstable/pod<daemon>/<daemon container>
    "v2 cgroupfs private namespace, same QoS as the reader": (
        v2(f"/../../pod{UID}/{CID}"),
        CgroupIdentity(UID, CID, "unknown", None, "cgroupfs"),
    ),
    "v2 cgroupfs private namespace, other QoS": (
        v2(f"/../../../besteffort/pod{UID}/crio-{CID}"),
        CgroupIdentity(UID, CID, "besteffort", "cri-o", "cgroupfs"),
    ),
    "v2 systemd private namespace": (
        v2(f"/../../kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope"),
        CgroupIdentity(UID, CID, "burstable", "containerd", "systemd"),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_runtime_and_driver_formats(name: str) -> None:
    text, expected = CASES[name]
    assert parse_cgroup_file(text) == expected


NOT_KUBERNETES = {
    "v2 user session": "0::/user.slice/user-1000.slice/session-3.scope\n",
    "v2 user app": "0::/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-code-1234.scope\n",
    "v2 system service": "0::/system.slice/nvidia-persistenced.service\n",
    "v2 docker outside kubernetes": f"0::/system.slice/docker-{CID}.scope\n",
    "v1 docker outside kubernetes": v1(f"/docker/{CID}"),
    "v2 root": "0::/\n",
    "v2 init scope": "0::/init.scope\n",
    "empty": "",
    "garbage": "not a cgroup file\n\x00\x01\n",
    "pod-like name outside kubepods": f"0::/system.slice/pod{UID}/{CID}\n",
    "pod-like name below a non-pod dir in a private namespace": f"0::/../system.slice/pod{UID}/{CID}\n",
    "pod-like name at a private namespace's root": f"0::/pod{UID}/{CID}\n",
}


@pytest.mark.parametrize("name", sorted(NOT_KUBERNETES))
def test_processes_outside_kubernetes(name: str) -> None:
    assert parse_cgroup_file(NOT_KUBERNETES[name]) is None


def test_hybrid_host_prefers_the_hierarchy_that_names_the_pod() -> None:
    # On a hybrid host the unified line can point at the runtime's service, not the pod.
    text = v1(f"/kubepods/besteffort/pod{UID}/{CID}", hybrid_unified="/system.slice/containerd.service")
    assert parse_cgroup_file(text) == CgroupIdentity(UID, CID, "besteffort", None, "cgroupfs")


def test_v1_line_with_container_wins_over_pod_level_line() -> None:
    text = f"3:cpuset:/kubepods/burstable/pod{UID}\n11:memory:/kubepods/burstable/pod{UID}/{CID}\n"
    assert parse_cgroup_file(text) == CgroupIdentity(UID, CID, "burstable", None, "cgroupfs")


def test_malformed_lines_are_skipped() -> None:
    text = "garbage line\n4:blkio\n" + v2(f"/kubepods/pod{UID}/{CID}")
    assert parse_cgroup_file(text) == CgroupIdentity(UID, CID, "guaranteed", None, "cgroupfs")


def test_short_or_odd_container_segment_is_not_taken_for_an_id() -> None:
    identity = parse_cgroup_path(f"/kubepods/burstable/pod{UID}/not-a-container")
    assert identity == CgroupIdentity(UID, None, "burstable", None, "cgroupfs")


def test_read_from_a_proc_root(tmp_path) -> None:
    os.makedirs(tmp_path / "4242")
    (tmp_path / "4242" / "cgroup").write_text(CASES["v2 systemd containerd burstable"][0])
    os.makedirs(tmp_path / "77")
    (tmp_path / "77" / "cgroup").write_text(NOT_KUBERNETES["v2 user session"])
    assert read_process_identity(str(tmp_path), 4242) == (CASES["v2 systemd containerd burstable"][1], True)
    assert read_process_identity(str(tmp_path), 77) == (None, True)
    assert read_process_identity(str(tmp_path), 99999) == (None, False)
    os.makedirs(tmp_path / "88")
    (tmp_path / "88" / "cgroup").write_text("")  # caught mid-write: not "host", read again later
    assert read_process_identity(str(tmp_path), 88) == (None, False)


def test_own_process_on_this_machine_parses_or_is_outside_kubernetes() -> None:
    # Whatever this machine is, reading the real /proc must not fail.
    identity, readable = read_process_identity("/proc", os.getpid())
    assert readable
    assert identity is None or isinstance(identity, CgroupIdentity)
