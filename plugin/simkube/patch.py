"""The three patch formats the API server accepts, on plain JSON dicts.

- JSON merge patch (RFC 7386, ``application/merge-patch+json``).
- Strategic merge patch (``application/strategic-merge-patch+json``, what the
  official Python client sends for a dict body and ``kubectl apply`` sends): a merge
  patch whose lists with a known merge key (containers by name, conditions by type,
  ...) merge element by element; ``$patch`` and kubectl's ordering directives are
  understood. Lists without a merge key are replaced, as the server does.
- JSON patch (RFC 6902, ``application/json-patch+json``, what the client sends for a
  list body).

Inputs are never mutated; every function returns a new document.
"""

from __future__ import annotations

import copy
from typing import Any


class PatchError(ValueError):
    """A patch the API server would refuse (400/422)."""


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# Field name -> merge key for lists patched element-wise (from the API's patchMergeKey tags).
# A value of None marks a list of primitives merged as a set (finalizers).
_MERGE_KEYS: dict[str, str | None] = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name",
    "volumes": "name", "env": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath",
    "imagePullSecrets": "name", "hostAliases": "ip", "ports": "containerPort",
    "conditions": "type", "containerStatuses": "name", "initContainerStatuses": "name",
    "ephemeralContainerStatuses": "name", "ownerReferences": "uid", "addresses": "type",
    "taints": "key", "finalizers": None,
}
_DIRECTIVE_PREFIXES = ("$setElementOrder/", "$deleteFromPrimitiveList/", "$retainKeys")


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key == "$patch":
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [v for v in result.get(field) or [] if v not in value]
            continue
        if key.startswith(_DIRECTIVE_PREFIXES):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and key in _MERGE_KEYS and isinstance(result.get(key), list):
            result[key] = _merge_list(result[key], value, _MERGE_KEYS[key])
        elif isinstance(value, list):
            result[key] = [_strip_directives(v) for v in value if not _is_delete(v)]
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def _is_delete(item: Any) -> bool:
    return isinstance(item, dict) and item.get("$patch") == "delete"


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items()
                if k != "$patch" and not k.startswith(_DIRECTIVE_PREFIXES)}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


def _merge_list(current: list[Any], patch: list[Any], merge_key: str | None) -> list[Any]:
    if merge_key is None:  # a set of primitives
        merged = list(current)
        merged.extend(v for v in patch if v not in merged)
        return merged
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [_strip_directives(item) for item in patch if item.get("$patch") != "replace"]
    merged = [copy.deepcopy(item) for item in current]
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise PatchError(f"list element {item!r} lacks its merge key {merge_key!r}")
        index = next((i for i, old in enumerate(merged)
                      if isinstance(old, dict) and old.get(merge_key) == item[merge_key]), None)
        if _is_delete(item):
            if index is not None:
                del merged[index]
        elif index is None:
            merged.append(_strip_directives(item))
        else:
            merged[index] = strategic_merge_patch(merged[index], item)
    return merged


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str], path: str) -> Any:
    for part in parts:
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdecimal() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            raise PatchError(f"path {path!r} does not exist")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"malformed JSON patch operation {op!r}")
        kind, path = op["op"], op["path"]
        parts = _pointer(path)
        if kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = copy.deepcopy(_walk(doc, source, op.get("from", "")))
            if kind == "move":
                doc = _remove(doc, source, op["from"])
            doc = _add(doc, parts, value, path)
        elif kind == "test":
            if _walk(doc, parts, path) != op.get("value"):
                raise PatchError(f"test failed at {path!r}")
        elif kind == "remove":
            doc = _remove(doc, parts, path)
        elif kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op.get("value")), path)
        elif kind == "replace":
            _walk(doc, parts, path)  # must exist
            doc = _remove(doc, parts, path)
            doc = _add(doc, parts, copy.deepcopy(op.get("value")), path)
        else:
            raise PatchError(f"unknown JSON patch operation {kind!r}")
    return doc


def _add(doc: Any, parts: list[str], value: Any, path: str) -> Any:
    if not parts:
        return value
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdecimal() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise PatchError(f"index in {path!r} is out of range")
    else:
        raise PatchError(f"parent of {path!r} is not a container")
    return doc


def _remove(doc: Any, parts: list[str], path: str) -> Any:
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdecimal() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise PatchError(f"path {path!r} does not exist")
    return doc


def apply_patch(target: dict[str, Any], patch: Any, content_type: str) -> Any:
    """Apply a patch body given the request's Content-Type (parameters ignored)."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/merge-patch+json":
        return merge_patch(target, patch)
    if media == "application/strategic-merge-patch+json":
        return strategic_merge_patch(target, patch)
    if media == "application/json-patch+json":
        return json_patch(target, patch)
    raise PatchError(f"unsupported patch content type {content_type!r}")
