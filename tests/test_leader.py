"""The Lease decisions of extender/controller/leader.py, pure: who may acquire, how long a leader may act, how
long a call may take. The safety property is checked over arbitrary timelines (hypothesis): a standby never
acquires while the leader may still act on any write it made, whatever the network delays of either side.
The same code against a real API server, with the leader's traffic paused and refused: tests/test_leader_live.py.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from extender.controller.leader import LeaseRecord, Observed, call_budget, may_acquire, may_act, observe

LEADER, STANDBY = "replica-a", "replica-b"


def test_observe_keeps_the_time_a_version_was_first_seen() -> None:
    rec = LeaseRecord(LEADER, 15)
    first = observe(None, rec, "7", 100.0)
    assert observe(first, rec, "7", 130.0) is first  # same version: the wait runs from the first sighting
    again = observe(first, rec, "8", 130.0)
    assert again == Observed(rec, "8", 130.0)  # a renewal restarts it


def test_may_acquire_examples() -> None:
    held = Observed(LeaseRecord(LEADER, 15), "1", 100.0)
    assert may_acquire(None, STANDBY, 0.0, 15)  # no Lease: create it
    assert may_acquire(Observed(LeaseRecord("", 15), "1", 100.0), STANDBY, 100.0, 15)  # released
    assert may_acquire(held, LEADER, 100.0, 15)  # our own (a restarted container of the same pod)
    assert not may_acquire(held, STANDBY, 114.9, 15)
    assert may_acquire(held, STANDBY, 115.0, 15)
    # a holder that promised a longer lease than ours is waited for that long
    assert not may_acquire(Observed(LeaseRecord(LEADER, 40), "1", 100.0), STANDBY, 139.0, 15)


def test_may_act_and_the_call_budget_end_at_the_renew_deadline() -> None:
    assert not may_act(None, 5.0, 10.0)
    assert may_act(100.0, 109.99, 10.0) and not may_act(100.0, 110.0, 10.0)
    assert not may_act(100.0, 99.0, 10.0)  # a clock that went backwards is no authority
    assert call_budget(100.0, 104.0, 10.0) == 6.0
    assert call_budget(100.0, 111.0, 10.0) == 0.0
    assert call_budget(None, 111.0, 10.0) == 10.0  # a standby's calls: one deadline each


@example(renewed=1.098007527347524e-16, now=1.0, deadline=1.0)  # rounding: may act, budget was 0.0
@given(renewed=st.floats(0, 1e6), now=st.floats(0, 1e6), deadline=st.floats(1, 100))
def test_a_leaders_call_never_outlives_its_authority(renewed: float, now: float, deadline: float) -> None:
    budget = call_budget(renewed, now, deadline)
    assert budget >= 0
    if budget > 0:  # a call that may still start ends within the authority
        assert now + budget <= renewed + deadline + 1e-6
    if may_act(renewed, now, deadline):
        assert budget > 0


delays = st.floats(0, 5, allow_nan=False)


@settings(max_examples=500)
@given(
    lease_duration=st.integers(2, 60),
    deadline_fraction=st.floats(0.1, 0.95),
    leader_period=st.floats(0.2, 10),
    renewals=st.integers(1, 30),
    commit_delays=st.lists(delays, min_size=30, max_size=30),
    standby_start=st.floats(0, 60),
    standby_period=st.floats(0.2, 10),
    polls=st.lists(st.tuples(delays, delays, delays), min_size=60, max_size=60),
)
def test_a_standby_never_acquires_while_the_leader_may_act(
    lease_duration: int,
    deadline_fraction: float,
    leader_period: float,
    renewals: int,
    commit_delays: list[float],
    standby_start: float,
    standby_period: float,
    polls: list[tuple[float, float, float]],
) -> None:
    """The leader's writes (acquire, renewals) are sent every ``leader_period`` until its traffic stalls, and
    committed in order some delay later (a stalled connection: any delay). The standby polls every
    ``standby_period``: its GET reaches the server some delay after it was sent, the answer reaches it some delay
    later, and its conditional update commits some delay after that, refused (409) if a write of the leader
    committed meanwhile. When the standby's update succeeds, every write of the leader committed before it must
    have lost its authority (send + renew_deadline) by then: the two never act at once."""
    renew_deadline = lease_duration * deadline_fraction
    sends = [i * leader_period for i in range(renewals)]
    commits: list[float] = []
    for s, d in zip(sends, commit_delays, strict=False):
        commits.append(max(s + d, commits[-1] if commits else 0.0))  # one connection: committed in order
    seen: Observed | None = None
    for i, (to_server, back, update_delay) in enumerate(polls):
        at_server = standby_start + i * standby_period + to_server
        answered = at_server + back
        latest = max((k for k, c in enumerate(commits) if c <= at_server), default=None)
        if latest is None:
            continue  # no Lease yet: the leader's create races ours; one of the two gets 409 (not modelled)
        seen = observe(seen, LeaseRecord(LEADER, lease_duration), str(latest), answered)
        if not may_acquire(seen, STANDBY, answered, lease_duration):
            continue
        taken = answered + update_delay  # the standby acts from its update's answer, after this commit
        if any(at_server < c <= taken for c in commits):
            continue  # resourceVersion moved: 409, no authority
        for k, c in enumerate(commits):
            if c <= taken:
                assert sends[k] + renew_deadline < taken, (k, sends[k], renew_deadline, taken)
        return
