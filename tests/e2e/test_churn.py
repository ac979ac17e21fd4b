"""Hundreds of notebook pods arriving and leaving at once over four simulated GPU nodes.

While they churn, a watcher checks after every pod event that the allocation records
(pod annotations) never hold more of a card than it has nor name one MIG slice twice, and a
poller checks the extender's ledger and every device plugin the same way. Card 0 of c-nv4 is
in MIG mode (3 x 2g.10gb + 1g.5gb); a tenth of the share pods ask for isolation. Afterwards the extender's ledger
(in-process and /inspect), the pod annotations, the device plugins' view and the kubelet
stand-ins' accounting and checkpoints all agree. The fault test restarts the extender, a
device plugin and a kubelet stand-in in the middle of the churn.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from e2e_support import (
    NAMES,
    AnnotationTally,
    allocation,
    create_pod,
    delete_pod,
    device_counts,
    holdings_from_annotations,
    inspect_cards,
    inventory,
    list_pods,
    overcommitted,
    pod_body,
)
from simkube.waiting import wait_for

from jupyter_vgpu.core import contract as c

pytestmark = pytest.mark.slow

CHURN = "vgpu.jupyter.org/churn"
NODES = (("c-dgx", "dgx-a100.txt", 40960), ("c-p40", "p40-7gpu-pix-phb.txt", 24576),
         ("c-nv4", "a100-sxm-4gpu-nv4.txt", 40960), ("c-pcie", "a100-pcie-4gpu-2numa.txt", 40960))
MIG = {"c-nv4": {0: ("2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb")}}


@pytest.fixture
def churn_cluster(topology_fixtures: Any) -> Iterator[Any]:
    from vgpu_plugin.demo.cluster import NodeSpec, SimCluster

    specs = [NodeSpec(name, fixture, memory_mib=memory, seed=i, mig=MIG.get(name, {}))
             for i, (name, fixture, memory) in enumerate(NODES)]
    with SimCluster(specs, fixtures_dir=topology_fixtures, metrics_period=2.0, ready_timeout=90) as sim:
        yield sim


class Watcher:
    """Checks the invariant continuously: on every pod event (annotations) and every 50 ms
    (the extender's ledger, each device plugin's usage)."""

    def __init__(self, cluster: Any) -> None:
        from vgpu_plugin.informer import Informer

        self.cluster = cluster
        self.capacity = {(node, card.index): card.memory_units
                         for node in cluster.nodes for card in inventory(cluster, node).cards}
        self.violations: list[str] = []
        self.events = 0
        self.checks = 0
        self.failed: dict[str, tuple[str, str]] = {}  # pod -> (node, message)
        self.slices_seen: set[str] = set()  # MIG slices some pod was placed on
        self.tally = AnnotationTally(self.capacity)  # what the annotations hold, pod by pod
        self._stop = threading.Event()
        self._informer = Informer(cluster.core_v1.list_pod_for_all_namespaces, label_selector=CHURN,
                                  on_event=self._on_event)
        self._informer.name = "invariant-watcher"  # its thread's name (bench_storm --thread-cpu)
        self._poller = threading.Thread(target=self._poll, daemon=True)

    def start(self) -> Watcher:
        self._informer.start()
        assert self._informer.wait_synced(30)
        self._poller.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._poller.join(10)
        self._informer.stop()

    def _on_event(self, kind: str, pod: dict[str, Any] | None) -> None:
        self.events += 1
        if pod is not None and (pod.get("status") or {}).get("phase") == "Failed":
            self.failed[pod["metadata"]["name"]] = (pod["spec"].get("nodeName", ""), pod["status"].get("message", ""))
        if pod is None:
            return  # RELISTED: the differences came as events before it
        problems, twice = self.tally.update(pod["metadata"].get("uid", ""), None if kind == "DELETED" else pod)
        self.violations += [f"annotations after {kind}: {p}" for p in problems + twice]
        self.slices_seen.update(self.tally.slices)

    def _poll(self) -> None:
        while not self._stop.wait(0.05):
            self.checks += 1
            extender = self.cluster.extender
            if extender is not None and extender.ledger is not None:
                self.violations += [f"extender ledger: {p}" for p in extender.ledger.overcommitted()]
            # every running device plugin's usage and served containers (one request per node process)
            for name, (held_by_card, served_by_key) in self.cluster.device_plugin_readings().items():
                usage = {(name, card): held for card, held in held_by_card.items()}
                self.violations += [f"device plugin: {p}" for p in overcommitted(usage, self.capacity)]
                served = Counter(s.mig_device for entry in served_by_key.values()
                                 for s in entry.allocation.cards if s.mig_device)
                self.violations += [f"device plugin on {name}: MIG slice {s} served {n} times"
                                    for s, n in served.items() if n > 1]
            extender = self.cluster.extender
            if extender is not None and extender.ledger is not None:
                self.violations += [f"extender ledger on {node}: MIG slice {s} held {n} times"
                                    for node, s, n in extender.ledger.slices_held_more_than_once()]


def _random_share(rng: random.Random) -> tuple[int, int | None]:
    roll = rng.random()
    if roll < 0.72:
        return rng.choice((10, 20, 25, 30, 50, 75)), rng.randint(2, 40)
    if roll < 0.92:
        return 100, None
    return 200, None


def _churn(cluster: Any, count: int, stay: int, seed: int, workers: int = 12,
           midway: Callable[[], None] | None = None) -> list[str]:
    """``count`` pods created, held a little and deleted by ``workers`` threads; the last ``stay``
    are kept. ``midway`` runs once a third of the pods have been created. The kept pods' names."""
    rng = random.Random(seed)
    plan = [(f"nb-{seed}-{i:03d}", *_random_share(rng), rng.uniform(0.1, 1.2), i >= count - stay, rng.random() < 0.1)
            for i in range(count)]
    started = threading.Semaphore(0)
    errors: list[BaseException] = []

    def run(name: str, cores: int, memory: int | None, hold: float, keep: bool, isolated: bool) -> None:
        try:
            body = pod_body(cluster, name, cores, memory, labels={CHURN: "true"})
            if isolated and cores < 100:  # only a MIG slice will do
                body["metadata"]["annotations"] = {NAMES.isolation: "mig"}
            create_pod(cluster, body)
            started.release()
            with contextlib.suppress(TimeoutError):  # a pod may wait for room: hold it anyway
                wait_for(lambda: ((cluster.read_pod("default", name) or {}).get("status") or {}).get("phase")
                         in ("Running", "Failed"), timeout=8, interval=0.1, what=f"{name} to run or fail")
            if not keep:
                time.sleep(hold)
                delete_pod(cluster, "default", name)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    def trigger() -> None:
        for _ in range(count // 3):
            started.acquire()
        if midway is not None:
            try:
                midway()
            except BaseException as error:  # noqa: BLE001 - reported by the test
                errors.append(error)

    fault = threading.Thread(target=trigger, daemon=True)
    fault.start()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda args: run(*args), plan))
    fault.join(120)
    assert not errors, errors[:3]
    return [name for name, _, _, _, keep, _ in plan if keep]


