"""The per-pod JSON API the notebook reads (``/api/v1/...``, documented in docs/metrics-api.yaml).

Every call names its caller with the per-allocation read token the device plugin put in
the container (``Authorization: Bearer $VGPU_TOKEN``). The token is an HMAC over a random
allocation id; the caller is the container whose allocation record holds that id (the
device plugin writes it there from kubelet's checkpoint, so it is the container that
really holds the token). The pod named in the container's ``VGPU_POD_*`` env plays no
part: it can name another pod after out-of-order admission. A caller sees its own
allocation and usage; other pods appear only as anonymous counts and totals per card.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tornado.web

from jupyter_vgpu.core.contract import CORES_PER_CARD, ENFORCEMENT_MIG, CardShare
from jupyter_vgpu.core.inventory import Card
from jupyter_vgpu.core.mig import MigSlice

from .podmap import PodEntry, held_memory_mib
from .sampler import ContainerKey, Sampler, Snapshot

log = logging.getLogger(__name__)

DEFAULT_HISTORY_SECONDS = 600.0


@dataclass(frozen=True)
class Caller:
    pod: PodEntry
    container_index: int

    @property
    def key(self) -> ContainerKey:
        return ContainerKey(self.pod.uid, self.container_index)


@dataclass
class ApiContext:
    sampler: Sampler
    token_minter: Any
    """vgpu_plugin.tokens.TokenMinter (verify(token) -> allocation id | None)."""
    enforcement: str
    require_token: bool = True
    clock: Callable[[], float] = time.time


class ApiError(tornado.web.HTTPError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, reason=None, log_message=message.replace("%", "%%"))
        self.message = message


def _round(value: float) -> float:
    return round(value, 2)


# --- identification ---------------------------------------------------------------------


def identify(context: ApiContext, authorization: str | None, query: dict[str, str]) -> Caller:
    """The caller's pod and container, or ApiError 401/403/404 saying nothing about others."""
    token = None
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise ApiError(401, "use 'Authorization: Bearer <token>' with the VGPU_TOKEN of your container")
        token = value.strip()
    if token is None and not context.require_token and query.get("pod"):
        return _identify_by_name(context, query)
    if token is None:
        raise ApiError(401, "missing token: send 'Authorization: Bearer <token>' with your container's VGPU_TOKEN")
    allocation_id = context.token_minter.verify(token)
    if allocation_id is None:
        raise ApiError(403, "the token is not valid on this node")
    found = context.sampler.find_allocation(allocation_id)
    if found is None:
        raise ApiError(403, "no container on this node holds this token's allocation: its pod is gone, "
                            "or its admission is still being confirmed (try again in a few seconds)")
    pod, index = found
    return _with_allocation(pod, index)


def _identify_by_name(context: ApiContext, query: dict[str, str]) -> Caller:
    """Token-less lookup by ``?pod=<namespace>/<name>&container=<name or index>`` (only when
    the node runs with tokens turned off, for debugging)."""
    namespace, _, name = query["pod"].partition("/")
    container = query.get("container", "0")
    for pod in context.sampler.snapshot().pods.pods():
        if pod.namespace == namespace and pod.name == name:
            index = int(container) if container.isdecimal() and len(container) <= 9 else (
                pod.container_names.index(container) if container in pod.container_names else -1)
            return _with_allocation(pod, index)
    raise ApiError(404, f"no pod {query['pod']} on this node")


def _with_allocation(pod: PodEntry, index: int) -> Caller:
    if pod.allocation is None or pod.allocation.container(index) is None:
        raise ApiError(404, "no vGPU allocation is recorded for this container")
    return Caller(pod, index)


# --- views ------------------------------------------------------------------------------------


def allocation_view(snapshot: Snapshot, caller: Caller, enforcement: str) -> dict[str, Any]:
    assert caller.pod.allocation is not None
    container = caller.pod.allocation.container(caller.container_index)
    assert container is not None
    cards = []
    for share in container.cards:
        view = snapshot.card(share.index)
        card = view.card if view else None
        held = _held_slice(share, card)
        if held is not None:  # the whole slice is the container's: its real size
            enforcement = ENFORCEMENT_MIG
            cards.append({"index": share.index, "uuid": held.uuid, "model": card.model if card else None,
                          "cores": held.cores, "memoryMib": held.memory_mib, "memoryTotalMib": held.memory_mib,
                          "migProfile": held.profile})
            continue
        cards.append({
            "index": share.index,
            "uuid": share.uuid or (card.uuid if card else ""),
            "model": card.model if card else None,
            "cores": share.cores,
            "memoryMib": held_memory_mib(share, card),
            "memoryTotalMib": card.memory_mib if card else None,
        })
    return {
        "node": snapshot.node,
        "namespace": caller.pod.namespace,
        "pod": caller.pod.name,
        "podUid": caller.pod.uid,
        "container": caller.pod.container_name(caller.container_index),
        "containerIndex": caller.container_index,
        "cores": sum(card["cores"] for card in cards),
        "memoryMib": sum(card["memoryMib"] for card in cards),
        "enforcement": enforcement,
        "policy": caller.pod.allocation.policy,
        "cards": cards,
    }


