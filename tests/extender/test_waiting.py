"""Issue 17: waiting made visible — the pending vGPU pods' order, why they wait, what fits now,
as pure functions and through the extender's GET /queue on the simulated API."""

from __future__ import annotations

import json
import random

from extender_support import get, node, pod
from hypothesis import given, settings
from hypothesis import strategies as st
from simkube.waiting import wait_for
from vgpu_plugin.extender.waiting import (
    Alternative,
    FreeRoom,
    alternative,
    fits,
    pending_pods,
    queue_report,
    why,
)

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.claims import FreeCard
from jupyter_vgpu.core.contract import DEFAULT_NAMES, Request

GIB = 4  # memory units per GiB
QUEUE_TOKEN = "queue-token-for-the-waiting-tests"
SCHEDULERS = frozenset({contract.SCHEDULER_NAME})


def card(index: int, cores: int, gib: float, whole: bool = False) -> FreeCard:
    return FreeCard(index, cores, int(gib * GIB), whole)


def test_why_and_what_fits_now() -> None:
    free = {"a": (card(0, 25, 8), card(1, 10, 30)), "b": (card(0, 30, 8),), "c": (card(0, 25, 10),),
            "d": ()}
    request = Request(50, 20 * GIB)
    assert why(request, free) == "no card on any node has 50 % and 20 GiB free"
    best = alternative(request, free)
    assert best == Alternative(25, 10 * GIB, 1)  # 25 x 10 GiB beats 30 x 8 GiB and 10 x 20 GiB
    assert alternative(Request(25, 8 * GIB), free) == Alternative(25, 8 * GIB, 3)
    assert Alternative(25, 8 * GIB, 3).describe() == "a 25 % share with 8 GiB fits on 3 nodes"
    assert why(Request(25, 8 * GIB), free) is None
    # whole cards
    whole = {"a": (card(0, 100, 16, True), card(1, 100, 16, True)), "b": (card(0, 100, 16, True),)}
    assert why(Request(300), whole) == "no node has 3 whole cards free"
    assert alternative(Request(300), whole) == Alternative(200, 0, 1)
    assert Alternative(200, 0, 1).describe() == "2 whole cards fits on 1 node"
    assert why(Request(50, GIB), {}) == "no GPU node is known to the scheduler"
    assert alternative(Request(50, GIB), {"a": ()}) is None


cards = st.builds(lambda i, c, u, w: FreeCard(i, 100 if w else c, u, w), st.integers(0, 7), st.integers(0, 100),
                  st.integers(0, 320), st.booleans())
requests = st.one_of(st.builds(Request, st.integers(1, 99), st.integers(1, 320)),
                     st.builds(lambda n, u: Request(100 * n, u), st.integers(1, 4), st.sampled_from([0, 64, 400])))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from("abcdef"), st.lists(cards, max_size=8), max_size=6), requests)
def test_the_reduced_room_fits_exactly_as_the_extender_does(free_by_node, request) -> None:
    """The queue's once-per-report summary answers as fits_alone over every card, node by node."""
    room = FreeRoom.of(free_by_node)
    for name, free in free_by_node.items():
        assert room.fits_on(name, request) == fits(free, request)
    best = alternative(request, room)
    if best is not None:  # what it offers fits where it says, and is no larger than the request
        wanted = Request(best.cores, best.memory_units)
        assert best.nodes == sum(fits(free, wanted) for free in free_by_node.values()) > 0
        assert best.cores <= request.cores and (request.is_share or best.memory_units == 0)


def pending(name: str, priority: int, second: int, **kwargs) -> dict:
    obj = pod(name, **kwargs)
    obj["metadata"]["uid"] = f"uid-{name}"
    obj["metadata"]["creationTimestamp"] = f"2026-11-25T09:{second // 60:02d}:{second % 60:02d}Z"
    obj["spec"]["priority"] = priority
    return obj


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(-2, 2), st.integers(0, 20)), min_size=50, max_size=50), st.randoms())
def test_a_burst_of_50_has_one_consistent_order(specs: list[tuple[int, int]], shuffler: random.Random) -> None:
    pods = [pending(f"p{i:02d}", priority, second) for i, (priority, second) in enumerate(specs)]
    others = [pending("cpu", 9, 0, cores=None, memory_units=None), pending("other", 9, 0, scheduler="x")]
    bound = pending("bound", 9, 0)
    bound["spec"]["nodeName"] = "a"
    order = [p.name for p in pending_pods(pods + others + [bound], DEFAULT_NAMES, SCHEDULERS)]
    assert len(order) == 50
    shuffled = pods[:]
    shuffler.shuffle(shuffled)
    assert [p.name for p in pending_pods(shuffled, DEFAULT_NAMES, SCHEDULERS)] == order
    key = {f"p{i:02d}": (-priority, second, f"p{i:02d}") for i, (priority, second) in enumerate(specs)}
    assert order == sorted(key, key=key.__getitem__)  # priority first, then age, then name
    report = queue_report(shuffled, {}, DEFAULT_NAMES, SCHEDULERS)
    assert [e["position"] for e in report["pending"]] == list(range(1, 51))
    assert [e["pod"] for e in report["pending"]] == order


