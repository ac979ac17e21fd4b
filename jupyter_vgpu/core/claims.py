"""What a pod holds, read one way for every part of the stack. Pure, stdlib only.

The extender's ledger, the device plugin and the node's metrics all ask the same
questions of a pod dict as the API server sends it: has it finished, which cards does it
hold and how much of each, and would a request fit in what is left. They ask here.

Precedence of a claim (``pod_claim``), and why:

1. **Amounts come from the pod's own requests** (``spec.containers[].resources``). The
   spec is immutable once the pod exists and it is what kubelet counts against the
   device plugin's devices, so it is the one part of a claim a tenant cannot rewrite
   later. An annotation saying "I hold 100 cores" on a pod asking for 10 is not believed.
2. **Cards come from gpu-admission's ``predicate-gpu-idx-<i>`` keys** when the pod has
   them. They are the hand-off every component speaks (gpu-admission writes them,
   gpu-manager's and our device plugin serve from them, our extender and device plugin
   rewrite them together with the record), so they are what kubelet's Allocate will
   really get.
3. **The allocation record** (``Names().allocation``) only adds what the keys cannot say
   (card UUIDs, a whole card's memory, the read token's allocation id, the policy), per
   container and only where it agrees with the keys and the requests. A pod with a record
   but no keys (written by an older release, or in tests) is read from the record, again
   only where it agrees with the requests.

4. **MIG slices come from the ``mig-slice-<i>`` keys** (written by our bind, protected
   like the predicate keys): the MIG device a share container holds, on the card its
   predicate key names. A key for a container without a share makes the claim unreadable.

A claim whose parts disagree (keys naming cards for a container that asks for nothing, a
record or a ``predicate-node`` naming another node than the one the pod is bound to) holds
nothing and carries a ``problem``. A pod that is not bound holds something only when it
asks for a vGPU and, if ``schedulers`` is given, its ``spec.schedulerName`` is one of them:
only our own bind writes claims on pods that no kubelet has admitted yet.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from jupyter_vgpu.core.contract import (
    CORES_PER_CARD,
    DEFAULT_NAMES,
    MEMORY_UNIT_MIB,
    CardShare,
    ContainerAllocation,
    Names,
    PodAllocation,
    Request,
    RequestError,
    format_mib,
    parse_mig_slices,
    parse_predicate_indices,
    pod_requests,
)

FINISHED_PHASES = ("Succeeded", "Failed")
"""Pod phases after which a pod holds nothing, whatever its annotations say."""


def is_finished(pod: Mapping[str, Any]) -> bool:
    """Whether the pod has terminated for good (its containers will not run again)."""
    return (pod.get("status") or {}).get("phase") in FINISHED_PHASES


def is_whole_card(cores: int) -> bool:
    """Whether a share of ``cores`` on one card is the whole card."""
    return cores >= CORES_PER_CARD


def held_memory_units(cores: int, memory_units: int, card_memory_units: int | None) -> int:
    """The memory a share holds on its card: a whole card holds all of it (when the card is known)."""
    if is_whole_card(cores) and card_memory_units is not None:
        return card_memory_units
    return memory_units


# --- a pod's claim -----------------------------------------------------------------------


@dataclass(frozen=True)
class PodClaim:
    """What one pod holds, read from its spec and annotations (see the module docstring)."""

    uid: str
    namespace: str
    name: str
    node: str                         # spec.nodeName, else the predicate node our bind wrote
    bound: bool                       # spec.nodeName is set
    scheduler: str                    # spec.schedulerName ("" when unset)
    requests: Mapping[int, Request]   # container index -> its vGPU request
    allocation: PodAllocation | None = None   # the cards held; None when none are named
    problem: str | None = None        # why the claim cannot be read; then allocation is None
    note: str | None = None           # an annotation that was ignored, and why
    from_record: frozenset[int] = field(default_factory=frozenset)
    """Container indices whose entry is the allocation record's (it agrees with keys and requests)."""
    policy: str | None = None         # the record's policy, when it has one


