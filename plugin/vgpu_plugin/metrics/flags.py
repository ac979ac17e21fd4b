"""The metrics server's command-line flags, for the node daemon's parser (env-var fallbacks).

    parser = argparse.ArgumentParser()
    add_metrics_arguments(parser)
    args = parser.parse_args(argv)
    server = MetricsServer(node, backend, pods, minter, names, **metrics_options(args), enforcement=...)

The node API (--metrics-port, a hostPort) and the scrape endpoint (--metrics-scrape-port,
not on the host, bearer token from --metrics-scrape-token-file) are separate listeners.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from jupyter_vgpu.core.contract import DEFAULT_METRICS_PORT

# Prometheus /metrics and /metric: a port the DaemonSet does not put on the host
DEFAULT_SCRAPE_PORT = 5679

ENV_ADDRESS = "VGPU_METRICS_ADDRESS"
ENV_PORT = "VGPU_METRICS_PORT"
ENV_PERIOD = "VGPU_METRICS_PERIOD"
ENV_HISTORY = "VGPU_METRICS_HISTORY"
ENV_REQUIRE_TOKEN = "VGPU_METRICS_REQUIRE_TOKEN"
ENV_PROC_ROOT = "VGPU_METRICS_PROC_ROOT"
ENV_SCRAPE_ADDRESS = "VGPU_METRICS_SCRAPE_ADDRESS"
ENV_SCRAPE_PORT = "VGPU_METRICS_SCRAPE_PORT"
ENV_SCRAPE_TOKEN_FILE = "VGPU_METRICS_SCRAPE_TOKEN_FILE"


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is outside 0-65535 (0 picks a free port)")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of seconds")
    return value


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def add_metrics_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --metrics-* flags; each defaults to its VGPU_METRICS_* variable, then to the built-in."""
    env = os.environ.get
    group = parser.add_argument_group("metrics endpoint")
    group.add_argument("--metrics-address", default=env(ENV_ADDRESS, "0.0.0.0"),
                       help=f"address of the node API (/healthz and the per-pod /api/, read-token protected) "
                            f"[${ENV_ADDRESS}, default 0.0.0.0]")
    group.add_argument("--metrics-port", type=_port, default=env(ENV_PORT, str(DEFAULT_METRICS_PORT)),
                       help=f"node API port, the hostPort notebooks reach (0 picks a free one) "
                            f"[${ENV_PORT}, default {DEFAULT_METRICS_PORT}]")
    group.add_argument("--metrics-scrape-address", default=env(ENV_SCRAPE_ADDRESS, "0.0.0.0"),
                       help=f"address of the scrape endpoint (Prometheus /metrics, gpu-manager /metric) "
                            f"[${ENV_SCRAPE_ADDRESS}, default 0.0.0.0]")
    group.add_argument("--metrics-scrape-port", type=_port, default=env(ENV_SCRAPE_PORT, str(DEFAULT_SCRAPE_PORT)),
                       help=f"scrape endpoint port; keep it off the host (no hostPort): its pages name every "
                            f"tenant [${ENV_SCRAPE_PORT}, default {DEFAULT_SCRAPE_PORT}]")
    group.add_argument("--metrics-scrape-token-file", default=env(ENV_SCRAPE_TOKEN_FILE, ""), metavar="PATH",
                       help=f"file holding the bearer token Prometheus sends (a mounted Secret key, re-read "
                            f"when it changes); without one every scrape is refused "
                            f"[${ENV_SCRAPE_TOKEN_FILE}, default none]")
    group.add_argument("--metrics-period", type=_seconds, default=env(ENV_PERIOD, "1"),
                       help=f"seconds between GPU usage samples [${ENV_PERIOD}, default 1]")
    group.add_argument("--metrics-history", type=_seconds, default=env(ENV_HISTORY, "900"),
                       help=f"seconds of per-container usage history kept for the API [${ENV_HISTORY}, default 900]")
    group.add_argument("--metrics-require-token", type=_bool, default=env(ENV_REQUIRE_TOKEN, "true"),
                       metavar="BOOL",
                       help=f"require the container's read token on /api/ calls and the scrape token on "
                            f"/metrics and /metric; 'false' is for debugging only "
                            f"[${ENV_REQUIRE_TOKEN}, default true]")
    group.add_argument("--metrics-proc-root", default=env(ENV_PROC_ROOT, "/proc"),
                       help=f"the /proc of the PID namespace NVML's PIDs are in, to map GPU processes to pods: the "
                            f"host's (the DaemonSet runs with hostPID, so its own /proc is it) "
                            f"[${ENV_PROC_ROOT}, default /proc]")


def metrics_options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for MetricsServer from parsed flags; ValueError when they disagree."""
    if args.metrics_history < args.metrics_period:
        raise ValueError(f"--metrics-history ({args.metrics_history:g} s) must be at least "
                         f"--metrics-period ({args.metrics_period:g} s)")
    if args.metrics_port != 0 and args.metrics_port == args.metrics_scrape_port:
        raise ValueError(f"--metrics-port and --metrics-scrape-port are both {args.metrics_port}: the node API "
                         f"(a hostPort) and the scrape endpoint need different ports")
    return {
        "address": args.metrics_address,
        "port": args.metrics_port,
        "period": args.metrics_period,
        "history_seconds": args.metrics_history,
        "require_token": args.metrics_require_token,
        "scrape_address": args.metrics_scrape_address,
        "scrape_port": args.metrics_scrape_port,
        "scrape_token_file": args.metrics_scrape_token_file or None,
        "proc_root": args.metrics_proc_root,
    }