def test_get_queue_from_the_extender(cluster) -> None:
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        cluster.add_node(node(name, count=2, memory_gib=8))
    cluster.start_extender(queue_token=QUEUE_TOKEN)
    big = cluster.add_pod(pending("big", 0, 0, cores=50, memory_units=20 * GIB))
    burst = [cluster.add_pod(pending(f"b{i:02d}", i % 3, i, cores=10, memory_units=GIB)) for i in range(50)]
    url = cluster.extender.base_url + "/queue"

    def listed():
        status, body = get(url, token=QUEUE_TOKEN)
        report = json.loads(body)
        return report if status == 200 and len(report["pending"]) == 51 else None

    report = wait_for(listed, timeout=20, what="the extender's pod cache")
    entries = {e["pod"]: e for e in report["pending"]}
    assert entries["big"]["why"] == "no card on any node has 50 % and 20 GiB free"
    assert entries["big"]["alternative"]["text"] == "a 50 % share with 8 GiB fits on 3 nodes"
    assert entries["b00"]["why"] is None and entries["b00"]["alternative"] is None
    positions = [e["position"] for e in report["pending"]]
    assert positions == list(range(1, 52))
    # priority 2 first, then 1, then 0; within one, the older first (the API server's timestamps), then by name
    created = {p["metadata"]["name"]: p["metadata"]["creationTimestamp"] for p in cluster.list_pods()}
    keys = [(-e["priority"], created[e["pod"]], e["pod"]) for e in report["pending"]]
    assert keys == sorted(keys) and len({k[0] for k in keys}) == 3
    assert {n["name"]: n["largestShare"] for n in report["nodes"]}["gpu-a"] == {"cores": 100, "memoryMib": 8192}
    assert len(burst) == 50 and big["metadata"]["name"] == "big"


def test_each_waiting_pod_is_told_where_it_stands(cluster) -> None:
    """A burst of 50 pods that fit nowhere: each gets one VGPUWaiting Event (what KubeSpawner
    shows on the spawn page) whose position is the one GET /queue gives."""
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        cluster.add_node(node(name, count=2, memory_gib=8))
    extender = cluster.start_extender(queue_notice_interval=0.2, queue_token=QUEUE_TOKEN)
    for i in range(50):
        cluster.add_pod(pending(f"w{i:02d}", i % 4, i, cores=50, memory_units=20 * GIB))

    def told():
        events = [e for e in cluster.core.list_namespaced_event("default").items if e.reason == "VGPUWaiting"]
        return events if len({e.involved_object.name for e in events}) == 50 else None

    def queued():
        status, body = get(extender.base_url + "/queue", token=QUEUE_TOKEN)
        pending = json.loads(body)["pending"] if status == 200 else []
        return {e["pod"]: e["position"] for e in pending} if len(pending) == 50 else None

    positions = wait_for(queued, timeout=20, what="the burst in the extender's pod cache")
    assert sorted(positions.values()) == list(range(1, 51))

    def expected(pod: str) -> str:
        return (f"position {positions[pod]} of 50 waiting for a vGPU: no card on any node has 50 % and 20 GiB "
                "free; a 50 % share with 8 GiB fits on 3 nodes now")

    def all_current():
        # while the burst arrived, earlier lines may have named other positions; the latest is current
        events = told() or []
        said = {(e.involved_object.name, e.message) for e in events}
        return events if all((pod, expected(pod)) in said for pod in positions) else None

    events = wait_for(all_current, timeout=60, what="every waiting pod told its current position")
    assert all(e.type == "Normal" and e.source.component == "vgpu-scheduler-extender" for e in events)
    before = len(events)
    assert extender.notifier.notify_once() == 0  # nothing changed: nothing repeated
    assert len(told()) == before
