"""Filter, prioritize and bind: the extender's decisions over the ledger.

Filter and prioritize only read. Their answers are cached per node and per request shape
(``cache.py``), forgotten node by node when that node's accounting changes, so a filter
over a thousand names is a few array operations over the names' slots plus deciding the
nodes that changed since.
A pod with one container is decided, and a refusal explained, from the node's
free-capacity summary (``core.claims``' rule, property-tested against the placement
policy); pods with several containers, scores and bind's choice of cards come from the
placement policy itself.

A pod's own claim never counts against it: a pod whose earlier bind was interrupted
after the claim was written is filtered, scored and bound as if it held nothing.

Bind is the only writer: under the pod's and the node's locks it chooses the card(s),
records the claim in the ledger at once (so concurrent filters see it), and POSTs one
Binding whose annotations the API server copies onto the pod together with nodeName
(kube-apiserver's ``setPodHostAndAnnotations``): the claim and the binding land in one
write or not at all, so a refused Binding leaves nothing to undo but the ledger's claim.
When an earlier claim left card keys this one
does not cover, they are removed with a PATCH first (a Binding can only add keys).
Cards a pod already names (``predicate-gpu-idx-<i>``, written by anyone) are adopted
only when they still have room for it; otherwise the pod is placed afresh.
A bind waits (bounded) while another pod on the node that kubelet has not admitted yet asks
for as many vcuda-core with another answer: kubelet's Allocate could not tell the two apart
(``RivalWait``, docs/design.md). ``bind_step`` stops where it would wait, so the server waits
on its loop (rival_waits.py) holding no bind worker; ``bind`` waits on the calling thread.

The pod is read from the watch's copy, without a GET, only when nothing of this extender's
can be newer than that copy (see ``Decisions._watched_copy``); the API server, not the copy,
decides whether the pod can still be bound, and a refused Binding leaves the ledger saying
what the API read after the refusal says.
"""

from __future__ import annotations

import functools
import itertools
import logging
import operator
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Protocol

import numpy as np

from jupyter_vgpu.core import claims, contract, fgd, node_placement, placement
from jupyter_vgpu.core.contract import (
    CardShare,
    ContainerAllocation,
    Names,
    PodAllocation,
    Request,
    RequestError,
)
from jupyter_vgpu.core.fragment import Mix, MixLearner, Shape
from jupyter_vgpu.core.mig import wants_isolation
from jupyter_vgpu.core.mig_placement import SlicePlacement
from jupyter_vgpu.core.placement import CardState, FragmentView, NodeState

