"""A share request in the simulated cluster: re-create the notebook pod with new limits.

The demo's lab selects it with ``c.VGPUSettings.requester_class =
"vgpu_plugin.demo.requester.KubeRecreateRequester"``; it needs a kubeconfig
(``c.VGPUSettings.kubeconfig`` or $JUPYTER_VGPU_KUBECONFIG) and the pod's name.

Make before break: a new pod (same spec, new vGPU limits) is created first and
watched until the device plugin has served it (``gpu-assigned: "true"`` and the
allocation record) or the scheduler gives up on it; only then is the old pod deleted.
A refusal leaves the user on their current share. ``kubernetes`` is imported lazily.

Where the extender's queue is given ($VGPU_DEMO_QUEUE_URL, the token in the file
$VGPU_DEMO_QUEUE_TOKEN_FILE: the simulated cluster's single-user lab, whose kubeconfig
already reads every pod), a new pod the scheduler cannot place waits in the queue instead
of failing: ``waiting()`` says its position, why and what fits now (the extender's
one-pod answer, no other pod named), and ``withdraw()`` deletes it so the user can ask
for that share instead.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from jupyter_vgpu.core import contract
from jupyter_vgpu.requesters.base import (
    Outcome,
    Progress,
    Requester,
    RequesterSettings,
    RequesterUnavailable,
    ShareRequest,
    Waiting,
    describe_share,
    waiting_from_queue,
)

ENV_QUEUE_URL = "VGPU_DEMO_QUEUE_URL"
ENV_QUEUE_TOKEN_FILE = "VGPU_DEMO_QUEUE_TOKEN_FILE"
ENV_SHARE_REQUEST = "VGPU_DEMO_SHARE_REQUEST"
"""The request that re-created the pod (JSON), in its notebook container's environment: it informs
only that container, so no annotation the admission policy keeps for the stack's accounts is
needed (docs/security.md, I2)."""
WITHDRAWN = "withdrawn: you asked for another share instead"

_GENERATION = re.compile(r"^(.*)-v([0-9]+)\Z")


def next_pod_name(name: str) -> str:
    """'nb' -> 'nb-v2', 'nb-v2' -> 'nb-v3' (names stay valid DNS labels)."""
    match = _GENERATION.match(name)
    base, generation = (match.group(1), int(match.group(2))) if match else (name, 1)
    suffix = f"-v{generation + 1}"
    return base[: 63 - len(suffix)] + suffix


class KubeRecreateRequester(Requester):
    name = "kubernetes"

    def __init__(self, kubeconfig: str, namespace: str, pod: str, container: str | None = None, *,
                 names: contract.Names = contract.DEFAULT_NAMES, timeout: float = 300.0,
                 poll_interval: float = 0.5, retire_delay: float = 3.0, unschedulable_grace: float = 5.0,
                 queue_url: str = "", queue_token_file: str = "", recorded_request: str = "") -> None:
        self.kubeconfig = kubeconfig
        self.recorded_request = recorded_request  # ENV_SHARE_REQUEST of the pod this server runs in
        self.namespace = namespace
        self.pod = pod
        self.container = container
        self.names = names
        self._timeout = timeout
        self._poll = poll_interval
        self._retire_delay = retire_delay
        self._unschedulable_grace = unschedulable_grace
        self.queue_url = queue_url.rstrip("/")
        self._queue_token_file = queue_token_file
        self._pending: str | None = None  # the new pod while it waits for the scheduler
        self._withdrawn = threading.Event()

    @classmethod
    def from_settings(cls, settings: RequesterSettings) -> KubeRecreateRequester:
        kubeconfig = settings.kubeconfig or settings.environ.get(contract.ENV_NOTEBOOK_KUBECONFIG, "")
        requester = cls.from_environ(kubeconfig, settings.environ, timeout=settings.timeout)
        if requester is None:
            raise RequesterUnavailable(
                f"Kubernetes requests are configured but there is no kubeconfig (${contract.ENV_NOTEBOOK_KUBECONFIG}) "
                f"or pod name (${contract.ENV_POD_NAME})")
        return requester

    @classmethod
    def from_environ(cls, kubeconfig: str, environ: Mapping[str, str], **kwargs: Any) -> KubeRecreateRequester | None:
        pod = environ.get(contract.ENV_POD_NAME) or environ.get("HOSTNAME")
        namespace = environ.get(contract.ENV_POD_NAMESPACE) or "default"
        if not (kubeconfig and pod):
            return None
        return cls(kubeconfig, namespace, pod, environ.get(contract.ENV_CONTAINER) or None,
                   queue_url=environ.get(ENV_QUEUE_URL, ""), queue_token_file=environ.get(ENV_QUEUE_TOKEN_FILE, ""),
                   recorded_request=environ.get(ENV_SHARE_REQUEST, ""), **kwargs)

    def _api(self) -> Any:
        from kubernetes import client, config

        api_client = config.new_client_from_config(config_file=self.kubeconfig)
        return client.CoreV1Api(api_client)

    def new_pod(self, old: dict[str, Any], cores: int, memory_units: int) -> dict[str, Any]:
        """The old pod's spec with the new limits, without anything the old placement wrote (the
        cards, the MIG slice, the record); what the user asked for, isolation too, is kept."""
        names = self.names
        metadata = old.get("metadata") or {}
        annotations = {
            k: v for k, v in (metadata.get("annotations") or {}).items()
            if not (k.startswith((names.predicate_gpu_idx_prefix, names.mig_slice_prefix))
                    or k in (names.predicate_node, names.predicate_time, names.gpu_assigned, names.allocation,
                             names.share_request))
        }
        spec = copy.deepcopy(old.get("spec") or {})
        for key in ("nodeName",):
            spec.pop(key, None)
        containers = spec.get("containers") or []
        if not containers:
            raise ValueError(f"pod {self.namespace}/{self.pod} has no containers")
        target = containers[self.container_index(spec)]
        resources = target.setdefault("resources", {})
        for key in ("limits", "requests"):
            values = {k: v for k, v in (resources.get(key) or {}).items() if k not in names.resources}
            if cores:
                values.update(contract.request_limits(contract.Request(cores, memory_units), names))
            resources[key] = values
        if cores:
            spec.setdefault("schedulerName", contract.SCHEDULER_NAME)
        # so the server in the new pod can tell its user what happened
        env = [e for e in target.get("env") or [] if e.get("name") != ENV_SHARE_REQUEST]
        asked = {"from": self.pod, "cores": cores, "memoryUnits": memory_units, "at": time.time(),
                 **({"id": self.request_id} if self.request_id else {})}  # the new server answers by that id
        target["env"] = [*env, {"name": ENV_SHARE_REQUEST, "value": json.dumps(asked, separators=(",", ":"))}]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": next_pod_name(self.pod),
                "namespace": self.namespace,
                "labels": dict(metadata.get("labels") or {}),
                "annotations": annotations,
            },
            "spec": spec,
        }

    def container_index(self, spec: Mapping[str, Any]) -> int:
        """Index of the notebook container (VGPU_CONTAINER, else the first)."""
        names = [c.get("name") for c in spec.get("containers") or []]
        return names.index(self.container) if self.container in names else 0

    def request(self, cores: int, memory_units: int, progress: Progress) -> Outcome:
        from kubernetes.client.exceptions import ApiException

        api = self._api()
        try:
            progress(f"reading pod {self.namespace}/{self.pod}")
            old = api.api_client.sanitize_for_serialization(api.read_namespaced_pod(self.pod, self.namespace))
            body = self.new_pod(old, cores, memory_units)
            new_name = body["metadata"]["name"]
            progress(f"creating pod {new_name} with {describe_share(cores, memory_units)}")
            self._withdrawn.clear()
            api.create_namespaced_pod(self.namespace, body)
            index = self.container_index(body["spec"])
            self._pending = new_name
            try:
                outcome = self._watch(api, new_name, index, cores > 0, progress)
            finally:
                self._pending = None
            if outcome.state != "scheduled":
                api.delete_namespaced_pod(new_name, self.namespace)
                return outcome
            # the caller records the outcome first; the old pod (this one) goes a little later
            threading.Timer(self._retire_delay, self._retire, args=(self.pod,)).start()
            self.pod = new_name
            return outcome
        except ApiException as error:
            return Outcome("failed", f"the Kubernetes API refused: {error.status} {error.reason}: "
                                     f"{_api_message(error)}")

    def waiting(self) -> Waiting | None:
        """The pending new pod's place in the extender's queue (its own entry only)."""
        pending = self._pending
        if pending is None or not self.queue_url:
            return None
        try:
            with open(self._queue_token_file, encoding="utf-8") as handle:
                token = handle.read().strip()
        except OSError:
            return None
        query = urllib.parse.urlencode({"namespace": self.namespace, "pod": pending})
        request = urllib.request.Request(f"{self.queue_url}/queue?{query}",
                                         headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return waiting_from_queue(json.loads(response.read()))
        except (OSError, ValueError):
            return None

    def withdraw(self) -> bool:
        if self._pending is None:
            return False
        self._withdrawn.set()
        return True

    def _retire(self, name: str) -> None:
        try:
            self._api().delete_namespaced_pod(name, self.namespace)
        except Exception:  # noqa: BLE001,S110 - the pod may already be gone; nothing to tell anyone
            pass

    def recover(self) -> ShareRequest | None:
        """In a re-created pod: the request that created it, and where its share landed."""
        try:
            asked = json.loads(self.recorded_request) if self.recorded_request else None
        except ValueError:
            return None
        if not isinstance(asked, dict):
            return None
        try:
            api = self._api()
            pod = api.api_client.sanitize_for_serialization(api.read_namespaced_pod(self.pod, self.namespace))
        except Exception:  # noqa: BLE001 - nothing to recover is the answer when the API cannot tell
            return None
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        index = self.container_index(pod.get("spec") or {})
        record = annotations.get(self.names.allocation)
        if record:
            outcome = self._scheduled(self.pod, index, record)
        else:
            node = (pod.get("spec") or {}).get("nodeName")
            outcome = Outcome("scheduled", f"pod {self.pod} runs on {node} without a GPU; the share is released",
                              node=node)
        request = ShareRequest(id=str(asked.get("id") or f"pod-{self.pod}"), cores=int(asked.get("cores") or 0),
                               memoryUnits=int(asked.get("memoryUnits") or 0), state="scheduled",
                               message=outcome.message, node=outcome.node, cards=list(outcome.cards),
                               created=float(asked.get("at") or time.time()))
        request.progress = [f"re-created from pod {asked.get('from')}", outcome.message]
        return request

    def _watch(self, api: Any, name: str, index: int, wants_gpu: bool, progress: Progress) -> Outcome:
        """Until the device plugin has served the new pod, or the scheduler keeps refusing it."""
        names = self.names
        deadline = time.monotonic() + self._timeout
        refused_since: float | None = None
        said = ""
        while time.monotonic() < deadline:
            if self._withdrawn.is_set():
                return Outcome("failed", WITHDRAWN)
            pod = api.api_client.sanitize_for_serialization(api.read_namespaced_pod(name, self.namespace))
            metadata = pod.get("metadata") or {}
            annotations = metadata.get("annotations") or {}
            node = (pod.get("spec") or {}).get("nodeName")
            if wants_gpu and annotations.get(names.gpu_assigned) == "true" and names.allocation in annotations:
                return self._scheduled(name, index, annotations[names.allocation])
            if not wants_gpu and node:
                return Outcome("scheduled", f"pod {name} runs on {node} without a GPU; the share is released",
                               node=node)
            refusal = None if node else self._refusal(api, pod)
            if refusal is None:
                refused_since = None
                now = f"pod {name}: " + (f"bound to {node}, waiting for the device plugin" if node
                                         else "waiting for the scheduler")
            else:
                refused_since = refused_since or time.monotonic()
                # with the queue to show, the user waits and sees where they stand (or withdraws)
                if not self.queue_url and time.monotonic() - refused_since >= self._unschedulable_grace:
                    return Outcome("failed", f"no node can take {name}'s share: {refusal}")
                now = f"pod {name}: the scheduler cannot place it yet: {refusal}"
            if now != said:
                progress(now)
                said = now
            self._withdrawn.wait(self._poll)
        return Outcome("failed", f"pod {name} was not scheduled within {self._timeout:.0f} s")

    def _refusal(self, api: Any, pod: dict[str, Any]) -> str | None:
        """Why the scheduler could not place the pod: its PodScheduled condition or latest FailedScheduling event."""
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False" \
                    and condition.get("reason") == "Unschedulable":
                return str(condition.get("message") or "unschedulable")
        uid = (pod.get("metadata") or {}).get("uid")
        events = api.api_client.sanitize_for_serialization(api.list_namespaced_event(self.namespace)).get("items") or []
        failures = [e for e in events if (e.get("involvedObject") or {}).get("uid") == uid
                    and e.get("reason") == "FailedScheduling"]
        if not failures:
            return None
        latest = max(failures, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
        return str(latest.get("message") or "FailedScheduling")

    def _scheduled(self, name: str, index: int, record: str) -> Outcome:
        allocation = contract.PodAllocation.from_json(record)
        container = allocation.container(index)
        cards = [{"index": s.index, "uuid": s.uuid, "cores": s.cores, "memoryMib": s.memory_mib}
                 for s in (container.cards if container else ())]
        where = ", ".join(f"card {c['index']} ({c['uuid']})" for c in cards) or "no card"
        return Outcome("scheduled", f"pod {name} was scheduled on {allocation.node}, {where}",
                       node=allocation.node, cards=cards)


def _api_message(error: Any) -> str:
    try:
        return str(json.loads(error.body).get("message"))
    except (TypeError, ValueError, AttributeError):
        return str(error.body)[:200]
