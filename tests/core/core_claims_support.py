"""The claim reader as it stood before the ledger rebuild was made fast (issue #18, third pass).

``pod_claim`` here is the old ``jupyter_vgpu.core.claims.pod_claim`` with the contract parsers
it called (``pod_requests``, ``PodAllocation.from_json``, the predicate and MIG-slice keys),
copied verbatim: the reference that ``test_core_claims_equivalence.py`` holds the product's
faster reader to, on generated pods with hostile annotations. It is not product code.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

from jupyter_vgpu.core.claims import PodClaim, is_finished, is_whole_card
from jupyter_vgpu.core.contract import (
    ALLOCATION_VERSION,
    CORES_PER_CARD,
    DEFAULT_NAMES,
    CardShare,
    ContainerAllocation,
    Names,
    PodAllocation,
    Request,
    RequestError,
    _allocation_id,
    check_mig_device,
    parse_count,
    validate_request,
)


def parse_container_request(
    limits: Mapping[str, object] | None,
    requests: Mapping[str, object] | None = None,
    names: Names = DEFAULT_NAMES,
) -> Request | None:
    """The vGPU request in a container's resources, None when it asks for none.

    Extended resources cannot be overcommitted, so Kubernetes requires requests to equal
    limits; a container that sets only requests or only limits is read from whichever is set.
    """
    for what, given in (("limits", limits), ("requests", requests)):
        if given is not None and not isinstance(given, Mapping):
            raise RequestError(f"resources.{what} must be a map of resource names to quantities, "
                               f"not {type(given).__name__}")
    limits = limits or {}
    requests = requests or {}
    values: dict[str, int | None] = {}
    for resource in names.resources:
        limit = parse_count(limits[resource], resource) if resource in limits else None
        request = parse_count(requests[resource], resource) if resource in requests else None
        if limit is not None and request is not None and limit != request:
            raise RequestError(
                f"{resource}: request {request} differs from limit {limit}; extended resources "
                f"cannot be overcommitted, set both to the same value"
            )
        values[resource] = limit if limit is not None else request
    cores, memory = values[names.core_resource], values[names.memory_resource]
    if cores is None and memory is None:
        return None
    if cores is None:
        raise RequestError(
            f"{names.memory_resource} without {names.core_resource}: memory comes with a share of "
            f"compute; add {names.core_resource} (1-99 for a share, 100 per whole card)"
        )
    if cores == 0 and not memory:
        return None
    validate_request(cores, memory or 0, names.core_resource, names.memory_resource)
    return Request(cores, memory or 0)


def pod_requests(pod: Mapping[str, Any], names: Names = DEFAULT_NAMES) -> dict[int, Request]:
    """Container index -> Request for every container of a pod (a dict as the API returns it).

    Indexes count ``spec.containers`` as gpu-admission does. An init container asking for a
    vGPU is refused: its share would be held for the pod's whole life for a moment's use.
    Raises RequestError naming the container on the first invalid request.
    """
    spec = _mapping(pod.get("spec"), "spec")
    for container in _containers(spec.get("initContainers") or spec.get("init_containers"), "init container"):
        resources = _mapping(container.get("resources"), f"init container {container.get('name')!r}: resources")
        for key in ("limits", "requests"):
            given = resources.get(key) or {}
            if not isinstance(given, Mapping):
                raise RequestError(f"init container {container.get('name')!r}: resources.{key} must be a map "
                                   f"of resource names to quantities, not {type(given).__name__}")
            if any(r in given for r in names.resources):
                raise RequestError(
                    f"init container {container.get('name')!r} asks for a vGPU; only regular containers can"
                )
    result: dict[int, Request] = {}
    for index, container in enumerate(_containers(spec.get("containers"), "container")):
        try:
            resources = _mapping(container.get("resources"), "resources")
            request = parse_container_request(resources.get("limits"), resources.get("requests"), names)
        except RequestError as error:
            raise RequestError(f"container {container.get('name')!r}: {error}") from None
        if request is not None:
            result[index] = request
    return result


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RequestError(f"{what} must be an object, not {type(value).__name__}")
    return value


def _containers(value: object, what: str) -> list[Mapping[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(c, Mapping) for c in value):
        raise RequestError(f"the pod's {what}s must be a list of objects")
    return value


def allocation_from_json(text: str) -> PodAllocation:
    """Parse an allocation annotation; ValueError with the reason when it is malformed."""
    try:
        data = json.loads(text)
    except (TypeError, json.JSONDecodeError) as error:
        raise ValueError(f"allocation annotation is not JSON: {error}") from None
    try:
        if not isinstance(data, dict):
            raise TypeError("not an object")
        version = int(data.get("version", ALLOCATION_VERSION))
        if version != ALLOCATION_VERSION:
            raise ValueError(f"unsupported allocation version {version}")
        containers = tuple(
            ContainerAllocation(
                index=_nonneg(c["index"], "container index"),
                name=str(c.get("name", "")),
                cards=tuple(
                    CardShare(
                        index=_nonneg(s["index"], "card index"),
                        uuid=str(s.get("uuid", "")),
                        cores=_nonneg(s["cores"], "cores"),
                        memory_units=_nonneg(s["memoryUnits"], "memoryUnits"),
                        mig_device=check_mig_device(s.get("migDevice", ""), allow_empty=True),
                    )
                    for s in c["cards"]
                ),
                allocation_id=_allocation_id(c.get("allocationId", "")),
            )
            for c in data["containers"]
        )
        return PodAllocation(
            node=str(data["node"]),
            containers=containers,
            assigned_at_ns=int(data.get("assignedAtNs", 0)),
            policy=str(data.get("policy", "binpack")),
            version=version,
        )
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"allocation annotation is malformed: {error!s}") from None


def parse_predicate_indices(annotations: Mapping[str, str], names: Names = DEFAULT_NAMES) -> dict[int, tuple[int, ...]]:
    """Container index -> card indices from gpu-admission's ``predicate-gpu-idx-<i>`` keys.

    Raises ValueError naming the key when a value is not a comma-separated list of indices.
    """
    result: dict[int, tuple[int, ...]] = {}
    prefix = names.predicate_gpu_idx_prefix
    for key, value in annotations.items():
        if not key.startswith(prefix):
            continue
        suffix = key[len(prefix):]
        if not suffix.isdigit():
            raise ValueError(f"annotation {key!r}: container index {suffix!r} is not a number")
        parts = [p.strip() for p in str(value).split(",") if p.strip()]
        if not parts or not all(p.isdigit() for p in parts):
            raise ValueError(f"annotation {key}={value!r}: expected card indices like '1' or '0,3'")
        result[int(suffix)] = tuple(int(p) for p in parts)
    return result


def parse_mig_slices(annotations: Mapping[str, str], names: Names = DEFAULT_NAMES) -> dict[int, str]:
    """Container index -> MIG device UUID from the ``mig-slice-<i>`` keys our bind writes.

    Raises ValueError naming the key when the index or the UUID is malformed, or when two
    containers name the same slice (a slice is held whole, by one container).
    """
    result: dict[int, str] = {}
    prefix = names.mig_slice_prefix
    for key, value in annotations.items():
        if not key.startswith(prefix):
            continue
        suffix = key[len(prefix):]
        if not suffix.isdigit() or len(suffix) > 6:
            raise ValueError(f"annotation {key!r}: container index {suffix!r} is not a number")
        try:
            result[int(suffix)] = check_mig_device(value)
        except ValueError as error:
            raise ValueError(f"annotation {key}: {error}") from None
    if len(set(result.values())) != len(result):
        raise ValueError(f"annotations {prefix}<i> name one MIG slice for several containers")
    return result


def pod_claim(pod: Mapping[str, Any], names: Names = DEFAULT_NAMES, *,
              schedulers: Collection[str] | None = None) -> PodClaim | None:
    """The pod's claim, or None when it holds nothing and names nothing worth a note.

    None for finished pods, pods on no node (neither bound nor carrying a predicate node),
    and unbound pods that ask for no (valid) vGPU or belong to another scheduler.
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
    claim = PodClaim(uid=str(metadata.get("uid") or ""), namespace=str(metadata.get("namespace") or ""),
                     name=str(metadata.get("name") or ""), node=node, bound=bool(bound), scheduler=scheduler,
                     requests=requests)

    def refused(problem: str) -> PodClaim:
        return replace(claim, problem=problem)

    record, record_problem = _read_record(annotations, names)
    if record is not None and record.node != node:
        return refused(f"allocation record names node {record.node}, pod is on {node}")
    if bound and predicate_node and predicate_node != bound:
        return refused(f"{names.predicate_node} names node {predicate_node}, pod is on {bound}")
    try:
        keys = parse_predicate_indices(annotations, names)
        slices = parse_mig_slices(annotations, names)
    except ValueError as error:
        return refused(str(error))
    read = _read_cards(claim, keys, record, record_problem, request_problem, bound, requests, spec, names)
    if slices and read.allocation is not None:
        return _on_slices(read, slices, names)
    if slices and read.problem is None:
        return refused(f"{names.mig_slice_prefix}<i> names MIG slices but the pod holds no cards")
    return read