def _agreement(cluster: Any) -> dict[str, Any]:
    """Every component's view of who holds what, once the churn has settled."""
    pods = [p for p in list_pods(cluster, label_selector=CHURN) if (p.get("status") or {}).get("phase") == "Running"]
    annotated = holdings_from_annotations(pods)
    by_node: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in cluster.nodes}
    for pod in pods:
        by_node[pod["spec"]["nodeName"]][pod["metadata"]["uid"]] = pod

    views: dict[str, Any] = {"annotations": annotated}
    # the device plugin confirms each running pod's record once every container is served
    views["confirmed"] = all(p["metadata"]["annotations"].get(NAMES.gpu_assigned) == "true" for p in pods)
    claims = cluster.extender.ledger.claims()
    ledger: Counter[tuple[str, int]] = Counter()
    ledger_units: Counter[tuple[str, int]] = Counter()
    for node, holders in claims.items():
        for _, held in holders.items():
            for _, card, cores, units in held:
                ledger[(node, card)] += cores
                ledger_units[(node, card)] += units
    views["extender"] = {k: (ledger[k], ledger_units[k]) for k in ledger if ledger[k] or ledger_units[k]}
    views["extender pods"] = {node: set(holders) for node, holders in claims.items() if holders}
    views["inspect"] = {(node, i): _inspected(card)
                        for node in cluster.nodes for i, card in inspect_cards(cluster, node).items()
                        if _inspected(card) != (0, 0)}
    views["device plugin"] = {(node, card): held for node, n in cluster.nodes.items()
                              for card, held in n.daemon.allocator.usage().items() if held != (0, 0)}
    views["device plugin pods"] = {node: {uid for uid, _ in n.daemon.allocator.served()}
                                   for node, n in cluster.nodes.items() if n.daemon.allocator.served()}
    views["pods"] = {node: set(uids) for node, uids in by_node.items() if uids}
    kubelet_pods, kubelet_devices, expected_devices = {}, {}, {}
    for node, n in cluster.nodes.items():
        kubelet = n.kubelet
        admitted = {uid for uid in by_node[node] if kubelet.admitted(uid) is not None}
        known = {e.pod_uid for e in _checkpoint(n)}
        if known:
            kubelet_pods[node] = known
        assert admitted == set(by_node[node]), f"{node}: the kubelet stand-in has not admitted every running pod"
        for resource in NAMES.resources:
            in_use = kubelet.in_use(resource)
            checkpointed = {d for e in _checkpoint(n) if e.resource == resource for d in e.device_ids}
            assert in_use == checkpointed, f"{node} {resource}: kubelet accounting != its checkpoint"
            kubelet_devices[(node, resource)] = len(in_use)
            expected_devices[(node, resource)] = sum(
                c.parse_count(ctr["resources"]["limits"].get(resource, "0"), resource)
                for pod in by_node[node].values() for ctr in pod["spec"]["containers"])
        for uid, pod in by_node[node].items():  # each pod's device IDs: as many as it asked for
            counted = device_counts(d for ctr in kubelet.admitted(uid).containers for ids in ctr.devices.values()
                                    for d in ids)
            limits = pod["spec"]["containers"][0]["resources"]["limits"]
            assert sum(v for (_, kind), v in counted.items() if kind == "core") == int(limits[NAMES.core_resource])
    views["kubelet checkpoint pods"] = kubelet_pods
    views["kubelet devices"] = kubelet_devices
    views["expected devices"] = expected_devices
    return views


