"""The jupyter-server extension: ``{base_url}vgpu/api/...`` over one FactSource."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Enum, Float, Int, Unicode, default

from jupyter_vgpu.core import contract
from jupyter_vgpu.server.facts import (
    SOURCES,
    FactSource,
    NoVGPUSource,
    SourceSettings,
    backend_factory,
    make_source,
)
from jupyter_vgpu.server.requests import RequestTracker


class VGPUExtension(ExtensionApp):
    """Shows the notebook's vGPU share, topology and live usage, and asks for new shares."""

    name = "jupyter_vgpu"
    load_other_extensions = True

    source = Enum(
        ("auto", *SOURCES), default_value="auto", config=True,
        help="Where the GPU facts come from: 'auto' detects this project's node API (VGPU_* env), "
             "a TKEStack gpu-manager container (/etc/vcuda), local NVIDIA GPUs (NVML), or none.",
    )
    metrics_url = Unicode(
        "", config=True,
        help="Base URL of the node metrics server (default: $VGPU_METRICS_URL).",
    )
    token = Unicode(
        "", config=True,
        help="Read token for the node metrics server (default: $VGPU_TOKEN).",
    )
    gpu_manager_metric_url = Unicode(
        "", config=True,
        help="gpu-manager's Prometheus /metric URL (default: http://$HOST_IP:5678/metric).",
    )
    vcuda_config_dir = Unicode(
        contract.GM_VCUDA_CONFIG_DIR, config=True,
        help="Where gpu-manager mounts vcuda.config into the container.",
    )
    local_backend = Unicode(
        "nvml", config=True,
        help="GPU backend of the 'local-nvml' source: 'nvml', or 'simulated:<path to an "
             "`nvidia-smi topo -m` capture>' to try the views on a machine without GPUs.",
    )
    timeout = Float(5.0, config=True, help="Seconds to wait for the node metrics server or gpu-manager.")
    history_seconds = Int(300, config=True, help="Usage history returned by GET usage when ?history= is absent.")
    stream_interval = Float(1.0, config=True, help="Seconds between usage/stream messages.")
    history_limit = Int(3600, config=True, help="Usage points kept by sources whose peer keeps no history.")
    requester = Enum(
        ("auto", "jupyterhub", "kube", "none"), default_value="auto", config=True,
        help="How a share request is carried out: 'jupyterhub' restarts the server through the Hub "
             "REST API; 'kube' re-creates the notebook pod through the Kubernetes API (the simulated "
             "cluster); 'auto' picks JupyterHub when JUPYTERHUB_API_TOKEN is set, else kube when a "
             "kubeconfig is given, else none.",
    )
    kubeconfig = Unicode(
        "", config=True,
        help="kubeconfig for the 'kube' requester (default: $JUPYTER_VGPU_KUBECONFIG).",
    )
    request_timeout = Float(300.0, config=True, help="Seconds a share request may stay pending.")

    @default("kubeconfig")
    def _kubeconfig_default(self) -> str:
        return os.environ.get(contract.ENV_NOTEBOOK_KUBECONFIG, "")

    def source_settings(self) -> SourceSettings:
        return SourceSettings(
            source=self.source, metrics_url=self.metrics_url, token=self.token,
            gpu_manager_metric_url=self.gpu_manager_metric_url, vcuda_config_dir=self.vcuda_config_dir,
            timeout=self.timeout, history_limit=self.history_limit,
            backend_factory=backend_factory(self.local_backend),
        )

    def initialize_settings(self) -> None:
        from jupyter_vgpu.server.request_setup import make_tracker

        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="vgpu-facts")
        try:
            self.facts: FactSource = make_source(self.source_settings())
        except ValueError as error:  # a bad setting: say so where the user looks, keep serving
            self.log.error("jupyter-vgpu: %s", error)
            self.facts = NoVGPUSource(f"jupyter-vgpu is misconfigured: {error}.")
        if self.source != "auto":
            # kernels started by this server read the same adapter (%vgpu, widgets)
            os.environ[contract.ENV_NOTEBOOK_SOURCE] = self.source
        self.tracker: RequestTracker = make_tracker(self.requester, self.kubeconfig, self.request_timeout,
                                                    os.environ)
        self._stream_task: asyncio.Task[None] | None = None
        self.stream_subscribers: set[Any] = set()
        self.log.info("jupyter-vgpu: facts from %s, share requests via %s", self.facts.name,
                      getattr(self.tracker.requester, "name", "nothing"))

    def initialize_handlers(self) -> None:
        from jupyter_vgpu.server.handlers import routes

        self.handlers.extend(routes())

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
