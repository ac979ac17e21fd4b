"""docs/configuration.md is the one place every setting is documented: it must match the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_configuration_reference_is_current():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_configuration.py"), "--check"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_every_daemon_flag_names_its_environment_fallback():
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text.split("## `jupyter-vgpu device-plugin`")[1].split("## `jupyter-vgpu sim`")[0]
    rows = [line for line in section.splitlines() if line.startswith("| `--")]
    assert rows, "no flags found"
    missing = [row.split("|")[1].strip() for row in rows if "VGPU_" not in row and "$" not in row]
    assert not missing, f"flags without an environment fallback: {missing}"
