"""Simulated Kubernetes API: start/stop time and request costs through the official client.

Also, side by side in one run, what authentication costs: the same emulator served as
SimKubeAPI does (TLS + bearer token) and bare (plain HTTP, no token, as before auth).

Run: .venv/bin/python benchmarks/sim/bench_kube_api.py [--pods 500] [--rounds 300]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp.web
import kubernetes.client
from kubernetes import watch
from simkube.apiserver import KubeEmulator, SimKubeAPI


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


@contextmanager
def bare_api() -> Iterator[int]:
    """The emulator on plain HTTP without the token check (the API before authentication)."""
    loop = asyncio.new_event_loop()
    started: list[tuple[KubeEmulator, aiohttp.web.ServerRunner]] = []
    port: list[int] = []
    ready = threading.Event()

    async def serve() -> None:
        emulator = KubeEmulator()
        await emulator.__aenter__()
        runner = aiohttp.web.ServerRunner(aiohttp.web.Server(emulator, access_log=None), handle_signals=False)
        await runner.setup()
        site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        started.append((emulator, runner))
        port.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        ready.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(serve(), loop)
    ready.wait(10)
    try:
        yield port[0]
    finally:
        async def stop() -> None:
            emulator, runner = started[0]
            await runner.cleanup()
            await emulator.__aexit__(None, None, None)

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def costs(core: kubernetes.client.CoreV1Api, connect, headers: dict[str, str], rounds: int) -> dict[str, float]:
    """ms per create / read on a kept-alive connection, and per new connection + GET."""
    body = {"metadata": {"name": ""}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    create = timed(lambda: [core.create_namespaced_pod("default", {**body, "metadata": {"name": f"s{i}"}})
                            for i in range(rounds)])
    read = timed(lambda: [core.read_namespaced_pod(f"s{i}", "default") for i in range(rounds)])

    def fresh() -> None:
        for _ in range(rounds):
            connection = connect()
            connection.request("GET", "/api/v1/namespaces/default/pods/s0", headers=headers)
            assert connection.getresponse().read() and connection.close() is None

    return {"create": create / rounds * 1000, "read": read / rounds * 1000,
            "new connection + read": timed(fresh) / rounds * 1000}


def side_by_side(rounds: int) -> None:
    with SimKubeAPI() as secured, bare_api() as port:
        plain = kubernetes.client.Configuration()
        plain.host = f"http://127.0.0.1:{port}"
        context = secured.ssl_context()
        results = {
            "TLS + token": costs(kubernetes.client.CoreV1Api(secured.api_client()),
                                 lambda: http.client.HTTPSConnection("127.0.0.1", secured.port, context=context),
                                 secured.auth_headers(), rounds),
            "bare HTTP": costs(kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(plain)),
                               lambda: http.client.HTTPConnection("127.0.0.1", port), {}, rounds),
        }
    print(f"side by side ({rounds} requests each, ms/request):")
    for measure in results["bare HTTP"]:
        a, b = results["TLS + token"][measure], results["bare HTTP"][measure]
        print(f"  {measure:24s} TLS + token {a:6.2f}   bare HTTP {b:6.2f}   ratio {a / b:4.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=300, help="requests per measure in the side-by-side run")
    args = parser.parse_args()

    makes, starts, stops = [], [], []
    for _ in range(args.starts):
        made = time.perf_counter()
        api = SimKubeAPI()  # makes its token, key and certificate
        makes.append(time.perf_counter() - made)
        starts.append(timed(api.start))
        stops.append(timed(api.stop))
    print(f"SimKubeAPI(): median {statistics.median(makes) * 1000:.1f} ms, max {max(makes) * 1000:.1f} ms")
    print(f"start: median {statistics.median(starts) * 1000:.1f} ms, max {max(starts) * 1000:.1f} ms "
          f"({args.starts} runs)")
    print(f"stop:  median {statistics.median(stops) * 1000:.1f} ms, max {max(stops) * 1000:.1f} ms")

    with SimKubeAPI() as api:
        core = kubernetes.client.CoreV1Api(api.api_client())
        body = {"metadata": {"name": "", "labels": {"app": "bench"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]}}
        seen = threading.Event()
        count = 0

        def consume() -> None:
            nonlocal count
            for _ in watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=120,
                                          resource_version=str(api.resource_version)):
                count += 1
                if count == args.pods:
                    seen.set()
                    return

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        time.sleep(0.2)
        create = timed(lambda: [core.create_namespaced_pod("default", {**body, "metadata": {
            **body["metadata"], "name": f"p{i}"}}) for i in range(args.pods)])
        seen.wait(120)
        patch = timed(lambda: [core.patch_namespaced_pod(f"p{i}", "default", {"metadata": {
            "annotations": {"k": "v"}}}) for i in range(args.pods)])
        lists = [timed(lambda: core.list_namespaced_pod("default", label_selector="app=bench",
                                                        _preload_content=False).data) for _ in range(10)]
        print(f"create: {create / args.pods * 1000:.2f} ms/pod ({args.pods} pods, a watch open)")
        print(f"patch:  {patch / args.pods * 1000:.2f} ms/pod (strategic merge, annotations)")
        print(f"list {args.pods} pods with a label selector (raw JSON): "
              f"median {statistics.median(lists) * 1000:.1f} ms")
        print(f"watch delivered {count} ADDED events")
    side_by_side(args.rounds)


if __name__ == "__main__":
    main()
