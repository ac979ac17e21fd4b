"""fgd-filter's pure-Python path for a few rows (``fgd_few``) against the numpy batch: the
same falls bit for bit (not only the same levels: a level hides the last bits), so levels
from either path may be compared in one filter."""

from __future__ import annotations

from dataclasses import replace
from unittest.mock import patch

import numpy as np
from extender_support import mixes
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fgd_filter_property import _copies_cpu, _free_after, _state, batch, node_states
from test_filter_property import cards, pod_for
from vgpu_plugin.extender import decisions, fgd_batch, fgd_few
from vgpu_plugin.extender.decisions import Decisions, read_ask
from vgpu_plugin.extender.fgd_batch import MixArrays, NodeRows, counts_of
from vgpu_plugin.extender.headroom import HostHeadroom
from vgpu_plugin.extender.ledger import Holding, Ledger, NodeCards
from vgpu_plugin.extender.wire import ExtenderArgs

from jupyter_vgpu.core import placement
from jupyter_vgpu.core.contract import CORES_PER_CARD, CardShare, ContainerAllocation, Request
from jupyter_vgpu.core.fragment import Headroom, Mix, Shape
from jupyter_vgpu.core.inventory import Card

REQUESTS = st.one_of(st.builds(Request, st.integers(1, 99), st.integers(1, 96)),
                     st.builds(lambda n: Request(CORES_PER_CARD * n), st.integers(1, 3)))


# 1 to 40 typical pods (from 8 on numpy sums pairwise), some asking CPU, some with a selector
WIDE_MIXES = mixes(pods=(1, 40), cpus=(0, 250, 1000, 4000, 12_000), weights=(0.01, 7))


def _arrays(states: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rows = NodeRows()
    for i, state in enumerate(states):
        node = batch(state)
        rows.set(str(i), node.free_cores, node.free_memory, node.whole_free)
    index = rows.take([str(i) for i in range(len(states))])
    cpu = np.array([np.nan if s.headroom is None else s.headroom.cpu_milli for s in states], dtype=float)
    return rows.free[index], rows.memory[index], rows.whole[index], cpu


@settings(max_examples=400, deadline=None)
@given(st.lists(node_states(), min_size=1, max_size=12), WIDE_MIXES, st.integers(0, 8000), REQUESTS,
       st.booleans())
def test_few_rows_fall_as_the_batch_bit_for_bit(states, mix, pod_cpu, request, everyone):
    arrays = MixArrays(mix)
    free, memory, whole, cpu = _arrays(states)
    admitted = arrays.admit_all(len(states)) if everyone else arrays.admitted(s.labels for s in states)
    fall, fit = fgd_batch.falls_of(free, memory, whole, cpu, admitted, request, pod_cpu, arrays)
    few_fall, few_fit = fgd_few.falls_few(free, memory, whole, cpu, None if everyone else admitted, request,
                                          pod_cpu, arrays)
    assert few_fit == fit.tolist()
    # bit for bit where the pod fits (elsewhere the level is not read)
    assert [f.hex() for f, ok in zip(few_fall, few_fit, strict=True) if ok] == \
        [f.hex() for f, ok in zip(fall.tolist(), few_fit, strict=True) if ok]
    level, _ = fgd_batch.levels_of(free, memory, whole, cpu, admitted, request, pod_cpu, arrays)
    kept = fgd_few.stored_levels_few(free, memory, whole, cpu, None if everyone else admitted, request, pod_cpu,
                                     arrays)
    assert kept == np.where(fit, level, -1).tolist()  # levels are 0-100: -1 is exactly "does not fit"
    # each row alone, as a filter re-scoring one changed row meets it
    for k in range(len(states)):
        alone = fgd_few.falls_few(free[k:k + 1], memory[k:k + 1], whole[k:k + 1], cpu[k:k + 1],
                                  None if everyone else admitted[k:k + 1], request, pod_cpu, arrays)
        assert alone == ([few_fall[k]], [few_fit[k]])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), max_size=300), st.integers(1, 6))
