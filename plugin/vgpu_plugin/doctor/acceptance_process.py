"""A real CUDA process, and whether the node daemon's sampler attributes its memory and utilisation to it.

The worker (``acceptance_cuda hold``) allocates a known amount on the card under test and keeps
it busy; meanwhile the metrics ``Sampler`` the node daemon runs samples the same NVML backend
with no pods (outside Kubernetes): the worker's PID must be listed on that card with at least
the memory it allocated, with the owner its ``/proc/<pid>/cgroup`` gives ("host" outside any
pod), and, when it ran kernels, with utilisation above zero in one of the samples.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..metrics.cgroup import parse_cgroup_file
from ..metrics.sampler import Sampler
from .acceptance_report import FAIL, NA, PASS, CheckResult
from .acceptance_setup import AcceptanceRun
from .acceptance_worker import Worker, describe_silence

NODE_NAME = "acceptance"
MEMORY_SLACK_MIB = 2  # NVML's bytes floored to MiB, an allocator's rounding
ATTRIBUTION, UTILISATION = "process-attribution", "process-utilisation"


class NoPods:
    """The sampler's pod source outside Kubernetes: there are none."""

    def items(self) -> list[dict[str, Any]]:
        return []


def _cgroup(proc_root: str, pid: int) -> tuple[str | None, str]:
    """(the cgroup file's text, the owner the sampler must give: "host" outside a pod)."""
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup"), encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None, "unreadable"
    # no pod is known to the kit, so a process in a pod's cgroup is an unknown pod's
    return text, "host" if parse_cgroup_file(text) is None else "unknown-pod"


def _both(status: str, summary: str, details: dict[str, Any]) -> list[CheckResult]:
    return [CheckResult(ATTRIBUTION, status, summary, details),
            CheckResult(UTILISATION, NA, f"not measured: {summary}", {})]


def check_process(run: AcceptanceRun) -> list[CheckResult]:
    card = run.test_card()
    if card is None:
        return _both(NA, run.no_test_card(), {})
    options = run.options
    mode = run.compute_mode(card.index)
    details: dict[str, Any] = {"card": card.index, "uuid": card.uuid, "computeMode": mode}
    if mode == "PROHIBITED":
        return _both(NA, f"card {card.index} is in PROHIBITED compute mode: no CUDA context may be created", details)
    argv = run.worker("hold", "--mib", str(options.hold_mib), "--seconds", f"{options.busy_seconds:g}")
    details["worker"] = argv
    with Worker(argv, run.worker_env({"CUDA_VISIBLE_DEVICES": card.uuid})) as worker:
        timeout = run.budget.allow(options.ready_timeout)
        ready = worker.message(timeout)
        if ready is None or ready.get("event") != "ready":
            result = _not_ready(worker, ready, timeout, mode, details)
        else:
            result = _watch(run, card, worker, ready, details)
    details["workerEnded"] = worker.ended
    details["workerStderr"] = worker.stderr_tail() or None
    return result


def _not_ready(worker: Worker, message: dict[str, Any] | None, timeout: float, mode: str | None,
               details: dict[str, Any]) -> list[CheckResult]:
    if message is not None and message.get("event") == "unavailable":
        details["reason"] = message.get("reason")
        return _both(NA, f"no way to run CUDA here: {message.get('reason')}", details)
    worker.stop()
    why = f"the CUDA worker failed: {message.get('error')}" if message else describe_silence(worker, timeout)
    if mode == "EXCLUSIVE_PROCESS":
        why += " (the card is in EXCLUSIVE_PROCESS compute mode: is another process, an MPS server, on it?)"
    tail = worker.stderr_tail()
    return _both(FAIL, why + (f"; stderr: {tail.splitlines()[-1]}" if tail else ""), details)