def pod_claim(pod: Mapping[str, Any], names: Names = DEFAULT_NAMES, *,
              schedulers: Collection[str] | None = None) -> PodClaim | None:
    """The pod's claim, or None when it holds nothing and names nothing worth a note.

    None for finished pods, pods on no node (neither bound nor carrying a predicate node),
    and unbound pods that ask for no (valid) vGPU or belong to another scheduler.

    The extender reads every pod of the cluster with this when it starts, so the usual case
    (keys and a record that agree) builds no object it then throws away: the record's own
    containers are kept, and the claim is made once, with all its parts.
    """
    if is_finished(pod):
        return None
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = metadata.get("annotations") or {}
    bound = str(spec.get("nodeName") or "")
    predicate_node = str(annotations.get(names.predicate_node) or "")
    node = bound or predicate_node
    if not node:
        return None
    scheduler = str(spec.get("schedulerName") or "")
    request_problem = None
    try:
        requests = pod_requests(pod, names)
    except RequestError as error:
        requests, request_problem = {}, str(error)
    if not bound and (request_problem or not requests or (schedulers is not None and scheduler not in schedulers)):
        return None
    uid, namespace, name = (str(metadata.get("uid") or ""), str(metadata.get("namespace") or ""),
                            str(metadata.get("name") or ""))

    def claim(allocation: PodAllocation | None = None, problem: str | None = None, note: str | None = None,
              from_record: frozenset[int] = frozenset(), policy: str | None = None) -> PodClaim:
        return PodClaim(uid, namespace, name, node, bool(bound), scheduler, requests, allocation, problem, note,
                        from_record, policy)

    record, record_problem = _read_record(annotations, names)
    if record is not None and record.node != node:
        return claim(problem=f"allocation record names node {record.node}, pod is on {node}")
    if bound and predicate_node and predicate_node != bound:
        return claim(problem=f"{names.predicate_node} names node {predicate_node}, pod is on {bound}")
    try:
        keys = parse_predicate_indices(annotations, names)
        slices = parse_mig_slices(annotations, names)
    except ValueError as error:
        return claim(problem=str(error))
    if keys:
        if request_problem:
            return claim(problem=request_problem)
        try:
            read = claim(*_from_keys(keys, record, record_problem, requests, spec, node, names))
        except ValueError as error:
            return claim(problem=str(error))
    elif record is not None:
        if request_problem:
            return claim(problem=request_problem)
        for container in record.containers:
            disagreement = _disagreement(container, requests.get(container.index))
            if disagreement:
                return claim(problem=f"allocation record: container {container.index} {disagreement}")
        read = claim(record, from_record=frozenset(c.index for c in record.containers), policy=record.policy)
    elif record_problem:
        return claim(problem=record_problem)
    elif bound and request_problem:
        return claim(problem=request_problem)
    elif bound and requests:
        return claim(problem="bound without a card assignment (no allocation or predicate annotations)")
    else:
        read = claim()
    if slices and read.allocation is not None:
        return _on_slices(read, slices, names)
    if slices:
        return claim(problem=f"{names.mig_slice_prefix}<i> names MIG slices but the pod holds no cards")
    return read


def _from_keys(keys: Mapping[int, tuple[int, ...]], record: PodAllocation | None, record_problem: str | None,
               requests: Mapping[int, Request], spec: Mapping[str, Any], node: str,
               names: Names) -> tuple[PodAllocation, None, str | None, frozenset[int], str | None]:
    """The cards the keys name, each container the record's where the record agrees (same cards,
    same amounts), else sized by the requests (UUIDs unknown, a whole card's memory 0).

    Returns the claim's allocation, problem (None), note, from_record and policy; raises
    ValueError naming the key when the keys and the requests disagree.
    """
    note = f"{names.allocation} ignored: {record_problem}" if record_problem else None
    chosen: list[ContainerAllocation] = []
    from_record = []
    spec_containers = None
    for index, cards in sorted(keys.items()):
        request = requests.get(index)
        if request is None:
            raise ValueError(f"{names.predicate_gpu_idx(index)} names cards but container {index} asks for no vGPU")
        if len(cards) > 1 and len(set(cards)) != len(cards):
            raise ValueError(f"{names.predicate_gpu_idx(index)} names a card twice")
        if request.is_share:
            if len(cards) != 1:
                raise ValueError(f"{names.predicate_gpu_idx(index)}={','.join(map(str, cards))}: "
                                 f"a share sits on one card")
        elif len(cards) != request.cards:
            raise ValueError(f"{names.predicate_gpu_idx(index)} names {len(cards)} cards for "
                             f"{request.cards} whole cards")
        if record is not None:
            mine = record.container(index)
            if mine is not None and (_same_share(mine.cards, cards[0], request) if request.is_share else (
                    not _disagreement(mine, request) and sorted(s.index for s in mine.cards) == sorted(cards))):
                chosen.append(mine)
                from_record.append(index)
                continue
            note = f"{names.allocation} disagrees with the predicate keys for container {index}; the keys win"
        if request.is_share:
            shares: tuple[CardShare, ...] = (CardShare(cards[0], "", request.cores, request.memory_units),)
        else:
            shares = tuple(CardShare(card, "", CORES_PER_CARD, 0) for card in cards)
        if spec_containers is None:
            spec_containers = spec.get("containers") or []
        container = spec_containers[index] if index < len(spec_containers) else {}
        name = str(container.get("name", "")) if isinstance(container, Mapping) else ""
        chosen.append(ContainerAllocation(index, name, shares))
    if record is None:
        return PodAllocation(node, tuple(chosen)), None, note, frozenset(from_record), None
    if len(chosen) == len(record.containers) and all(a is b for a, b in zip(chosen, record.containers, strict=True)):
        allocation = record  # the same value as the one built below (same node, version, containers)
    else:
        allocation = PodAllocation(node, tuple(chosen), record.assigned_at_ns, record.policy)
    return allocation, None, note, frozenset(from_record), record.policy


