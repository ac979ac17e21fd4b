"""Issue 17: the reclaim policy as a pure function of usage and the clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_vgpu.reclaimer.policy import (
    ACT,
    ACTIVE,
    CLEAR,
    HOARDING,
    IDLE,
    NONE,
    UNKNOWN,
    WARN,
    Policy,
    PostponeRefused,
    ShareState,
    classify,
    describe,
    gpu_hours,
    postpone,
    step,
)

POLICY = Policy(idle_utilization=2.0, idle_memory_mib=500, idle_seconds=600, hoard_seconds=1200,
                grace_seconds=300, postpone_seconds=600, max_postpones=2)


def run(kinds: list[tuple[float, str]], policy: Policy = POLICY, state: ShareState | None = None):
    state = state or ShareState()
    decisions = []
    for now, kind in kinds:
        state, decision = step(state, kind, now, policy)
        decisions.append((now, decision.kind))
    return state, decisions


def test_classify() -> None:
    assert classify([], POLICY) == UNKNOWN
    assert classify([(1, 0, 0), (2, 100, 0.5)], POLICY) == IDLE
    assert classify([(1, 9000, 0), (2, 600, 1.9)], POLICY) == HOARDING
    assert classify([(1, 0, 0), (2, 0, 6.0), (3, 0, 0)], POLICY) == ACTIVE  # 2 % on average
    # memory freed by the end of the window: idle, whatever it held before
    assert classify([(1, 9000, 0), (2, 10, 0)], POLICY) == IDLE


NAN = float("nan")


def test_one_busy_sample_among_idle_ones_does_not_keep_a_share() -> None:
    """Issue 32: a sample at the threshold per pass kept a share forever; the pass's utilisation
    integrated over time decides, so staying active costs the threshold's share of the card."""
    minute = [(t, 100, 0.0) for t in range(60)]
    minute[30] = (30, 100, 2.0)
    assert classify(minute, POLICY) == IDLE
    minute[30] = (30, 100, 100.0)  # one second at full load is still 1.7 % of the minute
    assert classify(minute, POLICY) == IDLE
    assert classify([(t, 100, 2.0) for t in range(60)], POLICY) == ACTIVE
    assert classify([(t, 100, 8.0 if t % 4 == 0 else 0.0) for t in range(60)], POLICY) == ACTIVE  # bursts, 2 % mean


def test_utilisation_is_weighted_by_the_time_each_point_stands_for() -> None:
    # ten quick idle samples, then one busy point closing a minute the sampler did not see in between
    points = [(t / 10, 0, 0.0) for t in range(10)] + [(61.0, 0, 3.0)]
    assert classify(points, POLICY) == ACTIVE
    points = [(t / 10, 0, 3.0) for t in range(10)] + [(61.0, 0, 0.0)]
    assert classify(points, POLICY) == IDLE


def test_a_pass_with_no_process_seen_is_unknown_never_idle() -> None:
    """Points with no GPU process seen (null from the node) may be a process the daemon cannot see:
    a pass of them alone is unknown and acts on nothing, however long it lasts."""
    assert classify([(1, NAN, NAN), (2, NAN, NAN)], POLICY) == UNKNOWN
    state, decisions = run([(t, classify([(t, NAN, NAN)], POLICY)) for t in range(0, 5000, 100)])
    assert state.quiet_since is None and {d for _, d in decisions} == {NONE}
    assert classify([(1, NAN, NAN), (2, 9000, 0), (3, NAN, NAN)], POLICY) == HOARDING  # its latest known memory


def test_stopping_the_process_between_bursts_does_not_keep_a_share() -> None:
    """Once a point of the pass is known the daemon sees the pod's processes: the pass's other
    points are no process, no compute, so a burst per pass is judged over the whole pass."""
    burst = [(t, NAN, NAN) for t in range(60)]
    burst[59] = (59, 300, 60.0)
    assert classify(burst, POLICY) == IDLE  # 60 % for one second of the minute: 1 %
    burst[58] = (58, 300, 60.0)
    burst[57] = (57, 300, 60.0)
    assert classify(burst, POLICY) == ACTIVE  # three seconds: 3 %


def test_idle_warned_then_reclaimed() -> None:
    state, decisions = run([(t, IDLE) for t in range(0, 1000, 100)])
    assert [d for d in decisions if d[1] != NONE] == [(600, WARN), (900, ACT)]
    assert state.reclaimed_at == 900 and state.kind == IDLE
    # after acting, nothing more until the server is gone
    assert step(state, IDLE, 5000, POLICY)[1].kind == NONE


def test_hoarding_has_its_own_limit() -> None:
    _, decisions = run([(t, HOARDING) for t in range(0, 2000, 100)])
    assert [d for d in decisions if d[1] != NONE] == [(1200, WARN), (1500, ACT)]


