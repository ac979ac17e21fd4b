"""The object store behind the simulated Kubernetes API: the API server's semantics, no HTTP.

One cluster-wide ``resourceVersion`` counter; every write bumps it, stamps the object
and appends exactly one watch event to a bounded history, so a watch can resume
from any version still in the history and gets 410 Gone for older ones.
Objects are never mutated after they are stored (each write stores a new dict), so
history entries and list results can be handed out without copying under a lock.
The store is synchronous and single-threaded: the emulator calls it from its event
loop only.
"""

from __future__ import annotations

import base64
import builtins
import collections
import copy
import datetime
import itertools
import json
import re
import secrets
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from .patch import PatchError, apply_patch


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: tuple[str, ...] = ()
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def singular(self) -> str:
        return self.kind.lower()


_CORE = [
    ResourceType("", "v1", "pods", "Pod", True, ("status", "binding", "log"), ("po",)),
    ResourceType("", "v1", "bindings", "Binding", True, (), (), ("create",)),
    ResourceType("", "v1", "nodes", "Node", False, ("status",), ("no",)),
    ResourceType("", "v1", "namespaces", "Namespace", False, ("status",), ("ns",),
                 ("create", "delete", "get", "list", "patch", "update", "watch")),
    ResourceType("", "v1", "configmaps", "ConfigMap", True, (), ("cm",)),
    ResourceType("", "v1", "secrets", "Secret", True),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True, (), ("sa",)),
    ResourceType("", "v1", "services", "Service", True, ("status",), ("svc",)),
    ResourceType("", "v1", "endpoints", "Endpoints", True, (), ("ep",)),
    ResourceType("", "v1", "events", "Event", True, (), ("ev",)),
    ResourceType("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, ("status",), ("pvc",)),
    ResourceType("", "v1", "persistentvolumes", "PersistentVolume", False, ("status",), ("pv",)),
]
_GROUPS = [
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True),
    ResourceType("events.k8s.io", "v1", "events", "Event", True, (), ("ev",)),
    ResourceType("apps", "v1", "deployments", "Deployment", True, ("status", "scale"), ("deploy",)),
    ResourceType("apps", "v1", "daemonsets", "DaemonSet", True, ("status",), ("ds",)),
    ResourceType("apps", "v1", "statefulsets", "StatefulSet", True, ("status", "scale"), ("sts",)),
    ResourceType("apps", "v1", "replicasets", "ReplicaSet", True, ("status", "scale"), ("rs",)),
    ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    ResourceType("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, (), ("pc",)),
    ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("status",), ("pdb",)),
    ResourceType("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False),
]
RESOURCE_TYPES: tuple[ResourceType, ...] = tuple(_CORE + _GROUPS)
_BY_PATH = {(rt.group, rt.version, rt.plural): rt for rt in RESOURCE_TYPES}


def resource_type(group: str, version: str, plural: str) -> ResourceType | None:
    return _BY_PATH.get((group, version, plural))


class ApiError(Exception):
    """An API failure, rendered as a ``Status`` object with ``code``."""

    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, dict(details or {})

    def status(self) -> dict[str, Any]:
        return status_object(self.code, self.reason, self.message, self.details)


def status_object(code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Success" if code < 400 else "Failure",
                            "message": message, "reason": reason, "code": code}
    if details:
        body["details"] = dict(details)
    return body


def _not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.plural} "{name}" not found',
                    {"name": name, "group": rt.group, "kind": rt.plural})


def _conflict(rt: ResourceType, name: str, why: str, plural: str | None = None) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {plural or rt.plural} "{name}": {why}',
                    {"name": name, "group": rt.group, "kind": rt.plural})


def _uid_precondition_failed(rt: ResourceType, name: str, given: str, stored: str) -> ApiError:
    return _conflict(rt, name, f"Precondition failed: UID in precondition: {given}, UID in object meta: {stored}")


def _invalid(rt: ResourceType, name: str, why: str) -> ApiError:
    return ApiError(422, "Invalid", f'{rt.kind} "{name}" is invalid: {why}',
                    {"name": name, "group": rt.group, "kind": rt.kind})


def _immutable(rt: ResourceType, name: str, path: str, value: Any) -> ApiError:
    """422 as ``ValidateImmutableField`` words it, the field named in ``details.causes`` too."""
    body = f"Invalid value: {json.dumps(value)}: field is immutable"
    error = _invalid(rt, name, f"{path}: {body}")
    error.details["causes"] = [{"reason": "FieldValueInvalid", "message": body, "field": path}]
    return error


