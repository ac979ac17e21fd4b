"""When an idle or hoarded GPU share is warned about and then reclaimed: a pure state machine.

The reclaimer calls ``classify`` on the usage points a node reported since its last pass,
then ``step`` with the server's previous ``ShareState`` and its own clock. Nothing here
reads a clock, a node or the Hub, so every rule is tested as a plain function.

- *active*: the pass's utilisation integrated over time (the time-weighted mean of its
  points) is at or above ``idle_utilization``: one busy sample among idle ones does not keep a
  share, only keeping the card busy at that level on average does;
- *idle*: not active, and the share holds less memory than ``idle_memory_mib`` at its latest
  known point;
- *hoarding*: not active, but memory held;
- *unknown*: no known point (node unreachable, a share too new to have been sampled, or no GPU
  process of the pod seen: the node sends those points as null, NaN here, since a process the
  daemon cannot see looks the same). A pass of unknown points alone is never idle; in a pass
  with a known point the daemon demonstrably sees the pod's processes, so its unknown points
  are "no process" and count as no compute.

A share quiet (idle or hoarding) for ``idle_seconds`` (idle) or ``hoard_seconds``
(hoarding) is warned, with a deadline ``grace_seconds`` later; "keep my GPU" moves the
deadline by ``postpone_seconds``, at most ``max_postpones`` times; any compute clears the
warning and the count; at the deadline, still quiet, the share is reclaimed. An unknown
pass changes nothing and never acts: the reclaimer does not act on data it has not seen.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

ACTIVE, IDLE, HOARDING, UNKNOWN = "active", "idle", "hoarding", "unknown"
KINDS = (ACTIVE, IDLE, HOARDING, UNKNOWN)
ACTIONS = ("cpu", "shrink", "stop")
"""What reclaiming does: restart on a CPU-only server, restart on a smaller share, or stop."""

NONE, WARN, ACT, CLEAR = "none", "warn", "act", "clear"


@dataclass(frozen=True)
class Policy:
    idle_utilization: float = 1.0
    """Below this (percent of one card, summed over the share's cards) a point computes nothing."""
    idle_memory_mib: float = 512.0
    """A quiet share holding less than this is idle; holding more, it is hoarding."""
    idle_seconds: float = 3600.0
    hoard_seconds: float = 7200.0
    grace_seconds: float = 900.0
    postpone_seconds: float = 3600.0
    max_postpones: int = 2
    action: str = "cpu"
    exempt: bool = False

    def __post_init__(self) -> None:
        for name in ("idle_utilization", "idle_memory_mib", "idle_seconds", "hoard_seconds",
                     "grace_seconds", "postpone_seconds"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
                    or value < 0:
                raise ValueError(f"{name} must be a number >= 0, not {value!r}")
        if not isinstance(self.max_postpones, int) or isinstance(self.max_postpones, bool) \
                or self.max_postpones < 0:
            raise ValueError(f"max_postpones must be an integer >= 0, not {self.max_postpones!r}")
        if self.action not in ACTIONS:
            raise ValueError(f"action {self.action!r} is not one of {', '.join(ACTIONS)}")

    def quiet_limit(self, kind: str) -> float:
        return self.hoard_seconds if kind == HOARDING else self.idle_seconds


@dataclass(frozen=True)
class ShareState:
    kind: str = UNKNOWN
    """The latest pass's classification (unknown passes leave it)."""
    quiet_since: float | None = None
    """The reclaimer's time of the first pass of this quiet spell (None while computing)."""
    warned_at: float | None = None
    deadline: float | None = None
    postpones: int = 0
    reclaimed_at: float | None = None
    """Set once the action was decided; no further decision until the server is gone."""

    @property
    def warned(self) -> bool:
        return self.deadline is not None and self.reclaimed_at is None


@dataclass(frozen=True)
class Decision:
    kind: str = NONE
    """none | warn | act | clear (a warning withdrawn: the share computes again, or became exempt)."""
    reason: str = ""
    """idle | hoarding (warn, act)."""
    deadline: float | None = None


def classify(points: Iterable[Sequence[float]], policy: Policy) -> str:
    """``points`` are (t, memory MiB, utilisation %) oldest first, as the node reports them; NaN
    memory or utilisation marks an unknown point (no GPU process of the pod seen)."""
    ordered = list(points)
    known = [p for p in ordered if not (math.isnan(p[1]) or math.isnan(p[2]))]
    if not known:
        return UNKNOWN
    # One known point shows the daemon sees this pod's processes, so the pass's other points are
    # "no process": no compute. Else stopping the process between bursts would leave only the bursts.
    used = [0.0 if math.isnan(p[2]) else p[2] for p in ordered]
    # each point stands for the interval it closes (the first one: the interval after it)
    spans = [max(0.0, ordered[i][0] - ordered[i - 1][0]) for i in range(1, len(ordered))]
    spans.insert(0, spans[0] if spans else 1.0)
    time = sum(spans)
    mean = sum(span * u for span, u in zip(spans, used, strict=True)) / time if time > 0 else sum(used) / len(used)
    if mean >= policy.idle_utilization:
        return ACTIVE
    return HOARDING if known[-1][1] >= policy.idle_memory_mib else IDLE


def step(state: ShareState, kind: str, now: float, policy: Policy) -> tuple[ShareState, Decision]:
    """The share's next state and what to do now, after a pass that classified it ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    if state.reclaimed_at is not None:
        return state, Decision()
    if policy.exempt:
        return ShareState(kind=kind if kind != UNKNOWN else state.kind), \
            Decision(CLEAR) if state.warned else Decision()
    if kind == UNKNOWN:
        return state, Decision()
    if kind == ACTIVE:
        return ShareState(kind=ACTIVE), Decision(CLEAR) if state.warned else Decision()
    quiet_since = now if state.quiet_since is None else state.quiet_since
    state = replace(state, kind=kind, quiet_since=quiet_since)
    if state.deadline is not None:
        if now >= state.deadline:
            return replace(state, reclaimed_at=now), Decision(ACT, kind, state.deadline)
        return state, Decision()
    if now - quiet_since >= policy.quiet_limit(kind):
        deadline = now + policy.grace_seconds
        return replace(state, warned_at=now, deadline=deadline), Decision(WARN, kind, deadline)
    return state, Decision()


class PostponeRefused(ValueError):
    """Why "keep my GPU" cannot postpone now (the message is for the user)."""


def postpone(state: ShareState, now: float, policy: Policy) -> ShareState:
    """"Keep my GPU": the deadline moves ``postpone_seconds`` past the later of now and itself."""
    if state.reclaimed_at is not None:
        raise PostponeRefused("this share has already been reclaimed")
    if not state.warned or state.deadline is None:
        raise PostponeRefused("this share has no pending reclaim to postpone")
    if state.postpones >= policy.max_postpones:
        raise PostponeRefused(f"the reclaim has been postponed {state.postpones} times already, "
                              f"the most this hub allows")
    return replace(state, deadline=max(state.deadline, now) + policy.postpone_seconds,
                   postpones=state.postpones + 1)


def gpu_hours(cores: int, state: ShareState, now: float) -> float:
    """The card-hours a reclaimed share had sat quiet: cards held (cores / 100) x quiet time."""
    if state.quiet_since is None:
        return 0.0
    return max(0.0, now - state.quiet_since) / 3600.0 * cores / 100.0


def describe(state: ShareState, now: float, policy: Policy) -> dict[str, object]:
    """The user-facing view of a share's state (the reclaimer's API, the panel, %vgpu status)."""
    phase = "reclaimed" if state.reclaimed_at is not None else "warned" if state.warned else \
        "exempt" if policy.exempt else state.kind
    return {
        "phase": phase,
        "reason": state.kind if phase in ("warned", "reclaimed") else None,
        "quietSeconds": None if state.quiet_since is None else round(now - state.quiet_since, 1),
        "deadline": state.deadline if state.warned else None,
        "secondsLeft": round(max(0.0, state.deadline - now), 1) if state.warned and state.deadline is not None else None,
        "postponesLeft": max(0, policy.max_postpones - state.postpones),
        "postponeSeconds": policy.postpone_seconds,
        "action": policy.action,
    }
