"""What tests, benchmarks and the demo do with a cluster, simulated (``SimCluster``) or real
(``realkube.RealCluster``): make notebook pods as the Hub's profiles do, read them, and wait
for them, through the official client."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from simkube import waiting

from jupyter_vgpu.core import contract as c

from .errors import ClusterError


class ClusterWorkloads:
    """Mixed into a cluster that has ``names``, ``ready_timeout`` and ``api_client()``."""

    names: c.Names
    ready_timeout: float

    def api_client(self) -> Any:
        raise NotImplementedError

    @property
    def core_v1(self) -> Any:
        import kubernetes.client

        return kubernetes.client.CoreV1Api(self.api_client())

    def notebook_pod(self, name: str, *, cores: int, memory: str | int | None = None,
                     namespace: str = "default",
                     command: Sequence[str] | None = None, env: Mapping[str, str] | None = None,
                     labels: Mapping[str, str] | None = None, annotations: Mapping[str, str] | None = None,
                     scheduler_name: str = c.SCHEDULER_NAME) -> dict[str, Any]:
        """A pod asking for a vGPU share the way the Hub's profiles do (limits + vgpu-scheduler)."""
        request = c.Request(cores, 0 if memory is None else c.parse_memory_size(memory))  # RequestError if invalid
        container: dict[str, Any] = {"name": "notebook", "image": "jupyter/base-notebook",
                                     "resources": {"limits": c.request_limits(request, self.names)}}
        if command:
            container["command"] = list(command)
        if env:
            container["env"] = [{"name": k, "value": v} for k, v in env.items()]
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {}),
                             "annotations": dict(annotations or {})},
                "spec": {"schedulerName": scheduler_name, "containers": [container]}}

    def create_notebook_pod(self, name: str, **kwargs: Any) -> dict[str, Any]:
        body = self.notebook_pod(name, **kwargs)
        response = self.core_v1.create_namespaced_pod(body["metadata"]["namespace"], body, _preload_content=False)
        return json.loads(response.data)

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return json.loads(self.core_v1.read_namespaced_pod(name, namespace, _preload_content=False).data)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def wait_for_pod(self, namespace: str, name: str, *, phase: str = "Running",
                     timeout: float | None = None) -> dict[str, Any]:
        """The pod once it reaches ``phase``; a pod that Failed instead raises with its message."""
        def reached() -> dict[str, Any] | None:
            pod = self.read_pod(namespace, name)
            current = ((pod or {}).get("status") or {}).get("phase")
            if current == "Failed" and phase != "Failed":
                raise ClusterError(f"pod {namespace}/{name} failed: {pod['status'].get('message', '')}")
            return pod if current == phase else None

        return self.wait_for(reached, timeout=timeout, what=f"pod {namespace}/{name} to be {phase}")

    def wait_for(self, condition: Callable[[], Any], *, timeout: float | None = None, interval: float = 0.05,
                 what: str = "a condition") -> Any:
        return waiting.wait_for(condition, timeout=timeout if timeout is not None else self.ready_timeout,
                                interval=interval, what=what, error=ClusterError)
