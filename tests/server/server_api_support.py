"""docs/server-api.yaml as a validator: a real answer of the server extension must match the
schema the document gives for its route, method and status (and the status must be listed)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "server-api.yaml"
URI = "urn:jupyter-vgpu:server-api"
CHECKED: list[tuple[str, str, int]] = []  # (route, method, status) of every answer checked, for the tests' own test


@cache
def document() -> dict[str, Any]:
    return yaml.safe_load(DOCUMENT.read_text())


@cache
def _registry() -> Registry:
    return Registry().with_resource(URI, Resource.from_contents(document(), default_specification=DRAFT202012))


def _template(route: str) -> str:
    """The document's path for a concrete route ('requests/r1-ab' -> '/requests/{id}')."""
    route = "/" + route.strip("/")
    for template in document()["paths"]:
        pattern = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, route):
            return template
    raise AssertionError(f"{route} is not in {DOCUMENT.name}")


def _response(route: str, method: str, status: int) -> dict[str, Any]:
    template = _template(route)
    responses = document()["paths"][template][method.lower()]["responses"]
    assert str(status) in responses, f"{method} {template} answered {status}, which {DOCUMENT.name} does not list"
    return responses[str(status)]


def _pointer(route: str, method: str, status: int) -> str:
    template = _template(route)
    response = _response(route, method, status)
    escaped = template.replace("~", "~0").replace("/", "~1")
    if "$ref" in response:
        return response["$ref"] + "/content/application~1json/schema"
    return f"#/paths/{escaped}/{method.lower()}/responses/{status}/content/application~1json/schema"


def validator_for(pointer: str) -> Draft202012Validator:
    return Draft202012Validator({"$ref": URI + pointer}, registry=_registry())


def check_response(route: str, method: str, status: int, body: Any) -> None:
    """AssertionError naming every way ``body`` differs from the documented answer (None: no body)."""
    if "content" not in _response(route, method, status) and "$ref" not in _response(route, method, status):
        CHECKED.append((route, method, status))
        assert body is None, f"{method} {route} {status} has a body, which {DOCUMENT.name} does not give it"
        return
    errors = sorted(validator_for(_pointer(route, method, status)).iter_errors(body), key=str)
    CHECKED.append((route, method, status))
    assert not errors, f"{method} {route} {status} does not match {DOCUMENT.name}:\n" + "\n".join(
        f"  at {'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors)


def check_schema(name: str, body: Any) -> None:
    """Validate against ``components/schemas/<name>`` (the websocket's messages)."""
    errors = sorted(validator_for(f"#/components/schemas/{name}").iter_errors(body), key=str)
    assert not errors, f"{name} does not match {DOCUMENT.name}:\n" + "\n".join(f"  {e.message}" for e in errors)
