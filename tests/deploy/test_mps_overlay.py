"""deploy/overlays/mps against NVIDIA's MPS contract (k8s-device-plugin's mps-control-daemon):
the control daemon runs as root, and daemon, MPS servers and clients share one sized tmpfs
as /dev/shm, mounted on the host, because clients are other pods that get it by host path
in the device plugin's Allocate answer."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from deploy_support import REPO, container, env_of, find, render

OVERLAY = "overlays/mps"
DAEMON_SET = "vgpu-mps-control-daemon"
SHM_INIT = "mps-shm"
SHM_MIN_BYTES = 64 * 1024 * 1024  # NVIDIA's mount-shm: size=65536k
# The containers of the mps overlay that run as root, and why: kubelet's device-plugin
# directory belongs to root (the node daemon); mounting the tmpfs; NVIDIA's control daemon.
ROOT_CONTAINERS = {("vgpu-node", "node"), (DAEMON_SET, SHM_INIT), (DAEMON_SET, "mps-control-daemon")}


def image_user() -> list[int]:
    """uid and gid the node image runs as when a pod does not say (the last USER of plugin/Dockerfile)."""
    users = re.findall(r"^USER\s+(\S+)", (REPO / "plugin" / "Dockerfile").read_text(), re.M)
    return [int(part) for part in users[-1].split(":")]


def image_uid() -> int:
    return image_user()[0]


def image_gid() -> int:
    return image_user()[-1]


def pods(objects):
    for obj in objects:
        if obj["kind"] in ("DaemonSet", "Deployment"):
            pod = obj["spec"]["template"]["spec"]
            for c in pod.get("initContainers", []) + pod["containers"]:
                yield obj["metadata"]["name"], pod, c


def effective(pod: dict, c: dict, key: str, default=None):
    """A securityContext field as the kubelet applies it: the container's, else the pod's."""
    for context in (c.get("securityContext") or {}, pod.get("securityContext") or {}):
        if key in context:
            return context[key]
    return default


def control_daemon_pod() -> dict:
    return find(render(OVERLAY), "DaemonSet", DAEMON_SET)["spec"]["template"]["spec"]


def init_container() -> dict:
    matches = [c for c in control_daemon_pod().get("initContainers", []) if c["name"] == SHM_INIT]
    assert len(matches) == 1, f"{DAEMON_SET} has no init container {SHM_INIT} to mount the shared tmpfs"
    return matches[0]


def host_path_of(pod: dict, c: dict, container_path: str) -> tuple[str, dict]:
    """The host path behind a path in a container (through its hostPath mounts), and the mount."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in sorted(c.get("volumeMounts", []), key=lambda m: -len(m["mountPath"])):
        root = mount["mountPath"].rstrip("/")
        if container_path == root or container_path.startswith(root + "/"):
            volume = volumes[mount["name"]]
            assert "hostPath" in volume, f"{c['name']}: {container_path} is on {mount['name']}, not a host path"
            return volume["hostPath"]["path"] + container_path[len(root):], mount
    raise AssertionError(f"{c['name']}: {container_path} is on no volume")


def tmpfs_bytes(size: str) -> int:
    """A tmpfs size= option (the kernel's memparse: a number with an optional k, m or g)."""
    match = re.fullmatch(r"([1-9][0-9]*)([kKmMgG]?)", size)
    assert match, f"{size!r} is not a tmpfs size such as 512M or 2G"
    return int(match.group(1)) * 1024 ** " KMG".index(match.group(2).upper() or " ")


def client_shm_host_path(monkeypatch) -> str:
    """The host path the node daemon's Allocate answer mounts as an MPS client's /dev/shm, from
    the node daemon's own flags with the overlay's environment."""
    from vgpu_plugin.deviceplugin import enforcement, main

    node = container(render(OVERLAY), "DaemonSet", "vgpu-node", "node")
    for key in list(os.environ):
        if key.startswith("VGPU_"):
            monkeypatch.delenv(key)
    for key, value in env_of(node).items():
        if key.startswith("VGPU_") and value is not None:
            monkeypatch.setenv(key, value)
    args = main.build_parser().parse_args(node["args"][1:])
    config = enforcement.EnforcementConfig(mode="mps", mps_pipe_dir=args.mps_pipe_dir, mps_shm_dir=args.mps_shm_dir)
    (shm,) = [m for m in enforcement._mps_mounts(config) if m.container_path == enforcement.MPS_CONTAINER_SHM_DIR]
    return shm.host_path


