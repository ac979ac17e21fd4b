"""The extender's view of the cluster: Nodes and Pods watched into the ledger.

Two informers (list + watch, resumed from resourceVersion, relisted on 410) feed the
ledger. A pod's claim comes from its annotations; between our bind and the watch
catching up, the ledger holds the bind's *assumed* claim, which watch events older
than the PATCH that wrote it cannot undo. Assumptions the watch never confirms expire
after ``assume_ttl`` and are settled from the informer's copy of the pod.
"""

from __future__ import annotations

import gc
import json
import logging
import threading
import time
from collections.abc import Collection, Mapping
from typing import Any

from jupyter_vgpu.core.claims import FINISHED_PHASES
from jupyter_vgpu.core.contract import Names

from ..informer import Informer, resource_version
from .decisions import APIFailure
from .headroom import HostHeadroom
from .ledger import (
    Holding,
    Ledger,
    Unattributed,
    node_cards,
    pod_holding,
    pod_key,
)

log = logging.getLogger(__name__)

# Terminated pods hold nothing; leaving the selected set is delivered as DELETED.
LIVE_PODS = ",".join(f"status.phase!={phase}" for phase in FINISHED_PHASES)


class KubePodAPI:
    """Bind's Kubernetes calls through the official client, on plain dicts.

    The GET and the Binding go through the client's own ``ApiClient`` (``param_serialize`` and
    ``call_api``: its configuration, auth, TLS, retries and ApiException) without the generated
    ``CoreV1Api`` methods above it, whose pydantic ``validate_call`` and per-endpoint serialisation
    cost ~0.1–0.15 ms of CPU per call on the bind path (benchmarks/extender/README.md). The rare
    PATCH keeps the generated method (it also picks the patch's content type)."""

    def __init__(self, api_client: Any, timeout: float = 10.0) -> None:
        from kubernetes import client

        self._client = api_client
        self._core = client.CoreV1Api(api_client)
        self._timeout = timeout

    def _call(self, what: str, fn: Any, *args: Any) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        try:
            data = fn(*args)
        except ApiException as error:
            raise APIFailure(f"{what}: {error.status} {_status_message(error)}", error.status) from None
        except Exception as error:  # connection refused/reset, timeouts
            raise APIFailure(f"{what}: {type(error).__name__}: {error}") from None
        try:
            decoded: dict[str, Any] = json.loads(data or b"{}")
        except ValueError:
            return {}
        return decoded

    def _request(self, method: str, path: str, path_params: dict[str, str],
                 body: dict[str, Any] | None = None) -> bytes:
        """What a generated method does with ``_preload_content=False`` once it has checked its
        arguments: the same ApiClient calls, the same ApiException for a status outside 2xx."""
        from kubernetes.client.exceptions import ApiException

        request = self._client.param_serialize(method, path, path_params=path_params,
                                               header_params={"Accept": "application/json"},
                                               body=body, auth_settings=["BearerToken"])
        response = self._client.call_api(*request, _request_timeout=self._timeout)
        response.read()
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        data: bytes = response.data
        return data

    def _patch(self, name: str, namespace: str, body: dict[str, Any]) -> bytes:
        response: Any = self._core.patch_namespaced_pod(name, namespace, body, _preload_content=False,
                                                        _request_timeout=self._timeout)
        data: bytes = response.data
        return data

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call("reading the pod", self._request, "GET", "/api/v1/namespaces/{namespace}/pods/{name}",
                              {"namespace": namespace, "name": name})
        except APIFailure as error:
            if error.status == 404:
                return None
            raise

    def patch_annotations(self, namespace: str, name: str,
                          annotations: Mapping[str, str | None]) -> dict[str, Any]:
        return self._call("annotating the pod", self._patch, name, namespace,
                          {"metadata": {"annotations": dict(annotations)}})

    def bind(self, namespace: str, name: str, uid: str, node: str,
             annotations: Mapping[str, str] | None = None) -> None:
        metadata: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            metadata["uid"] = uid  # the API server refuses the binding if the pod was replaced
        if annotations:
            metadata["annotations"] = dict(annotations)  # copied onto the pod with nodeName, in one write
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": metadata,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        self._call("binding the pod", self._request, "POST", "/api/v1/namespaces/{namespace}/pods/{name}/binding",
                   {"namespace": namespace, "name": name}, body)


def _status_message(error: Any) -> str:
    try:
        return json.loads(error.body).get("message") or error.reason
    except (TypeError, ValueError, AttributeError):
        return str(error.reason)


