"""The fast claim reader says exactly what the reference reader said, on any pod.

``core_claims_support.pod_claim`` is the claim reader (and the contract parsers it called) as
it stood before the ledger rebuild was made fast. Pods here are built the way a cluster's
pods look (requests, gpu-admission's keys, an allocation record, MIG-slice keys that agree)
and then spoiled the way a tenant could spoil them: keys naming other cards or twice the same
card, records that are not JSON or disagree in amounts, nodes, versions or types, quantities
that are not counts, maps that are lists. Both readers must return equal claims, or raise the
same exception with the same words.
"""

from __future__ import annotations

import json
from typing import Any

from core_claims_support import pod_claim as reference_pod_claim
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from jupyter_vgpu.core import claims
from jupyter_vgpu.core.contract import (
    DEFAULT_NAMES,
    CardShare,
    ContainerAllocation,
    Names,
    PodAllocation,
    predicate_annotations,
)

N = DEFAULT_NAMES
OTHER = Names(domain="example.com", project_domain="vgpu.example.org")
NODES = ("node-a", "node-b")

quantities = st.one_of(
    st.sampled_from(["25", "10", "100", "200", "0", "80", "32", "16", "1k", "0.5", "-1", "250m", "1e3", "lots", "",
                     " 25 ", "1e999999999", "9" * 70, "100Ei", "1Gi"]),
    st.integers(-5, 300), st.floats(allow_nan=True), st.booleans(), st.none(), st.text(max_size=6),
    st.lists(st.integers(), max_size=2),
)
json_junk = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 2**70), st.floats(allow_nan=False), st.text(max_size=6)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)
SHAPES = [(25, 80), (10, 32), (100, 0), (200, 0), (200, 16), (0, 0)]


