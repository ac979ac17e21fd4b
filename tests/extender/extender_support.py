"""Extender test helpers: nodes and pods as the API holds them, an extender on a real port.

``Cluster`` is the simulated API (``kube``) plus a started ``Extender`` watching it;
``post(url, body)`` sends raw bytes or JSON the way kube-scheduler does (POST,
Content-Type application/json) and returns (status, decoded JSON). ``mixes`` draws FGD's
typical-pod mixes for the fgd-filter properties.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import strategies as st
from simkube.waiting import wait_for

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.fragment import Mix, Shape
from jupyter_vgpu.core.inventory import Card, NodeInventory
from jupyter_vgpu.core.topology import parse_nvidia_smi_topo

NAMES = contract.DEFAULT_NAMES
GIB_UNITS = 1024 // contract.MEMORY_UNIT_MIB  # vcuda-memory units per GiB


def inventory(name: str, count: int = 4, memory_gib: int = 16, topology_text: str | None = None,
              unhealthy: tuple[int, ...] = ()) -> NodeInventory:
    topology = parse_nvidia_smi_topo(topology_text) if topology_text else None
    if topology is not None:
        count = topology.count
    cards = tuple(Card(index=i, uuid=f"GPU-{name}-{i}", model="Sim A100", memory_mib=memory_gib * 1024,
                       minor=i, healthy=i not in unhealthy) for i in range(count))
    return NodeInventory(node=name, cards=cards, topology=topology)


def node(name: str, count: int = 4, memory_gib: int = 16, *, annotate: bool = True,
         topology_text: str | None = None, unhealthy: tuple[int, ...] = (), cpu: str = "64",
         memory: str = "512Gi", pods: str = "110") -> dict[str, Any]:
    """A Node as the device plugin leaves it: inventory annotation and vGPU capacity."""
    inv = inventory(name, count, memory_gib, topology_text, unhealthy)
    healthy = [c for c in inv.cards if c.healthy]
    resources = {"cpu": cpu, "memory": memory, "pods": pods,
                 NAMES.core_resource: str(100 * len(healthy)),
                 NAMES.memory_resource: str(sum(c.memory_units for c in healthy))}
    annotations = {NAMES.node_inventory: inv.to_json()} if annotate else {}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}, "annotations": annotations},
            "spec": {},
            "status": {"capacity": dict(resources), "allocatable": dict(resources),
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, cores: int | None = 25, memory_units: int | None = 4 * GIB_UNITS, *,
        namespace: str = "default", containers: list[tuple[int, int]] | None = None,
        annotations: dict[str, str] | None = None, scheduler: str = contract.SCHEDULER_NAME) -> dict[str, Any]:
    """A notebook-like pod asking for a vGPU share (or several containers' worth)."""
    asks = containers if containers is not None else [(cores, memory_units)]
    specs = []
    for i, (c, m) in enumerate(asks):
        limits: dict[str, str] = {"cpu": "1", "memory": "1Gi"}
        if c:
            limits[NAMES.core_resource] = str(c)
        if m:
            limits[NAMES.memory_resource] = str(m)
        specs.append({"name": f"c{i}" if i else "notebook", "image": "jupyter/base-notebook",
                      "resources": {"limits": limits, "requests": dict(limits)}})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
            "spec": {"schedulerName": scheduler, "containers": specs},
            "status": {"phase": "Pending"}}


def mixes(pods: tuple[int, int], cpus: Sequence[int], weights: tuple[float, float]) -> st.SearchStrategy[Mix]:
    """Mixes of ``pods`` (fewest, most) typical pods, each asking one of ``cpus`` millicores, with
    or without a gpu=T4 node selector, for 1-4 whole cards or 1-99 cores of one, weighted within ``weights``."""

    @st.composite
    def mix(draw: st.DrawFn) -> Mix:
        shapes = []
        for _ in range(draw(st.integers(*pods))):
            cpu = draw(st.sampled_from(cpus))
            selector = draw(st.sampled_from([(), ("gpu=T4",)]))
            if draw(st.booleans()):
                shape = Shape(contract.CORES_PER_CARD, 0, draw(st.integers(1, 4)), cpu, 0, selector)
            else:
                shape = Shape(draw(st.integers(1, 99)), 0, 1, cpu, 0, selector)
            shapes.append((shape, draw(st.floats(*weights))))
        return Mix.of(shapes)

    return mix()


