"""ipywidgets views over a FactSource, built only from core widgets (no custom JS, no CDN).

Each view's ``repr`` is the plain text a frontend without widgets shows. The live
usage chart polls its source in a daemon thread (cell execution is never blocked) and
stops when it is closed — from Python or by the frontend closing its comm.
"""

from __future__ import annotations

import threading
from typing import Any

import ipywidgets as w

from jupyter_vgpu.core.contract import format_mib
from jupyter_vgpu.widgets import render


class _TextRepr:
    """Full plain-text repr in the mimebundle (ipywidgets truncates its own to 110 chars)."""

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = super()._repr_mimebundle_(**kwargs) or {}  # type: ignore[misc]
        bundle["text/plain"] = repr(self)
        return bundle


def _bar(description: str, value: float, maximum: float, style: str) -> w.FloatProgress:
    return w.FloatProgress(value=min(value, maximum), min=0, max=max(maximum, 1e-9), description=description,
                           bar_style=style, layout=w.Layout(width="95%"))


class AllocationCard(_TextRepr, w.VBox):
    """Model, UUID and node of each card, with the share of compute and memory as bars."""

    def __init__(self, source: Any, answer: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source = source
        self.answer: dict[str, Any] = {}
        self.refresh(answer)

    def refresh(self, answer: dict[str, Any] | None = None) -> None:
        self.answer = answer if answer is not None else self.source.allocation()
        self.children = self._build()

    def _build(self) -> tuple[w.Widget, ...]:
        answer = self.answer
        allocation = answer.get("allocation")
        children: list[w.Widget] = []
        if answer.get("state") == "unreachable":
            children.append(w.HTML(f'<div class="vgpu-stale" style="color:#b26a00">⚠ {render.esc(answer.get("message"))}</div>'))
        if not allocation:
            children.append(w.HTML(f'<div class="vgpu-empty"><b>No vGPU</b><br>{render.esc(answer.get("message"))}</div>'))
            return tuple(children)
        pod = allocation.get("pod")
        children.append(w.HTML(
            f'<div class="vgpu-header"><b>vGPU</b> on <code>{render.esc(allocation.get("node") or "this machine")}</code>'
            + (f' · pod <code>{render.esc(allocation.get("namespace"))}/{render.esc(pod)}</code>' if pod else "")
            + (f' · enforced by {render.esc(allocation.get("enforcement"))}' if allocation.get("enforcement") else "")
            + "</div>"))
        for card in allocation.get("cards") or []:
            total = card.get("memoryTotalMib") or card.get("memoryMib") or 0
            memory = card.get("memoryMib") or 0
            children.append(w.HTML(
                f'<div class="vgpu-card-title">{render.esc(render.card_title(card))}<br>'
                f'<small><code>{render.esc(card.get("uuid") or "")}</code></small></div>'))
            compute = _bar("compute", card.get("cores") or 0, 100, "success")
            compute.tooltip = f"{card.get('cores')} % of the card's compute"
            memory_bar = _bar("memory", memory, total, "info")
            memory_bar.tooltip = f"{format_mib(memory)} of {format_mib(total)}"
            children += [compute, w.Label(compute.tooltip), memory_bar, w.Label(memory_bar.tooltip)]
        return tuple(children)

    def __repr__(self) -> str:
        return render.allocation_text(self.answer)


class TopologyView(_TextRepr, w.HTML):
    """The node's GPU tree as SVG; your card highlighted, others' occupancy anonymous."""

    def __init__(self, source: Any, answer: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source = source
        self.answer: dict[str, Any] = {}
        self.refresh(answer)

    def refresh(self, answer: dict[str, Any] | None = None) -> None:
        self.answer = answer if answer is not None else self.source.topology()
        topology = self.answer.get("topology")
        if topology:
            note = f'<div style="color:#b26a00">⚠ {render.esc(self.answer.get("message"))}</div>' \
                if self.answer.get("state") == "unreachable" else ""
            self.value = note + render.topology_svg(topology)
        else:
            self.value = f'<div class="vgpu-empty">{render.esc(self.answer.get("message") or "No topology")}</div>'

    def __repr__(self) -> str:
        return render.topology_text(self.answer)


class UsageChart(_TextRepr, w.VBox):
    """Memory and utilisation against the limits; ``live=True`` polls about once a second."""

    def __init__(self, source: Any, *, window: float = 120, interval: float = 1.0, live: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source = source
        self.window = window
        self.interval = interval
        self.answer: dict[str, Any] = {}
        self.chart = w.HTML()
        self.memory = w.FloatProgress(min=0, max=1, description="memory", bar_style="info")
        self.utilization = w.FloatProgress(min=0, max=100, description="utilisation", bar_style="warning")
        self.status = w.HTML()
        self.children = (self.status, self.chart, self.memory, self.utilization)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.refresh()
        if live:
            self.start()

    def refresh(self, answer: dict[str, Any] | None = None) -> None:
        self.answer = answer if answer is not None else self.source.usage(self.window)
        answer = self.answer
        limits = answer.get("limits") or {}
        current = answer.get("current") or {}
        history = list(answer.get("history") or [])
        if current and (not history or history[-1].get("t") != current.get("t")):
            history.append(current)
        self.chart.value = render.usage_svg(history, limits)
        memory_limit = limits.get("memoryMib") or max(current.get("memoryUsedMib") or 0, 1)
        with self.hold_sync():
            self.memory.max = max(memory_limit, 1e-9)
            self.memory.value = min(current.get("memoryUsedMib") or 0, self.memory.max)
            self.memory.description = f"mem {render.percent(current.get('memoryUsedMib'), memory_limit):.0f}%"
            self.utilization.value = min(current.get("utilizationPercent") or 0, 100)
            state = answer.get("state")
            colour = {"live": "#2e7d32", "stale": "#b26a00", "unreachable": "#c62828"}.get(state or "", "#616161")
            message = f" — {render.esc(answer.get('message'))}" if answer.get("message") else ""
            self.status.value = f'<span class="vgpu-state" style="color:{colour}">● {render.esc(state)}</span>{message}'

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, name="vgpu-usage-chart", daemon=True)
        self._thread.start()
        if self.comm is not None:
            self.comm.on_close(lambda _msg: self.stop())

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh()
            except Exception as error:  # noqa: BLE001 - keep polling; show what went wrong
                self.status.value = f'<span style="color:#c62828">● error</span> {render.esc(error)}'

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def close(self) -> None:
        self.stop()
        for child in (self.chart, self.memory, self.utilization, self.status):
            child.close()
        super().close()

    def __repr__(self) -> str:
        return render.usage_text(self.answer)


class Dashboard(_TextRepr, w.VBox):
    """Allocation card, topology and live usage together."""

    def __init__(self, source: Any, *, live: bool = True, interval: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.allocation = AllocationCard(source)
        self.topology = TopologyView(source)
        self.usage = UsageChart(source, live=live, interval=interval)
        self.children = (self.allocation, w.HTML("<b>Topology</b>"), self.topology, w.HTML("<b>Usage</b>"), self.usage)

    def close(self) -> None:
        for child in self.children:
            child.close()
        super().close()

    def __repr__(self) -> str:
        return "\n\n".join(repr(v) for v in (self.allocation, self.topology, self.usage))
