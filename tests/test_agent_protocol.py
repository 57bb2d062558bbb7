"""The agent protocol's pure decisions: every (phase, failure) -> rollback, restart reconciliation, retry policy."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.agent.protocol import (
    DestinationState,
    FailureKind,
    InDoubtAction,
    Phase,
    RetryPolicy,
    SourceAction,
    after_abort,
    backoff_schedule,
    check_declared,
    check_migration_id,
    in_doubt_action,
    reconcile_destination,
    reconcile_source,
    rollback_for,
    transfer_verdict,
)

NON_TERMINAL = [p for p in Phase if not p.terminal]
BEFORE_CUTOVER = [Phase.NEW, Phase.CHECKPOINTED, Phase.TRANSFERRED, Phase.PREPARED]


@pytest.mark.parametrize("phase", BEFORE_CUTOVER)
@pytest.mark.parametrize("kind", list(FailureKind))
def test_before_cutover_nothing_to_restore_and_everything_deleted(phase: Phase, kind: FailureKind) -> None:
    plan = rollback_for(phase, kind)
    assert plan.source is SourceAction.NOTHING
    assert plan.abort_destination
    assert not plan.keep_final_archive


@pytest.mark.parametrize("phase", [p for p in NON_TERMINAL if p not in BEFORE_CUTOVER])
@pytest.mark.parametrize("kind", list(FailureKind))
def test_from_cutover_on_the_final_image_is_kept_and_the_destination_fenced(phase: Phase, kind: FailureKind) -> None:
    plan = rollback_for(phase, kind)
    assert plan.keep_final_archive
    assert plan.abort_destination
    assert plan.source is not SourceAction.NOTHING


def test_failed_final_dump_verifies_the_process_resumed() -> None:
    assert rollback_for(Phase.CUTOVER, FailureKind.LOCAL).source is SourceAction.ENSURE_RUNNING


@pytest.mark.parametrize("phase", [Phase.FINAL_DUMPED, Phase.FINAL_TRANSFERRED])
def test_no_restore_request_sent_means_restore_locally(phase: Phase) -> None:
    assert rollback_for(phase, FailureKind.TRANSIENT).source is SourceAction.RESTORE_LOCAL


def test_restore_refused_restores_locally_but_unanswered_restore_is_resolved_first() -> None:
    assert rollback_for(Phase.RESTORE_SENT, FailureKind.REFUSED).source is SourceAction.RESTORE_LOCAL
    assert rollback_for(Phase.RESTORE_SENT, FailureKind.TRANSIENT).source is SourceAction.RESOLVE


@pytest.mark.parametrize("phase", [p for p in Phase if p.terminal])
def test_no_rollback_from_a_terminal_phase(phase: Phase) -> None:
    with pytest.raises(ValueError):
        rollback_for(phase, FailureKind.TRANSIENT)


def test_abort_fence_answers() -> None:
    assert after_abort(DestinationState.RESTORED) is SourceAction.COMMIT
    assert after_abort(DestinationState.COMMITTED) is SourceAction.COMMIT
    assert after_abort(DestinationState.RESTORING) is SourceAction.RESOLVE
    for s in (DestinationState.ABORTED, DestinationState.RESTORE_FAILED, DestinationState.STAGED):
        assert after_abort(s) is SourceAction.RESTORE_LOCAL


def test_in_doubt_restores_locally_only_when_the_pid_fences_a_second_copy() -> None:
    assert in_doubt_action(same_kernel=True, restore_fenced_by_pid=True) is InDoubtAction.RESTORE_LOCAL
    assert in_doubt_action(same_kernel=False, restore_fenced_by_pid=True) is InDoubtAction.KEEP_IN_DOUBT
    assert in_doubt_action(same_kernel=True, restore_fenced_by_pid=False) is InDoubtAction.KEEP_IN_DOUBT


@given(st.sampled_from(NON_TERMINAL), st.booleans(), st.booleans())
def test_reconcile_source_never_restores_a_running_or_never_stopped_process(
    phase: Phase, alive: bool, complete: bool
) -> None:
    action = reconcile_source(phase, alive, complete)
    if phase in BEFORE_CUTOVER:
        assert action is SourceAction.NOTHING
    elif phase is Phase.CUTOVER:
        if alive:
            assert action is SourceAction.NOTHING
        else:
            assert action is (SourceAction.RESOLVE if complete else SourceAction.ENSURE_RUNNING)
    else:
        # after the final dump only the destination can tell whether it runs there
        assert action is SourceAction.RESOLVE


def test_reconcile_destination() -> None:
    assert reconcile_destination(DestinationState.RESTORING, True) is DestinationState.RESTORED
    assert reconcile_destination(DestinationState.RESTORING, False) is DestinationState.RESTORE_FAILED
    assert reconcile_destination(DestinationState.RECEIVING, False) is DestinationState.UNKNOWN
    for s in (DestinationState.STAGED, DestinationState.RESTORED, DestinationState.ABORTED):
        assert reconcile_destination(s, False) is s


def test_phase_order_and_terminal() -> None:
    assert not Phase.PREPARED.process_may_be_stopped
    assert Phase.CUTOVER.process_may_be_stopped and Phase.RESTORE_SENT.process_may_be_stopped
    assert all(p.terminal for p in (Phase.COMMITTED, Phase.ROLLED_BACK, Phase.IN_DOUBT, Phase.FAILED))


def test_retry_defaults_are_three_attempts_with_backoff() -> None:
    p = RetryPolicy()
    assert p.attempts == 3
    assert backoff_schedule(p) == [0.2, 0.4]


@given(
    st.integers(1, 10),
    st.floats(0, 5, allow_nan=False),
    st.floats(0, 30, allow_nan=False),
    st.floats(1, 4, allow_nan=False),
)
def test_backoff_schedule_is_monotone_and_capped(attempts: int, initial: float, cap: float, mult: float) -> None:
    if cap < initial:
        with pytest.raises(ValueError):
            RetryPolicy(attempts=attempts, initial_backoff_seconds=initial, max_backoff_seconds=cap, multiplier=mult)
        return
    sched = backoff_schedule(
        RetryPolicy(attempts=attempts, initial_backoff_seconds=initial, max_backoff_seconds=cap, multiplier=mult)
    )
    assert len(sched) == attempts - 1
    assert all(0 <= w <= cap for w in sched)
    assert sched == sorted(sched)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempts": 0},
        {"attempts": True},
        {"initial_backoff_seconds": -1},
        {"jitter_seconds": float("nan")},
        {"multiplier": 0.5},
    ],
)
def test_retry_policy_rejects_bad_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_transfer_verdicts() -> None:
    sha = "a" * 64
    assert transfer_verdict(10, sha, 10, sha).ok
    assert "truncated" in transfer_verdict(10, sha, 4, sha).reason
    assert "oversized" in transfer_verdict(10, sha, 11, sha).reason
    assert "sha256 mismatch" in transfer_verdict(10, sha, 10, "b" * 64).reason


def test_declared_headers() -> None:
    assert check_declared("12", "A" * 64, 100) == (12, "a" * 64)
    for size, sha in [(None, "a" * 64), ("x", "a" * 64), ("-1", "a" * 64), ("101", "a" * 64), ("1", "zz")]:
        with pytest.raises(ValueError):
            check_declared(size, sha, 100)


@given(st.text(max_size=80))
def test_migration_ids_are_safe_path_segments(text: str) -> None:
    try:
        mid = check_migration_id(text)
    except ValueError:
        return
    assert "/" not in mid and ".." not in mid and len(mid) <= 63 and mid == mid.lower()
