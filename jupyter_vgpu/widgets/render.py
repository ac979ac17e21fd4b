"""The plain text of the REST-shaped fact dicts: what a terminal (and a frontend without
widgets) shows. Browsers draw the same facts with the lab panel's renderer (views.py).

No widgets and no I/O here. Words come from the glossary the lab panel uses.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from jupyter_vgpu.core.contract import format_mib
from jupyter_vgpu.widgets.glossary import fill, glossary, measured, mig_slice, occupancy


def percent(part: float | None, whole: float | None) -> float:
    if not part or not whole:
        return 0.0
    return max(0.0, min(100.0, 100.0 * part / whole))


def text_bar(value: float, limit: float, width: int = 20) -> str:
    filled = round(width * percent(value, limit) / 100)
    return "[" + "#" * filled + "." * (width - filled) + "]"


# --- allocation ---------------------------------------------------------------------


def card_title(card: Mapping[str, Any]) -> str:
    index = card.get("index")
    name = f"GPU {index}" if index is not None else "GPU"
    if card.get("migProfile"):
        title = fill(glossary()["isolation"]["title"], profile=card["migProfile"], gpu=name)
        return f"{title} · {card.get('model') or 'unknown model'}"
    return f"{name} · {card.get('model') or 'unknown model'}"


def allocation_text(answer: Mapping[str, Any]) -> str:
    allocation = answer.get("allocation")
    lines = []
    if answer.get("state") == "unreachable":
        lines.append(f"(stale) {answer.get('message')}")
    if not allocation:
        lines.append(answer.get("message") or "No vGPU allocated.")
        return "\n".join(lines)
    where = allocation.get("node") or "this machine"
    pod = allocation.get("pod")
    lines.append(f"vGPU on {where}" + (f" (pod {allocation.get('namespace')}/{pod})" if pod else "")
                 + f" — {answer.get('source')}")
    enforcement = allocation.get("enforcement")
    named = enforcement and enforcement not in ("none", "mig")
    lines.append(f"  share: {allocation.get('cores')} % compute, {format_mib(allocation.get('memoryMib') or 0)} memory"
                 + (f", enforced by {enforcement}" if named else ""))
    if enforcement and not named:  # nothing enforces it, or the hardware does: say which, as the panel does
        lines.append(f"  {enforcement_text(enforcement)}")
    for card in allocation.get("cards") or []:
        lines.append(f"  {card_title(card)}  {card.get('uuid') or ''}".rstrip())
        lines.append(f"    compute {text_bar(card.get('cores') or 0, 100)} {card.get('cores')} %")
        total = card.get("memoryTotalMib")
        memory = card.get("memoryMib") or 0
        if total:
            lines.append(f"    memory  {text_bar(memory, total)} {format_mib(memory)} of {format_mib(total)}")
        else:
            lines.append(f"    memory  {format_mib(memory)}")
    return "\n".join(lines)


def enforcement_text(enforcement: str) -> str:
    """What holds the notebook to its share, in the panel's words (describeEnforcement)."""
    words = glossary()["enforcement"]
    return str(words[enforcement]) if enforcement in ("none", "mig") else fill(words["backend"], backend=enforcement)


# --- topology -------------------------------------------------------------------------


def topology_text(answer: Mapping[str, Any]) -> str:
    topology = answer.get("topology")
    if not topology:
        return answer.get("message") or "No topology available."
    lines = [f"GPU topology of {topology.get('node') or 'this node'}" + (" (stale)" if answer.get("state") == "unreachable" else "")]
    gpus = {g["index"]: g for g in topology.get("gpus") or []}

    def walk(node: Mapping[str, Any], depth: int) -> None:
        if node.get("level") == "GPU":
            index = node["gpus"][0]
            lines.append("  " * depth + _gpu_line(index, gpus.get(index, {})))
            lines.extend("  " * (depth + 2) + mig_slice(s) for s in gpus.get(index, {}).get("migSlices") or [])
            return
        lines.append("  " * depth + f"{node.get('level')} {node.get('gpus')}")
        for child in node.get("children") or []:
            walk(child, depth + 1)

    if topology.get("tree"):
        walk(topology["tree"], 0)
    else:
        for index in sorted(gpus):
            lines.append("  " + _gpu_line(index, gpus[index]))
            lines.extend("      " + mig_slice(s) for s in gpus[index].get("migSlices") or [])
    return "\n".join(lines)


SLICE_MARKS = {"mine": "@", "held": "#", "free": ".", "unavailable": "x"}


def _gpu_line(index: int, gpu: Mapping[str, Any]) -> str:
    slices = gpu.get("migSlices") or []
    if slices:  # one mark per compute slice: yours @, held #, free ., unavailable x
        marks = "|".join(SLICE_MARKS.get(s.get("state"), "?") * int(s.get("slices") or 1) for s in slices)
        return f"GPU {index} [{marks}] {occupancy(gpu)}"
    allocated = gpu.get("allocatedCores") or 0
    return f"GPU {index} {text_bar(allocated, 100, 10)} {occupancy(gpu)}"


# --- usage -------------------------------------------------------------------------------


def usage_text(answer: Mapping[str, Any]) -> str:
    state = answer.get("state")
    if state == "none":
        return answer.get("message") or "No vGPU allocated."
    limits = answer.get("limits") or {}
    current = answer.get("current")
    head = f"usage ({state})" + (f": {answer.get('message')}" if answer.get("message") else "")
    if not current:
        return head
    memory, limit = current.get("memoryUsedMib") or 0, limits.get("memoryMib")
    cores = limits.get("cores")
    util = current.get("utilizationPercent") or 0
    compute = (f"{text_bar(util, 100)} {util:.0f} % of the card" if measured(current)
               else f"{not_measured()} ({glossary()['charts']['notMeasuredWhy']})")
    lines = [head,
             f"  memory used  {text_bar(memory, limit or 0)} {format_mib(memory)}"
             + (f" of your {format_mib(limit)}" if limit else ""),
             f"  compute used {compute}" + (f" (your share: {cores} %)" if cores else "")]
    return "\n".join(lines)


SNAPSHOT_NOTE = "jupyter-vgpu, as the cell showed it when it ran; run the cell again for the live view"


def snapshot_html(text: str) -> str:
    """The plain text as a widget's static HTML fallback (escaped; it is shown in untrusted notebooks)."""
    return (f'<div class="jp-vgpu-snapshot"><pre>{html.escape(text)}</pre>'
            f"<p><small>{html.escape(SNAPSHOT_NOTE)}</small></p></div>")


def not_measured() -> str:
    """What the compute in use reads where it is not measured (a MIG slice), as the panel says it."""
    return str(glossary()["charts"]["notMeasured"])
