"""fgd-filter across mix snapshot moves: the levels kept per request and typical pod
(``fgd_batch.RequestColumns``), re-weighed when the snapshot moves, equal the batch's from
scratch bit for bit (falls, not only levels), whatever the rows, typical pods and weights did in
between; and a filter through them passes the core's best node."""

from __future__ import annotations

from unittest.mock import patch

import numpy as np
from extender_support import mixes
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fgd_few_rows import REQUESTS, _ask, _assert_the_core_best, _ledger_of
from test_fgd_filter_property import batch, node_states
from test_filter_property import cards
from vgpu_plugin.extender import decisions
from vgpu_plugin.extender.decisions import Decisions
from vgpu_plugin.extender.fgd_batch import CountMemo, MixArrays, NodeRows, RequestColumns, falls_of
from vgpu_plugin.extender.headroom import HostHeadroom
from vgpu_plugin.extender.ledger import Holding

from jupyter_vgpu.core.contract import CardShare, ContainerAllocation
from jupyter_vgpu.core.fragment import Mix

# a pool of typical pods the snapshots draw from: a move may reweigh them, drop some, bring
# new ones and reorder them (Mix sorts by weight); 1-12 of them (pairwise sums from 8 on)
POOLS = mixes(pods=(1, 12), cpus=(0, 250, 1000, 4000, 12_000), weights=(0.01, 7))


def _write(rows: NodeRows, k: int, state) -> None:
    node = batch(state)
    rows.set(str(k), node.free_cores, node.free_memory, node.whole_free)
    rows.set_cpu(k, np.nan if node.cpu_milli is None else float(node.cpu_milli))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), states=st.lists(node_states(), min_size=1, max_size=10), pool=POOLS,
       request=REQUESTS, pod_cpu=st.integers(0, 8000), everyone=st.booleans())
def test_columns_fall_as_the_batch_across_snapshot_moves(data, states, pool, request, pod_cpu, everyone):
    rows = NodeRows()
    for k, state in enumerate(states):
        _write(rows, k, state)
    labels = [batch(s).labels for s in states]
    shapes = [shape for shape, _ in pool.shapes]
    columns = RequestColumns()
    for _ in range(data.draw(st.integers(1, 6))):
        # the snapshot: some of the pool's typical pods, new weights
        kept = data.draw(st.lists(st.sampled_from(shapes), min_size=1, unique=True))
        mix = Mix.of([(shape, data.draw(st.floats(0.01, 7))) for shape in kept])
        arrays = MixArrays(mix)
        # rows changed since: cards, or only the CPU headroom
        for k in data.draw(st.lists(st.integers(0, len(states) - 1), max_size=3)):
            if data.draw(st.booleans()):
                _write(rows, k, data.draw(node_states()))
            else:
                rows.set_cpu(k, float(data.draw(st.integers(-2000, 40_000))))
        picked = np.array(data.draw(st.lists(st.integers(0, len(states) - 1), min_size=1, unique=True)),
                          dtype=np.int64)
        admitted = None if everyone else arrays.admitted(labels[k] for k in picked.tolist())
        fall, fit = columns.falls("request", rows, picked, admitted, request, pod_cpu, arrays, CountMemo(arrays))
        want, want_fit = falls_of(rows.free[picked], rows.memory[picked], rows.whole[picked], rows.cpu[picked],
                                  arrays.admit_all(len(picked)) if admitted is None else admitted, request, pod_cpu,
                                  arrays)
        assert fit.tolist() == want_fit.tolist()
        # bit for bit where the pod fits (elsewhere the level is not read)
        assert [f.hex() for f in fall[fit].tolist()] == [f.hex() for f in want[fit].tolist()]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), layout=st.lists(cards, min_size=3, max_size=6))
def test_filter_through_kept_columns_passes_the_core_best(data, layout):
    """Filters of a few request shapes while the learned mix's snapshot moves (each of the first
    pods renews it) and claims land between them; every re-scoring goes through the kept columns
    (the few-rows path off), and each filter passes the core's best node under the snapshot of
    the moment."""
    ledger, hosts = _ledger_of(layout), HostHeadroom()
    names = sorted(ledger.nodes)
    for name in names:
        hosts.on_node("MODIFIED", {"metadata": {"name": name, "labels": {}},
                                   "status": {"allocatable": {"cpu": "16", "memory": "64Gi"}}})
    fgd = Decisions(ledger, None, policy="fgd-filter", hosts=hosts)
    asks = data.draw(st.lists(st.builds(lambda c, m: [(c, m)], st.integers(1, 99), st.integers(1, 16)),
                              min_size=1, max_size=3))
    snapshots = set()
    with patch.object(decisions, "_FGD_FEW_ROWS", -1):
        for step in range(data.draw(st.integers(2, 12))):
            if data.draw(st.booleans()):
                node = data.draw(st.sampled_from(names))
                card = data.draw(st.integers(0, len(ledger.node(node).cards) - 1))
                ledger.put(Holding(f"uid{step}", "ns", f"h{step}", node,
                                   (ContainerAllocation(0, "c", (CardShare(card, "", data.draw(st.integers(1, 60)),
                                                                          1),)),)))
            args = _ask(data.draw(st.sampled_from(asks)), step, data.draw(st.sampled_from(["1", "250m"])), False,
                        names)
            fgd.learn_bound(args.pod)  # as its bind would: each of the first pods renews the snapshot
            passed = fgd.filter(args).passed
            snapshots.add(fgd.typical_snapshot)
            _assert_the_core_best(passed, fgd, ledger, hosts, args)
