"""``%vgpu``: the notebook's vGPU from a cell, and the framework guard rails.

Load with ``%load_ext jupyter_vgpu`` or automatically with
``c.InteractiveShellApp.extensions = ["jupyter_vgpu"]``. Settings are traitlets on
``VGPUSettings`` (``c.VGPUSettings.source = "auto"`` ...), shared with the server extension:
facts come from the same adapters, called directly (no HTTP to the notebook server).
"""

from __future__ import annotations

import argparse
import os
import shlex
import time
from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class
from traitlets import Float

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import RequestError
from jupyter_vgpu.settings import SettingsAliases

USAGE = """\
%vgpu                      the dashboard: allocation, topology, live usage
%vgpu status               your share, its usage and which framework guard rails are in force
%vgpu topo                 the node's GPU topology with your card highlighted
%vgpu usage                memory and utilisation against your limits, now
%vgpu watch [--interval S] a live usage chart (updates in the background; close it to stop);
                           without a widget frontend, a usage line every S seconds until Ctrl-C
%vgpu request --cores N --memory SIZE
                           ask for a new share (SIZE: 4GiB, 4096MiB or units of 256 MiB);
                           your server restarts with it (JupyterHub) or your pod is re-created
%vgpu release              give the GPU back (restart without one)
%vgpu --help               this text
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise RequestError(f"{message}\n\n{USAGE}")


def _parser() -> _Parser:
    parser = _Parser(prog="%vgpu", add_help=False)
    parser.add_argument("-h", "--help", action="store_true")
    sub = parser.add_subparsers(dest="command")
    for name in ("status", "topo", "usage", "release"):
        sub.add_parser(name, add_help=False)
    watch = sub.add_parser("watch", add_help=False)
    watch.add_argument("--interval", type=float, default=None)
    watch.add_argument("--count", type=int, default=0)  # text mode: stop after N lines (0: until Ctrl-C)
    request = sub.add_parser("request", add_help=False)
    request.add_argument("--cores", required=True)
    request.add_argument("--memory", default=None)
    request.add_argument("--no-wait", action="store_true")
    return parser


@magics_class
class VGPUMagics(SettingsAliases, Magics):
    """``%vgpu``; its facts and requests come from ``c.VGPUSettings`` (shared with the server)."""

    watch_interval = Float(1.0, config=True, help="Seconds between live usage updates.")

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self.vgpu_settings = self.make_vgpu_settings()
        self._facts: Any = None
        self._tracker: Any = None
        self.rails: Any = None
        self.live: list[Any] = []

    # --- the pieces, made on first use ------------------------------------------------

    @property
    def facts(self) -> Any:
        if self._facts is None:
            self._facts = self.vgpu_settings.make_source()
        return self._facts

    @property
    def tracker(self) -> Any:
        if self._tracker is None:
            self._tracker = self.vgpu_settings.make_tracker()
        return self._tracker

    def apply_guard_rails(self) -> Any:
        from jupyter_vgpu.guards import GuardRails

        answer = self.facts.allocation()
        self.rails = GuardRails(answer.get("allocation"))
        self.rails.apply()
        return self.rails

    # --- the magic -------------------------------------------------------------------------

    @line_magic
    def vgpu(self, line: str = "") -> Any:
        try:
            args = _parser().parse_args(shlex.split(line))
        except RequestError as error:
            print(error)
            return None
        if args.help:
            print(USAGE)
            return None
        command = args.command or "dashboard"
        try:
            return getattr(self, f"_cmd_{command}")(args)
        except RequestError as error:
            print(f"vgpu: {error}")
            return None

    def _display(self, widget: Any) -> Any:
        from IPython.display import display

        display(widget)
        return None

    @property
    def widgets_shown(self) -> bool:
        """True in a kernel (a frontend may render widgets); False in terminal IPython."""
        return getattr(self.shell, "kernel", None) is not None

    def _cmd_dashboard(self, args: argparse.Namespace) -> Any:
        from jupyter_vgpu.widgets.views import Dashboard

        dashboard = Dashboard(self.facts, interval=self.watch_interval, live=self.widgets_shown)
        if self.widgets_shown:
            self.live.append(dashboard)
        return self._display(dashboard)

    def _cmd_status(self, args: argparse.Namespace) -> None:
        from jupyter_vgpu.widgets import render

        print(render.allocation_text(self.facts.allocation()))
        print()
        print(render.usage_text(self.facts.usage(0)))
        print()
        print("framework guard rails:")
        rails = self.rails if self.rails is not None else self.apply_guard_rails()
        print(rails.status_text())
        latest = self.tracker.latest()
        if latest is not None:
            print()
            print(f"last request {latest.id}: {latest.state} — {latest.message}")
        reclaim = self._reclaim_text()
        if reclaim:
            print()
            print(reclaim)

    def _reclaim_text(self) -> str | None:
        """The GPU reclaimer's warning or what it did (under a Hub running it)."""
        import os

        from jupyter_vgpu.reclaimer.client import ReclaimClient, reclaim_text

        client = ReclaimClient.from_environ(os.environ)
        return None if client is None else reclaim_text(client.state())

    def _cmd_topo(self, args: argparse.Namespace) -> Any:
        from jupyter_vgpu.widgets.views import TopologyView

        return self._display(TopologyView(self.facts))

    def _cmd_usage(self, args: argparse.Namespace) -> Any:
        from jupyter_vgpu.widgets.views import UsageChart

        return self._display(UsageChart(self.facts, live=False))

    def _cmd_watch(self, args: argparse.Namespace) -> Any:
        interval = args.interval or self.watch_interval
        if not self.widgets_shown:
            return self._watch_text(interval, args.count)
        from jupyter_vgpu.widgets.views import UsageChart

        chart = UsageChart(self.facts, live=True, interval=interval)
        self.live.append(chart)
        return self._display(chart)

    def _watch_text(self, interval: float, count: int) -> None:
        """One line per sample for frontends without widgets; Ctrl-C stops it."""
        from jupyter_vgpu.widgets import render
        from jupyter_vgpu.widgets.glossary import measured

        shown = 0
        try:
            while count <= 0 or shown < count:
                answer = self.facts.usage(0)
                current = answer.get("current") or {}
                limits = answer.get("limits") or {}
                stamp = time.strftime("%H:%M:%S", time.localtime(current.get("t") or time.time()))
                memory, limit = current.get("memoryUsedMib") or 0, limits.get("memoryMib") or 0
                print(f"{stamp} {answer.get('state'):<11} memory {render.text_bar(memory, limit, 10)} "
                      f"{contract.format_mib(memory)}"
                      + (f"/{contract.format_mib(limit)}" if limit else "")
                      + (f"  util {current.get('utilizationPercent') or 0:5.1f} %" if measured(current)
                         else f"  util {render.not_measured()}")
                      + (f"  {answer['message']}" if answer.get("message") and answer.get("state") != "live" else ""),
                      flush=True)
                shown += 1
                if count <= 0 or shown < count:
                    time.sleep(interval)
        except KeyboardInterrupt:
            print("stopped")

    def _cmd_release(self, args: argparse.Namespace) -> None:
        self._submit(0, 0, wait=True)

    def _cmd_request(self, args: argparse.Namespace) -> None:
        from jupyter_vgpu.requesters.base import parse_share

        cores, units = parse_share(args.cores, args.memory, os.environ)
        if cores == 0:
            raise RequestError("use `%vgpu release` to give the GPU back")
        self._submit(cores, units, wait=not args.no_wait)

    def _submit(self, cores: int, units: int, wait: bool) -> None:
        """Print the request's progress and outcome; the cell shows those lines and no value."""
        request = self.tracker.submit(cores, units)
        print(f"request {request.id}: {request.progress[0]}")
        if not wait:
            print("check on it with `%vgpu status`")
            return
        shown = 1
        try:
            while True:
                request = self.tracker.wait(request.id, timeout=0.5) or request
                for message in request.progress[shown:]:
                    print(f"  … {message}")
                shown = len(request.progress)
                if request.state != "pending":
                    break
        except KeyboardInterrupt:
            print("stopped waiting; the request goes on — check with `%vgpu status`")
            return
        mark = "✔" if request.state == "scheduled" else "✘"
        print(f"{mark} {request.state}: {request.message}")

    def close(self) -> None:
        for chart in self.live:
            chart.stop()
        self.live.clear()
        if self.rails is not None:
            self.rails.remove()
        if self._facts is not None:
            self._facts.close()


_loaded: dict[int, VGPUMagics] = {}


def load_ipython_extension(ipython: Any) -> None:
    magics = VGPUMagics(shell=ipython)
    ipython.register_magics(magics)
    _loaded[id(ipython)] = magics
    started = time.monotonic()
    try:
        magics.apply_guard_rails()
    except Exception as error:  # noqa: BLE001 - the magic must load even if the facts cannot be read
        print(f"jupyter-vgpu: guard rails not applied ({error}) after {time.monotonic() - started:.1f} s")


def unload_ipython_extension(ipython: Any) -> None:
    magics = _loaded.pop(id(ipython), None)
    if magics is not None:
        magics.close()
