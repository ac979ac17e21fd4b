"""kube-scheduler's extender wire format (k8s.io/kube-scheduler/extender/v1).

The Go types carry no JSON tags, so their keys are the Go field names (``Pod``,
``NodeNames``, ``FailedAndUnresolvableNodes``, ``Host``/``Score``, ``PodUID``...), and
Go's encoding/json matches keys case-insensitively, preferring nothing: every key
that folds to a field's name sets it, the last one wins. The embedded ``v1.Pod`` and
``v1.Node`` objects use their own camelCase tags, matched the same way. This module
decodes both, canonicalises the parts of Pod and Node we read, and encodes replies
with every field present as Go's encoder writes them (nil pointers and maps as null).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

MAX_EXTENDER_PRIORITY = 10
"""extenderv1.MaxExtenderPriority: prioritize scores are 0..10."""


class WireError(ValueError):
    """A request that is not valid extender JSON; the message says what is wrong."""


# --- the Go structs ------------------------------------------------------------------

@dataclass(frozen=True)
class ExtenderArgs:
    pod: dict[str, Any]
    node_names: list[str] | None       # node-cache-capable mode
    nodes: list[dict[str, Any]] | None  # full Node objects otherwise (canonical keys)
    raw_nodes: list[Any] | None         # the Node objects exactly as sent, echoed in replies

    @property
    def cache_mode(self) -> bool:
        return self.node_names is not None

    @property
    def candidate_names(self) -> list[str]:
        if self.node_names is not None:
            return self.node_names
        return [node["metadata"]["name"] for node in self.nodes or []]


@dataclass(frozen=True)
class ExtenderBindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


# Canonical key -> schema of its value. A dict is a struct (matched case-insensitively),
# a one-element list is a list of that struct, MAP_OF_STRINGS a map[string]string,
# ANY a value taken as is (quantities, maps of quantities).
ANY = "any"
MAP_OF_STRINGS = "map[string]string"
_STRING = "string"

_CONTAINER = {"name": _STRING, "resources": {"limits": ANY, "requests": ANY}}
POD_SCHEMA: dict[str, Any] = {
    "metadata": {
        "name": _STRING, "namespace": _STRING, "uid": _STRING, "resourceVersion": _STRING,
        "annotations": MAP_OF_STRINGS, "labels": MAP_OF_STRINGS, "deletionTimestamp": ANY,
    },
    "spec": {
        "containers": [_CONTAINER], "initContainers": [_CONTAINER], "nodeName": _STRING,
        "schedulerName": _STRING, "nodeSelector": MAP_OF_STRINGS, "overhead": ANY,
    },
    "status": {"phase": _STRING},
}
NODE_SCHEMA: dict[str, Any] = {
    "metadata": {"name": _STRING, "annotations": MAP_OF_STRINGS, "labels": MAP_OF_STRINGS,
                 "resourceVersion": _STRING},
    "spec": {"unschedulable": ANY},
    "status": {"capacity": ANY, "allocatable": ANY},
}


def _fold_fields(data: Any, fields: tuple[str, ...], where: str) -> dict[str, Any]:
    """Go's struct decoding: keys matched case-insensitively, the last match wins."""
    if not isinstance(data, dict):
        raise WireError(f"{where} must be a JSON object, not {_json_type(data)}")
    folded = {name.lower(): name for name in fields}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = folded.get(key.lower())
        if name is not None:
            out[name] = value
    return out


def canonical(data: Any, schema: Any, where: str) -> Any:
    """A copy of ``data`` whose struct keys in ``schema`` are spelled canonically.

    Keys outside the schema are kept as sent; wrong types along the schema raise
    WireError naming the path, as Go's decoder would refuse them.
    """
    return _canonical(data, schema, where)


# A path into the request: the top's name, or (parent path, key or list index). The text is
# built only for an error message: every request walks ~20 keys of its pod, and formatting
# each one's path was a third of the decode.
_Path = str | tuple[Any, str | int]


