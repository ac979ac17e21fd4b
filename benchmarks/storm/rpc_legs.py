"""Where a kubelet stand-in's Allocate and GetPreferredAllocation spend their time: each call split into
its request leg (the client's call to the plugin's handler starting), the handler, and its response
leg (the handler's end to the client's call returning).

Two modes:

- ``--fresh``: one client and one device plugin server alone in this process, with a trivial
  servicer, the same messages as in the storm (``--ids`` available IDs in GetPreferredAllocation),
  back to back or, with ``--gap S``, after S seconds of idleness each;
- otherwise it runs profile_storm.py (every argument is passed through) with the legs recorded in
  every node process (``--node-processes N`` is needed), printed per node process before it stops.

In a node process the legs are matched by method name: the client's start is the last call of that
method in the process, so they hold where calls of one method do not overlap (a trickle, not the
full storm). The handlers are wrapped in the running servers' method tables, as the servicer's bound
methods were captured when each server started.

Usage:
    python benchmarks/storm/rpc_legs.py --fresh [--gap 0.25]
    python benchmarks/storm/rpc_legs.py --api-process --control-plane-process --node-processes 2 \\
        --pods 30 --spread 15 --only gpu --rounds 1
"""

from __future__ import annotations

import collections
import gc
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

METHODS = ("Allocate", "GetPreferredAllocation")

_lock = threading.Lock()
_client_start: dict[str, float] = {}
_handler_end: dict[str, float] = {}
_legs: dict[str, list[float]] = collections.defaultdict(list)


def _note(label: str, seconds: float) -> None:
    with _lock:
        _legs[label].append(seconds)


def _timed_handler(method: str, handler: Callable[..., Any]) -> Callable[..., Any]:
    def timed(request: Any, context: Any) -> Any:
        started = time.perf_counter()
        with _lock:
            client = _client_start.get(method)
        if client is not None and client <= started:
            _note(f"{method}: request leg", started - client)
        try:
            return handler(request, context)
        finally:
            ended = time.perf_counter()
            _note(f"{method}: handler", ended - started)
            with _lock:
                _handler_end[method] = ended

    return timed


def install() -> int:
    """Wrap the DevicePlugin handlers of every running server and every unary client call in this
    process; the number of handlers wrapped."""
    from grpc import _channel, _server

    wrapped = 0
    for state in [o for o in gc.get_objects() if isinstance(o, _server._ServerState)]:
        for key, handler in list(state.registered_method_handlers.items()):
            method = key.rsplit("/", 1)[-1]
            if key.startswith("/v1beta1.DevicePlugin/") and method in METHODS:
                state.registered_method_handlers[key] = handler._replace(
                    unary_unary=_timed_handler(method, handler.unary_unary))
                wrapped += 1
    call = _channel._UnaryUnaryMultiCallable.__call__

    def timed_call(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        method = (self._method.decode() if isinstance(self._method, bytes) else str(self._method)).rsplit("/", 1)[-1]
        if method not in METHODS:
            return call(self, request, *args, **kwargs)
        started = time.perf_counter()
        with _lock:
            _client_start[method] = started
        try:
            return call(self, request, *args, **kwargs)
        finally:
            ended = time.perf_counter()
            _note(f"{method}: client call", ended - started)
            with _lock:
                handler_end = _handler_end.get(method)
            if handler_end is not None and started <= handler_end <= ended:
                _note(f"{method}: response leg", ended - handler_end)

    _channel._UnaryUnaryMultiCallable.__call__ = timed_call  # type: ignore[method-assign]
    return wrapped


def summary() -> dict[str, tuple[int, float, float]]:
    """label -> (calls, mean ms, median ms)."""
    with _lock:
        legs = {label: sorted(values) for label, values in _legs.items() if values}
    return {label: (len(v), round(sum(v) / len(v) * 1000, 2), round(v[len(v) // 2] * 1000, 2))
            for label, v in sorted(legs.items())}


def fresh(calls: int, ids: int, gap: float) -> dict[str, tuple[int, float, float]]:
    """One client and one server alone in this process; ``gap`` seconds of idleness before each pair of calls
    (the storm's trickle admits a pod every 0.5 s; back to back, every thread involved is still awake)."""
    import grpc
    from vgpu_plugin.deviceplugin import api_pb2, api_pb2_grpc

    class Trivial(api_pb2_grpc.DevicePluginServicer):
        def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
            return api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)

        def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
            return api_pb2.PreferredAllocationResponse(container_responses=[
                api_pb2.ContainerPreferredAllocationResponse(deviceIDs=list(c.available_deviceIDs)[:c.allocation_size])
                for c in request.container_requests])

        def Allocate(self, request: Any, context: Any) -> Any:
            return api_pb2.AllocateResponse(container_responses=[
                api_pb2.ContainerAllocateResponse(envs={"VGPU": "1"}) for _ in request.container_requests])

    with tempfile.TemporaryDirectory(dir="/tmp") as directory:
        target = "unix://" + os.path.join(directory, "plugin.sock")
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        api_pb2_grpc.add_DevicePluginServicer_to_server(Trivial(), server)
        server.add_insecure_port(target)
        server.start()
        install()
        with grpc.insecure_channel(target) as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            available = [f"gpu{i // 160}-mem-{i % 160:04d}" for i in range(ids)]
            stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10)  # connected first, as the stand-in is
            for _ in range(calls):
                time.sleep(gap)
                stub.GetPreferredAllocation(api_pb2.PreferredAllocationRequest(container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=8)]),
                    timeout=10)
                stub.Allocate(api_pb2.AllocateRequest(container_requests=[
                    api_pb2.ContainerAllocateRequest(devices_ids=available[:8])]), timeout=10)
        server.stop(0)
    return summary()


def main() -> None:
    if "--fresh" in sys.argv[1:]:
        ids = int(sys.argv[sys.argv.index("--ids") + 1]) if "--ids" in sys.argv else 1280
        gap = float(sys.argv[sys.argv.index("--gap") + 1]) if "--gap" in sys.argv else 0.0
        print(json.dumps(fresh(60 if gap else 300, ids, gap), indent=1))
        return
    import bench_storm
    import profile_storm
    import rpc_legs  # by its module name, not __main__, so the node processes find the functions

    storm = bench_storm.main

    def with_legs(started: Any = None, stopping: Any = None) -> None:
        def start(cluster: Any) -> None:
            for host in cluster.node_hosts:
                host.call(rpc_legs.install)
            if started is not None:
                started(cluster)

        def stop(cluster: Any) -> None:
            for host in cluster.node_hosts:
                print(f"rpc legs in {host.name} (calls, mean ms, median ms):", json.dumps(host.call(rpc_legs.summary), indent=1))
            if stopping is not None:
                stopping(cluster)

        storm(started=start, stopping=stop)

    bench_storm.main = with_legs
    profile_storm.main()


if __name__ == "__main__":
    main()
