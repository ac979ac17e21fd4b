"""The filter's verdicts kept by node slot (``VerdictCache.state`` and
``reason``), the slots of name lists met before (``DecisionCache.slots_of``) and fgd-filter's
rows found by slot never change a decision: over random sequences of claims added and dropped,
cards changed (a card turning unhealthy, memory changing), nodes removed and added again,
request shapes evicted from the cache and random name lists (repeats, unknown and removed
names, the node of the pod's own claim, a list sent again), the filter equals the plain rule name by name under every
policy, its reply's bytes equal those written from the plain rule (every reason, in the names'
order, when no node passes; none when one does), and fgd-filter passes the core's best node."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_filter_names import UNSEEN, _answer, _plain, _state
from test_filter_property import cards, pod_for, requests
from vgpu_plugin.extender import cache
from vgpu_plugin.extender.cache import FAILS, PASSES, UNDECIDED, DecisionCache, VerdictCache
from vgpu_plugin.extender.decisions import Decisions, read_ask
from vgpu_plugin.extender.ledger import Holding, Ledger, NodeCards
from vgpu_plugin.extender.wire import ExtenderArgs, dumps, filter_result

from jupyter_vgpu.core import contract, placement
from jupyter_vgpu.core.contract import CardShare, ContainerAllocation
from jupyter_vgpu.core.inventory import Card

NAMES = contract.DEFAULT_NAMES
FEW_ASKS = [[(25, 8)], [(10, 16)], [(100, 0)], [(200, 0)]]


def _node_cards(specs: list[tuple[int, bool]]) -> NodeCards:
    return NodeCards(tuple(Card(i, f"u{i}", "m", gib * 1024, healthy=healthy) for i, (gib, healthy) in enumerate(specs)),
                     None, "inventory")


changed_cards = st.lists(st.tuples(st.sampled_from([16, 24, 40]), st.booleans()), min_size=1, max_size=4)


def _fgd_best(decisions: Decisions, ledger: Ledger, pod: dict, fits: list[str]) -> str:
    """The core's best node among ``fits`` (fgd_level, the first by name among equals)."""
    view = decisions._fgd_view(pod)
    ask = read_ask(pod, NAMES, "fgd-filter").requests
    level = {n: placement.fgd_level(_state(ledger, n, pod["metadata"]["uid"]), ask, view) for n in fits}
    scored = {n: -1 if v is None else v for n, v in level.items()}
    best = max(scored.values())
    return min(n for n in fits if scored[n] == best)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), layout=st.lists(cards, min_size=2, max_size=5), evict=st.booleans())