def test_mps_control_daemon_runs_as_root():
    """NVIDIA's control daemon runs as root: privileged mode keeps the image's uid (65532), which
    can make neither the root-owned pipe directory nor MPS servers under each client's uid."""
    assert image_uid() != 0, "the node image runs as non-root by default; the manifest must say uid 0"
    pod = control_daemon_pod()
    for c in pod.get("initContainers", []) + pod["containers"]:
        assert effective(pod, c, "runAsUser", image_uid()) == 0, f"{c['name']} runs as uid {image_uid()}"
        assert effective(pod, c, "runAsNonRoot") is not True, f"{c['name']}: runAsNonRoot forbids uid 0"
        assert effective(pod, c, "runAsGroup", image_gid()) == 0, c["name"]


def test_only_the_expected_containers_of_the_mps_overlay_run_as_root():
    """uid 0 for the control daemon does not spread: every other container keeps its user."""
    root = {(name, c["name"]) for name, pod, c in pods(render(OVERLAY))
            if effective(pod, c, "runAsUser", image_uid()) == 0}
    assert root == ROOT_CONTAINERS


def test_shared_shm_is_a_sized_tmpfs_on_the_host_path_clients_get(monkeypatch):
    """One tmpfs for daemon, servers and clients, as NVIDIA's: an init container mounts it on
    the host (Bidirectional propagation) at the host path the node daemon gives clients; the
    control daemon, started after it, mounts that host path as its /dev/shm."""
    pod = control_daemon_pod()
    init = init_container()
    daemon = container(render(OVERLAY), "DaemonSet", DAEMON_SET, "mps-control-daemon")
    env = env_of(init)
    tmpfs_host_path, mount = host_path_of(pod, init, env["MPS_SHM_DIR"])
    assert mount["mountPath"] != env["MPS_SHM_DIR"], "the tmpfs is mounted below the volume, on the host's tree"
    assert mount.get("mountPropagation") == "Bidirectional", "without it the tmpfs stays in the init container"
    assert init["securityContext"]["privileged"] is True, "Bidirectional propagation and mount(2) need it"
    assert tmpfs_bytes(env["MPS_SHM_SIZE"]) >= SHM_MIN_BYTES
    # the daemon's /dev/shm and every client's /dev/shm are that tmpfs
    daemon_shm, _ = host_path_of(pod, daemon, env_of(daemon)["VGPU_MPS_SHM_DIR"])
    assert daemon_shm == tmpfs_host_path
    assert client_shm_host_path(monkeypatch) == tmpfs_host_path
    # a host path any pod can bind, not a pod's own emptyDir
    assert tmpfs_host_path.startswith("/run/") and "kubelet/pods" not in tmpfs_host_path


def run_init_script(tmp_path: Path, mounted: bool) -> tuple[Path, list[str]]:
    """The init container's script with stand-ins for mount and mountpoint: the mount calls it makes."""
    init = init_container()
    assert init["command"] == ["/bin/sh", "-c"], init["command"]
    (script,) = init["args"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "mount").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {calls}\n')
    (bin_dir / "mountpoint").write_text(f"#!/bin/sh\nexit {0 if mounted else 1}\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    shm = tmp_path / "mps" / "shm"
    env = {**env_of(init), "MPS_SHM_DIR": str(shm), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    subprocess.run(["/bin/sh", "-c", script], env=env, check=True, timeout=30)
    return shm, calls.read_text().splitlines()


def test_init_script_mounts_a_sized_tmpfs(tmp_path):
    shm, argv = run_init_script(tmp_path, mounted=False)
    size = env_of(init_container())["MPS_SHM_SIZE"]
    assert shm.is_dir()
    assert argv[:2] == ["-t", "tmpfs"] and argv[-1] == str(shm)
    options = argv[argv.index("-o") + 1].split(",")
    assert f"size={size}" in options and "mode=1777" in options
    assert {"nosuid", "nodev", "noexec"} <= set(options)


def test_init_script_keeps_a_mounted_tmpfs_and_resizes_it(tmp_path):
    """A replaced pod keeps the tmpfs running clients hold (NVIDIA's unmounts it, leaving them
    on a detached one the new MPS servers do not see); only its size follows the manifest."""
    shm, argv = run_init_script(tmp_path, mounted=True)
    size = env_of(init_container())["MPS_SHM_SIZE"]
    assert argv == ["-o", f"remount,size={size}", str(shm)]


@pytest.mark.parametrize("size, expected", [("64M", SHM_MIN_BYTES), ("65536k", SHM_MIN_BYTES), ("1G", 1 << 30)])
def test_tmpfs_size_reads_as_the_kernel_does(size, expected):
    assert tmpfs_bytes(size) == expected
