"""A kube-scheduler stand-in: schedules its profiles' pods, through HTTP extenders if configured.

It does what kube-scheduler does for a profile with an HTTP extender, and speaks the
same JSON: node-level resource fit (allocatable minus the requests of the pods on the
node, for cpu, memory, pods and extended resources; unschedulable nodes; nodeSelector;
NoSchedule taints), then for pods the extender is interested in (managedResources)
``filter`` -> ``prioritize`` -> ``bind`` over HTTP, in node-cache mode or with full
Node objects as the configuration says. Failures become core/v1 ``FailedScheduling``
Events with kube-scheduler's message ("0/3 nodes are available: 1 Insufficient cpu, 2
<extender reason>.") and the pod is retried with exponential backoff; successes get a
``Scheduled`` Event. Binds run on a small pool, as kube-scheduler's binding cycles do;
Events are written by one recorder thread in the order they happen, as kube-scheduler's
event broadcaster does, so neither a scheduling nor a binding cycle waits for them.

The configuration is a real KubeSchedulerConfiguration file, checked against the
kubescheduler.config.k8s.io/v1 schema by ``load_config`` (unknown fields fail). The node
and pod caches come from the caller's informer (``informer=``, see ``ObjectCache``), the
same list+watch cache the components under test use.

Not modelled: preemption, affinity beyond nodeSelector, volume and port checks, the
default plugins' own scores (the extender's scores decide), percentageOfNodesToScore
(every feasible node goes to the extender) and tlsConfig.serverName.
"""

from __future__ import annotations

import base64
import datetime
import functools
import heapq
import http.client
import json
import logging
import os
import random
import re
import socket
import ssl
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

API_VERSION = "kubescheduler.config.k8s.io/v1"
KIND = "KubeSchedulerConfiguration"
MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10


class ConfigError(ValueError):
    """A scheduler configuration kube-scheduler would refuse; the message names the field."""


# --- the v1 schema ----------------------------------------------------------------------
# field -> type: a type, a nested dict (struct), a one-element list (list of), or a marker.

DURATION, ANY, NUMBER = "duration", "any", "number"
_PLUGIN_SET = {"enabled": [{"name": str, "weight": int}], "disabled": [{"name": str, "weight": int}]}
_EXTENSION_POINTS = ("preEnqueue", "queueSort", "preFilter", "filter", "postFilter", "preScore", "score",
                     "reserve", "permit", "preBind", "bind", "postBind", "multiPoint")
SCHEMA: dict[str, Any] = {
    "apiVersion": str,
    "kind": str,
    "parallelism": int,
    "leaderElection": {
        "leaderElect": bool, "leaseDuration": DURATION, "renewDeadline": DURATION, "retryPeriod": DURATION,
        "resourceLock": str, "resourceName": str, "resourceNamespace": str,
    },
    "clientConnection": {"kubeconfig": str, "acceptContentTypes": str, "contentType": str, "qps": NUMBER,
                         "burst": int},
    "enableProfiling": bool,
    "enableContentionProfiling": bool,
    "percentageOfNodesToScore": int,
    "podInitialBackoffSeconds": int,
    "podMaxBackoffSeconds": int,
    "profiles": [{
        "schedulerName": str,
        "percentageOfNodesToScore": int,
        "plugins": {point: _PLUGIN_SET for point in _EXTENSION_POINTS},
        "pluginConfig": [{"name": str, "args": ANY}],
    }],
    "extenders": [{
        "urlPrefix": str, "filterVerb": str, "preemptVerb": str, "prioritizeVerb": str, "weight": int,
        "bindVerb": str, "enableHTTPS": bool,
        "tlsConfig": {"insecure": bool, "serverName": str, "certFile": str, "keyFile": str, "caFile": str,
                      "certData": str, "keyData": str, "caData": str},
        "httpTimeout": DURATION, "nodeCacheCapable": bool,
        "managedResources": [{"name": str, "ignoredByScheduler": bool}],
        "ignorable": bool,
    }],
    "delayCacheUntilActive": bool,
}

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h))+\Z")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds from a Go duration ('30s', '1m30s', '500ms')."""
    if text == "0":
        return 0.0
    if not _DURATION.match(text):
        raise ValueError(f"{text!r} is not a duration (like 30s, 1m30s or 500ms)")
    return sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART.findall(text))


