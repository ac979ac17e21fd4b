"""Which pod kubelet is admitting, what its containers get, and the ledger of what was given.

kubelet's Allocate names device IDs, never the pod. The pod is found the way
gpu-admission's partner (gpu-manager) finds it: bound to this node, placed by the
scheduler extender (``predicate-*`` annotations), not yet served, asking for exactly
that many devices; among several, the oldest predicate time. The ``vcuda-core``
Allocate carries the container's whole answer; ``vcuda-memory``'s is empty, so the
two answers kubelet merges can never conflict, whatever order they come in.

When identical requests make the choice ambiguous, kubelet's checkpoint later says
which container really holds which device IDs; ``reconcile`` moves the records to
match, so the annotations end up true.

Each vcuda-core answer carries a read token over a fresh allocation id (``tokens``).
A record holds that id only when the answer certainly went to that container: no other
waiting container could have been the one kubelet was admitting, or kubelet's checkpoint
says so. So a token reads exactly the pod that has it, and after a guess nothing until
the checkpoint is read. Likewise the answer names its pod (``VGPU_POD_*``) only when it
is certain: a guess could show one user another user's pod.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import (
    CardShare,
    ContainerAllocation,
    Names,
    PodAllocation,
)

from ..tokens import new_allocation_id
from . import api_pb2
from .checkpoint import PodDeviceEntry
from .devices import CORE, MEMORY, card_of, cards_in
from .enforcement import EnforcementConfig, Identity, container_response
from .pods import PodView, Wanted, parse_pod
from .state import CardsState

if TYPE_CHECKING:
    from jupyter_vgpu.core.inventory import Card

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (pod UID, container index)


class AllocationError(Exception):
    """Allocate cannot be answered; the message is what kubelet puts on the pod."""


class PodSource(Protocol):
    def items(self) -> list[dict[str, Any]]: ...


class TokenSource(Protocol):
    def mint(self, subject: str) -> str: ...
    def verify(self, token: str | None) -> str | None: ...


@dataclass
class Served:
    key: Key
    namespace: str
    pod: str
    container: str
    allocation: ContainerAllocation  # its allocation_id only once kubelet's checkpoint confirmed it
    devices: dict[str, tuple[str, ...]] = field(default_factory=dict)  # kind -> device IDs
    identity_uid: str = ""  # whose identity the container's env carries (normally its own pod)
    since: float = field(default_factory=time.monotonic)
    answered_at: float = 0.0  # when its vcuda-core answer was given (monotonic); 0: before this process
    # its vcuda-core answer was a guess among several containers kubelet could have been admitting,
    # until kubelet's checkpoint confirms who holds it
    guessed: bool = False


class Allocator:
    def __init__(
        self,
        node: str,
        pods: PodSource,
        cards: CardsState,
        tokens: TokenSource,
        *,
        names: Names = c.DEFAULT_NAMES,
        enforcement: EnforcementConfig | None = None,
        metrics_url: Callable[[], str] | str = "",
        on_pod_changed: Callable[[str, str], None] | None = None,
        fresh_pods: Callable[[], list[dict[str, Any]]] | None = None,
        confirm_grace: float = 10.0,
    ) -> None:
        """``fresh_pods`` lists this node's pods straight from the API: kubelet's watch and ours
        are independent, so kubelet may admit a pod our cache has not seen bound yet.
        ``confirm_grace``: how long ``gpu-assigned=true`` waits for kubelet's checkpoint to confirm
        who holds each answer before it is written anyway (with no allocation id: no token works)."""
        self._confirm_grace = confirm_grace
        self.node = node
        self._fresh_pods = fresh_pods
        self.names = names
        self._pods = pods
        self._cards = cards
        self._tokens = tokens
        self._enforcement = enforcement or EnforcementConfig()
        self._metrics_url = metrics_url
        self._on_pod_changed = on_pod_changed or (lambda namespace, name: None)
        self._lock = threading.RLock()
        self._served: dict[Key, Served] = {}
        self._overrides: dict[Key, ContainerAllocation] = {}
        # core IDs -> what that answer gave (with the answer's allocation id) and whom it was prepared for
        self._given: dict[tuple[str, ...], tuple[ContainerAllocation, Key]] = {}
        self._views: dict[str, tuple[str, PodView | None]] = {}  # uid -> (resourceVersion, view)
        self._gone: set[str] = set()  # pods deleted or finished since the last reconcile

    # --- reading pods -------------------------------------------------------------------

    def _view(self, pod: dict[str, Any]) -> PodView | None:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid") or ""
        version = meta.get("resourceVersion") or ""
        cached = self._views.get(uid)
        if cached is not None and cached[0] == version and version:
            return cached[1]
        view = parse_pod(pod, self.node, self.names)
        self._views[uid] = (version, view)
        return view

    def _all_views(self, pods: list[dict[str, Any]] | None = None) -> list[PodView]:
        views = []
        seen = set()
        for pod in self._pods.items() if pods is None else pods:
            view = self._view(pod)
            uid = (pod.get("metadata") or {}).get("uid") or ""
            seen.add(uid)
            if view is not None:
                views.append(view)
        for uid in [u for u in self._views if u not in seen]:
            del self._views[uid]
        return views

    # --- choosing the container kubelet is admitting ------------------------------------------

    def _served_kind(self, key: Key, kind: str) -> bool:
        served = self._served.get(key)
        return served is not None and kind in served.devices

    def _choose(self, kind: str, count: int, ids: Sequence[str] | None,
                views: list[PodView]) -> Wanted | None:
        id_cards = set(cards_in(ids or ()))
        best: tuple[Any, ...] | None = None
        chosen = None
        for view in views:
            if view.assigned or view.problem:
                continue
            pod_started = any(key[0] == view.uid for key in self._served)
            for wanted in view.containers:
                key = (wanted.uid, wanted.index)
                if wanted.count(kind) != count or self._served_kind(key, kind):
                    continue
                other = MEMORY if kind == CORE else CORE
                half_served = self._served_kind(key, other)
                planned = self._overrides.get(key)
                plan_cards = {s.index for s in planned.cards} if planned else set(wanted.cards)
                rank = (
                    0 if half_served else 1,          # the other resource of this container came first
                    0 if pod_started else 1,          # kubelet finishes a pod before the next
                    wanted.predicate_time,            # then the oldest placement
                    0 if id_cards and id_cards <= plan_cards else 1,
                    wanted.namespace, wanted.pod, wanted.index,
                )
                if best is None or rank < best:
                    best, chosen = rank, wanted
        return chosen

    def _rivals(self, count: int, views: list[PodView]) -> list[Key]:
        """Every container kubelet could be admitting with ``count`` vcuda-core devices: those waiting,
        and those we answered by a guess kubelet's checkpoint has not confirmed (that guess may be wrong,
        and then the container it named is the one still waiting)."""
        rivals: list[Key] = []
        for view in views:
            if view.assigned:
                continue
            if view.problem:  # its requests are unknown: it could be anyone's rival
                rivals.append((view.uid, -1))
                continue
            for wanted in view.containers:
                key = (wanted.uid, wanted.index)
                served = self._served.get(key)
                if wanted.count(CORE) == count and (
                        not self._served_kind(key, CORE) or (served is not None and served.guessed)):
                    rivals.append(key)
        return rivals

    def _certain(self, wanted: Wanted, count: int, views: list[PodView], fresh: bool) -> bool:
        """For a vcuda-core answer: no other waiting container could be the one kubelet is admitting
        (asked of the API server too, as our cache may lag kubelet's), so the answer may name its pod."""
        key = (wanted.uid, wanted.index)
        with self._lock:
            if self._rivals(count, views) != [key]:
                return False
        if fresh or self._fresh_pods is None:
            return True
        pods = self._fetch_fresh()
        if pods is None:
            return False
        with self._lock:
            return self._rivals(count, self._all_views(pods)) == [key]

    def _no_match(self, kind: str, count: int, views: list[PodView]) -> AllocationError:
        resource = self.names.core_resource if kind == CORE else self.names.memory_resource
        waiting = [w for v in views if not v.assigned and not v.problem for w in v.containers
                   if not self._served_kind((w.uid, w.index), kind) and w.count(kind)]
        problems = [f"{v.namespace}/{v.name}: {v.problem}" for v in views if v.problem and not v.assigned]
        text = f"no pod bound to node {self.node} is waiting for exactly {count} {resource}"
        if waiting:
            listed = "; ".join(w.describe() for w in waiting[:5])
            more = f" and {len(waiting) - 5} more" if len(waiting) > 5 else ""
            text += f"; containers waiting here ask for: {listed}{more}"
        else:
            text += "; no vGPU container is waiting on this node"
        if problems:
            text += "; ignored: " + "; ".join(problems[:5])
        text += (f". A pod must be placed by the vGPU scheduler extender ({self.names.predicate_node}="
                 f"{self.node} and {self.names.predicate_gpu_idx_prefix}<i> annotations) before kubelet admits it")
        return AllocationError(text)

    # --- what a container gets --------------------------------------------------------------

    def _plan(self, wanted: Wanted, cards: dict[int, Card]) -> ContainerAllocation:
        key = (wanted.uid, wanted.index)
        planned = self._overrides.get(key) or wanted.record
        if planned is not None:
            return replace(planned, name=wanted.container, cards=tuple(
                replace(s, uuid=cards[s.index].uuid) if s.index in cards else s for s in planned.cards))
        request = wanted.request
        missing = [i for i in wanted.cards if i not in cards]
        if missing:
            raise AllocationError(
                f"{wanted.describe()}: card(s) {missing} assigned by the scheduler do not exist on node "
                f"{self.node} (it has {sorted(cards)})")
        if request.is_share:
            if len(wanted.cards) != 1:
                raise AllocationError(f"{wanted.describe()}: a share must be on one card, the scheduler chose "
                                      f"{len(wanted.cards)}")
            index = wanted.cards[0]
            shares = (CardShare(index, cards[index].uuid, request.cores, request.memory_units),)
        else:
            if len(set(wanted.cards)) != request.cards:
                raise AllocationError(f"{wanted.describe()}: {request.cards} whole card(s) requested but the "
                                      f"scheduler chose {len(set(wanted.cards))}")
            shares = tuple(CardShare(i, cards[i].uuid, c.CORES_PER_CARD, cards[i].memory_units)
                           for i in sorted(set(wanted.cards)))
        return ContainerAllocation(index=wanted.index, name=wanted.container, cards=shares)

    def _check_fits(self, wanted: Wanted, allocation: ContainerAllocation, cards: dict[int, Card]) -> None:
        key = (wanted.uid, wanted.index)
        for share in allocation.cards:
            card = cards.get(share.index)
            if card is None:
                raise AllocationError(f"{wanted.describe()}: card {share.index} does not exist on node {self.node}")
            if not card.healthy:
                why = self._cards.reason(share.index) or "unhealthy"
                raise AllocationError(f"{wanted.describe()}: card {share.index} is unhealthy ({why})")
            used_cores = used_units = 0
            for other in self._served.values():
                if other.key == key or CORE not in other.devices:
                    continue
                for held in other.allocation.cards:
                    if held.index == share.index:
                        used_cores += held.cores
                        used_units += held.memory_units
            if used_cores + share.cores > c.CORES_PER_CARD or used_units + share.memory_units > card.memory_units:
                raise AllocationError(
                    f"{wanted.describe()}: card {share.index} cannot take {share.cores} cores and "
                    f"{share.memory_units} memory units: {used_cores} cores and {used_units} of "
                    f"{card.memory_units} units are already given out on this node")

    def _metrics(self) -> str:
        return self._metrics_url() if callable(self._metrics_url) else self._metrics_url

    def _response(self, served: Served, cards: dict[int, Card], allocation_id: str,
                  certain: bool) -> api_pb2.ContainerAllocateResponse:
        uid, index = served.key
        identity = Identity(node=self.node, namespace=served.namespace if certain else "",
                            pod=served.pod if certain else "", pod_uid=(served.identity_uid or uid) if certain else "",
                            container=served.container, container_index=index, allocation_id=allocation_id)
        return container_response(self._enforcement, served.allocation, cards, identity,
                                  metrics_url=self._metrics(), token=self._tokens.mint(allocation_id))

    # --- the RPCs ---------------------------------------------------------------------------

    def allocate(self, kind: str, ids: Sequence[str]) -> api_pb2.ContainerAllocateResponse:
        """Serve one container's request for one resource; AllocationError changes nothing."""
        ids = tuple(sorted(set(ids)))
        if not ids:
            raise AllocationError("Allocate named no devices")
        foreign = [d for d in ids if card_of(d) is None]
        if foreign:
            raise AllocationError(f"device IDs {foreign[:3]} are not this plugin's (expected gpu<i>-core-<nn> "
                                  f"or gpu<i>-mem-<nnnn>)")
        started = time.perf_counter()
        with self._lock:
            views = self._all_views()
            wanted = self._choose(kind, len(ids), ids, views)
        fresh = False
        if wanted is None:
            pods = self._fetch_fresh()
            fresh = pods is not None
            with self._lock:
                views = self._all_views(pods)
                wanted = self._choose(kind, len(ids), ids, views)
                if wanted is None:
                    raise self._no_match(kind, len(ids), views)
        certain = kind == CORE and self._certain(wanted, len(ids), views, fresh)
        with self._lock:
            if self._served_kind((wanted.uid, wanted.index), kind):  # a concurrent call got there first
                raise self._no_match(kind, len(ids), views)
            cards = self._cards.by_index()
            key = (wanted.uid, wanted.index)
            existing = self._served.get(key)
            # a new answer: its id is recorded once it is certain who holds it
            allocation = replace(existing.allocation if existing else self._plan(wanted, cards), allocation_id="")
            if kind == CORE:
                self._check_fits(wanted, allocation, cards)
            served = existing or Served(key=key, namespace=wanted.namespace, pod=wanted.pod,
                                        container=wanted.container, allocation=allocation, identity_uid=wanted.uid)
            served.devices[kind] = ids
            self._served[key] = served
            self._overrides.pop(key, None)
            if kind == CORE:
                answer_id = new_allocation_id()
                # sure whose container this is: its record may name the answer now; else kubelet's
                # checkpoint has to say who holds it first
                served.allocation = replace(allocation, allocation_id=answer_id) if certain else allocation
                served.answered_at = time.monotonic()
                served.guessed = not certain
                self._given[ids] = (replace(allocation, allocation_id=answer_id), key)
                response = self._response(served, cards, answer_id, certain)
            else:
                response = api_pb2.ContainerAllocateResponse()
            complete = self._pod_complete(wanted.uid, views)
        log.info("Allocate %s: %d device(s) on card(s) %s -> %s [%s] (%.1f ms)",
                 kind, len(ids), ",".join(map(str, sorted(cards_in(ids)))), wanted.describe(),
                 "pod fully served" if complete else "more to come", (time.perf_counter() - started) * 1000)
        if complete:
            self._on_pod_changed(wanted.namespace, wanted.pod)
        return response

    def preferred(self, kind: str, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """Device IDs on the card(s) the scheduler chose for the container being admitted."""
        with self._lock:
            views = self._all_views()
            wanted = self._choose(kind, size, None, views)
        if wanted is None:
            pods = self._fetch_fresh()
        with self._lock:
            if wanted is None:
                views = self._all_views(pods)
                wanted = self._choose(kind, size, None, views)
            quota: dict[int, int] = {}
            if wanted is not None:
                try:
                    key = (wanted.uid, wanted.index)
                    existing = self._served.get(key)
                    allocation = existing.allocation if existing else self._plan(wanted, self._cards.by_index())
                    quota = _quota(kind, allocation, size)
                except AllocationError as error:
                    log.info("GetPreferredAllocation: %s; leaving the choice to kubelet", error)
        chosen = list(dict.fromkeys(must_include))[:size] if size > 0 else []
        pool = sorted(set(available) - set(chosen), key=_id_order)
        taken = cards_in(chosen)
        for device in pool:
            card = card_of(device)
            if len(chosen) >= size:
                break
            if card in quota and taken[card] < quota[card]:
                chosen.append(device)
                taken[card] += 1
        for device in pool:  # kubelet's accounting may differ from ours: fill up from the rest
            if len(chosen) >= size:
                break
            if device not in chosen:
                chosen.append(device)
        return chosen

    def _fetch_fresh(self) -> list[dict[str, Any]] | None:
        """The node's pods straight from the API (None: use the cache), for a cache that lags kubelet."""
        if self._fresh_pods is None:
            return None
        try:
            return self._fresh_pods()
        except Exception as error:
            log.warning("listing this node's pods for a cache miss failed: %s", error)
            return None

    # --- completion, annotations ----------------------------------------------------------------

    def _pod_complete(self, uid: str, views: Iterable[PodView]) -> bool:
        for view in views:
            if view.uid != uid:
                continue
            return all(self._container_complete(w) for w in view.containers)
        return False

    def _container_complete(self, wanted: Wanted) -> bool:
        served = self._served.get((wanted.uid, wanted.index))
        if served is None or CORE not in served.devices:
            return False
        return wanted.request.memory_units == 0 or MEMORY in served.devices

    def _confirmed(self, wanted: Wanted) -> bool:
        """kubelet's checkpoint said this container holds its answer (its record has the answer's id),
        or it was answered before this process started, or the grace for the checkpoint ran out."""
        served = self._served.get((wanted.uid, wanted.index))
        if served is None:
            return False
        return bool(served.allocation.allocation_id) or time.monotonic() - served.answered_at >= self._confirm_grace

    def desired_annotations(self, namespace: str, name: str) -> dict[str, str] | None:
        """The annotations that make the pod's record true now; None when there is nothing to say."""
        with self._lock:
            for view in self._all_views():
                if view.namespace != namespace or view.name != name or view.problem or not view.containers:
                    continue
                cards = self._cards.by_index()
                containers = []
                for wanted in view.containers:
                    served = self._served.get((wanted.uid, wanted.index))
                    if served is not None:
                        containers.append(served.allocation)
                    else:  # not admitted yet: no answer, so no id
                        try:
                            containers.append(replace(self._plan(wanted, cards), allocation_id=""))
                        except AllocationError:
                            return None
                complete = all(self._container_complete(w) for w in view.containers)
                if not complete and not any((w.uid, w.index) in self._overrides for w in view.containers):
                    return None
                if complete and not view.assigned and not all(self._confirmed(w) for w in view.containers):
                    return None  # gpu-assigned=true once the record is known true (reconcile asks again)
                unconfirmed = [w.container for w in view.containers  # complete: every container is served
                               if complete and not self._served[(w.uid, w.index)].allocation.allocation_id]
                record = PodAllocation(node=self.node, containers=tuple(containers),
                                       assigned_at_ns=view.containers[0].predicate_time, policy=view.policy)
                desired = {self.names.allocation: record.to_json(),
                           self.names.gpu_assigned: "true" if complete else "false"}
                for allocation in containers:
                    desired[self.names.predicate_gpu_idx(allocation.index)] = c.card_ids_env(
                        [s.index for s in allocation.cards])
                if all(view.annotations.get(k) == v for k, v in desired.items()):
                    return None
                if unconfirmed and not view.assigned:
                    log.warning("pod %s/%s: kubelet's checkpoint did not confirm container(s) %s within %.0f s; "
                                "marking it assigned anyway, but their read tokens read nothing",
                                namespace, name, unconfirmed, self._confirm_grace)
                return desired
        return None

    # --- restarts and reconciliation ---------------------------------------------------------------

    def restore(self, entries: Iterable[PodDeviceEntry]) -> int:
        """Rebuild the ledger after a restart from kubelet's checkpoint and the pod annotations."""
        with self._lock:
            self._served.clear()
            self._overrides.clear()
            self._given.clear()
            dirty: set[tuple[str, str]] = set()
            self._reconcile_locked(list(entries), dirty)
            cards = self._cards.by_index()
            for view in self._all_views():
                if view.assigned and not view.problem:  # served before, whatever kubelet recorded
                    for wanted in view.containers:
                        for kind in (CORE, MEMORY) if wanted.request.memory_units else (CORE,):
                            if not self._served_kind((wanted.uid, wanted.index), kind):
                                self._mark(wanted, kind, (), cards)
            restored = len(self._served)
        log.info("restored %d served container(s) from kubelet's checkpoint and pod annotations", restored)
        for namespace, name in dirty:
            self._on_pod_changed(namespace, name)
        return restored

    def _kind(self, resource: str) -> str | None:
        if resource == self.names.core_resource:
            return CORE
        if resource == self.names.memory_resource:
            return MEMORY
        return None

    def _mark(self, wanted: Wanted, kind: str, ids: tuple[str, ...], cards: dict[int, Card]) -> Served | None:
        key = (wanted.uid, wanted.index)
        served = self._served.get(key)
        if served is None:
            try:
                allocation = self._plan(wanted, cards)
            except AllocationError as error:
                log.warning("cannot restore %s: %s", wanted.describe(), error)
                return None
            served = Served(key=key, namespace=wanted.namespace, pod=wanted.pod, container=wanted.container,
                            allocation=allocation, identity_uid=wanted.uid)
            self._served[key] = served
        served.devices[kind] = ids
        if kind == CORE and ids:
            self._given[ids] = (served.allocation, key)
        return served

    def reconcile(self, entries: Sequence[PodDeviceEntry]) -> set[tuple[str, str]]:
        """Match the ledger to what kubelet did; returns the pods whose annotations must change."""
        dirty: set[tuple[str, str]] = set()
        with self._lock:
            views = self._all_views()
            by_uid = {v.uid: v for v in views}
            present = {(p.get("metadata") or {}).get("uid") for p in self._pods.items() if _holds_devices(p)}
            now = time.monotonic()
            # a pod our cache has not seen yet (served from a direct list) is not gone: only a
            # DELETED/terminal event, or a long absence, releases what it holds
            gone = {k[0] for k, served in self._served.items() if k[0] in self._gone
                    or (k[0] not in present and now - served.since > _ABSENCE_GRACE)}
            gone |= self._gone
            self._gone.clear()
            for key in [k for k in self._served if k[0] in gone]:
                served = self._served.pop(key)
                log.info("released %s/%s container %r (pod gone or finished)", served.namespace, served.pod,
                         served.container)
            for key in [k for k in self._overrides if k[0] in gone or k[0] not in by_uid]:
                del self._overrides[key]
            for ids in [i for i, (_, k) in self._given.items() if k[0] in gone]:
                del self._given[ids]
            self._reconcile_locked(entries, dirty)
            for view in views:
                if not view.problem and view.containers and not view.assigned and self._pod_complete(view.uid, views):
                    dirty.add((view.namespace, view.name))
        for namespace, name in dirty:
            self._on_pod_changed(namespace, name)
        return dirty

    def _reconcile_locked(self, entries: Sequence[PodDeviceEntry], dirty: set[tuple[str, str]]) -> None:
        """kubelet's checkpoint is the truth: which container holds which device IDs, and (in
        AllocResp) the answer that container was given."""
        views = self._all_views()
        by_uid = {v.uid: v for v in views}
        cards = self._cards.by_index()
        located: list[tuple[Wanted, str, PodDeviceEntry]] = []
        for entry in entries:
            kind = self._kind(entry.resource)
            view = by_uid.get(entry.pod_uid)
            if kind is None or view is None or view.problem:
                continue
            wanted = next((w for w in view.containers if w.container == entry.container_name), None)
            if wanted is not None and entry.device_ids:
                located.append((wanted, kind, entry))
        in_checkpoint = {((w.uid, w.index), kind) for w, kind, _ in located}
        for wanted, kind, entry in sorted(located, key=lambda item: item[1] != CORE):  # cores first
            key = (wanted.uid, wanted.index)
            ids = entry.device_ids
            if kind == MEMORY:
                self._take_devices(wanted, MEMORY, ids, in_checkpoint, cards, dirty)
                continue
            received = self._received(entry, cards, by_uid)
            served = self._served.get(key)
            if received is None:  # not an answer we can read: keep what the ledger says
                self._take_devices(wanted, CORE, ids, in_checkpoint, cards, dirty)
                continue
            allocation, partner = received
            allocation = replace(allocation, index=wanted.index, name=wanted.container)
            if served is not None and served.devices.get(CORE) == ids and _same_cards(served.allocation, allocation):
                self._given[ids] = (allocation, key)
                if served.allocation.allocation_id != allocation.allocation_id:  # kubelet confirms who holds it
                    served.allocation = replace(served.allocation, allocation_id=allocation.allocation_id)
                    dirty.add((wanted.namespace, wanted.pod))
                continue
            try:
                previous = served.allocation if served is not None and CORE in served.devices else self._plan(wanted, cards)
            except AllocationError:
                previous = None
            self._take_devices(wanted, CORE, ids, in_checkpoint, cards, dirty)
            served = self._served[key]
            if served.allocation.allocation_id != allocation.allocation_id:
                dirty.add((wanted.namespace, wanted.pod))
            served.allocation = allocation  # with the id of the answer it holds
            served.identity_uid = partner[0] or served.identity_uid
            self._given[ids] = (allocation, key)
            if previous is None or _same_cards(previous, allocation):
                continue
            dirty.add((wanted.namespace, wanted.pod))
            log.warning("kubelet gave %s the answer prepared for pod UID %s container %d (identical requests "
                        "admitted out of placement order): its records now show card(s) %s and its token's "
                        "allocation id; its VGPU_POD_* env names the other pod", wanted.describe(), partner[0],
                        partner[1], [s.index for s in allocation.cards])
            if partner != key and (partner, CORE) not in in_checkpoint and partner[0] in by_uid:
                # the other container is not admitted yet: it takes the placement this one left free
                other = self._served.get(partner)
                if other is not None and other.devices.get(CORE) == ids:
                    del other.devices[CORE]
                    if not other.devices:
                        del self._served[partner]
                partner_view = by_uid[partner[0]]
                name = next((w.container for w in partner_view.containers if w.index == partner[1]), "")
                self._overrides[partner] = replace(previous, index=partner[1], name=name, allocation_id="")
                dirty.add((partner_view.namespace, partner_view.name))
        for wanted, kind, entry in located:  # kubelet confirms who holds these: no guess any more
            served = self._served.get((wanted.uid, wanted.index))
            if kind == CORE and served is not None and served.devices.get(CORE) == entry.device_ids:
                served.guessed = False

    def _take_devices(self, wanted: Wanted, kind: str, ids: tuple[str, ...], in_checkpoint: set[tuple[Key, str]],
                      cards: dict[int, Card], dirty: set[tuple[str, str]]) -> None:
        """Record that kubelet gave ``wanted``'s container these IDs; whoever the ledger thought had them
        (and kubelet says has not) loses them."""
        key = (wanted.uid, wanted.index)
        for other_key, other in list(self._served.items()):
            if other_key != key and other.devices.get(kind) == ids and (other_key, kind) not in in_checkpoint:
                del other.devices[kind]
                if not other.devices:
                    del self._served[other_key]
                dirty.add((other.namespace, other.pod))
        served = self._served.get(key)
        if served is None or served.devices.get(kind) != ids:
            if self._mark(wanted, kind, ids, cards) is not None and served is None:
                dirty.add((wanted.namespace, wanted.pod))

    def _received(self, entry: PodDeviceEntry, cards: dict[int, Card],
                  by_uid: dict[str, PodView]) -> tuple[ContainerAllocation, Key] | None:
        """The allocation in the answer kubelet recorded for these IDs (with the answer's allocation
        id, from its token), and whom it was prepared for."""
        env: dict[str, str] = {}
        if entry.alloc_response:
            try:
                env = dict(api_pb2.ContainerAllocateResponse.FromString(entry.alloc_response).envs)
            except Exception:  # noqa: BLE001 - a foreign or corrupt record: fall back to our own memory
                env = {}
        given = self._given.get(entry.device_ids)
        if c.ENV_DEVICE_INDICES in env:
            try:
                indices = [int(i) for i in env[c.ENV_DEVICE_INDICES].split(",") if i]
                uuids = env.get(c.ENV_DEVICE_UUIDS, "").split(",")
                cores = int(env[c.ENV_CORES])
                mib = int(env[c.ENV_MEMORY_MIB])
            except (KeyError, ValueError):
                return None
            if not indices:
                return None
            if len(indices) == 1 and cores < c.CORES_PER_CARD:
                shares = (CardShare(indices[0], uuids[0] if uuids else "", cores, mib // c.MEMORY_UNIT_MIB),)
            else:
                shares = tuple(
                    CardShare(i, uuids[n] if n < len(uuids) else "", c.CORES_PER_CARD,
                              cards[i].memory_units if i in cards else mib // len(indices) // c.MEMORY_UNIT_MIB)
                    for n, i in enumerate(indices))
            # whom the answer was prepared for: named in it when that was certain, else in our memory
            partner_uid = env.get(c.ENV_POD_UID) or (given[1][0] if given else "")
            view = by_uid.get(partner_uid)
            index = next((w.index for w in view.containers if w.container == env.get(c.ENV_CONTAINER)), -1) \
                if view is not None else -1
            # an answer whose token this node did not mint (a lost secret) gets no id: it reads nothing
            answer_id = self._tokens.verify(env.get(c.ENV_TOKEN)) or ""
            return (ContainerAllocation(index=index, name=env.get(c.ENV_CONTAINER, ""), cards=shares,
                                        allocation_id=answer_id), (partner_uid, index))
        if given is not None:
            return given[0], given[1]
        return None

    def pod_gone(self, uid: str) -> None:
        """The pod was deleted or finished: what it holds is released at the next reconcile."""
        with self._lock:
            self._gone.add(uid)

    # --- views for others ---------------------------------------------------------------------

    def served(self) -> dict[Key, Served]:
        with self._lock:
            return dict(self._served)

    def usage(self) -> dict[int, tuple[int, int]]:
        """Card -> (cores, memory units) given out to admitted containers."""
        with self._lock:
            used: dict[int, tuple[int, int]] = {}
            for served in self._served.values():
                if CORE not in served.devices:
                    continue
                for share in served.allocation.cards:
                    cores, units = used.get(share.index, (0, 0))
                    used[share.index] = (cores + share.cores, units + share.memory_units)
            return used


_ABSENCE_GRACE = 60.0  # seconds a served pod may be missing from the cache before it counts as gone


def _same_cards(a: ContainerAllocation, b: ContainerAllocation) -> bool:
    return sorted((s.index, s.cores, s.memory_units) for s in a.cards) == \
        sorted((s.index, s.cores, s.memory_units) for s in b.cards)


def _holds_devices(pod: dict[str, Any]) -> bool:
    """Until it is deleted or finished a pod keeps its devices (a terminating pod still runs)."""
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _id_order(device: str) -> tuple[int, str]:
    card = card_of(device)
    return (card if card is not None else 1 << 30, device)


def _quota(kind: str, allocation: ContainerAllocation, size: int) -> dict[int, int]:
    """How many of ``size`` devices of a kind each card of the allocation should supply."""
    if kind == CORE:
        return {s.index: s.cores for s in allocation.cards}
    shares = sorted(allocation.cards, key=lambda s: s.index)
    if len(shares) == 1:
        return {shares[0].index: size}
    per, extra = divmod(size, len(shares))  # whole cards with declared memory: spread it evenly
    return {s.index: per + (1 if i < extra else 0) for i, s in enumerate(shares)}