def _held_slice(share: CardShare, card: Card | None) -> MigSlice | None:
    """The MIG slice a share holds, when it is on one this node's card has."""
    if card is None or not share.mig_device:
        return None
    return next((s for s in card.slices if s.uuid == share.mig_device), None)


def limits_of(snapshot: Snapshot, caller: Caller) -> dict[str, int]:
    """What the container may use: its share, or on a MIG slice the whole slice (the hardware's limit)."""
    assert caller.pod.allocation is not None
    container = caller.pod.allocation.container(caller.container_index)
    assert container is not None
    cores = memory = 0
    for share in container.cards:
        view = snapshot.card(share.index)
        card = view.card if view else None
        held = _held_slice(share, card)
        cores += held.cores if held is not None else share.cores
        memory += held.memory_mib if held is not None else held_memory_mib(share, card)
    return {"cores": cores, "memoryMib": memory}


def usage_view(sampler: Sampler, snapshot: Snapshot, caller: Caller, history_seconds: float,
               now: float) -> dict[str, Any]:
    stale, message = snapshot.staleness(now)
    current = None
    if snapshot.taken_at is not None:
        usage = snapshot.usage.get(caller.key)
        measured = {u.index: u for u in usage.cards} if usage else {}
        assert caller.pod.allocation is not None
        container = caller.pod.allocation.container(caller.container_index)
        held = [s.index for s in container.cards] if container else []
        on_slice = any(s.mig_device for s in container.cards) if container else False
        current = {
            "t": snapshot.taken_at,
            "memoryUsedMib": _round(usage.memory_used_mib) if usage else 0.0,
            "utilizationPercent": _round(usage.utilization_percent) if usage else 0.0,
            "cards": [
                {
                    "index": index,
                    "memoryUsedMib": _round(measured[index].memory_used_mib) if index in measured else 0.0,
                    "utilizationPercent": _round(measured[index].utilization_percent) if index in measured else 0.0,
                }
                for index in sorted(set(held) | set(measured))
            ],
            # NVML has no utilisation per MIG device: the 0s above are not measurements
            **({"utilizationMeasured": False} if on_slice else {}),
        }
    history = sampler.history(caller.key, history_seconds, now=now)
    return {
        "stale": stale,
        "message": message,
        "periodSeconds": sampler.period,
        "historySeconds": sampler.history_seconds,
        "limits": limits_of(snapshot, caller),
        "current": current,
        # an unknown point (no process seen) shows as 0, as ``current`` does; only the reclaimer's
        # /api/v1/pods tells it apart (metrics/podusage.py)
        "history": [
            {"t": p.t, "memoryUsedMib": _round(p.memory_used_mib) if p.known else 0.0,
             "utilizationPercent": _round(p.utilization_percent) if p.known else 0.0}
            for p in history
        ],
    }


def topology_view(snapshot: Snapshot, caller: Caller, now: float) -> dict[str, Any]:
    stale, message = snapshot.staleness(now)
    topology = snapshot.topology_dict or {}
    numa = {g.get("index"): g.get("numa") for g in topology.get("gpus", [])}
    assert caller.pod.allocation is not None
    container = caller.pod.allocation.container(caller.container_index)
    mine = {s.index: s for s in container.cards} if container else {}
    held_slices = {h.share.mig_device for h in snapshot.pods.holdings() if h.share.mig_device}
    failing = {s.uuid for s in snapshot.slices if not s.healthy}  # the latest sample's word on each slice
    gpus = []
    for view in snapshot.cards:
        card = view.card
        share = mine.get(card.index)
        others = sum(1 for holder in view.holders if holder != caller.key)
        slices = _slice_views(card, share, held_slices, failing)
        gpus.append({
            "index": card.index,
            "uuid": card.uuid,
            "model": card.model,
            "memoryMib": card.memory_mib,
            "numa": card.numa if getattr(card, "numa", None) is not None else numa.get(card.index),
            "healthy": view.healthy,
            "mine": share is not None,
            "myCores": share.cores if share else 0,
            "myMemoryMib": held_memory_mib(share, card) if share else 0,
            "allocatedCores": min(view.allocated_cores, CORES_PER_CARD),
            "allocatedMemoryMib": view.allocated_memory_mib,
            "tenants": others,
            "memoryUsedMib": _round(view.memory_used_mib) if view.memory_used_mib is not None else None,
            "utilizationPercent": _round(view.utilization_percent) if view.utilization_percent is not None else None,
            **({"migSlices": slices} if slices else {}),
        })
        if slices:  # accounting at the slices' real size: a holder has all of its slice
            gpus[-1].update(_slice_totals(slices))
            # a card in MIG mode is published unhealthy (never time-shared); it serves while a slice does
            gpus[-1]["healthy"] = any(s.healthy and s.uuid not in failing for s in card.slices)
    return {
        "node": snapshot.node,
        "stale": stale,
        "message": message,
        "links": topology.get("links", []),
        "tree": topology.get("tree"),
        "gpus": gpus,
    }


