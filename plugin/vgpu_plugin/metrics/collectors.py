"""Prometheus collectors over the sampler's latest snapshot (a scrape never touches the GPU).

``NodeCollector`` serves this project's series on ``/metrics``: per card (capacity, used,
utilisation, health, allocated shares), per container and card (request and usage), per GPU
process (including processes outside Kubernetes) and the sample's freshness.
``GpuManagerCollector`` serves TKEStack gpu-manager's series on ``/metric`` with its names,
labels and units (MiB; requested utilisation in cards), so existing dashboards keep working.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from jupyter_vgpu.core import contract as c

from .sampler import ContainerKey, Snapshot

MIB = 1024 * 1024


def _container_cards(snapshot: Snapshot) -> dict[ContainerKey, dict[int, tuple[int, int]]]:
    """Container -> card index -> (requested cores, held memory MiB), for held shares."""
    held: dict[ContainerKey, dict[int, tuple[int, int]]] = {}
    for holding in snapshot.pods.holdings():
        key = ContainerKey(holding.pod.uid, holding.container_index)
        held.setdefault(key, {})[holding.share.index] = (holding.share.cores, holding.memory_mib)
    return held


def _slice_metrics(snapshot: Snapshot, gauge: Callable[[str, str, tuple[str, ...]], GaugeMetricFamily]
                   ) -> tuple[GaugeMetricFamily, ...]:
    """Per MIG slice: memory, health, and utilisation only where measured (no series rather than a made-up 0)."""
    total = gauge(c.METRIC_SLICE_MEMORY_TOTAL, "Device memory of the MIG slice.", c.SLICE_LABELS)
    used = gauge(c.METRIC_SLICE_MEMORY_USED, "Device memory in use on the MIG slice.", c.SLICE_LABELS)
    util = gauge(c.METRIC_SLICE_UTILIZATION, "Compute utilisation of the MIG slice (0-100); absent where the "
                 "backend cannot measure it (NVML has none per MIG device: DCGM or GPM).", c.SLICE_LABELS)
    healthy = gauge(c.METRIC_SLICE_HEALTHY, "1 when the MIG slice is healthy, 0 when not.", c.SLICE_LABELS)
    profiles = {s.uuid: s.profile for view in snapshot.cards for s in getattr(view.card, "slices", ())}
    for sample in snapshot.slices:
        labels = [snapshot.node, str(sample.card_index), sample.uuid, profiles.get(sample.uuid, "")]
        total.add_metric(labels, sample.memory_total_mib * MIB)
        used.add_metric(labels, sample.memory_used_mib * MIB)
        if sample.utilization_percent is not None:
            util.add_metric(labels, sample.utilization_percent)
        healthy.add_metric(labels, 1.0 if sample.healthy else 0.0)
    return total, used, util, healthy


class NodeCollector(Collector):
    def __init__(self, snapshot: Callable[[], Snapshot], clock: Callable[[], float] = time.time) -> None:
        self._snapshot = snapshot
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self._snapshot()
        node = snapshot.node
        stale, _ = snapshot.staleness(self._clock())

        def gauge(name: str, doc: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=list(labels))

        total = gauge(c.METRIC_CARD_MEMORY_TOTAL, "Device memory of the card.", c.CARD_LABELS)
        used = gauge(c.METRIC_CARD_MEMORY_USED, "Device memory in use on the card.", c.CARD_LABELS)
        util = gauge(c.METRIC_CARD_UTILIZATION, "Compute utilisation of the card (0-100); absent for a card in "
                     "MIG mode (NVML has none: see the slices).", c.CARD_LABELS)
        healthy = gauge(c.METRIC_CARD_HEALTHY, "1 when the card is healthy, 0 when not.", c.CARD_LABELS)
        cores = gauge(c.METRIC_CARD_ALLOCATED_CORES, "vcuda-core units held on the card (100 = whole card).",
                      c.CARD_LABELS)
        memory = gauge(c.METRIC_CARD_ALLOCATED_MEMORY, "Device memory held by shares on the card.", c.CARD_LABELS)
        uuids = {}
        for view in snapshot.cards:
            card = view.card
            uuids[card.index] = card.uuid
            labels = [node, str(card.index), card.uuid, card.model]
            total.add_metric(labels, card.memory_mib * MIB)
            if view.memory_used_mib is not None:
                used.add_metric(labels, view.memory_used_mib * MIB)
            if view.utilization_percent is not None:
                util.add_metric(labels, view.utilization_percent)
            healthy.add_metric(labels, 1.0 if view.healthy else 0.0)
            cores.add_metric(labels, view.allocated_cores)
            memory.add_metric(labels, view.allocated_memory_mib * MIB)
        yield from (total, used, util, healthy, cores, memory)
        yield from _slice_metrics(snapshot, gauge)

        request_cores = gauge(c.METRIC_CONTAINER_REQUEST_CORES, "vcuda-core units the container holds on the card.",
                              c.CONTAINER_LABELS)
        request_memory = gauge(c.METRIC_CONTAINER_REQUEST_MEMORY, "Device memory the container holds on the card.",
                               c.CONTAINER_LABELS)
        c_used = gauge(c.METRIC_CONTAINER_MEMORY_USED, "Device memory the container's processes use on the card.",
                       c.CONTAINER_LABELS)
        c_util = gauge(c.METRIC_CONTAINER_UTILIZATION, "Compute the container's processes use on the card (0-100); "
                       "absent for a container on a MIG slice (not measurable through NVML).", c.CONTAINER_LABELS)
        held = _container_cards(snapshot)
        # a container on a MIG slice: NVML measures no compute per MIG device, so no series, not a 0
        on_slices = {(ContainerKey(h.pod.uid, h.container_index), h.share.index)
                     for h in snapshot.pods.holdings() if h.share.mig_device}
        keys = set(held) | set(snapshot.usage)
        for key in sorted(keys, key=lambda k: (k.pod_uid, k.index)):
            pod = snapshot.pods.by_uid(key.pod_uid)
            if pod is None:
                continue
            usage = snapshot.usage.get(key)
            measured = {u.index: u for u in usage.cards} if usage else {}
            shares = held.get(key, {})
            for index in sorted(set(shares) | set(measured)):
                labels = [node, pod.namespace, pod.name, pod.container_name(key.index), str(index),
                          uuids.get(index, "")]
                if index in shares:
                    request_cores.add_metric(labels, shares[index][0])
                    request_memory.add_metric(labels, shares[index][1] * MIB)
                card_usage = measured.get(index)
                c_used.add_metric(labels, card_usage.memory_used_mib * MIB if card_usage else 0.0)
                if (key, index) not in on_slices:
                    c_util.add_metric(labels, card_usage.utilization_percent if card_usage else 0.0)
        yield from (request_cores, request_memory, c_used, c_util)

        process = gauge(c.METRIC_PROCESS_MEMORY_USED,
                        "Device memory of each GPU process; empty pod labels for processes outside known pods.",
                        c.PROCESS_LABELS)
        for view in snapshot.processes:
            pod = view.pod
            process.add_metric(
                [node, str(view.card_index), view.uuid, str(view.pid),
                 pod.namespace if pod else "", pod.name if pod else "",
                 pod.container_name(view.container_index) if pod and view.container_index is not None else ""],
                view.memory_used_mib * MIB,
            )
        yield process

        stale_gauge = gauge(c.METRIC_SAMPLE_STALE, "1 when the GPU numbers are not fresh (see the JSON API message).",
                            ("node",))
        stale_gauge.add_metric([node], 1.0 if stale else 0.0)
        yield stale_gauge
        if snapshot.taken_at is not None:
            age = gauge(c.METRIC_SAMPLE_AGE, "Seconds since the GPU numbers were sampled.", ("node",))
            age.add_metric([node], max(0.0, self._clock() - snapshot.taken_at))
            yield age


class GpuManagerCollector(Collector):
    """gpu-manager's ``/metric`` series: usage per card (``gpu<i>``) and ``total``; requests as ``total``."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self._snapshot()
        node = snapshot.node
        labels = list(c.GM_LABELS)
        util = GaugeMetricFamily(c.METRIC_GM_CONTAINER_UTILIZATION, "gpu utilization",
                                 labels=labels + [c.GM_LABEL_UTILIZATION_GPU])
        memory = GaugeMetricFamily(c.METRIC_GM_CONTAINER_MEMORY_TOTAL, "gpu memory usage in MiB",
                                   labels=labels + [c.GM_LABEL_MEMORY_GPU])
        request_util = GaugeMetricFamily(c.METRIC_GM_CONTAINER_REQUEST_UTILIZATION, "request of gpu utilization",
                                         labels=labels + [c.GM_LABEL_REQUEST_UTILIZATION])
        request_memory = GaugeMetricFamily(c.METRIC_GM_CONTAINER_REQUEST_MEMORY, "request of gpu memory in MiB",
                                           labels=labels + [c.GM_LABEL_REQUEST_MEMORY])
        held = _container_cards(snapshot)
        for key in sorted(set(held) | set(snapshot.usage), key=lambda k: (k.pod_uid, k.index)):
            pod = snapshot.pods.by_uid(key.pod_uid)
            if pod is None:
                continue
            base = [pod.name, pod.namespace, node, pod.container_name(key.index)]
            usage = snapshot.usage.get(key)
            measured = {u.index: u for u in usage.cards} if usage else {}
            shares = held.get(key, {})
            for index in sorted(set(shares) | set(measured)):
                card_usage = measured.get(index)
                util.add_metric(base + [f"gpu{index}"], card_usage.utilization_percent if card_usage else 0.0)
                memory.add_metric(base + [f"gpu{index}"], card_usage.memory_used_mib if card_usage else 0.0)
            util.add_metric(base + ["total"], usage.utilization_percent if usage else 0.0)
            memory.add_metric(base + ["total"], usage.memory_used_mib if usage else 0.0)
            if shares:
                request_util.add_metric(base + ["total"], sum(s[0] for s in shares.values()) / c.CORES_PER_CARD)
                request_memory.add_metric(base + ["total"], sum(s[1] for s in shares.values()))
        yield from (util, memory, request_util, request_memory)
