"""Print how the environment of a Python differs from a lock file: a Markdown table of the
packages whose installed version is not the locked one, newest first in mind.

    .venv/bin/python scripts/lock_drift.py requirements/test.txt

The scheduled workflow (.github/workflows/newest.yml) writes this beside the test result, so
a red run says which release moved. Exit status 0 always: drift is information, not failure.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\#]+?))?\s*\\?$")


def locked(lock: Path) -> dict[str, str]:
    """Package -> locked version, for the pins whose environment marker holds here."""
    from packaging.markers import Marker

    pins: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        match = PIN.match(line)
        if match and (match.group(3) is None or Marker(match.group(3)).evaluate()):
            pins[canonicalize_name(match.group(1))] = match.group(2)
    return pins


def installed() -> dict[str, str]:
    return {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}


def drift(lock: Path) -> list[tuple[str, str, str]]:
    pins, have = locked(lock), installed()
    rows = [(name, pins.get(name, "—"), have.get(name, "—")) for name in sorted(set(pins) | set(have))]
    return [row for row in rows if row[1] != row[2] and row[0] not in ("jupyter-vgpu", "pip")]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    rows = drift(Path(argv[0]))
    if not rows:
        print(f"Every installed package is at its version in {argv[0]}.")
        return 0
    print(f"{len(rows)} packages differ from {argv[0]}:\n")
    print("| package | locked | installed |\n|---|---|---|")
    for name, pin, have in rows:
        print(f"| {name} | {pin} | {have} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
