"""What the API server says about this node: the daemon's pod, the inventory annotation,
the registered resources, and whether vgpu-scheduler's kube-scheduler suits the API server."""

from __future__ import annotations

from typing import Any

from ..extender.version_skew import (
    judge,
    server_version,
)
from .report import FAIL, OK, WARN, Finding
from .setup import NodeSetup

NODE_APP = "app.kubernetes.io/name=vgpu-node"
SCHEDULER_APP = "app.kubernetes.io/name=vgpu-scheduler"
NO_API = "no Kubernetes API to ask (pass --kubeconfig, or run in the vgpu-node pod)"



def api_errors() -> tuple[type[BaseException], ...]:
    """What the official client raises when the API answers badly or not at all."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    return ApiException, urllib3.exceptions.HTTPError, OSError


def node_pods(setup: NodeSetup) -> list[Any]:
    """Every pod bound to this node (V1Pod objects), read once per run; [] without a node name."""
    if not setup.node:
        return []
    if "node_pods" not in setup.facts:
        from kubernetes import client

        listed = client.CoreV1Api(setup.api).list_pod_for_all_namespaces(field_selector=f"spec.nodeName={setup.node}")
        setup.facts["node_pods"] = list(listed.items or [])
    return setup.facts["node_pods"]


def daemon_pod(setup: NodeSetup) -> Any:
    """The vgpu-node pod on this node, or None."""
    for pod in node_pods(setup):
        labels = pod.metadata.labels or {}
        if pod.metadata.namespace == setup.namespace and labels.get("app.kubernetes.io/name") == "vgpu-node":
            return pod
    return None


def vgpu_pods(setup: NodeSetup) -> list[Any]:
    """Pods on this node with a container asking for a vGPU."""
    found = []
    for pod in node_pods(setup):
        for container in pod.spec.containers or []:
            limits = (container.resources.limits if container.resources else None) or {}
            if set(limits) & set(setup.names.resources):
                found.append(pod)
                break
    return found


def check_node_annotation(setup: NodeSetup) -> Finding:
    if setup.api is None or not setup.node:
        return Finding("node-annotation", WARN, "skipped: " + (NO_API if setup.api is None else "no --node"),
                       "run with --kubeconfig and --node (or in the vgpu-node pod)")
    from kubernetes import client

    from jupyter_vgpu.core.inventory import NodeInventory

    try:
        node = client.CoreV1Api(setup.api).read_node(setup.node)
    except api_errors() as error:
        if getattr(error, "status", None) == 404:
            return Finding("node-annotation", FAIL, f"no Node {setup.node!r} in the cluster",
                           "pass this node's Kubernetes name with --node (kubectl get nodes)")
        return Finding("node-annotation", WARN, f"cannot read Node {setup.node}: {_reason(error)}",
                       "check the API server address and the RBAC")
    key = setup.names.node_inventory
    text = (node.metadata.annotations or {}).get(key)
    if text is None:
        return Finding("node-annotation", FAIL, f"Node {setup.node} has no {key} annotation",
                       "the node daemon publishes it at start: check `kubectl -n vgpu-system get pods -o wide` "
                       "and the node's label vgpu.jupyter.org/node=true")
    try:
        inventory = NodeInventory.from_json(text)
    except ValueError as error:
        return Finding("node-annotation", FAIL, f"{key} is malformed: {error}", "restart the node daemon's pod")
    if inventory.problem:
        return Finding("node-annotation", FAIL, f"the node daemon reports: {inventory.problem}",
                       "fix what the driver and runtime checks above say, then restart the node daemon's pod")
    allocatable = (node.status.allocatable if node.status else None) or {}
    core = allocatable.get(setup.names.core_resource)
    if not core or core == "0":
        return Finding("node-annotation", WARN,
                       f"{len(inventory.cards)} card(s) published, but kubelet offers no {setup.names.core_resource}",
                       "the device plugin has not registered with kubelet: see the kubelet checks and the daemon's log")
    return Finding("node-annotation", OK, f"{len(inventory.cards)} card(s) published (driver {inventory.driver}); "
                                          f"kubelet offers {core} {setup.names.core_resource}")


# what NVIDIA's device plugin registers (GKE's uses nvidia.com/gpu too): nvidia.com/gpu, its
# time-slicing rename (nvidia.com/gpu.shared) and, with the mixed MIG strategy, nvidia.com/mig-<profile>
NVIDIA_RESOURCE = "nvidia.com/gpu"
_NVIDIA_RESOURCE_PREFIXES = ("nvidia.com/gpu.", "nvidia.com/mig-")
RIVAL_PLUGIN_REMEDY = (
    "turn the other device plugin off on vGPU nodes: with the GPU Operator, set devicePlugin.enabled=false in "
    "its ClusterPolicy / Helm values (every node), or label this node nvidia.com/gpu.deploy.device-plugin=false "
    "(this node only: the operator keeps that value, but its validator's plugin check then fails here); on GKE "
    "Standard, create the node pool with the node label gke-no-default-nvidia-gpu-device-plugin=true; a plugin "
    "you installed yourself: keep its DaemonSet off nodes labelled vgpu.jupyter.org/node=true (docs/admin.md, "
    "section 7)")


def _nvidia_resources(status: Any) -> dict[str, str]:
    """NVIDIA's plugin's resources in a NodeStatus with a count other than 0, capacity or allocatable."""
    found: dict[str, str] = {}
    for table in (getattr(status, "capacity", None) or {}, getattr(status, "allocatable", None) or {}):
        for name, value in table.items():
            if (name == NVIDIA_RESOURCE or name.startswith(_NVIDIA_RESOURCE_PREFIXES)) and str(value) != "0":
                found.setdefault(name, str(value))
    return found


def check_nvidia_plugin(setup: NodeSetup) -> list[Finding]:
    """Another device plugin on the same cards (NVIDIA's from the GPU Operator, GKE's managed one):
    kubelet would hand a card to an nvidia.com/gpu pod and to vGPU shares at once."""
    if setup.api is None or not setup.node:
        return []  # node-annotation already says the cluster checks were skipped
    from kubernetes import client

    try:
        node = client.CoreV1Api(setup.api).read_node(setup.node)
    except api_errors() as error:
        if getattr(error, "status", None) == 404:
            return []  # node-annotation reports the wrong name
        return [Finding("nvidia-plugin", WARN, f"cannot read Node {setup.node}: {_reason(error)}",
                        "check the API server address and the RBAC")]
    rivals = _nvidia_resources(node.status)
    if not rivals:
        return [Finding("nvidia-plugin", OK, f"no {NVIDIA_RESOURCE} on Node {setup.node}: only this device "
                                             "plugin hands out its cards")]
    allocatable = (node.status.allocatable if node.status else None) or {}
    ours = allocatable.get(setup.names.core_resource)
    beside = f" next to {ours} {setup.names.core_resource}" if ours and ours != "0" else ""
    listed = ", ".join(f"{name}: {value}" for name, value in sorted(rivals.items()))
    return [Finding("nvidia-plugin", FAIL,
                    f"Node {setup.node} advertises {listed}{beside}: another device plugin (NVIDIA's, GKE's) "
                    "serves the same cards, so a pod asking for a whole GPU can get one that vGPU shares use",
                    RIVAL_PLUGIN_REMEDY)]


def judge_scheduler(server: str | None, image: str | None) -> Finding:
    """The extender's verdict on the paired kube-scheduler (``version_skew.judge``), as a finding."""
    verdict = judge(server, image)
    return Finding("scheduler-version", verdict.level, verdict.message, verdict.remedy)


