"""The framework guard rails on a real card: PyTorch held to a share's memory by its per-process fraction.

A worker (``acceptance_cuda guard``) is given a share the way the device plugin gives one to a
vGPU container (``VGPU_CORES``, ``VGPU_MEMORY_MIB``, ``VGPU_DEVICE_UUIDS``,
``VGPU_DEVICE_INDICES``), applies ``jupyter_vgpu.guards.GuardRails`` before importing PyTorch,
as the notebook extension does, then allocates half the share (must work) and more than the
share (PyTorch must refuse it with its out-of-memory error, while the card has room for it).
"""

from __future__ import annotations

from typing import Any

from jupyter_vgpu.core import contract

from .acceptance_report import FAIL, NA, PASS, CheckResult
from .acceptance_setup import AcceptanceRun
from .acceptance_worker import Worker, describe_silence

NAME = "guard-rails"
SHARE_CORES = 25  # a quarter of a card
SHARE_MAX_MIB = 4096  # with at most 4 GiB


def share_mib(card_mib: int) -> int:
    """A 25 % share's memory, at most 4 GiB, in whole 256 MiB units."""
    units = min(SHARE_MAX_MIB, card_mib // 4) // contract.MEMORY_UNIT_MIB
    return max(1, units) * contract.MEMORY_UNIT_MIB


def check_guard(run: AcceptanceRun) -> CheckResult:
    card = run.test_card()
    if card is None:
        return CheckResult(NAME, NA, run.no_test_card())
    share = share_mib(card.memory_mib)
    env = {
        contract.ENV_CORES: str(SHARE_CORES), contract.ENV_MEMORY_MIB: str(share),
        contract.ENV_DEVICE_UUIDS: card.uuid, contract.ENV_DEVICE_INDICES: str(card.index),
        contract.ENV_DEVICE_MODEL: card.model, contract.ENV_ENFORCEMENT: "none",
        "CUDA_VISIBLE_DEVICES": card.uuid,
    }
    argv = run.worker("guard", "--total-mib", str(card.memory_mib))
    details: dict[str, Any] = {"card": card.index, "uuid": card.uuid, "shareCores": SHARE_CORES, "shareMib": share,
                               "cardMib": card.memory_mib, "worker": argv}
    with Worker(argv, run.worker_env(env)) as worker:
        timeout = run.budget.allow(run.options.result_timeout)
        message = worker.message(timeout)
        if message is None:
            worker.stop()
    details["workerEnded"] = worker.ended
    details["workerStderr"] = worker.stderr_tail() or None
    if message is None:
        return CheckResult(NAME, FAIL, describe_silence(worker, timeout), details)
    if message.get("event") == "unavailable":
        details["reason"] = message.get("reason")
        return CheckResult(NAME, NA, f"not checked: {message.get('reason')}", details)
    if message.get("event") != "result":
        return CheckResult(NAME, FAIL, f"the guard worker failed: {message.get('error')}", details)
    details["result"] = {k: v for k, v in message.items() if k != "event"}
    return judge(message, details)


def judge(result: dict[str, Any], details: dict[str, Any]) -> CheckResult:
    """Pass iff the rail was in force, half the share was allowed and more than the share refused by PyTorch."""
    rail = result.get("guard") or {}
    share, below, above = result.get("shareMib"), result.get("belowMib"), result.get("aboveMib")
    if rail.get("state") != "in force":
        return CheckResult(NAME, FAIL, f"the PyTorch guard rail is {rail.get('state') or 'missing'}: "
                           f"{rail.get('detail') or 'GuardRails set nothing'}", details)
    allowed, refused = result.get("below") or {}, result.get("above") or {}
    if not allowed.get("ok"):
        return CheckResult(NAME, FAIL, f"an allocation below the share ({below} of {share} MiB) failed: "
                           f"{allowed.get('error')}", details)
    if refused.get("ok"):
        return CheckResult(NAME, FAIL, f"PyTorch allocated {above} MiB with a {share} MiB share "
                           f"({rail.get('detail')}): the guard rail did not hold", details)
    if not refused.get("refused"):
        return CheckResult(NAME, FAIL, f"the allocation above the share failed, but not with PyTorch's "
                           f"out-of-memory error: {refused.get('error')}", details)
    return CheckResult(NAME, PASS, f"PyTorch {result.get('version')} with {rail.get('detail')}: {below} MiB "
                       f"allowed, {above} MiB refused (share {share} MiB, {result.get('freeMib')} MiB free)", details)
