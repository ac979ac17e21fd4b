"""A simulated Kubernetes API server: kmock's Kubernetes scaffold plus a real object store.

kmock (``KubernetesScaffold``) supplies the HTTP handling, request parsing, the
``/version``, ``/api`` and ``/apis`` discovery documents, Status-shaped errors and its
reaction DSL, so a test can still inject faults (``emulator['get /api/v1/pods'] << 500``
wins over the defaults). kmock's own ``KubernetesEmulator`` is not used as the store:
it has no resourceVersion, ignores selectors and cannot bind pods. The store here
(``store.Store``) gives the API server's semantics: an increasing cluster-wide
resourceVersion, watch resumption with 410 Gone for compacted versions, label and
field selectors on list and watch, pods/binding, status subresources, the three
patch formats, optimistic concurrency and finalizers.

``SimKubeAPI`` runs it on 127.0.0.1 in a background thread and hands out a
kubeconfig and official-client ``ApiClient`` objects. Every request must carry the
instance's bearer token (401 otherwise, as an API server without anonymous access
answers): pods created here can become real processes (the kubelet stand-in's
run-processes mode), so nobody else on the machine may create them. It serves HTTPS
with a per-instance self-signed certificate (``tls``), because kubectl sends a
kubeconfig's token only over TLS.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import os
import re
import secrets
import ssl
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp.web
import attrs
import orjson
from kmock import KubernetesResourceNotFoundError, Payload, Request, ResourceInfo, resource

from . import tables
from ._kmock_private import Response, ScaffoldHooks
from .selectors import SelectorError, compile_selectors
from .store import RESOURCE_TYPES, ApiError, ResourceType, Store, WatchEvent, resource_type
from .tls import HOST, ServerIdentity

__all__ = ["KubeEmulator", "SimKubeAPI", "Store", "ApiError", "UNAUTHORIZED", "require_bearer_token"]

_JSON = {"Content-Type": "application/json"}
_T = TypeVar("_T")
# What kube-apiserver answers a request without valid credentials.
UNAUTHORIZED = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "Unauthorized", "reason": "Unauthorized", "code": 401}
_Handler = Callable[[aiohttp.web.BaseRequest], Awaitable[aiohttp.web.StreamResponse]]


def require_bearer_token(handler: _Handler, token: str) -> _Handler:
    """``handler`` behind ``Authorization: Bearer <token>``; anything else gets 401 and reaches nothing."""
    expected = token.encode()

    async def authenticated(request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
        given = credential.strip().encode("utf-8", "surrogateescape")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given, expected):
            return aiohttp.web.json_response(UNAUTHORIZED, status=401)
        return await handler(request)

    return authenticated


@dataclass(frozen=True)
class _Route:
    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None


def _route(path: str) -> _Route | None:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    # /namespaces/<ns>/<plural>/... but /namespaces/<name>/status is the namespace's own subresource.
    if len(rest) >= 3 and rest[0] == "namespaces" and not (len(rest) == 3 and rest[2] in ("status", "finalize")):
        namespace, rest = rest[1], rest[2:]
    rt = resource_type(group, version, rest[0])
    if rt is None or (namespace is not None and not rt.namespaced) or len(rest) > 3:
        return None
    return _Route(rt, namespace, rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None)


def _header(request: Request, name: str) -> str:
    return next((str(v) for k, v in request.headers.items() if k.lower() == name.lower()), "")


def _encode(body: Any) -> bytes:
    """JSON bytes; json's encoder for what orjson refuses (a lone surrogate a client stored)."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return json.dumps(body).encode()


def _truthy(value: str | None) -> bool:
    return value in ("true", "1", "True")


