"""What a vGPU container is given: visible cards, the enforcement backend's contract, info env.

The device plugin only sets the contract; the enforcing library (HAMi-core's
``libvgpu.so``, the NVIDIA MPS daemon) is installed on the node by the cluster admin.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jupyter_vgpu.core import contract as c

from . import api_pb2

if TYPE_CHECKING:
    from jupyter_vgpu.core.contract import ContainerAllocation
    from jupyter_vgpu.core.inventory import Card
    from jupyter_vgpu.core.mig import MigSlice

log = logging.getLogger(__name__)

HAMI_CONTAINER_ROOT = "/usr/local/vgpu"
HAMI_LOCK_DIR = "/tmp/vgpulock"
HAMI_CONTAINERS = "containers"
MPS_CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
MPS_CONTAINER_SHM_DIR = "/dev/shm"
# device nodes every CUDA container needs; nvidia-uvm-tools (profilers) is optional upstream
# and only passed where the host has it, or container creation fails
REQUIRED_DEVICE_NODES = ("nvidiactl", "nvidia-uvm")
OPTIONAL_DEVICE_NODES = ("nvidia-uvm-tools",)


@dataclass(frozen=True)
class EnforcementConfig:
    mode: str = "hami-core"
    hami_root: str = "/usr/local/vgpu"          # host dir with libvgpu.so and ld.so.preload
    hami_lock_dir: str = HAMI_LOCK_DIR          # host dir of HAMi-core's node-wide lock (mounted at /tmp/vgpulock)
    mps_pipe_dir: str = "/tmp/nvidia-mps"       # host dir of the MPS control daemon's pipes
    mps_shm_dir: str = "/run/nvidia-mps/shm"    # host tmpfs the MPS control daemon uses as its /dev/shm
    device_specs: bool = False                  # pass /dev/nvidia* as DeviceSpecs (no NVIDIA runtime hook)
    cdi: bool = False                           # name the cards as CDI devices (nvidia.com/gpu=<uuid>)
    dev_root: str = "/dev"                      # the host's /dev as this daemon sees it (to find optional nodes)

    def __post_init__(self) -> None:
        if self.mode not in c.ENFORCEMENT_BACKENDS:
            raise ValueError(f"enforcement {self.mode!r} is not one of {', '.join(c.ENFORCEMENT_BACKENDS)}")


@dataclass(frozen=True)
class Identity:
    """Who the answer is for; namespace, pod and pod_uid are "" when that is not certain."""

    node: str
    namespace: str
    pod: str
    pod_uid: str
    container: str
    container_index: int
    allocation_id: str = ""


def container_response(
    config: EnforcementConfig,
    allocation: ContainerAllocation,
    cards: Mapping[int, Card],
    identity: Identity,
    *,
    metrics_url: str,
    token: str,
) -> api_pb2.ContainerAllocateResponse:
    """The full answer for one container; a pure function of its inputs, so it can be rebuilt."""
    on_slice = slice_of(allocation, cards)
    if on_slice is not None:
        return _slice_response(config, allocation, cards, identity, on_slice, metrics_url=metrics_url, token=token)
    shares = sorted(allocation.cards, key=lambda s: s.index)
    memory_mib = [s.memory_units * c.MEMORY_UNIT_MIB for s in shares]
    is_share = allocation.cores < c.CORES_PER_CARD
    envs = {
        c.ENV_NVIDIA_VISIBLE_DEVICES: ",".join(s.uuid for s in shares),
        c.ENV_CORES: str(allocation.cores),
        c.ENV_MEMORY_MIB: str(sum(memory_mib)),
        c.ENV_DEVICE_UUIDS: ",".join(s.uuid for s in shares),
        c.ENV_DEVICE_INDICES: c.card_ids_env([s.index for s in shares]),
        c.ENV_DEVICE_MODEL: ",".join(sorted({cards[s.index].model for s in shares})),
        c.ENV_NODE: identity.node,
        c.ENV_CONTAINER: identity.container,
        c.ENV_METRICS_URL: metrics_url,
        c.ENV_TOKEN: token,
        c.ENV_ENFORCEMENT: config.mode,
    }
    mounts: list[api_pb2.Mount] = []
    if is_share:
        share = shares[0]
        card_mib = cards[share.index].memory_mib
        # framework guard rails, read at process start whatever the enforcement backend
        envs[c.ENV_XLA_MEM_FRACTION] = c.format_fraction(c.memory_fraction(memory_mib[0], card_mib))
        envs[c.ENV_XLA_PREALLOCATE] = "false"
        envs[c.ENV_CUPY_MEMORY_LIMIT] = str(memory_mib[0] * 1024 * 1024)
        envs[c.ENV_TF_FORCE_GROWTH] = "true"
        if config.mode == "hami-core":
            envs.update(_hami_env(shares, memory_mib, allocation.cores))
            mounts += _hami_mounts(config, identity)
        elif config.mode == "mps":
            envs[c.ENV_MPS_PIPE_DIRECTORY] = MPS_CONTAINER_PIPE_DIR
            # below the control daemon's server-side ceiling the client may only lower these
            envs[c.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] = str(allocation.cores)
            envs[c.ENV_MPS_PINNED_MEMORY_LIMIT] = ",".join(f"{i}={mib}M" for i, mib in enumerate(memory_mib))
            mounts += _mps_mounts(config)
    if identity.pod_uid:  # a hint for display; the read token is what identifies the container
        envs.update({c.ENV_POD_NAME: identity.pod, c.ENV_POD_NAMESPACE: identity.namespace,
                     c.ENV_POD_UID: identity.pod_uid})
    response = api_pb2.ContainerAllocateResponse(envs=envs, mounts=mounts)
    if config.device_specs:
        response.devices.extend(_device_specs(config, shares, cards))
    if config.cdi:
        response.cdi_devices.extend(api_pb2.CDIDevice(name=f"nvidia.com/gpu={s.uuid}") for s in shares)
    return response


def slice_of(allocation: ContainerAllocation, cards: Mapping[int, Card]) -> MigSlice | None:
    """The MIG slice a container holds (its one share names it and the card publishes it), or None."""
    for share in allocation.cards:
        if share.mig_device and share.index in cards:
            return next((s for s in cards[share.index].slices if s.uuid == share.mig_device), None)
    return None


def _slice_response(config: EnforcementConfig, allocation: ContainerAllocation, cards: Mapping[int, Card],
                    identity: Identity, on_slice: MigSlice, *, metrics_url: str,
                    token: str) -> api_pb2.ContainerAllocateResponse:
    """A container on a MIG slice: that MIG device only, its real size, and no HAMi-core or MPS limits
    (the hardware isolates a slice's compute and memory)."""
    share = allocation.cards[0]
    card = cards[share.index]
    envs = {
        c.ENV_NVIDIA_VISIBLE_DEVICES: on_slice.uuid,
        c.ENV_CORES: str(on_slice.cores),
        c.ENV_MEMORY_MIB: str(on_slice.memory_mib),
        c.ENV_DEVICE_UUIDS: on_slice.uuid,
        c.ENV_DEVICE_INDICES: c.card_ids_env([share.index]),
        c.ENV_DEVICE_MODEL: card.model,
        c.ENV_NODE: identity.node,
        c.ENV_CONTAINER: identity.container,
        c.ENV_METRICS_URL: metrics_url,
        c.ENV_TOKEN: token,
        c.ENV_ENFORCEMENT: c.ENFORCEMENT_MIG,
        c.ENV_MIG_PROFILE: on_slice.profile,
        # the whole device is the slice: frameworks may use all of it
        c.ENV_XLA_PREALLOCATE: "false",
        c.ENV_TF_FORCE_GROWTH: "true",
    }
    if identity.pod_uid:
        envs.update({c.ENV_POD_NAME: identity.pod, c.ENV_POD_NAMESPACE: identity.namespace,
                     c.ENV_POD_UID: identity.pod_uid})
    response = api_pb2.ContainerAllocateResponse(envs=envs)
    if config.device_specs:  # the parent's device node; the runtime hook adds the MIG capability nodes
        response.devices.extend(_device_specs(config, [share], cards))
    if config.cdi:
        response.cdi_devices.append(api_pb2.CDIDevice(name=f"nvidia.com/gpu={on_slice.uuid}"))
    return response


def _hami_env(shares: list, memory_mib: list[int], cores: int) -> dict[str, str]:
    env = {f"{c.ENV_HAMI_MEMORY_LIMIT_PREFIX}{i}": f"{mib}m" for i, mib in enumerate(memory_mib)}
    env[c.ENV_HAMI_SM_LIMIT] = str(cores)
    env[c.ENV_HAMI_SHARED_CACHE] = f"{HAMI_CONTAINER_ROOT}/cache/vgpu.cache"
    return env


def hami_cache_dir(config: EnforcementConfig, identity: Identity) -> str:
    """The host directory of one container's HAMi-core shared region (named by its allocation id:
    the pod may not be known for sure, and mountinfo shows the path)."""
    name = identity.allocation_id or f"{identity.pod_uid}_{identity.container}"
    return os.path.join(config.hami_root, HAMI_CONTAINERS, name)


def _hami_mounts(config: EnforcementConfig, identity: Identity) -> list[api_pb2.Mount]:
    # per-container shared-region directory on the host, as HAMi does, so restarts of the
    # container keep their accounting and other containers never see it
    cache_dir = hami_cache_dir(config, identity)
    try:
        prepare_hami_dirs(config, cache_dir)
    except OSError as error:  # the mount will fail visibly in the runtime; say why here
        log.warning("cannot prepare HAMi-core directories (%s): %s", cache_dir, error)
    return [
        api_pb2.Mount(container_path=f"{HAMI_CONTAINER_ROOT}/libvgpu.so",
                      host_path=os.path.join(config.hami_root, "libvgpu.so"), read_only=True),
        api_pb2.Mount(container_path="/etc/ld.so.preload",
                      host_path=os.path.join(config.hami_root, "ld.so.preload"), read_only=True),
        api_pb2.Mount(container_path=f"{HAMI_CONTAINER_ROOT}/cache", host_path=cache_dir, read_only=False),
        api_pb2.Mount(container_path=HAMI_LOCK_DIR, host_path=config.hami_lock_dir, read_only=False),
    ]


def prepare_hami_dirs(config: EnforcementConfig, cache_dir: str) -> None:
    """The container's cache directory, writable by any uid (the notebook's libvgpu.so creates its
    shared-region file there), and the node-wide lock directory.

    Modes are set with chmod after mkdir, as HAMi's plugin does: mkdir's mode is cut by the umask,
    and a 0755 root-owned directory makes libvgpu.so in a non-root notebook exit.
    The lock directory stays one per node on purpose: HAMi-core serialises every container's
    host-PID discovery through it, and per-container lock directories would let two containers
    starting at once take each other's PID. It is made like /tmp: owned by the daemon (root),
    sticky, so no tenant can delete or replace another's lock file, and never through a symlink.
    """
    os.makedirs(os.path.dirname(cache_dir), exist_ok=True)
    try:
        os.mkdir(cache_dir)
    except FileExistsError:
        pass
    _chmod_dir_nofollow(cache_dir, 0o777)
    try:
        os.mkdir(config.hami_lock_dir)
    except FileExistsError:
        pass
    _chmod_dir_nofollow(config.hami_lock_dir, 0o1777, owner=os.geteuid())


def _chmod_dir_nofollow(path: str, mode: int, owner: int | None = None) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        info = os.fstat(fd)
        if owner is not None and info.st_uid != owner:
            raise PermissionError(f"{path} is owned by uid {info.st_uid}, not {owner}; refusing to use it")
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def remove_stale_hami_dirs(config: EnforcementConfig, live: Iterable[str], *, min_age: float,
                           now: float) -> list[str]:
    """Remove the per-container cache directories no live container uses; the names removed.

    ``live`` holds the host paths containers still mount (the Allocate answers kept in kubelet's
    checkpoint). A directory younger than ``min_age`` seconds is kept: kubelet writes its
    checkpoint only after Allocate, so a brand-new answer's directory is not yet listed there.
    """
    root = os.path.normpath(os.path.join(config.hami_root, HAMI_CONTAINERS))
    keep = {os.path.normpath(path) for path in live}
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    removed = []
    for name in sorted(names):
        path = os.path.join(root, name)
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(info.st_mode) or path in keep or now - info.st_mtime < min_age:
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            removed.append(name)
    if removed:
        log.info("removed %d HAMi-core cache director%s of containers that are gone: %s", len(removed),
                 "y" if len(removed) == 1 else "ies", ", ".join(removed))
    return removed


def mount_sources(responses: Iterable[bytes]) -> set[str]:
    """Host paths mounted by serialized ContainerAllocateResponses (kubelet's checkpoint keeps them)."""
    paths = set()
    for raw in responses:
        if not raw:
            continue
        response = api_pb2.ContainerAllocateResponse()
        try:
            response.ParseFromString(raw)
        except Exception as error:  # protobuf's DecodeError; a garbled entry keeps nothing alive
            log.warning("unreadable Allocate answer in kubelet's checkpoint: %s", error)
            continue
        paths.update(os.path.normpath(m.host_path) for m in response.mounts)
    return paths


def _mps_mounts(config: EnforcementConfig) -> list[api_pb2.Mount]:
    # the pipe directory is read-only for clients: they connect to its sockets and FIFOs, which a
    # read-only bind mount allows, but cannot plant or remove files other tenants use. The
    # daemon's shm tmpfs becomes the client's /dev/shm, as NVIDIA's MPS integration does: the
    # daemon, its server and every client must share it.
    return [
        api_pb2.Mount(container_path=MPS_CONTAINER_PIPE_DIR, host_path=config.mps_pipe_dir, read_only=True),
        api_pb2.Mount(container_path=MPS_CONTAINER_SHM_DIR, host_path=config.mps_shm_dir, read_only=False),
    ]


def _device_specs(config: EnforcementConfig, shares: list, cards: Mapping[int, Card]) -> list[api_pb2.DeviceSpec]:
    paths = list(REQUIRED_DEVICE_NODES)
    paths += [p for p in OPTIONAL_DEVICE_NODES if os.path.exists(os.path.join(config.dev_root, p))]
    for share in shares:
        minor = cards[share.index].minor
        paths.append(f"nvidia{minor if minor is not None else share.index}")
    return [
        api_pb2.DeviceSpec(container_path=f"/dev/{p}", host_path=f"/dev/{p}", permissions="rw") for p in paths
    ]
