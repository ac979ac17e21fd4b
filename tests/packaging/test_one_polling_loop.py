"""Tests and benchmarks poll through ``simkube.waiting.wait_for``, the repository's one polling loop:
a hand-rolled ``deadline = time.monotonic() + ...`` loop must not come back."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("tests", "benchmarks")
# a deadline computed from a clock: ``time.monotonic() + 30``, ``monotonic() + timeout``, ``time.time() + 5``
DEADLINE = re.compile(r"\b(?:monotonic|perf_counter|time)\(\)\s*\+")


def deadline_lines(text: str) -> list[int]:
    return [number for number, line in enumerate(text.splitlines(), 1) if DEADLINE.search(line)]


def test_the_check_finds_a_hand_rolled_loop() -> None:
    loop = "deadline = time.monotonic() + 30\nwhile time.monotonic() < deadline:\n    time.sleep(0.1)\n"
    assert deadline_lines(loop) == [1]
    assert deadline_lines("end = monotonic()+timeout\n") == [1]
    assert deadline_lines("started = time.monotonic()\nelapsed = time.monotonic() - started\n") == []


def test_no_hand_rolled_deadline_loops_outside_simkube() -> None:
    files = [path for folder in SCANNED for path in sorted((REPO / folder).rglob("*.py"))
             if path != Path(__file__).resolve()]  # this file spells the pattern out
    assert len(files) > 50, "the scan must see the test suite"
    offenders = [f"{path.relative_to(REPO)}:{number}" for path in files
                 for number in deadline_lines(path.read_text(encoding="utf-8"))]
    assert offenders == [], f"poll with simkube.waiting.wait_for instead of a deadline loop: {offenders}"