def _read_cards(claim: PodClaim, keys: Mapping[int, tuple[int, ...]], record: PodAllocation | None,
                record_problem: str | None, request_problem: str | None, bound: str,
                requests: Mapping[int, Request], spec: Mapping[str, Any], names: Names) -> PodClaim:
    """The claim's cards from the predicate keys, else the record (see the module docstring)."""

    def refused(problem: str) -> PodClaim:
        return replace(claim, problem=problem)

    if keys:
        if request_problem:
            return refused(request_problem)
        try:
            containers = _from_keys(keys, requests, spec, names)
        except ValueError as error:
            return refused(str(error))
        return _with_record(claim, containers, record, record_problem, names)
    if record is not None:
        if request_problem:
            return refused(request_problem)
        for container in record.containers:
            disagreement = _disagreement(container, requests.get(container.index))
            if disagreement:
                return refused(f"allocation record: container {container.index} {disagreement}")
        return replace(claim, allocation=record, from_record=frozenset(c.index for c in record.containers),
                        policy=record.policy)
    if record_problem:
        return refused(record_problem)
    if bound and request_problem:
        return refused(request_problem)
    if bound and requests:
        return refused("bound without a card assignment (no allocation or predicate annotations)")
    return claim


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
        return allocation_from_json(raw), None
    except ValueError as error:
        return None, str(error)