def test_filter_by_slots_equals_the_plain_rule_across_changes(monkeypatch, data, layout, evict):
    if evict:  # a shape forgotten and decided again by a fresh cache between filters
        monkeypatch.setattr(cache, "MAX_CACHED_SHAPES", 1)
    ledger = Ledger()
    for n, specs in enumerate(layout):
        ledger.set_node(f"n{n}", _node_cards([(gib, True) for gib in specs]))
    every = [f"n{n}" for n in range(len(layout))]
    deciders = {policy: Decisions(ledger, None, policy=policy) for policy in placement.POLICIES}
    removed: set[str] = set()
    uids: list[str] = []
    previous: list[str] = []
    policy = data.draw(st.sampled_from(placement.POLICIES))  # one decider all along: its caches met again
    for step in range(data.draw(st.integers(1, 16))):
        action = data.draw(st.sampled_from(["put", "put", "drop", "cards", "remove", "none"]))
        known = [n for n in every if n not in removed]
        if action == "put" and known:
            node = data.draw(st.sampled_from(known))
            width = len(ledger.node(node).cards)
            card = data.draw(st.integers(0, max(0, width - 1)))
            cores = data.draw(st.sampled_from([10, 25, 50, 100]))
            uid = f"ask{step}" if data.draw(st.booleans()) else f"uid{step}"
            ledger.put(Holding(uid, "ns", f"h{step}", node, (
                ContainerAllocation(0, "c", (CardShare(card, "", cores, 0 if cores == 100 else 8),)),)))
            uids.append(uid)
        elif action == "drop" and uids:
            ledger.drop(uids.pop(data.draw(st.integers(0, len(uids) - 1))))
        elif action == "cards":  # a card unhealthy, memory changed, or a removed node back
            node = data.draw(st.sampled_from(every))
            ledger.set_node(node, _node_cards(data.draw(changed_cards)))
            removed.discard(node)
        elif action == "remove" and known:
            node = data.draw(st.sampled_from(known))
            ledger.remove_node(node)
            removed.add(node)
        pod = pod_for(data.draw(st.sampled_from(FEW_ASKS)) if data.draw(st.integers(0, 3)) else data.draw(requests))
        pod["metadata"]["uid"] = f"ask{step}"
        names = data.draw(st.lists(st.sampled_from([*every, "gone"]), max_size=12))
        if previous and data.draw(st.booleans()):  # the same list again, as new strings (its slots kept)
            names = [str(name + " ")[:-1] for name in previous]
        previous = names
        decisions = deciders[policy]
        args = ExtenderArgs(pod=pod, node_names=names, nodes=None, raw_nodes=None)
        expected = _plain(ledger, names, pod, policy)
        answer = _answer(names, expected)
        assert decisions._filter(args, read_ask(pod, NAMES, policy)) == answer
        decisions.learn_bound(pod)  # as its bind would: fgd-filter's mix moves with the pods asked about
        result = decisions.filter(args)
        if policy == "fgd-filter" and not read_ask(pod, NAMES, policy).isolated and len(expected[0]) > 1:
            answer = answer._replace(passed=[_fgd_best(decisions, ledger, pod, expected[0])])
        assert result == answer
        # the reply's bytes, as written from the plain rule (its reasons in the names' order)
        assert dumps(filter_result(args, *result[:3])) == dumps(filter_result(args, *answer[:3]))
        # the names refused alone: no node passes, and every reason is given
        refused = [name for name in names if name not in expected[0]]
        alone = ExtenderArgs(pod=pod, node_names=refused, nodes=None, raw_nodes=None)
        answer = _answer(refused, _plain(ledger, refused, pod, policy))
        result = decisions.filter(alone)
        assert result == answer and not result.passed
        assert dumps(filter_result(alone, *result[:3])) == dumps(filter_result(alone, *answer[:3]))
        for name in removed & set(refused):
            assert result.failed[name] == UNSEEN


def test_a_forgotten_verdict_reads_undecided_and_slot_minus_one_never_passes():
    """The last element of the state array stays undecided, so a name without a slot (-1)
    is decided afresh; a forgotten node's slot reads undecided again."""

    verdicts = VerdictCache()
    verdicts.set((None, False), 0)
    verdicts.set(("full", False), 5)
    assert verdicts.states(np.array([0, 5, -1, 3]), 6).tolist() == [PASSES, FAILS, UNDECIDED, UNDECIDED]
    assert verdicts.reason[5] == "full"
    verdicts.forget("b", 5)
    assert verdicts.states(np.array([5, -1]), 40).tolist() == [UNDECIDED, UNDECIDED]
    assert verdicts.state[-1] == UNDECIDED and verdicts.reason[5] is None


def test_a_kept_list_of_names_is_not_reused_once_a_slot_was_handed_out():
    """A list met before keeps its slots only while no slot was handed out since: a name of it
    without a slot then (a node not yet known) may have one now."""
    slots = DecisionCache(Ledger())
    slots.slot("a")
    slots.slot("c")
    assert slots.slots_of(["a", "b"]).tolist() == [0, -1]  # kept
    slots.slot("b")
    assert slots.slots_of(["a", "b"]).tolist() == [0, 2]
    kept = slots.slots_of(["a", "b"])  # kept again, and a copy each time
    kept[0] = 7
    assert slots.slots_of(["a", "b"]).tolist() == [0, 2]
