"""``jupyter-vgpu doctor --acceptance``: the GPU acceptance kit, on any Linux box with an NVIDIA card.

No Kubernetes, no network, only this package and its node dependencies; a run ends within five
minutes (each step has its own timeout, cut to what is left of the run's budget). In order:

``cards``                our NVML backend's cards against ``nvidia-smi`` (acceptance_gpu);
``mig``                  each card's current and pending MIG mode and MIG devices, read only;
``process-attribution``  a real CUDA process (acceptance_cuda) is found by the node daemon's
                         metrics sampler with its memory, on its card, owned as its cgroup says;
``process-utilisation``  ... and with utilisation above zero while it runs kernels (acceptance_process);
``guard-rails``          PyTorch's per-process memory fraction from a share refuses more than the
                         share (acceptance_guard);
``mps``                  with ``--allow-mps``: a private MPS daemon's pinned-memory limit holds a
                         client (acceptance_mps).

Each is pass, fail or n/a with a one-line summary and details; the report goes to
``acceptance.json`` and ``acceptance.md`` (acceptance_report documents the JSON). The exit
status is 1 iff a check failed. Nothing here changes a GPU setting: NVML is only read (no MIG
mode, compute mode, clock, power or persistence change), nvidia-smi is only queried, and every
process the kit starts (CUDA workers, the private MPS daemon) is stopped before it returns.
"""

from __future__ import annotations

import argparse
import logging
import platform
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .acceptance_gpu import card_facts, check_cards, check_mig
from .acceptance_guard import check_guard
from .acceptance_mps import check_mps
from .acceptance_process import ATTRIBUTION, UTILISATION, check_process
from .acceptance_report import (
    FAIL,
    NA,
    AcceptanceReport,
    CheckResult,
    exit_code,
    render_json,
    render_text,
    write_reports,
)
from .acceptance_setup import AcceptanceOptions, AcceptanceRun, Budget
from .acceptance_signals import terminate_as_exit
from .acceptance_smi import find_smi
from .acceptance_worker import package_shim
from .gpu_checks import nvml_version

log = logging.getLogger(__name__)

# (the results a step gives, the step, the seconds it needs at least to be worth starting)
STEPS: tuple[tuple[tuple[str, ...], Callable[[AcceptanceRun], Any], float], ...] = (
    (("cards",), check_cards, 2.0),
    (("mig",), check_mig, 2.0),
    ((ATTRIBUTION, UTILISATION), check_process, 20.0),
    (("guard-rails",), check_guard, 20.0),
    (("mps",), check_mps, 20.0),
)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def host_facts() -> dict[str, Any]:
    return {"hostname": socket.gethostname(), "kernel": platform.release(), "platform": platform.platform(),
            "python": platform.python_version(), "executable": sys.executable}


def driver_facts(gpus: Any) -> dict[str, Any]:
    from .gpu_checks import nvml_library

    cuda = None
    nv = nvml_library(gpus)
    if nv is not None:
        try:
            version = int(nv.nvmlSystemGetCudaDriverVersion())
            cuda = f"{version // 1000}.{version % 1000 // 10}"
        except Exception as error:  # NVMLError or old bindings: informative only
            log.debug("no CUDA driver version from NVML: %s", error)
    return {"version": gpus.driver_version(), "nvml": nvml_version(gpus), "cuda": cuda, "problem": gpus.problem()}


def _run_step(run: AcceptanceRun, names: tuple[str, ...], step: Callable[[AcceptanceRun], Any],
              needs: float) -> list[CheckResult]:
    started = time.monotonic()
    if run.budget.left() < needs:
        results = [CheckResult(name, NA, f"skipped: the run's {run.options.budget_seconds:.0f} s budget is spent")
                   for name in names]
    else:
        try:
            found = step(run)
            results = found if isinstance(found, list) else [found]
        except Exception as error:  # a kit that crashes tells nobody anything: the rest still run
            log.debug("acceptance step %s raised", names[0], exc_info=True)
            results = [CheckResult(names[0], FAIL, f"the check itself failed: {type(error).__name__}: {error}",
                                   {"traceback": traceback.format_exc(limit=8)})]
            results += [CheckResult(name, NA, f"not checked: {names[0]} failed") for name in names[1:]]
    elapsed = time.monotonic() - started
    for result in results:
        result.seconds = elapsed
    return results


def run_acceptance(gpus: Any, options: AcceptanceOptions, *, smi: str | None = None,
                   version: str | None = None) -> AcceptanceReport:
    """Every check against ``gpus`` (an NVML backend); ``smi`` is nvidia-smi's path (None: not installed)."""
    started_at, started = _now(), time.monotonic()
    checks: list[CheckResult] = []
    with tempfile.TemporaryDirectory(prefix="vgpu-acceptance-") as scratch:
        run = AcceptanceRun(gpus=gpus, options=options, budget=Budget(options.budget_seconds), smi=smi,
                            python_path=package_shim(Path(scratch)) if options.cuda_worker else None)
        for names, step, needs in STEPS:
            checks += _run_step(run, names, step, needs)
    if version is None:
        from jupyter_vgpu import __version__ as version
    return AcceptanceReport(
        tool={"name": "jupyter-vgpu doctor --acceptance", "version": version},
        host=host_facts(), driver=driver_facts(gpus), cards=card_facts(run), options=options.public(),
        checks=checks, started=started_at, finished=_now(), seconds=time.monotonic() - started,
    )


def run_from_args(args: argparse.Namespace) -> int:
    """The ``--acceptance`` branch of ``jupyter-vgpu doctor``."""
    if args.gpus != "nvml":
        print("jupyter-vgpu doctor: --acceptance checks real cards through NVML; drop --gpus "
              f"{args.gpus!r}", file=sys.stderr)
        return 2
    if args.report_dir:
        try:  # before the run, not after five minutes of it
            Path(args.report_dir).mkdir(parents=True, exist_ok=True)
        except OSError as error:
            print(f"jupyter-vgpu doctor: cannot use --report-dir {args.report_dir}: {error}", file=sys.stderr)
            return 2
    from jupyter_vgpu.gpu import open_backend

    options = AcceptanceOptions(proc_root=args.proc_root, allow_mps=args.allow_mps, cuda_worker=args.cuda_worker)
    gpus = open_backend("nvml")
    try:
        with terminate_as_exit():
            report = run_acceptance(gpus, options, smi=find_smi())
    finally:
        gpus.close()
    if args.report_dir:
        try:
            paths = write_reports(report, args.report_dir)
        except OSError as error:
            print(f"jupyter-vgpu doctor: cannot write the report: {error}", file=sys.stderr)
            return 2
    print(render_json(report) if args.json else render_text(report), end="\n" if not args.json else "")
    if args.report_dir:
        print(f"reports: {paths[0]}, {paths[1]}", file=sys.stderr)
    return exit_code(report)
