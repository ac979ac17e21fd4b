"""Per-user and per-group vGPU ceilings, held against everything a user's servers ask for.

A ceiling applies to the sum over the user's servers: with named servers, a second server
gets only what the first leaves. The server being started (or restarted) counts its new
request; the others count what they hold while they are running, starting or stopping
(JupyterHub's ``Spawner.active``): the caller says what that is (VGPUHub: what the server's
pod was checked with, else what its user_options ask for as KubeSpawner resolves them).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jupyter_vgpu.core.contract import (
    CORES_PER_CARD,
    MEMORY_UNIT_MIB,
    Request,
    RequestError,
    format_mib,
)
from jupyter_vgpu.hub.quantities import checked_count, checked_memory_size
from jupyter_vgpu.hub.shares import describe_request


@dataclass(frozen=True)
class Usage:
    """What some of a user's servers hold together: summed cores and memory units, and what holds them."""

    cores: int = 0
    memory_units: int = 0
    holders: tuple[str, ...] = ()

    def plus(self, request: Request | Usage, holder: str) -> Usage:
        return Usage(self.cores + request.cores, self.memory_units + request.memory_units, (*self.holders, holder))

    def describe(self) -> str:
        parts = [f"{self.cores / CORES_PER_CARD:g} GPU{'s' if self.cores > CORES_PER_CARD else ''} of compute"
                 if self.cores >= CORES_PER_CARD else f"{self.cores} % of one GPU"]
        if self.memory_units:
            parts.append(f"{format_mib(self.memory_units * MEMORY_UNIT_MIB)} of GPU memory")
        return " and ".join(parts)


@dataclass(frozen=True)
class Limit:
    """A ceiling on what one user's servers hold together: cores (100 per whole card) and memory
    units; None is no ceiling.

    A whole-card request that does not declare memory is held to the cores ceiling only (its
    memory is whatever the card has)."""

    cores: int | None = None
    memory_units: int | None = None
    source: str = "the default limit"

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None, source: str) -> Limit:
        if spec is None:
            return cls(None, None, source)
        if not isinstance(spec, Mapping):
            raise ValueError(f"{source}: expected {{'cores': 50, 'memory': '20GiB'}}, got {spec!r}")
        unknown = set(spec) - {"cores", "memory"}
        if unknown:
            raise ValueError(f"{source}: unknown keys {sorted(unknown)} (use 'cores' and 'memory')")
        try:
            cores = None if spec.get("cores") is None else checked_count(spec["cores"], "cores")
            memory = spec.get("memory")
            units = None if memory is None else checked_memory_size(memory)
        except RequestError as error:
            raise ValueError(f"{source}: {error}") from None
        return cls(cores, units, source)

    def allows(self, request: Request | Usage) -> bool:
        if self.cores is not None and request.cores > self.cores:
            return False
        return self.memory_units is None or request.memory_units <= self.memory_units

    def check(self, request: Request, others: Usage | None = None) -> None:
        """RequestError unless ``request`` fits, on top of what the user's other servers hold."""
        others = others or Usage()
        if self.allows(others.plus(request, "")):
            return
        if not others.holders:
            raise RequestError(
                f"{describe_request(request)} is more than {self.source} allows ({self.describe()}); "
                f"ask for less or ask your hub admin to raise the limit"
            )
        raise RequestError(
            f"{describe_request(request)} on top of what your servers already hold ({others.describe()}: "
            f"{', '.join(others.holders)}) is more than {self.source} allows ({self.describe()}) for all your servers "
            f"together; stop a server, ask for less, or ask your hub admin to raise the limit"
        )

    def describe(self) -> str:
        parts = []
        if self.cores is not None:
            whole, rest = divmod(self.cores, CORES_PER_CARD)
            plural = "s" if whole > 1 else ""
            parts.append(f"{self.cores} % of one GPU" if not whole else
                         f"{whole} whole GPU{plural}" if not rest else f"{self.cores / CORES_PER_CARD:g} GPUs of compute")
        if self.memory_units is not None:
            parts.append(f"{format_mib(self.memory_units * MEMORY_UNIT_MIB)} of GPU memory")
        return " and ".join(parts) or "no limit"

    def merged(self, other: Limit) -> Limit:
        """The more generous of two limits, dimension by dimension (None is unlimited)."""
        def pick(a: int | None, b: int | None) -> int | None:
            return None if a is None or b is None else max(a, b)

        return Limit(pick(self.cores, other.cores), pick(self.memory_units, other.memory_units), f"{self.source} or {other.source}")


def limit_for(user: Any, user_limits: Mapping[str, Any], group_limits: Mapping[str, Any],
              default_limit: Mapping[str, Any] | None) -> Limit:
    """The user's own entry, else the most generous of their groups', else the default."""
    name = getattr(user, "name", None)
    if isinstance(name, str) and name in user_limits:
        return Limit.from_spec(user_limits[name], f"user {name}'s limit")
    groups = sorted(g.name if hasattr(g, "name") else str(g) for g in (getattr(user, "groups", None) or []))
    limit: Limit | None = None
    for group in groups:
        if group in group_limits:
            this = Limit.from_spec(group_limits[group], f"group {group}'s limit")
            limit = this if limit is None else limit.merged(this)
    if limit is not None:
        return limit
    return Limit.from_spec(default_limit, "the default limit")


async def held_by_other_servers(user: Any, server_name: str,
                                holds: Callable[[Any], Awaitable[Request | Usage | None]]) -> Usage:
    """What the user's other active servers hold (JupyterHub's ``User.spawners``)."""
    usage = Usage()
    spawners: Mapping[str, Any] = getattr(user, "spawners", None) or {}
    for name, spawner in list(spawners.items()):  # a copy: the Hub adds spawners as users start them
        if name == server_name or not spawner.active:
            continue
        held = await holds(spawner)
        if held is not None and (held.cores or held.memory_units):
            usage = usage.plus(held, f"server {name!r}" if name else "the default server")
    return usage
