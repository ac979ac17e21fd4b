"""Data shipped with the package: topology captures for the simulated cluster and the demo."""

from __future__ import annotations

from pathlib import Path

TOPOLOGY_DIR = Path(__file__).parent / "topology"


def topology_fixture(name: str) -> Path:
    """Path of a bundled `nvidia-smi topo -m` capture, by file name with or without `.txt`."""
    path = TOPOLOGY_DIR / (name if name.endswith(".txt") else f"{name}.txt")
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in TOPOLOGY_DIR.glob("*.txt")))
        raise FileNotFoundError(f"no bundled topology {name!r}; known: {known}")
    return path
