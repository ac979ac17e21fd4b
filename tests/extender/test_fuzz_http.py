"""Fuzzed pods against filter, prioritize and bind over real HTTP: never a 500, always a reason.

Quantities and resource shapes come from whoever writes the pod spec; kube-scheduler passes
them on as they are. Before the contract bounded quantities, ``1e999999999`` made filter
answer 500 (decimal.Overflow), ``1e5000`` passed and crashed while explaining the refusal,
and limits given as a string made every verb answer 500.
"""

from __future__ import annotations

import itertools
import json
import urllib.request

import pytest
from extender_support import NAMES, binding_args, filter_args, node, pod, post
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CORE, MEMORY = NAMES.core_resource, NAMES.memory_resource

quantities = st.one_of(
    st.from_regex(r"\A[+-]?[0-9.]{1,10}([eE][+-]?[0-9]{1,11})?(Ki|Mi|Gi|Ei|k|M|G|E|m)?\Z"),
    st.sampled_from(["1e999999999", "1e5000", "-1e999999999", "9" * 70, "25", "100", "16", "0"]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.text(max_size=12), st.booleans(), st.none(), st.lists(st.integers(0, 200), max_size=2),
)
resource_maps = st.one_of(
    st.fixed_dictionaries({}, optional={CORE: quantities, MEMORY: quantities}),
    st.text(max_size=30).map(lambda t: f"{CORE}={t}"), st.lists(st.sampled_from([CORE, "25"]), max_size=3),
    st.integers(), st.none(),
)
resources = st.fixed_dictionaries({}, optional={"limits": resource_maps, "requests": resource_maps})
# what an API server stores: maps of quantities (it refuses other shapes before any scheduler sees them)
stored_quantities = st.one_of(quantities.filter(lambda q: isinstance(q, str)), st.integers(-(2**70), 2**70))
stored_resources = st.fixed_dictionaries({}, optional={
    key: st.fixed_dictionaries({}, optional={CORE: stored_quantities, MEMORY: stored_quantities})
    for key in ("limits", "requests")})
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def ready(cluster):
    cluster.add_node(node("gpu-a", count=2, memory_gib=16))
    cluster.add_node(node("gpu-b", count=1, memory_gib=24))
    cluster.start_extender()
    return cluster


def fuzzed_pod(name: str, containers: list[dict]) -> dict:
    obj = pod(name)
    obj["spec"]["containers"] = [{"name": f"c{i}", "image": "x", "resources": r} for i, r in enumerate(containers)]
    return obj


def create_raw(cluster, obj: dict) -> dict:
    """POST the pod as JSON, past the official client's own validation (the extender must not rely on it)."""
    kube = cluster.kube
    request = urllib.request.Request(f"{kube.url}/api/v1/namespaces/default/pods", data=json.dumps(obj).encode(),
                                     method="POST",
                                     headers={**kube.auth_headers(), "Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=kube.ssl_context(), timeout=30) as response:
        return json.loads(response.read())


def assert_answered(status: int, reply: object, verb: str) -> None:
    assert status in (200, 400), (verb, status, reply)
    text = json.dumps(reply)
    assert "Traceback" not in text and "internal error" not in text, (verb, reply)


@settings(FUZZ, max_examples=200)
@given(containers=st.lists(resources, min_size=1, max_size=2))
def test_filter_and_prioritize_answer_every_fuzzed_pod(ready, containers):
    args = filter_args(fuzzed_pod("fuzz", containers), ["gpu-a", "gpu-b"])
    status, reply = post(f"{ready.url}/filter", args)
    assert_answered(status, reply, "filter")
    if status == 200 and not reply["Error"]:
        decided = set(reply["NodeNames"] or []) | set(reply["FailedNodes"] or {}) | \
            set(reply["FailedAndUnresolvableNodes"] or {})
        assert decided == {"gpu-a", "gpu-b"}, reply
    status, reply = post(f"{ready.url}/prioritize", args)
    assert_answered(status, reply, "prioritize")
    assert status == 400 or [entry["Host"] for entry in reply] == ["gpu-a", "gpu-b"]


_names = itertools.count()


@settings(FUZZ, max_examples=40)
@given(containers=st.lists(stored_resources, min_size=1, max_size=2))
def test_bind_answers_every_fuzzed_pod(ready, containers):
    created = create_raw(ready, fuzzed_pod(f"fuzz-{next(_names)}", containers))
    status, reply = post(f"{ready.url}/bind", binding_args(created, "gpu-a"))
    assert_answered(status, reply, "bind")
    name = created["metadata"]["name"]
    if reply["Error"]:
        assert not ready.read_pod(name)["spec"].get("nodeName")
    else:
        assert ready.read_pod(name)["spec"]["nodeName"] == "gpu-a"
    assert ready.extender.ledger.overcommitted() == []


@pytest.mark.parametrize("limits, words", [
    ({CORE: "1e999999999", MEMORY: "4"}, "exponent"),
    ({CORE: "1e5000"}, "exponent"),
    (f"{CORE}=25", "resources.limits must be a map"),
    ([CORE, "25"], "resources.limits must be a map"),
])
def test_absurd_quantities_are_refused_with_the_reason(ready, limits, words):
    obj = fuzzed_pod("absurd", [{"limits": limits}])
    status, reply = post(f"{ready.url}/filter", filter_args(obj, ["gpu-a"]))
    assert status == 200 and words in reply["FailedAndUnresolvableNodes"]["gpu-a"], reply
    status, reply = post(f"{ready.url}/prioritize", filter_args(obj, ["gpu-a"]))
    assert status == 400 and words in reply["Error"], reply
    if not isinstance(limits, dict):
        return  # no API server stores such a pod, so none can be bound
    created = create_raw(ready, obj)
    status, reply = post(f"{ready.url}/bind", binding_args(created, "gpu-a"))
    assert status == 200 and words in reply["Error"], reply