def _check(value: Any, schema: Any, where: str) -> None:
    if value is None:
        return  # a null field is its zero value, as in Go
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected an object")
        for key, item in value.items():
            if key not in schema:
                near = [k for k in schema if k.lower() == str(key).lower()]
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise ConfigError(f"{where}: unknown field {key!r}{hint}")
            _check(item, schema[key], f"{where}.{key}" if where else key)
    elif isinstance(schema, list):
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list")
        for i, item in enumerate(value):
            _check(item, schema[0], f"{where}[{i}]")
    elif schema is ANY:
        return
    elif schema == DURATION:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a duration string such as 30s")
        try:
            parse_duration(value)
        except ValueError as error:
            raise ConfigError(f"{where}: {error}") from None
    elif schema == NUMBER:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number")
    elif schema is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer")
    elif not isinstance(value, schema) or (schema is not bool and isinstance(value, bool)):
        raise ConfigError(f"{where}: expected {schema.__name__}")


# --- the configuration the stand-in uses --------------------------------------------------

@dataclass(frozen=True)
class ExtenderConfig:
    url_prefix: str
    filter_verb: str = ""
    prioritize_verb: str = ""
    bind_verb: str = ""
    weight: int = 0
    node_cache_capable: bool = False
    http_timeout: float = 30.0
    ignorable: bool = False
    managed_resources: Mapping[str, bool] = field(default_factory=dict)  # name -> ignoredByScheduler
    enable_https: bool = False
    tls: Mapping[str, Any] = field(default_factory=dict)  # tlsConfig as written

    def ssl_context(self) -> ssl.SSLContext | None:
        """kube-scheduler's client TLS: verify with caFile/caData (none given: insecure, as it
        does), present certFile/keyFile (or certData/keyData) when given."""
        if not (self.enable_https or self.url_prefix.startswith("https:")):
            return None
        tls = self.tls
        ca_data = base64.b64decode(tls["caData"]).decode() if tls.get("caData") else None
        if tls.get("insecure") or not (tls.get("caFile") or ca_data):
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            context = ssl.create_default_context(cafile=tls.get("caFile") or None, cadata=ca_data)
        if tls.get("certFile") or tls.get("certData"):
            cert, key = tls.get("certFile"), tls.get("keyFile")
            with tempfile.TemporaryDirectory() as scratch:
                if tls.get("certData"):
                    cert = os.path.join(scratch, "cert.pem")
                    Path(cert).write_bytes(base64.b64decode(tls["certData"]))
                if tls.get("keyData"):
                    key = os.path.join(scratch, "key.pem")
                    Path(key).write_bytes(base64.b64decode(tls["keyData"]))
                context.load_cert_chain(cert, key)
        return context

    def url(self, verb: str) -> str:
        return self.url_prefix.rstrip("/") + "/" + verb

    def interested(self, pod: Mapping[str, Any]) -> bool:
        """kube-scheduler's IsInterested: no managed resources means every pod."""
        if not self.managed_resources:
            return True
        spec = pod.get("spec") or {}
        for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
            resources = container.get("resources") or {}
            for key in ("requests", "limits"):
                if any(name in self.managed_resources for name in resources.get(key) or {}):
                    return True
        return False


@dataclass(frozen=True)
class SchedulerConfig:
    profiles: tuple[str, ...]
    extenders: tuple[ExtenderConfig, ...]
    pod_initial_backoff: float = 1.0
    pod_max_backoff: float = 10.0
    raw: Mapping[str, Any] = field(default_factory=dict)

    def with_extender_url(self, base: str) -> SchedulerConfig:
        """The same configuration with every extender's scheme://host:port replaced (keeps the path)."""
        target = urllib.parse.urlsplit(base)
        extenders = []
        for ext in self.extenders:
            parts = urllib.parse.urlsplit(ext.url_prefix)
            url = urllib.parse.urlunsplit((target.scheme, target.netloc, parts.path, "", ""))
            extenders.append(_replace(ext, url_prefix=url))
        return _replace(self, extenders=tuple(extenders))

    def ignored_resources(self) -> frozenset[str]:
        return frozenset(name for ext in self.extenders for name, ignored in ext.managed_resources.items()
                         if ignored)


