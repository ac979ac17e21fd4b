"""Data shipped with the package: topology captures for the simulated cluster and the demo."""

from __future__ import annotations

from pathlib import Path

TOPOLOGY_DIR = Path(__file__).parent / "topology"

CARD_MEMORY_MIB = {
    "p40-7gpu-pix-phb": 24576,  # Tesla P40: 24 GiB
    "dgx-a100": 40960,  # A100-SXM4-40GB
    "a100-pcie-4gpu-2numa": 40960,  # A100-PCIE-40GB
    "a100-sxm-4gpu-nv4": 40960,  # A100-SXM4-40GB
}
"""Each bundled capture's cards' memory in MiB, as the demo and the simulated cluster model them
(`nvidia-smi topo -m` does not say it)."""


def topology_fixture(name: str) -> Path:
    """Path of a bundled `nvidia-smi topo -m` capture, by file name with or without `.txt`."""
    path = TOPOLOGY_DIR / (name if name.endswith(".txt") else f"{name}.txt")
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in TOPOLOGY_DIR.glob("*.txt")))
        raise FileNotFoundError(f"no bundled topology {name!r}; known: {known}")
    return path


def bundled_card_memory_mib(text: str) -> int | None:
    """The cards' memory of the machine a capture's ``text`` shows, when it is one of the bundled
    captures (read from a copy or from stdin as well); None for any other text."""
    for stem, memory_mib in CARD_MEMORY_MIB.items():
        bundled = TOPOLOGY_DIR / f"{stem}.txt"
        if bundled.is_file() and bundled.read_text(encoding="utf-8", errors="replace") == text:
            return memory_mib
    return None
