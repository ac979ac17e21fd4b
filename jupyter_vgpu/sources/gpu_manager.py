"""Facts on a TKEStack gpu-manager node.

gpu-manager tells a container little: the cards come as ``NVIDIA_VISIBLE_DEVICES``, the
limits as vcuda-controller's binary ``/etc/vcuda/<id>/vcuda.config`` (its
``resource_data_t``), and live usage only through the node's Prometheus ``/metric`` with
labels ``pod_name, namespace, node, container_name``. gpu-manager keeps no history, so
this adapter records the points it has read.
"""

from __future__ import annotations

import glob
import http.client
import os
import re
import socket
import struct
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from jupyter_vgpu.core import contract
from jupyter_vgpu.sources.base import (
    FactSource,
    History,
    SourceSettings,
    allocation_answer,
    topology_answer,
    usage_answer,
)

# vcuda-controller's resource_data_t (packed): pod_uid[48], int limit, occupied[4044],
# container_name[FILENAME_MAX=4096], bus_id[16], uint64 gpu_memory (bytes),
# int utilization (percent of the card), int hard_limit, ...
_POD_UID = slice(0, 48)
_CONTAINER_NAME = slice(4096, 8192)
_BUS_ID = slice(8192, 8208)
_TAIL = struct.Struct("<Qii")  # gpu_memory, utilization, hard_limit at offset 8208
_TAIL_OFFSET = 8208
VCUDA_CONFIG_MIN_SIZE = _TAIL_OFFSET + _TAIL.size

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class VcudaConfig:
    pod_uid: str
    container_name: str
    bus_id: str
    memory_bytes: int
    utilization: int
    hard_limit: bool


def parse_vcuda_config(data: bytes) -> VcudaConfig:
    """Decode vcuda-controller's config file; ValueError says what is wrong."""
    if len(data) < VCUDA_CONFIG_MIN_SIZE:
        raise ValueError(f"vcuda.config is {len(data)} bytes, shorter than vcuda-controller's "
                         f"{VCUDA_CONFIG_MIN_SIZE}-byte resource_data_t")
    memory, utilization, hard = _TAIL.unpack_from(data, _TAIL_OFFSET)
    if not 0 <= utilization <= contract.CORES_PER_CARD:
        raise ValueError(f"vcuda.config utilization {utilization} is not a percentage")
    return VcudaConfig(
        pod_uid=_cstr(data[_POD_UID]),
        container_name=_cstr(data[_CONTAINER_NAME]),
        bus_id=_cstr(data[_BUS_ID]),
        memory_bytes=memory,
        utilization=utilization,
        hard_limit=bool(hard),
    )


def encode_vcuda_config(config: VcudaConfig) -> bytes:
    """The inverse of parse_vcuda_config (tests and the simulated cluster write these)."""
    data = bytearray(VCUDA_CONFIG_MIN_SIZE + 16)
    data[_POD_UID] = config.pod_uid.encode()[:47].ljust(48, b"\0")
    data[_CONTAINER_NAME] = config.container_name.encode()[:4095].ljust(4096, b"\0")
    data[_BUS_ID] = config.bus_id.encode()[:15].ljust(16, b"\0")
    _TAIL.pack_into(data, _TAIL_OFFSET, config.memory_bytes, config.utilization, int(config.hard_limit))
    return bytes(data)


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def vcuda_configs(directory: str) -> list[str]:
    """vcuda.config files gpu-manager mounted: <dir>/vcuda.config or <dir>/<id>/vcuda.config."""
    if not directory or not os.path.isdir(directory):
        return []
    name = contract.GM_VCUDA_CONFIG_NAME
    found = glob.glob(os.path.join(directory, name)) + glob.glob(os.path.join(directory, "*", name))
    return sorted(found)


# --- Prometheus text -------------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) for every sample line; comments and malformed lines are skipped."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(match.group(2) or "")}
        samples.append((match.group(1), labels, value))
    return samples


