"""The import graph: no cycles, and dependencies point one way (core <- everything else)."""

from __future__ import annotations

import sys
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("jupyter_vgpu", "vgpu_plugin", "simkube")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    # build from this checkout, whatever the installed copy says
    for path in (str(REPO / "plugin"), str(REPO)):
        if path not in sys.path:
            sys.path.insert(0, path)
    return grimp.build_graph(*PACKAGES, include_external_packages=True, cache_dir=None,
                              exclude_type_checking_imports=True)  # annotations only: no import at run time


def cycles(graph: grimp.ImportGraph) -> set[tuple[str, str]]:
    """Pairs of internal modules that reach each other through imports (any import, even in a function)."""
    found = set()
    for module in graph.modules:
        if not module.startswith(PACKAGES):
            continue
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.startswith(PACKAGES) and graph.chain_exists(importer=imported, imported=module):
                found.add(tuple(sorted((module, imported))))
    return found


def test_no_import_cycles(graph):
    found = cycles(graph)
    detail = "\n".join(
        f"{a} <-> {b}: {' -> '.join(graph.find_shortest_chain(importer=b, imported=a) or ())}"
        for a, b in sorted(found))
    assert not found, f"import cycles:\n{detail}"


def test_the_cycle_check_sees_a_cycle():
    made = grimp.ImportGraph()
    made.add_import(importer="jupyter_vgpu.a", imported="jupyter_vgpu.b")
    made.add_import(importer="jupyter_vgpu.b", imported="jupyter_vgpu.c")
    made.add_import(importer="jupyter_vgpu.c", imported="jupyter_vgpu.a")
    assert cycles(made) == {("jupyter_vgpu.a", "jupyter_vgpu.b"), ("jupyter_vgpu.b", "jupyter_vgpu.c"),
                            ("jupyter_vgpu.a", "jupyter_vgpu.c")}


def test_the_core_depends_on_nothing_of_ours_and_nothing_outside_the_standard_library(graph):
    core = [m for m in graph.modules if m == "jupyter_vgpu.core" or m.startswith("jupyter_vgpu.core.")]
    assert core
    stdlib = set(sys.stdlib_module_names)
    bad = sorted(
        f"{module} imports {imported}"
        for module in core
        for imported in graph.find_modules_directly_imported_by(module)
        if not imported.startswith("jupyter_vgpu.core")
        and not (imported.split(".")[0] in stdlib and not imported.startswith(PACKAGES)))
    assert not bad, "\n".join(bad)


def test_the_notebook_side_never_imports_the_node_side(graph):
    notebook = [m for m in graph.modules if m.startswith("jupyter_vgpu")]
    bad = sorted(f"{m} imports {i}" for m in notebook for i in graph.find_modules_directly_imported_by(m)
                 if i.startswith("vgpu_plugin"))
    assert not bad, "\n".join(bad)


def test_the_simulated_api_knows_nothing_of_the_project(graph):
    simkube = [m for m in graph.modules if m == "simkube" or m.startswith("simkube.")]
    assert simkube
    bad = sorted(f"{m} imports {i}" for m in simkube for i in graph.find_modules_directly_imported_by(m)
                 if i.startswith(("jupyter_vgpu", "vgpu_plugin")))
    assert not bad, "\n".join(bad)
