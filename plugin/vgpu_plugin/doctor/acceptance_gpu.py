"""The cards through our NVML backend, compared with nvidia-smi, and their MIG state (read only)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from .acceptance_report import FAIL, NA, PASS, CheckResult
from .acceptance_setup import AcceptanceRun
from .acceptance_smi import (
    CARD_FIELDS,
    MIG_FIELDS,
    SmiError,
    compare_cards,
    mig_devices,
    mode_flag,
    query,
)


def card_facts(run: AcceptanceRun) -> list[dict[str, Any]]:
    """The report's card table: what the backend publishes, with MIG and compute mode as NVML reads them."""
    facts = []
    for card in run.cards():
        mig = run.mig_mode(card.index)
        facts.append({
            "index": card.index, "uuid": card.uuid, "model": card.model, "memoryMib": card.memory_mib,
            "busId": card.bus_id, "healthy": card.healthy,
            "mig": None if mig is None else {"current": mig[0], "pending": mig[1]},
            "computeMode": run.compute_mode(card.index),
            "slices": [{"uuid": s.uuid, "profile": s.profile, "memoryMib": s.memory_mib} for s in card.slices],
        })
    return facts


def _models(cards: list[Any]) -> str:
    counts = Counter(f"{c.model} ({c.memory_mib} MiB)" for c in cards)
    return ", ".join(f"{n} x {model}" for model, n in sorted(counts.items()))


def check_cards(run: AcceptanceRun) -> CheckResult:
    gpus = run.gpus
    if not gpus.available():
        return CheckResult("cards", FAIL, f"our NVML backend finds no card: {gpus.problem() or 'no GPUs'}",
                           {"problem": gpus.problem()})
    cards = run.cards()
    driver = gpus.driver_version()
    details: dict[str, Any] = {"nvml": [{"index": c.index, "uuid": c.uuid, "model": c.model,
                                         "memoryMib": c.memory_mib} for c in cards], "driver": driver}
    if run.smi is None:
        return CheckResult("cards", NA, f"nvidia-smi is not installed, nothing to compare with; NVML finds "
                                        f"{len(cards)} card(s): {_models(cards)}", details)
    try:
        rows = query(run.smi, CARD_FIELDS, run.budget.allow(run.options.command_timeout))
    except SmiError as error:
        details["error"] = str(error)
        return CheckResult("cards", FAIL, f"nvidia-smi failed: {error}", details)
    details["nvidiaSmi"] = rows
    problems = compare_cards(cards, rows, driver)
    if problems:
        details["disagreements"] = problems
        return CheckResult("cards", FAIL, f"NVML and nvidia-smi disagree: {'; '.join(problems)}", details)
    return CheckResult("cards", PASS, f"{len(cards)} card(s) agree with nvidia-smi: {_models(cards)}, driver {driver}",
                       details)


def check_mig(run: AcceptanceRun) -> CheckResult:
    """Per card: current and pending MIG mode and the MIG devices, read only; compared with nvidia-smi."""
    if not run.gpus.available():
        return CheckResult("mig", NA, "no cards to read MIG state from")
    cards = run.cards()
    states: list[dict[str, Any]] = []
    for card in cards:
        mode = run.mig_mode(card.index)
        states.append({"index": card.index, "uuid": card.uuid,
                       "current": None if mode is None else mode[0], "pending": None if mode is None else mode[1],
                       "devices": [{"uuid": s.uuid, "profile": s.profile, "memoryMib": s.memory_mib}
                                   for s in card.slices]})
    details: dict[str, Any] = {"cards": states}
    if all(s["current"] is None for s in states):
        return CheckResult("mig", NA, "no card supports MIG (NVML: not supported)", details)
    problems: list[str] = []
    if run.smi is not None:
        try:
            timeout = run.budget.allow(run.options.command_timeout)
            rows = {row["uuid"]: row for row in query(run.smi, MIG_FIELDS, timeout)}
            listed = mig_devices(run.smi, timeout)
        except SmiError as error:
            problems.append(f"nvidia-smi failed: {error}")
            rows, listed = {}, {}
        for state in states:
            row = rows.get(state["uuid"])
            if row is None:
                continue
            for key, field_name in (("current", "mig.mode.current"), ("pending", "mig.mode.pending")):
                if state[key] is not None and mode_flag(row[field_name]) != state[key]:
                    problems.append(f"card {state['index']}: {key} MIG mode {state[key]} in NVML, "
                                    f"{row[field_name]!r} in nvidia-smi")
            ours = {d["uuid"] for d in state["devices"]}
            theirs = {d["uuid"] for d in listed.get(state["uuid"], [])}
            if state["current"] and ours != theirs:
                problems.append(f"card {state['index']}: MIG devices {sorted(ours)} in NVML, {sorted(theirs)} in "
                                "nvidia-smi -L")
        details["nvidiaSmi"] = {"modes": list(rows.values()), "devices": listed}
    else:
        details["nvidiaSmi"] = "not installed: not compared"
    words = []
    for state in states:
        if state["current"] is None:
            words.append(f"card {state['index']}: no MIG")
            continue
        text = f"card {state['index']}: MIG {'on' if state['current'] else 'off'}"
        if state["pending"] != state["current"]:
            text += f" ({'on' if state['pending'] else 'off'} after the next reset)"
        if state["devices"]:
            text += " with " + ", ".join(d["profile"] for d in state["devices"])
        words.append(text)
    summary = "; ".join(words) + " (read only)"
    if problems:
        details["disagreements"] = problems
        return CheckResult("mig", FAIL, f"{summary}; NVML and nvidia-smi disagree: {'; '.join(problems)}", details)
    return CheckResult("mig", PASS, summary, details)
