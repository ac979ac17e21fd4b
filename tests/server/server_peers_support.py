"""Small real HTTP peers for the server tests: a node API and a gpu-manager /metric.

They serve the documented shapes (docs/internals.md "Node metrics server") on
127.0.0.1 and check the bearer token as the real node API does.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import tornado.httpserver
import tornado.netutil
import tornado.web

TOKEN = "read-token-for-pod-1"

ALLOCATION = {
    "node": "gpu-node-1", "namespace": "jupyter", "pod": "jupyter-alice", "podUid": "uid-1",
    "container": "notebook", "cores": 25, "memoryMib": 4096, "enforcement": "hami-core",
    "cards": [{"index": 2, "uuid": "GPU-2222", "model": "NVIDIA A100-SXM4-40GB", "cores": 25,
               "memoryMib": 4096, "memoryTotalMib": 40960}],
}

TOPOLOGY = {
    "node": "gpu-node-1",
    "links": [["X", "NV4", "SYS"], ["NV4", "X", "SYS"], ["SYS", "SYS", "X"]],
    "tree": {"level": "ROOT", "gpus": [0, 1, 2], "children": [
        {"level": "NV4", "gpus": [0, 1], "children": [
            {"level": "GPU", "gpus": [0], "children": []}, {"level": "GPU", "gpus": [1], "children": []}]},
        {"level": "GPU", "gpus": [2], "children": []}]},
    "gpus": [
        {"index": i, "uuid": f"GPU-{i}{i}{i}{i}", "model": "NVIDIA A100-SXM4-40GB", "memoryMib": 40960,
         "numa": 0, "healthy": True, "mine": i == 2, "allocatedCores": [50, 0, 75][i],
         "allocatedMemoryMib": [8192, 0, 12288][i], "tenants": [2, 0, 2][i]}
        for i in range(3)
    ],
}


class NodeAPI(tornado.web.RequestHandler):
    def initialize(self, state: dict[str, Any]) -> None:
        self.state = state

    async def get(self, what: str) -> None:
        if self.state.get("delay"):
            await asyncio.sleep(self.state["delay"])
        if self.state.get("cut"):  # a peer that dies mid-answer
            stream = self.request.connection.detach()
            await stream.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"no")
            stream.close()
            return
        self.state["requests"].append((what, dict(self.request.query_arguments), self.request.headers.get("Authorization")))
        auth = self.request.headers.get("Authorization", "")
        if not auth:
            self.set_status(401)
            return self.finish({"message": "missing bearer token"})
        if auth != f"Bearer {TOKEN}":
            self.set_status(403)
            return self.finish({"message": "token does not verify"})
        if what == "allocation":
            return self.finish(ALLOCATION)
        if what == "topology":
            return self.finish(TOPOLOGY)
        history = float(self.get_query_argument("history", "0"))
        now = time.time()
        # usage that changes over time: a slow ramp within the share's limits
        points = [{"t": now - k, "memoryUsedMib": 1000 + (now - k) % 60 * 10, "utilizationPercent": (now - k) % 25}
                  for k in range(int(history), -1, -1)]
        self.finish({"stale": self.state.get("stale", False), "message": None, "periodSeconds": 1.0,
                     "limits": {"cores": 25, "memoryMib": 4096},
                     "current": dict(points[-1], cards=[{"index": 2, "memoryUsedMib": points[-1]["memoryUsedMib"],
                                                         "utilizationPercent": points[-1]["utilizationPercent"]}]),
                     "history": points[:-1] if history else []})


class Metric(tornado.web.RequestHandler):
    def initialize(self, state: dict[str, Any]) -> None:
        self.state = state

    def get(self) -> None:
        self.set_header("Content-Type", "text/plain; version=0.0.4")
        self.finish(self.state["metric_text"])


def serve(state: dict[str, Any]) -> tuple[tornado.httpserver.HTTPServer, str]:
    """Start the peers on the current loop; returns (server, base URL)."""
    state.setdefault("requests", [])
    app = tornado.web.Application([
        (r"/api/v1/(allocation|usage|topology)", NodeAPI, {"state": state}),
        (r"/metric", Metric, {"state": state}),
    ])
    sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
    server = tornado.httpserver.HTTPServer(app)
    server.add_sockets(sockets)
    port = sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (bound then closed)."""
    sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
    port = sockets[0].getsockname()[1]
    for s in sockets:
        s.close()
    return f"http://127.0.0.1:{port}"


def as_json(response: Any) -> Any:
    return json.loads(response.body.decode())
