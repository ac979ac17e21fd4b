"""Other people's pods for the demo: shares and whole cards with simulated GPU work.

They are ordinary vGPU pods (scheduled by the extender, allocated by the device plugin);
the kubelet stand-in runs a simulated GPU process for each, following the pod's usage
pattern, so the notebook's topology view shows other cards busy — anonymously, as the
node API only ever reports counts and totals for other people's pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jupyter_vgpu.core import contract as c

from .kubelet import SIM_PATTERN_ANNOTATION

NAMESPACE = "research"
ROLE_LABEL = f"{c.PROJECT_DOMAIN}/demo-role"


@dataclass(frozen=True)
class Neighbour:
    name: str
    node: str
    cores: int
    memory: str | None  # None: whole cards with all their memory
    pattern: str  # simulated usage: "notebook", "training" or "idle"


def default_neighbours(dgx: str, pcie: str) -> tuple[Neighbour, ...]:
    """A training job on two NVLinked cards, a whole-card job, and shares beside the notebook."""
    return (
        Neighbour("trainer-2gpu", dgx, 200, None, "training"),
        Neighbour("analyst", dgx, 50, "10GiB", "notebook"),
        Neighbour("batch-inference", pcie, 100, None, "training"),
        Neighbour("student", pcie, 30, "4GiB", "notebook"),
        Neighbour("idle-reservation", pcie, 20, "2GiB", "idle"),
    )


def neighbour_pod(cluster: Any, neighbour: Neighbour) -> dict[str, Any]:
    body: dict[str, Any] = cluster.notebook_pod(
        neighbour.name, cores=neighbour.cores, memory=neighbour.memory, namespace=NAMESPACE,
        labels={ROLE_LABEL: "neighbour"}, annotations={SIM_PATTERN_ANNOTATION: neighbour.pattern})
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": neighbour.node}
    body["spec"]["containers"][0]["name"] = "work"
    return body


def start_neighbours(cluster: Any, neighbours: tuple[Neighbour, ...], timeout: float = 60.0) -> list[dict[str, Any]]:
    """Create the neighbours' namespace and pods; return the pods once they all run."""
    from kubernetes.client.exceptions import ApiException

    core = cluster.core_v1
    try:
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    except ApiException as error:
        if error.status != 409:
            raise
    for neighbour in neighbours:
        core.create_namespaced_pod(NAMESPACE, neighbour_pod(cluster, neighbour), _preload_content=False)
    return [cluster.wait_for_pod(NAMESPACE, n.name, timeout=timeout) for n in neighbours]
