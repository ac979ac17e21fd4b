"""Extender benchmark: 1,000 nodes x 8 GPUs with 20,000 running pods.

Measures, side by side in one run:
- filter and prioritize latency (p50/p99, node-cache mode, every node named) of the real
  extender and of a null extender on the same tornado stack that only parses the request
  and echoes the nodes (the HTTP + JSON floor: "null" with the json module, "null-wire" with
  the extender's reply encoder, "null-front" on the extender's own HTTP front and codec, with
  no tornado RequestHandler, as the real extender answers its verbs since the fourteenth
  step); each cycle is filter -> prioritize -> bind as kube-scheduler does it, the servers
  interleaved request by request;
- bind throughput over HTTP (bind's API calls answered in memory, so this is the
  extender's own cost), and end to end against the simulated Kubernetes API;
- ledger memory (tracemalloc) and rebuild time: from the objects alone, and end to end
  (the extender listing 1,000 nodes and 20,000 pods from the simulated API).

Each server runs in its own process (the client would otherwise share its GIL).
Usage: python benchmarks/extender/bench_extender.py [--cycles 600] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from jupyter_vgpu.core import contract, placement
from jupyter_vgpu.core.contract import CardShare, ContainerAllocation, PodAllocation, Request
from jupyter_vgpu.core.inventory import Card, NodeInventory
from jupyter_vgpu.core.topology import parse_nvidia_smi_topo
from jupyter_vgpu.data import topology_fixture

NAMES = contract.DEFAULT_NAMES
GIB = 1024 // contract.MEMORY_UNIT_MIB
CARD_GIB = 80
# request shapes: (cores, memory units) per container; 100*n = n whole cards
SHAPES = [(25, 20 * GIB), (10, 8 * GIB), (50, 40 * GIB), (100, 0), (200, 0)]
# what runs already: notebook-sized shares and 1 in 20 a whole card; 2.5 pods per card
# fill the cluster to about 70 % of its cores and 65 % of its memory
RUNNING_SHARES = [(25, 20 * GIB), (10, 8 * GIB), (50, 40 * GIB), (20, 10 * GIB), (30, 24 * GIB),
                  (10, 16 * GIB), (15, 12 * GIB), (40, 16 * GIB)]


# --- the cluster ---------------------------------------------------------------------------

def make_nodes(count: int, gpus: int) -> list[dict[str, Any]]:
    topology = parse_nvidia_smi_topo(topology_fixture("dgx-a100").read_text()) if gpus == 8 else None
    nodes = []
    for i in range(count):
        name = f"node-{i:04d}"
        cards = tuple(Card(index=g, uuid=f"GPU-{i:04d}-{g}", model="A100-SXM4-80GB", memory_mib=CARD_GIB * 1024,
                           minor=g) for g in range(gpus))
        inventory = NodeInventory(node=name, cards=cards, topology=topology)
        resources = {"cpu": "128", "memory": "2Ti", "pods": "250", NAMES.core_resource: str(100 * gpus),
                     NAMES.memory_resource: str(gpus * CARD_GIB * GIB)}
        nodes.append({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": name, "annotations": {NAMES.node_inventory: inventory.to_json()},
                                   "labels": {"kubernetes.io/hostname": name}},
                      "status": {"capacity": resources, "allocatable": resources}})
    return nodes


def pod_object(name: str, shape: tuple[int, int], *, uid: str | None = None) -> dict[str, Any]:
    cores, memory = shape
    limits = {"cpu": "2", "memory": "8Gi", NAMES.core_resource: str(cores)}
    if memory:
        limits[NAMES.memory_resource] = str(memory)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "bench", "uid": uid or f"uid-{name}", "annotations": {},
                         "labels": {"app": "notebook"}, "resourceVersion": "1"},
            "spec": {"schedulerName": contract.SCHEDULER_NAME,
                     "containers": [{"name": "notebook", "image": "jupyter/base-notebook",
                                     "resources": {"limits": limits, "requests": dict(limits)}}]},
            "status": {"phase": "Pending"}}


def make_running_pods(nodes: list[dict[str, Any]], count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` pods placed by the placement policy itself, so the cluster is a reachable state."""
    rng = random.Random(seed)
    gpus = len(NodeInventory.from_json(nodes[0]["metadata"]["annotations"][NAMES.node_inventory]).cards)
    topology = parse_nvidia_smi_topo(topology_fixture("dgx-a100").read_text()) if gpus == 8 else None
    states = {n["metadata"]["name"]: placement.NodeState(
        tuple(placement.CardState(g, CARD_GIB * GIB) for g in range(gpus)), topology) for n in nodes}
    names = list(states)
    pods = []
    for i in range(count):
        shape = (100, 0) if rng.random() < 0.05 else rng.choice(RUNNING_SHARES)
        request = Request(*shape)
        for _ in range(50):
            node_name = rng.choice(names)
            result = placement.place_pod(states[node_name], {0: request})
            if isinstance(result, placement.PodPlacement):
                break
        else:
            raise RuntimeError("the cluster is too full for the running pods")
        states[node_name] = states[node_name].apply(result)
        shares = tuple(CardShare(g, f"GPU-{node_name[5:]}-{g}", c, m) for g, c, m in result.containers[0])
        allocation = PodAllocation(node_name, (ContainerAllocation(0, "notebook", shares),), assigned_at_ns=1)
        pod = pod_object(f"running-{i:05d}", shape)
        pod["metadata"]["annotations"] = contract.predicate_annotations(allocation)
        pod["metadata"]["annotations"][NAMES.gpu_assigned] = "true"
        pod["spec"]["nodeName"] = node_name
        pod["status"]["phase"] = "Running"
        pods.append(pod)
    return pods


