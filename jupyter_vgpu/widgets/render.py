"""Pure renderers: the REST-shaped fact dicts to plain text, HTML snippets and SVG.

No widgets and no I/O here, so the text a terminal shows and the SVG a browser shows
come from the same numbers and can be tested as strings. Words and colours come from the
glossary the lab panel uses; colours are JupyterLab theme variables (light and dark alike)
with fallbacks for other frontends, set through ``style`` (SVG attributes cannot take var()).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from jupyter_vgpu.core.contract import format_mib
from jupyter_vgpu.widgets.glossary import (
    chart_label,
    colour,
    fill,
    glossary,
    measured,
    mig_slice,
    occupancy,
)

FONT = "font-family:var(--jp-ui-font-family, sans-serif)"


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


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
    lines.append(f"  share: {allocation.get('cores')} % compute, {format_mib(allocation.get('memoryMib') or 0)} memory"
                 + (f", enforced by {allocation['enforcement']}" if allocation.get("enforcement") else ""))
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


CARD_W, CARD_H, GAP, LEVEL_H, TOP = 124, 78, 12, 40, 18


def topology_svg(topology: Mapping[str, Any]) -> str:
    """The node's tree, leaves as cards: yours highlighted, everyone's allocation as a bar with
    its number. Drawn at its natural size (text 11-12 px); a narrow view scrolls sideways."""
    gpus = {g["index"]: g for g in topology.get("gpus") or []}
    tree = topology.get("tree") or {"level": "ROOT", "gpus": sorted(gpus),
                                     "children": [{"level": "GPU", "gpus": [i], "children": []} for i in sorted(gpus)]}
    leaves = _leaves(tree)
    depth = _depth(tree)
    width = max(1, len(leaves)) * (CARD_W + GAP) + GAP
    height = TOP + depth * LEVEL_H + CARD_H + 8
    positions: dict[int, float] = {leaf: GAP + i * (CARD_W + GAP) + CARD_W / 2 for i, leaf in enumerate(leaves)}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="vgpu-topology" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="GPU topology of '
             f'{esc(topology.get("node") or "this node")}" style="max-width:none;{FONT}">']
    labels: list[str] = []  # drawn last, over the lines

    def draw(node: Mapping[str, Any], level: int) -> float:
        x = sum(positions[g] for g in node["gpus"]) / max(1, len(node["gpus"]))
        y = TOP + level * LEVEL_H
        if node.get("level") == "GPU":
            parts.append(_card_svg(node["gpus"][0], gpus.get(node["gpus"][0], {}), x - CARD_W / 2,
                                   TOP + depth * LEVEL_H))
            return x
        for child in node.get("children") or []:
            cx = draw(child, level + 1)
            cy = TOP + depth * LEVEL_H if child.get("level") == "GPU" else TOP + (level + 1) * LEVEL_H
            mid = (y + cy) / 2
            parts.append(f'<path d="M{x:.1f},{y} V{mid:.1f} H{cx:.1f} V{cy}" style="fill:none;stroke:'
                         f'{colour("border")}"/>')
        name = topology.get("node") if node.get("level") == "ROOT" else node.get("level")
        labels.append(f'<text x="{x + 5:.1f}" y="{y - 4}" font-size="11" style="fill:{colour("text")}">'
                      f'{esc(name)}</text>')
        return x

    draw(tree, 0)
    parts += labels
    parts.append("</svg>")
    return f'<div class="vgpu-topology-scroll" style="overflow-x:auto;max-width:100%">{"".join(parts)}</div>'


def _card_svg(index: int, gpu: Mapping[str, Any], x: float, y: float) -> str:
    """One card: the compute all tenants hold (allocated) as a bar with its number, yours on top;
    the glossary's words on two lines (who, then how much is allocated)."""
    mine = bool(gpu.get("mine"))
    allocated = percent(gpu.get("allocatedCores"), 100)
    own = percent(gpu.get("myCores"), 100) if mine and gpu.get("myCores") is not None else (allocated if mine else 0.0)
    words = occupancy(gpu)
    who, _, how_much = words.partition(" · ")
    health = "" if gpu.get("healthy", True) else " ✕"
    bar_w = CARD_W - 16
    text = colour("text")
    return (
        f'<g class="vgpu-card{" vgpu-mine" if mine else ""}" data-index="{index}">'
        f'<title>GPU {index}{" (" + esc(gpu.get("model")) + ")" if gpu.get("model") else ""}: {esc(words)}</title>'
        f'<rect x="{x:.1f}" y="{y}" width="{CARD_W}" height="{CARD_H}" rx="6" style="fill:{colour("surface")};'
        f'stroke:{colour("compute") if mine else colour("border")};stroke-width:{2.5 if mine else 1}"/>'
        f'<text x="{x + 8:.1f}" y="{y + 17}" font-size="12" font-weight="{"bold" if mine else "normal"}" '
        f'style="fill:{text}">GPU {index}{health}</text>'
        + (_slices_svg(gpu["migSlices"], x + 8, y + 25, bar_w) if gpu.get("migSlices") else
           f'<rect x="{x + 8:.1f}" y="{y + 25}" width="{bar_w}" height="8" rx="3" style="fill:{colour("track")}"/>'
           f'<rect class="vgpu-occupancy" x="{x + 8:.1f}" y="{y + 25}" width="{bar_w * allocated / 100:.1f}" '
           f'height="8" rx="3" style="fill:{colour("others")}"/>'
           + (f'<rect class="vgpu-own" x="{x + 8:.1f}" y="{y + 25}" width="{bar_w * own / 100:.1f}" height="8" '
              f'rx="3" style="fill:{colour("compute")}"/>' if mine else ""))
        + f'<text class="vgpu-who" x="{x + 8:.1f}" y="{y + 50}" font-size="11" style="fill:{text}">{esc(who)}</text>'
        + (f'<text class="vgpu-allocated" x="{x + 8:.1f}" y="{y + 66}" font-size="11" style="fill:{text}">'
           f'{esc(how_much)}</text>' if how_much else "")
        + "</g>"
    )


