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
from jupyter_vgpu.widgets.glossary import colour, measured


class _TextRepr:
    """Full plain-text repr in the mimebundle (ipywidgets truncates its own to 110 chars)."""

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = super()._repr_mimebundle_(**kwargs) or {}  # type: ignore[misc]
        bundle["text/plain"] = repr(self)
        return bundle


def _bar(description: str, value: float, maximum: float, colour_name: str) -> w.FloatProgress:
    """A progress bar in the glossary's colour for the quantity (compute or memory)."""
    return w.FloatProgress(value=min(value, maximum), min=0, max=max(maximum, 1e-9), description=description,
                           style={"bar_color": colour(colour_name), "description_width": "initial"},
                           layout=w.Layout(width="95%"))


def _readout(text: str) -> w.HTML:
    """The number on a bar, in the theme's text colour."""
    return w.HTML(f'<span class="vgpu-readout" style="color:{colour("text")}">{render.esc(text)}</span>')


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
            children.append(w.HTML(f'<div class="vgpu-stale" style="color:{colour("limit")}">⚠ '
                                   f'{render.esc(answer.get("message"))}</div>'))
        if not allocation:
            children.append(w.HTML(f'<div class="vgpu-empty" style="color:{colour("text")}"><b>No vGPU</b><br>'
                                   f'{render.esc(answer.get("message"))}</div>'))
            return tuple(children)
        pod = allocation.get("pod")
        children.append(w.HTML(
            f'<div class="vgpu-header" style="color:{colour("text")}"><b>vGPU</b> on <code>{render.esc(allocation.get("node") or "this machine")}</code>'
            + (f' · pod <code>{render.esc(allocation.get("namespace"))}/{render.esc(pod)}</code>' if pod else "")
            + (f' · enforced by {render.esc(allocation.get("enforcement"))}' if allocation.get("enforcement") else "")
            + "</div>"))
        for card in allocation.get("cards") or []:
            total = card.get("memoryTotalMib") or card.get("memoryMib") or 0
            memory = card.get("memoryMib") or 0
            children.append(w.HTML(
                f'<div class="vgpu-card-title" style="color:{colour("text")}">{render.esc(render.card_title(card))}<br>'
                f'<small><code>{render.esc(card.get("uuid") or "")}</code></small></div>'))
            compute = _bar("compute", card.get("cores") or 0, 100, "compute")
            compute.tooltip = f"your share: {card.get('cores')} % of the card's compute"
            memory_bar = _bar("memory", memory, total, "memory")
            memory_bar.tooltip = f"your share: {format_mib(memory)} of the card's {format_mib(total)}"
            children += [compute, _readout(compute.tooltip), memory_bar, _readout(memory_bar.tooltip)]
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
            note = f'<div style="color:{colour("limit")}">⚠ {render.esc(self.answer.get("message"))}</div>' \
                if self.answer.get("state") == "unreachable" else ""
            self.value = note + render.topology_svg(topology)
        else:
            self.value = (f'<div class="vgpu-empty" style="color:{colour("text")}">'
                          f'{render.esc(self.answer.get("message") or "No topology")}</div>')

    def __repr__(self) -> str:
        return render.topology_text(self.answer)


class UsageChart(_TextRepr, w.VBox):
    """Compute and memory used, each on its own chart against your share, with the numbers now
    on bars; ``live=True`` polls about once a second."""

    def __init__(self, source: Any, *, window: float = 120, interval: float = 1.0, live: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.source = source
        self.window = window
        self.interval = interval
        self.answer: dict[str, Any] = {}
        self.chart = w.HTML()
        self.utilization = _bar("compute used", 0, 100, "compute")
        self.utilization_readout = _readout("")
        self.memory = _bar("memory used", 0, 1, "memory")
        self.memory_readout = _readout("")
        self.status = w.HTML()
        self.children = (self.status, self.chart, self.utilization, self.utilization_readout, self.memory,
                         self.memory_readout)
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
        self.chart.value = render.usage_svg(history, limits, window=self.window, measured=measured(current))
        memory_limit = limits.get("memoryMib") or max(current.get("memoryUsedMib") or 0, 1)
        used_mib = current.get("memoryUsedMib") or 0
        utilization = current.get("utilizationPercent") or 0
        cores = limits.get("cores")
        with self.hold_sync():
            self.memory.max = max(memory_limit, 1e-9)
            self.memory.value = min(used_mib, self.memory.max)
            self.memory_readout.value = _readout(
                f"{format_mib(used_mib)} of your {format_mib(memory_limit)} "
                f"({render.percent(used_mib, memory_limit):.0f} %)").value
            self.utilization.value = min(utilization, 100)
            self.utilization_readout.value = _readout(
                (f"{utilization:.0f} % of the card" if measured(current) else render.not_measured())
                + (f" (your share: {cores} %)" if cores else "")).value
            state = answer.get("state")
            tone = {"live": "compute", "stale": "limit", "unreachable": "error"}.get(state or "", "muted")
            message = f" — {render.esc(answer.get('message'))}" if answer.get("message") else ""
            self.status.value = (f'<span class="vgpu-state" style="color:{colour(tone)}">● {render.esc(state)}</span>'
                                 f'<span style="color:{colour("text")}">{message}</span>')

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
                self.status.value = f'<span style="color:{colour("error")}">● error</span> {render.esc(error)}'

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
        for child in (self.chart, self.memory, self.memory_readout, self.utilization, self.utilization_readout,
                      self.status):
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
        heading = f'style="color:{colour("text")}"'
        self.children = (self.allocation, w.HTML(f"<b {heading}>Topology</b>"), self.topology,
                         w.HTML(f"<b {heading}>Usage</b>"), self.usage)

    def close(self) -> None:
        for child in self.children:
            child.close()
        super().close()

    def __repr__(self) -> str:
        return "\n\n".join(repr(v) for v in (self.allocation, self.topology, self.usage))