class ClusterView:
    """Keeps ``ledger`` in step with the API. ``start()`` returns at once; see ``synced``.

    ``schedulers``: only unbound pods of these scheduler names hold what they claim (None: any).
    """

    def __init__(self, api_client: Any, ledger: Ledger, names: Names, *, assume_ttl: float = 60.0,
                 sweep_interval: float = 5.0, schedulers: Collection[str] | None = None,
                 hosts: HostHeadroom | None = None) -> None:
        from kubernetes import client

        core = client.CoreV1Api(api_client)
        self.ledger = ledger
        self.names = names
        self.schedulers = frozenset(schedulers) if schedulers is not None else None
        self.hosts = hosts  # CPU/memory headroom per node, for the fragment policy
        self.assume_ttl = assume_ttl
        self._sweep_interval = sweep_interval
        self.nodes = Informer(core.list_node, on_event=self._on_node)
        # the unbound pods are indexed apart: the queue (GET /queue, its Events) reads only those
        self.pods = Informer(core.list_pod_for_all_namespaces, field_selector=LIVE_PODS,
                             on_event=self._on_pod, subset=unbound)
        self._stopping = threading.Event()
        self._sweeper: threading.Thread | None = None
        self._started_at = 0.0
        self._frozen = False
        self.sync_seconds: float | None = None  # from start() until nodes and pods were both listed

    def start(self) -> ClusterView:
        self._stopping.clear()
        self._started_at, self.sync_seconds = time.monotonic(), None
        self.nodes.start()
        self.pods.start()
        self._sweeper = threading.Thread(target=self._sweep_loop, name="extender-sweep", daemon=True)
        self._sweeper.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self.pods.stop()
        self.nodes.stop()
        if self._sweeper is not None:
            self._sweeper.join(10)
            self._sweeper = None

    @property
    def synced(self) -> bool:
        synced = self.nodes.synced and self.pods.synced
        if synced and self.sync_seconds is None:
            self.sync_seconds = time.monotonic() - self._started_at
        return synced

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return (self.nodes.wait_synced(timeout)
                and self.pods.wait_synced(max(0.0, deadline - time.monotonic())))

    # --- events -------------------------------------------------------------------------

    def _on_node(self, kind: str, node: dict[str, Any] | None) -> None:
        if node is None:
            return
        name = (node.get("metadata") or {}).get("name") or ""
        if self.hosts is not None:
            self.hosts.on_node(kind, node)
        if kind == "DELETED":
            self.ledger.remove_node(name)
        else:
            self.ledger.set_node(name, node_cards(node, self.names))

    def _on_pod(self, kind: str, pod: dict[str, Any] | None) -> None:
        if pod is None:
            if kind == "RELISTED" and not self._frozen and self.nodes.synced:
                # The first full list is the bulk of what stays alive for good: take it out of
                # the cyclic GC's full collections (a pause of ~200 ms at 20,000 pods otherwise).
                self._frozen = True
                gc.freeze()
            return
        uid = pod_key(pod)[0]
        if self.hosts is not None:
            self.hosts.on_pod(kind, pod)
        with self.ledger.lock:
            existing = self.ledger.holding(uid)
            if kind == "DELETED":
                # gone, or terminated (it left the live-pods selection)
                if existing is None or not existing.assumed or not _older(pod, existing):
                    self.ledger.drop(uid)
                return
            self.apply(pod, existing)

    def apply(self, pod: Mapping[str, Any], existing: Holding | None) -> None:
        """Make the ledger say what this version of the pod says, unless it predates our bind."""
        claim = pod_holding(pod, self.names, self.schedulers)
        if existing is not None and existing.assumed:
            if existing.min_resource_version is None:
                # our PATCH is still in flight: only its own result may confirm the claim
                if not (isinstance(claim, Holding) and claim.same_claim(existing)):
                    return
            elif _older(pod, existing):
                return
        if claim is None:
            self.ledger.drop(pod_key(pod)[0])
        elif isinstance(claim, Unattributed):
            log.warning("pod %s/%s on %s: %s", claim.namespace, claim.name, claim.node, claim.reason)
            self.ledger.put_unattributed(claim)
        elif (existing is None or existing.assumed or not existing.same_claim(claim)
              or existing.unserved != claim.unserved):  # kubelet admitted it: binds waiting on it go on
            self.ledger.put(claim)

    # --- assumptions the watch never confirmed ------------------------------------------------

    def _sweep_loop(self) -> None:
        while not self._stopping.wait(self._sweep_interval):
            try:
                self.sweep()
            except Exception:  # keep sweeping; the next round may succeed
                log.exception("sweeping expired assumptions failed")

    def sweep(self, now: float | None = None) -> int:
        """Settle assumptions older than ``assume_ttl`` from the informer's copy; returns how many."""
        now = time.monotonic() if now is None else now
        settled = 0
        for holding in self.ledger.holdings():
            if not holding.assumed or now - holding.assumed_at < self.assume_ttl:
                continue
            pod = self.pods.get(holding.namespace, holding.name)
            with self.ledger.lock:
                if self.ledger.holding(holding.uid) is not holding:
                    continue
                if pod is None or pod_key(pod)[0] != holding.uid:
                    self.ledger.drop(holding.uid)
                else:
                    self.apply(pod, None)
                settled += 1
        return settled


def unbound(pod: Mapping[str, Any]) -> bool:
    """Not bound to a node yet: the pods that may be waiting in the queue."""
    return not (pod.get("spec") or {}).get("nodeName")


def _older(pod: Mapping[str, Any], holding: Holding) -> bool:
    """Whether this pod version predates the PATCH that wrote the assumed claim."""
    rv = resource_version(pod)
    return rv is not None and holding.min_resource_version is not None and rv < holding.min_resource_version
