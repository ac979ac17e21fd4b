"""The jupyter-server extension: ``{base_url}vgpu/api/...`` (docs/server-api.yaml) over one FactSource."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Float, Int

from jupyter_vgpu.requesters.tracker import RequestTracker
from jupyter_vgpu.settings import SettingsAliases, VGPUSettings
from jupyter_vgpu.sources.base import FactSource, NoVGPUSource


class VGPUExtension(SettingsAliases, ExtensionApp):
    """Shows the notebook's vGPU share, topology and live usage, and asks for new shares.

    Where the facts come from and how shares are requested: ``c.VGPUSettings`` (shared with
    the kernel's ``%vgpu``).
    """

    name = "jupyter_vgpu"
    load_other_extensions = True
    classes = [VGPUSettings]

    history_seconds = Int(300, config=True, help="Usage history returned by GET usage when ?history= is absent.")
    stream_interval = Float(1.0, config=True, help="Seconds between usage/stream messages.")

    def initialize_settings(self) -> None:
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="vgpu-facts")
        self.vgpu_settings: VGPUSettings = self.make_vgpu_settings()
        try:
            self.facts: FactSource = self.vgpu_settings.make_source()
        except ValueError as error:  # a bad setting: say so where the user looks, keep serving
            self.log.error("jupyter-vgpu: %s", error)
            self.facts = NoVGPUSource(f"jupyter-vgpu is misconfigured: {error}.")
        self.vgpu_settings.pass_on_to_kernels()
        self.tracker: RequestTracker = self.vgpu_settings.make_tracker()
        self._stream_task: asyncio.Task[None] | None = None
        self.stream_subscribers: set[Any] = set()
        self.log.info("jupyter-vgpu: facts from %s, share requests via %s", self.facts.name,
                      getattr(self.tracker.requester, "name", "nothing"))

    def initialize_handlers(self) -> None:
        from jupyter_vgpu.server import reclaim
        from jupyter_vgpu.server.handlers import routes

        self.handlers.extend(routes() + reclaim.routes())

    async def call(self, method: str, *args: Any) -> dict[str, Any]:
        """Run a FactSource method off the event loop."""
        return await self.off_loop(getattr(self.facts, method), *args)  # type: ignore[no-any-return]

    async def off_loop(self, function: Any, *args: Any) -> Any:
        """Anything that may block (HTTP to a peer, NVML) runs in the extension's thread pool."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    # --- usage stream: one poller however many sockets ------------------------------------

    def subscribe(self, socket: Any) -> None:
        self.stream_subscribers.add(socket)
        if self._stream_task is None or self._stream_task.done():
            self._stream_task = asyncio.ensure_future(self._stream())

    def unsubscribe(self, socket: Any) -> None:
        self.stream_subscribers.discard(socket)

    async def _stream(self) -> None:
        while self.stream_subscribers:
            try:
                usage = await self.call("usage", 0)
            except Exception as error:  # noqa: BLE001 - a broken source must not end the stream
                usage = {"state": "unreachable", "message": str(error), "current": None, "limits": None}
            message = {key: usage.get(key) for key in ("state", "source", "message", "current", "limits")}
            for socket in list(self.stream_subscribers):
                socket.send(message)
            await asyncio.sleep(self.stream_interval)

    async def stop_extension(self) -> None:
        if self._stream_task is not None:
            self._stream_task.cancel()
        self.facts.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
