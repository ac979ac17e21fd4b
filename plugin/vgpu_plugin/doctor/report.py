"""Findings and how they are shown: one line each (ok / warn / fail), or JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Finding:
    check: str  # short name: "driver", "mig", "kubelet-socket", ...
    status: str  # OK, WARN or FAIL
    detail: str  # what was found
    remedy: str = ""  # what to do, for warn and fail

    def __post_init__(self) -> None:
        if self.status not in (OK, WARN, FAIL):
            raise ValueError(f"status {self.status!r} is not ok, warn or fail")


def exit_code(findings: Sequence[Finding]) -> int:
    """1 when any check failed, else 0 (warnings do not fail the node)."""
    return 1 if any(f.status == FAIL for f in findings) else 0


def render_text(findings: Sequence[Finding]) -> str:
    width = max((len(f.check) for f in findings), default=0)
    lines = []
    for f in findings:
        lines.append(f"{f.status:<4}  {f.check:<{width}}  {f.detail}")
        if f.remedy and f.status != OK:
            lines.append(f"{'':<4}  {'':<{width}}  -> {f.remedy}")
    counts = {s: sum(1 for f in findings if f.status == s) for s in (OK, WARN, FAIL)}
    lines.append(f"{counts[OK]} ok, {counts[WARN]} warn, {counts[FAIL]} fail")
    return "\n".join(lines)


def render_json(findings: Sequence[Finding], node: str | None) -> str:
    return json.dumps({"node": node, "ok": exit_code(findings) == 0,
                       "checks": [asdict(f) for f in findings]}, indent=2)