class GpuManagerSource(FactSource):
    name = "gpu-manager"

    @classmethod
    def detected(cls, settings: SourceSettings) -> bool:
        """gpu-manager mounted a vcuda.config into this container."""
        return bool(vcuda_configs(settings.vcuda_config_dir))

    def __init__(self, settings: SourceSettings) -> None:
        env = settings.environ
        self._settings = settings
        self._timeout = settings.timeout
        self.metric_url = settings.gpu_manager_metric_url or (
            f"http://{env['HOST_IP']}:{contract.DEFAULT_METRICS_PORT}/metric" if env.get("HOST_IP") else ""
        )
        self._pod = env.get("POD_NAME") or env.get("HOSTNAME") or socket.gethostname()
        self._namespace = env.get("POD_NAMESPACE") or _read_first_line(SERVICE_ACCOUNT_NAMESPACE)
        self._visible = [d for d in env.get(contract.ENV_NVIDIA_VISIBLE_DEVICES, "").split(",") if d]
        self._history = History(settings.history_limit)
        self._node: str | None = env.get("NODE_NAME") or None

    def _configs(self) -> tuple[list[VcudaConfig], list[str]]:
        configs, problems = [], []
        for path in vcuda_configs(self._settings.vcuda_config_dir):
            try:
                with open(path, "rb") as handle:
                    configs.append(parse_vcuda_config(handle.read()))
            except (OSError, ValueError) as error:
                problems.append(f"{path}: {error}")
        return configs, problems

    def allocation(self) -> dict[str, Any]:
        configs, problems = self._configs()
        if not configs:
            reason = "; ".join(problems) or f"no {contract.GM_VCUDA_CONFIG_NAME} under {self._settings.vcuda_config_dir}"
            return allocation_answer("none", self.name, None, f"gpu-manager gave this container no limits ({reason})")
        cards: list[dict[str, Any]] = []
        for i, config in enumerate(configs):
            device = self._visible[i] if i < len(self._visible) else None
            cards.append({
                "index": int(device) if device and device.isdigit() else None,
                "uuid": device if device and not device.isdigit() else None,
                "model": None,
                "busId": config.bus_id or None,
                "cores": config.utilization,
                "memoryMib": config.memory_bytes // (1024 * 1024),
                "memoryTotalMib": None,
            })
        first = configs[0]
        allocation = {
            "node": self._node,
            "namespace": self._namespace,
            "pod": self._pod,
            "podUid": first.pod_uid or None,
            "container": first.container_name or None,
            "cores": sum(c["cores"] for c in cards),
            "memoryMib": sum(c["memoryMib"] for c in cards),
            "enforcement": "vcuda" if first.hard_limit else "vcuda (soft limit)",
            "cards": cards,
        }
        return allocation_answer("allocated", self.name, allocation, "; ".join(problems) or None)

    def topology(self) -> dict[str, Any]:
        return topology_answer(
            "none", self.name, None,
            "gpu-manager does not publish the node's GPU topology to containers",
        )

    def _scrape(self) -> list[tuple[str, dict[str, str], float]]:
        if not self.metric_url:
            raise OSError("gpu-manager's /metric URL is unknown: set c.VGPUSettings.gpu_manager_metric_url "
                          "or give the container HOST_IP through the downward API")
        with urllib.request.urlopen(self.metric_url, timeout=self._timeout) as response:
            return parse_prometheus(response.read().decode("utf-8", "replace"))

    def usage(self, history_seconds: float = 0) -> dict[str, Any]:
        allocation = self.allocation().get("allocation")
        limits = {"cores": allocation["cores"], "memoryMib": allocation["memoryMib"]} if allocation else None
        container = allocation.get("container") if allocation else None
        try:
            samples = self._scrape()
        except (OSError, ValueError, http.client.HTTPException) as error:
            reason = getattr(error, "reason", error)
            return usage_answer("unreachable", self.name, limits=limits,
                                message=f"gpu-manager's metrics at {self.metric_url or '(unknown)'} are unreachable: {reason}",
                                history=self._history.since(history_seconds))
        mine = [
            (name, labels, value) for name, labels, value in samples
            if labels.get("pod_name") == self._pod
            and (self._namespace is None or labels.get("namespace") == self._namespace)
            and (container is None or labels.get("container_name") == container)
        ]
        utilization = _total(mine, contract.METRIC_GM_CONTAINER_UTILIZATION, contract.GM_LABEL_UTILIZATION_GPU)
        memory = _total(mine, contract.METRIC_GM_CONTAINER_MEMORY_TOTAL, contract.GM_LABEL_MEMORY_GPU)
        if utilization is None and memory is None:
            return usage_answer("stale", self.name, limits=limits,
                                message=f"gpu-manager reports no usage for pod {self._namespace}/{self._pod} yet",
                                history=self._history.since(history_seconds))
        for _, labels, _ in mine:
            self._node = self._node or labels.get("node")
        point = {"t": time.time(), "memoryUsedMib": memory or 0.0, "utilizationPercent": utilization or 0.0}
        self._history.add(point)
        return usage_answer("live", self.name, limits=limits, current=dict(point, cards=[]),
                            history=self._history.since(history_seconds))



def _total(samples: list[tuple[str, dict[str, str], float]], metric: str, series_label: str) -> float | None:
    """The 'total' series of a gpu-manager metric, else the sum of its per-card series."""
    values = [(labels.get(series_label), value) for name, labels, value in samples if name == metric]
    if not values:
        return None
    totals = [value for series, value in values if series == "total"]
    return totals[0] if totals else sum(value for _, value in values)


def _read_first_line(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.readline().strip() or None
    except OSError:
        return None
