"""fgd-filter in the extender (hypothesis): the numpy batch equals the core's ``fgd_level``, and
the filter narrows to exactly one node whenever any node fits (never refusing a pod that fits),
that node being one the plain filter passes and the best by the core's measure."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from extender_support import mixes
from hypothesis import given, settings
from hypothesis import strategies as st
from test_filter_property import cards, pod_for, requests
from vgpu_plugin.extender.decisions import Decisions, read_ask
from vgpu_plugin.extender.fgd_batch import (
    BatchNode,
    LevelMemo,
    MixArrays,
    NodeRows,
    counts_of,
    levels,
)
from vgpu_plugin.extender.headroom import HostHeadroom
from vgpu_plugin.extender.ledger import Holding, Ledger, NodeCards
from vgpu_plugin.extender.wire import ExtenderArgs

from jupyter_vgpu.core import placement
from jupyter_vgpu.core.contract import CORES_PER_CARD, CardShare, ContainerAllocation, Request
from jupyter_vgpu.core.fgd import node_fragment
from jupyter_vgpu.core.fragment import Headroom, Mix, Shape
from jupyter_vgpu.core.inventory import Card
from jupyter_vgpu.core.placement import CardState, FragmentView, NodeState

LABELS = st.frozensets(st.sampled_from(["gpu=T4", "gpu=A10"]), max_size=2)


TYPICAL_MIXES = mixes(pods=(0, 6), cpus=(0, 1000, 4000, 12_000), weights=(0.05, 5))


@st.composite
def node_states(draw: st.DrawFn) -> NodeState:
    count = draw(st.integers(1, 6))
    states = []
    for i in range(count):
        units = draw(st.sampled_from([64, 96, 160]))
        used = draw(st.sampled_from([0, 0, 10, 25, 50, 75, 90, 100]))
        memory = units if used == 100 else draw(st.integers(0, units)) if used else 0
        states.append(CardState(i, units, draw(st.integers(0, 7)) > 0, used, memory))
    headroom = draw(st.one_of(st.none(), st.builds(Headroom, st.integers(-2000, 40_000), st.just(10**6))))
    return NodeState(tuple(states), None, headroom, draw(LABELS))


def batch(state: NodeState) -> BatchNode:
    healthy = [c for c in state.cards if c.healthy]
    return BatchNode(tuple(c.free_cores for c in healthy), tuple(c.free_memory_units for c in healthy),
                     tuple(c.is_free for c in healthy),
                     state.headroom.cpu_milli if state.headroom is not None else None, state.labels)


@settings(max_examples=300, deadline=None)
@given(st.lists(node_states(), min_size=1, max_size=5), TYPICAL_MIXES, st.integers(0, 8000),
       st.one_of(st.builds(Request, st.integers(1, 99), st.integers(1, 96)),
                 st.builds(lambda n: Request(CORES_PER_CARD * n), st.integers(1, 3))))
def test_batch_levels_equal_the_core(states, mix, cpu, request):
    view = FragmentView(mix, cpu, 0)
    expected = [placement.fgd_level(s, {0: request}, view) for s in states]
    assert levels([batch(s) for s in states], request, cpu, MixArrays(mix)) == expected


@settings(max_examples=120, deadline=None)
@given(data=st.data(), layout=st.lists(cards, min_size=1, max_size=4))
def test_filter_passes_one_node_exactly_when_one_fits(data, layout):
    ledger = Ledger()
    for n, specs in enumerate(layout):
        ledger.set_node(f"n{n}", NodeCards(tuple(Card(i, f"u{i}", "m", gib * 1024) for i, gib in enumerate(specs)),
                                           None, "inventory"))
    fgd, binpack = Decisions(ledger, None, policy="fgd-filter"), Decisions(ledger, None)
    names = sorted(ledger.nodes)
    for step in range(data.draw(st.integers(1, 12))):
        node = data.draw(st.sampled_from(names))
        card = data.draw(st.integers(0, len(ledger.node(node).cards) - 1))
        cores = data.draw(st.sampled_from([10, 25, 50, 100]))
        ledger.put(Holding(f"uid{step}", "ns", f"h{step}", node, (
            ContainerAllocation(0, "c", (CardShare(card, "", cores, 0 if cores == 100 else 8),)),)))
        pod = pod_for(data.draw(requests))
        pod["metadata"]["uid"] = f"ask{step}"
        args = ExtenderArgs(pod=pod, node_names=names, nodes=None, raw_nodes=None)
        fgd.learn_bound(pod)  # as its bind would: the mix moves with the pods asked about
        found = fgd.filter(args)
        passed, fits = found.passed, binpack.filter(args).passed
        assert len(passed) == min(1, len(fits)) and set(passed) <= set(fits)
        assert set(found.failed) <= set(names) - set(fits)  # the nodes left out are not called failed
        if len(fits) > 1:
            ask = read_ask(pod, fgd.names, "fgd-filter").requests
            view = fgd._fgd_view(pod)
            best = {n: placement.fgd_level(_state(ledger, n), ask, view) for n in fits}
            assert best[passed[0]] == max(best.values())
            assert passed[0] == min(n for n in fits if best[n] == best[passed[0]])


def _state(ledger: Ledger, name: str) -> NodeState:
    entry = ledger.node(name)
    return NodeState(tuple(CardState(c.index, c.memory_units, c.healthy, entry.used_cores[i], entry.used_memory[i])
                           for i, c in enumerate(entry.cards)))


# --- the filter's fast path: rows kept across requests, CPU headroom per row, ties by name rank ----

ODD_NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from(["\x00", "é", "Z"]),
                    max_size=6)


@settings(max_examples=200, deadline=None)
@given(names=st.lists(ODD_NAMES, min_size=1, max_size=30, unique=True), data=st.data())
def test_the_lowest_rank_is_min_of_the_names(names, data):
    """The tie-break over rows (the lowest of ``ranks``) equals Python's ``min`` of the names, odd
    names included (trailing NULs, which numpy's string arrays would drop, accents, the empty
    name), as rows keep coming."""
    rows = NodeRows()
    for count in range(1, len(names) + 1):
        rows.set(names[count - 1], [50], [10], [False])
        picked = np.array(data.draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=count, unique=True)),
                          dtype=np.int64)
        first = int(picked[np.argmin(rows.ranks()[picked])])
        assert rows.names[first] == min(names[i] for i in picked.tolist())


@settings(max_examples=200, deadline=None)
@given(names=st.lists(ODD_NAMES, min_size=1, max_size=30, unique=True), data=st.data())
def test_level_memo_pick_is_the_best_level_first_by_name(names, data):
    """The memo's pick, one ``argmax`` over its keys, is the best level among the rows picked, the
    first by name among equals, as rows keep coming (their ranks move), levels are stored a few at a
    time or as arrays and rows are forgotten; any row picked whose level is not kept sorts first."""
    rows, memo = NodeRows(), LevelMemo()
    kept: dict[int, int] = {}
    for count in range(1, len(names) + 1):
        rows.set(names[count - 1], [50], [10], [False])
        rank = rows.ranks()
        memo.reserve(len(rows.stamp), rank)
        stored = data.draw(st.lists(st.integers(0, count - 1), unique=True))
        values = data.draw(st.lists(st.integers(-1, 2), min_size=len(stored), max_size=len(stored)))  # ties
        if data.draw(st.booleans()):
            memo.store_few(stored, values, rank)
        else:
            memo.store(np.array(stored, dtype=np.int64), np.array(values, dtype=np.int64), rank)
        kept.update(zip(stored, values, strict=True))
        for row in data.draw(st.lists(st.integers(0, count - 1), max_size=2)):
            memo.forget(row)
            kept.pop(row, None)
        picked = data.draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=count, unique=True))
        keyed = memo.keyed[np.array(picked, dtype=np.int64)]
        at = int(keyed.argmax())
        if any(row not in kept for row in picked):
            assert keyed[at] == LevelMemo.STALE
            continue
        top = max(kept[row] for row in picked)
        assert LevelMemo.level_of(int(keyed[at])) == top
        assert rows.names[picked[at]] == min(rows.names[row] for row in picked if kept[row] == top)


def test_level_memo_keys_follow_rows_that_sort_before_them():
    """A row added later whose name sorts first wins the tie with a level kept before it came."""
    rows, memo = NodeRows(), LevelMemo()
    rows.set("node-b", [50], [10], [False])
    memo.reserve(len(rows.stamp), rows.ranks())
    memo.store_few([0], [7], rows.ranks())
    rows.set("node-a", [50], [10], [False])
    memo.reserve(len(rows.stamp), rows.ranks())
    memo.store(np.array([1]), np.array([7]), rows.ranks())
    keyed = memo.keyed[np.array([0, 1])]
    assert rows.names[int(keyed.argmax())] == "node-a"
    assert LevelMemo.level_of(int(keyed.max())) == 7


CARD_ROWS = st.lists(st.tuples(st.integers(-1, CORES_PER_CARD), st.integers(0, 96), st.booleans()), max_size=9)


@settings(max_examples=150, deadline=None)
@given(layouts=st.lists(CARD_ROWS, min_size=1, max_size=12), data=st.data())
def test_rows_as_lists_are_the_rows_of_the_arrays(layouts, data):
    """The rows' Python copies read as the arrays' rows would (``tolist``: padded to the widest
    row, CPU headroom NaN until set), as rows are added, widened and rewritten."""
    rows = NodeRows()
    for i, layout in enumerate(layouts):
        name = f"n{data.draw(st.integers(0, i))}"  # now and then a row written again
        rows.set(name, [c[0] for c in layout], [c[1] for c in layout], [c[2] for c in layout])
        if data.draw(st.booleans()):
            rows.set_cpu(rows.index[name], float(data.draw(st.integers(-2000, 40_000))))
    picked = data.draw(st.lists(st.integers(0, len(rows.names) - 1), min_size=1, max_size=8))
    free, memory, whole, cpu = rows.rows_as_lists(picked)
    at = np.array(picked, dtype=np.int64)
    assert (free, memory, whole) == (rows.free[at].tolist(), rows.memory[at].tolist(), rows.whole[at].tolist())
    assert [repr(v) for v in cpu] == [repr(v) for v in rows.cpu[at].tolist()]
    assert all(type(v) is bool for row in whole for v in row)


QUANTITIES = st.one_of(st.sampled_from(["4", "16", "500m", "64", "1e3", "0", "-1", "abc", "", "1Ki", "9" * 70]),
                       st.integers(-5, 100), st.none(), st.booleans())


@st.composite
def host_events(draw: st.DrawFn, nodes: list[str]) -> tuple[str, str, object]:
    """An informer event for HostHeadroom, hostile fields included (bad quantities, no nodeName,
    finished pods, objects that are not mappings)."""
    node = draw(st.sampled_from(nodes))
    if draw(st.integers(0, 9)) == 0:
        return ("node" if draw(st.booleans()) else "pod", "MODIFIED", draw(st.sampled_from([None, [], "x", 3])))
    if draw(st.booleans()):
        kind = draw(st.sampled_from(["ADDED", "MODIFIED", "DELETED"]))
        labels = draw(st.dictionaries(st.sampled_from(["gpu", "zone"]), st.sampled_from(["T4", "A10"]), max_size=2))
        return "node", kind, {"metadata": {"name": node, "labels": labels},
                              "status": {"allocatable": {"cpu": draw(QUANTITIES), "memory": "64Gi"}}}
    uid = f"u{draw(st.integers(0, 5))}"
    kind = draw(st.sampled_from(["ADDED", "MODIFIED", "DELETED"]))
    spec = {"nodeName": draw(st.sampled_from([node, ""])),
            "containers": [{"resources": {"requests": {"cpu": draw(QUANTITIES), "memory": "1Gi"}}}]}
    phase = draw(st.sampled_from(["Running", "Pending", "Succeeded"]))
    return "pod", kind, {"metadata": {"uid": uid, "name": uid}, "spec": spec, "status": {"phase": phase}}


def _same_cpu(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_headroom_reports_every_change(data):
    """A copy of each node's CPU headroom and labels refreshed only for the nodes HostHeadroom
    reports as changed stays equal to what it answers, whatever the informers deliver."""
    nodes = ["a", "b", "c"]
    hosts, changed = HostHeadroom(), set()
    hosts.subscribe(changed.add)
    copy = {n: (hosts.cpu_milli(n), hosts.labels(n)) for n in nodes}
    for _ in range(data.draw(st.integers(1, 25))):
        what, kind, obj = data.draw(host_events(nodes))
        (hosts.on_node if what == "node" else hosts.on_pod)(kind, obj)
        while changed:
            name = changed.pop()
            copy[name] = (hosts.cpu_milli(name), hosts.labels(name))
        for n in nodes:
            cpu, labels = hosts.facts([n])
            assert _same_cpu(copy[n][0], cpu[0]) and copy[n][1] == labels[0]


@settings(max_examples=120, deadline=None)
@given(data=st.data(), layout=st.lists(cards, min_size=2, max_size=4))
def test_filter_follows_headroom_labels_and_claims(data, layout):
    """Between filters the ledger's claims, the nodes' CPU headroom and labels change (hostile
    quantities included); the node fgd-filter passes is always the core's best with each node's
    headroom and labels, the first by name among equals."""
    ledger, hosts = Ledger(), HostHeadroom()
    for n, specs in enumerate(layout):
        ledger.set_node(f"n{n}", NodeCards(tuple(Card(i, f"u{i}", "m", gib * 1024) for i, gib in enumerate(specs)),
                                           None, "inventory"))
    fgd = Decisions(ledger, None, policy="fgd-filter", hosts=hosts)
    binpack = Decisions(ledger, None)
    names = sorted(ledger.nodes)
    for step in range(data.draw(st.integers(1, 10))):
        for _ in range(data.draw(st.integers(0, 3))):
            what, kind, obj = data.draw(host_events(names))
            (hosts.on_node if what == "node" else hosts.on_pod)(kind, obj)
        if data.draw(st.booleans()):
            node = data.draw(st.sampled_from(names))
            card = data.draw(st.integers(0, len(ledger.node(node).cards) - 1))
            cores = data.draw(st.sampled_from([10, 25, 50, 100]))
            ledger.put(Holding(f"uid{step}", "ns", f"h{step}", node, (
                ContainerAllocation(0, "c", (CardShare(card, "", cores, 0 if cores == 100 else 8),)),)))
        asks = data.draw(requests.filter(lambda r: len(r) == 1))
        pod = pod_for(asks)
        pod["metadata"]["uid"] = f"ask{step}"
        pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": data.draw(st.sampled_from(["1", "4", "250m"]))}
        selector = data.draw(st.sampled_from([None, {"gpu": "T4"}]))
        if selector:
            pod["spec"]["nodeSelector"] = selector
        args = ExtenderArgs(pod=pod, node_names=data.draw(st.permutations(names)), nodes=None, raw_nodes=None)
        fgd.learn_bound(pod)  # as its bind would: the mix moves with the pods asked about
        passed = fgd.filter(args).passed
        fits = binpack.filter(args).passed
        assert len(passed) == min(1, len(fits)) and set(passed) <= set(fits)
        if len(fits) > 1:
            ask = read_ask(pod, fgd.names, "fgd-filter").requests
            view = fgd._fgd_view(pod)
            best = {n: placement.fgd_level(replace(_state(ledger, n), headroom=hosts.headroom(n),
                                                   labels=hosts.labels(n)), ask, view) for n in fits}
            assert best[passed[0]] == max(best.values())
            assert passed[0] == min(n for n in fits if best[n] == best[passed[0]])


@st.composite
def cpu_mixes(draw: st.DrawFn) -> Mix:
    """Mixes of which at least one typical pod asks for CPU (the batch's CPU-copies path)."""
    mix = draw(TYPICAL_MIXES)
    asking = Shape(draw(st.integers(1, CORES_PER_CARD)), 0, 1, draw(st.sampled_from([250, 1000, 4000])))
    return Mix.of([*mix.shapes, (asking, draw(st.floats(0.05, 5)))])


def _copies_cpu(free: list[int], shapes: list[Shape]) -> int:
    """The CPU of as many copies of each typical pod as the cards with ``free`` cores that fit it
    hold (at least one), at its largest over ``shapes``: below it the row's headroom may bind."""
    need = []
    for shape in shapes:
        fitting = sum(v for v in free if v >= shape.cores)
        need.append(max(1, -(-fitting // (shape.cards * shape.cores))) * shape.cpu_milli)
    return max(need)


def _free_after(state: NodeState, request: Request) -> list[int]:
    """The healthy cards' free cores once the pod is on the first card (or whole cards) it fits."""
    free = [c.free_cores for c in state.cards if c.healthy]
    if request.is_share:
        spot = next((i for i, v in enumerate(free) if v >= request.cores), None)
        if spot is not None:
            free[spot] -= request.cores
        return free
    whole = [i for i, v in enumerate(free) if v == CORES_PER_CARD][:request.cards]
    return [0 if i in whole else v for i, v in enumerate(free)]


@settings(max_examples=300, deadline=None)
@given(st.lists(node_states(), min_size=4, max_size=7), cpu_mixes(), st.integers(0, 4000),
       st.lists(st.tuples(st.integers(0, 9), st.booleans(), st.integers(-2, 2), st.integers(-3, 3)),
                min_size=4, max_size=7),
       st.one_of(st.builds(Request, st.integers(1, 99), st.integers(1, 96)),
                 st.builds(lambda n: Request(CORES_PER_CARD * n), st.integers(1, 3))))
def test_batch_skips_cpu_copies_only_where_cpu_cannot_bind(states, mix, cpu, copies, request):
    """Rows side by side whose headroom binds and does not: unknown, zero, ample, and just
    around the CPU of as many copies of a typical pod (one asking for CPU) as the row's fitting
    cards, before or after the pod, hold: the row's own bound over all typical pods (at it, one
    below it) or one pod's (a few copies and millicores either side)."""
    asking = [shape for shape, _ in mix.shapes if shape.cpu_milli > 0]
    around, rows = [], []
    for state, (pick, after, offset, nudge) in zip(states, copies, strict=False):
        free = _free_after(state, request) if after else [c.free_cores for c in state.cards if c.healthy]
        rows.append(free)
        # the headroom the batch compares is the node's before the pod and the node's less the pod's after
        base = cpu if after else 0
        if pick < 4:  # the row's own bound: at it, or one millicore below
            around.append(base + _copies_cpu(free, asking) - (pick % 2))
        else:
            shape = asking[pick % len(asking)]
            k = max(0, _copies_cpu(free, [shape]) // shape.cpu_milli + offset)
            around.append(base + shape.cpu_milli * k + nudge)
    headrooms = [None, 0, 10**7, *around[3:]]  # each aimed row at its own cards
    states = [replace(s, headroom=None if h is None else Headroom(h, 10**6))
              for s, h in zip(states, headrooms, strict=False)]
    view = FragmentView(mix, cpu, 0)
    expected = [placement.fgd_level(s, {0: request}, view) for s in states]
    assert levels([batch(s) for s in states], request, cpu, MixArrays(mix)) == expected
    # each row alone: the batch skips the copies when no row of it may bind, so a row aimed at
    # its own bound decides that skip by itself
    assert [levels([batch(s)], request, cpu, MixArrays(mix))[0] for s in states] == expected
    # the fragment itself (a level hides a few cores): each row's cards at the headroom aimed at them
    arrays = MixArrays(mix)
    free = np.array([r + [-1] * (7 - len(r)) for r in rows])
    cpu_at = [None if s.headroom is None else s.headroom.cpu_milli - (cpu if after else 0)
              for s, (_, after, _, _) in zip(states, copies, strict=False)]
    count, fitting = counts_of(free, arrays)
    fragment = arrays.fragment(np.clip(free, 0, CORES_PER_CARD).sum(1).astype(float), count, fitting,
                               np.array([np.nan if h is None else h for h in cpu_at], dtype=float),
                               arrays.admitted(s.labels for s in states[:len(rows)]))
    core = [node_fragment(r, h, s.labels, mix) for r, h, s in zip(rows, cpu_at, states, strict=False)]
    assert all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) for a, b in zip(fragment, core, strict=True))