from ..informer import resource_version
from .cache import (
    FAILS,
    NEVER,
    PASSES,
    UNDECIDED,
    DecisionCache,
    NodeMemo,
    ScoreCache,
    VerdictCache,
    remember,
)
from .fgd_batch import CountMemo, LevelMemo, MixArrays, NodeRows, RequestColumns
from .fgd_few import falls_few_lists, stored_levels_lists
from .headroom import HostHeadroom, pod_cpu_memory
from .inflight import InFlight, shapes_rival
from .ledger import (
    Holding,
    Ledger,
    NodeEntry,
    Unattributed,
    node_cards,
    pod_holding,
    pod_key,
    rival,
    shape_rival,
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
    def bind(self, namespace: str, name: str, uid: str, node: str,
             annotations: Mapping[str, str] | None = None) -> None:
        """POST the Binding; the API server copies its ``annotations`` onto the pod with nodeName."""


WatchedPods = Callable[[str, str], Mapping[str, Any] | None]
"""The watch's copy of a pod by namespace and name (``Informer.get``), None when it has none."""


class _CopyOutdated(Exception):
    """The watch's copy a bind started from is no longer the newest the extender has seen."""


@dataclass(frozen=True)
class RivalWait:
    """``Decisions.bind_step``'s answer when the bind must wait for ``other``, a pod on ``node`` that
    kubelet has not admitted yet and could not tell from this one (``how``); nothing was claimed.
    The bind is tried again once ``settled``, or refused (``Decisions.rival_refusal``)."""

    other: Holding
    how: str
    node: str

    def settled(self, ledger: Ledger) -> bool:
        """Whether kubelet has admitted the other pod, or it left the node (deleted, moved)."""
        now = ledger.holding(self.other.uid)
        return now is None or now.node != self.node or not now.unserved


class _RivalUnserved(Exception):
    """Raised from under the node's lock, out to ``_bind_pod``: the bind must wait (``wait``)."""

    def __init__(self, wait: RivalWait) -> None:
        super().__init__(wait.how)
        self.wait = wait


RIVAL_WAIT = 20.0
"""Default seconds a bind waits for such a pod to be admitted: under kube-scheduler's extender
httpTimeout (30 s in deploy/scheduler/config.yaml), with room for the bind's own API calls."""

ADMISSION_BACKLOG = 4
"""Default number of our pods a node's kubelet may have still to admit before the filter prefers
other nodes that fit (``Decisions._away_from_rivals``)."""


class PodProblem(ValueError):
    """The pod cannot be handled by this extender at all (no vGPU request)."""


@dataclass(frozen=True)
class PodAsk:
    """What a pod asks for, read once per request."""

    requests: dict[int, Request]
    policy: str
    key: tuple[Any, ...]      # hashable shape of the request, for memo keys
    invalid: str | None = None  # a reason no node can ever accept it
    isolated: bool = False    # asks for a MIG slice only (``Names.isolation``)


class Filtered(NamedTuple):
    """A filter's answer: the nodes that pass, why the others do not, and how many do not.

    The reasons (node -> why) are given only when no node passes. kube-scheduler reads an
    extender's FailedNodes and FailedAndUnresolvableNodes only into the statuses of the pod's
    scheduling diagnosis (``findNodesThatPassExtenders``), which it uses only when no node is
    left: the FailedScheduling message ("0/N nodes are available: ...") and preemption. With a
    node passing, hundreds of reasons were encoded, sent and decoded to be dropped, on
    kube-scheduler's serial scheduling cycle (docs/design.md). The counts are always given:
    the metrics count each refusal."""

    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    failed_count: int
    unresolvable_count: int


def _reasons_where(names: list[str], reasons: np.ndarray, where: np.ndarray) -> dict[str, str]:
    """{name: reason} of the names where ``where`` holds, in the names' order (``reasons``: by position)."""
    if not np.count_nonzero(where):
        return {}
    return dict(zip(itertools.compress(names, where.tobytes()), reasons[where].tolist(), strict=True))


_PASSING = bytes(int(kind == PASSES) for kind in range(256))
"""``bytes.translate`` table: a verdict's kind to 1 where it passes, else 0."""


def _positions(data: bytes, value: int) -> Iterator[int]:
    """Where ``value`` is in ``data``, in order (``bytes.find``: no array built for a few)."""
    at = data.find(value)
    while at >= 0:
        yield at
        at = data.find(value, at + 1)


class _Passing(Sequence[str]):
    """The names that pass (``where``: one byte per name, 1 where it passes), as strings only
    where read: fgd-filter's pick reads none of hundreds in the usual case, so the list of
    them all is not built on its way (``Decisions.filter``)."""

    def __init__(self, names: list[str], where: bytes, count: int) -> None:
        self._names, self._where, self._count = names, where, count
        self._at: list[int] | None = None

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        return itertools.compress(self._names, self._where)

    def __getitem__(self, i: Any) -> Any:
        if self._at is None:
            self._at = list(_positions(self._where, 1))
        if isinstance(i, slice):
            return [self._names[at] for at in self._at[i]]
        return self._names[self._at[operator.index(i)]]  # numpy integers too


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
    try:
        isolated = wants_isolation(annotations, names)
    except RequestError as error:
        return PodAsk({}, default_policy, ("invalid", str(error)), invalid=str(error))
    key = tuple(sorted((i, r.cores, r.memory_units) for i, r in requests.items()))
    return PodAsk(requests, policy, (policy, key, isolated), isolated=isolated)


def ask_shapes(ask: PodAsk) -> set[tuple[int, int, bool]]:
    """``ledger.answer_shape`` of the answers the pod's containers would get, as far as the ask
    tells (a MIG slice is assumed exactly when the pod asks for isolation)."""
    return {(r.cores, 0 if claims.is_whole_card(r.cores) else r.memory_units, ask.isolated)
            for r in ask.requests.values()}


def on_slices(entry: NodeEntry, ask: PodAsk) -> bool:
    """Whether MIG slices or the node's sharing mode take part in this pod's placement here."""
    return not node_placement.plain(entry.slices, entry.sharing, ask.isolated)


def place_here(entry: NodeEntry, ask: PodAsk, state: NodeState,
               held: Collection[str] | None = None) -> node_placement.NodePlacement | placement.Refusal:
    return node_placement.place(state, entry.slices, entry.held_slices if held is None else held,
                                ask.requests, ask.policy, entry.sharing, ask.isolated)


def node_state(entry: NodeEntry, memo: NodeMemo) -> NodeState:
    state = memo.live.get("state")
    if state is None:
        state = NodeState(
            cards=tuple(
                CardState(index=card.index, memory_units=card.memory_units, healthy=card.healthy,
                          used_cores=entry.used_cores[i], used_memory_units=entry.used_memory[i])
                for i, card in enumerate(entry.cards)
            ),
            topology=entry.topology,
        )
        memo.live["state"] = state
    return state


def fit(entry: NodeEntry, ask: PodAsk, memo: NodeMemo) -> tuple[str | None, bool]:
    """(reason it does not fit or None, whether no preemption could ever help). Memoised.

    A pod with one container is decided, and a refusal explained, from the free-capacity
    summary (``claims.fits_alone``); several containers by the placement policy itself.
    Whether a node could ever take the pod (with every card free) is decided once per set
    of cards.
    """
    key = ("fit", ask.key)
    verdict = memo.live.get(key)
    if verdict is not None:
        return verdict  # type: ignore[no-any-return]
    if ask.invalid:
        verdict = (ask.invalid, True)
    elif not entry.cards:
        verdict = (entry.problem or "no vGPU cards", True)
    elif on_slices(entry, ask):
        found = place_here(entry, ask, node_state(entry, memo))
        if isinstance(found, node_placement.NodePlacement):
            verdict = (None, False)
        else:
            empty = place_here(entry, ask, node_state(entry, memo).emptied(), held=())
            verdict = (found.reason, isinstance(empty, placement.Refusal))
    else:
        requests = ask.requests
        only = next(iter(requests.values())) if len(requests) == 1 else None
        if only is not None and claims.fits_alone(entry.free, only):
            verdict = (None, False)
        elif (never := _never_reason(entry, ask, memo)) is not None:
            verdict = (never, True)
        elif only is not None:
            verdict = (claims.refusal_alone(entry.free, only), False)
        else:
            result = placement.place_pod(node_state(entry, memo), requests, ask.policy)
            verdict = (None, False) if isinstance(result, placement.PodPlacement) else (result.reason, False)
    remember(memo.live, key, verdict)
    return verdict


def _never_reason(entry: NodeEntry, ask: PodAsk, memo: NodeMemo) -> str | None:
    """Why the pod could not fit even on this node emptied, or None. Memoised per set of cards."""
    key = ("never", ask.key)
    if key not in memo.static:
        healthy = [card.memory_units for card in entry.cards if card.healthy]
        if len(ask.requests) == 1 and claims.fits_empty(healthy, next(iter(ask.requests.values()))):
            reason = None
        else:
            result = placement.place_pod(node_state(entry, memo).emptied(), ask.requests, ask.policy)
            reason = (None if isinstance(result, placement.PodPlacement)
                      else f"{result.reason} (even with every card free)")
        remember(memo.static, key, reason)
        return reason
    return memo.static[key]  # type: ignore[no-any-return]


def score(entry: NodeEntry, ask: PodAsk, memo: NodeMemo) -> int:
    key = ("score", ask.key)
    value = memo.live.get(key)
    if value is None:
        if fit(entry, ask, memo)[0] is not None:
            value = 0
        elif on_slices(entry, ask):
            value = node_placement.score(node_state(entry, memo), entry.slices, entry.held_slices, ask.requests,
                                         ask.policy, entry.sharing, ask.isolated)
        else:
            value = placement.score_node(node_state(entry, memo), ask.requests, ask.policy)
            value = max(0, min(MAX_EXTENDER_PRIORITY, int(value)))
        remember(memo.live, key, value)
    return value  # type: ignore[no-any-return]


def typical_shape(pod: Mapping[str, Any], ask: PodAsk, cpu: int | None = None) -> Shape | None:
    """What fgd-filter learns of a pod: its largest container's GPU request (a share's memory
    aside: the measure counts compute), its CPU request and its node selector. ``cpu``: the
    pod's CPU request when the caller has read it. Memoised by (request, CPU, selector)."""
    if cpu is None:
        cpu, _ = pod_cpu_memory(pod)
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    items = tuple(sorted({f"{k}={v}" for k, v in selector.items() if isinstance(k, str) and k
                          and isinstance(v, str)})) if isinstance(selector, Mapping) and selector else ()
    key = (ask.key, cpu, items)
    known = _TYPICAL_SHAPES.get(key)
    if known is not None:
        return known[0]
    shape = Shape.of_pod(ask.requests, cpu)
    found = None if shape is None else replace(shape, memory_units=0, selector=items)
    if len(_TYPICAL_SHAPES) >= _TYPICAL_SHAPES_KEPT:
        _TYPICAL_SHAPES.clear()
    _TYPICAL_SHAPES[key] = (found,)
    return found


# typical_shape's answers (in a 1-tuple: None is an answer): a few request shapes, CPU requests
# and selectors repeat over every pod
_TYPICAL_SHAPES: dict[tuple[Any, ...], tuple[Shape | None]] = {}
_TYPICAL_SHAPES_KEPT = 1024


def preset_refusal(state: NodeState, holding: Holding) -> str | None:
    """Why the cards a pod already names have no room for it on ``state`` (which excludes it), or None."""
    for container, share in holding.shares():
        try:
            card = state.card(share.index)
        except KeyError:
            return f"container {container}: the node has no card {share.index}"
        memory = claims.held_memory_units(share.cores, share.memory_units, card.memory_units)
        if not card.healthy:
            return f"container {container}: card {share.index} is unhealthy"
        if claims.is_whole_card(share.cores) and not card.is_free:
            return f"container {container}: card {share.index} is not free for a whole-card claim"
        if not card.fits_share(share.cores, memory):
            return (f"container {container}: card {share.index} has {card.free_cores} cores / "
                    f"{card.free_memory_units} memory units free, the claim needs {share.cores} / {memory}")
        state = replace(state, cards=tuple(c.holding(share.cores, memory) if c.index == share.index else c
                                           for c in state.cards))
    return None


def slice_refusal(entry: NodeEntry, share: CardShare) -> str | None:
    """Why a share cannot hold the MIG slice it names on this node (which excludes its pod), or None."""
    found = next((s for s in entry.slices if s.uuid == share.mig_device), None)
    if found is None or found.card != share.index:
        return f"no MIG slice {share.mig_device} on card {share.index}"
    if share.mig_device in entry.held_slices:
        return f"MIG slice {share.mig_device} is held by another pod"
    if not found.slice.fits(Request(share.cores, share.memory_units)):
        return f"{found.describe()} is unhealthy or smaller than {share.cores} cores / {share.memory_units} units"
    if not entry.sharing.slices_serve(found.card, True):
        return f"card {found.card} serves no MIG slices ({entry.sharing.of(found.card)})"
    return None


class _StripedLocks:
    """A fixed set of locks picked by hashing a key: per-key exclusion without bookkeeping."""

    def __init__(self, count: int = 128) -> None:
        self._locks = [threading.Lock() for _ in range(count)]

    def __call__(self, key: str) -> threading.Lock:
        return self._locks[zlib.crc32(key.encode()) % len(self._locks)]


# How many pod uids each task-mix learner remembers having counted (the fragment policy's: a
# pod is prioritized once per scheduling attempt; fgd-filter's: a repeated bind of a bound pod;
# each counts once).
_SEEN_PODS = 4096
# The fragment policy decides with a snapshot of the learned mix, refreshed at each of the
# first pods and then every this many, so that its scores can be memoised per node between
# refreshes (a prioritize over 1,000 nodes would otherwise score every node afresh).
_MIX_REFRESH = 16
# fgd-filter: levels memoised for this many (request, pod CPU, snapshot) keys
_FGD_MEMOS = 32
# fgd-filter: at most this many rows to re-score go through the pure-Python path (fgd_few),
# more through the numpy batch, whose ~90 array calls cost more than this many rows in Python
_FGD_FEW_ROWS = 4


def _refresh_due(observed: int) -> bool:
    """A learned mix's snapshot is renewed at each of the first pods, then every ``_MIX_REFRESH``."""
    return observed <= _MIX_REFRESH or observed % _MIX_REFRESH == 0


class Decisions:
    """``schedulers``: the scheduler names whose unbound pods' claims count (None: any)."""

    def __init__(self, ledger: Ledger, api: PodAPI | None, names: Names = contract.DEFAULT_NAMES,
                 policy: str = "binpack", schedulers: Collection[str] | None = (contract.SCHEDULER_NAME,),
                 hosts: HostHeadroom | None = None, watched: WatchedPods | None = None,
                 rival_wait: float = RIVAL_WAIT, admission_backlog: int = ADMISSION_BACKLOG) -> None:
        """``watched``: the pods' watch cache; bind reads a pod from it instead of a GET when that is safe.
        ``rival_wait``: seconds a bind waits for a rival pod on its node (``RivalWait``);
        ``admission_backlog``: pods awaiting kubelet's admission on a node before the filter prefers
        other nodes (0: no limit)."""
        if policy not in placement.POLICIES:
            raise ValueError(f"policy {policy!r} is not one of {', '.join(placement.POLICIES)}")
        self.ledger = ledger
        self.cache = DecisionCache(ledger)
        self.api = api
        self.watched = watched
        self.names = names
        self.policy = policy
        self.schedulers = frozenset(schedulers) if schedulers is not None else None
        self.hosts = hosts if hosts is not None else HostHeadroom()
        self.mix = MixLearner()  # the task mix of the pods seen, for the fragment policy
        # FGD's typical pods, counted, with their node selectors: learned from every vGPU pod
        # this extender binds (once per uid, ``learn_bound``), for the fgd-filter policy
        self.typical = MixLearner(fgd.FGD_CAPACITY, fgd.FGD_DECAY, by="count")
        self._typical_view = (0, MixArrays(Mix()))
        self._typical_observed = 0
        self._typical_seen: OrderedDict[str, None] = OrderedDict()
        # every node's cards as array rows for fgd-filter, rewritten when the ledger changes the node
        self._fgd_rows = NodeRows()
        self._fgd_row_of_slot = np.full(0, -1, dtype=np.int64)  # DecisionCache slot -> row (-1: none yet)
        # guarded by the ledger's lock: the filter reads and stores levels under it, and the
        # ledger's listeners that forget a changed row's levels (_fgd_forget_row) run under it
        self._fgd_memos: OrderedDict[tuple[Any, ...], LevelMemo] = OrderedDict()
        self._fgd_counts = CountMemo(self._typical_view[1])  # per mix snapshot: what each node offers each typical pod
        self._fgd_columns = RequestColumns()  # per request: each typical pod's numbers, kept across snapshots
        ledger.subscribe(self._fgd_node_changed)
        self._fgd_hosts_dirty: set[str] = set()  # nodes whose CPU headroom or labels changed since
        self.hosts.subscribe(self._fgd_hosts_dirty.add)
        self._mix_view = (0, Mix())  # (version, snapshot) the fragment policy decides with
        self._observed = 0
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._seen_lock = threading.Lock()
        self._pod_locks = _StripedLocks()
        self._node_locks = _StripedLocks()
        self.rival_wait = rival_wait
        self.admission_backlog = admission_backlog
        self.inflight = InFlight()

    # --- filter and prioritize (read-only) ------------------------------------------

    def _entries(self, args: ExtenderArgs) -> list[tuple[str, NodeEntry | None, NodeMemo]]:
        """(name, entry, memo) per candidate; without node cache, the request's Node objects give the cards."""
        if args.cache_mode:
            return [(name, self.ledger.node(name), self.cache.node(name)) for name in args.candidate_names]
        result = []
        for node in args.nodes or []:
            name = node["metadata"]["name"]
            entry = self.ledger.node(name)
            if entry is None or not entry.known:
                # a node our watch has not delivered yet: a throwaway entry from the request
                cards = node_cards(node, self.names)
                temp = NodeEntry(name, cards.cards, cards.topology, cards.source, cards.problem, True,
                                 pods=dict(entry.pods) if entry else {}, sharing=cards.sharing)
                temp.recount()
                result.append((name, temp, NodeMemo()))
            else:
                result.append((name, entry, self.cache.node(name)))
        return result

    def _own(self, pod: Mapping[str, Any]) -> Holding | None:
        """The claim the ledger holds for this very pod (an earlier, interrupted bind), if any."""
        uid = pod_key(pod)[0]
        return self.ledger.holding(uid) if uid else None

    def filter(self, args: ExtenderArgs) -> Filtered:
        """The nodes that pass, and the others' reasons when none does (``Filtered``).
        PodProblem when the pod asks for no vGPU.

        Under ``fgd-filter`` only the node of the best FGD score passes (the first by name
        among equal scores): kube-scheduler skips scoring when one node is left. The others
        are left out of every list and count."""
        ask = read_ask(args.pod, self.names, self.policy)
        pick = ask.policy == "fgd-filter" and not ask.isolated
        found, slots = self._filter_slots(args, ask, lazy=pick)
        if ask.invalid:
            return found
        passed, slots = self._away_from_rivals(args, ask, found.passed, slots)
        if pick and len(passed) > 1:
            return found._replace(passed=[self._fgd_best(args, ask, passed, slots)])
        return found._replace(passed=list(passed)) if pick or passed is not found.passed else found

    def _away_from_rivals(self, args: ExtenderArgs, ask: PodAsk, passed: Sequence[str],
                          slots: np.ndarray | None) -> tuple[Sequence[str], np.ndarray | None]:
        """The passed nodes without the ones where the pod would queue, unless every passed node
        would: where a bind would wait for a rival pod's admission (``RivalWait``: seconds, and past
        ``rival_wait`` a refusal), or where kubelet has ``admission_backlog`` of our pods still to
        admit (it admits one pod at a time, calling the device plugin for each). Another node that
        fits costs nothing; a node whose queue drains is chosen again. Only the nodes with a pod
        kubelet has not admitted yet are looked at (the ledger's ``awaiting_admission``: none
        outside a burst of binds), so placement outside a burst is the policy's alone."""
        if len(passed) < 2:
            return passed, slots
        uid = pod_key(args.pod)[0] or ""
        flying = self.inflight.by_node(without=uid)
        with self.ledger.lock:
            awaiting = self.ledger.awaiting_admission
            if not awaiting and not flying:
                return passed, slots
            nodes, shapes, backlog = self.ledger.nodes, ask_shapes(ask), self.admission_backlog
            blocked = set()
            for name in awaiting | flying.keys():
                entry = nodes.get(name)
                unserved = entry.unserved if entry is not None else {}
                coming = flying.get(name, ())
                if (backlog and len(unserved) - (uid in unserved) + len(coming) >= backlog) \
                        or shape_rival(shapes, uid, unserved.values()) \
                        or any(shapes_rival(shapes, theirs) for theirs in coming):
                    blocked.add(name)
        if not blocked:
            return passed, slots
        keep = [name not in blocked for name in passed]
        if all(keep) or not any(keep):
            return passed, slots
        return list(itertools.compress(passed, keep)), None if slots is None else slots[np.array(keep)]

    def _filter(self, args: ExtenderArgs, ask: PodAsk) -> Filtered:
        """The filter's answer before any policy's pick."""
        return self._filter_slots(args, ask)[0]

    def _filter_slots(self, args: ExtenderArgs, ask: PodAsk, lazy: bool = False) -> tuple[Filtered, np.ndarray | None]:
        """``_filter`` and, when ``lazy``, the passed names' slots (None: not from the cache, or the pod's
        own claim moved them) with the passed names as a ``_Passing`` (not a list) when read from the cache."""
        names = args.candidate_names
        if ask.invalid:
            return Filtered([], {}, dict.fromkeys(names, ask.invalid), 0, len(names)), None
        if not args.cache_mode:
            return self._filter_entries(args, ask), None
        with self.ledger.lock:
            own = self._own(args.pod)
            cache = self.cache.shape(("fit", ask.key), VerdictCache)
            # the names as slots in one C-level pass; the verdicts' kinds are then array operations
            slot_of = self.cache.slots
            slots = self.cache.slots_of(names)
            states = cache.states(slots, len(slot_of))
            unseen: list[int] = []  # where the names the ledger does not know are
            # the verdicts' kinds as bytes: finding and counting them are then a few calls of
            # the same bytes methods, not an array operation each (cold caches: README, fourteenth step)
            kinds = states.tobytes()
            if UNDECIDED in kinds:
                nodes = self.ledger.nodes
                for at in _positions(kinds, UNDECIDED):
                    name = names[at]
                    slot = slot_of.get(name, -1)
                    if slot < 0 or cache.state[slot] == UNDECIDED:  # not decided earlier in this loop
                        entry = nodes.get(name)
                        if entry is None or not entry.known:
                            unseen.append(at)
                            states[at] = FAILS
                            continue
                        slot = self.cache.slot(name)
                        cache.set(fit(entry, ask, self.cache.node(name)), slot)
                    slots[at] = slot
                    states[at] = cache.state[slot]
            mine: np.ndarray | None = None  # where the node holding the pod's own claim is named
            own_reason: str | None = None
            if own is not None and (entry := self.ledger.nodes.get(own.node)) is not None and entry.known:
                mine = (slots == slot_of.get(own.node, -2)).nonzero()[0]
                if len(mine):
                    # decide that node as if the pod held nothing there
                    own_reason, own_hopeless = fit(entry.without(own.uid), ask, NodeMemo())
                    states[mine] = PASSES if own_reason is None else NEVER if own_hopeless else FAILS
                else:
                    mine = None
            kinds = states.tobytes()
            counts = kinds.count(FAILS), kinds.count(NEVER)
            passing = kinds.count(PASSES)
            if passing:  # kube-scheduler reads no reason when a node passes (Filtered)
                where = kinds.translate(_PASSING)
                if not lazy:
                    return Filtered(list(itertools.compress(names, where)), {}, {}, *counts), None
                passed_slots = None if mine is not None else slots[np.frombuffer(where, dtype=bool)]
                return Filtered(_Passing(names, where, passing), {}, {}, *counts), passed_slots  # type: ignore[arg-type]
            failing, hopeless = states == FAILS, states == NEVER
            reasons = cache.reason[slots]
        reasons[unseen] = "the extender has not seen this node yet"
        if mine is not None:
            reasons[mine] = own_reason
        return Filtered([], _reasons_where(names, reasons, failing), _reasons_where(names, reasons, hopeless),
                        *counts), None

    def _filter_entries(self, args: ExtenderArgs, ask: PodAsk) -> Filtered:
        """Without the node cache: the request's Node objects, one by one."""
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        counts = [0, 0]  # names failed, unresolvable
        with self.ledger.lock:
            own = self._own(args.pod)
            for name, entry, memo in self._entries(args):
                reason: str | None
                if entry is None or not entry.known:
                    reason, never = "the extender has not seen this node yet", False
                else:
                    if own is not None and own.node == name:
                        entry, memo = entry.without(own.uid), NodeMemo()
                    reason, never = fit(entry, ask, memo)
                if reason is None:
                    passed.append(name)
                else:
                    (unresolvable if never else failed)[name] = reason
                    counts[never] += 1
        if passed:  # kube-scheduler reads no reason when a node passes (Filtered)
            return Filtered(passed, {}, {}, *counts)
        return Filtered(passed, failed, unresolvable, *counts)

    def prioritize(self, args: ExtenderArgs) -> list[tuple[str, int]]:
        ask = read_ask(args.pod, self.names, self.policy)
        if ask.invalid:
            raise PodProblem(f"pod {describe_pod(args.pod)}: {ask.invalid}")
        if ask.policy == "fragment" and not ask.isolated:  # MIG slices are placed as before
            return self._prioritize_fragment(args, ask)
        with self.ledger.lock:
            own = self._own(args.pod)
            if not args.cache_mode:
                scores = []
                for name, entry, memo in self._entries(args):
                    if entry is None or not entry.known:
                        scores.append((name, 0))
                        continue
                    if own is not None and own.node == name:
                        entry, memo = entry.without(own.uid), NodeMemo()
                    scores.append((name, score(entry, ask, memo)))
                return scores
            cache = self.cache.shape(("score", ask.key), ScoreCache)
            nodes = self.ledger.nodes
            for name in list(itertools.filterfalse(cache.__contains__, args.candidate_names)):
                entry = nodes.get(name)
                if entry is not None and entry.known:
                    cache[name] = score(entry, ask, self.cache.node(name))
            mine: dict[str, int] = {}
            if own is not None and own.node in nodes and nodes[own.node].known:
                mine[own.node] = score(nodes[own.node].without(own.uid), ask, NodeMemo())
            names = args.candidate_names
            scores = list(zip(names, map(cache.get, names, itertools.repeat(0)), strict=True))  # C-level loops
            if mine:
                scores = [(name, mine.get(name, score)) for name, score in scores]
            return scores

    def _fragment_view(self, pod: Mapping[str, Any], ask: PodAsk, learn: bool) -> FragmentView:
        """The mix learned so far (this pod counted once, when ``learn``) and the pod's CPU/memory."""
        cpu, memory = pod_cpu_memory(pod)
        if learn:
            new = self._first_sight(self._seen, pod)
            shape = Shape.of_pod(ask.requests, cpu, memory)
            if new and shape is not None:
                self.mix.observe(shape)
                with self._seen_lock:
                    self._observed += 1
                    if _refresh_due(self._observed):
                        self._mix_view = (self._mix_view[0] + 1, self.mix.mix())
        return FragmentView(self._mix_view[1], cpu, memory)

    def _first_sight(self, seen: OrderedDict[str, None], pod: Mapping[str, Any]) -> bool:
        """Whether ``seen`` (the last ``_SEEN_PODS`` pods a mix counted) lacks the pod; it is added."""
        uid = str((pod.get("metadata") or {}).get("uid") or describe_pod(pod))
        with self._seen_lock:
            new = uid not in seen
            seen[uid] = None
            if len(seen) > _SEEN_PODS:
                seen.popitem(last=False)
        return new

    def learn_bound(self, pod: Mapping[str, Any], ask: PodAsk | None = None) -> None:
        """Count a pod this extender bound once (per uid) in the typical-pod mix, with its node
        selector; at each of the first pods and then every ``_MIX_REFRESH``, take a new snapshot
        if the mix drifted. ``ask``: the pod's ``read_ask``, when the caller has read it.

        Bound pods only, not every pod the filter is asked about (issue 32): one namespace's
        thousands of pending pods of a shape that never fits, each retried, became most of the
        mix and skewed every node's score. A pod is bound once, so a tenant weighs in the mix
        only as much as it runs (benchmarks/trace/README.md, "A hostile namespace"). No cap per
        namespace: under JupyterHub every user's notebook is in the Hub's one namespace."""
        if ask is None:
            try:
                ask = read_ask(pod, self.names, self.policy)
            except PodProblem:
                return
        if ask.invalid or not self._first_sight(self._typical_seen, pod):
            return
        shape = typical_shape(pod, ask)
        if shape is None:
            return
        self.typical.observe(shape)
        with self._seen_lock:
            self._typical_observed += 1
            refresh = _refresh_due(self._typical_observed)
        if refresh:
            learned = self.typical.mix()
            if fgd.drifted(self._typical_view[1].mix, learned):
                arrays = MixArrays(learned)
                with self._seen_lock:
                    self._typical_view = (self._typical_view[0] + 1, arrays)

    @property
    def typical_snapshot(self) -> Mix:
        """The typical pods the fgd-filter policy decides with now."""
        return self._typical_view[1].mix

    def _fgd_view(self, pod: Mapping[str, Any]) -> FragmentView:
        cpu, memory = pod_cpu_memory(pod)
        return FragmentView(self._typical_view[1].mix, cpu, memory)

    def _fgd_best(self, args: ExtenderArgs, ask: PodAsk, passed: Sequence[str], slots: np.ndarray | None = None) -> str:
        """The passed node of the best fgd_level, the first by name among equals. Levels are
        computed in one numpy batch over rows of the nodes' cards (``fgd_batch``), rewritten
        when the ledger changes a node, and memoised per (request, pod CPU, mix snapshot) until
        the row or the node's CPU headroom changes (any label change forgets them all); a node with MIG slices or
        a card-sharing mode, one the ledger does not know, the one holding this pod's own claim,
        and pods of several containers are scored by the core. The work per filter beyond the
        nodes that changed is array operations over the passed rows (no Python loop per node)."""
        version, arrays = self._typical_view
        view = FragmentView(arrays.mix, *pod_cpu_memory(args.pod))
        for node in args.nodes or []:  # full Node objects carry allocatable and labels
            self.hosts.on_node("MODIFIED", node)
        single = next(iter(ask.requests.values())) if len(ask.requests) == 1 else None
        found: dict[str, int] = {}
        with self.ledger.lock:
            own = self._own(args.pod)
            rows = self._fgd_rows
            index = self._fgd_index(passed, slots)
            usable = self._fgd_usable(index, single, own)
            # usually every row is usable: then no other array call (bytes' search, not a numpy reduction)
            if 0 in usable.tobytes():  # a passed node without a row yet, or one the core scores
                self._fgd_new_rows(index, passed)
                usable = self._fgd_usable(index, single, own)
                core = np.flatnonzero(~usable)
                self._fgd_core_levels(args, ask, view, own, {passed[i] for i in core.tolist()}, found)
                picked = index[usable]
            else:
                picked = index
            if len(picked) and single is not None:
                known = self._fgd_memo((ask.key, view.cpu_milli, version, self.hosts.labels_version))
                top, row = self._fgd_top(known, picked, ask, single, view, arrays)
                if top >= max(found.values(), default=-1):
                    found = {name: level for name, level in found.items() if level == top}
                    found[rows.names[row]] = top
        best = max(found.values(), default=-1)
        return min(name for name, level in found.items() if level == best) if found else passed[0]

    def _fgd_top(self, known: LevelMemo, picked: np.ndarray, ask: PodAsk, single: Request, view: FragmentView,
                 arrays: MixArrays) -> tuple[int, int]:
        """(level, row) of the best of the ``picked`` rows (not empty), the first by name among
        equals: one gather and one ``argmax`` over the memo's keys, after computing the levels
        the memo does not know (``LevelMemo.STALE`` sorts above every key)."""
        rows = self._fgd_rows
        rank = rows.ranks()
        known.reserve(len(rows.stamp), rank)
        keyed = known.keyed[picked]
        at = int(keyed.argmax())
        if keyed[at] == LevelMemo.STALE:
            self._fgd_store(known, picked[keyed == LevelMemo.STALE], ask, single, view, arrays, rank)
            keyed = known.keyed[picked]
            at = int(keyed.argmax())
        return LevelMemo.level_of(int(keyed[at])), int(picked[at])

    def _fgd_store(self, known: LevelMemo, some: np.ndarray, ask: PodAsk, single: Request, view: FragmentView,
                   arrays: MixArrays, rank: np.ndarray) -> None:
        """The levels of the ``some`` rows into ``known`` (-1 where the pod does not fit)."""
        rows = self._fgd_rows
        admitted = None
        if arrays.reads_labels:  # a Python loop over the rows: only when some selector needs it
            admitted = arrays.admitted(self.hosts.facts([rows.names[row] for row in some.tolist()])[1])
        if len(some) <= _FGD_FEW_ROWS and arrays.mix.shapes:  # the batch's numbers, in Python
            few = some.tolist()
            falls = falls_few_lists(*rows.rows_as_lists(few), None if admitted is None else admitted.tolist(),
                                    single, view.cpu_milli, arrays)
            known.store_few(few, stored_levels_lists(*falls), rank)
            return
        if self._fgd_counts.arrays is not arrays:
            self._fgd_counts = CountMemo(arrays)
        fresh, fit = self._fgd_columns.levels((ask.key, view.cpu_milli, self.hosts.labels_version),
                                              rows, some, admitted, single, view.cpu_milli, arrays,
                                              self._fgd_counts)
        known.store(some, np.where(fit, fresh, -1), rank)

    def _fgd_forget_row(self, row: int) -> None:
        """The row or its CPU headroom changed (under the ledger's lock): no memo answers its level again."""
        for memo in self._fgd_memos.values():
            memo.forget(row)

    def _fgd_usable(self, index: np.ndarray, single: Request | None, own: Holding | None) -> np.ndarray:
        """Which rows of ``index`` (-1: none) the batch scores: plain nodes, for pods of one container,
        not the node holding the pod's own claim."""
        rows = self._fgd_rows
        usable = rows.usable(index) if single is not None else index < -1
        if own is not None and own.node in rows.index:
            usable &= index != rows.index[own.node]
        return usable

    def _fgd_index(self, passed: Sequence[str], slots: np.ndarray | None = None) -> np.ndarray:
        """Under the ledger's lock: each passed node's row (-1: none yet, ``_fgd_new_rows``), after
        updating the CPU headroom of nodes whose headroom changed (the ledger's changes rewrite their
        rows as they happen, ``_fgd_node_changed``). ``slots``: the passed nodes' slots
        (``DecisionCache.slots``), when the filter has them: the rows are then one gather."""
        rows = self._fgd_rows
        hosts_dirty = self._fgd_hosts_dirty
        while hosts_dirty:  # pop, not clear: a change reported meanwhile stays for the next filter
            name = hosts_dirty.pop()
            row = rows.index.get(name)
            if row is not None and rows.set_cpu(row, self.hosts.cpu_milli(name)):
                self._fgd_forget_row(row)
        if slots is not None:
            if len(self._fgd_row_of_slot) < len(self.cache.slots):
                grown = np.full(max(len(self.cache.slots), 2 * len(self._fgd_row_of_slot)), -1, dtype=np.int64)
                grown[:len(self._fgd_row_of_slot)] = self._fgd_row_of_slot
                self._fgd_row_of_slot = grown
            index = self._fgd_row_of_slot[slots]
        else:
            index = np.fromiter(map(rows.index.get, passed, itertools.repeat(-1)), dtype=np.int64,
                                count=len(passed))
        return index

    def _fgd_new_rows(self, index: np.ndarray, passed: Sequence[str]) -> None:
        """Write the rows of the passed nodes seen for the first time (-1 in ``index``), into ``index``."""
        rows, nodes = self._fgd_rows, self.ledger.nodes
        for at in (index < 0).nonzero()[0].tolist():
            name = passed[at]
            row = rows.index.get(name)
            if row is None:
                if not self._fgd_write_row(name, nodes.get(name)):
                    continue
                row = rows.index[name]
                if rows.set_cpu(row, self.hosts.cpu_milli(name)):
                    self._fgd_forget_row(row)
            index[at] = row
            slot = self.cache.slots.get(name)
            if slot is not None and slot < len(self._fgd_row_of_slot):
                self._fgd_row_of_slot[slot] = row

    def _fgd_node_changed(self, name: str, _cards_changed: bool) -> None:
        """The ledger changed the node (under its lock): its row, if it has one, is written again
        now, by the writer (a bind, the watch), not by the next filter on its way to an answer. A
        node without a row gets one when it first passes a filter."""
        if name in self._fgd_rows.index:
            self._fgd_write_row(name, self.ledger.nodes.get(name))

    def _fgd_write_row(self, name: str, entry: NodeEntry | None) -> bool:
        """Write the node's row from its ledger entry; False when the ledger does not know the node
        (gone or not seen: the filter does not pass it, and the ledger's next change of it writes the
        row, ``_fgd_node_changed``)."""
        if entry is None or not entry.known:
            return False
        # the ledger's free-capacity summary (healthy cards, in order; the filter's fit has
        # usually built it already): the same numbers as its NodeState's healthy cards
        free = entry.free
        self._fgd_rows.set(name, [f.free_cores for f in free], [f.free_memory_units for f in free],
                           [f.whole for f in free], node_placement.plain(entry.slices, entry.sharing, False))
        self._fgd_forget_row(self._fgd_rows.index[name])
        return True

    def _fgd_core_levels(self, args: ExtenderArgs, ask: PodAsk, view: FragmentView, own: Holding | None,
                         core: set[str], found: dict[str, int]) -> None:
        """``placement.fgd_level`` of the ``core`` nodes (those the batch does not score) into ``found``."""
        if args.cache_mode:  # only the core nodes' entries, not one per name of the request
            entries = [(name, self.ledger.node(name), self.cache.node(name)) for name in sorted(core)]
        else:
            entries = self._entries(args)
        for name, entry, memo in entries:
            if name not in core or entry is None or not entry.known:
                continue
            if own is not None and own.node == name:
                entry, memo = entry.without(own.uid), NodeMemo()
            state = replace(node_state(entry, memo), headroom=self.hosts.headroom(name),
                            labels=self.hosts.labels(name))
            level = placement.fgd_level(state, ask.requests, view)
            found[name] = -1 if level is None else level

    def _fgd_memo(self, key: tuple[Any, ...]) -> LevelMemo:
        """The levels memo of one (request, pod CPU, snapshot, labels version), LRU over a few."""
        memo = self._fgd_memos.get(key)
        if memo is None:
            memo = self._fgd_memos[key] = LevelMemo()
            if len(self._fgd_memos) > _FGD_MEMOS:
                self._fgd_memos.popitem(last=False)
        else:
            self._fgd_memos.move_to_end(key)
        return memo

    @property
    def mix_snapshot(self) -> Mix:
        """The learned mix the fragment policy decides with now."""
        return self._mix_view[1]


    def _prioritize_fragment(self, args: ExtenderArgs, ask: PodAsk) -> list[tuple[str, int]]:
        """Scores that depend on the mix snapshot and on CPU/memory headroom, memoised per node
        under both (a node's memo is cleared whenever its vGPU accounting changes)."""
        view = self._fragment_view(args.pod, ask, learn=True)
        version = self._mix_view[0]
        for node in args.nodes or []:  # full Node objects carry allocatable
            self.hosts.on_node("MODIFIED", node)
        out = []
        with self.ledger.lock:
            own = self._own(args.pod)
            for name, entry, memo in self._entries(args):
                value = 0
                if entry is not None and entry.known:
                    if own is not None and own.node == name:
                        entry, memo = entry.without(own.uid), NodeMemo()
                    if fit(entry, ask, memo)[0] is None:
                        headroom = self.hosts.headroom(name)
                        key = ("fragment", ask.key, view.cpu_milli, view.memory_mib, version, headroom)
                        cached = memo.live.get(key)
                        if cached is None:
                            state = replace(node_state(entry, memo), headroom=headroom)
                            cached = placement.score_node(state, ask.requests, ask.policy, view=view)
                            remember(memo.live, key, cached)
                        value = int(cached)
                out.append((name, max(0, min(MAX_EXTENDER_PRIORITY, value))))
        return out

    # --- bind (the only writer) -------------------------------------------------------

    @property
    def _api(self) -> PodAPI:
        if self.api is None:  # bind() checks first; this is for the helpers it calls
            raise RuntimeError("no Kubernetes API")
        return self.api

    def bind(self, args: ExtenderBindingArgs) -> str:
        """Bind the pod; '' on success, else the reason (nothing is left changed then). Blocks while
        the bind waits for a rival pod on the node (at most ``rival_wait``); the server does not call
        this but ``bind_step``, and waits on its loop (rival_waits.py), holding no thread."""
        deadline = time.monotonic() + self.rival_wait
        while True:
            answer = self.bind_step(args)
            if not isinstance(answer, RivalWait):
                return answer
            if not self.ledger.wait_for(functools.partial(answer.settled, self.ledger),
                                        deadline - time.monotonic()):
                return self.rival_refusal(args, answer)

    def bind_step(self, args: ExtenderBindingArgs) -> str | RivalWait:
        """``bind`` up to where it would wait: '' when bound, the reason when refused, or the
        ``RivalWait`` to wait out (nothing claimed) before calling this again."""
        if self.api is None:
            return "this extender has no Kubernetes API access and cannot bind"
        where = f"pod {args.pod_namespace}/{args.pod_name}"
        # One bind per pod and per node at a time: a node's claims and Bindings are made in one
        # order, which keeps kubelet's admissions in that order and the node daemon's record swaps
        # (two PATCHes a bind could see half-done) rare (docs/adr/0005-the-per-node-bind-lock.md).
        # It guards the claim and the Binding; reading the pod and checking it are about this pod
        # alone (the pod lock keeps other binds of it out), so they happen before it is taken.
        with self._pod_locks(f"{args.pod_namespace}/{args.pod_name}"):
            copy = self._watched_copy(args)
            if copy is not None:
                try:
                    return self._bind_pod(copy, args, watched=True)
                except _CopyOutdated:
                    pass  # the watch moved on meanwhile: read the API, as for any other pod
            try:
                pod = self._read_pod(args)
            except APIFailure as error:
                return f"cannot read {where}: {error}"
            if pod is None:
                return f"{where} not found"
            return self._bind_pod(pod, args, watched=False)

    def _bind_pod(self, pod: Mapping[str, Any], args: ExtenderBindingArgs, *, watched: bool) -> str | RivalWait:
        """Under the pod's lock: check the pod, then claim and bind under the node's lock, unless a
        rival on the node must be admitted first (``RivalWait``).
        ``watched``: ``pod`` is the watch's copy (``_watched_copy``), not a GET's answer."""
        where = f"pod {args.pod_namespace}/{args.pod_name}"
        metadata = pod.get("metadata") or {}
        uid = metadata.get("uid") or ""
        if args.pod_uid and uid and args.pod_uid != uid:
            return (f"{where} has UID {uid}, not {args.pod_uid}: "
                    f"it was deleted and created again since it was scheduled")
        if claims.is_finished(pod):
            return f"{where} has already terminated"
        try:
            ask = read_ask(pod, self.names, self.policy)
        except PodProblem as problem:
            return str(problem)
        if ask.invalid:
            return f"{where}: {ask.invalid}"
        # the rivals are checked under the node's lock, with the claim: a bind to the node that
        # got in first is in the ledger already; the wait is outside both locks, so other binds go on
        self.inflight.note(uid, args.node, ask_shapes(ask))  # queued for the node: filters count it
        try:
            with self._node_locks(args.node):
                try:
                    if watched:
                        answer = self._allocate_and_bind(pod, args, uid, ask, watched=pod)
                    else:
                        answer = self._claim_and_bind(pod, args, uid, ask)
                except _RivalUnserved as found:
                    return found.wait
        finally:
            self.inflight.done(uid)  # claimed (the ledger counts it now), refused or waiting
        if not answer:
            self.learn_bound(pod, ask)  # bound: now it counts among fgd-filter's typical pods
        return answer

    def rival_refusal(self, args: ExtenderBindingArgs, wait: RivalWait, waiting: int | None = None) -> str:
        """Why the bind fails after ``wait`` ran out (or, with ``waiting``, found that many binds
        waiting already). kubelet's Allocate names only devices and their count, never the pod, and
        kubelet may ask for vcuda-core first: with both pods waiting, the device plugin could give
        either one the other's answer (memory limit, MIG slice), and no later answer corrects it
        (docs/design.md)."""
        other = wait.other
        why = (f"kubelet has not admitted it within {self.rival_wait:g} s ({self.names.gpu_assigned} is not true)"
               if waiting is None else f"kubelet has not admitted it yet, and {waiting} binds are waiting already")
        return (f"pod {args.pod_namespace}/{args.pod_name} not bound to node {wait.node}: pod {other.namespace}/"
                f"{other.name} there asks for {wait.how}, and {why}; kubelet's Allocate tells containers "
                f"apart only by their vcuda-core count, so with both waiting either could be given the "
                f"other's limits. kube-scheduler will try again")

    def _watched_copy(self, args: ExtenderBindingArgs) -> Mapping[str, Any] | None:
        """The watch's copy of the pod when binding from it cannot act on anything the API no
        longer holds, else None (then bind GETs the pod).

        The hazard is a copy older than a write of ours: a pod this extender bound a moment ago
        still looks unbound there, and binding it again from that copy would move its claim in
        the ledger (freeing the cards it holds) until the API refuses the Binding. Every write
        of ours leaves the pod a claim in the ledger (assumed until the watch confirms it), and
        the watch writes its cache before it tells the ledger; so with no claim in the ledger,
        read first, the copy read next is at least as new as anything we wrote. The copy must
        also be the pod the scheduler named (same UID), unbound, and carry no claim annotations
        (adopting or clearing an earlier claim goes by what the API holds). Writes by others
        that the watch has not delivered yet can only make the API refuse the Binding, which
        writes nothing; ``_post_binding`` then reads the pod and the ledger says what it says.
        """
        if self.watched is None or not args.pod_uid or self.ledger.holding(args.pod_uid) is not None:
            return None
        copy = self.watched(args.pod_namespace, args.pod_name)
        if copy is None:
            return None
        metadata = copy.get("metadata") or {}
        if metadata.get("uid") != args.pod_uid or (copy.get("spec") or {}).get("nodeName"):
            return None
        names = self.names
        for key in metadata.get("annotations") or ():
            if key.startswith((names.predicate_gpu_idx_prefix, names.mig_slice_prefix)) \
                    or key in (names.allocation, names.predicate_node):
                return None
        return copy

    def _claim_and_bind(self, pod: Mapping[str, Any], args: ExtenderBindingArgs, uid: str, ask: PodAsk) -> str:
        """Under the pod's and the node's locks: adopt what the pod already holds, or claim cards; then bind."""
        where = f"pod {args.pod_namespace}/{args.pod_name}"
        current = pod_holding(pod, self.names, self.schedulers)
        bound = (pod.get("spec") or {}).get("nodeName") or ""
        if bound:
            if bound != args.node:
                return f"{where} is already bound to node {bound}"
            if isinstance(current, Holding):
                self._adopt(current)
                return ""  # a repeated bind: already done, nothing more to allocate
            return f"{where} is already bound to {bound} without a card assignment"
        if isinstance(current, Holding) and current.node == args.node:
            # cards named before this call (an earlier attempt that did not get to bind, or
            # whoever wrote the pod): reuse them only if they still have room for the pod
            with self.ledger.lock:
                refusal = self._preset_refusal(current, args.node)
                if refusal is None:
                    self._check_rivals(current)
                    self._adopt(replace(current, unserved=True))  # kubelet may admit it once bound
            if refusal is None:
                return self._post_binding(pod, args, uid, patched=None)
            log.warning("%s: not adopting the cards it names on %s (%s); placing it afresh",
                        where, args.node, refusal)
        return self._allocate_and_bind(pod, args, uid, ask)

    def _read_pod(self, args: ExtenderBindingArgs) -> dict[str, Any] | None:
        """The pod as the API has it now. (Reading the watch's copy instead saves a request but
        was taken out: with a stale copy, a pod bound meanwhile could leave an assumed claim
        that only the sweep settles, tests/extender/test_concurrency.py.)"""
        return self._api.get_pod(args.pod_namespace, args.pod_name)

    def _state_without(self, entry: NodeEntry, uid: str) -> NodeState:
        """The node's placement state with pod ``uid``'s own claim given back."""
        if uid and uid in entry.pods:
            return node_state(entry.without(uid), NodeMemo())
        return node_state(entry, self.cache.node(entry.name))

    def _preset_refusal(self, holding: Holding, node: str) -> str | None:
        entry = self.ledger.node(node)
        if entry is None or not entry.known or not entry.cards:
            return f"node {node} has no vGPU cards known"
        mine = entry.without(holding.uid) if holding.uid in entry.pods else entry
        on_cards = replace(holding, containers=tuple(c for c in holding.containers
                                                     if not any(s.mig_device for s in c.cards)))
        for container, share in holding.shares():
            if share.mig_device:
                refusal = slice_refusal(mine, share)
                if refusal is not None:
                    return f"container {container}: {refusal}"
        return preset_refusal(self._state_without(entry, holding.uid), on_cards)

    def _adopt(self, holding: Holding) -> None:
        with self.ledger.lock:
            known = self.ledger.holding(holding.uid)
            if known is None or not known.same_claim(holding) or known.unserved != holding.unserved:
                self.ledger.put(holding)

    def _check_rivals(self, holding: Holding) -> None:
        """Under the node's and the ledger's locks: _RivalUnserved when another pod on the node that
        kubelet has not admitted yet asks for as many vcuda-core as ``holding``, answered differently."""
        entry = self.ledger.node(holding.node)
        found = rival(holding, entry.unserved.values()) if entry is not None and entry.unserved else None
        if found is not None:
            raise _RivalUnserved(RivalWait(*found, holding.node))

    def _allocate_and_bind(self, pod: Mapping[str, Any], args: ExtenderBindingArgs, uid: str,
                           ask: PodAsk, watched: Mapping[str, Any] | None = None) -> str:
        """``watched``: the watch's copy ``pod`` is; the claim is recorded only while it is still
        the newest copy and the ledger still holds nothing for the pod (else _CopyOutdated)."""
        where = f"pod {args.pod_namespace}/{args.pod_name}"
        with self.ledger.lock:
            if watched is not None and (self.ledger.holding(uid) is not None or self.watched is None
                                        or self.watched(args.pod_namespace, args.pod_name) is not watched):
                raise _CopyOutdated(where)
            entry = self.ledger.node(args.node)
            if entry is None or not entry.known or not entry.cards:
                problem = entry.problem if entry is not None and entry.problem else "no vGPU cards known"
                return f"node {args.node}: {problem}"
            mine = entry.without(uid) if uid and uid in entry.pods else entry
            if ask.policy in ("fragment", "fgd-filter") and not on_slices(mine, ask):
                state = replace(self._state_without(entry, uid), headroom=self.hosts.headroom(args.node),
                                labels=self.hosts.labels(args.node))
                view = (self._fgd_view(pod) if ask.policy == "fgd-filter"
                        else self._fragment_view(pod, ask, learn=False))
                found = placement.place_pod(state, ask.requests, ask.policy, view=view)
                result = found if isinstance(found, placement.Refusal) else node_placement.NodePlacement(
                    found, SlicePlacement({}))
            else:
                result = place_here(mine, ask, self._state_without(entry, uid))
            if isinstance(result, placement.Refusal):
                return f"{where} does not fit on node {args.node} any more: {result.reason}"
            allocation = self._allocation(pod, args.node, entry, result, ask)
            holding = Holding(uid, args.pod_namespace, args.pod_name, args.node, allocation.containers,
                              assumed=True, assumed_at=time.monotonic(), unserved=True)
            self._check_rivals(holding)
            previous = self.ledger.put(holding)
        annotations = contract.predicate_annotations(allocation, self.names)
        stale = [key for key in (pod.get("metadata") or {}).get("annotations") or {}
                 if key.startswith((self.names.predicate_gpu_idx_prefix, self.names.mig_slice_prefix))
                 and key not in annotations]
        if not stale:
            return self._post_binding(pod, args, uid, patched=holding, annotations=annotations, previous=previous)
        # keys of an earlier claim that this one does not cover: only a PATCH can remove them
        patch: dict[str, str | None] = {**annotations, **dict.fromkeys(stale)}
        try:
            patched = self._api.patch_annotations(args.pod_namespace, args.pod_name, patch)
        except APIFailure as error:
            self._restore(holding, previous)
            return f"cannot annotate {where}: {error}"
        self._watch_from(holding, resource_version(patched))
        return self._post_binding(pod, args, uid, patched=holding)

    def _settle(self, ours: Holding, pod: Mapping[str, Any]) -> None:
        """After a Binding that failed, or whose answer was lost: the ledger says what ``pod`` (read
        from the API since) says in place of our claim, and the watch says the rest from there on.

        While our claim was in flight the watch could not change it (only its own result confirms
        it), so an event of the pod that came meanwhile (bound by someone else, say) was set aside:
        when the watch's copy is already as new as ``pod``, it is what the ledger takes, as the
        watch would have; otherwise ``pod``'s claim, assumed until the watch gets that far."""
        uid = ours.uid
        rv = resource_version(pod)
        with self.ledger.lock:
            if self.ledger.holding(uid) is not ours:
                return
            copy = self.watched(ours.namespace, ours.name) if self.watched is not None else None
            if copy is not None and ((copy.get("metadata") or {}).get("uid") != uid
                                     or rv is None or (resource_version(copy) or 0) < rv):
                copy = None
            # without a watch (a ledger fed by hand) nothing would ever confirm an assumed claim
            confirmed = copy is not None or self.watched is None
            claim = pod_holding(copy if copy is not None else pod, self.names, self.schedulers)
            if isinstance(claim, Holding):
                if confirmed:
                    self.ledger.put(claim)
                elif claim.same_claim(ours):
                    if rv is not None:
                        self.ledger.put(replace(ours, min_resource_version=rv))
                else:
                    self.ledger.put(replace(claim, assumed=True, assumed_at=time.monotonic(),
                                            min_resource_version=rv))
            elif isinstance(claim, Unattributed):
                self.ledger.put_unattributed(claim)
            else:
                self.ledger.drop(uid)

    def _watch_from(self, holding: Holding, rv: int | None) -> None:
        """Watch events from ``rv`` on say what the pod holds (older ones cannot undo our claim)."""
        if rv is not None:
            with self.ledger.lock:
                if self.ledger.holding(holding.uid) is holding:
                    self.ledger.put(replace(holding, min_resource_version=rv))

    def _post_binding(self, pod: Mapping[str, Any], args: ExtenderBindingArgs, uid: str, *,
                      patched: Holding | None, annotations: Mapping[str, str] | None = None,
                      previous: Holding | None = None) -> str:
        """POST the Binding (carrying ``annotations`` when given); after a failure, undo our claim
        and the annotations a PATCH wrote (``patched`` without ``annotations``)."""
        where = f"pod {args.pod_namespace}/{args.pod_name}"
        try:
            self._api.bind(args.pod_namespace, args.pod_name, uid, args.node, annotations)
            return ""
        except APIFailure as error:
            failure = f"cannot bind {where} to {args.node}: {error}"
        # The answer may have been lost after the API server bound it: look before undoing.
        try:
            now = self._api.get_pod(args.pod_namespace, args.pod_name)
        except APIFailure:
            now = None
        if now is not None and (now.get("spec") or {}).get("nodeName") == args.node:
            if patched is not None:
                self._settle(patched, now)
            return ""
        elsewhere = ((now or {}).get("spec") or {}).get("nodeName") or ""
        if elsewhere:  # bound meanwhile to another node (our copy of the pod was older): say so
            failure = f"{where} is already bound to node {elsewhere}"
        if patched is None:
            return failure  # the annotations predate this call; the claim stays as the API shows it
        if annotations is not None:
            # the Binding carried the claim: refused, it wrote nothing
            if now is not None and (now.get("metadata") or {}).get("uid") == patched.uid:
                self._settle(patched, now)  # what the pod holds now, e.g. bound elsewhere meanwhile
            else:
                self._restore(patched, previous)
            return failure
        removal: dict[str, str | None] = {
            key: None for key in (self.names.predicate_node, self.names.predicate_time,
                                  self.names.gpu_assigned, self.names.allocation)
        }
        for container in patched.containers:
            removal[self.names.predicate_gpu_idx(container.index)] = None
            if any(share.mig_device for share in container.cards):
                removal[self.names.mig_slice(container.index)] = None
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
                    result: node_placement.NodePlacement, ask: PodAsk) -> PodAllocation:
        containers = (pod.get("spec") or {}).get("containers") or []
        requests = ask.requests  # read_ask's contract.pod_requests of this very pod
        cards = {card.index: card for card in entry.cards}
        allocated = []
        for index, shares in sorted(result.cards.containers.items()):
            name = (containers[index].get("name") or "") if index < len(containers) else ""
            allocated.append(ContainerAllocation(index, name, tuple(
                CardShare(card, cards[card].uuid, cores,
                          claims.held_memory_units(cores, memory, cards[card].memory_units))
                for card, cores, memory in shares
            )))
        for index, held in sorted(result.slices.containers.items()):
            # the record carries the request (what claims check it against); the slice gives its real size
            name = (containers[index].get("name") or "") if index < len(containers) else ""
            request = requests[index]
            allocated.append(ContainerAllocation(index, name, (
                CardShare(held.card, cards[held.card].uuid, request.cores, request.memory_units, held.uuid),)))
        allocated.sort(key=lambda c: c.index)
        return PodAllocation(node, tuple(allocated), assigned_at_ns=time.time_ns(), policy=ask.policy)