def _replace(obj: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(obj, **changes)


def load_config(path: str | os.PathLike[str]) -> SchedulerConfig:
    """Read and validate a KubeSchedulerConfiguration (YAML) as kube-scheduler would."""
    import yaml

    source = Path(path)
    try:
        data = yaml.safe_load(source.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"{source}: {error}") from None
    try:
        return parse_config(data)
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from None


def parse_config(data: Any) -> SchedulerConfig:
    if not isinstance(data, dict):
        raise ConfigError("expected a KubeSchedulerConfiguration object")
    _check(data, SCHEMA, "")
    if data.get("apiVersion") != API_VERSION or data.get("kind") != KIND:
        raise ConfigError(f"apiVersion/kind must be {API_VERSION} / {KIND}, not "
                          f"{data.get('apiVersion')} / {data.get('kind')}")
    profiles = [p.get("schedulerName") or "default-scheduler" for p in data.get("profiles") or [{}]]
    if len(set(profiles)) != len(profiles):
        raise ConfigError(f"profiles: schedulerName repeats: {profiles}")
    extenders = []
    binders = 0
    for i, raw in enumerate(data.get("extenders") or []):
        where = f"extenders[{i}]"
        if not raw.get("urlPrefix"):
            raise ConfigError(f"{where}.urlPrefix is required")
        if raw.get("prioritizeVerb") and (raw.get("weight") or 0) <= 0:
            raise ConfigError(f"{where}.weight: must be positive when prioritizeVerb is set")
        binders += bool(raw.get("bindVerb"))
        managed: dict[str, bool] = {}
        for j, resource in enumerate(raw.get("managedResources") or []):
            name = resource.get("name") or ""
            if "/" not in name or name.split("/", 1)[0].endswith("kubernetes.io"):
                raise ConfigError(f"{where}.managedResources[{j}].name: {name!r} is not an extended resource name")
            if name in managed:
                raise ConfigError(f"{where}.managedResources[{j}].name: {name!r} is duplicated")
            managed[name] = bool(resource.get("ignoredByScheduler"))
        extenders.append(ExtenderConfig(
            url_prefix=raw["urlPrefix"], filter_verb=raw.get("filterVerb") or "",
            prioritize_verb=raw.get("prioritizeVerb") or "", bind_verb=raw.get("bindVerb") or "",
            weight=raw.get("weight") or 0, node_cache_capable=bool(raw.get("nodeCacheCapable")),
            http_timeout=parse_duration(raw["httpTimeout"]) if raw.get("httpTimeout") else 30.0,
            ignorable=bool(raw.get("ignorable")), managed_resources=managed,
            enable_https=bool(raw.get("enableHTTPS")), tls=dict(raw.get("tlsConfig") or {}),
        ))
    if binders > 1:
        raise ConfigError("extenders: only one extender may implement bind")
    initial = data.get("podInitialBackoffSeconds") or 1
    maximum = data.get("podMaxBackoffSeconds") or 10
    if initial <= 0 or maximum < initial:
        raise ConfigError("podInitialBackoffSeconds must be > 0 and podMaxBackoffSeconds >= it")
    return SchedulerConfig(tuple(profiles), tuple(extenders), float(initial), float(maximum), data)


# --- quantities and node-level fit ----------------------------------------------------------

_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m|u|n)?\Z")
_SUFFIX = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "m": Decimal("1e-3"), "u": Decimal("1e-6"), "n": Decimal("1e-9"),
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity(value: Any) -> Decimal:
    """A Kubernetes quantity ('500m', '4Gi', 2) as a Decimal; unreadable values count as 0."""
    if isinstance(value, bool):
        return Decimal(0)
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    return _text_quantity(str(value))


