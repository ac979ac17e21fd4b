"""Chosen pods' containers, run beside the real cluster as local processes.

Kubernetes' fake CRI runtime starts no process: it records the ContainerConfig kubelet sent
(``RealNode.containers``). The demo's notebook must run all the same, and with exactly what
kubelet gave its container: the command, the arguments, the working directory and the
environment, the device plugin's Allocate answer included. ``ContainerRunner`` starts such a
process once kubelet has created the container and the API says the pod runs, and stops its
process group once the pod is being deleted, is gone, or kubelet removed the container, as a
runtime's StopContainer would. Nothing else of a container (mounts, devices, cgroups,
namespaces) is reproduced: the process runs as this machine's user, in this machine's
namespaces.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def record_env(config: dict[str, Any]) -> dict[str, str]:
    """The environment in a recorded CRI ContainerConfig (its ``KeyValue.value`` is bytes,
    which protojson writes in base64)."""
    return {e["key"]: base64.b64decode(e.get("value", "")).decode() for e in config.get("envs", [])}


@dataclass(frozen=True)
class ContainerKey:
    pod_uid: str
    container: str


@dataclass
class Started:
    namespace: str
    pod: str
    process: subprocess.Popen[bytes]
    log_path: Path


class ContainerRunner(threading.Thread):
    """Runs the containers of the pods in ``namespace`` matching ``label_selector``, on the
    cluster's nodes, every ``interval`` seconds: ``start()``, ``stop()``."""

    def __init__(self, cluster: Any, namespace: str, label_selector: str, log_dir: str | os.PathLike[str],
                 interval: float = 0.25) -> None:
        super().__init__(name="realkube-containers", daemon=True)
        self.cluster, self.namespace, self.label_selector = cluster, namespace, label_selector
        self.log_dir, self.interval = Path(log_dir), interval
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._running: dict[ContainerKey, Started] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(self.interval):
            try:
                self.sync()
            except Exception as error:  # noqa: BLE001 - the API restarting or stopping: try again next time
                log.debug("containers: %s", error)

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join(timeout)
        with self._lock:
            running, self._running = self._running, {}
        for started in running.values():
            _stop(started.process, timeout)

    def sync(self) -> None:
        """Start the containers that should run and are not; stop those that should not."""
        answer = self.cluster.core_v1.list_namespaced_pod(self.namespace, label_selector=self.label_selector,
                                                         _preload_content=False)
        pods = {pod["metadata"]["uid"]: pod for pod in json.loads(answer.data).get("items") or []}
        wanted: dict[ContainerKey, dict[str, Any]] = {}
        for record in self._records():
            pod = pods.get(record.get("podUid", ""))
            if pod is None or pod["metadata"].get("deletionTimestamp") or \
                    (pod.get("status") or {}).get("phase") != "Running":
                continue
            wanted[ContainerKey(pod["metadata"]["uid"], record["config"]["metadata"]["name"])] = record
        with self._lock:
            gone = [key for key in self._running if key not in wanted]
            stopped = [self._running.pop(key) for key in gone]
        for started in stopped:  # before starting others: a successor may want the same port
            log.info("containers: stopping %s/%s (pid %d)", started.namespace, started.pod, started.process.pid)
            _stop(started.process)
        for key, record in wanted.items():
            with self._lock:
                if key in self._running or self._stopping.is_set():
                    continue
                self._running[key] = self._start(record)

    def _records(self) -> Iterable[dict[str, Any]]:
        for node in self.cluster.nodes.values():
            for record in node.containers():
                if record.get("namespace") == self.namespace:
                    yield record

    def _start(self, record: dict[str, Any]) -> Started:
        config = record["config"]
        argv = [*config.get("command", []), *config.get("args", [])]
        path = self.log_path(record["namespace"], record["pod"], config["metadata"]["name"])
        env = {**os.environ, **record_env(config), "HOSTNAME": record["pod"]}
        with open(path, "ab") as output:
            process = subprocess.Popen(argv, env=env, cwd=config.get("workingDir") or None, stdout=output,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.info("containers: started %s for %s/%s as pid %d", argv[:1], record["namespace"], record["pod"],
                 process.pid)
        return Started(record["namespace"], record["pod"], process, path)

    def log_path(self, namespace: str, pod: str, container: str) -> Path:
        return self.log_dir / f"{namespace}_{pod}_{container}.log"

    def process(self, namespace: str, pod: str) -> subprocess.Popen[bytes] | None:
        """The process of the pod's container that runs here, if one does."""
        with self._lock:
            return next((s.process for s in self._running.values() if (s.namespace, s.pod) == (namespace, pod)), None)


def _stop(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM to the process group, SIGKILL after ``timeout`` (as kubelet's grace period)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout)
            return
        except subprocess.TimeoutExpired:
            continue
