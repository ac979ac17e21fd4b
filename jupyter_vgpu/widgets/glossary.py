"""The shared glossary (labextension/src/glossary.json): the words the lab panel and the
widgets' front end use, read here so the widgets' plain text says the same. The wheel ships the file next to this
module; a source checkout reads it where the panel's source keeps it."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
CANDIDATES = (_HERE / "glossary.json", _HERE.parents[1] / "labextension" / "src" / "glossary.json")


@cache
def glossary() -> dict[str, Any]:
    for path in CANDIDATES:
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]
    raise FileNotFoundError(f"the glossary is missing (looked at {', '.join(map(str, CANDIDATES))})")


def fill(template: str, **values: object) -> str:
    """Fill ``{name}`` placeholders; unknown names stay as they are (as the panel's fill does)."""
    return re.sub(r"\{(\w+)\}", lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), template)


def count(noun: str, n: int) -> str:
    one, many = glossary()["counts"][noun]
    return fill(one if n == 1 else many, n=n)


def occupancy(gpu: Mapping[str, Any]) -> str:
    """One card's occupancy in words, as the panel's describeOccupancy says it."""
    words = glossary()["occupancy"]
    if gpu.get("healthy") is False:
        return str(words["unhealthy"])
    slices = gpu.get("migSlices") or []
    if slices:
        return mig_card(slices)
    tenants = int(gpu.get("tenants") or 0)
    allocated = gpu.get("allocatedCores") or 0
    if gpu.get("mine"):
        return fill(words["mineWithOthers"], others=count("others", tenants), allocated=allocated) if tenants \
            else fill(words["mine"], allocated=allocated)
    if tenants == 0 and allocated == 0:
        return str(words["free"])
    return fill(words["others"], tenants=count("tenants", tenants), allocated=allocated)


def mig_card(slices: list[Mapping[str, Any]]) -> str:
    """A card in MIG mode in words, as the panel's describeOccupancy says it: your slice named,
    the rest counted."""
    words = glossary()["mig"]
    held = sum(1 for s in slices if s.get("state") in ("mine", "held"))
    total = count("slices", len(slices))
    mine = next((s for s in slices if s.get("state") == "mine"), None)
    if mine is not None:
        return fill(words["mine"], profile=mine.get("profile"), held=held, slices=total)
    return fill(words["others"], held=held, slices=total) if held else fill(words["free"], slices=total)


def mig_slice(slice_: Mapping[str, Any]) -> str:
    """One MIG slice in words ("2g.10gb · yours"), as the panel's describeSlice says it."""
    words = glossary()["mig"]
    return fill(words["slice"], profile=slice_.get("profile"), state=words["states"].get(slice_.get("state"), "?"))


def measured(current: Mapping[str, Any] | None) -> bool:
    """Whether the compute in ``current`` was measured (not on a MIG slice: NVML has none per slice)."""
    return not current or current.get("utilizationMeasured") is not False
