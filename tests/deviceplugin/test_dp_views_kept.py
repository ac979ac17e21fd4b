"""The allocator keeps its views of the node's pods while its informer's cache is unchanged.

Each admission asks for the node's pods about four times and every reconciliation once more;
``Allocator._all_views`` now answers from the last reading while the informer's ``changes``
count is the one read before it and no LIST stands in for the cache. Over random sequences of
watch events applied through the real ``Informer`` (pods added, bound with a claim, modified,
Running, finished, deleted, a relist) and of LIST replies standing in for the cache (older and
newer than the watch), the views and running pods are, after every step, exactly what reading
the pods afresh gives.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from vgpu_plugin.deviceplugin.allocator import Allocator
from vgpu_plugin.deviceplugin.state import CardsState
from vgpu_plugin.informer import Informer
from vgpu_plugin.tokens import TokenMinter

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import CardShare, ContainerAllocation, PodAllocation, Request
from jupyter_vgpu.core.inventory import Card

NAMES = c.DEFAULT_NAMES
CARDS = [Card(index=i, uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", model="T", memory_mib=64 * 256)
         for i in range(2)]
UIDS = [f"00000000-0000-0000-0000-{n:012d}" for n in range(5)]


def _pod(n: int, version: int, phase: str, cores: int, card: int) -> dict:
    request = Request(cores, 4)
    allocation = PodAllocation(node="n1", containers=(ContainerAllocation(0, "c0", (
        CardShare(card, CARDS[card].uuid, cores, 4),)),), assigned_at_ns=n + 1)
    return {"metadata": {"name": f"p{n}", "namespace": "default", "uid": UIDS[n], "resourceVersion": str(version),
                         "annotations": c.predicate_annotations(allocation, NAMES)},
            "spec": {"nodeName": "n1", "containers": [{"name": "c0",
                                                       "resources": {"limits": c.request_limits(request, NAMES)}}]},
            "status": {"phase": phase}}


STEP = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 4), st.sampled_from(["Pending", "Running", "Succeeded"]),
              st.sampled_from([10, 20, 30]), st.integers(0, 1)),
    st.tuples(st.just("delete"), st.integers(0, 4)),
    st.tuples(st.just("relist"), st.integers(0, 4)),
    st.tuples(st.just("list"), st.integers(-3, 3), st.lists(st.integers(0, 4), max_size=5, unique=True)),
    st.tuples(st.just("read")),
)


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(STEP, min_size=1, max_size=30))
def test_kept_views_are_a_fresh_reading(steps):
    informer = Informer(lambda **_: None)
    allocator = Allocator("n1", informer, CardsState(list(CARDS)), TokenMinter(b"0" * 32), names=NAMES)
    versions = itertools.count(1)
    pods: dict[int, dict] = {}
    for step in steps:
        if step[0] == "put":
            _, n, phase, cores, card = step
            pods[n] = _pod(n, next(versions), phase, cores, card)
            informer._apply("MODIFIED", pods[n])
        elif step[0] == "delete" and step[1] in pods:
            informer._apply("DELETED", pods.pop(step[1]))
        elif step[0] == "relist":
            kept = dict(list(pods.items())[:step[1]])
            pods = kept
            informer._apply_list({"metadata": {"resourceVersion": str(next(versions))}, "items": list(pods.values())})
        elif step[0] == "list":  # a LIST reply taken some versions before or after the watch's position
            _, ahead, members = step
            at = int(informer.resource_version or 0) + ahead
            items = [_pod(n, at, "Pending", 20, 0) for n in members] if ahead > 0 else \
                [pods[n] for n in members if n in pods]
            with allocator._lock:
                allocator._refresh({"metadata": {"resourceVersion": str(max(at, 0))}, "items": items})
        with allocator._lock:
            got = allocator._all_views()
            running = set(allocator._running)
            again = allocator._all_views()  # answered from what was kept, when anything was
            allocator._kept_views = None
            fresh = allocator._all_views()
            assert got == again == fresh, step
            assert running == allocator._running, step
