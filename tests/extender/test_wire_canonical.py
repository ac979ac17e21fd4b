"""``wire.canonical`` (the pod's and nodes' keys spelled as Go's decoder matches them) against
the plain rule it replaced: the same copy and the same error message for any JSON value, along
the pod's and the node's schemas, with keys in any case and values of any type."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from vgpu_plugin.extender.wire import (
    ANY,
    MAP_OF_STRINGS,
    NODE_SCHEMA,
    POD_SCHEMA,
    WireError,
    _json_type,
    canonical,
    decode_extender_args,
)


def plain_canonical(data: Any, schema: Any, where: str) -> Any:
    """The rule as first written: every path formatted eagerly, the folding built per struct."""
    if data is None:
        return None
    if schema == ANY:
        return data
    if schema == "string":
        if not isinstance(data, str):
            raise WireError(f"{where} must be a string, not {_json_type(data)}")
        return data
    if schema == MAP_OF_STRINGS:
        if not isinstance(data, dict):
            raise WireError(f"{where} must be an object of strings, not {_json_type(data)}")
        for key, value in data.items():
            if not isinstance(value, str):
                raise WireError(f"{where}[{key!r}] must be a string, not {_json_type(value)}")
        return data
    if isinstance(schema, list):
        if not isinstance(data, list):
            raise WireError(f"{where} must be a list, not {_json_type(data)}")
        return [plain_canonical(item, schema[0], f"{where}[{i}]") for i, item in enumerate(data)]
    if not isinstance(data, dict):
        raise WireError(f"{where} must be a JSON object, not {_json_type(data)}")
    folded = {name.lower(): name for name in schema}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = key if key in schema else folded.get(key.lower())
        if name is None:
            out[key] = value
        else:
            out[name] = plain_canonical(value, schema[name], f"{where}.{name}")
    return out


scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)


def _respelled(name: str) -> st.SearchStrategy[str]:
    """The field's name in any mix of cases (Go matches it case-insensitively)."""
    return st.lists(st.booleans(), min_size=len(name), max_size=len(name)).map(
        lambda upper: "".join(c.upper() if u else c.lower() for c, u in zip(name, upper, strict=True)))


def along(schema: Any) -> st.SearchStrategy[Any]:
    """Values shaped mostly like ``schema`` (keys in any case, some extra), sometimes anything."""
    if isinstance(schema, list):
        shaped: st.SearchStrategy[Any] = st.lists(along(schema[0]), max_size=3)
    elif isinstance(schema, dict):
        shaped = st.lists(st.sampled_from(sorted(schema)).flatmap(
            lambda name: st.tuples(_respelled(name), along(schema[name]))) | st.tuples(st.text(max_size=4), json_values),
            max_size=6).map(dict)
    elif schema == MAP_OF_STRINGS:
        shaped = st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3)
    elif schema == "string":
        shaped = st.text(max_size=4)
    else:
        shaped = json_values
    return st.one_of(shaped, shaped, shaped, json_values)


def _outcome(rule: Any, data: Any, schema: Any, where: str) -> tuple[str, Any]:
    try:
        return "copy", rule(data, schema, where)
    except WireError as error:
        return "refused", str(error)


@settings(max_examples=400, deadline=None)
@given(data=along(POD_SCHEMA))
def test_pod_canonical_matches_the_plain_rule(data: Any) -> None:
    assert _outcome(canonical, data, POD_SCHEMA, "Pod") == _outcome(plain_canonical, data, POD_SCHEMA, "Pod")


@settings(max_examples=300, deadline=None)
@given(data=along(NODE_SCHEMA), at=st.integers(0, 9))
def test_node_canonical_matches_the_plain_rule(data: Any, at: int) -> None:
    where = f"Nodes.items[{at}]"
    assert _outcome(canonical, data, NODE_SCHEMA, where) == _outcome(plain_canonical, data, NODE_SCHEMA, where)


def test_a_schema_built_elsewhere_folds_its_own_keys() -> None:
    """A struct schema this module does not hold is folded from its own keys, not another's."""
    schema = {"hostName": "string"}
    assert canonical({"HOSTNAME": "a", "other": 1}, schema, "X") == {"hostName": "a", "other": 1}
    try:
        canonical({"hostname": 3}, schema, "X")
    except WireError as error:
        assert str(error) == "X.hostName must be a string, not a number"
    else:
        raise AssertionError("a number accepted as a string")


def test_a_deep_error_names_its_path() -> None:
    body = b'{"Pod": {"spec": {"CONTAINERS": [{"name": "a"}, {"Resources": {"limits": 1}, "name": 7}]}}, "NodeNames": []}'
    try:
        decode_extender_args(body)
    except WireError as error:
        assert str(error) == "Pod.spec.containers[1].name must be a string, not a number"
    else:
        raise AssertionError("a number accepted as a container name")
