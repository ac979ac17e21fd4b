"""The allocator: the thin, locked shell the gRPC services and the daemon call.

It holds the served ledger (``served.py``) and this node's pod views, and does the I/O:
listing pods when the cache lags kubelet, minting tokens, logging, asking for annotation
writes. The decisions are pure functions elsewhere: which container kubelet is admitting
and what it gets (``allocate.py``), reconciliation with kubelet's checkpoint as a plan
that is then swapped in (``reconcile.py``), what a pod's annotations should say
(``records.py``), the protobuf answers (``responses.py``).

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
from dataclasses import replace
from typing import Any, Protocol

from jupyter_vgpu.core import claims
from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import Names

from ..tokens import new_allocation_id
from . import api_pb2
from .allocate import (
    AllocationError,
    check_fits,
    choose,
    no_match,
    placement,
    preferred_ids,
    quota,
    refuse_unaccountable,
    rivals,
    settled_pods,
    unaccountable,
)
from .checkpoint import PodDeviceEntry
from .devices import CORE, card_of, cards_in
from .enforcement import EnforcementConfig
from .listed import ListedPods
from .pods import PodView, Wanted, parse_pod
from .reconcile import Plan, World, gone_pods, plan_reconcile, plan_restore
from .records import Desired, desired_annotations
from .responses import answer_env, core_answer, memory_answer
from .served import Key, Ledger, Served
from .state import CardsState

__all__ = ["AllocationError", "Allocator", "AnswerMemo", "Desired", "Key", "PodSource", "Served", "TokenSource"]

log = logging.getLogger(__name__)


class PodSource(Protocol):
    def items(self) -> list[dict[str, Any]]: ...


class TokenSource(Protocol):
    def mint(self, subject: str) -> str: ...
    def verify(self, token: str | None) -> str | None: ...


class AnswerMemo:
    """What reconciliation reads of each answer kubelet recorded (its env, and the allocation id its
    token verifies to), remembered from one pass to the next: both are functions of their argument
    alone (the answer's bytes; the token, under this node's fixed secret), and kubelet's checkpoint
    holds the same answers pass after pass. Only what the last pass asked is kept."""

    def __init__(self, verify: Callable[[str | None], str | None]) -> None:
        self._verify = verify
        self._envs: tuple[dict[bytes, dict[str, str]], dict[bytes, dict[str, str]]] = ({}, {})
        self._ids: tuple[dict[str | None, str | None], dict[str | None, str | None]] = ({}, {})

    def next_pass(self) -> None:
        """Forget what the pass before last asked and the last pass did not."""
        self._envs = (self._envs[1], {})
        self._ids = (self._ids[1], {})

    def env(self, raw: bytes) -> dict[str, str]:
        """``responses.answer_env(raw)``; the planner only reads it."""
        before, now = self._envs
        if raw not in now:
            now[raw] = before[raw] if raw in before else answer_env(raw)
        return now[raw]

    def verify(self, token: str | None) -> str | None:
        before, now = self._ids
        if token not in now:
            now[token] = before[token] if token in before else self._verify(token)
        return now[token]


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
        fresh_pods: Callable[[], dict[str, Any]] | None = None,
        confirm_grace: float = 10.0,
    ) -> None:
        """``fresh_pods`` lists this node's pods straight from the API (the LIST reply: items and
        resourceVersion): kubelet's watch and ours are independent, so kubelet may admit a pod our
        cache has not seen bound yet. A list stands in for the cache until the watch catches up
        (``listed.py``).
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
        self._ledger = Ledger()
        self._listed = ListedPods()  # the last list of the node's pods, while it is newer than the watch
        self._views: dict[str, tuple[str, PodView | None]] = {}  # uid -> (resourceVersion, view)
        self._running: set[str] = set()  # pods kubelet runs (it admitted them), from the last listing
        # the informer's change count and the views and running pods read at it (see _all_views)
        self._kept_views: tuple[int, tuple[PodView, ...], frozenset[str]] | None = None
        self._gone: set[str] = set()  # pods deleted or finished since the last reconcile
        self._answers = AnswerMemo(tokens.verify)

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

    def _items(self) -> list[dict[str, Any]]:
        """The node's pods: the informer's, with a standing list's newer copies."""
        version = getattr(self._pods, "resource_version", None)  # read first: the items are at least as new
        return list(self._listed.merged(self._pods.items(), version))

    def _refresh(self, body: dict[str, Any] | None) -> list[dict[str, Any]] | None:
        """Take a LIST reply in (under the lock); the pods to read for this call when the list cannot
        stand in for the cache (None: read ``_items()``)."""
        if body is None:
            return None
        items = self._listed.replace(body)
        return None if self._listed.standing else items

    def _all_views(self, pods: list[dict[str, Any]] | None = None) -> list[PodView]:
        """The views of ``pods`` (None: the node's pods, ``_items()``), and ``_running`` set from them.

        Of the node's pods, the last answer is kept while the informer's cache has not changed
        (its ``changes`` count, read before the items) and no list stands in for it: the views are
        a function of the items (each of the ~4 calls per admission, and every reconcile, asks)."""
        changes = getattr(self._pods, "changes", None) if pods is None else None
        kept = self._kept_views
        if changes is not None and kept is not None and kept[0] == changes and not self._listed.standing:
            self._running = set(kept[2])
            return list(kept[1])
        views = []
        seen = set()
        running = set()
        for pod in self._items() if pods is None else pods:
            view = self._view(pod)
            uid = (pod.get("metadata") or {}).get("uid") or ""
            seen.add(uid)
            if (pod.get("status") or {}).get("phase") == "Running":
                running.add(uid)
            if view is not None:
                views.append(view)
        for uid in [u for u in self._views if u not in seen]:
            del self._views[uid]
        self._running = running
        if pods is None:
            self._kept_views = (changes, tuple(views), frozenset(running)) \
                if changes is not None and not self._listed.standing else None
        return views

    def _settled(self, views: list[PodView]) -> set[str]:
        return settled_pods(views, self._ledger, self._running)

    def _fetch_fresh(self) -> dict[str, Any] | None:
        """The LIST of the node's pods straight from the API (None: use the cache), for a cache that lags kubelet."""
        if self._fresh_pods is None:
            return None
        try:
            return self._fresh_pods()
        except Exception as error:
            log.warning("listing this node's pods for a cache miss failed: %s", error)
            return None

    # --- choosing the container kubelet is admitting ------------------------------------------

    def _choose(self, kind: str, count: int, ids: Sequence[str] | None, views: list[PodView]) -> Wanted | None:
        return choose(self._ledger, kind, count, ids, views, self._settled(views))

    def _rivals(self, count: int, views: list[PodView]) -> list[Key]:
        return rivals(self._ledger, count, views, self._settled(views))

    def _check_accountable(self, wanted: Wanted, kind: str, count: int, views: list[PodView]) -> None:
        """AllocationError when a pod we cannot account for could be the one kubelet is admitting
        with ``count`` devices of ``kind`` (under the lock): we refuse rather than guess."""
        others = unaccountable(self._ledger, kind, count, views, self._settled(views), self._running)
        if others:
            raise refuse_unaccountable(wanted, kind, count, self.names, others)

    def _certain(self, wanted: Wanted, count: int, views: list[PodView], fresh: bool) -> bool:
        """For a vcuda-core answer: no other waiting container could be the one kubelet is admitting
        (asked of the API server too, as our cache may lag kubelet's), so the answer may name its pod.
        AllocationError when the API server shows a pod we cannot account for that could be it."""
        key = (wanted.uid, wanted.index)
        with self._lock:
            certain = self._rivals(count, views) == [key]
        if fresh or self._fresh_pods is None:
            return certain
        body = self._fetch_fresh()
        if body is None:
            return False
        with self._lock:
            views = self._all_views(self._refresh(body))
            self._check_accountable(wanted, CORE, count, views)
            return certain and self._rivals(count, views) == [key]

    def _no_match(self, kind: str, count: int, views: list[PodView]) -> AllocationError:
        return no_match(self._ledger, self.node, self.names, kind, count, views, self._settled(views))

    def _metrics(self) -> str:
        return self._metrics_url() if callable(self._metrics_url) else self._metrics_url

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
            body = self._fetch_fresh()
            fresh = body is not None
            with self._lock:
                views = self._all_views(self._refresh(body))
                wanted = self._choose(kind, len(ids), ids, views)
                if wanted is None:
                    raise self._no_match(kind, len(ids), views)
        with self._lock:
            self._check_accountable(wanted, kind, len(ids), views)
        certain = kind == CORE and self._certain(wanted, len(ids), views, fresh)
        with self._lock:
            ledger = self._ledger
            key = (wanted.uid, wanted.index)
            if ledger.served_kind(key, kind):  # a concurrent call got there first
                raise self._no_match(kind, len(ids), views)
            cards = self._cards.by_index()
            existing = ledger.served.get(key)
            # a new answer: its id is recorded once it is certain who holds it
            allocation = replace(existing.allocation if existing else
                                 placement(wanted, ledger.overrides.get(key), cards, self.node), allocation_id="")
            if kind == CORE:
                check_fits(ledger, wanted, allocation, cards, self.node, self._cards.reason)
            served = existing or Served(key=key, namespace=wanted.namespace, pod=wanted.pod,
                                        container=wanted.container, allocation=allocation, identity_uid=wanted.uid)
            served.devices[kind] = ids
            ledger.served[key] = served
            ledger.overrides.pop(key, None)
            if kind == CORE:
                answer_id = new_allocation_id()
                # sure whose container this is: its record may name the answer now; else kubelet's
                # checkpoint has to say who holds it first
                served.allocation = replace(allocation, allocation_id=answer_id) if certain else allocation
                served.answered_at = time.monotonic()
                served.guessed = not certain
                ledger.given[ids] = (replace(allocation, allocation_id=answer_id), key)
                response = core_answer(self._enforcement, served, cards, node=self.node, allocation_id=answer_id,
                                       certain=certain, metrics_url=self._metrics(),
                                       token=self._tokens.mint(answer_id))
            else:
                response = memory_answer()
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
        body = self._fetch_fresh() if wanted is None else None
        with self._lock:
            if wanted is None:
                views = self._all_views(self._refresh(body))
                wanted = self._choose(kind, size, None, views)
            per_card: dict[int, int] = {}
            if wanted is not None:
                try:
                    key = (wanted.uid, wanted.index)
                    existing = self._ledger.served.get(key)
                    allocation = existing.allocation if existing else placement(
                        wanted, self._ledger.overrides.get(key), self._cards.by_index(), self.node)
                    per_card = quota(kind, allocation, size)
                except AllocationError as error:
                    log.info("GetPreferredAllocation: %s; leaving the choice to kubelet", error)
        return preferred_ids(available, must_include, size, per_card)

    # --- completion, annotations ----------------------------------------------------------------

    def _pod_complete(self, uid: str, views: Iterable[PodView]) -> bool:
        for view in views:
            if view.uid == uid:
                return all(self._ledger.container_complete(w) for w in view.containers)
        return False

    def desired_annotations(self, namespace: str, name: str) -> Desired | None:
        """The annotations that make the pod's record true now (None values: keys to remove) and the UID
        of the pod they are about; None when there is nothing to say. Our view of the node's pods may
        lag: under JupyterHub a restarted server is a new pod with the same name, so the UID, not the
        name, says whose record this is."""
        with self._lock:
            for view in self._all_views():
                if view.namespace != namespace or view.name != name or view.problem or not view.containers:
                    continue
                desired = desired_annotations(view, self._ledger, self._cards.by_index(), node=self.node,
                                              names=self.names, now=time.monotonic(), grace=self._confirm_grace)
                if desired is None:
                    return None
                if desired.unconfirmed and not view.assigned:
                    log.warning("pod %s/%s: kubelet's checkpoint did not confirm container(s) %s within %.0f s; "
                                "marking it assigned anyway, but their read tokens read nothing",
                                namespace, name, desired.unconfirmed, self._confirm_grace)
                return desired
        return None

    # --- restarts and reconciliation: plan, then apply ---------------------------------------------

    def _world(self, views: list[PodView]) -> World:
        self._answers.next_pass()
        return World(node=self.node, names=self.names, views=views, cards=self._cards.by_index(),
                     verify=self._answers.verify, answer_env=self._answers.env, now=time.monotonic())

    def _apply(self, plan: Plan) -> None:
        """Swap the planned ledger in (under the lock) and say what changed."""
        self._ledger = plan.ledger
        for level, message in plan.notes:
            log.log(level, "%s", message)

    def restore(self, entries: Iterable[PodDeviceEntry], *, checkpoint_complete: bool = False) -> int:
        """Rebuild the ledger after a restart from kubelet's checkpoint and the pod annotations.
        ``checkpoint_complete``: the entries are kubelet's whole record (its file exists and was read)."""
        with self._lock:
            views = self._all_views()
            plan = plan_restore(list(entries), self._world(views), checkpoint_complete=checkpoint_complete,
                                running=self._running)
            self._apply(plan)
            restored = len(self._ledger.served)
        log.info("restored %d served container(s) from kubelet's checkpoint and pod annotations", restored)
        for namespace, name in plan.dirty:
            self._on_pod_changed(namespace, name)
        return restored

    def reconcile(self, entries: Sequence[PodDeviceEntry]) -> set[tuple[str, str]]:
        """Match the ledger to what kubelet did; returns the pods whose annotations must change."""
        with self._lock:
            views = self._all_views()
            present = {(p.get("metadata") or {}).get("uid") or "" for p in self._items() if not claims.is_finished(p)}
            gone = gone_pods(self._ledger, self._gone, present, time.monotonic())
            self._gone.clear()
            plan = plan_reconcile(self._ledger, entries, self._world(views), gone)
            self._apply(plan)
        for namespace, name in plan.dirty:
            self._on_pod_changed(namespace, name)
        return plan.dirty

    def pod_gone(self, uid: str) -> None:
        """The pod was deleted or finished: what it holds is released at the next reconcile."""
        with self._lock:
            self._gone.add(uid)

    # --- views for others ---------------------------------------------------------------------

    def served(self) -> dict[Key, Served]:
        with self._lock:
            return dict(self._ledger.served)

    def usage(self) -> dict[int, tuple[int, int]]:
        """Card -> (cores, memory units) given out to admitted containers."""
        with self._lock:
            return self._ledger.usage()


