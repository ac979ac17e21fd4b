"""simkube's pytest plugin serves the
fixtures when installed (the pytest11 entry point), from a checkout (``pytest_plugins``) and
with both at once (an editable install running the project's own tests). That simkube imports
nothing of the project is checked on the import graph (tests/packaging/test_import_graph.py)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import tomllib

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_the_wheel_declares_the_plugin_under_its_module_name():
    # the same name as pytest_plugins uses, or pytest refuses the second registration
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["pytest11"] == {"simkube.pytest_plugin": "simkube.pytest_plugin"}
    assert "plugin/simkube" in pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]


def _run_pytest(project: pathlib.Path, extra_path: list[str]) -> subprocess.CompletedProcess[str]:
    path = [str(REPO / "plugin"), str(REPO), *extra_path, os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    if not extra_path:  # "not installed", even where this environment has the wheel installed
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(project)],
                          cwd=project, env=env, capture_output=True, text=True, timeout=240)


def test_the_fixtures_work_installed_from_a_checkout_and_both(tmp_path):
    # an installed wheel, as importlib.metadata sees one: a dist-info with the entry point
    site = tmp_path / "site"
    info = site / "simkube_probe-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: simkube-probe\nVersion: 1.0\n")
    entry = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    (info / "entry_points.txt").write_text("[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in entry.items()))
    test = ("def test_api(kube, core_v1, kube_session):\n"
            "    core_v1.create_namespaced_config_map('default', {'metadata': {'name': 'probe'}})\n"
            "    assert kube.store.rv > 0 and kube_session.url != kube.url\n")
    cases = {"installed": ([str(site)], False), "checkout": ([], True), "both": ([str(site)], True)}
    for case, (extra_path, conftest) in cases.items():
        project = tmp_path / case
        project.mkdir()
        (project / "test_probe.py").write_text(test)
        if conftest:
            (project / "conftest.py").write_text('pytest_plugins = ["simkube.pytest_plugin"]\n')
        result = _run_pytest(project, extra_path)
        assert result.returncode == 0 and "1 passed" in result.stdout, f"{case}:\n{result.stdout}\n{result.stderr}"

    bare = tmp_path / "neither"
    bare.mkdir()
    (bare / "test_probe.py").write_text(test)
    result = _run_pytest(bare, [])
    assert result.returncode != 0 and "fixture 'kube' not found" in result.stdout
