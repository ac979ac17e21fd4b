"""The repository works wherever it is cloned: nothing in it reads or points outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# a path that climbs out of the repository into the team's reference folder (built up so this
# file does not match itself)
OUTSIDE = re.compile(r"\.\./" + "shared|" + r"""["']shared["']\s*/\s*["'](fixtures|seeds|traces)""")


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, text=True)
    if listed.returncode != 0:  # an unpacked sdist: no git, walk the tree
        names = [str(p.relative_to(REPO)) for p in REPO.rglob("*") if p.is_file()
                 and not {".venv", "node_modules", ".git"} & set(p.relative_to(REPO).parts)]
    else:
        names = listed.stdout.splitlines()
    return [REPO / name for name in names if not name.endswith(("package-lock.json", ".png"))]


def test_no_file_reaches_outside_the_repository():
    offenders = []
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "paths outside the repository:\n" + "\n".join(offenders)


def test_the_checker_catches_an_outside_path():
    assert OUTSIDE.search("see " + "../" + "shared/DESIGN.md")
    assert OUTSIDE.search('ROOT / "shared"' + ' / "fixtures" / "topology"')
    assert not OUTSIDE.search("the panel's shared state")