_STALE = "the object has been modified; please apply your changes to the latest version and try again"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?\Z")
_POD_MUTABLE_SPEC = ("activeDeadlineSeconds", "tolerations", "schedulingGates")
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class WatchEvent:
    rv: int
    group: str
    plural: str
    type: str  # ADDED / MODIFIED / DELETED
    obj: dict[str, Any]
    old: dict[str, Any] | None  # the previous state, to turn selector transitions into ADDED/DELETED


Key = tuple[str, str, str, str]  # group, plural, namespace ("" when cluster-scoped), name


@dataclass
class Store:
    history: int = 5000  # watch events kept for resumption; older versions get 410 Gone
    objects: dict[Key, dict[str, Any]] = field(default_factory=dict)
    rv: int = 0
    events: collections.deque[WatchEvent] = field(init=False)
    # called with each change as it is committed (watches decide whether it wakes them)
    listeners: list[Callable[[WatchEvent | None], None]] = field(default_factory=list)
    _service_ips: int = 0
    # each kind's objects, and its keys in list order (rebuilt only after a key came or went):
    # a list reads its own kind in order, not all objects sorted again (100,000 pods beside 5,000 nodes)
    _kinds: dict[tuple[str, str], dict[Key, dict[str, Any]]] = field(default_factory=dict, init=False, repr=False)
    _ordered: dict[tuple[str, str], builtins.list[Key]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.events = collections.deque(maxlen=self.history)
        for name in DEFAULT_NAMESPACES:
            self.create(_BY_PATH[("", "v1", "namespaces")], None, {"metadata": {"name": name}})

    # -- reading -------------------------------------------------------------------

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self.objects.get(self._key(rt, namespace, name))
        if obj is None:
            raise _not_found(rt, name)
        return obj

    def list(self, rt: ResourceType, namespace: str | None,
             predicate: Callable[[Mapping[str, Any]], bool] = lambda _: True) -> list[dict[str, Any]]:
        kind = (rt.group, rt.plural)
        objects = self._kinds.get(kind, {})
        keys = self._ordered.get(kind)
        if keys is None:
            keys = self._ordered[kind] = sorted(objects)  # (namespace, name) order within the kind
        items = []
        for key in keys:
            if namespace is None or key[2] == namespace:
                obj = objects[key]
                if predicate(obj):
                    items.append(obj)
        return items

    def oldest_resumable(self) -> int:
        """The smallest resourceVersion a watch can resume from."""
        return self.events[0].rv - 1 if self.events else self.rv

    def events_after(self, rv: int) -> list[WatchEvent]:
        if rv < self.oldest_resumable():
            raise ApiError(410, "Expired", f"too old resource version: {rv} ({self.oldest_resumable()})")
        if not self.events or rv >= self.events[-1].rv:
            return []
        start = max(0, rv - self.events[0].rv + 1)
        # the tail only, walked from the right: a watch wakes on every change, and copying the
        # whole history (5,000 events) each time cost every watch of a storm that much per event
        tail = list(itertools.islice(reversed(self.events), len(self.events) - start))
        tail.reverse()
        return tail

    def compact(self) -> int:
        """Forget the watch history, as etcd compaction does; returns the compacted version."""
        self.events.clear()
        return self.rv

    # -- writing -------------------------------------------------------------------

    def create(self, rt: ResourceType, namespace: str | None, body: Any) -> dict[str, Any]:
        obj = self._check_body(rt, namespace, body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{secrets.token_hex(3)[:5]}"
        name = meta.get("name") or ""
        if not name:
            raise _invalid(rt, "", "metadata.name: Required value: name or generateName is required")
        if not _NAME.match(name) or len(name) > 253:
            raise _invalid(rt, name, f"metadata.name: Invalid value: {name!r}: must be a lowercase RFC 1123 subdomain")
        key = self._key(rt, namespace, name)
        if key in self.objects:
            raise ApiError(409, "AlreadyExists", f'{rt.plural} "{name}" already exists',
                           {"name": name, "group": rt.group, "kind": rt.plural})
        if rt.namespaced:
            self._require_namespace(namespace or "")
        for stale in ("resourceVersion", "uid", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(stale, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        self._defaults(rt, obj)
        return self._commit(rt, key, "ADDED", obj, None)

    def replace(self, rt: ResourceType, namespace: str | None, name: str, body: Any,
                subresource: str | None = None) -> dict[str, Any]:
        old = self.get(rt, namespace, name)
        new = self._check_body(rt, namespace, body)
        new_meta = new.setdefault("metadata", {})
        if new_meta.get("name", name) != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        uid = old["metadata"]["uid"]
        if new_meta.get("uid") not in (None, "", uid):
            # a PUT body's UID is a storage precondition (rest.DefaultUpdatedObjectInfo), checked before anything else
            raise _uid_precondition_failed(rt, name, new_meta["uid"], uid)
        expected = new_meta.get("resourceVersion")
        if expected not in (None, "") and expected != old["metadata"]["resourceVersion"]:
            raise _conflict(rt, name, _STALE)
        return self._update(rt, old, new, subresource)

    def patch(self, rt: ResourceType, namespace: str | None, name: str, patch: Any, content_type: str,
              subresource: str | None = None) -> dict[str, Any]:
        old = self.get(rt, namespace, name)
        try:
            new = apply_patch(old, patch, content_type)
        except PatchError as error:
            if "content type" in str(error):
                raise ApiError(415, "UnsupportedMediaType", str(error)) from None
            raise ApiError(422, "Invalid", str(error)) from None
        if not isinstance(new, dict):
            raise ApiError(422, "Invalid", "the patch must produce an object")
        expected = (patch.get("metadata") or {}).get("resourceVersion") if isinstance(patch, dict) else None
        if expected not in (None, "") and expected != old["metadata"]["resourceVersion"]:
            raise _conflict(rt, name, _STALE)
        return self._update(rt, old, new, subresource)

    def delete(self, rt: ResourceType, namespace: str | None, name: str,
               options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        old = self.get(rt, namespace, name)
        preconditions = (options or {}).get("preconditions") or {}
        if preconditions.get("uid") and preconditions["uid"] != old["metadata"]["uid"]:
            raise _uid_precondition_failed(rt, name, preconditions["uid"], old["metadata"]["uid"])
        if preconditions.get("resourceVersion") and preconditions["resourceVersion"] != old["metadata"]["resourceVersion"]:
            raise _conflict(rt, name, _STALE)
        if old["metadata"].get("finalizers"):
            if old["metadata"].get("deletionTimestamp"):
                return old
            new = copy.deepcopy(old)
            new["metadata"]["deletionTimestamp"] = _now()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            return self._commit(rt, self._key(rt, namespace, name), "MODIFIED", new, old)
        if rt.plural == "namespaces":
            for key in [k for k in self.objects if k[2] == name and k[1] != "namespaces"]:
                inner = next(t for t in RESOURCE_TYPES if (t.group, t.plural) == key[:2])
                self._remove(inner, key)
        return self._remove(rt, self._key(rt, namespace, name))

    def bind(self, namespace: str, name: str, binding: Any) -> dict[str, Any]:
        """``pods/binding``: set spec.nodeName once, copy the binding's annotations onto the pod."""
        pods = _BY_PATH[("", "v1", "pods")]
        if not isinstance(binding, dict) or not isinstance(binding.get("target"), dict) \
                or not binding["target"].get("name"):
            raise ApiError(400, "BadRequest", "a Binding needs target.name (the node)")
        meta = binding.get("metadata") or {}
        if meta.get("name") not in (None, name):
            raise ApiError(400, "BadRequest", "the binding's metadata.name does not match the pod")
        pod = self.get(pods, namespace, name)
        if meta.get("uid") and meta["uid"] != pod["metadata"]["uid"]:
            raise _conflict(pods, name, "the pod's UID does not match the binding", "pods/binding")
        if pod["metadata"].get("deletionTimestamp"):
            raise _conflict(pods, name, "pod is being deleted, cannot be assigned to a host", "pods/binding")
        if pod["spec"].get("nodeName"):
            raise _conflict(pods, name, f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"',
                            "pods/binding")
        # a new dict for each part that changes; the rest is shared with the stored pod, which
        # nothing mutates (module docstring): a deep copy of every container was most of a bind
        new = {**pod, "metadata": dict(pod["metadata"]), "spec": dict(pod["spec"]),
               "status": dict(pod.get("status") or {})}
        new["spec"]["nodeName"] = binding["target"]["name"]
        if meta.get("annotations"):
            new["metadata"]["annotations"] = {**(new["metadata"].get("annotations") or {}), **meta["annotations"]}
        conditions = [c for c in new["status"].get("conditions", []) if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": _now(),
                           "lastProbeTime": None})
        new["status"]["conditions"] = conditions
        self._commit(pods, self._key(pods, namespace, name), "MODIFIED", new, pod)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    # -- internals -----------------------------------------------------------------

    def _key(self, rt: ResourceType, namespace: str | None, name: str) -> Key:
        return (rt.group, rt.plural, (namespace or "") if rt.namespaced else "", name)

    def _require_namespace(self, namespace: str) -> None:
        if ("", "namespaces", "", namespace) not in self.objects:
            raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found',
                           {"name": namespace, "kind": "namespaces"})

    def _check_body(self, rt: ResourceType, namespace: str | None, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", f"the request body must be a JSON {rt.kind} object")
        obj = copy.deepcopy(body)
        if obj.get("kind") not in (None, "", rt.kind):
            raise ApiError(400, "BadRequest", f"the body is a {obj['kind']}, not a {rt.kind}")
        obj["kind"], obj["apiVersion"] = rt.kind, rt.api_version
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        if rt.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise ApiError(400, "BadRequest", "the namespace of the provided object does not match "
                                                  "the namespace sent on the request")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        for label_map in ("labels", "annotations"):
            values = meta.get(label_map)
            if values is not None and (not isinstance(values, dict)
                                       or not all(isinstance(v, str) for v in values.values())):
                raise _invalid(rt, meta.get("name", ""), f"metadata.{label_map}: values must be strings")
        if rt.plural == "pods":
            containers = (obj.get("spec") or {}).get("containers")
            if not isinstance(containers, list) or not containers \
                    or not all(isinstance(c, dict) and c.get("name") for c in containers):
                raise _invalid(rt, meta.get("name", ""), "spec.containers: Required value (each with a name)")
        return obj

    def _defaults(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        if rt.plural == "pods":
            spec = obj["spec"]
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("serviceAccountName", "default")
            obj["status"] = {"phase": "Pending", "qosClass": _qos_class(spec)}
        elif rt.plural == "namespaces":
            obj["status"] = {"phase": "Active"}
        elif rt.plural == "services":
            spec = obj.setdefault("spec", {})
            spec.setdefault("type", "ClusterIP")
            if spec.get("clusterIP") is None:
                self._service_ips += 1
                spec["clusterIP"] = f"10.96.{self._service_ips // 250}.{self._service_ips % 250 + 1}"
            spec.setdefault("clusterIPs", [spec["clusterIP"]])
        elif rt.plural == "secrets":
            _fold_string_data(obj)
            obj.setdefault("type", "Opaque")

    def _update(self, rt: ResourceType, old: dict[str, Any], new: dict[str, Any],
                subresource: str | None) -> dict[str, Any]:
        name = old["metadata"]["name"]
        new["kind"], new["apiVersion"] = rt.kind, rt.api_version
        given = new.get("metadata")
        uid = given.get("uid") if isinstance(given, dict) else None
        if uid not in (None, "", old["metadata"]["uid"]):
            # a pod deleted and created again under its name is another object: a write that names
            # the old one's UID (kubelet's status patches do) is refused, also through /status
            # (rest.BeforeUpdate -> ValidateObjectMetaUpdate); an empty one means the stored one
            raise _immutable(rt, name, "metadata.uid", uid)
        if subresource == "status":
            # Only the status changes through /status; the rest stays as it was.
            merged = copy.deepcopy(old)
            merged["status"] = new.get("status", {})
            new = merged
        elif subresource is not None:
            raise ApiError(405, "MethodNotAllowed", f"{rt.plural}/{subresource} cannot be updated this way")
        else:
            if rt.has_status:  # the main resource ignores status changes
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            if rt.plural == "pods":
                self._check_pod_update(rt, name, old["spec"], new.get("spec") or {})
            if rt.plural == "secrets":
                _fold_string_data(new)
        meta = new.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        for keep in ("name", "namespace", "uid", "creationTimestamp", "generation"):
            if keep in old["metadata"]:
                meta[keep] = old["metadata"][keep]
            else:
                meta.pop(keep, None)
        if old["metadata"].get("deletionTimestamp"):
            meta["deletionTimestamp"] = old["metadata"]["deletionTimestamp"]
        meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        self._check_body(rt, old["metadata"].get("namespace"), new)
        if new.get("spec") != old.get("spec"):
            meta["generation"] = old["metadata"].get("generation", 1) + 1
        if new == old:
            return old  # a no-op write changes nothing, not even the resourceVersion
        key = self._key(rt, meta.get("namespace"), name)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self.objects[key] = new  # the last finalizer is gone: finish the deletion
            return self._remove(rt, key)
        return self._commit(rt, key, "MODIFIED", new, old)

    def _check_pod_update(self, rt: ResourceType, name: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        def frozen(spec: Mapping[str, Any]) -> dict[str, Any]:
            spec = copy.deepcopy(dict(spec))
            for key in _POD_MUTABLE_SPEC:
                spec.pop(key, None)
            for group in ("containers", "initContainers"):
                for container in spec.get(group) or []:
                    container.pop("image", None)
            return spec

        if frozen(old) != frozen(new):
            raise _invalid(rt, name, "spec: Forbidden: pod updates may not change fields other than "
                                     "`spec.containers[*].image`, `spec.initContainers[*].image`, "
                                     "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions "
                                     "to existing tolerations) or `spec.schedulingGates`")

    def _remove(self, rt: ResourceType, key: Key) -> dict[str, Any]:
        old = self.objects.pop(key)
        self._kinds[key[:2]].pop(key, None)
        self._ordered.pop(key[:2], None)
        gone = copy.deepcopy(old)
        return self._commit(rt, key, "DELETED", gone, old, store=False)

    def _commit(self, rt: ResourceType, key: Key, kind: str, obj: dict[str, Any],
                old: dict[str, Any] | None, store: bool = True) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        if store:
            self.objects[key] = obj
            of_kind = self._kinds.setdefault(key[:2], {})
            if key not in of_kind:
                self._ordered.pop(key[:2], None)
            of_kind[key] = obj
        event = WatchEvent(self.rv, rt.group, rt.plural, kind, obj, old)
        self.events.append(event)
        for listener in list(self.listeners):
            listener(event)
        return obj


_QOS_RESOURCES = ("cpu", "memory")  # extended resources (vcuda-core, ...) never change a pod's QoS class
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(m|k|Ki|Mi|Gi|Ti|Pi|Ei|M|G|T|P|E|[eE][+-]?[0-9]+)?\Z")
_SUFFIX = {"m": Decimal("0.001"), "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9,
           "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
           "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
           "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60}


def _quantity(value: Any) -> Decimal:
    """A resource quantity's value ("500m" == "0.5", "1Gi" == "1073741824"); 0 when unreadable."""
    match = _QUANTITY.match(str(value).strip())
    if not match:
        return Decimal(0)
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:
        return Decimal(0)
    suffix = match.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return number.scaleb(int(suffix[1:]))
    return number * _SUFFIX.get(suffix, Decimal(1))


def _qos_class(spec: Mapping[str, Any]) -> str:
    """status.qosClass as Kubernetes computes it (GetPodQOS): only cpu and memory count, zero
    quantities count as unset, and requests default to limits."""
    requests: dict[str, Decimal] = {}
    limits: dict[str, Decimal] = {}
    guaranteed = True
    for container in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        own_limits = {k: _quantity(v) for k, v in (resources.get("limits") or {}).items() if k in _QOS_RESOURCES}
        own_requests = {k: _quantity(v) for k, v in (resources.get("requests") or {}).items() if k in _QOS_RESOURCES}
        own_requests = {**own_limits, **own_requests}  # the API server defaults requests to limits
        for name, value in own_requests.items():
            if value > 0:
                requests[name] = requests.get(name, Decimal(0)) + value
        found = set()
        for name, value in own_limits.items():
            if value > 0:
                found.add(name)
                limits[name] = limits.get(name, Decimal(0)) + value
        if found != set(_QOS_RESOURCES):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and requests == limits:
        return "Guaranteed"
    return "Burstable"


def _fold_string_data(secret: dict[str, Any]) -> None:
    string_data = secret.pop("stringData", None)
    if isinstance(string_data, dict):
        data = secret.setdefault("data", {})
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()