@functools.lru_cache(maxsize=1024)
def _text_quantity(text: str) -> Decimal:
    """Memoised: a scheduling cycle reads every placed pod's and every node's quantities, and a
    cluster has few distinct strings (a Decimal is immutable, so one may be shared)."""
    match = _QUANTITY.match(text.strip())
    if not match:
        return Decimal(0)
    try:
        return Decimal(match.group(1)) * Decimal(_SUFFIX[match.group(2)])
    except InvalidOperation:
        return Decimal(0)


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """Effective requests as kube-scheduler computes them: max(sum of containers, any init
    container) plus overhead; a request left out defaults to the limit, as the API server does."""

    def of(container: Mapping[str, Any]) -> dict[str, Decimal]:
        resources = container.get("resources") or {}
        requests = {k: quantity(v) for k, v in (resources.get("requests") or {}).items()}
        for name, value in (resources.get("limits") or {}).items():
            requests.setdefault(name, quantity(value))  # the API server's defaulting
        return requests

    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        for name, value in of(container).items():
            total[name] = total.get(name, Decimal(0)) + value
    for container in spec.get("initContainers") or []:
        for name, value in of(container).items():
            total[name] = max(total.get(name, Decimal(0)), value)
    for name, value in (spec.get("overhead") or {}).items():
        total[name] = total.get(name, Decimal(0)) + quantity(value)
    return total


