"""The node metrics HTTP server: Prometheus text, gpu-manager compatibility and the per-pod API.

Runs in the node daemon's process on its own thread and event loop, beside the sampler
thread, with non-blocking ``start()`` / ``stop()``:

    server = MetricsServer("node-1", backend, pod_informer, TokenMinter(secret), port=5678)
    server.start()          # binds (errors raise here), starts sampling and serving
    ...
    server.stop()
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import tornado.httpserver
import tornado.netutil
import tornado.web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from jupyter_vgpu.core.contract import (
    DEFAULT_METRICS_PORT,
    DEFAULT_NAMES,
    ENFORCEMENT_BACKENDS,
    Names,
)

from .api import (
    AllocationHandler,
    ApiContext,
    HealthHandler,
    ReadyHandler,
    TopologyHandler,
    UsageHandler,
)
from .collectors import GpuManagerCollector, NodeCollector
from .sampler import PodSource, Sampler

log = logging.getLogger(__name__)


class _PrometheusHandler(tornado.web.RequestHandler):
    def initialize(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.registry))


class MetricsServer:
    def __init__(
        self,
        node_name: str,
        backend: Any,
        pods: PodSource,
        token_minter: Any,
        names: Names = DEFAULT_NAMES,
        *,
        address: str = "0.0.0.0",
        readiness: Callable[[], str | None] | None = None,
        port: int = DEFAULT_METRICS_PORT,
        period: float = 1.0,
        history_seconds: float = 900.0,
        require_token: bool = True,
        proc_root: str = "/proc",
        enforcement: str = "none",
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``backend`` is a jupyter_vgpu.gpu GPUBackend; ``pods`` anything with ``items()``
        returning pod dicts (the node daemon's pod informer); ``token_minter`` a
        vgpu_plugin.tokens.TokenMinter over the node's secret."""
        if enforcement not in ENFORCEMENT_BACKENDS:
            raise ValueError(f"enforcement {enforcement!r} is not one of {', '.join(ENFORCEMENT_BACKENDS)}")
        self.node_name = node_name
        # /readyz: None when ready, else why not (the node daemon: registered with kubelet)
        self._readiness = readiness or (lambda: None)
        self.address = address
        self._requested_port = port
        self.sampler = Sampler(node_name, backend, pods, names, period=period, history_seconds=history_seconds,
                               proc_root=proc_root, clock=clock)
        self.context = ApiContext(self.sampler, token_minter, enforcement, require_token, clock)
        if not require_token:
            log.warning("metrics API tokens are OFF: any caller can read any pod's allocation and usage")
        self.metrics_registry = CollectorRegistry(auto_describe=False)
        self.metrics_registry.register(NodeCollector(self.sampler.snapshot, clock))
        self.gpu_manager_registry = CollectorRegistry(auto_describe=False)
        self.gpu_manager_registry.register(GpuManagerCollector(self.sampler.snapshot))
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: tornado.httpserver.HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def make_app(self) -> tornado.web.Application:
        context = {"context": self.context}
        return tornado.web.Application([
            (r"/metrics", _PrometheusHandler, {"registry": self.metrics_registry}),
            (r"/metric", _PrometheusHandler, {"registry": self.gpu_manager_registry}),
            (r"/healthz", HealthHandler, context),
            (r"/api/v1/allocation", AllocationHandler, context),
            (r"/api/v1/usage", UsageHandler, context),
            (r"/api/v1/topology", TopologyHandler, context),
            (r"/readyz", ReadyHandler, {"readiness": self._readiness}),
        ])

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.address in ("", "0.0.0.0", "::") else self.address
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        """Bind (an address in use raises here), then sample and serve in background threads."""
        if self._thread is not None:
            return
        sockets = tornado.netutil.bind_sockets(self._requested_port, self.address or None)
        self.port = sockets[0].getsockname()[1]
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                self._http = tornado.httpserver.HTTPServer(self.make_app(), xheaders=False)
                self._http.add_sockets(sockets)
                self._loop = loop
            except BaseException as error:  # hand it to start()'s caller
                failure.append(error)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        self.sampler.start()
        self._thread = threading.Thread(target=serve, name=f"vgpu-metrics-http-{self.node_name}", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread = None
            self.sampler.stop()
            for sock in sockets:
                sock.close()
            raise failure[0]
        log.info("metrics server for node %s on %s", self.node_name, self.url)

    def stop(self, timeout: float = 10.0) -> None:
        loop, http = self._loop, self._http
        if loop is not None and http is not None and self._thread is not None:
            async def shutdown() -> None:
                http.stop()
                await http.close_all_connections()
                loop.stop()

            asyncio.run_coroutine_threadsafe(shutdown(), loop)
            self._thread.join(timeout)
        self._thread = self._loop = self._http = None
        self.sampler.stop(timeout)
