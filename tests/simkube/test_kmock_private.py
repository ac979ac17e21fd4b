"""simkube reaches kmock's private members in one module only, pinned to the kmock release it
was written against; a release that moves them fails here, naming what moved."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import pathlib

import attrs
import kmock
import pytest
import tomllib
from packaging.requirements import Requirement

REPO = pathlib.Path(__file__).resolve().parents[2]
SIMKUBE = REPO / "plugin" / "simkube"
PRIVATE_NAMES = {"_handle", "_requests", "_payloads", "_serve_api", "_serve_apis", "_serve_version",
                 "_serve_server_version", "_raw_request"}


def test_the_installed_kmock_still_has_every_private_member_simkube_uses():
    try:
        private = importlib.import_module("simkube._kmock_private")
    except ImportError as error:  # the module refuses to import, saying what moved
        pytest.fail(str(error))
    assert private.missing() == []


def test_a_release_without_those_members_is_refused_with_their_names():
    from simkube._kmock_private import explain, missing

    @attrs.define
    class Scaffold:
        _requests: list[object] = attrs.field(factory=list)

        async def _handle(self, request: object) -> None: ...

    @attrs.define
    class Request:
        id: int = 0

    gone = missing(Scaffold, Request, package=object())
    assert gone == ["kmock.Response", "Scaffold._serve_api()", "Scaffold._serve_apis()", "Scaffold._serve_version()",
                    "Scaffold._serve_server_version()", "Scaffold._payloads", "Request._raw_request",
                    "Request.url", "Request.method", "Request.params", "Request.headers", "Request.body",
                    "Request.text"]
    message = explain(gone)
    assert "Scaffold._payloads" in message and "simkube/_kmock_private.py" in message
    assert f"kmock {importlib.metadata.version('kmock')}" in message


def test_pyproject_pins_kmock_to_the_release_the_private_module_was_written_for():
    from simkube._kmock_private import TESTED_WITH

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (pin,) = [Requirement(r) for r in extras["sim"] if Requirement(r).name == "kmock"]
    installed = importlib.metadata.version("kmock")
    assert pin.specifier.contains(f"{TESTED_WITH}.0") and pin.specifier.contains(installed), \
        f"kmock {installed} is installed; pyproject says {pin}; simkube was written for {TESTED_WITH}"
    next_minor = TESTED_WITH.split(".")[0] + "." + str(int(TESTED_WITH.split(".")[1]) + 1)
    assert not pin.specifier.contains(f"{next_minor}.0"), f"{pin} lets kmock {next_minor} in unchecked"


def _private_uses(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kmock._"):
            found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import) and any(a.name.startswith("kmock._") for a in node.names):
            found.append(f"line {node.lineno}: import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Attribute) and node.attr in PRIVATE_NAMES:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in PRIVATE_NAMES:
            found.append(f"line {node.lineno}: def {node.name}")
    return found


def _unexported_imports(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [f"line {node.lineno}: from kmock import {alias.name}" for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "kmock"
            for alias in node.names if alias.name not in kmock.__all__]


def test_no_other_module_touches_kmocks_private_members():
    modules = sorted(SIMKUBE.glob("*.py"))
    assert SIMKUBE / "apiserver.py" in modules
    found = {path.name: uses for path in modules if path.name != "_kmock_private.py"
             for uses in [_private_uses(path) + _unexported_imports(path)] if uses}
    assert not found, f"kmock's private members outside simkube/_kmock_private.py: {found}"
    private = SIMKUBE / "_kmock_private.py"
    assert _private_uses(private) and _unexported_imports(private), "the check finds nothing even where they are"


def test_the_request_log_stays_bounded_and_keeps_the_latest(kube, core_v1):
    kube.emulator.request_log_limit = 20
    for _ in range(45):
        core_v1.list_namespaced_config_map("default")
    core_v1.list_namespace()  # a path kmock cannot parse: logged by hand
    logged = list(kube.emulator)
    assert 10 <= len(logged) <= 21
    assert logged[-1].url.path == "/api/v1/namespaces"
    assert logged[-2].url.path == "/api/v1/namespaces/default/configmaps"