def test_activity_clears_a_warning_and_restarts_the_count() -> None:
    _, decisions = run([(0, IDLE), (600, IDLE), (700, ACTIVE), (800, IDLE), (1300, IDLE), (1400, IDLE)])
    assert [d for d in decisions if d[1] != NONE] == [(600, WARN), (700, CLEAR), (1400, WARN)]


def test_unknown_never_acts_nor_counts_as_activity() -> None:
    state, decisions = run([(0, IDLE), (600, IDLE), (900, UNKNOWN), (1000, UNKNOWN)])
    assert [d for d in decisions if d[1] != NONE] == [(600, WARN)]
    assert state.warned and state.quiet_since == 0
    assert step(state, IDLE, 1001, POLICY)[1].kind == ACT


def test_postpone_is_limited() -> None:
    state, _ = run([(0, IDLE), (600, IDLE)])
    assert state.deadline == 900
    state = postpone(state, 700, POLICY)
    assert state.deadline == 1500 and state.postpones == 1
    assert step(state, IDLE, 1000, POLICY)[1].kind == NONE
    state = postpone(state, 1600, POLICY)  # after the deadline, before a pass: from now
    assert state.deadline == 2200
    with pytest.raises(PostponeRefused, match="2 times"):
        postpone(state, 1700, POLICY)
    assert describe(state, 1700, POLICY)["postponesLeft"] == 0
    assert step(state, IDLE, 2200, POLICY)[1].kind == ACT


def test_postpone_needs_a_warning() -> None:
    with pytest.raises(PostponeRefused, match="no pending reclaim"):
        postpone(ShareState(kind=IDLE, quiet_since=0), 10, POLICY)
    with pytest.raises(PostponeRefused, match="already"):
        postpone(ShareState(kind=IDLE, quiet_since=0, deadline=5, reclaimed_at=5), 10, POLICY)


def test_exempt_is_never_warned_and_a_warning_is_withdrawn() -> None:
    exempt = Policy(idle_seconds=0, grace_seconds=0, exempt=True)
    _, decisions = run([(t, IDLE) for t in range(0, 5000, 100)], exempt)
    assert {d for _, d in decisions} == {NONE}
    warned, _ = run([(0, IDLE), (600, IDLE)])
    assert step(warned, IDLE, 700, exempt)[1].kind == CLEAR


def test_describe_and_gpu_hours() -> None:
    state, _ = run([(0, HOARDING), (1200, HOARDING)])
    view = describe(state, 1300, POLICY)
    assert view == {"phase": "warned", "reason": HOARDING, "quietSeconds": 1300, "deadline": 1500,
                    "secondsLeft": 200, "postponesLeft": 2, "postponeSeconds": 600, "action": "cpu"}
    assert gpu_hours(50, state, 3600) == pytest.approx(0.5)
    assert gpu_hours(50, ShareState(kind=ACTIVE), 3600) == 0


@pytest.mark.parametrize("bad", [{"idle_seconds": -1}, {"grace_seconds": float("nan")}, {"max_postpones": -1},
                                 {"action": "delete"}, {"idle_utilization": True}])
def test_bad_policy(bad: dict) -> None:
    with pytest.raises(ValueError):
        Policy(**bad)


kinds = st.sampled_from([ACTIVE, IDLE, HOARDING, UNKNOWN])
gaps = st.floats(min_value=0, max_value=2000, allow_nan=False)
policies = st.builds(Policy, idle_seconds=gaps, hoard_seconds=gaps, grace_seconds=gaps,
                     postpone_seconds=gaps, max_postpones=st.integers(0, 3), exempt=st.booleans())


@settings(max_examples=300, deadline=None)
@given(policies, st.lists(st.tuples(gaps, kinds, st.booleans()), max_size=40))
def test_properties(policy: Policy, passes: list[tuple[float, str, bool]]) -> None:
    """Whatever the usage: an action only after a warning and its deadline, only on a quiet
    pass, never for an exempt share; the quiet spell it acts on is at least the limit plus
    the grace; postpones stay within the limit."""
    state, now = ShareState(), 0.0
    for gap, kind, keep in passes:
        now += gap
        if keep:
            try:
                state = postpone(state, now, policy)
            except PostponeRefused:
                pass
        before = state
        state, decision = step(state, kind, now, policy)
        assert state.postpones <= policy.max_postpones
        if decision.kind == ACT:
            assert not policy.exempt and kind in (IDLE, HOARDING)
            assert before.warned and before.deadline is not None and now >= before.deadline
            assert before.quiet_since is not None and before.warned_at is not None
            assert now - before.quiet_since >= min(policy.idle_seconds, policy.hoard_seconds) + policy.grace_seconds
        if decision.kind == WARN:
            assert not policy.exempt and kind in (IDLE, HOARDING) and not before.warned
        if kind == ACTIVE and before.reclaimed_at is None:
            assert decision.kind in (NONE, CLEAR) and state.quiet_since is None and not state.warned