def build_ledger(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> Any:
    """The ledger from API objects, by the same code the watch runs (with the cyclic GC paused,
    as the informer pauses it while it applies a full list)."""
    from vgpu_plugin.extender.ledger import Holding, Ledger, node_cards, pod_holding
    from vgpu_plugin.informer import cyclic_gc_paused

    ledger = Ledger()
    with cyclic_gc_paused():
        for node in nodes:
            ledger.set_node(node["metadata"]["name"], node_cards(node, NAMES))
        for pod in pods:
            claim = pod_holding(pod, NAMES)
            if isinstance(claim, Holding):
                ledger.put(claim)
    return ledger


def feed_headroom(hosts: Any, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
    """Each node's allocatable and labels, and every running pod's requests, into a ``HostHeadroom``:
    what the deployed extender's node and pod informers give it (with ``--skip-api`` nothing else does)."""
    for node in nodes:
        hosts.on_node("ADDED", node)
    for pod in pods:
        hosts.on_pod("ADDED", pod)


# --- servers (child processes) -----------------------------------------------------------

class InMemoryPods:
    """Bind's API calls (GET, POST Binding with the annotations) answered from memory: the extender's own bind cost."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.rv = 10

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        pod = self.pods.get(name)
        if pod is None and name.startswith("pending-"):
            shape = SHAPES[int(name.split("-")[1])]
            pod = self.pods[name] = pod_object(name, shape)
        return json.loads(json.dumps(pod)) if pod is not None else None

    def patch_annotations(self, namespace: str, name: str, annotations: Any) -> dict[str, Any]:
        pod = self.pods[name]
        self.rv += 1
        pod["metadata"]["annotations"].update({k: v for k, v in annotations.items() if v is not None})
        pod["metadata"]["resourceVersion"] = str(self.rv)
        return pod

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Any = None) -> None:
        pod = self.pods[name]
        self.rv += 1
        pod["metadata"]["annotations"].update(annotations or {})
        pod["metadata"]["resourceVersion"] = str(self.rv)
        pod["spec"]["nodeName"] = node


def null_answers(decode: Callable[[bytes], Any], encode: Callable[[Any], Any]) -> dict[str, Callable[[bytes], Any]]:
    """The null extender's verbs by path: parse the request, echo the nodes, decide nothing."""
    def filter_(body: bytes) -> Any:
        return encode({"Nodes": None, "NodeNames": decode(body).get("NodeNames"), "FailedNodes": {},
                       "FailedAndUnresolvableNodes": {}, "Error": ""})

    def prioritize(body: bytes) -> Any:
        return encode([{"Host": n, "Score": 0} for n in decode(body).get("NodeNames") or []])

    def bind(body: bytes) -> Any:
        decode(body)
        return encode({"Error": ""})

    return {"/scheduler/filter": filter_, "/scheduler/prioritize": prioritize, "/scheduler/bind": bind}


async def serve_null(kind: str, port: int) -> None:
    """A null extender: "null" parses and encodes with the json module, "null-wire" encodes with the
    extender's own codec (wire.dumps), so the floor moves with it; both answer through tornado's
    RequestHandler. "null-front" answers on the extender's own HTTP front (front.PostFront) with
    its codec (orjson in, wire.dumps out): tornado's RequestHandler left out, as the real
    extender leaves it out for its verbs."""
    import asyncio

    import tornado.httpserver
    import tornado.web
    from vgpu_plugin.extender.wire import dumps

    server: tornado.httpserver.HTTPServer
    if kind == "null-front":
        import orjson
        from vgpu_plugin.extender.front import Post, PostFront

        posts = {path: Post(lambda body, answer=answer: (200, answer(body)), lambda seconds: None)
                 for path, answer in null_answers(orjson.loads, dumps).items()}
        server = tornado.httpserver.HTTPServer(PostFront(posts, tornado.web.Application([]), lambda *reply: None))
    else:
        class Verb(tornado.web.RequestHandler):
            def initialize(self, answer: Callable[[bytes], Any]) -> None:
                self.answer = answer

            def post(self) -> None:
                self.finish(self.answer(self.request.body))

        class Health(tornado.web.RequestHandler):
            def get(self) -> None:
                self.finish("ok")

        answers = null_answers(json.loads, json.dumps if kind == "null" else dumps)
        server = tornado.httpserver.HTTPServer(tornado.web.Application(
            [*((path, Verb, {"answer": answer}) for path, answer in answers.items()), ("/healthz", Health)]))
    server.listen(port, "127.0.0.1")
    print("ready", flush=True)
    await asyncio.Event().wait()


def serve(kind: str, port: int, nodes: int, gpus: int, pods: int, seed: int, policy: str = "binpack",
          headroom: bool = True) -> None:
    import asyncio

    if kind in ("null", "null-wire", "null-front"):
        asyncio.run(serve_null(kind, port))
        return

    from vgpu_plugin.extender.server import Extender

    node_objs = make_nodes(nodes, gpus)
    pod_objs = make_running_pods(node_objs, pods, seed)
    ledger = build_ledger(node_objs, pod_objs)
    extender = Extender(port=port, ledger=ledger, api=InMemoryPods(), policy=policy)
    if headroom:
        feed_headroom(extender.decisions.hosts, node_objs, pod_objs)
    extender.start()
    print("ready", extender.url, flush=True)
    threading.Event().wait()


def spawn(kind: str, args: argparse.Namespace, port: int) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind, "--port", str(port), "--nodes", str(args.nodes),
         "--gpus", str(args.gpus), "--pods", str(args.pods), "--seed", str(args.seed), "--policy", args.policy,
         *(["--no-headroom"] if args.no_headroom else [])],
        stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline() if process.stdout else ""
    if not line.startswith("ready"):
        raise RuntimeError(f"{kind} server did not start: {line!r}")
    return process


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- measurements ---------------------------------------------------------------------------

def print_cprofile(profile: Any, title: str, top: int) -> None:
    """A cProfile's ``top`` entries by cumulative and by own time, under ``title`` (paths made relative)."""
    import io
    import pstats
    for order in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(order).print_stats(top)
        text = out.getvalue()
        body = text[text.index("   ncalls"):] if "   ncalls" in text else text
        print(f"\n=== {title}, sorted by {order} ===")
        print(body.replace(os.getcwd() + "/", "").rstrip())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def nodes_to_find(total: int, percentage: int = 0) -> int:
    """How many feasible nodes kube-scheduler looks for before it stops filtering
    (numFeasibleNodesToFind, pkg/scheduler/schedule_one.go): with percentageOfNodesToScore
    unset (0) the adaptive default, 50 % minus 1 % per 125 nodes, at least 5 %, and never
    fewer than 100 nodes."""
    min_feasible, min_percentage = 100, 5
    if total < min_feasible or percentage >= 100:
        return total
    if percentage <= 0:
        percentage = max(min_percentage, 50 - total // 125)
    return min(total, max(min_feasible, total * percentage // 100))


def candidate_names(node_names: list[str], cycle: int, args: argparse.Namespace) -> list[str]:
    """The NodeNames of one filter request: every node, or, as kube-scheduler sends them with
    its default percentageOfNodesToScore, the first ``nodes_to_find`` feasible nodes from a
    start index that moves on by the number of nodes examined each cycle (every node here
    passes kube-scheduler's own filters)."""
    if args.names == "all":
        return node_names
    count = nodes_to_find(len(node_names))
    start = (cycle * count) % len(node_names)
    return (node_names[start:] + node_names[:start])[:count]


def call(connection: http.client.HTTPConnection, path: str, body: bytes) -> tuple[float, Any]:
    started = time.perf_counter()
    connection.request("POST", path, body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    elapsed = time.perf_counter() - started
    if response.status != 200:
        raise RuntimeError(f"{path}: {response.status} {data[:200]!r}")
    return elapsed, json.loads(data)


def latency(args: argparse.Namespace) -> dict[str, Any]:
    real_port, null_port = free_port(), free_port()
    started = time.perf_counter()
    wire_port = free_port()
    real = spawn("real", args, real_port)
    null = spawn("null", args, null_port)
    null_wire = spawn("null-wire", args, wire_port)
    front_port = free_port()
    null_front = spawn("null-front", args, front_port)
    kinds = ("real", "null", "null-wire", "null-front")
    setup = time.perf_counter() - started
    node_names = [f"node-{i:04d}" for i in range(args.nodes)]
    samples: dict[str, dict[str, list[float]]] = {k: {"filter": [], "prioritize": [], "bind": []}
                                                  for k in kinds}
    passed_counts: list[int] = []
    try:
        connections = {"real": http.client.HTTPConnection("127.0.0.1", real_port),
                       "null": http.client.HTTPConnection("127.0.0.1", null_port),
                       "null-wire": http.client.HTTPConnection("127.0.0.1", wire_port),
                       "null-front": http.client.HTTPConnection("127.0.0.1", front_port)}
        cpu_at_warm: dict[str, float] = {}
        servers = {"real": real, "null": null, "null-wire": null_wire, "null-front": null_front}
        for cycle in range(args.cycles + args.warmup):
            if cycle == args.warmup:  # each server's CPU time over the measured cycles: preemption is not in it
                cpu_at_warm = {kind: _cpu_seconds(process.pid) for kind, process in servers.items()}
            shape_index = cycle % len(SHAPES)
            name = f"pending-{shape_index}-{cycle}"
            pod = pod_object(name, SHAPES[shape_index])
            filter_body = json.dumps({"Pod": pod, "Nodes": None,
                                      "NodeNames": candidate_names(node_names, cycle, args)}).encode()
            order = kinds[cycle % len(kinds):] + kinds[:cycle % len(kinds)]  # each server first in turn
            for kind in order:
                conn = connections[kind]
                t_filter, result = call(conn, "/scheduler/filter", filter_body)
                passed = result["NodeNames"] or []
                if kind == "real":
                    passed_counts.append(len(passed))
                if not passed:
                    continue
                prioritize_body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": passed}).encode()
                t_prio, scores = call(conn, "/scheduler/prioritize", prioritize_body)
                best = max(scores, key=lambda s: s["Score"])["Host"]
                bind_body = json.dumps({"PodName": name, "PodNamespace": "bench", "PodUID": f"uid-{name}",
                                        "Node": best}).encode()
                t_bind, reply = call(conn, "/scheduler/bind", bind_body)
                if reply["Error"]:
                    raise RuntimeError(f"bind refused: {reply['Error']}")
                if cycle >= args.warmup:
                    samples[kind]["filter"].append(t_filter)
                    samples[kind]["prioritize"].append(t_prio)
                    samples[kind]["bind"].append(t_bind)
        cycle_cpu_ms = {kind: round((_cpu_seconds(process.pid) - cpu_at_warm[kind]) / max(1, args.cycles) * 1000, 2)
                        for kind, process in servers.items()}
        # bind throughput over HTTP, in-memory API: 8 concurrent clients, each on a keep-alive
        # connection as kube-scheduler's HTTP client keeps them
        count = args.binds
        local = threading.local()

        def one(i: int, port: int = real_port) -> None:
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = http.client.HTTPConnection("127.0.0.1", port)
            name = f"pending-1-b{i}"  # 10 cores / 8 GiB
            node = node_names[i % len(node_names)]
            call(conn, "/scheduler/bind", json.dumps({"PodName": name, "PodNamespace": "bench",
                                                       "PodUID": f"uid-{name}", "Node": node}).encode())

        started = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(count)))
        bind_rate = count / (time.perf_counter() - started)
        # the real server's process after the cycles and binds: its ledger, decision caches (and
        # fgd-filter's rows) and the objects it built them from (an extender's informers hold those)
        server_rss = _rss_mb(real.pid)
    finally:
        for process in servers.values():
            process.kill()
    result: dict[str, Any] = {"server_setup_seconds": round(setup, 1), "cycles": args.cycles,
                              "names_per_filter": len(candidate_names(node_names, 0, args)),
                              "bind_per_second_in_memory_api": round(bind_rate, 1),
                              "real_server_rss_mb_after_binds": server_rss,
                              "median_nodes_passing_filter": statistics.median(passed_counts)}
    for kind, value in cycle_cpu_ms.items():  # filter + prioritize + bind, the server's own CPU
        result[f"cycle_{kind}_cpu_ms"] = value
    for verb in ("filter", "prioritize", "bind"):
        for kind in kinds:
            values = samples[kind][verb]
            for q in (50, 90, 99):
                result[f"{verb}_{kind}_p{q}_ms"] = round(percentile(values, q) * 1000, 2)
        for q in (50, 90, 99):
            result[f"{verb}_p{q}_ratio"] = round(result[f"{verb}_real_p{q}_ms"] / result[f"{verb}_null_p{q}_ms"], 2)
            result[f"{verb}_p{q}_ratio_wire"] = round(
                result[f"{verb}_real_p{q}_ms"] / result[f"{verb}_null-wire_p{q}_ms"], 2)
            result[f"{verb}_p{q}_ratio_front"] = round(
                result[f"{verb}_real_p{q}_ms"] / result[f"{verb}_null-front_p{q}_ms"], 2)
    return result


def ledger_cost(args: argparse.Namespace) -> dict[str, Any]:
    nodes = make_nodes(args.nodes, args.gpus)
    pods = make_running_pods(nodes, args.pods, args.seed)
    gc.collect()
    started = time.perf_counter()
    build_ledger(nodes, pods)
    elapsed = time.perf_counter() - started
    gc.collect()
    tracemalloc.start()  # a second build, traced (tracing slows it several times over)
    ledger = build_ledger(nodes, pods)
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    stats = ledger.stats()
    assert stats["pods"] == args.pods and ledger.overcommitted() == []
    return {"ledger_pods": stats["pods"], "ledger_nodes": stats["nodes"],
            "rebuild_from_objects_seconds": round(elapsed, 2),
            "ledger_memory_mb": round(current / 2**20, 1), "ledger_build_peak_mb": round(peak / 2**20, 1)}


def loaded_api(args: argparse.Namespace) -> Any:
    """The simulated API, started in this process and holding the bench's nodes and running pods."""
    from simkube.apiserver import SimKubeAPI
    from simkube.store import resource_type

    nodes = make_nodes(args.nodes, args.gpus)
    pods = make_running_pods(nodes, args.pods, args.seed)
    api = SimKubeAPI().start()
    node_rt, pod_rt, ns_rt = (resource_type("", "v1", "nodes"), resource_type("", "v1", "pods"),
                              resource_type("", "v1", "namespaces"))

    def load_nodes() -> None:
        store = api.store
        try:
            store.create(ns_rt, None, {"metadata": {"name": "bench"}})
        except Exception:
            pass  # the simulated API may create namespaces on demand
        for node in nodes:
            store.create(node_rt, None, node)

    def load_pods(chunk: list[dict[str, Any]]) -> None:
        for pod in chunk:
            pod = json.loads(json.dumps(pod))
            del pod["metadata"]["uid"], pod["metadata"]["resourceVersion"]
            api.store.create(pod_rt, "bench", pod)

    api.call(load_nodes)
    for start in range(0, len(pods), 2000):  # each call on the API's loop must end within 30 s
        api.call(load_pods, pods[start:start + 2000])
    # What was loaded stays for the whole run: take it out of the cyclic GC's full collections,
    # as the extender does after its first list. Left in, the first full collection after the
    # load walks the store's ~675,000 tracked objects and stops the API's event loop for ~0.55 s
    # (measured mid-binds: README, sixth pass), a pause kube-apiserver's concurrent GC never makes.
    # The stored objects are JSON trees without reference cycles: refcounting still frees every
    # version a write replaces.
    del pods  # the templates; the store holds its own copies
    gc.collect()
    gc.freeze()
    return api


def serve_api(args: argparse.Namespace, kubeconfig: str) -> None:
    """``--serve sim-api``: the loaded simulated API alone in this process, as a real API server runs."""
    api = loaded_api(args)
    api.write_kubeconfig(kubeconfig)
    print("ready", kubeconfig, flush=True)
    threading.Event().wait()


def end_to_end(args: argparse.Namespace, api_process: str) -> dict[str, Any]:
    """The real command against the simulated API: rebuild time, memory, binds per second.

    ``jupyter-vgpu extender`` runs in its own process (so its memory is its own), lists
    the nodes and running pods through the official client, and then binds pending pods
    (chosen nodes pass its filter) with 8 concurrent clients, each on one keep-alive
    connection as kube-scheduler keeps them; each bind POSTs one Binding carrying the claim's
    annotations against the simulated API (the pod read from the extender's watch, which holds
    the pending pods; a GET first only when that copy cannot be trusted, see decisions.py). ``api_process``: the
    simulated API runs in this process, next to the 8 clients ("shared"), or alone in
    its own ("own"), as a real API server does.
    """
    import shutil
    import tempfile

    import kubernetes.client
    from vgpu_plugin import kubeclient

    workdir = tempfile.mkdtemp(prefix="bench-extender-")
    kubeconfig = os.path.join(workdir, "kubeconfig")
    api = server = process = None
    try:
        if api_process == "shared":
            api = loaded_api(args)
            api.write_kubeconfig(kubeconfig)
        else:
            server = subprocess.Popen(
                [sys.executable, __file__, "--serve", "sim-api", "--kubeconfig-out", kubeconfig,
                 "--nodes", str(args.nodes), "--gpus", str(args.gpus), "--pods", str(args.pods),
                 "--seed", str(args.seed)], stdout=subprocess.PIPE, text=True)
            line = server.stdout.readline() if server.stdout else ""
            if not line.startswith("ready"):
                raise RuntimeError(f"the simulated API did not start: {line!r}")
        port = free_port()
        started = time.perf_counter()
        process = subprocess.Popen([sys.executable, "-c", AS_INSTALLED, "extender", "--port", str(port),
                                    "--kubeconfig", kubeconfig, "--log-level", "WARNING", "--policy", args.policy],
                                   stdout=subprocess.DEVNULL)
        api_pid = os.getpid() if server is None else server.pid
        profiles = py_spy(args, f"{api_process}-rebuild", {"extender": process.pid, "api": api_pid})
        base = f"http://127.0.0.1:{port}"
        while True:
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.perf_counter() - started > 600 or process.poll() is not None:
                raise RuntimeError("the extender did not become ready")
            time.sleep(0.05)
        rebuild = time.perf_counter() - started
        profiles.stop()
        with urllib.request.urlopen(f"{base}/inspect?node=none", timeout=30) as response:
            report = json.loads(response.read())
        ledger = report["ledger"]
        assert ledger["pods"] == args.pods and ledger["nodes"] == args.nodes, ledger
        rss_mb = _rss_mb(process.pid)
        # pending pods, each sent to a node that passes the extender's filter
        core = kubernetes.client.CoreV1Api(kubeclient.load(kubeconfig))
        node_names = [f"node-{i:04d}" for i in range(args.nodes)]
        conn = http.client.HTTPConnection("127.0.0.1", port)
        targets = []
        for i in range(args.api_binds):
            body = pod_object(f"pending-api-{i}", SHAPES[i % 3])
            del body["metadata"]["uid"], body["metadata"]["resourceVersion"]
            created = json.loads(core.create_namespaced_pod("bench", body, _preload_content=False).data)
            _, result = call(conn, "/scheduler/filter", json.dumps(
                {"Pod": created, "Nodes": None, "NodeNames": node_names}).encode())
            passed = result["NodeNames"]
            targets.append((created, passed[(i * 7) % len(passed)]))

        local = threading.local()

        def bind(target: tuple[dict[str, Any], str]) -> str:
            meta, node = target[0]["metadata"], target[1]
            client = getattr(local, "conn", None)
            if client is None:
                client = local.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            _, reply = call(client, "/scheduler/bind", json.dumps(
                {"PodName": meta["name"], "PodNamespace": "bench", "PodUID": meta["uid"], "Node": node}).encode())
            return str(reply["Error"])

        profiles = py_spy(args, f"{api_process}-binds", {"extender": process.pid, "api": api_pid})
        cpu_before = _cpu_seconds(api_pid), _cpu_seconds(process.pid)
        clients_before = time.process_time()  # this process: the 8 clients (and the API when shared)
        started = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            errors = [e for e in pool.map(bind, targets) if e]
        elapsed = time.perf_counter() - started
        clients_cpu = time.process_time() - clients_before
        profiles.stop()
        rate = len(targets) / elapsed
        # CPU each process spent per bind (the API's figure includes the 8 clients when shared):
        # a process near elapsed / binds per bind is the one that sets the rate
        api_cpu, extender_cpu = (_cpu_seconds(api_pid) - cpu_before[0], _cpu_seconds(process.pid) - cpu_before[1])
        suffix = "" if api_process == "shared" else "_api_own_process"
        return {f"rebuild_from_api_seconds_incl_process_start{suffix}": round(rebuild, 2),
                f"rebuild_list_and_watch_seconds{suffix}": report["syncSeconds"],
                f"extender_rss_mb_after_sync{suffix}": rss_mb,
                f"extender_rss_mb_after_binds{suffix}": _rss_mb(process.pid),
                f"bind_per_second_sim_api{suffix}": round(rate, 1),
                f"bind_wall_ms_per_bind{suffix}": round(elapsed / len(targets) * 1000, 2),
                f"bind_api_cpu_ms_per_bind{suffix}": round(api_cpu / len(targets) * 1000, 2),
                f"bind_extender_cpu_ms_per_bind{suffix}": round(extender_cpu / len(targets) * 1000, 2),
                f"bind_clients_cpu_ms_per_bind{suffix}": round(clients_cpu / len(targets) * 1000, 2),
                f"bind_refusals_sim_api{suffix}": len(errors),
                f"bind_refusal_example{suffix}": errors[0] if errors else None}
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
        if api is not None:
            api.stop()
        if server is not None:
            server.kill()
            server.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)


# `jupyter-vgpu` as installed (the [node] extra, plugin/Dockerfile). This environment also holds
# the test dependency kubernetes-validate, which `import kubernetes` loads when it can
# (kubernetes.dynamic), building jsonschema's URI grammars with lark: 2-5 s of the extender's
# start on this machine that an installed extender never spends. Hidden here as it is absent there.
AS_INSTALLED = ("import sys; sys.modules['kubernetes_validate'] = None; "
                "from jupyter_vgpu.cli import main; sys.exit(main())")


class _Profiles:
    """py-spy recorders on some processes, stopped (and their files written) together."""

    def __init__(self, recorders: list[subprocess.Popen[bytes]]) -> None:
        self._recorders = recorders

    def stop(self) -> None:
        for recorder in self._recorders:
            recorder.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for recorder in self._recorders:
            recorder.wait(60)
        self._recorders = []


def py_spy(args: argparse.Namespace, phase: str, pids: dict[str, int]) -> _Profiles:
    """With ``--py-spy DIR``: sample each process (collapsed stacks, DIR/<phase>-<name>.txt) until stopped."""
    if not args.py_spy:
        return _Profiles([])
    os.makedirs(args.py_spy, exist_ok=True)
    return _Profiles([subprocess.Popen(
        [args.py_spy_command, "record", "--pid", str(pid), "--rate", "100", "--nonblocking", "--format", "raw",
         "--output", os.path.join(args.py_spy, f"{phase}-{name}.txt"), *(["--gil"] if args.py_spy_gil else [])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for name, pid in pids.items()])


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", choices=("real", "null", "null-wire", "null-front", "sim-api"), help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig-out", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cycles", type=int, default=600, help="filter->prioritize->bind cycles per server")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--binds", type=int, default=1000, help="binds for the in-memory-API throughput")
    parser.add_argument("--api-binds", type=int, default=300, help="binds against the simulated API")
    parser.add_argument("--names", choices=("kube-scheduler", "all"), default="kube-scheduler",
                        help="NodeNames per filter: as kube-scheduler sends them with its default "
                             "percentageOfNodesToScore (500 of 5,000 nodes; all up to 100), or every node")
    parser.add_argument("--quick", action="store_true", help="a small run to check the script works")
    parser.add_argument("--policy", default="binpack", help="the real extender's placement policy")
    parser.add_argument("--skip-api", action="store_true", help="skip the simulated-API part")
    parser.add_argument("--no-headroom", action="store_true",
                        help="the real server's nodes without known CPU headroom (with --skip-api the benchmark "
                             "otherwise feeds it the nodes' allocatable and the running pods' requests, as the "
                             "deployed extender's informers do)")
    parser.add_argument("--only-api", action="store_true",
                        help="only the simulated-API part (rebuild end to end, RSS, binds/s)")
    parser.add_argument("--api-process", choices=("own", "shared", "both"), default="both",
                        help="the simulated API alone in its own process (as a real API server runs), in the "
                             "benchmark's process next to its 8 bind clients (as before), or both, one after the other")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--py-spy", metavar="DIR",
                        help="record the extender and the simulated API with py-spy (not a dependency: install it) "
                             "during the rebuild and during the binds, as collapsed stacks in DIR")
    parser.add_argument("--py-spy-gil", action="store_true",
                        help="with --py-spy: sample only the thread holding the GIL (where the CPU goes, not the waits)")
    parser.add_argument("--py-spy-command", default=os.path.join(os.path.dirname(sys.executable), "py-spy"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve == "sim-api":
        serve_api(args, args.kubeconfig_out)
        return 0
    if args.serve:
        serve(args.serve, args.port, args.nodes, args.gpus, args.pods, args.seed, args.policy,
              headroom=not args.no_headroom)
        return 0
    if args.quick:
        args.nodes, args.pods, args.cycles, args.binds, args.api_binds = 50, 1000, 40, 50, 20
    results: dict[str, Any] = {"nodes": args.nodes, "gpus_per_node": args.gpus, "running_pods": args.pods,
                               "cpus": os.cpu_count(), "load_average_at_start": round(os.getloadavg()[0], 2)}
    if not args.only_api:
        results.update(ledger_cost(args))
        results.update(latency(args))
    if not args.skip_api:
        for api_process in ("own", "shared") if args.api_process == "both" else (args.api_process,):
            results.update(end_to_end(args, api_process))
    results["load_average_at_end"] = round(os.getloadavg()[0], 2)
    width = max(len(k) for k in results)
    for key, value in results.items():
        print(f"{key.ljust(width)}  {value}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