def post(url: str, body: Any, timeout: float = 30) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        payload = error.read()
        try:
            return error.code, json.loads(payload)
        except ValueError:
            return error.code, payload.decode(errors="replace")


def get(url: str, timeout: float = 30, token: str | None = None) -> tuple[int, bytes]:
    """GET, with ``Authorization: Bearer <token>`` when a token is given (the queue)."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def filter_args(pod_obj: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """ExtenderArgs as kube-scheduler sends it with nodeCacheCapable: true."""
    return {"Pod": pod_obj, "Nodes": None, "NodeNames": names}


def another_writers_claim(node_name: str, card: int, cores: int = 40,
                          memory_units: int = 4 * GIB_UNITS) -> dict[str, str]:
    """The claim annotations of a pod given ``card`` of ``node_name`` by someone other than the extender."""
    allocation = contract.PodAllocation(node_name, (contract.ContainerAllocation(
        0, "notebook", (contract.CardShare(card, f"GPU-{node_name}-{card}", cores, memory_units),)),),
        assigned_at_ns=1)
    return contract.predicate_annotations(allocation)


def bind_as_another_writer(core: Any, name: str, node_name: str, card: int) -> int:
    """Pod ``name`` (namespace default) bound by someone other than the extender: a Binding to
    ``card`` of ``node_name`` carrying ``another_writers_claim``, POSTed through the official
    client ``core``. Returns the API's status."""
    reply = core.create_namespaced_pod_binding(name, "default", {
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "namespace": "default", "annotations": another_writers_claim(node_name, card)},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node_name}}, _preload_content=False)
    return int(reply.status)


def binding_args(pod_obj: dict[str, Any], node_name: str) -> dict[str, Any]:
    meta = pod_obj["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
            "Node": node_name}


class Cluster:
    """The simulated API, the official client, and an extender watching it."""

    def __init__(self, kube: Any, policy: str = "binpack") -> None:
        import kubernetes.client

        self.kube = kube
        self.core = kubernetes.client.CoreV1Api(kube.api_client())
        self.policy = policy
        self.extender: Any = None

    def start_extender(self, **kwargs: Any) -> Any:
        from vgpu_plugin.extender.server import Extender

        self.extender = Extender(port=0, policy=self.policy, api_client=self.kube.api_client(), **kwargs)
        self.extender.start()
        assert self.extender.view.wait_synced(30), "extender did not sync"
        return self.extender

    def stop_extender(self) -> None:
        if self.extender is not None:
            self.extender.stop()
            self.extender = None

    @property
    def url(self) -> str:
        return self.extender.url

    def add_node(self, obj: dict[str, Any]) -> dict[str, Any]:
        created = self.core.api_client.sanitize_for_serialization(obj)
        self.core.create_node(created)
        return obj

    def add_pod(self, obj: dict[str, Any]) -> dict[str, Any]:
        response = self.core.create_namespaced_pod(obj["metadata"]["namespace"], obj, _preload_content=False)
        return json.loads(response.data)

    def read_pod(self, name: str, namespace: str = "default") -> dict[str, Any]:
        response = self.core.read_namespaced_pod(name, namespace, _preload_content=False)
        return json.loads(response.data)

    def list_pods(self) -> list[dict[str, Any]]:
        response = self.core.list_pod_for_all_namespaces(_preload_content=False)
        return json.loads(response.data)["items"]

    def wait_ledger(self, condition: Callable[[Any], Any], message: str = "ledger") -> Any:
        return wait_for(lambda: condition(self.extender.ledger), timeout=20, what=message)