def _on_slices(claim: PodClaim, slices: Mapping[int, str], names: Names) -> PodClaim:
    """The claim with each ``mig-slice-<i>`` key's MIG device on container i's one share (the keys win)."""
    if claim.allocation is None:
        return claim
    containers = []
    for container in claim.allocation.containers:
        device = slices.get(container.index)
        if device is None:
            containers.append(container)
            continue
        if len(container.cards) != 1 or is_whole_card(container.cards[0].cores):
            return replace(claim, allocation=None, from_record=frozenset(),
                           problem=f"{names.mig_slice(container.index)}: a MIG slice holds one share, "
                                   f"container {container.index} asks for whole cards")
        containers.append(replace(container, cards=(replace(container.cards[0], mig_device=device),)))
    unknown = sorted(set(slices) - {c.index for c in claim.allocation.containers})
    if unknown:
        return replace(claim, allocation=None, from_record=frozenset(),
                       problem=f"{names.mig_slice(unknown[0])} names a slice for a container without a card")
    return replace(claim, allocation=replace(claim.allocation, containers=tuple(containers)))


def _read_record(annotations: Mapping[str, Any], names: Names) -> tuple[PodAllocation | None, str | None]:
    raw = annotations.get(names.allocation)
    if not raw:
        return None, None
    try:
        return PodAllocation.from_json(raw), None
    except ValueError as error:
        return None, str(error)


def _same_share(held: tuple[CardShare, ...], card: int, request: Request) -> bool:
    """Whether a record's cards are exactly this share on this card (``_disagreement`` finds
    nothing and the card is the key's), without building the words of a disagreement."""
    return len(held) == 1 and held[0].index == card and held[0].cores == request.cores \
        and held[0].memory_units == request.memory_units


def _disagreement(record: ContainerAllocation, request: Request | None) -> str | None:
    """Why a record's container does not give exactly what the container asks for, or None."""
    if request is None:
        return "asks for no vGPU"
    if request.is_share:
        if len(record.cards) != 1 or record.cores != request.cores or record.memory_units != request.memory_units:
            return f"holds {record.cores} cores / {record.memory_units} units, asks for {request.describe()}"
        return None
    if len(record.cards) != request.cards or not all(s.cores == CORES_PER_CARD for s in record.cards) \
            or len({s.index for s in record.cards}) != len(record.cards):
        return f"holds {len(record.cards)} card share(s), asks for {request.describe()}"
    return None


# --- would a request fit: the rule the extender's fast path uses --------------------------


@dataclass(frozen=True)
class FreeCard:
    """One healthy card's free capacity."""

    index: int
    free_cores: int
    free_memory_units: int
    whole: bool      # nothing held on it


def free_cards(cards: Iterable[tuple[int, int, bool, int, int]]) -> tuple[FreeCard, ...]:
    """Free capacity of each healthy card from (index, memory units, healthy, used cores, used units).

    Over-commitment never shows as negative free capacity.
    """
    return tuple(
        FreeCard(index, max(0, CORES_PER_CARD - used_cores), max(0, memory_units - used_memory),
                 used_cores == 0 and used_memory == 0)
        for index, memory_units, healthy, used_cores, used_memory in cards if healthy
    )


def fits_alone(free: Sequence[FreeCard], request: Request) -> bool:
    """Whether one container's request fits, from the node's free capacity (exact).

    A share needs one healthy card with the cores and the memory free; n whole cards need
    n healthy untouched cards whose memory covers any declared amount (the n largest do if
    any n do). This is the placement policy's own rule, without its ranking work.
    """
    if request.is_share:
        cores, memory = request.cores, request.memory_units
        return any(f.free_cores >= cores and f.free_memory_units >= memory for f in free)
    intact = [f.free_memory_units for f in free if f.whole]
    if len(intact) < request.cards:
        return False
    return not request.memory_units or sum(sorted(intact)[-request.cards:]) >= request.memory_units


def fits_empty(healthy_memory_units: Sequence[int], request: Request) -> bool:
    """Whether one container's request would fit on the node's healthy cards with all of them free."""
    sizes = sorted(healthy_memory_units)
    if request.is_share:
        return bool(sizes) and sizes[-1] >= request.memory_units
    return len(sizes) >= request.cards and sum(sizes[-request.cards:]) >= request.memory_units


def refusal_alone(free: Sequence[FreeCard], request: Request) -> str:
    """Why one container's request does not fit now, in words a person can act on."""
    if request.is_share:
        cores, memory = request.cores, request.memory_units
        if not free:
            return f"needs {cores} cores and {_mib(memory)} on one card; no healthy card is left"
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
    return format_mib(units * MEMORY_UNIT_MIB)
