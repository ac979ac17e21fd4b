"""The notebook widgets: anywidget models whose front end is the lab panel's own renderer.

The front end (``static/widget.js``, bundled from labextension/src by ``npm run build``
and shipped in the wheel) draws these traits with the panel's FactsView, so the widgets
and the panel say and draw the same. The traits are the REST-shaped answers the panel
gets from the server (docs/server-api.yaml): ``allocation``, ``topology``, ``usage``
(with its ``history``). anywidget runs on the standard ipywidgets manager (JupyterLab,
Notebook 7, VS Code, Voilà).

Each widget's ``repr`` is the plain text a frontend without widgets shows; its display's mime
bundle carries that text as text/plain and text/html beside the widget view, so a saved notebook
still reads when the widget's model is gone. A live view
polls its source in a daemon thread (cell execution is never blocked), pushes the new
samples into ``usage``, and stops when it is closed, from Python or by the frontend
closing its comm.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, ClassVar

import anywidget
from traitlets import Dict, Float, List, Unicode

from jupyter_vgpu.widgets import render

STATIC = Path(__file__).resolve().parent / "static"


def bundle(name: str) -> Path:
    """A file of the built front end; a source checkout builds it with ``npm run build``."""
    path = STATIC / name
    if not path.is_file():
        raise FileNotFoundError(f"the widgets' front end {path} is not built: run `npm install && npm run build` "
                                "in labextension/ (a wheel ships it prebuilt)")
    return path


class _FactsWidget(anywidget.AnyWidget):
    """The facts of one notebook, drawn by the panel's renderer; ``parts`` says which sections."""

    PARTS: ClassVar[tuple[str, ...]] = ("allocation", "topology", "usage")

    parts = List(Unicode()).tag(sync=True)
    allocation = Dict(allow_none=True, default_value=None).tag(sync=True)
    topology = Dict(allow_none=True, default_value=None).tag(sync=True)
    usage = Dict(allow_none=True, default_value=None).tag(sync=True)
    window = Float(120.0).tag(sync=True)  # seconds of usage on the charts

    _esm = bundle("widget.js")
    _css = bundle("widget.css")

    def __init__(self, source: Any, *, interval: float = 1.0, window: float = 120.0, **kwargs: Any) -> None:
        super().__init__(parts=list(self.PARTS), window=window, **kwargs)
        self.source = source
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._samples: dict[float, dict[str, Any]] = {}

    # --- the facts -----------------------------------------------------------------------

    def refresh_usage(self, answer: dict[str, Any] | None = None) -> None:
        """Merge the newest samples into ``usage`` (its history trimmed to the window)."""
        if answer is None:
            # after the first fetch only the last few seconds are new
            answer = self.source.usage(self.window if not self._samples else max(5.0, 3 * self.interval))
        for point in [*(answer.get("history") or []), *([answer["current"]] if answer.get("current") else [])]:
            self._samples[float(point["t"])] = {k: point[k] for k in ("t", "memoryUsedMib", "utilizationPercent")}
        if self._samples:
            newest = max(self._samples)
            for t in [t for t in self._samples if t < newest - self.window]:
                del self._samples[t]
        self.usage = {**answer, "history": [self._samples[t] for t in sorted(self._samples)]}

    # --- live usage ------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, name="vgpu-usage", daemon=True)
        self._thread.start()
        if self.comm is not None:
            self.comm.on_close(lambda _msg: self.stop())

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh_usage()
            except Exception as error:  # noqa: BLE001 - keep polling; show what went wrong
                self.usage = {**(self.usage or {}), "state": "unreachable", "message": str(error)}

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
        super().close()

    # --- plain text ---------------------------------------------------------------------------

    def __repr__(self) -> str:
        """The plain text of the parts (what a terminal shows, and the display's text/plain)."""
        texts = {"allocation": lambda: render.allocation_text(self.allocation or {}),
                 "topology": lambda: render.topology_text(self.topology or {}),
                 "usage": lambda: render.usage_text(self.usage or {})}
        return "\n\n".join(texts[part]() for part in self.parts)

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The widget view, and beside it the same facts as text/plain and text/html: what a saved
        notebook shows where the widget's model is gone (reopened without its kernel, an untrusted
        notebook, nbconvert, a viewer without widgets)."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        data, metadata = bundle
        text = repr(self)
        return {**data, "text/plain": text, "text/html": render.snapshot_html(text)}, metadata


class AllocationCard(_FactsWidget):
    """Model, node and cards of your share, with its compute and memory as bars."""

    PARTS = ("allocation",)

    def __init__(self, source: Any, answer: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(source, **kwargs)
        self.refresh(answer)

    def refresh(self, answer: dict[str, Any] | None = None) -> None:
        self.allocation = answer if answer is not None else self.source.allocation()


class TopologyView(_FactsWidget):
    """The node's GPU tree; your card highlighted, others' allocation anonymous."""

    PARTS = ("topology",)

    def __init__(self, source: Any, answer: dict[str, Any] | None = None, *,
                 allocation: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(source, **kwargs)
        self.refresh(answer, allocation)

    def refresh(self, answer: dict[str, Any] | None = None, allocation: dict[str, Any] | None = None) -> None:
        with self.hold_sync():
            self.allocation = allocation if allocation is not None else self.source.allocation()
            self.topology = answer if answer is not None else self.source.topology()


class UsageChart(_FactsWidget):
    """Memory and compute used, each on its own chart against your share; ``live=True`` pushes
    new samples about once per ``interval``."""

    PARTS = ("usage",)

    def __init__(self, source: Any, *, window: float = 120, interval: float = 1.0, live: bool = True,
                 allocation: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(source, window=window, interval=interval, **kwargs)
        with self.hold_sync():
            self.allocation = allocation if allocation is not None else source.allocation()
            self.refresh_usage()
        if live:
            self.start()

    def refresh(self, answer: dict[str, Any] | None = None) -> None:
        self.refresh_usage(answer)


class Dashboard(_FactsWidget):
    """Allocation card, topology and live usage together (what ``%vgpu`` shows)."""

    def __init__(self, source: Any, *, live: bool = True, interval: float = 1.0, window: float = 120,
                 **kwargs: Any) -> None:
        super().__init__(source, window=window, interval=interval, **kwargs)
        with self.hold_sync():
            self.allocation = source.allocation()
            self.topology = source.topology()
            self.refresh_usage()
        if live:
            self.start()
