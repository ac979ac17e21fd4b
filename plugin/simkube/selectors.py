"""Label and field selectors with the Kubernetes API server's syntax and semantics.

Label selectors: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x,y)``,
``a`` (exists), ``!a`` (does not exist), comma-separated (all must hold).
Field selectors: ``path=v``, ``path==v``, ``path!=v`` on the fields each resource
supports (the real API refuses other fields, and so do we).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


class SelectorError(ValueError):
    """A selector the API server would refuse with 400 Bad Request."""


_LABEL_KEY = re.compile(r"^([a-z0-9A-Z]([-a-z0-9A-Z.]*[a-z0-9A-Z])?/)?[a-z0-9A-Z]([-a-z0-9A-Z_.]*[a-z0-9A-Z])?\Z")
_LABEL_VALUE = re.compile(r"^([a-z0-9A-Z]([-a-z0-9A-Z_.]*[a-z0-9A-Z])?)?\Z")
_SET_REQUIREMENT = re.compile(r"^\s*(?P<key>\S+)\s+(?P<op>in|notin)\s*\((?P<values>[^)]*)\)\s*\Z")
_EQ_REQUIREMENT = re.compile(r"^\s*(?P<key>[^=!\s]+)\s*(?P<op>==|=|!=)\s*(?P<value>\S*)\s*\Z")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside ``( ... )`` value sets."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced ')' in selector {text!r}")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise SelectorError(f"unbalanced '(' in selector {text!r}")
    parts.append("".join(current))
    return [part.strip() for part in parts if part.strip()]


@dataclass(frozen=True)
class LabelRequirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        # "!=" and "notin" also match objects without the label, as the API does.
        return not present or value not in self.values


def _check_key(key: str, selector: str) -> str:
    if not _LABEL_KEY.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
        raise SelectorError(f"invalid label key {key!r} in selector {selector!r}")
    return key


def _check_value(value: str, selector: str) -> str:
    if not _LABEL_VALUE.match(value) or len(value) > 63:
        raise SelectorError(f"invalid label value {value!r} in selector {selector!r}")
    return value


def parse_label_selector(selector: str | None) -> tuple[LabelRequirement, ...]:
    if not selector or not selector.strip():
        return ()
    requirements = []
    for part in _split_top_level(selector):
        if match := _SET_REQUIREMENT.match(part):
            values = [v.strip() for v in match["values"].split(",") if v.strip()]
            if not values:
                raise SelectorError(f"empty value set in selector {selector!r}")
            requirements.append(LabelRequirement(
                _check_key(match["key"], selector), match["op"],
                frozenset(_check_value(v, selector) for v in values)))
        elif match := _EQ_REQUIREMENT.match(part):
            op = "!=" if match["op"] == "!=" else "="
            requirements.append(LabelRequirement(
                _check_key(match["key"], selector), op,
                frozenset({_check_value(match["value"], selector)})))
        elif part.startswith("!"):
            requirements.append(LabelRequirement(_check_key(part[1:].strip(), selector), "!exists"))
        else:
            requirements.append(LabelRequirement(_check_key(part, selector), "exists"))
    return tuple(requirements)


# Fields each resource can be selected on (metadata.name/namespace work everywhere).
SELECTABLE_FIELDS: dict[str, frozenset[str]] = {
    "pods": frozenset({
        "spec.nodeName", "spec.schedulerName", "spec.restartPolicy", "spec.serviceAccountName",
        "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName",
    }),
    "nodes": frozenset({"spec.unschedulable"}),
    "events": frozenset({
        "involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
        "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
        "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type",
        "regarding.kind", "regarding.namespace", "regarding.name", "regarding.uid",
    }),
    "secrets": frozenset({"type"}),
    "namespaces": frozenset({"status.phase"}),
    "replicasets": frozenset({"status.replicas"}),
    "jobs": frozenset({"status.successful"}),
}


def _field_value(obj: Mapping[str, Any], path: str, parts: tuple[str, ...] | None = None) -> str:
    value: Any = obj
    for part in parts or path.split("."):
        # a plain dict first: the ABC check alone cost more than the lookup, for every listed object
        value = value.get(part) if type(value) is dict or isinstance(value, Mapping) else None
    if path == "source" and isinstance(value, Mapping):  # events: source is source.component
        value = value.get("component")
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class FieldRequirement:
    path: str
    negated: bool
    value: str
    _parts: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_parts", tuple(self.path.split(".")))  # split once, not per object

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return (_field_value(obj, self.path, self._parts) == self.value) != self.negated


def parse_field_selector(selector: str | None, plural: str) -> tuple[FieldRequirement, ...]:
    if not selector or not selector.strip():
        return ()
    allowed = SELECTABLE_FIELDS.get(plural, frozenset()) | {"metadata.name", "metadata.namespace"}
    requirements = []
    for part in (p.strip() for p in selector.split(",")):
        if not part:
            continue
        match = re.match(r"^([^=!]+)(==|=|!=)(.*)$", part)
        if not match:
            raise SelectorError(f"invalid field selector {selector!r}: {part!r} has no operator")
        path, op, value = match[1].strip(), match[2], match[3].strip()
        if path not in allowed:
            raise SelectorError(f'field label not supported: {path}')
        requirements.append(FieldRequirement(path, op == "!=", value))
    return tuple(requirements)


def compile_selectors(label_selector: str | None, field_selector: str | None,
                      plural: str) -> Callable[[Mapping[str, Any]], bool]:
    """One predicate for both selectors; raises SelectorError for bad syntax or fields."""
    labels = parse_label_selector(label_selector)
    fields = parse_field_selector(field_selector, plural)

    def matches(obj: Mapping[str, Any]) -> bool:  # loops, not all(<generator>): a list runs it per object
        if labels:
            object_labels = (obj.get("metadata") or {}).get("labels") or {}
            for label in labels:
                if not label.matches(object_labels):
                    return False
        for requirement in fields:
            if not requirement.matches(obj):
                return False
        return True

    return matches
