"""What a vGPU container is given: visible cards, the enforcement backend's contract, info env.

The device plugin only sets the contract; the enforcing library (HAMi-core's
``libvgpu.so``, the NVIDIA MPS daemon) is installed on the node by the cluster admin.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from jupyter_vgpu.core import contract as c

from . import api_pb2

if TYPE_CHECKING:
    from jupyter_vgpu.core.contract import ContainerAllocation
    from jupyter_vgpu.core.inventory import Card

log = logging.getLogger(__name__)

HAMI_CONTAINER_ROOT = "/usr/local/vgpu"
HAMI_LOCK_DIR = "/tmp/vgpulock"
MPS_CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"


@dataclass(frozen=True)
class EnforcementConfig:
    mode: str = "hami-core"
    hami_root: str = "/usr/local/vgpu"          # host dir with libvgpu.so and ld.so.preload
    mps_pipe_dir: str = "/tmp/nvidia-mps"       # host dir of the MPS control daemon's pipes
    device_specs: bool = False                  # pass /dev/nvidia* as DeviceSpecs (no NVIDIA runtime hook)
    cdi: bool = False                           # name the cards as CDI devices (nvidia.com/gpu=<uuid>)
    dev_root: str = "/dev"

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
        envs[c.ENV_XLA_MEM_FRACTION] = f"{min(1.0, memory_mib[0] / card_mib):.3f}" if card_mib else "0"
        envs[c.ENV_XLA_PREALLOCATE] = "false"
        envs[c.ENV_CUPY_MEMORY_LIMIT] = str(memory_mib[0] * 1024 * 1024)
        envs[c.ENV_TF_FORCE_GROWTH] = "true"
        if config.mode == "hami-core":
            envs.update(_hami_env(shares, memory_mib, allocation.cores))
            mounts += _hami_mounts(config, identity)
        elif config.mode == "mps":
            envs[c.ENV_MPS_PIPE_DIRECTORY] = MPS_CONTAINER_PIPE_DIR
            envs[c.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] = str(allocation.cores)
            envs[c.ENV_MPS_PINNED_MEMORY_LIMIT] = ",".join(f"{i}={mib}M" for i, mib in enumerate(memory_mib))
            mounts.append(api_pb2.Mount(container_path=MPS_CONTAINER_PIPE_DIR, host_path=config.mps_pipe_dir,
                                        read_only=False))
    if identity.pod_uid:  # a hint for display; the read token is what identifies the container
        envs.update({c.ENV_POD_NAME: identity.pod, c.ENV_POD_NAMESPACE: identity.namespace,
                     c.ENV_POD_UID: identity.pod_uid})
    response = api_pb2.ContainerAllocateResponse(envs=envs, mounts=mounts)
    if config.device_specs:
        response.devices.extend(_device_specs(config, shares, cards))
    if config.cdi:
        response.cdi_devices.extend(api_pb2.CDIDevice(name=f"nvidia.com/gpu={s.uuid}") for s in shares)
    return response


def _hami_env(shares: list, memory_mib: list[int], cores: int) -> dict[str, str]:
    env = {f"{c.ENV_HAMI_MEMORY_LIMIT_PREFIX}{i}": f"{mib}m" for i, mib in enumerate(memory_mib)}
    env[c.ENV_HAMI_SM_LIMIT] = str(cores)
    env[c.ENV_HAMI_SHARED_CACHE] = f"{HAMI_CONTAINER_ROOT}/cache/vgpu.cache"
    return env


def _hami_mounts(config: EnforcementConfig, identity: Identity) -> list[api_pb2.Mount]:
    # per-container shared-region directory on the host, as HAMi does, so restarts of the
    # container keep their accounting and other containers never see it
    # (named by the allocation id: the pod may not be known for sure, and mountinfo shows the path)
    cache_dir = os.path.join(config.hami_root, "containers",
                             identity.allocation_id or f"{identity.pod_uid}_{identity.container}")
    try:
        os.makedirs(cache_dir, mode=0o777, exist_ok=True)
        os.makedirs(HAMI_LOCK_DIR, mode=0o777, exist_ok=True)
    except OSError as error:  # the mount will fail visibly in the runtime; say why here
        log.warning("cannot prepare HAMi-core directories (%s): %s", cache_dir, error)
    return [
        api_pb2.Mount(container_path=f"{HAMI_CONTAINER_ROOT}/libvgpu.so",
                      host_path=os.path.join(config.hami_root, "libvgpu.so"), read_only=True),
        api_pb2.Mount(container_path="/etc/ld.so.preload",
                      host_path=os.path.join(config.hami_root, "ld.so.preload"), read_only=True),
        api_pb2.Mount(container_path=f"{HAMI_CONTAINER_ROOT}/cache", host_path=cache_dir, read_only=False),
        api_pb2.Mount(container_path=HAMI_LOCK_DIR, host_path=HAMI_LOCK_DIR, read_only=False),
    ]


def _device_specs(config: EnforcementConfig, shares: list, cards: Mapping[int, Card]) -> list[api_pb2.DeviceSpec]:
    paths = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
    for share in shares:
        minor = cards[share.index].minor
        paths.append(f"nvidia{minor if minor is not None else share.index}")
    return [
        api_pb2.DeviceSpec(container_path=f"/dev/{p}", host_path=os.path.join(config.dev_root, p), permissions="rw")
        for p in paths
    ]
