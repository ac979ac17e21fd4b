"""The acceptance kit's report: one result per check (pass, fail or n/a), as JSON and as Markdown.

The JSON (``acceptance.json``) has this shape; ``schemaVersion`` changes when a field changes
meaning or goes away (new fields may appear without it)::

    {
      "schema": "jupyter-vgpu/acceptance", "schemaVersion": 1,
      "result": "pass" | "fail",          # fail iff a check failed (the exit status is then 1)
      "counts": {"pass": 4, "fail": 0, "n/a": 2},
      "tool": {"name": "jupyter-vgpu doctor --acceptance", "version": "0.1.0"},
      "host": {"hostname": ..., "kernel": ..., "platform": ..., "python": ..., "executable": ...},
      "driver": {"version": "550.54.15", "nvml": "12.550.54.15" | null, "cuda": "12.4" | null},
      "cards": [{"index": 0, "uuid": "GPU-...", "model": ..., "memoryMib": ..., "healthy": true,
                 "mig": {"current": false, "pending": false} | null, "computeMode": "DEFAULT" | null,
                 "slices": [{"uuid": "MIG-...", "profile": "3g.20gb", "memoryMib": ...}]}],
      "options": {...},                   # what the run was asked to do (--allow-mps, the worker)
      "checks": [{"name": "cards", "status": "pass" | "fail" | "n/a", "summary": "one line",
                  "details": {...}, "seconds": 0.4}],
      "started": "2025-01-01T12:00:00Z", "finished": "...", "seconds": 41.2
    }
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "jupyter-vgpu/acceptance"
SCHEMA_VERSION = 1
PASS, FAIL, NA = "pass", "fail", "n/a"
STATUSES = (PASS, FAIL, NA)
JSON_NAME, MARKDOWN_NAME = "acceptance.json", "acceptance.md"


@dataclass
class CheckResult:
    name: str  # "cards", "process-attribution", ...
    status: str  # PASS, FAIL or NA
    summary: str  # one line: what was found, or why it could not be checked
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not pass, fail or n/a")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "summary": self.summary,
                "details": self.details, "seconds": round(self.seconds, 2)}


@dataclass
class AcceptanceReport:
    tool: dict[str, Any]
    host: dict[str, Any]
    driver: dict[str, Any]
    cards: list[dict[str, Any]]
    options: dict[str, Any]
    checks: list[CheckResult]
    started: str
    finished: str
    seconds: float

    def counts(self) -> dict[str, int]:
        return {status: sum(1 for c in self.checks if c.status == status) for status in STATUSES}

    def result(self) -> str:
        return FAIL if any(c.status == FAIL for c in self.checks) else PASS

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "schemaVersion": SCHEMA_VERSION, "result": self.result(), "counts": self.counts(),
            "tool": self.tool, "host": self.host, "driver": self.driver, "cards": self.cards,
            "options": self.options, "checks": [c.to_dict() for c in self.checks],
            "started": self.started, "finished": self.finished, "seconds": round(self.seconds, 1),
        }


def exit_code(report: AcceptanceReport) -> int:
    """1 when a check failed, else 0 (n/a is not a failure: the report says what was not checked)."""
    return 1 if report.result() == FAIL else 0


def render_json(report: AcceptanceReport) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False, default=str) + "\n"


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return " ".join(text.split()).replace("|", "\\|")


def _detail_lines(details: Mapping[str, Any]) -> list[str]:
    lines = []
    for key, value in details.items():
        if isinstance(value, str) and "\n" in value:
            lines += [f"- {key}:", "", "  ```text", *(f"  {line}" for line in value.rstrip().splitlines()), "  ```", ""]
        else:
            lines.append(f"- {key}: {_cell(value)}")
    return lines


def _card_rows(cards: Sequence[Mapping[str, Any]]) -> list[str]:
    rows = ["| index | UUID | model | memory | MIG (current / pending) | compute mode | MIG devices |",
            "|---|---|---|---|---|---|---|"]
    for card in cards:
        mig = card.get("mig")
        mig_text = "not supported" if mig is None else (
            f"{'on' if mig.get('current') else 'off'} / {'on' if mig.get('pending') else 'off'}")
        slices = ", ".join(f"{s.get('profile')} ({s.get('uuid')})" for s in card.get("slices") or []) or "-"
        rows.append(f"| {card.get('index')} | {_cell(card.get('uuid'))} | {_cell(card.get('model'))} | "
                    f"{card.get('memoryMib')} MiB | {mig_text} | {_cell(card.get('computeMode') or 'unknown')} | "
                    f"{_cell(slices)} |")
    return rows


def render_markdown(report: AcceptanceReport) -> str:
    counts = report.counts()
    host = report.host
    driver = report.driver
    driver_text = str(driver.get("version") or "not found")
    extra = [f"NVML {driver['nvml']}" if driver.get("nvml") else "", f"CUDA {driver['cuda']}" if driver.get("cuda") else ""]
    if any(extra):
        driver_text += " (" + ", ".join(e for e in extra if e) + ")"
    lines = [
        f"# GPU acceptance: {host.get('hostname', 'this host')}",
        "",
        f"**Result: {report.result().upper()}** — {counts[PASS]} pass, {counts[FAIL]} fail, {counts[NA]} n/a "
        f"({report.started} to {report.finished}, {report.seconds:.0f} s)",
        "",
        "| | |",
        "|---|---|",
        f"| host | {_cell(host.get('hostname'))}, {_cell(host.get('platform'))} |",
        f"| Python | {_cell(host.get('python'))} ({_cell(host.get('executable'))}) |",
        f"| driver | {_cell(driver_text)} |",
        f"| tool | {_cell(report.tool.get('name'))} {_cell(report.tool.get('version'))} |",
        f"| options | {_cell(report.options)} |",
        "",
        "## Cards",
        "",
    ]
    lines += _card_rows(report.cards) if report.cards else ["No card was found through NVML."]
    lines += ["", "## Checks", "", "| check | status | summary |", "|---|---|---|"]
    lines += [f"| {c.name} | {c.status} | {_cell(c.summary)} |" for c in report.checks]
    for check in report.checks:
        lines += ["", f"### {check.name}: {check.status}", "", check.summary, ""]
        lines += _detail_lines(check.details)
        lines.append(f"- seconds: {check.seconds:.1f}")
    lines += ["", "This run changed no GPU setting (no MIG mode, compute mode, clock or power change); "
                  "the processes it started were stopped before it finished.", ""]
    return "\n".join(lines)


def render_text(report: AcceptanceReport) -> str:
    """One line per check, for the terminal."""
    width = max((len(c.name) for c in report.checks), default=0)
    lines = [f"{c.status:<4}  {c.name:<{width}}  {c.summary}" for c in report.checks]
    counts = report.counts()
    lines.append(f"result: {report.result()} ({counts[PASS]} pass, {counts[FAIL]} fail, {counts[NA]} n/a)")
    return "\n".join(lines)


def write_reports(report: AcceptanceReport, directory: str | os.PathLike[str]) -> tuple[Path, Path]:
    """acceptance.json and acceptance.md in ``directory`` (created if missing)."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    json_path, markdown_path = folder / JSON_NAME, folder / MARKDOWN_NAME
    json_path.write_text(render_json(report), encoding="utf-8")
    markdown_path.write_text(render_markdown(report), encoding="utf-8")
    return json_path, markdown_path
