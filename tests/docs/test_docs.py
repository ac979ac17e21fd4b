"""README.md, docs/admin.md and docs/user.md: tested blocks run, and what the prose names exists.

A fenced block whose info string says ``tested`` is run: ``sh tested`` with bash in the
repository root, ``python tested`` in a fresh interpreter, ``python tested=jupyterhub_config``
as a jupyterhub_config.py (``c`` predefined), after which KubeSpawner must build the
profiles the block promises.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from traitlets.config import Config

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", REPO / "docs" / "admin.md", REPO / "docs" / "user.md"]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.M | re.S)


def blocks(path: Path) -> list[tuple[str, str, str]]:
    """(language, marker, code) for every fenced block."""
    found = []
    for info, code in FENCE.findall(path.read_text()):
        words = info.split()
        language = words[0] if words else ""
        marker = next((w for w in words[1:] if w.startswith("tested")), "")
        found.append((language, marker, code))
    return found


TESTED = [(path.name, i, language, marker, code)
          for path in DOCS for i, (language, marker, code) in enumerate(blocks(path)) if marker]


def test_docs_have_tested_blocks():
    kinds = {(language, marker) for _, _, language, marker, _ in TESTED}
    assert ("sh", "tested") in kinds and ("python", "tested=jupyterhub_config") in kinds
    assert len(TESTED) >= 5


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.mark.parametrize("doc, index, language, marker, code",
                         [t for t in TESTED if t[2] == "sh"], ids=lambda v: str(v)[:40])
def test_shell_block_runs(doc, index, language, marker, code):
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=REPO, env=_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{doc} block {index} failed:\n{code}\n{result.stderr}"
    assert result.stdout.strip(), f"{doc} block {index} printed nothing:\n{code}"


@pytest.mark.parametrize("doc, index, language, marker, code",
                         [t for t in TESTED if t[2] == "python" and t[3] == "tested"], ids=lambda v: str(v)[:40])
def test_python_block_runs(doc, index, language, marker, code):
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{doc} block {index} failed:\n{code}\n{result.stderr}"




@pytest.mark.parametrize("doc, index, language, marker, code",
                         [t for t in TESTED if t[3] == "tested=jupyterhub_config"], ids=lambda v: str(v)[:40])
async def test_hub_config_block_configures_kubespawner(doc, index, language, marker, code, kubespawner_kubeconfig):
    from kubespawner import KubeSpawner

    c = Config()
    exec(compile(code, f"{doc} block {index}", "exec"), {"c": c})

    def offered(name, *groups):
        user = SimpleNamespace(name=name, id=1, url=f"/user/{name}/", groups=[SimpleNamespace(name=g) for g in groups])
        return KubeSpawner(_mock=True, config=c, user=user, namespace="jhub")

    for name, groups, expected, refused in (
        ("bob", (), {"cpu", "vgpu-quarter", "vgpu-custom"}, {"vgpu-half", "vgpu-one"}),
        ("alice", (), {"vgpu-one"}, {"vgpu-two"}),
        ("carol", ("gpu-power-users",), {"vgpu-two"}, set()),
    ):
        spawner = offered(name, *groups)
        slugs = {p["slug"] for p in await spawner.profile_list(spawner)}
        assert expected <= slugs and not refused & slugs, (name, slugs)
    assert any(role["name"] == "server" for role in c.JupyterHub.load_roles)


def test_paths_and_settings_named_in_the_docs_exist():
    from jupyter_vgpu.hub import VGPUHub

    text = "\n".join(p.read_text() for p in DOCS)
    for path in set(re.findall(r"\b(?:deploy|plugin|docs|binder|tests)/[\w./-]*\w", text)):
        assert (REPO / path).exists(), f"the docs name {path}, which does not exist"
    traits = set(VGPUHub.class_trait_names(config=True))
    for trait in set(re.findall(r"c\.VGPUHub\.(\w+)", text)):
        assert trait in traits, f"the docs set c.VGPUHub.{trait}, which is not a setting"


def test_vgpu_commands_in_the_user_guide_exist():
    from jupyter_vgpu.magic import USAGE

    text = (REPO / "docs" / "user.md").read_text()
    for command in set(re.findall(r"%vgpu (\w+)", text)):
        assert f"%vgpu {command}" in USAGE, f"docs/user.md shows %vgpu {command}, which %vgpu does not have"
    for flag in set(re.findall(r"%vgpu request[^\n#]*?(--\w+)", text)):
        assert flag in USAGE


def test_the_first_deployment_checks_the_label_it_sets_and_says_who_sets_the_other():
    """docs/admin.md §7 labels nodes `vgpu.jupyter.org/node=true`; its check lists that label, and any
    other label it checks is one the text says the node daemon sets (not one the admin was told to set)."""
    from jupyter_vgpu.core.contract import DEFAULT_NAMES

    text = (REPO / "docs" / "admin.md").read_text()
    section = text[text.index("## 7. "):text.index("## 8. ")]
    set_here = set(re.findall(r"kubectl label node \S+ (vgpu\.jupyter\.org/[\w./-]+)=", section))
    checked = {label for labels in re.findall(r"kubectl get nodes -L (\S+?)`", section) for label in labels.split(",")}
    assert set_here and checked and set_here <= checked, (set_here, checked)
    daemon_sets = {label for label in checked - set_here
                   if re.search(rf"daemon (?:then )?sets [^.]*`{re.escape(label)}`", section)}
    assert checked - set_here == daemon_sets == {DEFAULT_NAMES.node_label_gpu}, (checked, set_here, daemon_sets)
