"""The metrics flags the node daemon exposes: defaults, env fallbacks, clear errors."""

from __future__ import annotations

import argparse

import pytest
from vgpu_plugin.metrics import add_metrics_arguments, metrics_options


def parse(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="vgpu-node")
    add_metrics_arguments(parser)
    return metrics_options(parser.parse_args(argv))


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ADDRESS", "PORT", "PERIOD", "HISTORY", "REQUIRE_TOKEN", "PROC_ROOT", "SCRAPE_ADDRESS",
                 "SCRAPE_PORT", "SCRAPE_TOKEN_FILE"):
        monkeypatch.delenv(f"VGPU_METRICS_{name}", raising=False)
    assert parse([]) == {"address": "0.0.0.0", "port": 5678, "period": 1.0, "history_seconds": 900.0,
                         "require_token": True, "proc_root": "/proc", "scrape_address": "0.0.0.0",
                         "scrape_port": 5679, "scrape_token_file": None}


def test_scrape_port_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VGPU_METRICS_SCRAPE_PORT", "9400")
    monkeypatch.setenv("VGPU_METRICS_SCRAPE_TOKEN_FILE", "/var/run/secrets/scrape/token")
    options = parse([])
    assert (options["scrape_port"], options["scrape_token_file"]) == (9400, "/var/run/secrets/scrape/token")
    options = parse(["--metrics-scrape-port", "0", "--metrics-scrape-address", "10.1.2.3"])
    assert (options["scrape_port"], options["scrape_address"]) == (0, "10.1.2.3")


def test_one_port_for_both_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VGPU_METRICS_SCRAPE_PORT", raising=False)
    with pytest.raises(ValueError, match="different ports"):
        parse(["--metrics-port", "5679"])


def test_environment_then_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VGPU_METRICS_PORT", "9400")
    monkeypatch.setenv("VGPU_METRICS_PERIOD", "0.5")
    monkeypatch.setenv("VGPU_METRICS_REQUIRE_TOKEN", "false")
    monkeypatch.setenv("VGPU_METRICS_PROC_ROOT", "/host/proc")
    options = parse([])
    assert (options["port"], options["period"], options["require_token"], options["proc_root"]) == (
        9400, 0.5, False, "/host/proc")
    options = parse(["--metrics-port", "0", "--metrics-require-token", "yes", "--metrics-history", "1200"])
    assert (options["port"], options["require_token"], options["history_seconds"]) == (0, True, 1200.0)


@pytest.mark.parametrize("argv, words", [
    (["--metrics-port", "70000"], "outside 0-65535"),
    (["--metrics-port", "http"], "not a port number"),
    (["--metrics-period", "0"], "positive number of seconds"),
    (["--metrics-period", "fast"], "not a number of seconds"),
    (["--metrics-require-token", "maybe"], "not true or false"),
])
def test_bad_values_are_refused_with_the_reason(argv: list[str], words: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(argv)
    assert words in capsys.readouterr().err


def test_bad_environment_value_is_refused_too(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VGPU_METRICS_PERIOD", "-1")
    with pytest.raises(SystemExit):
        parse([])
    assert "positive number of seconds" in capsys.readouterr().err


def test_history_shorter_than_a_period_is_refused() -> None:
    with pytest.raises(ValueError, match="--metrics-history"):
        parse(["--metrics-period", "10", "--metrics-history", "5"])