def _where(path: _Path) -> str:
    if isinstance(path, str):
        return path
    parent, part = path
    return f"{_where(parent)}[{part}]" if isinstance(part, int) else f"{_where(parent)}.{part}"


def _canonical(data: Any, schema: Any, where: _Path) -> Any:
    if data is None:
        return None
    if isinstance(schema, str):
        if schema == ANY:
            return data
        if schema == _STRING:
            if not isinstance(data, str):
                raise WireError(f"{_where(where)} must be a string, not {_json_type(data)}")
            return data
        if schema == MAP_OF_STRINGS:
            if not isinstance(data, dict):
                raise WireError(f"{_where(where)} must be an object of strings, not {_json_type(data)}")
            for key, value in data.items():
                if not isinstance(value, str):
                    raise WireError(f"{_where(where)}[{key!r}] must be a string, not {_json_type(value)}")
            return data
    if isinstance(schema, list):
        if not isinstance(data, list):
            raise WireError(f"{_where(where)} must be a list, not {_json_type(data)}")
        item = schema[0]
        return [_canonical(value, item, (where, i)) for i, value in enumerate(data)]
    if not isinstance(data, dict):
        raise WireError(f"{_where(where)} must be a JSON object, not {_json_type(data)}")
    folded = _folded(schema)
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = key if key in schema else folded.get(key.lower())
        if name is None:
            out[key] = value
        else:
            out[name] = _canonical(value, schema[name], (where, name))
    return out


def _structs(schema: Any) -> list[dict[str, Any]]:
    """The struct schemas in ``schema``, itself included."""
    if isinstance(schema, list):
        return _structs(schema[0])
    if not isinstance(schema, dict):
        return []
    return [schema, *(inner for value in schema.values() for inner in _structs(value))]


def _folding(schema: dict[str, Any]) -> dict[str, str]:
    return {name.lower(): name for name in schema}


def _folded(schema: dict[str, Any]) -> dict[str, str]:
    """The lower-cased field names of a struct schema: computed once for this module's schemas
    (kept with the schema itself, so an id is never taken for another object's), else now."""
    known = _FOLDED.get(id(schema))
    if known is not None and known[0] is schema:
        return known[1]
    return _folding(schema)


_FOLDED = {id(struct): (struct, _folding(struct)) for struct in (*_structs(POD_SCHEMA), *_structs(NODE_SCHEMA))}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _load(body: bytes) -> Any:
    """The request's JSON as ``json.loads`` reads it. orjson reads a filter's node names about
    twice as fast and gives the same values for any body it accepts, except that it reads an
    integer beyond 64 bits as a float: a value with any float in it (rare: quantities are
    strings) is read again by json, as is anything orjson refuses (NaN, a lone surrogate, a byte
    order mark, UTF-16, a syntax error), which json reads or says what is wrong with."""
    if not body or not body.strip():
        raise WireError("empty request body; expected JSON")
    if type(body) is bytes:
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
        else:
            if not _has_float(value):
                return value
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise WireError(f"request body is not JSON: {error}") from None
    except RecursionError:  # deeper than orjson's 1,024 levels and the interpreter's stack
        raise WireError("request body nests too deeply to read") from None


def _has_float(value: Any) -> bool:
    """Whether a float is anywhere in ``value`` (a stack, not recursion: orjson reads 1,024 levels
    deep). A list of strings, such as the node names, is passed over in one C-level call."""
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            stack.extend(item.values())
        elif type(item) is list:
            if not _all_strings(item):
                stack.extend(item)
        elif type(item) is float:
            return True
    return False


def _all_strings(items: list[Any]) -> bool:
    """Whether every item is a str (``str.join`` refuses anything else, in one C-level pass)."""
    try:
        "".join(items)
    except TypeError:
        return False
    return True


# --- decoding ---------------------------------------------------------------------------

