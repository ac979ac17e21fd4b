"""Restarts under load on real Kubernetes: during a storm of notebook creations and deletions,
the kubelet, the node daemon, the extender and kube-scheduler are each killed (SIGKILL, as a
crash or an OOM kill) and come back. Afterwards no card is over-committed, every surviving
pod that fits is Running with its record confirmed, and kubelet's checkpoint holds exactly the
devices of the pods that run. The simulated cluster's tests/e2e/test_churn.py does the same
with the stand-ins, plus faults only a stand-in can inject (a dropped watch, an API restart).
"""

from __future__ import annotations

import collections
import random
import time
from typing import Any

import pytest
from realkube_support import GPU_A, GPU_B, OvercommitWatcher, annotations, held
from simkube.waiting import wait_for
from vgpu_plugin.deviceplugin.checkpoint import read_checkpoint

from jupyter_vgpu.core import contract as c

pytestmark = pytest.mark.slow

NAMESPACE = "storm"
SHARES = [(10, "2GiB"), (25, "4GiB"), (50, "8GiB"), (25, "10GiB"), (100, None)]
CARD_UNITS = {GPU_A: 40960 // c.MEMORY_UNIT_MIB, GPU_B: 24576 // c.MEMORY_UNIT_MIB}


def live_pods(real: Any) -> list[dict[str, Any]]:
    import json

    return [p for p in json.loads(real.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json"))["items"]
            if not p["metadata"].get("deletionTimestamp")]


def test_kills_during_a_storm_overcommit_nothing_and_lose_nothing(real: Any, names: c.Names) -> None:
    real.kubectl("create", "namespace", NAMESPACE)
    rng = random.Random(7)
    made: list[str] = []
    watcher = OvercommitWatcher(real.core_v1.list_namespaced_pod, names, CARD_UNITS.get, namespace=NAMESPACE,
                                keep=lambda pod: not pod["metadata"].get("deletionTimestamp")).start()  # every event
    crashes = [lambda: real.node(GPU_A).kubelet.restart(kill=True),
               lambda: real.restart_daemon(GPU_B, kill=True),
               lambda: real.restart_extender(kill=True),
               lambda: real.restart_scheduler(kill=True)]
    try:
        for step in range(48):
            cores, memory = SHARES[rng.randrange(len(SHARES))]
            name = f"nb-{step}"
            body = real.notebook_pod(name, cores=cores, memory=memory, namespace=NAMESPACE)
            body["spec"]["nodeSelector"] = {"pool": "a100" if step % 2 else "p40"}
            real.core_v1.create_namespaced_pod(NAMESPACE, body, _preload_content=False)
            made.append(name)
            if step % 5 == 4:  # a user stops a server
                gone = made.pop(rng.randrange(len(made)))
                real.kubectl("delete", "pod", "-n", NAMESPACE, gone, "--wait=false")
            if step % 12 == 6:
                crashes[step // 12]()
            time.sleep(0.15)
        real.wait_published(real.node(GPU_A))  # the killed kubelet is back and has our devices again

        unsettled: list[str] = []

        def settled() -> bool:
            pods = live_pods(real)
            # a pending pod is fine only if its share fits on no card of its pool now
            unsettled[:] = [describe(p) for p in pods if (p["status"].get("phase") == "Pending" and fits_somewhere(
                p, pods, names)) or (p["status"].get("phase") == "Running"
                                     and annotations(p).get(names.gpu_assigned) != "true")]
            return not unsettled

        try:
            wait_for(settled, timeout=180, interval=1.0, what="every pod that fits Running and confirmed")
        except TimeoutError as error:
            raise AssertionError(f"{error}; unsettled:\n" + "\n".join(unsettled)) from None
    finally:
        watcher.stop()
    assert watcher.violations == [] and watcher.checks > 10, (watcher.violations, watcher.checks)
    pods = live_pods(real)
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    assert len(running) >= 20
    # kubelet refuses, for good, a pod bound while the node's device plugin was down (its devices
    # unhealthy until the daemon registers again): real Kubernetes, and docs/admin.md says so
    failed = [p for p in pods if p["status"].get("phase") == "Failed"]
    assert all(p["spec"]["nodeName"] == GPU_B and p["status"].get("reason") == "UnexpectedAdmissionError"
               for p in failed), [describe(p) for p in failed]

    for node in (GPU_A, GPU_B):
        entries = read_checkpoint(str(real.node(node).plugin_dir / "kubelet_internal_checkpoint"))
        here = {p["metadata"]["uid"]: p for p in running if p["spec"]["nodeName"] == node}
        cores = collections.Counter(e.pod_uid for e in entries if e.resource == names.core_resource
                                    for _ in e.device_ids)
        for uid, pod in here.items():  # every running pod's devices, as many as its record holds
            record = c.PodAllocation.from_json(annotations(pod)[names.allocation])
            assert cores[uid] == sum(s.cores for ct in record.containers for s in ct.cards), pod["metadata"]["name"]
        ids = [d for e in entries if e.resource == names.core_resource for d in e.device_ids]
        assert len(ids) == len(set(ids))  # kubelet never handed one device twice
    real.kubectl("delete", "namespace", NAMESPACE, "--timeout=120s")  # the session's next tests need the cards


def describe(pod: dict[str, Any]) -> str:
    status = pod["status"]
    conditions = "; ".join(f"{x['type']}={x['status']} {x.get('reason', '')} {x.get('message', '')}".strip()
                           for x in status.get("conditions") or [])
    return (f"{pod['metadata']['name']} {status.get('phase')} {status.get('reason', '')} {status.get('message', '')} "
            f"on {pod['spec'].get('nodeName')} "
            f"annotations={ {k: v for k, v in annotations(pod).items() if 'allocation' not in k} } {conditions}")


def fits_somewhere(pod: dict[str, Any], pods: list[dict[str, Any]], names: c.Names) -> bool:
    """Would this pending pod's share fit on some card of its pool, given what is held now?"""
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    cores, units = int(limits[names.core_resource]), int(limits.get(names.memory_resource, 0))
    node = GPU_A if pod["spec"]["nodeSelector"]["pool"] == "a100" else GPU_B
    holding = held([p for p in pods if p["spec"].get("nodeName") == node], names)
    cards = {uuid: shares for (where, uuid), shares in holding.items() if where == node}
    count = 4 if node == GPU_A else 7
    free = [(100 - sum(s[0] for s in shares), CARD_UNITS[node] - sum(s[1] for s in shares)) for shares in cards.values()]
    free += [(100, CARD_UNITS[node])] * (count - len(cards))
    if cores >= 100:
        return sum(1 for f in free if f[0] == 100) >= cores // 100
    return any(f[0] >= cores and f[1] >= units for f in free)
