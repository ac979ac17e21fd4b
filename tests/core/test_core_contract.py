"""The wire contract: names, quantities, request validation, the allocation record."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_vgpu.core.contract import (
    DEFAULT_NAMES,
    CardShare,
    ContainerAllocation,
    Names,
    PodAllocation,
    Request,
    RequestError,
    card_ids_env,
    format_mib,
    parse_container_request,
    parse_count,
    parse_memory_size,
    parse_predicate_indices,
    pod_requests,
    predicate_annotations,
    request_limits,
    validate_request,
)

CORE, MEMORY = DEFAULT_NAMES.core_resource, DEFAULT_NAMES.memory_resource


def test_names_are_gpu_managers_and_gpu_admissions() -> None:
    assert (CORE, MEMORY) == ("tencent.com/vcuda-core", "tencent.com/vcuda-memory")
    assert DEFAULT_NAMES.predicate_gpu_idx(2) == "tencent.com/predicate-gpu-idx-2"
    assert DEFAULT_NAMES.predicate_node == "tencent.com/predicate-node"
    assert DEFAULT_NAMES.gpu_assigned == "tencent.com/gpu-assigned"
    custom = Names("example.org", "vgpu.example.org")
    assert custom.core_resource == "example.org/vcuda-core"
    assert custom.node_inventory == "vgpu.example.org/gpu-inventory"
    with pytest.raises(ValueError, match="resource domain 'Tencent.com/' is not a DNS subdomain"):
        Names("Tencent.com/")


@pytest.mark.parametrize(("value", "count"), [
    (25, 25), ("25", 25), (" 25 ", 25), (25.0, 25), ("1k", 1000), ("1Ki", 1024), ("1e3", 1000), ("+5", 5), ("0", 0),
])
def test_counts(value: object, count: int) -> None:
    assert parse_count(value, CORE) == count


@pytest.mark.parametrize(("value", "message"), [
    ("250m", "is not a whole number"), ("0.5", "is not a whole number"), (0.5, "is not a whole number"),
    ("-1", "is negative"), (-3, "is negative"), ("lots", "is not a quantity"), ("", "is not a quantity"),
    (True, "is not a count"), (None, "is not a count"), ([25], "is not a count"), (float("nan"), "whole number"),
])
def test_bad_counts_name_the_resource_and_value(value: object, message: str) -> None:
    with pytest.raises(RequestError, match=message) as error:
        parse_count(value, CORE)
    assert str(error.value).startswith(f"{CORE}: {value!r}")


def test_requests_shares_and_whole_cards() -> None:
    share = Request(25, 16)
    assert share.is_share and share.cards == 1 and share.memory_mib == 4096
    assert share.describe() == "25 % of one card with 4 GiB"
    whole = Request(300)
    assert not whole.is_share and whole.cards == 3 and whole.describe() == "3 whole cards"
    assert Request(100, 80).describe() == "1 whole card (20 GiB declared)"


@pytest.mark.parametrize(("cores", "memory", "message"), [
    (0, 0, "asks for no GPU"),
    (0, 5, "memory comes with a share of compute"),
    (25, 0, "is a share of one card and needs vcuda-memory too"),
    (150, 0, "did you mean 100 or 200"),
    (99, 10**9, "more than any card has"),
    (200, 10**9, "more than 2 card\\(s\\) could have"),
    (-1, 4, "is negative"),
    (True, 4, "is not a whole number"),
])
def test_invalid_requests_are_refused_with_a_reason(cores: int, memory: int, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        validate_request(cores, memory)
    with pytest.raises(RequestError, match=message):
        Request(cores, memory)


@settings(max_examples=200, deadline=None)
@given(st.integers(-5, 1000), st.integers(-5, 5000))
def test_a_request_is_valid_exactly_when_the_rules_say(cores: int, memory: int) -> None:
    valid = (
        cores >= 0 and memory >= 0 and cores != 0
        and ((cores < 100 and 1 <= memory <= 2048) or (cores >= 100 and cores % 100 == 0
                                                          and memory <= cores // 100 * 2048))
    )
    try:
        Request(cores, memory)
    except RequestError as error:
        assert not valid and str(error)
    else:
        assert valid


def test_container_request_from_limits_or_requests() -> None:
    assert parse_container_request({CORE: "25", MEMORY: "16"}) == Request(25, 16)
    assert parse_container_request(None, {CORE: 200}) == Request(200)
    assert parse_container_request({CORE: 25, MEMORY: 16}, {CORE: 25, MEMORY: 16}) == Request(25, 16)
    assert parse_container_request({"cpu": "1"}) is None
    assert parse_container_request({CORE: "0"}) is None
    with pytest.raises(RequestError, match="request 20 differs from limit 25"):
        parse_container_request({CORE: 25, MEMORY: 16}, {CORE: 20, MEMORY: 16})
    with pytest.raises(RequestError, match="vcuda-memory without tencent.com/vcuda-core"):
        parse_container_request({MEMORY: 16})


def test_pod_requests_index_containers_like_gpu_admission() -> None:
    pod = {"spec": {"containers": [
        {"name": "sidecar", "resources": {}},
        {"name": "notebook", "resources": {"limits": {CORE: "30", MEMORY: "40"}}},
        {"name": "trainer", "resources": {"limits": {CORE: "200"}}},
    ]}}
    assert pod_requests(pod) == {1: Request(30, 40), 2: Request(200)}
    pod["spec"]["containers"][2]["resources"]["limits"][CORE] = "250"
    with pytest.raises(RequestError, match="container 'trainer': tencent.com/vcuda-core=250"):
        pod_requests(pod)
    init = {"spec": {"initContainers": [{"name": "warmup", "resources": {"limits": {CORE: "10", MEMORY: "4"}}}],
                     "containers": []}}
    with pytest.raises(RequestError, match="init container 'warmup' asks for a vGPU"):
        pod_requests(init)


def allocation() -> PodAllocation:
    return PodAllocation(
        node="gpu-1",
        containers=(
            ContainerAllocation(0, "notebook", (CardShare(3, "GPU-3", 30, 40),)),
            ContainerAllocation(2, "trainer", (CardShare(0, "GPU-0", 100, 96), CardShare(1, "GPU-1", 100, 96))),
        ),
        assigned_at_ns=1_700_000_000_000_000_000,
        policy="spread",
    )


def test_allocation_round_trip_and_annotations() -> None:
    record = allocation()
    assert PodAllocation.from_json(record.to_json()) == record
    assert record.container(2).cores == 200 and record.container(2).memory_units == 192
    assert record.container(1) is None
    annotations = predicate_annotations(record)
    assert annotations["tencent.com/predicate-gpu-idx-0"] == "3"
    assert annotations["tencent.com/predicate-gpu-idx-2"] == "0,1"
    assert annotations["tencent.com/predicate-node"] == "gpu-1"
    assert annotations["tencent.com/gpu-assigned"] == "false"
    assert annotations["tencent.com/predicate-time"] == "1700000000000000000"
    assert json.loads(annotations[DEFAULT_NAMES.allocation])["policy"] == "spread"
    assert parse_predicate_indices(annotations) == {0: (3,), 2: (0, 1)}


@pytest.mark.parametrize(("text", "message"), [
    ("{", "not JSON"),
    ("null", "not an object"),
    (json.dumps({"version": 9, "node": "n", "containers": []}), "unsupported allocation version 9"),
    (json.dumps({"containers": []}), "malformed"),
    (json.dumps({"node": "n", "containers": [{"index": 0, "cards": [{"index": True, "cores": 1, "memoryUnits": 1}]}]}),
     "card index True is not a non-negative integer"),
    (json.dumps({"node": "n", "containers": [{"index": -1, "cards": []}]}), "container index -1"),
    (json.dumps({"node": "n", "containers": 5}), "malformed"),
])
def test_malformed_allocations_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PodAllocation.from_json(text)


def test_predicate_indices_refuse_garbage() -> None:
    with pytest.raises(ValueError, match="expected card indices like '1' or '0,3'"):
        parse_predicate_indices({"tencent.com/predicate-gpu-idx-0": "a,b"})
    with pytest.raises(ValueError, match="container index 'x' is not a number"):
        parse_predicate_indices({"tencent.com/predicate-gpu-idx-x": "1"})
    assert parse_predicate_indices({"other": "1", "tencent.com/predicate-gpu-idx-1": " 2 , 5 "}) == {1: (2, 5)}


@pytest.mark.parametrize(("text", "units"), [
    ("4GiB", 16), ("4096MiB", 16), ("4Gi", 16), (" 8 GiB ", 32), ("1.5GiB", 6), ("16", 16), (16, 16), ("1TiB", 4096),
])
def test_memory_sizes(text: str | int, units: int) -> None:
    assert parse_memory_size(text) == units


@pytest.mark.parametrize(("text", "message"), [
    ("100MiB", "not a multiple of 256 MiB"), ("0", "must be more than zero"), ("4GB", "unknown unit 'GB'"),
    ("lots", "use e.g. 4GiB"), (True, "is not a size"), ("1.5", "must be whole"), (-2, "more than zero"),
])
def test_bad_memory_sizes(text: str | int, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        parse_memory_size(text)


def test_formatting_helpers() -> None:
    assert [format_mib(m) for m in (768, 1024, 1536, 40960)] == ["768 MiB", "1 GiB", "1.5 GiB", "40 GiB"]
    assert request_limits(Request(25, 16)) == {CORE: "25", MEMORY: "16"}
    assert request_limits(Request(200)) == {CORE: "200"}
    assert card_ids_env([0, 3]) == "0,3"


def test_annotations_nested_past_the_json_readers_depth_are_malformed_not_a_crash() -> None:
    """Anyone who can create pods writes these annotations: 5,000 open brackets are refused as
    malformed (a ValueError every reader handles), never a RecursionError that ends a daemon's thread."""
    from jupyter_vgpu.core.claims import pod_claim
    from jupyter_vgpu.core.inventory import NodeInventory
    from jupyter_vgpu.core.topology import Topology

    deep = "[" * 5000
    for reader in (PodAllocation.from_json, NodeInventory.from_json, Topology.from_json):
        with pytest.raises(ValueError, match="not JSON"):
            reader(deep)
    pod = {"metadata": {"name": "deep", "namespace": "t", "uid": "u1", "annotations": {DEFAULT_NAMES.allocation: deep}},
           "spec": {"nodeName": "node-1", "containers": [{"name": "c0"}]}, "status": {"phase": "Pending"}}
    claim = pod_claim(pod)
    assert claim is not None and claim.allocation is None and "not JSON" in (claim.problem or "")


def test_a_trailing_newline_is_not_part_of_a_name_or_number() -> None:
    """``$`` matches before a final newline; the patterns end at ``\\Z`` so "2g.10gb\\n" is no MIG
    profile (the name would be carried on into annotations and env as written)."""
    from jupyter_vgpu.core.mig import check_profile_name

    assert check_profile_name("2g.10gb") == "2g.10gb"
    with pytest.raises(ValueError, match="not a MIG profile"):
        check_profile_name("2g.10gb\n")