def _inspected(card: dict[str, Any]) -> tuple[int, int]:
    """(cores, memory units) held on a card as /inspect shows it: time-shared holders, plus what
    the holders of its MIG slices asked for (each slice is listed at its real size too)."""
    on_slices = [s["holder"] for s in card.get("slices") or [] if s["holder"]]
    return (card["cores"]["held"] + sum(h["askedCores"] for h in on_slices),
            (card["memoryMib"]["held"] + sum(h["askedMemoryMib"] for h in on_slices)) // c.MEMORY_UNIT_MIB)


def _checkpoint(node: Any) -> list[Any]:
    from vgpu_plugin.deviceplugin.checkpoint import read_checkpoint

    return list(read_checkpoint(node.kubelet.checkpoint_path))


def _settled(cluster: Any) -> dict[str, Any] | None:
    try:
        views = _agreement(cluster)
    except AssertionError:
        return None
    agree = (views["annotations"] == views["extender"] == views["inspect"] == views["device plugin"]
             and views["pods"] == views["extender pods"] == views["device plugin pods"] == views["kubelet checkpoint pods"]
             and views["kubelet devices"] == views["expected devices"]
             and views["confirmed"])
    return views if agree else None


def _check_after_churn(cluster: Any, watcher: Watcher, kept: list[str],
                       excusable: Callable[[str, str], bool] = lambda node, message: False) -> None:
    """``excusable(node, message)``: an admission failure the fault explains (the agreement
    check then also proves the failed pod holds nothing anywhere)."""
    # deleted pods are gone everywhere, kept ones run (or wait for room, never half-placed)
    wait_for(lambda: {p["metadata"]["name"] for p in list_pods(cluster, label_selector=CHURN)} <= set(kept),
             timeout=60, what="deleted pods to go")
    wait_for(lambda: [p for p in list_pods(cluster, label_selector=CHURN) if p["status"].get("phase") == "Running"],
             timeout=60, what="kept pods to run")
    try:
        views = wait_for(lambda: _settled(cluster), timeout=90, what="every component to agree", interval=0.5)
    except TimeoutError:
        raise AssertionError(f"the components disagree: {_agreement(cluster)}") from None
    running = [p for p in list_pods(cluster, label_selector=CHURN) if p["status"].get("phase") == "Running"]
    assert views["annotations"], "some kept pods must hold shares, or the comparison says nothing"
    assert len(running) >= len(kept) // 2, f"only {len(running)} of {len(kept)} kept pods run"
    for pod in running:
        assert pod["metadata"]["annotations"][NAMES.gpu_assigned] == "true"
        assert allocation(pod) is not None
    assert watcher.violations == [], watcher.violations[:10]
    unexplained = {name: why for name, why in watcher.failed.items() if not excusable(*why)}
    assert unexplained == {}, dict(list(unexplained.items())[:5])
    assert watcher.events > 500 and watcher.checks > 50, (watcher.events, watcher.checks)
    assert len(watcher.slices_seen) >= 2, "isolated pods must have held slices, or the slice check says nothing"


def test_churn_keeps_every_view_in_agreement(churn_cluster: Any) -> None:
    watcher = Watcher(churn_cluster).start()
    try:
        kept = _churn(churn_cluster, count=300, stay=40, seed=1)
        _check_after_churn(churn_cluster, watcher, kept)
    finally:
        watcher.stop()


def test_restarts_during_churn_lose_nothing_and_double_allocate_nothing(churn_cluster: Any) -> None:
    cluster = churn_cluster
    watcher = Watcher(cluster).start()
    restarted: list[str] = []

    def faults() -> None:
        # pods placed before the faults must keep their cards through them
        before = {p["metadata"]["uid"]: allocation(p) for p in list_pods(cluster, label_selector=CHURN)
                  if p["metadata"].get("annotations", {}).get(NAMES.gpu_assigned) == "true"}
        cluster.restart_extender()
        restarted.append("extender")
        cluster.restart_daemon("c-dgx")
        restarted.append("device plugin on c-dgx")
        cluster.restart_kubelet("c-p40")
        restarted.append("kubelet on c-p40")
        for pod in list_pods(cluster, label_selector=CHURN):
            uid = pod["metadata"]["uid"]
            if uid in before and (pod.get("status") or {}).get("phase") == "Running":
                record = allocation(pod)
                assert record is not None and record.node == before[uid].node, f"{uid} lost its allocation"

    try:
        kept = _churn(cluster, count=180, stay=30, seed=2, midway=faults)
        assert restarted == ["extender", "device plugin on c-dgx", "kubelet on c-p40"]
        # As with the real kubelet, a pod admitted in the instant the device plugin's socket is
        # gone but its stream not yet seen closed fails admission (UnexpectedAdmissionError);
        # such a pod must then hold nothing anywhere, which the agreement check proves.
        _check_after_churn(cluster, watcher, kept, excusable=lambda node, message: node == "c-dgx"
                           and "Allocate failed" in message and "UNAVAILABLE" in message)
        # after the restarts, new pods still place, allocate and run
        create_pod(cluster, pod_body(cluster, "after-faults", 10, 4, labels={CHURN: "true"}))
        cluster.wait_for_pod("default", "after-faults", timeout=60)
    finally:
        watcher.stop()


def test_the_invariant_check_sees_an_overcommitted_card() -> None:
    """The watcher's check is not vacuous: two records sharing card 0 beyond 100 % are caught."""
    def pod(name: str, cores: int, units: int) -> dict[str, Any]:
        record = c.PodAllocation("n1", (c.ContainerAllocation(0, "nb", (c.CardShare(0, "GPU-0", cores, units),)),))
        return {"metadata": {"name": name, "annotations": {NAMES.allocation: record.to_json()}},
                "status": {"phase": "Running"}}

    capacity = {("n1", 0): 160}
    assert overcommitted(holdings_from_annotations([pod("a", 60, 40), pod("b", 40, 120)]), capacity) == []
    assert overcommitted(holdings_from_annotations([pod("a", 60, 40), pod("b", 50, 10)]), capacity) == [
        "n1 card 0: 110 cores, 50/160 memory units"]
    assert overcommitted(holdings_from_annotations([pod("a", 10, 100), pod("b", 10, 61)]), capacity)
    finished = {**pod("b", 90, 10), "status": {"phase": "Succeeded"}}
    assert overcommitted(holdings_from_annotations([pod("a", 60, 40), finished]), capacity) == []


def test_the_incremental_tally_is_the_full_recount_after_every_event() -> None:
    """The watcher's pod-by-pod tally (AnnotationTally) against recounting every pod after every
    event: the same holdings and slice counts, and exactly the full recount's problems on the
    cards the event touched (the others were checked when they last changed)."""
    rng = random.Random(7)
    capacity = {(node, card): 160 for node in ("n1", "n2") for card in (0, 1)}
    tally = AnnotationTally(capacity)
    pods: dict[str, dict[str, Any]] = {}
    reported_overcommit = reported_twice = 0
    for step in range(600):
        uid = f"u{rng.randrange(12)}"
        action = rng.choice(("put", "put", "put", "finish", "delete"))
        if action == "delete":
            gone = pods.pop(uid, None)
            problems, twice = tally.update(uid, None)
            touched = set(holdings_from_annotations([gone])) if gone else set()
        else:
            node, card = rng.choice(sorted(capacity))
            record = c.PodAllocation(node, (c.ContainerAllocation(0, "nb", (
                c.CardShare(card, f"GPU-{card}", rng.choice((10, 25, 50, 75)), rng.randint(1, 90)),)),))
            annotations = {NAMES.allocation: record.to_json()}
            if rng.random() < 0.3:
                annotations[NAMES.mig_slice(0)] = f"MIG-{node}-{rng.randrange(3)}"
            before = pods.get(uid)
            pods[uid] = {"metadata": {"uid": uid, "name": uid, "annotations": annotations},
                         "status": {"phase": "Succeeded" if action == "finish" else "Running"}}
            problems, twice = tally.update(uid, pods[uid])
            touched = set(holdings_from_annotations([p for p in (before, pods[uid]) if p]))  # live ones only
        full = holdings_from_annotations(pods.values())
        assert tally.held == full, step
        live = [p for p in pods.values() if p["status"]["phase"] == "Running"]
        named = Counter(v for p in live for k, v in p["metadata"]["annotations"].items()
                        if k.startswith(NAMES.mig_slice_prefix))
        assert +tally.slices == named, step
        assert problems == overcommitted({k: v for k, v in full.items() if k in touched}, capacity), step
        assert set(twice) <= {f"MIG slice {s} named by {n} pods" for s, n in named.items() if n > 1}, step
        reported_overcommit += len(problems)
        reported_twice += len(twice)
    assert reported_overcommit and reported_twice  # the sequence did make both mistakes, and they were seen
