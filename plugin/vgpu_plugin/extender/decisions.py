"""Filter, prioritize and bind: the extender's decisions over the ledger.

Filter and prioritize only read. Per request shape the ledger keeps each node's verdict
and score, forgotten node by node when that node's accounting changes, so a filter over
a thousand names is a few set operations plus deciding the nodes that changed since.
A pod with one container is decided, and a refusal explained, from the node's
free-capacity summary (the placement policy's own rule, property-tested against it);
pods with several containers, scores and bind's choice of cards come from the
placement policy itself.

Bind is the only writer: under the pod's and the node's locks it chooses the card(s),
records the claim in the ledger at once (so concurrent filters see it), PATCHes the
pod's annotations, POSTs the Binding, and undoes what it did when a step fails.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from jupyter_vgpu.core import contract, placement
from jupyter_vgpu.core.contract import (
    CORES_PER_CARD,
    CardShare,
    ContainerAllocation,
    Names,
    PodAllocation,
    Request,
    RequestError,
)
from jupyter_vgpu.core.fragment import Mix, MixLearner, Shape
from jupyter_vgpu.core.placement import CardState, FragmentView, NodeState, PodPlacement

from .headroom import HostHeadroom, pod_cpu_memory
from .ledger import (
    TERMINATED_PHASES,
    Holding,
    Ledger,
    NodeEntry,
    ScoreCache,
    VerdictCache,
    node_cards,
    pod_holding,
)
from .wire import MAX_EXTENDER_PRIORITY, ExtenderArgs, ExtenderBindingArgs

log = logging.getLogger(__name__)


class APIFailure(Exception):
    """A Kubernetes call that failed. ``status`` is None when no answer came (timeout, reset)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class PodAPI(Protocol):
    """The few Kubernetes calls bind makes (see cluster.KubePodAPI)."""

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def patch_annotations(self, namespace: str, name: str,
                          annotations: Mapping[str, str | None]) -> dict[str, Any]: ...
    def bind(self, namespace: str, name: str, uid: str, node: str) -> None: ...


class PodProblem(ValueError):
    """The pod cannot be handled by this extender at all (no vGPU request)."""


@dataclass(frozen=True)
class PodAsk:
    """What a pod asks for, read once per request."""

    requests: dict[int, Request]
    policy: str
    key: tuple[Any, ...]      # hashable shape of the request, for memo keys
    invalid: str | None = None  # a reason no node can ever accept it