def _tolerates(pod: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    for toleration in (pod.get("spec") or {}).get("tolerations") or []:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key, operator = toleration.get("key"), toleration.get("operator", "Equal")
        if not key and operator == "Exists":
            return True
        if key != taint.get("key"):
            continue
        if operator == "Exists" or toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def node_reasons(pod: Mapping[str, Any], node: Mapping[str, Any], used: Mapping[str, Decimal],
                 pod_count: int, ignored: frozenset[str], requests: Mapping[str, Decimal] | None = None) -> list[str]:
    """Why the pod cannot go on this node before any extender is asked (kube-scheduler's words).
    ``requests``: the pod's ``pod_requests`` when the caller has them (one cycle asks every node)."""
    spec = node.get("spec") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    if spec.get("unschedulable"):
        return ["node(s) were unschedulable"]
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return ["node(s) didn't match Pod's node affinity/selector"]
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(pod, taint):
            value = taint.get("value")
            shown = f"{taint.get('key')}: {value}" if value else str(taint.get("key"))
            return [f"node(s) had untolerated taint {{{shown}}}"]
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    reasons = []
    if pod_count + 1 > quantity(allocatable.get("pods", 110)):
        reasons.append("Too many pods")
    for name, amount in sorted((pod_requests(pod) if requests is None else requests).items()):
        if amount <= 0 or name in ignored:
            continue
        if used.get(name, Decimal(0)) + amount > quantity(allocatable.get(name, 0)):
            reasons.append(f"Insufficient {name}")
    return reasons


def fit_error(total: int, reasons: Mapping[str, list[str]]) -> str:
    """kube-scheduler's FitError message: '0/N nodes are available: <count> <reason>, ...'."""
    histogram: dict[str, int] = {}
    for node_reasons_ in reasons.values():
        for reason in node_reasons_:
            histogram[reason] = histogram.get(reason, 0) + 1
    parts = sorted(f"{count} {reason}" for reason, count in histogram.items())
    message = f"0/{total} nodes are available"
    return message + (": " + ", ".join(parts) + "." if parts else ".")


# --- the stand-in ----------------------------------------------------------------------------

class ExtenderError(Exception):
    pass


class _KeptConnections(threading.local):
    """Each thread's open connection per extender address: kube-scheduler's HTTP client keeps
    connections alive, so a filter or bind costs no TCP (or TLS) set-up on either side."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, str, float], http.client.HTTPConnection] = {}


_kept = _KeptConnections()
# what a kept connection the server has closed meanwhile raises: the request was not read
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


def _connect(ext: ExtenderConfig, parts: urllib.parse.SplitResult) -> http.client.HTTPConnection:
    if parts.scheme == "https":
        return http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=ext.http_timeout,
                                           context=ext.ssl_context())
    return http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=ext.http_timeout)


def _exchange(ext: ExtenderConfig, url: str, data: bytes) -> tuple[int, bytes]:
    """POST ``data`` on this thread's kept connection to the extender (a new one if none, or if
    the kept one turns out closed by the server); the reply's status and body."""
    parts = urllib.parse.urlsplit(url)
    key = (parts.scheme, parts.netloc, ext.http_timeout)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    while True:
        connection = _kept.open.pop(key, None)
        reused = connection is not None
        if connection is None:
            connection = _connect(ext, parts)
        try:
            connection.request("POST", target, body=data, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            payload = response.read()
        except _STALE:
            connection.close()
            if reused:
                continue  # closed while idle (an extender restart): once more on a new connection
            raise
        except BaseException:
            connection.close()
            raise
        if response.will_close:
            connection.close()
        else:
            _kept.open[key] = connection
        return response.status, payload


def _post(ext: ExtenderConfig, verb: str, body: Any) -> Any:
    url = ext.url(verb)
    data = json.dumps(body, separators=(",", ":")).encode()
    try:
        status, payload = _exchange(ext, url, data)
        if not 200 <= status < 300:
            raise ExtenderError(f"failed {url.rsplit('/', 1)[-1]} with extender at URL {url}, code {status}")
        return json.loads(payload)
    except (OSError, http.client.HTTPException, ValueError) as error:  # refused, reset, timeout, not JSON
        raise ExtenderError(f"failed {url.rsplit('/', 1)[-1]} with extender at URL {url}: {error}") from None


def _drain(response: Any) -> None:
    """Read an unparsed API reply to its end, as client-go always does: only then does the
    connection go back to the client's pool (otherwise each call opens a new TLS connection)."""
    response.data  # noqa: B018 - reading it is the point


def _field(obj: Mapping[str, Any], name: str) -> Any:
    """Go's case-insensitive struct decoding, for the extender's replies."""
    if name in obj:
        return obj[name]
    lowered = name.lower()
    for key, value in obj.items():
        if key.lower() == lowered:
            return value
    return None


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Queued:
    attempts: int = 0
    due: float = 0.0
    in_flight: bool = False


class ObjectCache(Protocol):
    """A list+watch cache of one kind of object, as the scheduler uses it.

    Made by ``informer(list_func, on_event=callback)``: ``list_func`` is an official-client
    list method, ``callback(kind, obj)`` gets ``ADDED``/``MODIFIED``/``DELETED`` with the
    object as a plain dict, and ``RELISTED`` with ``None`` after a full list.
    """

    @property
    def synced(self) -> bool: ...

    def start(self) -> Any: ...

    def stop(self) -> None: ...

    def wait_synced(self, timeout: float) -> bool: ...

    def items(self) -> list[dict[str, Any]]: ...

    def get(self, namespace: str | None, name: str) -> dict[str, Any] | None: ...


class SimScheduler:
    """Schedules pods whose ``schedulerName`` is the configuration's profile. start()/stop().

    ``bind_workers``: binding cycles in flight at once. kube-scheduler gives each its own
    goroutine (no limit); a small pool would make binds queue behind each other's API calls.
    """

    def __init__(self, api_client: Any, config: SchedulerConfig | str | os.PathLike[str], *,
                 informer: Callable[..., ObjectCache], extender_url: str | None = None, seed: int | None = None,
                 bind_workers: int = 8, initial_backoff: float | None = None,
                 max_backoff: float | None = None) -> None:
        from kubernetes import client

        if not isinstance(config, SchedulerConfig):
            config = load_config(config)
        if extender_url:
            config = config.with_extender_url(extender_url)
        self.config = config
        self.profiles = set(config.profiles)
        self.initial_backoff = initial_backoff if initial_backoff is not None else config.pod_initial_backoff
        self.max_backoff = max_backoff if max_backoff is not None else config.pod_max_backoff
        self._core = client.CoreV1Api(api_client)
        self._random = random.Random(seed)
        self.nodes = informer(self._core.list_node, on_event=self._on_node)
        self.pods = informer(self._core.list_pod_for_all_namespaces, on_event=self._on_pod)
        self._queue: dict[tuple[str, str], _Queued] = {}
        self._assumed: dict[str, tuple[str, dict[str, Any]]] = {}  # uid -> (node, pod)
        self._events: dict[tuple[str, str, str], tuple[str, int]] = {}  # (uid, reason, message) -> (name, count)
        self._kept_requests: dict[str, tuple[str, dict[str, Decimal]]] = {}  # uid -> (resourceVersion, requests)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._binder = ThreadPoolExecutor(bind_workers, thread_name_prefix="sim-scheduler-bind")
        self._recorder = ThreadPoolExecutor(1, thread_name_prefix="sim-scheduler-events")
        self._instance = f"{socket.gethostname()}-{os.getpid()}"
        self.scheduled = 0
        self.failures = 0

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> SimScheduler:
        if self._thread is not None:
            raise RuntimeError("the scheduler is already running")
        self._stopping.clear()
        self.nodes.start()
        self.pods.start()
        self._thread = threading.Thread(target=self._loop, name="sim-scheduler", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._binder.shutdown(wait=True, cancel_futures=True)
        self._recorder.shutdown(wait=True)  # the Events of what was decided are still written
        self.pods.stop()
        self.nodes.stop()

    def __enter__(self) -> SimScheduler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- events ---------------------------------------------------------------------------

    def _ours(self, pod: Mapping[str, Any]) -> bool:
        spec = pod.get("spec") or {}
        return (spec.get("schedulerName") or "default-scheduler") in self.profiles

    def _on_pod(self, kind: str, pod: dict[str, Any] | None) -> None:
        if pod is None:
            self._wake.set()
            return
        meta = pod.get("metadata") or {}
        key = (meta.get("namespace") or "", meta.get("name") or "")
        with self._lock:
            if (pod.get("spec") or {}).get("nodeName") or kind == "DELETED":
                self._assumed.pop(meta.get("uid") or "", None)
            pending = (kind != "DELETED" and self._ours(pod) and not (pod.get("spec") or {}).get("nodeName")
                       and not meta.get("deletionTimestamp")
                       and (pod.get("status") or {}).get("phase", "Pending") == "Pending")
            if pending:
                self._queue.setdefault(key, _Queued(due=time.monotonic()))
            elif key in self._queue and not self._queue[key].in_flight:
                del self._queue[key]
            if kind == "DELETED":
                self._retry_soon()  # freed capacity: unschedulable pods may fit now
        self._wake.set()

    def _on_node(self, kind: str, node: dict[str, Any] | None) -> None:
        with self._lock:
            self._retry_soon()
        self._wake.set()

    def _retry_soon(self) -> None:
        """Like moving unschedulable pods back to the active queue on a cluster event."""
        now = time.monotonic()
        for entry in self._queue.values():
            if not entry.in_flight and entry.attempts:
                entry.due = min(entry.due, now + self.initial_backoff)

    # --- the scheduling loop -----------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            if not (self.nodes.synced and self.pods.synced):
                self._stopping.wait(0.05)
                continue
            key, delay = self._next()
            if key is None:
                self._wake.wait(delay)
                self._wake.clear()
                continue
            try:
                self.schedule_one(key)
            except Exception:  # the loop must survive a bug or an API hiccup
                log.exception("scheduling %s/%s failed", *key)
                self._requeue(key)

    def _next(self) -> tuple[tuple[str, str] | None, float]:
        now = time.monotonic()
        with self._lock:
            ready = [(entry.due, key) for key, entry in self._queue.items() if not entry.in_flight]
            if not ready:
                return None, 1.0
            due, key = heapq.nsmallest(1, ready)[0]
            if due > now:
                return None, due - now
            self._queue[key].in_flight = True
            return key, 0.0

    def _requeue(self, key: tuple[str, str]) -> None:
        with self._lock:
            entry = self._queue.get(key)
            if entry is None:
                return
            entry.attempts += 1
            entry.in_flight = False
            entry.due = time.monotonic() + min(self.max_backoff,
                                                self.initial_backoff * 2 ** (entry.attempts - 1))
        self._wake.set()

    def _done(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._queue.pop(key, None)

    def schedule_one(self, key: tuple[str, str]) -> None:
        pod = self.pods.get(*key)
        if pod is None or (pod.get("spec") or {}).get("nodeName") or not self._ours(pod):
            self._done(key)
            return
        nodes = sorted(self.nodes.items(), key=lambda n: n["metadata"]["name"])
        reasons: dict[str, list[str]] = {}
        feasible = self._node_fit(pod, nodes, reasons)
        for ext in self.config.extenders:
            if not feasible:
                break
            if not ext.filter_verb or not ext.interested(pod):
                continue
            try:
                feasible = self._extender_filter(ext, pod, feasible, reasons)
            except ExtenderError as error:
                if ext.ignorable:
                    continue
                return self._fail(key, pod, str(error))
        if not feasible:
            return self._fail(key, pod, fit_error(len(nodes), reasons))
        host = self._select(pod, feasible)
        self._assume(pod, host)
        self._binder.submit(self._bind, key, pod, host)

    def _node_fit(self, pod: Mapping[str, Any], nodes: list[dict[str, Any]],
                  reasons: dict[str, list[str]]) -> list[dict[str, Any]]:
        used: dict[str, dict[str, Decimal]] = {}
        counts: dict[str, int] = {}
        uid = (pod.get("metadata") or {}).get("uid")
        with self._lock:
            assumed = dict(self._assumed)
        placed = {p["metadata"].get("uid"): (p["spec"]["nodeName"], p) for p in self.pods.items()
                  if (p.get("spec") or {}).get("nodeName")
                  and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")}
        placed.update({u: v for u, v in assumed.items() if u not in placed})
        for other_uid, (node_name, other) in placed.items():
            if other_uid == uid:
                continue
            bucket = used.setdefault(node_name, {})
            for name, amount in self._placed_requests(other).items():
                bucket[name] = bucket.get(name, Decimal(0)) + amount
            counts[node_name] = counts.get(node_name, 0) + 1
        self._forget_requests(placed)
        ignored = self.config.ignored_resources()
        requests = pod_requests(pod)
        feasible = []
        for node in nodes:
            name = node["metadata"]["name"]
            why = node_reasons(pod, node, used.get(name, {}), counts.get(name, 0), ignored, requests)
            if why:
                reasons[name] = why
            else:
                feasible.append(node)
        return feasible

    def _placed_requests(self, pod: Mapping[str, Any]) -> dict[str, Decimal]:
        """``pod_requests`` of a placed pod, kept per uid while its resourceVersion stays (each
        scheduling cycle sums every placed pod's requests; only the fit loop's thread calls this)."""
        meta = pod.get("metadata") or {}
        uid, version = meta.get("uid") or "", meta.get("resourceVersion") or ""
        kept = self._kept_requests.get(uid)
        if kept is not None and version and kept[0] == version:
            return kept[1]
        requests = pod_requests(pod)
        if uid:
            self._kept_requests[uid] = (version, requests)
        return requests

    def _forget_requests(self, placed: Mapping[str, Any]) -> None:
        """Drop the kept requests of pods no longer placed (deleted, finished)."""
        if len(self._kept_requests) > len(placed):
            for uid in [u for u in self._kept_requests if u not in placed]:
                del self._kept_requests[uid]

    def _extender_filter(self, ext: ExtenderConfig, pod: dict[str, Any], nodes: list[dict[str, Any]],
                         reasons: dict[str, list[str]]) -> list[dict[str, Any]]:
        by_name = {n["metadata"]["name"]: n for n in nodes}
        if ext.node_cache_capable:
            args = {"Pod": pod, "Nodes": None, "NodeNames": list(by_name)}
        else:
            args = {"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}
        result = _post(ext, ext.filter_verb, args)
        if not isinstance(result, dict):
            raise ExtenderError(f"extender {ext.url_prefix} answered filter with {type(result).__name__}")
        if _field(result, "Error"):
            raise ExtenderError(str(_field(result, "Error")))
        if ext.node_cache_capable:
            names = _field(result, "NodeNames") or []
        else:
            names = [n["metadata"]["name"] for n in (_field(_field(result, "Nodes") or {}, "items") or [])]
        passed = []
        for name in names:
            if name not in by_name:
                raise ExtenderError(f"extender {ext.url_prefix} claims a filtered node {name!r} "
                                    f"which is not found in the input node list")
            passed.append(by_name[name])
        for key in ("FailedNodes", "FailedAndUnresolvableNodes"):
            for name, message in (_field(result, key) or {}).items():
                reasons[name] = [message]
        return passed

    def _select(self, pod: dict[str, Any], feasible: list[dict[str, Any]]) -> str:
        names = [n["metadata"]["name"] for n in feasible]
        if len(names) == 1:
            return names[0]  # kube-scheduler does not score a single feasible node
        scores = dict.fromkeys(names, 0)
        for ext in self.config.extenders:
            if not ext.prioritize_verb or not ext.interested(pod):
                continue
            args = ({"Pod": pod, "Nodes": None, "NodeNames": names} if ext.node_cache_capable
                    else {"Pod": pod, "Nodes": {"metadata": {}, "items": feasible}, "NodeNames": None})
            try:
                result = _post(ext, ext.prioritize_verb, args)
            except ExtenderError as error:
                log.info("prioritize ignored: %s", error)  # kube-scheduler ignores prioritize errors
                continue
            for item in result if isinstance(result, list) else []:
                host, score = _field(item, "Host"), _field(item, "Score")
                if host in scores and isinstance(score, int):
                    scores[host] += score * ext.weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
        best = max(scores.values())
        return self._random.choice([n for n in names if scores[n] == best])

    def _assume(self, pod: dict[str, Any], host: str) -> None:
        with self._lock:
            self._assumed[pod["metadata"].get("uid") or ""] = (host, pod)

    def _bind(self, key: tuple[str, str], pod: dict[str, Any], host: str) -> None:
        meta = pod["metadata"]
        binder = next((e for e in self.config.extenders if e.bind_verb and e.interested(pod)), None)
        try:
            if binder is not None:
                args = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta.get("uid", ""),
                        "Node": host}
                result = _post(binder, binder.bind_verb, args)
                error = _field(result, "Error") if isinstance(result, dict) else "malformed bind reply"
                if error:
                    raise ExtenderError(str(error))
            else:
                body = {"apiVersion": "v1", "kind": "Binding",
                        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid")},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": host}}
                _drain(self._core.create_namespaced_pod_binding(meta["name"], meta["namespace"], body,
                                                                _preload_content=False))
        except Exception as error:  # ExtenderError or an API error: the binding cycle failed
            with self._lock:
                self._assumed.pop(meta.get("uid") or "", None)
            message = f"binding rejected: {error}"
            self._fail(key, pod, message)
            return
        self.scheduled += 1
        self._record(pod, "Scheduled", f"Successfully assigned {meta['namespace']}/{meta['name']} to {host}",
                     "Normal")
        self._done(key)

    def _fail(self, key: tuple[str, str], pod: dict[str, Any], message: str) -> None:
        self.failures += 1
        log.info("%s/%s: %s", key[0], key[1], message)
        self._record(pod, "FailedScheduling", message, "Warning")
        self._requeue(key)

    # --- Events ----------------------------------------------------------------------------

    def _record(self, pod: Mapping[str, Any], reason: str, message: str, kind: str) -> None:
        """Queue a core/v1 Event for the recorder thread (after stop(): dropped, as on shutdown)."""
        try:
            self._recorder.submit(self._write_event, pod, reason, message, kind)
        except RuntimeError:  # the recorder has shut down
            log.info("scheduler stopped: not recording %s for %s", reason, (pod.get("metadata") or {}).get("name"))

    def _write_event(self, pod: Mapping[str, Any], reason: str, message: str, kind: str) -> None:
        """A core/v1 Event; a repeat of the same one bumps its count, as the event recorder does."""
        meta = pod.get("metadata") or {}
        namespace, uid = meta.get("namespace") or "default", meta.get("uid") or ""
        message = message if len(message) <= 1024 else message[:1021] + "..."
        now = _now()
        dedupe = (uid, reason, message)
        try:
            with self._lock:
                known = self._events.get(dedupe)
            if known is not None:
                name, count = known
                _drain(self._core.patch_namespaced_event(name, namespace, {"count": count + 1, "lastTimestamp": now},
                                                         _preload_content=False))
                with self._lock:
                    self._events[dedupe] = (name, count + 1)
                return
            name = f"{meta.get('name')}.{uuid.uuid4().hex[:16]}"
            body = {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": name, "namespace": namespace},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"),
                                   "namespace": namespace, "uid": uid,
                                   "resourceVersion": meta.get("resourceVersion")},
                "reason": reason, "message": message, "type": kind,
                "source": {"component": next(iter(sorted(self.profiles)))},
                "reportingComponent": next(iter(sorted(self.profiles))), "reportingInstance": self._instance,
                "firstTimestamp": now, "lastTimestamp": now, "count": 1, "action": "Scheduling",
            }
            _drain(self._core.create_namespaced_event(namespace, body, _preload_content=False))
            with self._lock:
                self._events[dedupe] = (name, 1)
        except Exception as error:  # events are best effort, as in kube-scheduler
            log.warning("cannot record event %s for %s/%s: %s", reason, namespace, meta.get("name"), error)