def records(nodes: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Allocation annotations a tenant could write: not JSON, the wrong shape, or a record's shape
    with any node, indices, amounts, MIG devices and token ids (negative ones included)."""
    return st.one_of(
        st.builds(lambda d: json.dumps(d), json_junk),
        st.sampled_from(["{", "", "null", '{"version": 2, "node": "node-a", "containers": []}',
                         '{"node": "node-a", "containers": [{"index": 0, "cards": []}]}',
                         '{"node": "node-a", "containers": [{"index": -1, "cards": []}]}',
                         '{"node": "node-b", "containers": [{"index": 0, "cards": [{"index": 0, '
                         '"cores": 25, "memoryUnits": 80, "migDevice": "MIG-x"}], "allocationId": "a b"}]}']),
        st.builds(lambda a: a.to_json(), st.builds(
            PodAllocation, nodes, st.lists(st.builds(
                ContainerAllocation, st.integers(-1, 2), st.text(max_size=3), st.lists(st.builds(
                    CardShare, st.integers(-1, 7), st.text(max_size=3), st.sampled_from([10, 25, 100, 0, -5]),
                    st.sampled_from([0, 32, 80, -1]), st.sampled_from(["", "", "MIG-1", "MIG 1"])),
                    max_size=2).map(tuple), st.sampled_from(["", "", "tok-1", "a b"])),
                max_size=2).map(tuple))),
    )


def resources_for(draw: Any, shape: tuple[int, int], names: Names) -> Any:
    """A container's resources for ``shape``, sometimes spoiled."""
    cores, memory = shape
    limits: dict[str, Any] = {"cpu": "2", names.core_resource: str(cores)}
    if memory:
        limits[names.memory_resource] = str(memory)
    how = draw(st.sampled_from(["both"] * 6 + ["limits", "requests", "int", "spoiled", "junk", "none"]))
    if how == "both":
        return {"limits": limits, "requests": dict(limits)}
    if how == "limits":
        return {"limits": limits}
    if how == "requests":
        return {"requests": limits}
    if how == "int":
        return {"limits": {k: (int(v) if k != "cpu" else v) for k, v in limits.items()}}
    if how == "spoiled":
        spoiled = dict(limits)
        spoiled[draw(st.sampled_from(names.resources))] = draw(quantities)
        return {"limits": limits, "requests": spoiled} if draw(st.booleans()) else {"limits": spoiled}
    if how == "junk":
        return draw(st.one_of(json_junk, st.fixed_dictionaries({}, optional={"limits": json_junk,
                                                                               "requests": json_junk})))
    return None


def cards_for(draw: Any, shape: tuple[int, int]) -> list[int]:
    count = 1 if shape[0] < 100 else max(1, shape[0] // 100)
    return draw(st.lists(st.integers(0, 7), min_size=count, max_size=count, unique=True))


@st.composite
def pods(draw: Any) -> tuple[dict[str, Any], Names]:
    names = draw(st.sampled_from([N, N, N, OTHER]))
    node = draw(st.sampled_from(NODES))
    shapes = draw(st.lists(st.sampled_from(SHAPES), min_size=draw(st.sampled_from([0, 1, 1])), max_size=3))
    containers = []
    for index, shape in enumerate(shapes):
        container: dict[str, Any] = {"name": draw(st.sampled_from([f"c{index}", "", "nb"]))}
        resources = resources_for(draw, shape, names)
        if resources is not None:
            container["resources"] = resources
        containers.append(container)
    held = [ContainerAllocation(i, c["name"], tuple(
        CardShare(card, f"GPU-{card}", shape[0] if shape[0] < 100 else 100, shape[1] if shape[0] < 100 else 0)
        for card in cards_for(draw, shape))) for i, (shape, c) in enumerate(zip(shapes, containers, strict=True)) if shape[0]]
    allocation = PodAllocation(node, tuple(held), assigned_at_ns=draw(st.integers(0, 10)),
                               policy=draw(st.sampled_from(["binpack", "spread"])))
    written = draw(st.sampled_from(["ours", "ours", "keys only", "record only", "theirs", "nothing"]))
    annotations: dict[str, Any] = predicate_annotations(allocation, names) if held and written != "nothing" else {}
    if written == "keys only":  # gpu-admission's hand-off alone
        annotations.pop(names.allocation, None)
    elif written == "record only":  # an older release's record alone
        annotations = {k: v for k, v in annotations.items() if not k.startswith(names.predicate_gpu_idx_prefix)}
    elif written == "theirs":  # a record the tenant wrote, for the pod's own node
        annotations[names.allocation] = draw(records(st.just(node)))
    shares = [c.index for c in held if len(c.cards) == 1 and c.cards[0].cores < 100]
    if shares and draw(st.booleans()):  # a share on a MIG slice, as our bind writes it
        annotations[names.mig_slice(shares[0])] = draw(st.sampled_from(["MIG-1", "MIG-abc/1", "GPU-1", "", "MIG-1"]))
    for _ in range(draw(st.sampled_from([0, 0, 0, 0, 1, 2, 3]))):  # what a tenant (or an older release) may have written
        key = draw(st.sampled_from([names.allocation, names.predicate_node, names.predicate_gpu_idx(0),
                                    names.predicate_gpu_idx(1), names.predicate_gpu_idx(9), names.mig_slice(0),
                                    names.mig_slice(1), names.predicate_gpu_idx_prefix + "x",
                                    names.mig_slice_prefix + "1234567", "other/key"]))
        if key == names.allocation:
            value: Any = draw(records(st.sampled_from(NODES)))
        elif key == names.predicate_node:
            value = draw(st.sampled_from([*NODES, "", "node-c"]))
        elif key.startswith(names.mig_slice_prefix):
            value = draw(st.sampled_from(["MIG-1", "MIG-2", "MIG-" + "a" * 120, "nope", ""]))
        else:
            value = draw(st.one_of(st.sampled_from(["0", "1", "0,1", "1,1", " 2 ", "", "x", "-1", "0,,3", "٣", "²", "1,²"]),
                                   st.text(max_size=4)))
        annotations[key] = value
    if draw(st.integers(0, 19)) == 0:
        annotations = draw(st.sampled_from([None, {}, {names.predicate_node: None}]))
    spec: dict[str, Any] = {"containers": containers, "schedulerName": draw(st.sampled_from(["vgpu-scheduler",
                                                                                           "default", ""]))}
    placed = draw(st.sampled_from(["bound", "bound", "predicate", "none"]))
    if placed == "bound":
        spec["nodeName"] = draw(st.sampled_from([node] * 5 + ["node-c"]))
    elif placed == "predicate":
        annotations = dict(annotations or {})
        annotations[names.predicate_node] = node
    if draw(st.integers(0, 9)) == 0:
        spec["initContainers"] = [{"name": "init", "resources": resources_for(draw, (25, 80), names)}]
    if draw(st.integers(0, 14)) == 0:
        spec["containers"] = draw(st.sampled_from([None, "c", [1], {}]))
    pod = {"metadata": {"uid": "u-1", "namespace": "ns", "name": "p", "annotations": annotations},
           "spec": spec, "status": {"phase": draw(st.sampled_from(["Running"] * 4 + ["Pending", "Succeeded", "Failed"]))}}
    return pod, names


def outcome(read: Any, pod: dict[str, Any], names: Names, schedulers: Any) -> Any:
    try:
        return "claim", read(pod, names, schedulers=schedulers)
    except Exception as error:  # both readers must fail alike, if at all
        return "raised", type(error), str(error)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=pods(), schedulers=st.sampled_from([None, frozenset({"vgpu-scheduler"})]))
@example(case=({"metadata": {"annotations": {N.predicate_gpu_idx(0): "1,1"}},
                "spec": {"nodeName": "n", "containers": [{"resources": {"limits": {N.core_resource: "200"}}}]}}, N),
         schedulers=None)
def test_the_fast_reader_agrees_with_the_reference(case: tuple[dict[str, Any], Names], schedulers: Any) -> None:
    pod, names = case
    fast = outcome(claims.pod_claim, pod, names, schedulers)
    assert fast == outcome(reference_pod_claim, json.loads(json.dumps(pod)), names, schedulers)
    assert fast == outcome(claims.pod_claim, pod, names, schedulers)  # a second read (caches warm) agrees too


def test_the_generated_pods_reach_every_kind_of_claim() -> None:
    """The generator is worth its name: it makes agreeing records, disagreeing ones and refusals."""
    seen: set[str] = set()

    @settings(max_examples=1000, deadline=None, database=None, derandomize=True)  # the same examples every run: no flake
    @given(case=pods())
    def collect(case: tuple[dict[str, Any], Names]) -> None:
        claim = claims.pod_claim(*case)
        if claim is None:
            seen.add("none")
        elif claim.problem:
            seen.add("problem")
        elif claim.allocation is not None and claim.from_record:
            seen.add("from record" + (" with slice" if any(
                s.mig_device for c in claim.allocation.containers for s in c.cards) else ""))
        elif claim.allocation is not None:
            seen.add("from keys" + (" with note" if claim.note else ""))

    collect()
    assert {"none", "problem", "from record", "from record with slice", "from keys",
            "from keys with note"} <= seen, seen
