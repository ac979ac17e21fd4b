"""Pure renderers: the REST-shaped fact dicts to plain text, HTML snippets and SVG.

No widgets and no I/O here, so the text a terminal shows and the SVG a browser shows
come from the same numbers and can be tested as strings.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from jupyter_vgpu.core.contract import format_mib

MINE = "#2e7d32"
OTHERS = "#9e9e9e"
FREE = "#e0e0e0"
LIMIT = "#c62828"


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
        return f"MIG {card['migProfile']} on {name} (isolated) · {card.get('model') or 'unknown model'}"
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
            return
        lines.append("  " * depth + f"{node.get('level')} {node.get('gpus')}")
        for child in node.get("children") or []:
            walk(child, depth + 1)

    if topology.get("tree"):
        walk(topology["tree"], 0)
    else:
        for index in sorted(gpus):
            lines.append("  " + _gpu_line(index, gpus[index]))
    return "\n".join(lines)


def _gpu_line(index: int, gpu: Mapping[str, Any]) -> str:
    mine = " <- yours" if gpu.get("mine") else ""
    health = "" if gpu.get("healthy", True) else " UNHEALTHY"
    used = gpu.get("allocatedCores") or 0
    return f"GPU {index} {text_bar(used, 100, 10)} {used} % allocated, {gpu.get('tenants', 0)} tenant(s){health}{mine}"


def topology_svg(topology: Mapping[str, Any]) -> str:
    """The node's tree, leaves as cards: yours highlighted, others' occupancy as grey fill."""
    gpus = {g["index"]: g for g in topology.get("gpus") or []}
    tree = topology.get("tree") or {"level": "ROOT", "gpus": sorted(gpus),
                                     "children": [{"level": "GPU", "gpus": [i], "children": []} for i in sorted(gpus)]}
    leaves = [n for n in _leaves(tree)]
    depth = _depth(tree)
    card_w, card_h, gap, level_h = 96, 64, 16, 48
    width = max(1, len(leaves)) * (card_w + gap) + gap
    height = depth * level_h + card_h + 40
    positions: dict[int, float] = {leaf: gap + i * (card_w + gap) + card_w / 2 for i, leaf in enumerate(leaves)}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="vgpu-topology" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="GPU topology">']

    def draw(node: Mapping[str, Any], level: int) -> float:
        x = sum(positions[g] for g in node["gpus"]) / max(1, len(node["gpus"]))
        y = 16 + level * level_h
        if node.get("level") == "GPU":
            parts.append(_card_svg(node["gpus"][0], gpus.get(node["gpus"][0], {}), x - card_w / 2,
                                   16 + depth * level_h, card_w, card_h))
            return x
        for child in node.get("children") or []:
            cx = draw(child, level + 1)
            cy = 16 + depth * level_h if child.get("level") == "GPU" else 16 + (level + 1) * level_h
            parts.append(f'<line x1="{x:.1f}" y1="{y + 8}" x2="{cx:.1f}" y2="{cy}" stroke="#757575"/>')
        parts.append(f'<text x="{x:.1f}" y="{y + 4}" text-anchor="middle" font-size="11" font-family="sans-serif">'
                     f'{esc(node.get("level"))}</text>')
        return x

    draw(tree, 0)
    parts.append("</svg>")
    return "".join(parts)


def _card_svg(index: int, gpu: Mapping[str, Any], x: float, y: float, w: int, h: int) -> str:
    """One card: its share of compute held by anyone (grey), yours on top (green)."""
    mine = bool(gpu.get("mine"))
    used = percent(gpu.get("allocatedCores"), 100)
    own = percent(gpu.get("myCores"), 100) if mine and gpu.get("myCores") is not None else (used if mine else 0.0)
    stroke = MINE if mine else "#616161"
    tenants = gpu.get("tenants", 0) or 0
    if mine:
        label = f"you {own:.0f} % · {used:.0f} % held"
    elif tenants or used:
        label = f"{tenants} tenant(s) · {used:.0f} % held"
    else:
        label = "free"
    health = "" if gpu.get("healthy", True) else " ✕"
    bar_w = w - 8
    return (
        f'<g class="vgpu-card{" vgpu-mine" if mine else ""}" data-index="{index}">'
        f'<title>GPU {index}: {esc(label)}</title>'
        f'<rect x="{x:.1f}" y="{y}" width="{w}" height="{h}" rx="6" fill="white" stroke="{stroke}" '
        f'stroke-width="{3 if mine else 1}"/>'
        f'<text x="{x + w / 2:.1f}" y="{y + 16}" text-anchor="middle" font-size="12" font-family="sans-serif" '
        f'font-weight="{"bold" if mine else "normal"}">GPU {index}{health}</text>'
        f'<rect x="{x + 4:.1f}" y="{y + 26}" width="{bar_w}" height="10" fill="{FREE}"/>'
        f'<rect class="vgpu-occupancy" x="{x + 4:.1f}" y="{y + 26}" width="{bar_w * used / 100:.1f}" height="10" '
        f'fill="{OTHERS}"/>'
        + (f'<rect class="vgpu-own" x="{x + 4:.1f}" y="{y + 26}" width="{bar_w * own / 100:.1f}" height="10" '
           f'fill="{MINE}"/>' if mine else "")
        + f'<text x="{x + w / 2:.1f}" y="{y + 54}" text-anchor="middle" font-size="10" font-family="sans-serif">'
        f'{esc(label)}</text></g>'
    )


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
    lines = [head,
             f"  memory      {text_bar(memory, limit or 0)} {format_mib(memory)}"
             + (f" of {format_mib(limit)}" if limit else ""),
             f"  utilisation {text_bar(util, 100)} {util:.0f} % of the card" + (f" (share: {cores} %)" if cores else "")]
    return "\n".join(lines)


def usage_svg(history: Sequence[Mapping[str, Any]], limits: Mapping[str, Any] | None,
              width: int = 480, height: int = 160) -> str:
    """Memory (of the memory limit) and utilisation (of the card) over time, limits as dashed lines."""
    limits = limits or {}
    pad = 28
    inner_w, inner_h = width - 2 * pad, height - 2 * pad
    memory_limit = limits.get("memoryMib") or max((p.get("memoryUsedMib") or 0 for p in history), default=1) or 1
    cores = limits.get("cores")
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="vgpu-usage" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="GPU usage">',
             f'<rect x="{pad}" y="{pad}" width="{inner_w}" height="{inner_h}" fill="#fafafa" stroke="#bdbdbd"/>']
    if history:
        t0, t1 = history[0]["t"], history[-1]["t"]
        span = max(t1 - t0, 1e-9)

        def xy(point: Mapping[str, Any], value: float, top: float) -> str:
            x = pad + (inner_w * (point["t"] - t0) / span if len(history) > 1 else inner_w)
            y = pad + inner_h * (1 - min(value, top) / top)
            return f"{x:.1f},{y:.1f}"

        memory = " ".join(xy(p, p.get("memoryUsedMib") or 0, memory_limit) for p in history)
        util = " ".join(xy(p, p.get("utilizationPercent") or 0, 100) for p in history)
        parts.append(f'<polyline class="vgpu-memory" fill="none" stroke="#1565c0" stroke-width="2" points="{memory}"/>')
        parts.append(f'<polyline class="vgpu-utilization" fill="none" stroke="#ef6c00" stroke-width="2" points="{util}"/>')
    if cores and cores < 100:
        y = pad + inner_h * (1 - cores / 100)
        parts.append(f'<line class="vgpu-core-limit" x1="{pad}" x2="{pad + inner_w}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'stroke="{LIMIT}" stroke-dasharray="4 3"/>')
    parts.append(f'<text x="{pad}" y="{pad - 8}" font-size="11" font-family="sans-serif">'
                 f'<tspan fill="#1565c0">memory (of {esc(format_mib(memory_limit))})</tspan> '
                 f'<tspan fill="#ef6c00">utilisation (of the card)</tspan>'
                 + (f' <tspan fill="{LIMIT}">share {cores} %</tspan>' if cores and cores < 100 else "") + "</text>")
    parts.append("</svg>")
    return "".join(parts)
