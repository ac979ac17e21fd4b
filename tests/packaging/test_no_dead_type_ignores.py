"""mypy checks the pure core, not the tests: a type-ignore comment in tests/ silences nothing."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
MARK = "# type" + ": ignore"  # spelled in two parts so this file does not match itself


def test_no_type_ignore_comments_in_the_tests() -> None:
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 50, "the scan must see the test suite"
    found = [f"{path.relative_to(TESTS)}:{number}" for path in files
             for number, line in enumerate(path.read_text().splitlines(), 1) if MARK in line]
    assert not found, f"dead type-ignore comments (tests are not type-checked): {found}"