@attrs.define(kw_only=True)
class KubeEmulator(ScaffoldHooks):
    """kmock's scaffold serving the resources in ``store.RESOURCE_TYPES`` from a ``Store``."""

    store: Store = attrs.field(factory=Store)
    watch_timeout: float = 1800.0  # the longest a watch stays open without timeoutSeconds
    bookmark_interval: float = 10.0  # idle time before a BOOKMARK when the client allows them
    request_log_limit: int = 500  # kmock records requests for assertions; keep only the recent ones
    _closing: bool = attrs.field(default=False, init=False)
    _builtin_reactions: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for rt in RESOURCE_TYPES:
            self.resources[resource(rt.group, rt.version, rt.plural)] = ResourceInfo(
                namespaced=rt.namespaced, kind=rt.kind, singular=rt.singular, verbs=set(rt.verbs),
                shortnames=set(rt.short_names), subresources=set(rt.subresources))
        self.fallback[self._is_api_request] << self._serve  # a callable is a criterion
        # The official client asks for discovery documents with a trailing slash.
        self.fallback["get", re.compile(r"/api/[^/]+/|/apis/[^/]+/[^/]+/")] << self.serve_resource_list
        self.fallback["get", re.compile(r"/apis/")] << self.serve_api_groups
        self.fallback["get", re.compile(r"/api/")] << self.serve_api_versions
        self.fallback["get", re.compile(r"/version/")] << self.serve_server_version
        self.fallback["get /openapi/v3"] << self._serve_openapi_root
        self.fallback["get", re.compile(r"/openapi/v3/apis?/.+")] << self._serve_openapi_group
        self._builtin_reactions = self.reaction_count

    # -- discovery: kmock's version documents say groupVersion "/v1" for the core group and
    # give subresources the parent's verbs; kubectl needs these exact.

    async def serve_api_versions(self, request: Request) -> Payload:
        return {"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": request.url.host or ""}]}

    async def serve_resource_list(self, request: Request) -> Payload:
        parts = [p for p in request.url.path.split("/") if p]
        group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
        types = [rt for rt in RESOURCE_TYPES if (rt.group, rt.version) == (group, version)]
        if not types:
            raise KubernetesResourceNotFoundError()
        resources: list[dict[str, Any]] = []
        for rt in types:
            entry = {"name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                     "kind": rt.kind, "verbs": list(rt.verbs)}
            if rt.short_names:
                entry["shortNames"] = list(rt.short_names)
            resources.append(entry)
            for sub in rt.subresources:
                verbs = {"status": ["get", "patch", "update"], "binding": ["create"], "log": ["get"],
                         "scale": ["get", "patch", "update"]}.get(sub, ["get"])
                kind = {"binding": "Binding", "scale": "Scale"}.get(sub, rt.kind)
                resources.append({"name": f"{rt.plural}/{sub}", "singularName": "", "namespaced": rt.namespaced,
                                  "kind": kind, "verbs": verbs})
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version, "resources": resources}

    # -- OpenAPI v3, only as much as kubectl needs to validate on the server side
    # (it looks for the fieldValidation parameter on each kind's write operations).

    async def _serve_openapi_root(self) -> Payload:
        versions = sorted({(rt.group, rt.version) for rt in RESOURCE_TYPES})
        paths = {}
        for group, version in versions:
            prefix = f"apis/{group}/{version}" if group else f"api/{version}"
            paths[prefix] = {"serverRelativeURL": f"/openapi/v3/{prefix}?hash=sim"}
        return {"paths": paths}

    async def _serve_openapi_group(self, request: Request) -> Payload:
        parts = [p for p in request.url.path.split("/")[3:] if p]
        group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
        paths: dict[str, Any] = {}
        param = [{"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}}]
        for rt in RESOURCE_TYPES:
            if (rt.group, rt.version) != (group, version):
                continue
            gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
            prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
            scope = f"{prefix}/namespaces/{{namespace}}" if rt.namespaced else prefix
            ops = {"x-kubernetes-group-version-kind": gvk, "parameters": param, "responses": {}}
            paths[f"{scope}/{rt.plural}"] = {"post": dict(ops, **{"x-kubernetes-action": "post"})}
            paths[f"{scope}/{rt.plural}/{{name}}"] = {
                "put": dict(ops, **{"x-kubernetes-action": "put"}),
                "patch": dict(ops, **{"x-kubernetes-action": "patch"})}
        return {"openapi": "3.0.0", "info": {"title": "Kubernetes (simulated)", "version": "v1.32.0"},
                "paths": paths, "components": {"schemas": {}}}

    async def serve_server_version(self, request: Request) -> Payload:
        return {"major": "1", "minor": "32", "gitVersion": "v1.32.0-vgpu-sim", "gitCommit": "", "gitTreeState": "",
                "buildDate": "", "goVersion": "", "compiler": "", "platform": "linux/amd64"}

    def close_watches(self) -> None:
        """End every open watch stream (before the server stops)."""
        self._closing = True
        for listener in list(self.store.listeners):
            listener(None)

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # kmock 0.8's path parser crashes on the bare ".../namespaces" collection (namespace create
        # and list); build that request here. API requests while no test has added a reaction go
        # straight to the store too: kmock's parser decodes every body as JSON (the store decodes
        # it again), guesses the Kubernetes action and copies cookies, for reactions that match
        # nothing here. The rest (discovery, fault injection) goes through kmock as usual.
        if raw_request.path.rstrip("/") in ("/api/v1/namespaces",) or (
                self.reaction_count == self._builtin_reactions and _route(raw_request.path) is not None):
            return await self.serve_unparsed(raw_request)
        return await super().__call__(raw_request)

    async def handle(self, request: Request) -> aiohttp.web.StreamResponse:
        # kmock keeps every request for test assertions; bound that list for long-running demos.
        self.trim_request_log(self.request_log_limit)
        # kmock matches a request by rescanning its request log for every reaction; with no
        # reactions added by a test, API requests go straight to the store.
        if self.reaction_count == self._builtin_reactions and self._is_api_request(request):
            response: aiohttp.web.StreamResponse = await (await self._serve(request))(request)
            return response
        return await self.react(request)

    @staticmethod
    def _is_api_request(request: Request) -> bool:
        return _route(request.url.path) is not None

    async def _serve(self, request: Request) -> Response:
        route = _route(request.url.path)
        assert route is not None  # the criteria guarantee it
        try:
            return self._dispatch(request, route)
        except ApiError as error:
            return Response(status=error.code, headers=_JSON, payload=_encode(error.status()))

    def _dispatch(self, request: Request, route: _Route) -> Response:
        rt, ns, name, sub = route.rt, route.namespace, route.name, route.subresource
        params = request.params
        method = request.method.value if hasattr(request.method, "value") else str(request.method)
        if params.get("dryRun"):
            raise ApiError(400, "BadRequest", "dryRun is not supported by the simulated API server")
        if sub not in (None, "status", "binding") or (sub == "binding" and rt.plural != "pods") \
                or (sub == "status" and not rt.has_status):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({rt.plural}/{sub})")

        if method == "GET":
            predicate = self._predicate(rt, params, name)
            version = tables.wants_table(_header(request, "Accept")) if tables.printable(rt.group, rt.plural) \
                else None
            include = params.get("includeObject") or None
            if version is not None and include not in (None, "None", "Metadata", "Object"):
                raise ApiError(400, "BadRequest", f"includeObject={include!r}: use None, Metadata or Object")
            if _truthy(params.get("watch")):
                as_table = None if version is None else (  # kubectl get -w: each event's object as a Table row
                    lambda obj: tables.table(rt.group, rt.plural, [obj], version, obj["metadata"].get(
                        "resourceVersion", ""), include))
                return self._start_watch(route, params, predicate, as_table)
            if version is not None:  # kubectl get: the columns it prints
                objects = self.store.list(rt, ns, predicate) if name is None else [self.store.get(rt, ns, name)]
                return self._ok(tables.table(rt.group, rt.plural, objects, version, str(self.store.rv), include))
            if name is None:
                items = self.store.list(rt, ns, predicate)
                body = {"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                        "metadata": {"resourceVersion": str(self.store.rv)}, "items": items}
                # encoded here with orjson (a 100,000-pod list: ~0.3 s against several with json);
                # bytes go out as they are
                return Response(status=200, headers=_JSON, payload=_encode(body))
            return self._ok(self.store.get(rt, ns, name))

        if rt.namespaced and ns is None and method in ("POST", "PUT", "PATCH", "DELETE"):
            raise ApiError(405, "MethodNotAllowed", f"{rt.plural} are namespaced: use /namespaces/<ns>/{rt.plural}")
        if method == "POST" and rt.plural == "bindings" and name is None:
            body = self._body(request)
            target = (body.get("metadata") or {}).get("name", "") if isinstance(body, dict) else ""
            return self._ok(self.store.bind(ns or "", target, body), 201)
        if method == "POST" and sub == "binding":
            return self._ok(self.store.bind(ns or "", name or "", self._body(request)), 201)
        if method == "POST" and name is None:
            return self._ok(self.store.create(rt, ns, self._body(request)), 201)
        if method == "PUT" and name is not None:
            return self._ok(self.store.replace(rt, ns, name, self._body(request), sub))
        if method == "PATCH" and name is not None:
            content_type = request.headers.get("Content-Type", request.headers.get("content-type", ""))
            return self._ok(self.store.patch(rt, ns, name, self._body(request), content_type, sub))
        if method == "DELETE" and name is not None and sub is None:
            return self._ok(self.store.delete(rt, ns, name, self._body(request, optional=True)))
        if method == "DELETE" and name is None:
            deleted = [self.store.delete(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"])
                       for obj in self.store.list(rt, ns, self._predicate(rt, params, None))]
            return self._ok({"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                             "metadata": {"resourceVersion": str(self.store.rv)}, "items": deleted})
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {request.url.path}")

    @staticmethod
    def _ok(body: Mapping[str, Any], status: int = 200) -> Response:
        # encoded here with orjson: kmock sends bytes as they are, where a dict would go through
        # its renderer's chain of type checks and the json module (a pod: most of a GET's cost)
        return Response(status=status, headers=_JSON, payload=_encode(body))

    @staticmethod
    def _body(request: Request, optional: bool = False) -> Any:
        if not request.body:
            if optional:
                return {}
            raise ApiError(400, "BadRequest", "the request needs a JSON body")
        try:
            return json.loads(request.body)
        except ValueError as error:
            raise ApiError(400, "BadRequest", f"the request body is not valid JSON: {error}") from None

    @staticmethod
    def _predicate(rt: ResourceType, params: Mapping[str, str], name: str | None) -> Callable[[Mapping[str, Any]], bool]:
        try:
            matches = compile_selectors(params.get("labelSelector"), params.get("fieldSelector"), rt.plural)
        except SelectorError as error:
            raise ApiError(400, "BadRequest", str(error)) from None
        if name is None:
            return matches
        return lambda obj: obj["metadata"]["name"] == name and matches(obj)

    # -- watch ---------------------------------------------------------------------

    def _start_watch(self, route: _Route, params: Mapping[str, str],
                     predicate: Callable[[Mapping[str, Any]], bool],
                     as_table: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None) -> Response:
        since = params.get("resourceVersion") or "0"
        if not since.isdecimal():
            raise ApiError(400, "BadRequest", f"invalid resourceVersion {since!r}: must be an integer")
        try:
            timeout = float(params.get("timeoutSeconds") or self.watch_timeout)
        except ValueError:
            raise ApiError(400, "BadRequest", "timeoutSeconds must be a number") from None
        stream = self._watch(route, int(since), timeout, _truthy(params.get("allowWatchBookmarks")), predicate,
                             _relevance(route, params.get("fieldSelector")))
        if as_table is not None:
            stream = self._as_tables(stream, as_table)
        return Response(status=200, headers=_JSON, payload=self._lines(stream))

    @staticmethod
    async def _lines(stream: AsyncIterator[Any]) -> AsyncIterator[bytes]:
        """Each event as a JSON line, encoded here with orjson: kmock would send a dict through the
        json module (a pod: ~20 times slower), once per event and per watch that shows it."""
        try:
            async for item in stream:
                yield item if isinstance(item, bytes) else _encode(item) + b"\n"
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    @staticmethod
    async def _as_tables(stream: AsyncIterator[Any],
                         convert: Callable[[Mapping[str, Any]], dict[str, Any]]) -> AsyncIterator[Any]:
        try:
            async for item in stream:
                if isinstance(item, dict) and item.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    item = {"type": item["type"], "object": convert(item["object"])}
                yield item
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    async def _watch(self, route: _Route, since: int, timeout: float, bookmarks: bool,
                     predicate: Callable[[Mapping[str, Any]], bool],
                     relevant: Callable[[WatchEvent], bool]) -> AsyncIterator[Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        wake = asyncio.Event()
        skipped = 0

        def notify(event: WatchEvent | None) -> None:
            # Only a change this watch may show wakes it: every write used to wake every watch
            # (~90 in the classroom storm, 80 of them kubelets' and device plugins' pinned to one
            # node each). Every _CATCH_UP changes it wakes anyway, to move past them well inside
            # the history.
            nonlocal skipped
            skipped += 1
            if event is None or relevant(event) or skipped >= _CATCH_UP:
                skipped = 0
                wake.set()

        self.store.listeners.append(notify)
        try:
            yield b""  # send the headers now: clients block until they arrive
            if since == 0:  # "any version": the current state as ADDED events, then changes
                last = self.store.rv
                for obj in self.store.list(route.rt, route.namespace, predicate):
                    yield {"type": "ADDED", "object": obj}
            else:
                last = since
            while not self._closing:
                wake.clear()
                try:
                    events = self.store.events_after(last)
                except ApiError as error:  # compacted: the client must relist
                    yield {"type": "ERROR", "object": error.status()}
                    return
                for event in events:
                    last = event.rv
                    if not relevant(event):
                        continue
                    out = self._translate(event, route, predicate)
                    if out is not None:
                        yield out
                if events:
                    continue
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return
                try:
                    await asyncio.wait_for(wake.wait(), min(remaining, self.bookmark_interval))
                except asyncio.TimeoutError:
                    if bookmarks and loop.time() < deadline:
                        yield {"type": "BOOKMARK", "object": {
                            "kind": route.rt.kind, "apiVersion": route.rt.api_version,
                            "metadata": {"resourceVersion": str(max(last, 0))}}}
        finally:
            if notify in self.store.listeners:
                self.store.listeners.remove(notify)

    @staticmethod
    def _translate(event: WatchEvent, route: _Route,
                   predicate: Callable[[Mapping[str, Any]], bool]) -> dict[str, Any] | None:
        """The event as this watch sees it: selector transitions become ADDED/DELETED, as the API does."""
        if (event.group, event.plural) != (route.rt.group, route.rt.plural):
            return None
        if route.namespace is not None and event.obj["metadata"].get("namespace") != route.namespace:
            return None
        now = predicate(event.obj)
        if event.type == "MODIFIED":
            before = event.old is not None and predicate(event.old)
            kind = "MODIFIED" if now and before else "ADDED" if now else "DELETED" if before else None
        else:
            kind = event.type if now else None
        return None if kind is None else {"type": kind, "object": event.obj}


# A watch that no change concerns still wakes after this many (the history keeps 5,000 by default).
_CATCH_UP = 500


def _pinned_node(field_selector: str | None) -> str | None:
    """The node a pod watch's field selector pins it to (``spec.nodeName=<node>``), else None."""
    for term in (field_selector or "").split(","):
        key, sep, value = term.partition("=")
        value = value.removeprefix("=")  # "==" means "="; "!=" leaves "spec.nodeName!" as the key
        if sep and key.strip() == "spec.nodeName" and value.strip():
            return value.strip()
    return None


def _relevance(route: _Route, field_selector: str | None) -> Callable[[WatchEvent], bool]:
    """Whether a change may concern a watch of ``route``: its kind and namespace, and for a pod watch
    pinned to a node, a pod on that node before or after the change. A cheap superset of what
    ``_translate`` shows, checked before the selectors are evaluated."""
    group, plural, namespace = route.rt.group, route.rt.plural, route.namespace
    node = _pinned_node(field_selector) if (group, plural) == ("", "pods") else None

    def relevant(event: WatchEvent) -> bool:
        if event.plural != plural or event.group != group:
            return False
        if namespace is not None and event.obj["metadata"].get("namespace") != namespace:
            return False
        if node is None:
            return True
        return ((event.obj.get("spec") or {}).get("nodeName") == node
                or (event.old is not None and (event.old.get("spec") or {}).get("nodeName") == node))

    return relevant


class SimKubeAPI:
    """The simulated API on ``127.0.0.1:<port>`` in a background thread.

    ``start()`` returns once it accepts connections; ``stop()`` ends open watches and
    closes the port; ``start()`` again serves the same objects on the same port
    (a restart, as an informer sees it). Store access from other threads goes through
    ``call()``, which runs a function on the server's event loop.

    Clients authenticate with ``token`` (random per instance unless given) over HTTPS
    (a self-signed certificate per instance): the kubeconfig and ``api_client()`` carry
    both; raw HTTP clients send ``auth_headers()`` and verify with ``ssl_context()``.
    """

    def __init__(self, *, port: int = 0, history: int = 5000, watch_timeout: float = 1800.0,
                 bookmark_interval: float = 10.0, token: str | None = None):
        if token is not None and (not token or not all("!" <= ch <= "~" for ch in token)):
            raise ValueError("the API token must be non-empty printable ASCII without spaces (it goes in a header)")
        self.store = Store(history=history)
        self.port = port
        self.token = token if token is not None else secrets.token_urlsafe(32)
        self.identity = ServerIdentity.generate()
        self.kubeconfig: str | None = None
        self._watch_timeout = watch_timeout
        self._bookmark_interval = bookmark_interval
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._emulator: KubeEmulator | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"https://{HOST}:{self.port}"

    def auth_headers(self) -> dict[str, str]:
        """The header a raw HTTP request needs (official clients get it from the kubeconfig)."""
        return {"Authorization": f"Bearer {self.token}"}

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that trusts this server's certificate (for urllib and friends)."""
        return self.identity.client_context()

    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def emulator(self) -> KubeEmulator:
        """The kmock handler: add reactions to inject faults, read ``.requests``."""
        if self._emulator is None:
            raise RuntimeError("the simulated API is not running")
        return self._emulator

    def start(self, timeout: float = 10.0) -> SimKubeAPI:
        if self._thread is not None:
            raise RuntimeError("the simulated API is already running")
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(ready, failure), name="sim-kube-api", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError("the simulated API did not start in time")
        if failure:
            self._thread.join()
            self._thread = None
            raise RuntimeError(f"the simulated API failed to start: {failure[0]}") from failure[0]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None or loop is None or stopping is None:
            return
        loop.call_soon_threadsafe(stopping.set)
        thread.join(timeout)
        self._thread = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> SimKubeAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run ``fn(*args, **kwargs)`` where the store lives (the server loop, or here when stopped)."""
        loop = self._loop
        if self._thread is None or loop is None:
            with self._lock:
                return fn(*args, **kwargs)

        async def run() -> _T:
            return fn(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(run(), loop).result(timeout=30)

    def compact(self) -> int:
        """Forget the watch history (as etcd compaction does): older resourceVersions now get 410."""
        return self.call(self.store.compact)

    @property
    def resource_version(self) -> int:
        return self.call(lambda: self.store.rv)

    def write_kubeconfig(self, path: str | os.PathLike[str]) -> str:
        """A kubeconfig for kubectl and ``kubernetes.config.load_kube_config`` (JSON is valid YAML).

        It holds the token, so only its owner may read it (mode 0600, also when it existed).
        """
        config = {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": "vgpu-sim", "cluster": {
                "server": self.url,
                "certificate-authority-data": base64.b64encode(self.identity.cert_pem).decode()}}],
            "users": [{"name": "vgpu-sim", "user": {"token": self.token}}],
            "contexts": [{"name": "vgpu-sim", "context": {"cluster": "vgpu-sim", "user": "vgpu-sim",
                                                          "namespace": "default"}}],
            "current-context": "vgpu-sim",
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with open(fd, "w", encoding="utf-8") as handle:
            json.dump(config, handle, indent=2)
        self.kubeconfig = os.fspath(path)
        return self.kubeconfig

    def api_client(self) -> Any:
        """A fresh official-client ``ApiClient`` pointed at this server, with its token."""
        from .client import api_client

        return api_client(self.url, self.token, self.identity.cert_pem)

    # -- the server thread -----------------------------------------------------------

    def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve(ready))
        except BaseException as error:  # reported to start(), which re-raises it
            failure.append(error)
            ready.set()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            self._loop = None

    async def _serve(self, ready: threading.Event) -> None:
        self._stopping = asyncio.Event()
        emulator = KubeEmulator(store=self.store, watch_timeout=self._watch_timeout,
                                bookmark_interval=self._bookmark_interval)
        # kmock.Server is not used: its DNS interceptor patches aiohttp process-wide and must be
        # unwound LIFO, which several emulators in several threads cannot promise.
        async with emulator:
            handler = require_bearer_token(emulator, self.token)
            runner = aiohttp.web.ServerRunner(aiohttp.web.Server(handler, access_log=None), shutdown_timeout=2.0,
                                              handle_signals=False)
            await runner.setup()
            try:
                site = aiohttp.web.TCPSite(runner, HOST, self.port, reuse_address=True,
                                           ssl_context=self.identity.server_context())
                await site.start()
                self.port = runner.addresses[0][1]
                self._emulator = emulator
                ready.set()
                await self._stopping.wait()
                emulator.close_watches()
            finally:
                self._emulator = None
                await runner.cleanup()