def check_scheduler_version(setup: NodeSetup) -> Finding:
    """Every vgpu-scheduler pod's kube-scheduler image against the API server's /version."""
    if setup.api is None:
        return Finding("scheduler-version", WARN, "skipped: " + NO_API, "run with --kubeconfig")
    from kubernetes import client

    try:
        pods = client.CoreV1Api(setup.api).list_namespaced_pod(setup.namespace, label_selector=SCHEDULER_APP).items
        server = server_version(setup.api)
    except api_errors() as error:
        return Finding("scheduler-version", WARN, f"cannot read the scheduler's pod or /version: {_reason(error)}",
                       "check the API server address and the RBAC")
    images = sorted({c.image for p in pods for c in p.spec.containers or [] if c.name == "kube-scheduler"})
    if not images:
        return Finding("scheduler-version", FAIL, f"no vgpu-scheduler pod in {setup.namespace}",
                       "deploy it: kubectl apply -k <your overlay> (docs/admin.md, 'Your overlay')")
    findings = [judge_scheduler(server, image) for image in images]
    return next(f for level in (FAIL, WARN, OK) for f in findings if f.status == level)


def check_vgpu_contract(setup: NodeSetup) -> list[Finding]:
    """The runtime class of vGPU pods: they need what the daemon needs."""
    if setup.api is None or not setup.node:
        return []
    try:
        daemon = daemon_pod(setup)
        pods = vgpu_pods(setup)
    except api_errors() as error:
        return [Finding("notebook-runtime", WARN, f"cannot list the pods on {setup.node}: {_reason(error)}",
                        "check the API server address and the RBAC")]
    wanted = setup.runtime_class or (daemon.spec.runtime_class_name if daemon is not None else None)
    if not wanted or not pods:
        return []
    without = [f"{p.metadata.namespace}/{p.metadata.name}" for p in pods if p.spec.runtime_class_name != wanted]
    if without:
        return [Finding("notebook-runtime", WARN,
                        f"the node daemon runs with RuntimeClass {wanted} but vGPU pod(s) {', '.join(without[:5])} "
                        "do not: they get the vGPU environment but no GPU",
                        f"set c.VGPUHub.runtime_class_name = {wanted!r} in the Hub (deploy/z2jh/values.yaml)")]
    return [Finding("notebook-runtime", OK, f"{len(pods)} vGPU pod(s) run with RuntimeClass {wanted}")]


def pod_names_by_uid(setup: NodeSetup) -> dict[str, str]:
    """uid -> namespace/name of this node's pods; {} when the API cannot say."""
    if setup.api is None:
        return {}
    try:
        return {p.metadata.uid: f"{p.metadata.namespace}/{p.metadata.name}" for p in node_pods(setup)}
    except api_errors():
        return {}


def _reason(error: BaseException) -> str:
    reason = getattr(error, "reason", None)
    return f"{getattr(error, 'status', '')} {reason}".strip() if isinstance(reason, str) else str(error)