def describe_pod(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace') or 'default'}/{metadata.get('name') or '<unnamed>'}"


def read_ask(pod: Mapping[str, Any], names: Names, default_policy: str) -> PodAsk:
    """The pod's vGPU request and policy; PodProblem when it asks for no vGPU at all."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        requests = contract.pod_requests(pod, names)
    except RequestError as error:
        return PodAsk({}, default_policy, ("invalid", str(error)), invalid=str(error))
    if not requests:
        raise PodProblem(
            f"pod {describe_pod(pod)} asks for no vGPU ({names.core_resource} / {names.memory_resource}); "
            f"this extender only handles pods that do: list both resources under managedResources "
            f"in the scheduler configuration"
        )
    policy = annotations.get(names.policy, default_policy)
    if policy not in placement.POLICIES:
        reason = (f"annotation {names.policy}={policy!r} is not a placement policy "
                  f"(use one of {', '.join(placement.POLICIES)})")
        return PodAsk({}, default_policy, ("invalid", reason), invalid=reason)
    key = tuple(sorted((i, r.cores, r.memory_units) for i, r in requests.items()))
    return PodAsk(requests, policy, (policy, key))


def node_state(entry: NodeEntry) -> NodeState:
    state = entry.memo.get("state")
    if state is None:
        state = NodeState(
            cards=tuple(
                CardState(index=card.index, memory_units=card.memory_units, healthy=card.healthy,
                          used_cores=entry.used_cores[i], used_memory_units=entry.used_memory[i])
                for i, card in enumerate(entry.cards)
            ),
            topology=entry.topology,
        )
        entry.memo["state"] = state
    return state


def _fits_alone(entry: NodeEntry, request: Request) -> bool:
    """Whether one container's request fits, from the free-capacity summary (exact).

    A share needs one healthy card with the cores and the memory free; n whole cards need
    n healthy untouched cards whose memory covers any declared amount (the n largest do
    if any n do). This is the placement policy's own rule, without its ranking work.
    """
    if request.is_share:
        cores, memory = request.cores, request.memory_units
        return any(f.free_cores >= cores and f.free_memory_units >= memory for f in entry.free)
    intact = [f.free_memory_units for f in entry.free if f.whole]
    if len(intact) < request.cards:
        return False
    return not request.memory_units or sum(sorted(intact)[-request.cards:]) >= request.memory_units


def _fits_empty(entry: NodeEntry, request: Request) -> bool:
    """Whether one container's request would fit with every card free (cards and health only)."""
    sizes = sorted(card.memory_units for card in entry.cards if card.healthy)
    if request.is_share:
        return bool(sizes) and sizes[-1] >= request.memory_units
    return len(sizes) >= request.cards and sum(sizes[-request.cards:]) >= request.memory_units


def _refusal_alone(entry: NodeEntry, request: Request) -> str:
    """Why one container's request does not fit now, from the free-capacity summary."""
    free = entry.free
    if request.is_share:
        cores, memory = request.cores, request.memory_units
        best = max(free, key=lambda f: (min(f.free_cores, cores) * memory + min(f.free_memory_units, memory) * cores,
                                        f.free_cores, f.free_memory_units))
        return (f"needs {cores} cores and {_mib(memory)} on one card; largest free share is "
                f"{best.free_cores} cores / {_mib(best.free_memory_units)} on card {best.index}")
    n = request.cards
    asked = f"asked for {n} whole card{'s' if n > 1 else ''}"
    intact = [f for f in free if f.whole]
    if not intact:
        return f"no whole card free on this node; {asked}"
    if len(intact) < n:
        return (f"only {len(intact)} whole card{'s' if len(intact) > 1 else ''} free "
                f"({', '.join(str(f.index) for f in intact)}); {asked}")
    largest = sum(sorted(f.free_memory_units for f in intact)[-n:])
    return f"{asked} with {_mib(request.memory_units)} in total, but the {n} largest free cards have {_mib(largest)}"


def _mib(units: int) -> str:
    return contract.format_mib(units * contract.MEMORY_UNIT_MIB)


def fit(entry: NodeEntry, ask: PodAsk) -> tuple[str | None, bool]:
    """(reason it does not fit or None, whether no preemption could ever help). Memoised.

    A pod with one container is decided, and a refusal explained, from the free-capacity
    summary; several containers by the placement policy itself. Whether a node could
    ever take the pod (with every card free) is decided once per set of cards.
    """
    key = ("fit", ask.key)
    verdict = entry.memo.get(key)
    if verdict is not None:
        return verdict
    if ask.invalid:
        verdict = (ask.invalid, True)
    elif not entry.cards:
        verdict = (entry.problem or "no vGPU cards", True)
    else:
        requests = ask.requests
        only = next(iter(requests.values())) if len(requests) == 1 else None
        if only is not None and _fits_alone(entry, only):
            verdict = (None, False)
        elif (never := _never_reason(entry, ask)) is not None:
            verdict = (never, True)
        elif only is not None:
            verdict = (_refusal_alone(entry, only), False)
        else:
            result = placement.place_pod(node_state(entry), requests, ask.policy)
            verdict = (None, False) if isinstance(result, placement.PodPlacement) else (result.reason, False)
    _remember(entry.memo, key, verdict)
    return verdict


def _never_reason(entry: NodeEntry, ask: PodAsk) -> str | None:
    """Why the pod could not fit even on this node emptied, or None. Memoised per set of cards."""
    key = ("never", ask.key)
    if key not in entry.static_memo:
        if len(ask.requests) == 1 and _fits_empty(entry, next(iter(ask.requests.values()))):
            reason = None
        else:
            result = placement.place_pod(node_state(entry).emptied(), ask.requests, ask.policy)
            reason = (None if isinstance(result, placement.PodPlacement)
                      else f"{result.reason} (even with every card free)")
        _remember(entry.static_memo, key, reason)
        return reason
    return entry.static_memo[key]  # type: ignore[no-any-return]


MEMO_LIMIT = 512
"""Entries a node's memo keeps before starting over: request shapes are many over a long life."""


def _remember(memo: dict[Any, Any], key: Any, value: Any) -> None:
    if len(memo) >= MEMO_LIMIT:
        memo.clear()
    memo[key] = value


def score(entry: NodeEntry, ask: PodAsk) -> int:
    key = ("score", ask.key)
    value = entry.memo.get(key)
    if value is None:
        if fit(entry, ask)[0] is not None:
            value = 0
        else:
            value = placement.score_node(node_state(entry), ask.requests, ask.policy)
            value = max(0, min(MAX_EXTENDER_PRIORITY, int(value)))
        _remember(entry.memo, key, value)
    return value


class _StripedLocks:
    """A fixed set of locks picked by hashing a key: per-key exclusion without bookkeeping."""

    def __init__(self, count: int = 128) -> None:
        self._locks = [threading.Lock() for _ in range(count)]

    def __call__(self, key: str) -> threading.Lock:
        return self._locks[zlib.crc32(key.encode()) % len(self._locks)]


# How many pod uids the task-mix learner remembers having counted (a pod is prioritized
# once per scheduling attempt; it counts once).
_SEEN_PODS = 4096
# The fragment policy decides with a snapshot of the learned mix, refreshed at each of the
# first pods and then every this many, so that its scores can be memoised per node between
# refreshes (a prioritize over 1,000 nodes would otherwise score every node afresh).
_MIX_REFRESH = 16


class Decisions:
    def __init__(self, ledger: Ledger, api: PodAPI | None, names: Names = contract.DEFAULT_NAMES,
                 policy: str = "binpack", hosts: HostHeadroom | None = None) -> None:
        if policy not in placement.POLICIES:
            raise ValueError(f"policy {policy!r} is not one of {', '.join(placement.POLICIES)}")
        self.ledger = ledger
        self.api = api
        self.names = names
        self.policy = policy
        self.hosts = hosts if hosts is not None else HostHeadroom()
        self.mix = MixLearner()  # the task mix of the pods seen, for the fragment policy
        self._mix_view = (0, Mix())  # (version, snapshot) the fragment policy decides with
        self._observed = 0
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._seen_lock = threading.Lock()
        self._pod_locks = _StripedLocks()
        self._node_locks = _StripedLocks()

    # --- filter and prioritize (read-only) ------------------------------------------

    def _entries(self, args: ExtenderArgs) -> list[tuple[str, NodeEntry | None]]:
        """(name, entry) per candidate; without node cache, the request's Node objects give the cards."""
        if args.cache_mode:
            return [(name, self.ledger.node(name)) for name in args.candidate_names]
        result = []
        for node in args.nodes or []:
            name = node["metadata"]["name"]
            entry = self.ledger.node(name)
            if entry is None or not entry.known:
                # a node our watch has not delivered yet: a throwaway entry from the request
                cards = node_cards(node, self.names)
                temp = NodeEntry(name, cards.cards, cards.topology, cards.source, cards.problem, True,
                                 pods=dict(entry.pods) if entry else {})
                temp.recount()
                entry = temp
            result.append((name, entry))
        return result

    def filter(self, args: ExtenderArgs) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """(passed, failed, failed and unresolvable). PodProblem when the pod asks for no vGPU."""
        ask = read_ask(args.pod, self.names, self.policy)
        names = args.candidate_names
        if ask.invalid:
            return [], {}, dict.fromkeys(names, ask.invalid)
        if not args.cache_mode:
            return self._filter_entries(args, ask)
        with self.ledger.lock:
            cache = self.ledger.cache(("fit", ask.key), VerdictCache)
            known = cache.values
            unseen: dict[str, str] = {}
            nodes = self.ledger.nodes
            wanted = set(names)
            for name in wanted.difference(known):
                entry = nodes.get(name)
                if entry is None or not entry.known:
                    unseen[name] = "the extender has not seen this node yet"
                else:
                    cache.set(name, fit(entry, ask))
            passing, failing, never = cache.passing, cache.failed, cache.unresolvable
            passed = [n for n in names if n in passing]
            failed = {n: failing[n] for n in wanted.intersection(failing)}
            unresolvable = {n: never[n] for n in wanted.intersection(never)}
        failed.update(unseen)
        return passed, failed, unresolvable

    def _filter_entries(self, args: ExtenderArgs, ask: PodAsk) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """Without the node cache: the request's Node objects, one by one."""
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        with self.ledger.lock:
            for name, entry in self._entries(args):
                if entry is None or not entry.known:
                    failed[name] = "the extender has not seen this node yet"
                    continue
                reason, never = fit(entry, ask)
                if reason is None:
                    passed.append(name)
                elif never:
                    unresolvable[name] = reason
                else:
                    failed[name] = reason
        return passed, failed, unresolvable

    def prioritize(self, args: ExtenderArgs) -> list[tuple[str, int]]:
        ask = read_ask(args.pod, self.names, self.policy)
        if ask.invalid:
            raise PodProblem(f"pod {describe_pod(args.pod)}: {ask.invalid}")
        if ask.policy == "fragment":
            return self._prioritize_fragment(args, ask)
        with self.ledger.lock:
            if not args.cache_mode:
                return [(name, score(entry, ask) if entry is not None and entry.known else 0)
                        for name, entry in self._entries(args)]
            cache = self.ledger.cache(("score", ask.key), ScoreCache)
            nodes = self.ledger.nodes
            for name in [n for n in args.candidate_names if n not in cache]:
                entry = nodes.get(name)
                if entry is not None and entry.known:
                    cache[name] = score(entry, ask)
            return [(name, cache.get(name, 0)) for name in args.candidate_names]

    def _fragment_view(self, pod: Mapping[str, Any], ask: PodAsk, learn: bool) -> FragmentView:
        """The mix learned so far (this pod counted once, when ``learn``) and the pod's CPU/memory."""
        cpu, memory = pod_cpu_memory(pod)
        if learn:
            uid = str((pod.get("metadata") or {}).get("uid") or describe_pod(pod))
            with self._seen_lock:
                new = uid not in self._seen
                self._seen[uid] = None
                if len(self._seen) > _SEEN_PODS:
                    self._seen.popitem(last=False)
            shape = Shape.of_pod(ask.requests, cpu, memory)
            if new and shape is not None:
                self.mix.observe(shape)
                with self._seen_lock:
                    self._observed += 1
                    if self._observed <= _MIX_REFRESH or self._observed % _MIX_REFRESH == 0:
                        self._mix_view = (self._mix_view[0] + 1, self.mix.mix())
        return FragmentView(self._mix_view[1], cpu, memory)

    @property
    def mix_snapshot(self) -> Mix:
        """The learned mix the fragment policy decides with now."""
        return self._mix_view[1]

    def _fragment_state(self, name: str, entry: NodeEntry) -> NodeState:
        return replace(node_state(entry), headroom=self.hosts.headroom(name))

    def _prioritize_fragment(self, args: ExtenderArgs, ask: PodAsk) -> list[tuple[str, int]]:
        """Scores that depend on the mix snapshot and on CPU/memory headroom, memoised per node
        under both (the node's memo is cleared whenever its vGPU accounting changes)."""
        view = self._fragment_view(args.pod, ask, learn=True)
        version = self._mix_view[0]
        for node in args.nodes or []:  # full Node objects carry allocatable
            self.hosts.on_node("MODIFIED", node)
        out = []
        with self.ledger.lock:
            for name, entry in self._entries(args):
                value = 0
                if entry is not None and entry.known and fit(entry, ask)[0] is None:
                    headroom = self.hosts.headroom(name)
                    key = ("fragment", ask.key, view.cpu_milli, view.memory_mib, version, headroom)
                    cached = entry.memo.get(key)
                    if cached is None:
                        cached = placement.score_node(replace(node_state(entry), headroom=headroom), ask.requests,
                                                      ask.policy, view=view)
                        _remember(entry.memo, key, cached)
                    value = int(cached)
                out.append((name, max(0, min(MAX_EXTENDER_PRIORITY, int(value)))))
        return out

    # --- bind (the only writer) -------------------------------------------------------

    @property
    def _api(self) -> PodAPI:
        if self.api is None:  # bind() checks first; this is for the helpers it calls
            raise RuntimeError("no Kubernetes API")
        return self.api

    def bind(self, args: ExtenderBindingArgs) -> str:
        """Bind the pod; '' on success, else the reason (nothing is left changed then)."""
        if self.api is None:
            return "this extender has no Kubernetes API access and cannot bind"
        where = f"pod {args.pod_namespace}/{args.pod_name}"
        with self._pod_locks(f"{args.pod_namespace}/{args.pod_name}"), self._node_locks(args.node):
            try:
                pod = self._api.get_pod(args.pod_namespace, args.pod_name)
            except APIFailure as error:
                return f"cannot read {where}: {error}"
            if pod is None:
                return f"{where} not found"
            metadata = pod.get("metadata") or {}
            uid = metadata.get("uid") or ""
            if args.pod_uid and uid and args.pod_uid != uid:
                return (f"{where} has UID {uid}, not {args.pod_uid}: "
                        f"it was deleted and created again since it was scheduled")
            if (pod.get("status") or {}).get("phase") in TERMINATED_PHASES:
                return f"{where} has already terminated"
            try:
                ask = read_ask(pod, self.names, self.policy)
            except PodProblem as problem:
                return str(problem)
            if ask.invalid:
                return f"{where}: {ask.invalid}"
            current = pod_holding(pod, self.names)
            bound = (pod.get("spec") or {}).get("nodeName") or ""
            if bound:
                if bound != args.node:
                    return f"{where} is already bound to node {bound}"
                if isinstance(current, Holding):
                    self._adopt(current)
                    return ""  # a repeated bind: already done, nothing more to allocate
                return f"{where} is already bound to {bound} without a card assignment"
            if isinstance(current, Holding) and current.node == args.node:
                # annotated by an earlier attempt that did not get to bind: reuse its cards
                self._adopt(current)
                return self._post_binding(pod, args, uid, patched=None)
            return self._allocate_and_bind(pod, args, uid, ask)

    def _adopt(self, holding: Holding) -> None:
        with self.ledger.lock:
            known = self.ledger.holding(holding.uid)
            if known is None or not known.same_claim(holding):
                self.ledger.put(holding)

    def _allocate_and_bind(self, pod: dict[str, Any], args: ExtenderBindingArgs, uid: str,
                           ask: PodAsk) -> str:
        where = f"pod {args.pod_namespace}/{args.pod_name}"
        with self.ledger.lock:
            entry = self.ledger.node(args.node)
            if entry is None or not entry.known or not entry.cards:
                problem = entry.problem if entry is not None and entry.problem else "no vGPU cards known"
                return f"node {args.node}: {problem}"
            if ask.policy == "fragment":
                result = placement.place_pod(self._fragment_state(args.node, entry), ask.requests, ask.policy,
                                             view=self._fragment_view(pod, ask, learn=False))
            else:
                result = placement.place_pod(node_state(entry), ask.requests, ask.policy)
            if isinstance(result, placement.Refusal):
                return f"{where} does not fit on node {args.node} any more: {result.reason}"
            allocation = self._allocation(pod, args.node, entry, result, ask.policy)
            holding = Holding(uid, args.pod_namespace, args.pod_name, args.node, allocation.containers,
                              assumed=True, assumed_at=time.monotonic())
            previous = self.ledger.put(holding)
        try:
            patched = self._api.patch_annotations(args.pod_namespace, args.pod_name,
                                                 contract.predicate_annotations(allocation, self.names))
        except APIFailure as error:
            self._restore(holding, previous)
            return f"cannot annotate {where}: {error}"
        rv = _resource_version(patched)
        if rv is not None:
            with self.ledger.lock:
                if self.ledger.holding(uid) is holding:
                    self.ledger.put(replace(holding, min_resource_version=rv))
        return self._post_binding(pod, args, uid, patched=holding)

    def _post_binding(self, pod: dict[str, Any], args: ExtenderBindingArgs, uid: str, *,
                      patched: Holding | None) -> str:
        """POST the Binding; after a failure, undo our annotations and our claim."""
        where = f"pod {args.pod_namespace}/{args.pod_name}"
        try:
            self._api.bind(args.pod_namespace, args.pod_name, uid, args.node)
            return ""
        except APIFailure as error:
            failure = f"cannot bind {where} to {args.node}: {error}"
        # The answer may have been lost after the API server bound it: look before undoing.
        try:
            now = self._api.get_pod(args.pod_namespace, args.pod_name)
        except APIFailure:
            now = None
        if now is not None and (now.get("spec") or {}).get("nodeName") == args.node:
            return ""
        if patched is None:
            return failure  # the annotations predate this call; the claim stays as the API shows it
        removal: dict[str, str | None] = {
            key: None for key in (self.names.predicate_node, self.names.predicate_time,
                                  self.names.gpu_assigned, self.names.allocation)
        }
        for container in patched.containers:
            removal[self.names.predicate_gpu_idx(container.index)] = None
        try:
            self._api.patch_annotations(args.pod_namespace, args.pod_name, removal)
        except APIFailure as error:
            # the pod still carries our annotations: keep the claim the API shows
            log.warning("%s: could not remove annotations after a failed bind: %s", where, error)
            return failure
        self._restore(patched, None)
        return failure

    def _restore(self, ours: Holding, previous: Holding | None) -> None:
        """Take our claim back out of the ledger, and put back what the pod held before."""
        with self.ledger.lock:
            if self.ledger.holding(ours.uid) is not None:
                self.ledger.drop(ours.uid)
            if previous is not None:
                self.ledger.put(previous)

    def _allocation(self, pod: Mapping[str, Any], node: str, entry: NodeEntry,
                    result: PodPlacement, policy: str) -> PodAllocation:
        containers = (pod.get("spec") or {}).get("containers") or []
        cards = {card.index: card for card in entry.cards}
        allocated = []
        for index, shares in sorted(result.containers.items()):
            name = (containers[index].get("name") or "") if index < len(containers) else ""
            allocated.append(ContainerAllocation(index, name, tuple(
                CardShare(card, cards[card].uuid, cores,
                          cards[card].memory_units if cores >= CORES_PER_CARD else memory)
                for card, cores, memory in shares
            )))
        return PodAllocation(node, tuple(allocated), assigned_at_ns=time.time_ns(), policy=policy)


def _resource_version(obj: Mapping[str, Any] | None) -> int | None:
    value = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None
