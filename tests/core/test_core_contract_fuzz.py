"""Hostile quantities and shapes: the contract refuses them with a RequestError, never anything else.

Pod specs reach the contract from anyone who can create a pod (extender, device plugin, metrics)
and from notebook users (the Hub's options, the server extension's requests): no input may raise
an arithmetic error, exhaust memory or produce a number no later code can print.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import DEFAULT_NAMES, RequestError

CORE, MEMORY = DEFAULT_NAMES.core_resource, DEFAULT_NAMES.memory_resource

quantity_text = st.one_of(
    st.from_regex(r"\A[+-]?[0-9.]{1,12}([eE][+-]?[0-9]{1,12})?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m|u|n)?\Z"),
    st.text(max_size=40),
    st.sampled_from(["1e999999999", "1e5000", "1E+4300", "-1e999999999", "1e-999999999", "9" * 70,
                     "1" + "0" * 63, "1Ei", "8Ei", "NaN", "Infinity", "0x10", "1_000", "١٢", "."]),
)
quantity = st.one_of(quantity_text, st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                     st.booleans(), st.none(), st.lists(st.integers(), max_size=2),
                     st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8), quantity_text),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=12,
)
resource_maps = st.one_of(
    st.fixed_dictionaries({}, optional={CORE: quantity, MEMORY: quantity}),
    json_values,
)


@settings(max_examples=600, deadline=None)
@given(value=quantity)
def test_counts_are_bounded_or_refused(value: Any) -> None:
    try:
        count = c.parse_count(value, CORE)
    except RequestError as error:
        assert CORE in str(error) and len(str(error)) < 400
    else:
        assert isinstance(count, int) and 0 <= count <= c.MAX_COUNT
        str(count)  # printable: no 5000-digit numbers


@pytest.mark.parametrize("value, words", [
    ("1e999999999", "exponent"),    # decimal.Overflow before
    ("-1e999999999", "exponent"),
    ("1e5000", "exponent"),         # parsed to a 5001-digit count before, and crashed later
    ("9" * 70, "characters"),
    ("100Ei", "more than any node has"),
    (2**64, "more than any node has"),
    (float("nan"), "not a count"),
    (float("inf"), "not a count"),
])
def test_absurd_quantities_are_refused_before_any_arithmetic(value: Any, words: str) -> None:
    with pytest.raises(RequestError, match=words):
        c.parse_count(value, CORE)


@pytest.mark.parametrize("limits", [["tencent.com/vcuda-core", "25"], "tencent.com/vcuda-core=25", 25, True])
def test_limits_and_requests_must_be_maps(limits: Any) -> None:
    with pytest.raises(RequestError, match="resources.limits must be a map"):
        c.parse_container_request(limits, None)
    with pytest.raises(RequestError, match="resources.requests must be a map"):
        c.parse_container_request(None, limits)
    pod = {"spec": {"containers": [{"name": "nb", "resources": {"limits": limits}}]}}
    with pytest.raises(RequestError, match="container 'nb': resources.limits must be a map"):
        c.pod_requests(pod)


@settings(max_examples=400, deadline=None)
@given(limits=resource_maps, requests=resource_maps)
def test_container_requests_never_raise_anything_else(limits: Any, requests: Any) -> None:
    try:
        request = c.parse_container_request(limits, requests)
    except RequestError:
        return
    assert request is None or (0 < request.cores <= c.MAX_COUNT and request.describe())


@settings(max_examples=300, deadline=None)
@given(spec=json_values, containers=st.lists(st.one_of(
    json_values, st.fixed_dictionaries({"name": st.text(max_size=5)},
                                       optional={"resources": st.fixed_dictionaries(
                                           {}, optional={"limits": resource_maps, "requests": resource_maps})}),
), max_size=3), init=st.booleans())
def test_pod_requests_never_raise_anything_else(spec: Any, containers: Any, init: bool) -> None:
    for pod in ({"spec": spec}, {"spec": {"initContainers" if init else "containers": containers}}):
        try:
            requests = c.pod_requests(pod)
        except RequestError:
            continue
        assert all(isinstance(r, c.Request) for r in requests.values())


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(quantity_text, st.integers(min_value=-10, max_value=10**6), st.none(), st.floats()))
def test_memory_sizes_never_raise_anything_else(text: Any) -> None:
    try:
        units = c.parse_memory_size(text)
    except RequestError:
        return
    assert isinstance(units, int) and units > 0
