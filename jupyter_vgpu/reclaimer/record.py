"""Every reclaim step on record: a Kubernetes Event on the pod, a log line, Prometheus counters.

The counters carry no user or pod names (the reclaimer's /metrics is for dashboards):
``vgpu_reclaimer_warnings_total{reason}``, ``vgpu_reclaimer_postpones_total``,
``vgpu_reclaimer_shares_reclaimed_total{reason,action}``,
``vgpu_reclaimer_gpu_hours_returned_total{reason}`` (cards held x quiet time, at reclaim),
``vgpu_reclaimer_dry_run_decisions_total{decision,reason}``,
``vgpu_reclaimer_pass_seconds`` (the last pass's duration) and
``vgpu_reclaimer_nodes_unreachable`` (nodes whose usage the last pass could not read).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import secrets
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger(__name__)

COMPONENT = "vgpu-reclaimer"
EVENT_WARNED = "VGPUIdleWarning"
EVENT_POSTPONED = "VGPUReclaimPostponed"
EVENT_CLEARED = "VGPUReclaimCleared"
EVENT_RECLAIMED = "VGPUReclaimed"


class Counters:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.warnings = Counter("vgpu_reclaimer_warnings", "Idle or hoarded shares warned", ["reason"],
                                registry=self.registry)
        self.postpones = Counter("vgpu_reclaimer_postpones", "Reclaims postponed by their users ('keep my GPU')",
                                 registry=self.registry)
        self.reclaimed = Counter("vgpu_reclaimer_shares_reclaimed", "vGPU shares reclaimed",
                                 ["reason", "action"], registry=self.registry)
        self.gpu_hours = Counter("vgpu_reclaimer_gpu_hours_returned",
                                 "Card-hours the reclaimed shares had held without computing", ["reason"],
                                 registry=self.registry)
        self.dry_run = Counter("vgpu_reclaimer_dry_run_decisions", "What a dry run would have done",
                               ["decision", "reason"], registry=self.registry)
        self.pass_seconds = Gauge("vgpu_reclaimer_pass_seconds", "Duration of the last pass",
                                  registry=self.registry)
        self.nodes_unreachable = Gauge("vgpu_reclaimer_nodes_unreachable",
                                       "Nodes whose usage the last pass could not read", registry=self.registry)


class EventRecorder:
    """core/v1 Events on the notebook pods, through the official client (imported lazily).

    ``api_client`` None: no events (a reclaimer without Kubernetes credentials), logged once.
    """

    def __init__(self, api_client: Any | None) -> None:
        self._api: Any = None
        if api_client is not None:
            from kubernetes import client

            self._api = client.CoreV1Api(api_client)
        else:
            log.warning("no Kubernetes credentials: reclaim steps are not recorded as pod Events")

    def _create(self, namespace: str, pod: str, uid: str, reason: str, message: str, warning: bool) -> None:
        now = datetime.datetime.now(datetime.timezone.utc)
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{pod}.{secrets.token_hex(8)}", "namespace": namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": namespace, "uid": uid},
            "reason": reason, "message": message, "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        self._api.create_namespaced_event(namespace, body)

    async def event(self, namespace: str, pod: str, uid: str, reason: str, message: str,
                    warning: bool = False) -> None:
        """Record an Event; a failure is logged, never raised (the step itself stands)."""
        if self._api is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, self._create, namespace, pod, uid, reason, message, warning)
        except Exception as error:  # the API server's refusal must not stop a reclaim
            log.warning("could not record event %s on pod %s/%s: %s", reason, namespace, pod, error)
