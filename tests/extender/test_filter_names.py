"""The cached filter's handling of the request's names (C-level passes over them, no set built)
equals the plain rule applied name by name: odd lists included (repeated names, names the
ledger does not know, the node holding the pod's own earlier claim), under every policy, with
every reason when no node passes and none when one does; and under fgd-filter, where that node
is scored apart from the batch, the node passed is the core's best with the pod's own claim
left out."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from test_filter_property import cards, pod_for, requests
from vgpu_plugin.extender.cache import NodeMemo
from vgpu_plugin.extender.decisions import Decisions, Filtered, fit, read_ask
from vgpu_plugin.extender.ledger import Holding, Ledger, NodeCards
from vgpu_plugin.extender.wire import ExtenderArgs

from jupyter_vgpu.core import contract, placement
from jupyter_vgpu.core.contract import CardShare, ContainerAllocation
from jupyter_vgpu.core.inventory import Card
from jupyter_vgpu.core.placement import CardState, NodeState

NAMES = contract.DEFAULT_NAMES
UNSEEN = "the extender has not seen this node yet"


def _plain(ledger: Ledger, names: list[str], pod: dict, policy: str) -> tuple[list[str], dict, dict]:
    """The filter's rule name by name, from scratch (no cache): the node holding the pod's own
    claim decided as if the pod held nothing there."""
    ask = read_ask(pod, NAMES, policy)
    own = ledger.holding(pod["metadata"]["uid"])
    passed, failed, unresolvable = [], {}, {}
    for name in names:
        entry = ledger.node(name)
        if entry is None or not entry.known:
            failed[name] = UNSEEN
            continue
        if own is not None and own.node == name:
            entry = entry.without(own.uid)
        reason, never = fit(entry, ask, NodeMemo())
        if reason is None:
            passed.append(name)
        else:
            (unresolvable if never else failed)[name] = reason
    return passed, failed, unresolvable


def _answer(names: list[str], plain: tuple[list[str], dict, dict]) -> Filtered:
    """The plain rule as the filter answers it: the reasons only when no node passes (kube-scheduler
    reads them only then), and how many names each kind of refusal covers, always."""
    passed, failed, unresolvable = plain
    counts = sum(name in failed for name in names), sum(name in unresolvable for name in names)
    return Filtered(passed, {}, {}, *counts) if passed else Filtered(passed, failed, unresolvable, *counts)


def _state(ledger: Ledger, name: str, without: str) -> NodeState:
    entry = ledger.node(name).without(without)
    return NodeState(tuple(CardState(c.index, c.memory_units, c.healthy, entry.used_cores[i], entry.used_memory[i])
                           for i, c in enumerate(entry.cards)))


@settings(max_examples=150, deadline=None)
@given(data=st.data(), layout=st.lists(cards, min_size=1, max_size=4))
def test_cached_filter_over_odd_name_lists_equals_the_plain_rule(data, layout):
    ledger = Ledger()
    for n, specs in enumerate(layout):
        ledger.set_node(f"n{n}", NodeCards(tuple(Card(i, f"u{i}", "m", gib * 1024) for i, gib in enumerate(specs)),
                                           None, "inventory"))
    known = sorted(ledger.nodes)
    deciders = {policy: Decisions(ledger, None, policy=policy) for policy in placement.POLICIES}
    for step in range(data.draw(st.integers(1, 8))):
        node = data.draw(st.sampled_from(known))
        card = data.draw(st.integers(0, len(ledger.node(node).cards) - 1))
        cores = data.draw(st.sampled_from([10, 25, 50, 100]))
        own = data.draw(st.booleans())  # the pod asking holds this claim (an earlier, interrupted bind)
        ledger.put(Holding(f"ask{step}" if own else f"uid{step}", "ns", f"h{step}", node, (
            ContainerAllocation(0, "c", (CardShare(card, "", cores, 0 if cores == 100 else 8),)),)))
        asks = data.draw(requests)
        pod = pod_for(asks)
        pod["metadata"]["uid"] = f"ask{step}"
        names = data.draw(st.lists(st.sampled_from([*known, "gone", "x"]), max_size=10))
        policy = data.draw(st.sampled_from(placement.POLICIES))
        decisions = deciders[policy]
        args = ExtenderArgs(pod=pod, node_names=names, nodes=None, raw_nodes=None)
        expected = _plain(ledger, names, pod, policy)
        assert decisions._filter(args, read_ask(pod, NAMES, policy)) == _answer(names, expected)
        decisions.learn_bound(pod)  # as its bind would: fgd-filter's mix moves with the pods asked about
        refused = [name for name in names if name not in expected[0]]  # no node passes: every reason
        assert decisions.filter(replace(args, node_names=refused)) == _answer(refused, _plain(ledger, refused, pod, policy))
        result = decisions.filter(args)
        fits = expected[0]
        if policy != "fgd-filter" or read_ask(pod, NAMES, policy).isolated or len(fits) <= 1:
            assert result == _answer(names, expected)
            continue
        assert result[1:] == _answer(names, expected)[1:] and len(result.passed) == 1
        view = decisions._fgd_view(pod)
        ask = read_ask(pod, NAMES, policy).requests
        level = {n: placement.fgd_level(replace(_state(ledger, n, pod["metadata"]["uid"])), ask, view)
                 for n in fits}
        best = max(level.values())
        assert result.passed == [min(n for n in fits if level[n] == best)]
