"""What the checks look at: roots, the configured backend, the notebook user, the API."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_vgpu.core.contract import DEFAULT_NAMES, Names

DEFAULT_NAMESPACE = "vgpu-system"


@dataclass
class NodeSetup:
    """One node as the checks see it. Paths are as visible where the doctor runs."""

    gpus: Any  # a jupyter_vgpu.gpu.GPUBackend
    node: str | None = None
    plugin_dir: str = "/var/lib/kubelet/device-plugins"
    enforcement: str = "hami-core"
    hami_root: str = "/usr/local/vgpu"
    hami_lock_dir: str = "/tmp/vgpulock"
    mps_pipe_dir: str = "/tmp/nvidia-mps"
    mps_shm_dir: str | None = None
    proc_root: str = "/proc"
    sysfs_root: str = "/sys"
    dev_root: str = "/dev"
    host_root: str = "/"  # for the container runtime's configuration
    toolkit_config: str | None = None  # the NVIDIA Container Toolkit's config.toml on the host; None: the usual places
    cdi: bool = False  # the device plugin names cards as CDI devices (its --cdi)
    notebook_uid: int = 1000  # the docker-stacks user (jovyan:users)
    notebook_gid: int = 100
    runtime_class: str | None = None  # override; else the node daemon pod's own
    namespace: str = DEFAULT_NAMESPACE
    names: Names = DEFAULT_NAMES
    api: Any = None  # kubernetes.client.ApiClient, or None to skip the cluster checks
    mig_mode: Callable[[int], bool | None] | None = None  # card index -> MIG on? (None: unknown)
    facts: dict[str, Any] = field(default_factory=dict)  # shared between checks (own pod, ...)

    def host(self, path: str) -> str:
        return os.path.join(self.host_root, path.lstrip("/"))


def usable_by(path: str, uid: int, gid: int, need: str) -> bool:
    """Whether ``uid``/``gid`` may do ``need`` ("r", "w", "x" letters) on ``path`` by its mode bits.

    Judged from the inode, not by trying: the doctor runs as root, which may do anything.
    Owner bits apply to the owner, group bits to the group, other bits to everyone else.
    """
    info = os.stat(path)
    if uid == 0:
        return True
    if info.st_uid == uid:
        shift = 6
    elif info.st_gid == gid:
        shift = 3
    else:
        shift = 0
    bits = {"r": stat.S_IROTH, "w": stat.S_IWOTH, "x": stat.S_IXOTH}
    return all(info.st_mode & (bits[letter] << shift) for letter in need)


def mode_text(path: str) -> str:
    info = os.stat(path)
    return f"{stat.S_IMODE(info.st_mode):04o} uid {info.st_uid} gid {info.st_gid}"
