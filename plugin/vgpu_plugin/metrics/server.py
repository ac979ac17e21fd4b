"""The node metrics HTTP server: the per-pod API, Prometheus text and gpu-manager compatibility.

Two listeners, one per audience:

- the node API port (5678, a hostPort: notebooks reach it at their node's IP): ``/healthz``
  and the per-pod JSON API, where each caller sees only its own container (read token);
- the scrape port (5679, not on the host): ``/metrics`` and ``/metric``, which name every
  tenant on the node, for Prometheus only (bearer scrape token, see scrape.py).

Both run in the node daemon's process on one thread and event loop, beside the sampler
thread, with non-blocking ``start()`` / ``stop()``:

    server = MetricsServer("node-1", backend, pod_informer, TokenMinter(secret), port=5678,
                           scrape_port=5679, scrape_token_file="/var/run/secrets/.../token")
    server.start()          # binds both (errors raise here), starts sampling and serving
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
from .flags import DEFAULT_SCRAPE_PORT
from .podusage import PodUsageHandler
from .sampler import PodSource, Sampler
from .scrape import PrometheusHandler, ScrapeAuth

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4096
"""Request body limit on both ports: every endpoint is a GET; a bigger body is refused with 400 as
its headers arrive (Content-Length) or as its chunks pass the limit, never buffered."""
MAX_BUFFER_BYTES = 1 << 20
"""Read buffer per connection: room for tornado's 64 KiB header limit and a body chunk."""


def _local_url(address: str, port: int | None) -> str:
    host = "127.0.0.1" if address in ("", "0.0.0.0", "::") else address
    return f"http://{host}:{port}"


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
        scrape_address: str | None = None,
        scrape_port: int | None = None,
        scrape_token: str | None = None,
        scrape_token_file: str | None = None,
        proc_root: str = "/proc",
        enforcement: str = "none",
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``backend`` is a jupyter_vgpu.gpu GPUBackend; ``pods`` anything with ``items()``
        returning pod dicts (the node daemon's pod informer); ``token_minter`` a
        vgpu_plugin.tokens.TokenMinter over the node's secret. ``scrape_token`` (or the file
        ``scrape_token_file`` holding it) is what Prometheus must send to the scrape port;
        ``require_token=False`` turns off both tokens, for debugging only. ``scrape_port`` None:
        5679, or a free port when ``port`` is 0 too."""
        if scrape_port is None:
            scrape_port = 0 if port == 0 else DEFAULT_SCRAPE_PORT
        if port != 0 and port == scrape_port:
            raise ValueError(f"the node API and the scrape endpoint need different ports, both are {port}")
        if enforcement not in ENFORCEMENT_BACKENDS:
            raise ValueError(f"enforcement {enforcement!r} is not one of {', '.join(ENFORCEMENT_BACKENDS)}")
        self.node_name = node_name
        # /readyz: None when ready, else why not (the node daemon: registered with kubelet)
        self._readiness = readiness or (lambda: None)
        self.address = address
        self._requested_port = port
        self.scrape_address = address if scrape_address is None else scrape_address
        self._requested_scrape_port = scrape_port
        self.scrape_auth = ScrapeAuth(scrape_token, scrape_token_file, required=require_token)
        self.sampler = Sampler(node_name, backend, pods, names, period=period, history_seconds=history_seconds,
                               proc_root=proc_root, clock=clock, monotonic=monotonic)
        self.context = ApiContext(self.sampler, token_minter, enforcement, require_token, clock)
        if not require_token:
            log.warning("metrics tokens are OFF: any caller can read any pod's allocation and usage, "
                        "and scrape every tenant's series")
        self.metrics_registry = CollectorRegistry(auto_describe=False)
        self.metrics_registry.register(NodeCollector(self.sampler.snapshot, clock))
        self.gpu_manager_registry = CollectorRegistry(auto_describe=False)
        self.gpu_manager_registry.register(GpuManagerCollector(self.sampler.snapshot))
        self.port: int | None = None
        self.scrape_port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: list[tornado.httpserver.HTTPServer] = []
        self._thread: threading.Thread | None = None

    def make_app(self) -> tornado.web.Application:
        """The node API (the hostPort): health and each caller's own container, nothing else."""
        context = {"context": self.context}
        return tornado.web.Application([
            (r"/healthz", HealthHandler, context),
            (r"/api/v1/allocation", AllocationHandler, context),
            (r"/api/v1/usage", UsageHandler, context),
            (r"/api/v1/topology", TopologyHandler, context),
            (r"/readyz", ReadyHandler, {"readiness": self._readiness}),
        ])

    def make_scrape_app(self) -> tornado.web.Application:
        """The scrape port: every tenant's series and usage history, for the holder of the scrape token."""
        return tornado.web.Application([
            (r"/metrics", PrometheusHandler, {"registry": self.metrics_registry, "auth": self.scrape_auth}),
            (r"/metric", PrometheusHandler, {"registry": self.gpu_manager_registry, "auth": self.scrape_auth}),
            (r"/api/v1/pods", PodUsageHandler, {"sampler": self.sampler, "auth": self.scrape_auth,
                                                "clock": self.context.clock}),
        ])

    @property
    def url(self) -> str:
        """The node API's base URL (as seen from this host)."""
        return _local_url(self.address, self.port)

    @property
    def scrape_url(self) -> str:
        return _local_url(self.scrape_address, self.scrape_port)

    def start(self) -> None:
        """Bind both ports (an address in use raises here), then sample and serve in background threads."""
        if self._thread is not None:
            return
        sockets = tornado.netutil.bind_sockets(self._requested_port, self.address or None)
        try:
            scrape_sockets = tornado.netutil.bind_sockets(self._requested_scrape_port, self.scrape_address or None)
        except OSError:
            for sock in sockets:
                sock.close()
            raise
        self.port = sockets[0].getsockname()[1]
        self.scrape_port = scrape_sockets[0].getsockname()[1]
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                for app, socks in ((self.make_app(), sockets), (self.make_scrape_app(), scrape_sockets)):
                    # nothing on either port takes a body: refuse one before it is buffered (tornado's
                    # defaults would hold 100 MB per request in a daemon limited to 256 MiB)
                    http = tornado.httpserver.HTTPServer(app, xheaders=False, max_body_size=MAX_BODY_BYTES,
                                                         max_buffer_size=MAX_BUFFER_BYTES)
                    http.add_sockets(socks)
                    self._http.append(http)
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
            for sock in sockets + scrape_sockets:
                sock.close()
            raise failure[0]
        log.info("metrics server for node %s: node API on %s, scrape endpoint on %s (%s)", self.node_name,
                 self.url, self.scrape_url, self.scrape_auth.describe())

    def stop(self, timeout: float = 10.0) -> None:
        loop, servers = self._loop, list(self._http)
        if loop is not None and self._thread is not None:
            async def shutdown() -> None:
                for http in servers:
                    http.stop()
                for http in servers:
                    await http.close_all_connections()
                loop.stop()

            asyncio.run_coroutine_threadsafe(shutdown(), loop)
            self._thread.join(timeout)
        self._thread = self._loop = None
        self._http = []
        self.sampler.stop(timeout)