def _watch(run: AcceptanceRun, card: Any, worker: Worker, ready: dict[str, Any],
           details: dict[str, Any]) -> list[CheckResult]:
    options = run.options
    pid = int(ready.get("pid") or worker.pid or 0)
    allocated = int(ready.get("allocatedMib") or options.hold_mib)
    kernels = bool(ready.get("kernels", True))
    details.update({"pid": pid, "framework": ready.get("framework"), "frameworkVersion": ready.get("version"),
                    "allocatedMib": allocated, "kernels": kernels, "smCount": ready.get("smCount"),
                    "frameworksSkipped": ready.get("skipped")})
    run.facts["smCount"] = ready.get("smCount")
    cgroup_text, expected_owner = _cgroup(options.proc_root, pid)
    details["cgroup"] = cgroup_text.strip() if cgroup_text else None
    details["expectedOwner"] = expected_owner
    sampler = Sampler(NODE_NAME, run.gpus, NoPods(), period=options.sample_period, proc_root=options.proc_root,
                      history_seconds=max(60.0, options.sample_period))
    samples: list[dict[str, Any]] = []
    started = time.monotonic()
    watch_for = run.budget.allow(options.busy_seconds)
    while True:
        snapshot = sampler.sample_once()
        mine = [p for p in snapshot.processes if p.pid == pid]
        samples.append({"t": round(time.monotonic() - started, 2), "failure": snapshot.failure,
                        "views": [{"card": p.card_index, "uuid": p.uuid, "memoryMib": p.memory_used_mib,
                                   "utilisation": p.utilization_percent, "owner": p.owner} for p in mine]})
        memory_ok = any(p.uuid == card.uuid and p.memory_used_mib >= allocated - MEMORY_SLACK_MIB for p in mine)
        busy_seen = any(p.utilization_percent > 0 for p in mine)
        enough = memory_ok and busy_seen and len(samples) >= 2  # without that, watch the whole window
        if enough or time.monotonic() - started + options.sample_period > watch_for or worker.exit_status() is not None:
            break
        time.sleep(options.sample_period)
    details["samples"] = samples
    worker.stop()  # at once: the verdict needs nothing more from it
    return [_attribution(card, pid, allocated, expected_owner, samples, details),
            _utilisation(pid, kernels, samples, ready)]


def _attribution(card: Any, pid: int, allocated: int, expected_owner: str, samples: list[dict[str, Any]],
                 details: dict[str, Any]) -> CheckResult:
    views = [v for s in samples for v in s["views"]]
    if not views:
        failures = sorted({s["failure"] for s in samples if s["failure"]})
        why = f"; the sampler failed: {failures[0]}" if failures else ""
        return CheckResult(ATTRIBUTION, FAIL, f"the CUDA process (pid {pid}) never appeared in the sampler's "
                           f"{len(samples)} sample(s) of NVML's process list{why} (in a container, NVML reports host "
                           "PIDs: run the kit on the host)", details)
    best = max(views, key=lambda v: v["memoryMib"])
    details["owner"] = best["owner"]
    details["listedMib"] = best["memoryMib"]
    problems = []
    if best["uuid"] != card.uuid:
        problems.append(f"listed on {best['uuid']}, not on card {card.index} ({card.uuid})")
    if best["memoryMib"] < allocated - MEMORY_SLACK_MIB:
        problems.append(f"{best['memoryMib']:.0f} MiB attributed, less than the {allocated} MiB it allocated")
    if best["owner"] != expected_owner:
        problems.append(f"owner {best['owner']!r}, but its cgroup ({(details.get('cgroup') or '').splitlines()[:1]}) "
                        f"makes it {expected_owner!r}")
    if problems:
        return CheckResult(ATTRIBUTION, FAIL, f"pid {pid}: " + "; ".join(problems), details)
    return CheckResult(ATTRIBUTION, PASS, f"pid {pid} ({details.get('framework')}) on card {card.index}: "
                       f"{best['memoryMib']:.0f} MiB attributed (it allocated {allocated} MiB), owner "
                       f"{best['owner']!r} from /proc/{pid}/cgroup", details)


def _utilisation(pid: int, kernels: bool, samples: list[dict[str, Any]], ready: dict[str, Any]) -> CheckResult:
    series = [max((v["utilisation"] for v in s["views"]), default=None) for s in samples]
    details: dict[str, Any] = {"pid": pid, "kernels": kernels, "utilisationPerSample": series}
    seen = [u for u in series if u is not None]
    if not seen:
        return CheckResult(UTILISATION, NA, "not measured: the process was not listed (see process-attribution)",
                           details)
    peak = max(seen)
    if peak > 0:
        return CheckResult(UTILISATION, PASS, f"pid {pid}: up to {peak:g} % of the card's SMs in "
                           f"{len(samples)} sample(s)", details)
    if not kernels:
        return CheckResult(UTILISATION, NA, f"the {ready.get('framework')} fallback launches no kernels (memsets "
                           "only) and NVML counted none; install PyTorch or CuPy for the worker to measure "
                           "utilisation", details)
    return CheckResult(UTILISATION, FAIL, f"pid {pid} ran kernels but its utilisation was 0 in all "
                       f"{len(samples)} sample(s) (nvmlDeviceGetProcessUtilization)", details)