def test_pairwise_sum_is_numpys_order(terms, rows):
    """The batch sums [rows, T] arrays over T: numpy's pairwise order, which a plain running sum
    does not reproduce (the differences show in the last bits)."""
    spread = np.array(terms, dtype=float) * np.logspace(-8, 8, len(terms))
    table = np.tile(spread, (rows, 1)) * np.arange(1, rows + 1)[:, None]
    summed = table.sum(-1)
    assert [fgd_batch.pairwise_sum(row) for row in table.tolist()] == summed.tolist()


def test_a_running_sum_would_differ():
    """The test above can fail: over these terms a running sum is not numpy's."""
    rng = np.random.default_rng(7)
    terms = (rng.standard_normal(40) * 10.0 ** rng.integers(-6, 7, 40)).tolist()
    running = 0.0
    for term in terms:
        running += term
    assert fgd_batch.pairwise_sum(terms) == np.add.reduce(np.array(terms))
    assert running != np.add.reduce(np.array(terms))


@settings(max_examples=300, deadline=None)
@given(st.lists(node_states(), min_size=1, max_size=6), WIDE_MIXES, st.integers(0, 4000), REQUESTS,
       st.lists(st.tuples(st.booleans(), st.integers(-1, 1)), min_size=6, max_size=6))
def test_few_rows_at_their_cpu_bound(states, mix, pod_cpu, request, aims):
    """Each row's headroom at the CPU of as many copies of the typical pods that ask CPU as its
    fitting cards hold, before or after the pod, and a millicore either side: where the batch
    starts counting CPU copies, the few-rows path does too."""
    asking = [shape for shape, _ in mix.shapes if shape.cpu_milli > 0]
    if not asking:
        mix = Mix.of([*mix.shapes, (Shape(30, 0, 1, 1000), 1.0)])
        asking = [Shape(30, 0, 1, 1000)]
    aimed = []
    for state, (after, nudge) in zip(states, aims, strict=False):
        free = _free_after(state, request) if after else [c.free_cores for c in state.cards if c.healthy]
        aimed.append(replace(state, headroom=Headroom((pod_cpu if after else 0) + _copies_cpu(free, asking) + nudge,
                                                      10**6)))
    arrays = MixArrays(mix)
    free, memory, whole, cpu = _arrays(aimed)
    admitted = arrays.admit_all(len(aimed))
    fall, fit = fgd_batch.falls_of(free, memory, whole, cpu, admitted, request, pod_cpu, arrays)
    for k in range(len(aimed)):
        alone, fits = fgd_few.falls_few(free[k:k + 1], memory[k:k + 1], whole[k:k + 1], cpu[k:k + 1], None, request,
                                        pod_cpu, arrays)
        assert fits == [bool(fit[k])]
        if fit[k]:
            assert alone[0].hex() == fall[k].hex()


@settings(max_examples=150, deadline=None)
@given(data=st.data(), layout=st.lists(cards, min_size=2, max_size=5),
       ask=st.builds(lambda c, m: [(c, m)], st.integers(1, 99), st.integers(1, 64)), batch_only=st.booleans())
def test_levels_follow_cpu_headroom_for_one_request_shape(data, layout, ask, batch_only):
    """The same request shape filtered again and again (its levels memoised per row) while the
    nodes' CPU headroom (and labels) move around the few copies of it that fit: the node passed is always
    the core's best with the headroom of the moment (a level kept past a headroom change fails).
    ``batch_only``: every re-scoring through the numpy batch and its per-snapshot memo of the
    fragment before the pod, however few rows changed."""
    with patch.object(decisions, "_FGD_FEW_ROWS", -1 if batch_only else decisions._FGD_FEW_ROWS):
        _follow_cpu_headroom(data, layout, ask)


