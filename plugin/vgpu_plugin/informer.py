"""A list+watch cache of one kind of Kubernetes object, through the official client.

It lists, then watches from the list's resourceVersion, and resumes each new watch
from the last version it saw, so no event is lost when a watch times out or the API
server restarts. When the server says that version is gone (410), it relists and
reports the difference as ordinary events. Objects are the plain dicts the API sends
(camelCase), never client models.

Callbacks run on the informer's thread, in event order:
``on_event(kind, obj)`` with kind ``ADDED``/``MODIFIED``/``DELETED`` for each change
(the initial list reports every object as ``ADDED``; a relist reports what changed
while no watch was open) and ``RELISTED`` with ``obj=None`` after each full list.

``subset``, when given, keeps a second index of the cached objects it holds true for
(``subset_items()``), maintained with each event: a reader that wants a few of many
objects (the extender's unbound pods among 100,000 bound ones) reads those, not all.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson

log = logging.getLogger(__name__)

_gc_lock = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = True


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a full list is decoded and applied.

    A list of 100,000 pods allocates millions of long-lived objects, and each full
    collection on the way walks all of them again (about a third of the time to rebuild
    the extender's ledger). The JSON objects hold no reference cycles, so reference
    counting frees them anyway. Nested and concurrent pauses are counted: the collector
    comes back, if it was on, when the last one ends.
    """
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()

EventCallback = Callable[[str, "dict[str, Any] | None"], None]