SLICE_COLOURS = {"mine": "compute", "held": "others", "free": "track", "unavailable": "error"}


def _slices_svg(slices: Sequence[Mapping[str, Any]], x: float, y: float, width: float) -> str:
    """A MIG card's bar: one segment per slice, as wide as its part of the card's compute, in the
    allocated bar's colours (yours, held by others, free); the panel's layoutSlices does the same."""
    parts, at = [], 0.0
    for slice_ in slices:
        part = min(int(slice_.get("slices") or 0) / max(int(slice_.get("cardSlices") or 1), 1), 1.0 - at)
        state = str(slice_.get("state"))
        parts.append(f'<rect class="vgpu-slice vgpu-slice-{esc(state)}" data-profile="{esc(slice_.get("profile"))}" '
                     f'x="{x + width * at:.1f}" y="{y}" width="{max(0.5, width * part - 1.5):.1f}" height="8" rx="2" '
                     f'style="fill:{colour(SLICE_COLOURS.get(state, "error"))}"><title>{esc(mig_slice(slice_))}'
                     f'</title></rect>')
        at += part
    return "".join(parts)


def _leaves(node: Mapping[str, Any]) -> list[int]:
    if node.get("level") == "GPU" or not node.get("children"):
        return list(node.get("gpus") or [])
    out: list[int] = []
    for child in node["children"]:
        out.extend(_leaves(child))
    return out


def _depth(node: Mapping[str, Any]) -> int:
    children = [c for c in node.get("children") or [] if c.get("level") != "GPU"]
    return 1 + max((_depth(c) for c in children), default=0)


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
               else f"{not_measured()} ({chart_label('notMeasuredWhy')})")
    lines = [head,
             f"  memory used  {text_bar(memory, limit or 0)} {format_mib(memory)}"
             + (f" of your {format_mib(limit)}" if limit else ""),
             f"  compute used {compute}" + (f" (your share: {cores} %)" if cores else "")]
    return "\n".join(lines)


def not_measured() -> str:
    """What the compute in use reads where it is not measured (a MIG slice), as the panel says it."""
    return chart_label("notMeasured")


def _memory_unit(limit_mib: float) -> tuple[str, float]:
    return ("GiB", 1024.0) if limit_mib >= 1024 else ("MiB", 1.0)


def _number(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".") if value % 1 else f"{value:.0f}"


