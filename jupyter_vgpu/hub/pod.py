"""Reading and editing the vGPU parts of the pod KubeSpawner is about to create.

Nothing here imports kubernetes at module import (the Hub's pod objects come from
kubernetes_asyncio, which KubeSpawner imports).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import MEMORY_UNIT_MIB, Names, Request, RequestError
from jupyter_vgpu.hub.limits import Limit
from jupyter_vgpu.hub.quantities import checked_count, checked_request, guarded, shown


def _resource_map(container: Any, field: str) -> Mapping[str, object]:
    value = getattr(getattr(container, "resources", None), field, None)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RequestError(f"container {container.name!r}: resources.{field} must be a mapping of "
                           f"resource names to quantities, got {shown(value)}")
    return value


def container_request(container: Any, names: Names) -> Request | None:
    """The container's vGPU request (None: it asks for none); RequestError when malformed."""
    limits, requests = _resource_map(container, "limits"), _resource_map(container, "requests")
    try:
        # counts checked here first so the contract only ever sees bounded values
        for resource in names.resources:
            for table in (limits, requests):
                if resource in table:
                    checked_count(table[resource], resource)
        request = guarded("its vGPU resources",
                          lambda: contract.parse_container_request(limits, requests, names))
        return None if request is None else checked_request(request.cores, request.memory_units)
    except RequestError as error:
        raise RequestError(f"container {container.name!r}: {error}") from None


def container_requests(pod: Any, names: Names) -> dict[int, Request]:
    """Container index -> vGPU request, for the containers that ask for one."""
    requests: dict[int, Request] = {}
    for index, container in enumerate(pod.spec.containers or []):
        request = container_request(container, names)
        if request is not None:
            requests[index] = request
    return requests


def set_vgpu_limits(container: Any, limits: Mapping[str, str | None]) -> None:
    """Put ``limits`` (None values: remove) on the container; extended resources live in limits."""
    resources = container.resources
    for field in ("limits", "requests"):
        current = dict(getattr(resources, field, None) or {})
        for key, value in limits.items():
            current.pop(key, None)
            if value is not None and field == "limits":
                current[key] = value
        setattr(resources, field, current or None)


def hint_env(request: Request, limit: Limit) -> dict[str, str]:
    """``VGPU_REQUESTED_*`` (what the Hub asked for) and ``VGPU_MAX_*`` (the user's ceiling)."""
    hints = {
        contract.ENV_HUB_REQUESTED_CORES: str(request.cores),
        contract.ENV_HUB_REQUESTED_MEMORY_MIB: str(request.memory_mib),
    }
    if limit.cores is not None:
        hints[contract.ENV_HUB_MAX_CORES] = str(limit.cores)
    if limit.memory_units is not None:
        hints[contract.ENV_HUB_MAX_MEMORY_MIB] = str(limit.memory_units * MEMORY_UNIT_MIB)
    return hints


def set_env(container: Any, values: Mapping[str, str]) -> None:
    """Set ``values`` as the container's env entries, replacing same-named ones."""
    from kubernetes_asyncio.client.models import V1EnvVar

    env = [e for e in (container.env or []) if _env_name(e) not in values]
    env.extend(V1EnvVar(name=name, value=value) for name, value in values.items())
    container.env = env


def _env_name(entry: Any) -> str | None:
    return entry.get("name") if isinstance(entry, Mapping) else getattr(entry, "name", None)


TOLERATION_FIELDS = ("key", "operator", "value", "effect")


def add_tolerations(pod: Any, tolerations: Sequence[Mapping[str, str]]) -> None:
    """Add each toleration (``{"key", "operator", "value", "effect"}``) the pod does not have yet."""
    from kubernetes_asyncio.client.models import V1Toleration

    present = list(pod.spec.tolerations or [])
    seen = {tuple(getattr(t, field, None) if not isinstance(t, Mapping) else t.get(field)
                  for field in TOLERATION_FIELDS) for t in present}
    for spec in tolerations:
        fields = tuple(spec.get(field) for field in TOLERATION_FIELDS)
        if fields not in seen:
            present.append(V1Toleration(**dict(zip(TOLERATION_FIELDS, fields, strict=True))))
            seen.add(fields)
    pod.spec.tolerations = present