def decode(data: bytes | str) -> Any:
    """An API reply's JSON: orjson (a 100,000-pod list in a fraction of json's time), or json
    for what orjson refuses (a lone surrogate; a real API server never sends one). orjson turns
    integers beyond 64 bits into floats, which only matters for input the API server did not
    validate: every integer field of its objects is int32 or int64."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def decode_watch_event(line: str) -> dict[str, Any] | None:
    """One line of a watch stream as the official client's ``Watch.unmarshal_event`` gives it with
    ``return_type=object`` (``type``, ``object`` and ``raw_object``, the same dict), decoded once:
    the client's parses the line, writes the object back to JSON and parses that again, three
    passes of the stdlib's json per event in every informer of every component. None for a blank
    or malformed line, as there."""
    if not line or line.isspace():
        return None
    try:
        event = decode(line)
    except ValueError:  # json.JSONDecodeError and orjson.JSONDecodeError both are
        return None
    if not isinstance(event, dict):
        return None
    event["raw_object"] = event.get("object")
    return event


def _raw_watch() -> Any:
    """A ``kubernetes.watch.Watch`` whose events are decoded once (``decode_watch_event``)."""
    return _raw_watch_class()(return_type=object)


@functools.cache
def _raw_watch_class() -> Any:
    from kubernetes import watch

    class RawWatch(watch.Watch):  # type: ignore[misc]
        def unmarshal_event(self, data: str, return_type: Any) -> dict[str, Any] | None:
            event = decode_watch_event(data)
            obj = event.get("object") if event is not None else None
            if event is not None and event.get("type") != "ERROR" and isinstance(obj, dict):
                meta = obj.get("metadata")
                version = meta.get("resourceVersion") if isinstance(meta, dict) else None
                if version:  # where the client's own retry resumes, as unmarshal_event keeps it
                    self.resource_version = version
            return event

    return RawWatch


def _key(obj: dict[str, Any]) -> tuple[str | None, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace"), meta.get("name", "")


def resource_version(obj: Any) -> int | None:
    """An object's (or a list's) resourceVersion as an integer, to compare two of them; None when
    it has none or it is not one (the API server's are integers, but they are opaque by contract)."""
    value = (obj.get("metadata") or {}).get("resourceVersion") if isinstance(obj, Mapping) else None
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _version(obj: dict[str, Any]) -> str | None:
    return (obj.get("metadata") or {}).get("resourceVersion")


class Informer:
    def __init__(self, list_func: Callable[..., Any], *, label_selector: str | None = None,
                 field_selector: str | None = None, on_event: EventCallback | None = None,
                 watch_timeout: float = 240.0, backoff_initial: float = 0.2, backoff_max: float = 10.0,
                 subset: Callable[[dict[str, Any]], bool] | None = None, **list_kwargs: Any):
        self._list_func = list_func
        self._selectors = {k: v for k, v in (("label_selector", label_selector),
                                              ("field_selector", field_selector)) if v}
        self._list_kwargs = list_kwargs
        self._on_event = on_event
        self._watch_timeout = watch_timeout
        self._backoff_initial, self._backoff_max = backoff_initial, backoff_max
        self._cache: dict[tuple[str | None, str], dict[str, Any]] = {}
        self._in_subset = subset
        self._subset: dict[tuple[str | None, str], dict[str, Any]] = {}  # the cached objects subset() holds for
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: Any = None
        self.resource_version: str | None = None
        self.changes = 0  # bumped (under the lock) with every change to the cache: equal counts, equal items
        self.relists = 0  # how many full lists it has made (1 after the first sync)
        self.failures = 0  # how many list/watch attempts failed (API errors other than 410, connection errors)
        self.name = getattr(list_func, "__name__", "informer")

    # -- public API ----------------------------------------------------------------

    def start(self) -> Informer:
        if self._thread is not None:
            raise RuntimeError("the informer is already running")
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        thread, deadline = self._thread, time.monotonic() + timeout
        # A watch whose response has not arrived yet cannot be interrupted: keep trying until it has.
        while thread is not None and thread.is_alive() and time.monotonic() < deadline:
            watch = self._watch
            if watch is not None:
                watch.stop()
            thread.join(0.05)
        self._thread = None

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def items(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._cache.values())

    def get(self, namespace: str | None, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._cache.get((namespace or None, name))

    def subset_items(self) -> list[dict[str, Any]]:
        """The cached objects ``subset`` holds true for (all of them when no ``subset`` was given)."""
        with self._lock:
            return list((self._subset if self._in_subset is not None else self._cache).values())

    # -- the loop ------------------------------------------------------------------

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        backoff = self._backoff_initial
        while not self._stopping.is_set():
            try:
                if self.resource_version is None:
                    self._relist()
                self._watch_once()
                backoff = self._backoff_initial
            except ApiException as error:
                if error.status == 410:
                    log.info("%s: resourceVersion %s is gone; relisting", self.name, self.resource_version)
                    self.resource_version = None
                    continue
                if self._stopping.is_set():
                    break
                self.failures += 1
                log.warning("%s: API error %s %s; retrying in %.1fs", self.name, error.status, error.reason, backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, self._backoff_max)
            except Exception as error:  # connection refused/reset, timeouts, malformed data
                if self._stopping.is_set():
                    break
                self.failures += 1
                log.warning("%s: %s; retrying in %.1fs", self.name, error or type(error).__name__, backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, self._backoff_max)

    def _relist(self) -> None:
        response = self._list_func(**self._list_kwargs, **self._selectors, _preload_content=False,
                                   _request_timeout=60)
        with cyclic_gc_paused():
            self._apply_list(decode(response.data))

    def _apply_list(self, body: dict[str, Any]) -> None:
        fresh = {}
        for obj in body.get("items") or []:
            fresh[_key(obj)] = obj
        in_subset = self._in_subset
        subset = {} if in_subset is None else {key: obj for key, obj in fresh.items() if in_subset(obj)}
        with self._lock:
            old, self._cache, self._subset = self._cache, fresh, subset
            self.changes += 1
        self.resource_version = (body.get("metadata") or {}).get("resourceVersion") or None
        self.relists += 1
        for key, obj in old.items():
            if key not in fresh:
                self._emit("DELETED", obj)
        for key, obj in fresh.items():
            if key not in old:
                self._emit("ADDED", obj)
            elif _version(old[key]) != _version(obj):
                self._emit("MODIFIED", obj)
        self._synced.set()
        self._emit("RELISTED", None)

    def _watch_once(self) -> None:
        self._watch = _raw_watch()
        if self._stopping.is_set():
            return
        try:
            stream = self._watch.stream(
                self._list_func, **self._list_kwargs, **self._selectors,
                resource_version=self.resource_version, allow_watch_bookmarks=True,
                timeout_seconds=int(self._watch_timeout), _request_timeout=self._watch_timeout + 30)
            for event in stream:
                self._apply(event["type"], event["raw_object"])
                if self._stopping.is_set():
                    break
        finally:
            self._watch = None

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        version = _version(obj)
        if kind == "BOOKMARK":
            self.resource_version = version or self.resource_version
            return
        key = _key(obj)
        with self._lock:
            self.changes += 1
            if kind == "DELETED":
                self._cache.pop(key, None)
                self._subset.pop(key, None)
            else:
                self._cache[key] = obj
                if self._in_subset is not None:
                    if self._in_subset(obj):
                        self._subset[key] = obj
                    else:
                        self._subset.pop(key, None)
        if version:
            self.resource_version = version
        self._emit(kind, obj)

    def _emit(self, kind: str, obj: dict[str, Any] | None) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(kind, obj)
        except Exception:  # a consumer's bug must not stop the cache
            log.exception("%s: on_event callback failed for %s", self.name, kind)
