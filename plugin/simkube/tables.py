"""kubectl's Table format (``meta.k8s.io/v1 Table``) for pods, nodes and events.

kubectl asks for lists and objects with ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io``
and prints the server's columns (``-o wide`` adds those of priority 1). A server that answers
plain JSON gets only NAME and AGE, so this module gives the columns kube-apiserver's printers
give for real clusters (pkg/printers/internalversion), computed the same way.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_TABLE_MEDIA = ("as=table", "g=meta.k8s.io")
NONE = "<none>"


def wants_table(accept: str) -> str | None:
    """The meta.k8s.io version of the first Table media type in ``accept`` (None: plain JSON)."""
    for media in accept.split(","):
        params = {part.strip().lower() for part in media.split(";")[1:]}
        if all(p in params for p in _TABLE_MEDIA):
            for version in ("v1", "v1beta1"):
                if f"v={version}" in params:
                    return version
    return None


def human_duration(seconds: float) -> str:
    """An age as kubectl prints it (apimachinery's duration.HumanDuration)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def _since(timestamp: Any, now: datetime.datetime) -> str:
    if not isinstance(timestamp, str) or not timestamp:
        return "<unknown>"
    try:
        then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    if then.tzinfo is None:
        then = then.replace(tzinfo=datetime.timezone.utc)
    return human_duration((now - then).total_seconds())


def _column(name: str, description: str, priority: int = 0, kind: str = "string", fmt: str = "") -> dict[str, Any]:
    return {"name": name, "type": kind, "format": fmt, "description": description, "priority": priority}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# -- pods ---------------------------------------------------------------------------------------

POD_COLUMNS = [
    _column("Name", "Name must be unique within a namespace.", fmt="name"),
    _column("Ready", "The aggregate readiness state of this pod for accepting traffic."),
    _column("Status", "The aggregate status of the containers in this pod."),
    _column("Restarts", "The number of times the containers in this pod have been restarted.", kind="string"),
    _column("Age", "CreationTimestamp is the time this object was created."),
    _column("IP", "IP address allocated to the pod. Routable at least within the cluster.", 1),
    _column("Node", "NodeName is the node the pod is scheduled on.", 1),
    _column("Nominated Node", "nominatedNodeName is set when this pod preempts other pods on the node.", 1),
    _column("Readiness Gates", "If specified, all readiness gates will be evaluated for pod readiness.", 1),
]


def _pod_status(pod: Mapping[str, Any]) -> str:
    """The STATUS kubectl shows: the phase, refined by container states and deletion (printPod)."""
    status = _dict(pod.get("status"))
    reason = str(status.get("reason") or status.get("phase") or "Pending")
    running = False
    for container in reversed(_list(status.get("containerStatuses"))):
        state = _dict(_dict(container).get("state"))
        waiting, terminated = _dict(state.get("waiting")), _dict(state.get("terminated"))
        if waiting.get("reason"):
            reason = str(waiting["reason"])
        elif terminated.get("reason"):
            reason = str(terminated["reason"])
        elif terminated:
            reason = f"Signal:{terminated['signal']}" if terminated.get("signal") \
                else f"ExitCode:{terminated.get('exitCode', 0)}"
        elif "running" in state and _dict(container).get("ready"):
            running = True
    if reason == "Completed" and running:
        reason = "Running"
    if _dict(pod.get("metadata")).get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    return reason


def pod_row(pod: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    spec, status = _dict(pod.get("spec")), _dict(pod.get("status"))
    statuses = [_dict(c) for c in _list(status.get("containerStatuses"))]
    ready = sum(1 for c in statuses if c.get("ready"))
    restarts = sum(int(c.get("restartCount") or 0) for c in statuses)
    gates = _list(spec.get("readinessGates"))
    if gates:
        conditions = {c.get("type"): c.get("status") for c in map(_dict, _list(status.get("conditions")))}
        passed = sum(1 for g in map(_dict, gates) if conditions.get(g.get("conditionType")) == "True")
        readiness = f"{passed}/{len(gates)}"
    else:
        readiness = NONE
    metadata = _dict(pod.get("metadata"))
    return [metadata.get("name", ""), f"{ready}/{len(_list(spec.get('containers')))}", _pod_status(pod),
            str(restarts), _since(metadata.get("creationTimestamp"), now), status.get("podIP") or NONE,
            spec.get("nodeName") or NONE, status.get("nominatedNodeName") or NONE, readiness]


# -- nodes --------------------------------------------------------------------------------------

NODE_COLUMNS = [
    _column("Name", "Name must be unique within a namespace.", fmt="name"),
    _column("Status", "The status of the node"),
    _column("Roles", "The roles of the node"),
    _column("Age", "CreationTimestamp is the time this object was created."),
    _column("Version", "Kubelet Version reported by the node."),
    _column("Internal-IP", "List of addresses reachable to the node.", 1),
    _column("External-IP", "List of addresses reachable to the node.", 1),
    _column("OS-Image", "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).", 1),
    _column("Kernel-Version", "Kernel Version reported by the node from 'uname -r'.", 1),
    _column("Container-Runtime", "Container runtime version reported by the node.", 1),
]
_ROLE_PREFIX = "node-role.kubernetes.io/"


def node_row(node: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    metadata, spec, status = _dict(node.get("metadata")), _dict(node.get("spec")), _dict(node.get("status"))
    ready = {c.get("type"): c.get("status") for c in map(_dict, _list(status.get("conditions")))}.get("Ready")
    state = {"True": "Ready", None: "Unknown"}.get(ready, "NotReady")
    if spec.get("unschedulable"):
        state += ",SchedulingDisabled"
    labels = _dict(metadata.get("labels"))
    roles = sorted({key[len(_ROLE_PREFIX):] for key in labels if key.startswith(_ROLE_PREFIX) and key != _ROLE_PREFIX}
                   | ({str(labels["kubernetes.io/role"])} if labels.get("kubernetes.io/role") else set()))
    addresses = [_dict(a) for a in _list(status.get("addresses"))]

    def address(kind: str) -> str:
        return next((str(a["address"]) for a in addresses if a.get("type") == kind and a.get("address")), NONE)

    info = _dict(status.get("nodeInfo"))
    return [metadata.get("name", ""), state, ",".join(roles) or NONE, _since(metadata.get("creationTimestamp"), now),
            info.get("kubeletVersion", ""), address("InternalIP"), address("ExternalIP"),
            info.get("osImage") or "<unknown>", info.get("kernelVersion") or "<unknown>",
            info.get("containerRuntimeVersion") or "<unknown>"]


# -- events -------------------------------------------------------------------------------------

EVENT_COLUMNS = [
    _column("Last Seen", "The time at which the most recent occurrence of this event was recorded."),
    _column("Type", "Type of this event (Normal, Warning), new types could be added in the future"),
    _column("Reason", "This should be a short, machine understandable string that gives the reason for the "
                      "transition into the object's current status."),
    _column("Object", "The object that this event is about."),
    _column("Subobject", "The field of the object that this event is about.", 1),
    _column("Source", "The component reporting this event.", 1),
    _column("Message", "A human-readable description of the status of this operation."),
    _column("First Seen", "The time at which the event was first recorded.", 1),
    _column("Count", "The number of times this event has occurred.", 1),
    _column("Name", "Name must be unique within a namespace.", 1, fmt="name"),
]


def event_row(event: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    involved, source = _dict(event.get("involvedObject")), _dict(event.get("source"))
    first = event.get("firstTimestamp") or event.get("eventTime")
    last = event.get("lastTimestamp") or event.get("eventTime") or first
    count = int(event.get("count") or 1) if str(event.get("count") or 1).isdecimal() else 1
    last_seen = _since(last, now)
    if count > 1:
        last_seen = f"{last_seen} (x{count} over {_since(first, now)})"
    origin = ", ".join(str(part) for part in (source.get("component"), source.get("host")) if part) \
        or str(event.get("reportingComponent") or "")
    return [last_seen, event.get("type", ""), event.get("reason", ""),
            f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}", involved.get("fieldPath", ""),
            origin, str(event.get("message", "")).strip(), _since(first, now), count,
            _dict(event.get("metadata")).get("name", "")]


_PRINTERS: dict[tuple[str, str], tuple[list[dict[str, Any]], Callable[[Mapping[str, Any], datetime.datetime], list[Any]]]] = {
    ("", "pods"): (POD_COLUMNS, pod_row),
    ("", "nodes"): (NODE_COLUMNS, node_row),
    ("", "events"): (EVENT_COLUMNS, event_row),
}


def printable(group: str, plural: str) -> bool:
    return (group, plural) in _PRINTERS


def table(group: str, plural: str, objects: Sequence[Mapping[str, Any]], version: str, resource_version: str,
          include: str | None, now: datetime.datetime | None = None) -> dict[str, Any]:
    """The Table kube-apiserver answers for ``objects``; ``include`` is the includeObject parameter
    (None/"" and "Metadata": each row carries the object's metadata; "Object": the whole object)."""
    columns, row = _PRINTERS[(group, plural)]
    now = now or datetime.datetime.now(datetime.timezone.utc)
    api_version = f"meta.k8s.io/{version}"
    rows = []
    for obj in objects:
        entry: dict[str, Any] = {"cells": row(obj, now)}
        if include == "Object":
            entry["object"] = dict(obj)
        elif include != "None":
            entry["object"] = {"kind": "PartialObjectMetadata", "apiVersion": api_version,
                               "metadata": dict(_dict(obj.get("metadata")))}
        rows.append(entry)
    return {"kind": "Table", "apiVersion": api_version, "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": columns, "rows": rows}