def _from_keys(keys: Mapping[int, tuple[int, ...]], requests: Mapping[int, Request],
               spec: Mapping[str, Any], names: Names) -> tuple[ContainerAllocation, ...]:
    """The cards the keys name, sized by the requests (UUIDs unknown, a whole card's memory 0)."""
    spec_containers = spec.get("containers") or []
    containers = []
    for index, cards in sorted(keys.items()):
        key = names.predicate_gpu_idx(index)
        request = requests.get(index)
        if request is None:
            raise ValueError(f"{key} names cards but container {index} asks for no vGPU")
        if len(set(cards)) != len(cards):
            raise ValueError(f"{key} names a card twice")
        if request.is_share:
            if len(cards) != 1:
                raise ValueError(f"{key}={','.join(map(str, cards))}: a share sits on one card")
            shares: tuple[CardShare, ...] = (CardShare(cards[0], "", request.cores, request.memory_units),)
        else:
            if len(cards) != request.cards:
                raise ValueError(f"{key} names {len(cards)} cards for {request.cards} whole cards")
            shares = tuple(CardShare(card, "", CORES_PER_CARD, 0) for card in cards)
        container = spec_containers[index] if index < len(spec_containers) else {}
        name = str(container.get("name", "")) if isinstance(container, Mapping) else ""
        containers.append(ContainerAllocation(index, name, shares))
    return tuple(containers)


def _with_record(claim: PodClaim, containers: tuple[ContainerAllocation, ...], record: PodAllocation | None,
                 record_problem: str | None, names: Names) -> PodClaim:
    """The keys' containers, each replaced by the record's where the record agrees."""
    note = f"{names.allocation} ignored: {record_problem}" if record_problem else None
    chosen, from_record = [], set()
    for container in containers:
        mine = record.container(container.index) if record is not None else None
        if mine is not None and not _disagreement(mine, claim.requests.get(container.index)) and \
                sorted(s.index for s in mine.cards) == sorted(s.index for s in container.cards):
            chosen.append(mine)
            from_record.add(container.index)
            continue
        if mine is not None or record is not None:
            note = f"{names.allocation} disagrees with the predicate keys for container {container.index}; the keys win"
        chosen.append(container)
    allocation = PodAllocation(node=claim.node, containers=tuple(chosen),
                               assigned_at_ns=record.assigned_at_ns if record is not None else 0,
                               policy=record.policy if record is not None else "binpack")
    return replace(claim, allocation=allocation, from_record=frozenset(from_record), note=note,
                    policy=record.policy if record is not None else None)


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


def _nonneg(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} {value!r} is not a non-negative integer")
    return value
