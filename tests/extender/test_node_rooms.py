"""Issue 18: the queue report with per-node rooms kept between recomputes (``NodeRooms``) is the
plain report, exactly (positions, reasons, alternatives, node lines), over random ledgers, waiting
pods and sequences of ledger changes, read as the extender reads them (``NodeEntry.free``)."""

from __future__ import annotations

from extender_support import NAMES, node, pod
from hypothesis import given, settings
from hypothesis import strategies as st
from vgpu_plugin.extender.ledger import Holding, Ledger, node_cards
from vgpu_plugin.extender.waiting import FreeRoom, NodeRooms, fits, queue_report

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.claims import FreeCard
from jupyter_vgpu.core.contract import CardShare, ContainerAllocation

SCHEDULERS = frozenset({contract.SCHEDULER_NAME})
NODES = ("n0", "n1", "n2", "n3")

set_node = st.tuples(st.just("set"), st.sampled_from(NODES), st.integers(0, 4), st.sampled_from([8, 16, 40]),
                     st.sets(st.integers(0, 3), max_size=2))
remove_node = st.tuples(st.just("remove"), st.sampled_from(NODES))
put = st.tuples(st.just("put"), st.integers(0, 9), st.sampled_from(NODES),
                st.lists(st.tuples(st.integers(0, 4), st.integers(0, 100), st.integers(0, 160)), min_size=1,
                         max_size=3))
drop = st.tuples(st.just("drop"), st.integers(0, 9))
changes = st.lists(st.one_of(set_node, remove_node, put, drop), min_size=1, max_size=25)
asks = st.lists(st.one_of(st.tuples(st.integers(1, 99), st.integers(1, 160)),
                          st.tuples(st.sampled_from([100, 200, 300]), st.sampled_from([0, 64, 400]))),
                max_size=6)


def apply(ledger: Ledger, change: tuple) -> None:
    kind = change[0]
    if kind == "set":
        _, name, count, gib, unhealthy = change
        ledger.set_node(name, node_cards(node(name, count, gib, unhealthy=tuple(i for i in unhealthy if i < count)),
                                         NAMES))
    elif kind == "remove":
        ledger.remove_node(change[1])
    elif kind == "put":
        _, uid, name, shares = change
        cards = tuple(CardShare(index, "", cores, units) for index, cores, units in shares)
        ledger.put(Holding(f"uid-{uid}", "ns", f"held-{uid}", name, (ContainerAllocation(0, "c", cards),)))
    else:
        ledger.drop(f"uid-{change[1]}")


def free_by_node(ledger: Ledger) -> dict[str, tuple[FreeCard, ...]]:
    """What ``Extender.queue_report`` hands the report: each known node's live ``free`` tuple."""
    with ledger.lock:
        return {name: entry.free for name, entry in ledger.nodes.items() if entry.known}


def waiting(shapes: list[tuple[int, int]]) -> list[dict]:
    pods = []
    for i, (cores, units) in enumerate(shapes):
        obj = pod(f"w{i}", cores, units, namespace="ns")
        obj["metadata"]["uid"] = f"w-uid-{i}"
        obj["metadata"]["creationTimestamp"] = f"2026-11-25T09:00:{i:02d}Z"
        pods.append(obj)
    return pods


@settings(max_examples=200, deadline=None)
@given(changes, asks, st.integers(1, 4))
def test_kept_rooms_give_the_plain_report_after_every_change(steps, shapes, every) -> None:
    ledger, rooms, pods = Ledger(), NodeRooms(), waiting(shapes)
    for i, change in enumerate(steps):
        apply(ledger, change)
        if i % every:
            continue  # several changes between two reports, as in a bind burst
        free = free_by_node(ledger)
        plain = queue_report(pods, {name: list(cards) for name, cards in free.items()}, NAMES, SCHEDULERS)
        assert queue_report(pods, free, NAMES, SCHEDULERS, rooms) == plain
    free = free_by_node(ledger)
    assert queue_report(pods, free, NAMES, SCHEDULERS, rooms) == queue_report(pods, free, NAMES, SCHEDULERS)


def test_a_node_given_as_a_list_is_read_afresh_each_report() -> None:
    """Only an immutable tuple is trusted to be the same cards: a list changed in place is not missed."""
    rooms, pods = NodeRooms(), waiting([(50, 40)])
    cards = [FreeCard(0, 100, 64, True)]
    first = queue_report(pods, {"a": cards}, NAMES, SCHEDULERS, rooms)
    assert first["pending"][0]["why"] is None and first["nodes"][0]["wholeCardsFree"] == 1
    cards[0] = FreeCard(0, 30, 64, False)
    second = queue_report(pods, {"a": cards}, NAMES, SCHEDULERS, rooms)
    assert second == queue_report(pods, {"a": cards}, NAMES, SCHEDULERS)
    assert second["pending"][0]["why"] == "no card on any node has 50 % and 10 GiB free"
    assert second["nodes"][0]["wholeCardsFree"] == 0


free_cards = st.builds(lambda i, c, u, w: FreeCard(i, 100 if w else c, u, w), st.integers(0, 7),
                       st.integers(0, 100), st.integers(0, 160), st.booleans())
requests = st.one_of(st.builds(lambda c, u: contract.Request(c, u), st.integers(1, 99), st.integers(1, 160)),
                     st.builds(lambda n, u: contract.Request(100 * n, u), st.integers(1, 4),
                               st.sampled_from([0, 64, 400])))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from("abcdefgh"), st.lists(free_cards, max_size=8), max_size=8), requests)
def test_the_per_shape_pass_counts_as_fits_alone_node_by_node(free_by_node, request) -> None:
    """``fits_somewhere`` (over the rooms' pairs) and ``nodes_fitting`` (inlined for shares) are
    the extender's fit rule applied to every node's cards."""
    room = FreeRoom.of(free_by_node)
    fitting = sum(fits(free, request) for free in free_by_node.values())
    assert room.nodes_fitting(request) == fitting
    assert room.fits_somewhere(request) == (fitting > 0)