def _follow_cpu_headroom(data: st.DataObject, layout: list[list[int]], ask: list[tuple[int, int]]) -> None:
    ledger, hosts = _ledger_of(layout), HostHeadroom()
    fgd = Decisions(ledger, None, policy="fgd-filter", hosts=hosts)
    names = sorted(ledger.nodes)
    cpu = data.draw(st.sampled_from(["1", "2", "4"]))
    selector = data.draw(st.booleans())  # the typical pod then admits only the nodes labelled gpu=T4
    for step in range(data.draw(st.integers(2, 8))):
        for name in data.draw(st.lists(st.sampled_from(names), max_size=len(names))):
            labels = data.draw(st.sampled_from([{}, {"gpu": "T4"}, {"gpu": "A10"}]))
            hosts.on_node("MODIFIED", {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": {
                "cpu": data.draw(st.sampled_from(["0", "1", "2", "3", "4", "6", "8", "12", "64"])), "memory": "64Gi"}}})
        if data.draw(st.booleans()):
            node = data.draw(st.sampled_from(names))
            card = data.draw(st.integers(0, len(ledger.node(node).cards) - 1))
            ledger.put(Holding(f"uid{step}", "ns", f"h{step}", node, (
                ContainerAllocation(0, "c", (CardShare(card, "", 25, 8),)),)))
        args = _ask(ask, step, cpu, selector, names)
        fgd.learn_bound(args.pod)  # as its bind would: a typical pod asking CPU, with the selector
        passed = fgd.filter(args).passed
        _assert_the_core_best(passed, fgd, ledger, hosts, args)


def _ledger_of(layout: list[list[int]]) -> Ledger:
    """A ledger of nodes n0, n1, ... with the cards (GiB each) of ``layout``."""
    ledger = Ledger()
    for n, specs in enumerate(layout):
        ledger.set_node(f"n{n}", NodeCards(tuple(Card(i, f"u{i}", "m", gib * 1024) for i, gib in enumerate(specs)),
                                           None, "inventory"))
    return ledger


def _ask(ask: list[tuple[int, int]], step: int, cpu: str, selector: bool, names: list[str]) -> ExtenderArgs:
    """kube-scheduler's filter arguments for a pod of ``ask`` (its own uid per step)."""
    pod = pod_for(ask)
    pod["metadata"]["uid"] = f"ask{step}"
    pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu}
    if selector:
        pod["spec"]["nodeSelector"] = {"gpu": "T4"}
    return ExtenderArgs(pod=pod, node_names=names, nodes=None, raw_nodes=None)


def _assert_the_core_best(passed: list[str], fgd: Decisions, ledger: Ledger, hosts: HostHeadroom,
                          args: ExtenderArgs) -> None:
    """fgd-filter passed the core's best node (FGD level with the headroom and labels of the moment),
    whenever more than one node fits."""
    fits = Decisions(ledger, None).filter(args).passed
    if len(fits) > 1:
        view = fgd._fgd_view(args.pod)
        requests = read_ask(args.pod, fgd.names, "fgd-filter").requests
        best = {n: placement.fgd_level(replace(_state(ledger, n), headroom=hosts.headroom(n),
                                               labels=hosts.labels(n)), requests, view) for n in fits}
        top = max(best.values())
        assert passed == [min(n for n in fits if best[n] == top)]


def test_numpy_exp_of_an_element_does_not_depend_on_the_array():
    """The few-rows path takes numpy's exp of 1-4 values, the batch of thousands: each element
    must come out the same (a SIMD kernel with a different tail or short-array path would not)."""
    rng = np.random.default_rng(11)
    values = rng.uniform(-40, 40, 20_000)
    whole = np.exp(values)
    for size in (1, 2, 3, 4):
        parts = np.concatenate([np.exp(values[i:i + size]) for i in range(0, len(values) - size + 1, size)])
        assert parts.tolist() == whole[:len(parts)].tolist()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(-800, 800, allow_nan=False), st.integers(-800, 800).map(float)),
                min_size=1, max_size=4))
def test_few_rows_level_is_the_batch_expression(falls):
    """The few rows' level arithmetic (``levels_of_falls``: numpy's exp, then Python's add, divide
    and int) against the batch's ``level_of_fall``, falls near whole levels included."""
    near = [8 * float(np.log(100 / k - 1)) for k in range(1, 100, 7)]  # where the level steps
    tried = falls + near + [float(np.nextafter(f, 1e9)) for f in near] + [float(np.nextafter(f, -1e9)) for f in near]
    assert fgd_few.levels_of_falls(tried) == fgd_batch.level_of_fall(np.array(tried)).tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(node_states(), min_size=1, max_size=30), WIDE_MIXES, st.booleans())
