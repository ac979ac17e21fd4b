"""docs/configuration.md documents every configurable trait, with its real default, and nothing else;
docs/notebook.md names only %vgpu commands that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jupyter_vgpu.magic import USAGE, VGPUMagics
from jupyter_vgpu.server.app import VGPUExtension
from jupyter_vgpu.settings import VGPUSettings

DOCS = Path(__file__).resolve().parents[2] / "docs"
DOC = (DOCS / "notebook.md").read_text()
REFERENCE = (DOCS / "configuration.md").read_text()


@pytest.mark.parametrize("cls", [VGPUSettings, VGPUExtension, VGPUMagics])
def test_every_setting_is_documented_with_its_default(cls):
    rows = dict(re.findall(rf"^\| `c\.{cls.__name__}\.(\w+)` \| `([^`]*)` \|", REFERENCE, re.MULTILINE))
    traits = cls.class_own_traits(config=True)
    assert set(rows) == set(traits)
    for name, default in rows.items():
        assert default == repr(traits[name].default_value).replace("'", '"'), name


def test_documented_magic_commands_exist():
    for command in set(re.findall(r"^%vgpu (\w+)", DOC, re.MULTILINE)):
        assert f"%vgpu {command}" in USAGE, command
