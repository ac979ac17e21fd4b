"""The notebook's vGPU as widgets (anywidget, drawn by the lab panel's renderer): allocation card, topology, live usage, dashboard."""

from __future__ import annotations

from typing import Any

__all__ = ["AllocationCard", "Dashboard", "TopologyView", "UsageChart"]


def __getattr__(name: str) -> Any:  # lazy: importing the package does not import ipywidgets
    if name in __all__:
        from jupyter_vgpu.widgets import views

        return getattr(views, name)
    raise AttributeError(name)
