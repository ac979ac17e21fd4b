"""The protobuf side of Allocate: the answer a container gets, and the env of an answer kubelet recorded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from . import api_pb2
from .enforcement import EnforcementConfig, Identity, container_response

if TYPE_CHECKING:
    from jupyter_vgpu.core.inventory import Card

    from .served import Served


def core_answer(config: EnforcementConfig, served: Served, cards: Mapping[int, Card], *, node: str,
                allocation_id: str, certain: bool, metrics_url: str,
                token: str) -> api_pb2.ContainerAllocateResponse:
    """The vcuda-core answer: the container's whole env, mounts and devices. It names its pod only
    when ``certain``: a guess could show one user another user's pod."""
    uid, index = served.key
    identity = Identity(node=node, namespace=served.namespace if certain else "",
                        pod=served.pod if certain else "",
                        pod_uid=(served.identity_uid or uid) if certain else "",
                        container=served.container, container_index=index, allocation_id=allocation_id)
    return container_response(config, served.allocation, cards, identity, metrics_url=metrics_url, token=token)


def memory_answer() -> api_pb2.ContainerAllocateResponse:
    """vcuda-memory's answer is empty, so the two answers kubelet merges can never conflict."""
    return api_pb2.ContainerAllocateResponse()


def answer_env(alloc_response: bytes) -> dict[str, str]:
    """The env of an answer kubelet recorded in its checkpoint; {} when it is not one we can read."""
    if not alloc_response:
        return {}
    try:
        return dict(api_pb2.ContainerAllocateResponse.FromString(alloc_response).envs)
    except Exception:  # noqa: BLE001 - a foreign or corrupt record: the ledger's memory is used instead
        return {}