def test_typical_pods_first_fragment_is_the_rows_first_sum(states, mix, everyone):
    """The batch lays (row, value) entries out typical pods first and sums over them run by run:
    bit for bit what the rows-first layout and numpy's ``sum(-1)`` give (how it was computed)."""
    arrays = MixArrays(mix)
    free, _, _, cpu = _arrays(states)
    count, fitting = counts_of(free, arrays)
    total = np.clip(free, 0, CORES_PER_CARD).sum(1).astype(float)
    admitted = arrays.admit_all(len(states)) if everyone else arrays.admitted(s.labels for s in states)
    caps = arrays.caps(cpu, fitting)
    use = (1 - arrays.blend) * fitting + arrays.blend * fitting
    ok = admitted & (count >= arrays.cards)
    if caps is not None:
        fit = fitting[caps.rows]
        use[caps.rows] = (1 - arrays.blend) * np.minimum(fit, caps.cap) + arrays.blend * fit
        ok[caps.rows] &= caps.one
    rows_first = (np.where(ok, total[:, None] - use, total[:, None]) * arrays.weight).sum(-1)
    got = arrays.capped_fragment(total, count.T, fitting.T, None if everyone else admitted.T, caps)
    assert [x.hex() for x in got.tolist()] == [x.hex() for x in rows_first.tolist()]


@settings(max_examples=200, deadline=None)
@given(st.lists(node_states(), min_size=1, max_size=30), WIDE_MIXES)
def test_counts_of_counts_each_rows_cards(states, mix):
    """Per row and typical pod: how many of its cards fit it and their free cores, summed card
    position by card position in the batch, counted here card by card."""
    arrays = MixArrays(mix)
    free, _, _, _ = _arrays(states)
    count, fitting = counts_of(free, arrays)
    shapes = [shape for shape, _ in mix.shapes]
    for row, layout in enumerate(free.tolist()):
        cores = [min(max(v, 0), CORES_PER_CARD) for v in layout]
        need = [CORES_PER_CARD if s.whole else s.cores for s in shapes]
        assert count[row].tolist() == [float(sum(1 for v in cores if v >= n)) for n in need]
        assert fitting[row].tolist() == [float(sum(v for v in cores if v >= n)) for n in need]


@settings(max_examples=150, deadline=None)
@given(data=st.data(), layout=st.lists(cards, min_size=2, max_size=6),
       ask=st.builds(lambda c, m: [(c, m)], st.integers(1, 99), st.integers(1, 16)))
def test_fragment_before_follows_label_changes_within_a_snapshot(data, layout, ask):
    """Two filters of one request shape under one mix snapshot, the nodes' labels changed between
    them and nothing else (same cards, same CPU headroom, so every row keeps its stamp): the
    typical pod's node selector now admits other rows, and the fragment before the pod kept per
    snapshot (the columns ``RequestColumns`` keeps, per labels version) must be recomputed, not reused. Each filter passes the
    core's best node, all rows scored through the numpy batch and its memo."""
    ledger, hosts = _ledger_of(layout), HostHeadroom()
    names = sorted(ledger.nodes)
    for k, (node, cores) in enumerate(data.draw(st.lists(st.tuples(st.sampled_from(names), st.integers(1, 100)),
                                                         max_size=8))):
        card = data.draw(st.integers(0, len(ledger.node(node).cards) - 1))
        ledger.put(Holding(f"uid{k}", "ns", f"h{k}", node, (ContainerAllocation(0, "c", (CardShare(card, "", cores, 1),)),)))
    fgd = Decisions(ledger, None, policy="fgd-filter", hosts=hosts)
    labelled = st.lists(st.sampled_from([{}, {"gpu": "T4"}]), min_size=len(names), max_size=len(names))
    first = data.draw(labelled)
    then = data.draw(labelled.filter(first.__ne__))
    snapshot = None
    with patch.object(decisions, "_FGD_FEW_ROWS", -1):
        for step, labels in enumerate((first, then)):
            for name, node_labels in zip(names, labels, strict=True):
                hosts.on_node("MODIFIED", {"metadata": {"name": name, "labels": node_labels},
                                           "status": {"allocatable": {"cpu": "8", "memory": "64Gi"}}})
            args = _ask(ask, step, "1", True, names)
            fgd.learn_bound(args.pod)  # as its bind would: a typical pod with the node selector
            passed = fgd.filter(args).passed
            if snapshot is None:
                snapshot = fgd.typical_snapshot
            assert fgd.typical_snapshot is snapshot  # the second filter decides with the same snapshot
            _assert_the_core_best(passed, fgd, ledger, hosts, args)