def usage_svg(history: Sequence[Mapping[str, Any]], limits: Mapping[str, Any] | None, *, window: float = 120,
              width: int = 480, measured: bool = True) -> str:
    """Two charts, one quantity each: compute used (% of the card, your share dashed) and memory
    used (in GiB or MiB, your share's memory dashed), over the last ``window`` seconds. Compute
    that is not ``measured`` (a MIG slice) draws no line and says so in its title."""
    limits = limits or {}
    memory_limit = limits.get("memoryMib") or max((p.get("memoryUsedMib") or 0 for p in history), default=0) or 1024
    unit, scale = _memory_unit(memory_limit)
    end = history[-1]["t"] if history else 0.0
    cores = limits.get("cores")
    title = chart_label("utilization") + ("" if measured else f": {not_measured()}")
    compute = _chart(history if measured else [], "utilizationPercent", title, top=100.0, end=end, window=window,
                     width=width, ticks=[(0, "0 %"), (50, "50 %"), (100, "100 %")],
                     share=(float(cores), chart_label("shareLine", value=f"{cores} %")) if cores and cores < 100 else None,
                     colour_name="compute", css="vgpu-utilization")
    memory_ticks = [(0.0, "0"), (memory_limit / 2, _number(memory_limit / 2 / scale)),
                    (float(memory_limit), _number(memory_limit / scale))]
    memory = _chart(history, "memoryUsedMib", chart_label("memory", unit=unit), top=float(memory_limit), end=end,
                    window=window, width=width, ticks=memory_ticks,
                    share=(float(memory_limit), chart_label("shareLine", value=format_mib(memory_limit)))
                    if limits.get("memoryMib") else None, colour_name="memory", css="vgpu-memory")
    return f'<div class="vgpu-usage" style="overflow-x:auto;max-width:100%">{compute}{memory}</div>'


def _chart(history: Sequence[Mapping[str, Any]], key: str, title: str, *, top: float, end: float, window: float,
           width: int, ticks: list[tuple[float, str]], share: tuple[float, str] | None, colour_name: str,
           css: str) -> str:
    left, right, head, foot, inner_h = 44, 12, 20, 22, 64
    inner_w, height = width - left - right, head + inner_h + foot
    muted, border = colour("muted"), colour("border")

    def y_of(value: float) -> float:
        return head + inner_h * (1 - max(0.0, min(value, top)) / top)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="vgpu-chart {css}-chart" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}" '
             f'style="width:100%;min-width:360px;max-width:{width}px;height:auto;{FONT}">',
             f'<text class="vgpu-chart-title" x="{left}" y="13" font-size="11" style="fill:{colour("text")}">'
             f'{esc(title)}</text>',
             f'<rect x="{left}" y="{head}" width="{inner_w}" height="{inner_h}" style="fill:none;stroke:{border}"/>']
    for value, label in ticks:
        parts.append(f'<text class="vgpu-tick" x="{left - 4}" y="{y_of(value) + 4:.1f}" font-size="10" '
                     f'text-anchor="end" style="fill:{muted}">{esc(label)}</text>')
    for seconds, anchor in ((window, "start"), (window / 2, "middle"), (0, "end")):
        x = left + inner_w * (1 - seconds / window)
        label = "now" if seconds == 0 else f"{_number(seconds)} s ago"
        parts.append(f'<text class="vgpu-tick" x="{x:.1f}" y="{head + inner_h + 15}" font-size="10" '
                     f'text-anchor="{anchor}" style="fill:{muted}">{label}</text>')
    if share is not None:
        y = y_of(share[0])
        parts.append(f'<line class="vgpu-share-line" x1="{left}" x2="{left + inner_w}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'style="stroke:{colour("limit")};stroke-dasharray:4 3"/>')
        parts.append(f'<text class="vgpu-share-label" x="{left + inner_w}" y="13" font-size="10" text-anchor="end" '
                     f'style="fill:{muted}">- - {esc(share[1])}</text>')
    shown = [p for p in history if end - p["t"] <= window]
    if shown:
        points = " ".join(f"{left + inner_w * (1 - (end - p['t']) / window):.1f},{y_of(p.get(key) or 0):.1f}"
                          for p in shown)
        parts.append(f'<polyline class="{css}" points="{points}" style="fill:none;stroke:{colour(colour_name)};'
                     f'stroke-width:2"/>')
    parts.append("</svg>")
    return "".join(parts)
