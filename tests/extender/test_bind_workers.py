"""The bind worker threads (bind_workers.py): every answer reaches its request, a bind that
raises becomes kube-scheduler's error JSON, binds to one node stay serialised, and stopping
drops what has not started while it waits for what runs."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from extender_support import NAMES, binding_args, node, pod, post
from simkube.waiting import wait_for
from vgpu_plugin.extender.bind_workers import BindWorkers, WorkersStopped
from vgpu_plugin.extender.ledger import Ledger, node_cards
from vgpu_plugin.extender.server import Extender

from jupyter_vgpu.core import contract


def squared_unless_seventh(n: int) -> int:
    if n % 7 == 0:
        raise ValueError(f"bad {n}")
    return n * n


def test_every_answer_and_every_error_reaches_its_own_request():
    async def main() -> list[Any]:
        workers: BindWorkers[int, int] = BindWorkers(squared_unless_seventh, 8)
        workers.start(asyncio.get_running_loop())
        try:
            # many answers finish while the loop has not taken the earlier ones: they share wake-ups
            futures = [workers.submit(n) for n in range(3000)]
            return await asyncio.gather(*futures, return_exceptions=True)
        finally:
            await asyncio.to_thread(workers.stop)

    results = asyncio.run(main())
    for n, result in enumerate(results):
        if n % 7 == 0:
            assert isinstance(result, ValueError) and str(result) == f"bad {n}"
        else:
            assert result == n * n


def test_stop_waits_for_the_running_binds_drops_the_queued_and_refuses_new_ones():
    started, release = threading.Event(), threading.Event()
    finished: list[int] = []

    def work(n: int) -> int:
        if n == 0:
            started.set()
            release.wait()
        finished.append(n)
        return n

    async def main() -> None:
        loop = asyncio.get_running_loop()
        workers: BindWorkers[int, int] = BindWorkers(work, 1)
        workers.start(loop)
        futures = [workers.submit(n) for n in range(20)]
        await asyncio.to_thread(wait_for, started.is_set, timeout=10, what="the first item running")
        stopping = loop.run_in_executor(None, workers.stop)

        async def refused() -> bool:
            try:
                futures.append(workers.submit(len(futures)))  # may still be taken before the stop
            except WorkersStopped:
                return True
            return False

        await asyncio.to_thread(wait_for, lambda: asyncio.run_coroutine_threadsafe(refused(), loop).result(),
                                timeout=10, what="new items refused")
        release.set()
        await stopping
        assert 0 in finished, "stop returned before the running item finished"
        await asyncio.to_thread(wait_for, lambda: all(f.done() for f in futures), timeout=10, what="every future settled")
        for n, future in enumerate(futures):
            if future.cancelled():
                assert n not in finished, f"item {n} ran, yet its request was told it was dropped"
            else:
                assert future.result() == n and n in finished
        assert not futures[0].cancelled() and any(f.cancelled() for f in futures)

        workers.start(loop)  # a restarted extender starts them again
        try:
            assert await workers.submit(99) == 99
        finally:
            await asyncio.to_thread(workers.stop)

    asyncio.run(main())


def test_workers_restarted_on_a_new_loop_answer_there_after_the_old_loop_went_away():
    started, release = threading.Event(), threading.Event()

    def work(n: int) -> int:
        if n == 0:
            started.set()
            release.wait()
        return n

    workers: BindWorkers[int, int] = BindWorkers(work, 1)
    gone = asyncio.new_event_loop()  # an extender's loop that stops before its last answer is taken
    workers.start(gone)
    unanswered = workers.submit(0)
    wait_for(started.is_set, timeout=10, what="the bind running")
    release.set()
    workers.stop()  # the answer's wake-up is queued on a loop that never runs again
    assert not unanswered.done()
    gone.close()

    async def restarted() -> int:
        workers.start(asyncio.get_running_loop())
        try:
            return await asyncio.wait_for(workers.submit(7), 30)  # a hang guard, not a timing
        finally:
            await asyncio.to_thread(workers.stop)

    assert asyncio.run(restarted()) == 7


class BrokenAPI:
    """A Kubernetes API whose reads fail with an error bind does not expect (a bug, not a refusal)."""

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        raise KeyError("metadata")

    def patch_annotations(self, namespace: str, name: str, annotations: Any) -> dict[str, Any]:
        raise AssertionError("never reached")

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Any = None) -> None:
        raise AssertionError("never reached")


def test_a_bind_that_raises_in_its_worker_answers_with_the_error_json_and_the_server_goes_on(caplog):
    ledger = Ledger()
    ledger.set_node("n1", node_cards(node("n1"), NAMES))
    with Extender(port=0, api=BrokenAPI(), ledger=ledger) as extender:
        args = binding_args(pod("nb") | {"metadata": {"name": "nb", "namespace": "default", "uid": "u1"}}, "n1")
        for _ in range(3):  # the worker that raised takes binds again
            status, reply = post(f"{extender.url}/bind", args)
            assert status == 500
            assert reply == {"Error": "internal error in the extender (see its log)"}
        status, reply = post(f"{extender.url}/bind", {"PodName": "nb"})
        assert status == 400 and reply["Error"]
    assert ledger.stats()["pods"] == 0
    assert any(record.exc_info and record.exc_info[0] is KeyError for record in caplog.records)


@pytest.mark.parametrize("workers", [1, 8])
def test_binds_to_one_node_from_many_clients_fill_it_exactly(cluster, workers):
    cluster.add_node(node("n1", count=1, memory_gib=16))
    cluster.start_extender(bind_workers=workers)
    created = [cluster.add_pod(pod(f"nb{i}", cores=30, memory_units=1)) for i in range(24)]
    with ThreadPoolExecutor(16) as clients:
        replies = list(clients.map(lambda p: post(f"{cluster.url}/bind", binding_args(p, "n1")), created))
    assert all(status == 200 for status, _ in replies)
    bound = [r for _, r in replies if r["Error"] == ""]
    assert len(bound) == 3, [r["Error"] for _, r in replies]  # 3 x 30 cores of one card's 100
    assert all("does not fit" in r["Error"] for _, r in replies if r["Error"])
    pods = cluster.list_pods()
    cores = 0
    for obj in pods:
        annotations = obj["metadata"].get("annotations") or {}
        if NAMES.allocation in annotations:
            assert obj["spec"]["nodeName"] == "n1"
            allocation = contract.PodAllocation.from_json(annotations[NAMES.allocation])
            cores += sum(share.cores for c in allocation.containers for share in c.cards)
    assert cores == 90
    cluster.wait_ledger(lambda ledger: ledger.overcommitted() == [] and ledger.stats()["pods"] == 3,
                        "the ledger holding the three binds")


def test_a_bind_arriving_once_the_workers_stop_is_refused_with_kube_schedulers_error_field():
    ledger = Ledger()
    ledger.set_node("n1", node_cards(node("n1"), NAMES))
    with Extender(port=0, api=BrokenAPI(), ledger=ledger) as extender:
        extender.binds.stop()  # as Extender.stop() does once its listeners are closed
        status, reply = post(f"{extender.url}/bind", {"PodName": "nb", "PodNamespace": "default",
                                                      "PodUID": "u1", "Node": "n1"})
        assert status == 200
        assert reply == {"Error": "the extender is stopping; try again"}
    assert ledger.stats()["pods"] == 0