def decode_extender_args(body: bytes) -> ExtenderArgs:
    """ExtenderArgs{Pod, Nodes, NodeNames} from a filter or prioritize request body."""
    fields = _fold_fields(_load(body), ("Pod", "Nodes", "NodeNames"), "ExtenderArgs")
    pod = canonical(fields.get("Pod"), POD_SCHEMA, "Pod")
    if not pod:
        raise WireError("ExtenderArgs.Pod is missing: the pod being scheduled is required")
    node_names = fields.get("NodeNames")
    if node_names is not None:
        if not isinstance(node_names, list) or not _all_strings(node_names):
            raise WireError("ExtenderArgs.NodeNames must be a list of node names")
    nodes: list[dict[str, Any]] | None = None
    raw_nodes: list[Any] | None = None
    node_list = fields.get("Nodes")
    if node_list is not None:
        items = _fold_fields(node_list, ("items",), "ExtenderArgs.Nodes").get("items") or []
        if not isinstance(items, list):
            raise WireError("ExtenderArgs.Nodes.items must be a list of Node objects")
        raw_nodes = items
        nodes = []
        for i, item in enumerate(items):
            node = canonical(item, NODE_SCHEMA, f"Nodes.items[{i}]")
            if not isinstance(node, dict) or not (node.get("metadata") or {}).get("name"):
                raise WireError(f"Nodes.items[{i}] has no metadata.name")
            nodes.append(node)
    if node_names is None and nodes is None:
        raise WireError(
            "ExtenderArgs has neither NodeNames (nodeCacheCapable: true) nor Nodes "
            "(nodeCacheCapable: false): no candidate nodes to consider"
        )
    return ExtenderArgs(pod=pod, node_names=node_names, nodes=nodes, raw_nodes=raw_nodes)


def decode_binding_args(body: bytes) -> ExtenderBindingArgs:
    """ExtenderBindingArgs{PodName, PodNamespace, PodUID, Node} from a bind request body."""
    fields = _fold_fields(_load(body), ("PodName", "PodNamespace", "PodUID", "Node"),
                          "ExtenderBindingArgs")
    values: dict[str, str] = {}
    for name in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = fields.get(name)
        if value is None:
            value = ""
        if not isinstance(value, str):
            raise WireError(f"ExtenderBindingArgs.{name} must be a string, not {_json_type(value)}")
        values[name] = value
    missing = [name for name in ("PodName", "PodNamespace", "Node") if not values[name]]
    if missing:
        raise WireError(f"ExtenderBindingArgs lacks {', '.join(missing)}")
    return ExtenderBindingArgs(values["PodName"], values["PodNamespace"], values["PodUID"],
                               values["Node"])


# --- encoding ---------------------------------------------------------------------------

def filter_result(args: ExtenderArgs | None, passed: list[str], failed: Mapping[str, str],
                  unresolvable: Mapping[str, str], error: str = "") -> dict[str, Any]:
    """ExtenderFilterResult in the mode of the request: NodeNames, or Nodes with the objects sent."""
    node_names: list[str] | None = None
    nodes: dict[str, Any] | None = None
    if error or args is None:
        pass
    elif args.cache_mode:
        node_names = passed
    else:
        keep = set(passed)
        items = [raw for raw, node in zip(args.raw_nodes or [], args.nodes or [], strict=True)
                 if node["metadata"]["name"] in keep]
        nodes = {"metadata": {}, "items": items}
    return {
        "Nodes": nodes,
        "NodeNames": node_names,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": error,
    }


def priority_list(scores: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """HostPriorityList."""
    return [{"Host": host, "Score": score} for host, score in scores]


def binding_result(error: str = "") -> dict[str, str]:
    """ExtenderBindingResult."""
    return {"Error": error}


def dumps(value: Any) -> bytes:
    """Compact JSON. orjson writes a score list of hundreds of nodes, or a filter reply with
    hundreds of reasons, about ten times faster than the json module. Strings orjson refuses (a
    lone surrogate, which json.loads lets through from a request) go through json instead,
    escaped exactly as Go's encoder would read them back."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":")).encode()