def _slice_views(card: Card, share: CardShare | None, held: set[str], failing: set[str]) -> list[dict[str, Any]]:
    """A MIG card's slices for the topology view: profile, size and whose (the caller's, another
    tenant's, free, or unavailable); other holders stay anonymous (no UUIDs of theirs)."""
    views = []
    for mig in card.slices:
        mine = share is not None and share.mig_device == mig.uuid
        state = ("mine" if mine else "held" if mig.uuid in held
                 else "free" if mig.placeable and mig.uuid not in failing else "unavailable")
        views.append({"profile": mig.profile, "slices": mig.slices, "cardSlices": mig.card_slices,
                      "cores": mig.cores, "memoryMib": mig.memory_mib, "state": state})
    return views


def _slice_totals(slices: list[dict[str, Any]]) -> dict[str, int]:
    held = [s for s in slices if s["state"] in ("mine", "held")]
    own = [s for s in slices if s["state"] == "mine"]
    return {"allocatedCores": min(sum(s["cores"] for s in held), CORES_PER_CARD),
            "allocatedMemoryMib": sum(s["memoryMib"] for s in held),
            "myCores": sum(s["cores"] for s in own), "myMemoryMib": sum(s["memoryMib"] for s in own)}


# --- tornado handlers ---------------------------------------------------------------------


class JSONHandler(tornado.web.RequestHandler):
    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")

    def write_json(self, body: Any) -> None:
        self.finish(json.dumps(body, separators=(",", ":")))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = kwargs.get("exc_info", (None, None, None))[1]
        message = error.message if isinstance(error, ApiError) else self._reason
        if status_code == 401:
            self.set_header("WWW-Authenticate", 'Bearer realm="vgpu"')
        self.finish(json.dumps({"status": status_code, "message": message}))

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        if isinstance(value, ApiError):  # a refused caller is not a server error
            log.debug("%s %s: %d %s", self.request.method, self.request.path, value.status_code, value.message)
            return
        super().log_exception(typ, value, tb)


class ApiHandler(JSONHandler):
    def initialize(self, context: ApiContext) -> None:
        self.context = context

    def prepare(self) -> None:
        query = {k: self.get_query_argument(k) for k in ("pod", "container") if self.get_query_argument(k, None)}
        self.caller = identify(self.context, self.request.headers.get("Authorization"), query)
        self.snapshot = self.context.sampler.snapshot()


class AllocationHandler(ApiHandler):
    def get(self) -> None:
        self.write_json(allocation_view(self.snapshot, self.caller, self.context.enforcement))


class UsageHandler(ApiHandler):
    def get(self) -> None:
        text = self.get_query_argument("history", None)
        seconds = DEFAULT_HISTORY_SECONDS
        if text is not None:
            try:
                seconds = float(text)
            except ValueError:
                seconds = math.nan
            if not math.isfinite(seconds) or seconds < 0:
                raise ApiError(400, f"history={text!r}: give a number of seconds, 0 or more")
        seconds = min(seconds, self.context.sampler.history_seconds)
        self.write_json(usage_view(self.context.sampler, self.snapshot, self.caller, seconds, self.context.clock()))


class TopologyHandler(ApiHandler):
    def get(self) -> None:
        self.write_json(topology_view(self.snapshot, self.caller, self.context.clock()))


class HealthHandler(JSONHandler):
    def initialize(self, context: ApiContext) -> None:
        self.context = context

    def get(self) -> None:
        # the server is alive even when the GPU numbers are stale; say so without failing
        stale, message = self.context.sampler.snapshot().staleness(self.context.clock())
        self.write_json({"ok": True, "stale": stale, "message": message})


class ReadyHandler(JSONHandler):
    """The readiness probe: 200 when the process does its job (the node daemon: registered with
    kubelet), else 503 with the reason. /healthz stays the liveness probe."""

    def initialize(self, readiness: Callable[[], str | None]) -> None:
        self.readiness = readiness

    def get(self) -> None:
        reason = self.readiness()
        if reason is not None:
            self.set_status(503)
        self.write_json({"ready": reason is None, "reason": reason or ""})
