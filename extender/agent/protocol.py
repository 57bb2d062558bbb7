"""The migration protocol's pure decisions: phases, retry policy, which failure leads to which rollback.

No I/O, no clock, no asyncio: the coordinator (``migrate.py``) and the agents' restart reconciliation call
these functions with what they observed and carry out the answer. Keeping the decisions here lets every
(phase, failure) pair be tested exhaustively without CRIU, sockets or a cluster.

The protocol (source-coordinated; see README.md "Cutover"):

  1. CHECKPOINTED      source dumps with leave-running (pre-copy image C1); the process keeps running
  2. TRANSFERRED       C1 streamed to the destination with size + sha256; the destination verifies it
  3. PREPARED          the destination accepted the workload (backend ready, archive sane)
  4. CUTOVER           journaled *before* the final dump: from here the process may be stopped
  5. FINAL_DUMPED      final image C2 taken without leave-running: the process is stopped, C2 is the only copy
  6. FINAL_TRANSFERRED C2 streamed and verified at the destination
  7. RESTORE_SENT      the restore request left the source: from here the destination may be running it
  8. COMMITTED         the destination confirmed the restore; archives are deleted on both sides

Before CUTOVER a failure costs nothing: the process never stopped. After it, the source keeps C2 until the
destination confirms, and rolls back by restoring C2 locally. The one ambiguous case is a restore request
without an answer: the source then asks the destination to *abort* (an atomic fence: answered "restored"
if the restore already happened, otherwise the destination refuses that restore forever) before it restores
locally.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from pydantic import Field, model_validator

from extender.settings import Settings

__all__ = [
    "ARCHIVE_SHA256_HEADER",
    "ARCHIVE_SIZE_HEADER",
    "DestinationState",
    "FailureKind",
    "InDoubtAction",
    "Outcome",
    "Phase",
    "RetryPolicy",
    "Rollback",
    "SourceAction",
    "Stage",
    "TransferVerdict",
    "after_abort",
    "backoff_schedule",
    "check_declared",
    "check_migration_id",
    "in_doubt_action",
    "reconcile_destination",
    "reconcile_source",
    "rollback_for",
    "transfer_verdict",
]

ARCHIVE_SIZE_HEADER = "X-Qos-Archive-Size"
ARCHIVE_SHA256_HEADER = "X-Qos-Archive-Sha256"

_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


class Phase(StrEnum):
    """Source-side phases, in protocol order (journaled; a restarted source agent resumes from them)."""

    NEW = "new"
    CHECKPOINTED = "checkpointed"
    TRANSFERRED = "transferred"
    PREPARED = "prepared"
    CUTOVER = "cutover"
    FINAL_DUMPED = "final-dumped"
    FINAL_TRANSFERRED = "final-transferred"
    RESTORE_SENT = "restore-sent"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled-back"
    IN_DOUBT = "in-doubt"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def process_may_be_stopped(self) -> bool:
        """From CUTOVER on, the source process may have been stopped by the final dump."""
        return _ORDER.index(self) >= _ORDER.index(Phase.CUTOVER) if self in _ORDER else False


_ORDER = (
    Phase.NEW,
    Phase.CHECKPOINTED,
    Phase.TRANSFERRED,
    Phase.PREPARED,
    Phase.CUTOVER,
    Phase.FINAL_DUMPED,
    Phase.FINAL_TRANSFERRED,
    Phase.RESTORE_SENT,
    Phase.COMMITTED,
)
_TERMINAL = frozenset({Phase.COMMITTED, Phase.ROLLED_BACK, Phase.IN_DOUBT, Phase.FAILED})


class Stage(StrEnum):
    """Which of the two archives of a migration: the pre-copy (leave-running) image or the final one."""

    PRECOPY = "precopy"
    FINAL = "final"


class DestinationState(StrEnum):
    """Destination-side states of one migration id (journaled)."""

    RECEIVING = "receiving"
    STAGED = "staged"
    PREPARED = "prepared"
    RESTORING = "restoring"
    RESTORED = "restored"
    RESTORE_FAILED = "restore-failed"
    COMMITTED = "committed"
    ABORTED = "aborted"
    UNKNOWN = "unknown"


class Outcome(StrEnum):
    """How a migration ended, as reported to the controller, in metrics and in Events."""

    SUCCEEDED = "succeeded"
    ROLLED_BACK = "rolled_back"  # the workload runs at the source again (or never stopped); reason says why
    IN_DOUBT = "in_doubt"  # the destination could not be reached to learn whether it restored; C2 kept
    FAILED = "failed"  # the rollback itself failed: the workload is not known to run; C2 kept for recovery


class FailureKind(StrEnum):
    """What the I/O layer saw, reduced to what the decisions need."""

    TRANSIENT = "transient"  # connection error, timeout, 5xx, checksum mismatch: worth retrying
    REFUSED = "refused"  # an explicit, deliberate refusal (4xx): retrying will not help
    LOCAL = "local"  # a local operation failed (dump, pack): not the peer's fault


class SourceAction(StrEnum):
    NOTHING = "nothing"  # the process never stopped
    ENSURE_RUNNING = "ensure-running"  # the final dump failed; CRIU resumes the process, verify it
    RESTORE_LOCAL = "restore-local"  # restore the final image C2 at the source
    RESOLVE = "resolve"  # ask the destination (abort fence) before deciding
    COMMIT = "commit"  # the destination has it: finish as succeeded


@dataclass(frozen=True, slots=True)
class Rollback:
    """What to do after an unrecoverable failure at a phase."""

    source: SourceAction
    abort_destination: bool
    keep_final_archive: bool  # never delete C2 before the process is known to run somewhere


def check_migration_id(value: str) -> str:
    """Migration ids name files and URL segments: lowercase DNS-label-like, at most 63 chars."""
    if not isinstance(value, str) or not _ID_RE.match(value):
        raise ValueError(f"migration id must match {_ID_RE.pattern}, got {value!r}")
    return value


class RetryPolicy(Settings):
    """Retries of one protocol step (tenacity: attempts, exponential backoff, capped, with jitter)."""

    attempts: int = Field(3, ge=1)
    """Tries of one step, the first included."""
    initial_backoff_seconds: float = Field(0.2, ge=0, allow_inf_nan=False)
    """Wait after the first failure."""
    max_backoff_seconds: float = Field(2.0, ge=0, allow_inf_nan=False)
    """Cap of every wait (>= initial_backoff_seconds)."""
    multiplier: float = Field(2.0, ge=1, allow_inf_nan=False)
    """Each wait is the previous one times this."""
    jitter_seconds: float = Field(0.05, ge=0, allow_inf_nan=False)
    """Random extra wait, up to this, so agents retrying together spread out."""

    @model_validator(mode="after")
    def _cap_above_initial(self) -> RetryPolicy:
        if self.max_backoff_seconds < self.initial_backoff_seconds:
            raise ValueError("max_backoff_seconds must be >= initial_backoff_seconds")
        return self


def backoff_schedule(policy: RetryPolicy) -> list[float]:
    """The waits between attempts without jitter: attempts - 1 values, each capped."""
    return [
        min(policy.max_backoff_seconds, policy.initial_backoff_seconds * policy.multiplier**i)
        for i in range(policy.attempts - 1)
    ]


@dataclass(frozen=True, slots=True)
class TransferVerdict:
    ok: bool
    reason: str = ""


def transfer_verdict(expected_size: int, expected_sha256: str, got_size: int, got_sha256: str) -> TransferVerdict:
    """Compare what was declared with what arrived. A short stream is a cut connection, not corruption."""
    if got_size < expected_size:
        return TransferVerdict(False, f"truncated: {got_size} of {expected_size} bytes arrived")
    if got_size > expected_size:
        return TransferVerdict(False, f"oversized: {got_size} bytes arrived, {expected_size} declared")
    if got_sha256 != expected_sha256:
        return TransferVerdict(False, f"sha256 mismatch: declared {expected_sha256[:12]}, got {got_sha256[:12]}")
    return TransferVerdict(True)


def check_declared(size: str | None, sha256: str | None, max_bytes: int) -> tuple[int, str]:
    """Validate the size/sha256 headers of an archive upload; ValueError says which one is wrong."""
    if size is None or sha256 is None:
        raise ValueError(f"missing {ARCHIVE_SIZE_HEADER} or {ARCHIVE_SHA256_HEADER} header")
    try:
        n = int(size)
    except ValueError:
        raise ValueError(f"{ARCHIVE_SIZE_HEADER} must be an integer, got {size!r}") from None
    if n < 0:
        raise ValueError(f"{ARCHIVE_SIZE_HEADER} must be >= 0, got {n}")
    if n > max_bytes:
        raise ValueError(f"archive of {n} bytes exceeds the limit of {max_bytes}")
    digest = sha256.lower()
    if not _SHA_RE.match(digest):
        raise ValueError(f"{ARCHIVE_SHA256_HEADER} must be 64 hex digits, got {sha256!r}")
    return n, digest


def rollback_for(phase: Phase, kind: FailureKind) -> Rollback:
    """The rollback after an unrecoverable failure while the migration was at ``phase``.

    ``phase`` is the last phase *reached* (journaled) when the failing step started.
    """
    if phase.terminal:
        raise ValueError(f"no rollback from terminal phase {phase}")
    if phase in (Phase.NEW, Phase.CHECKPOINTED, Phase.TRANSFERRED, Phase.PREPARED):
        return Rollback(SourceAction.NOTHING, abort_destination=True, keep_final_archive=False)
    if phase is Phase.CUTOVER:
        # The final dump itself failed: CRIU resumes the tree it froze. If it is gone anyway, C2 (if the dump
        # completed) restores it — ENSURE_RUNNING covers both.
        return Rollback(SourceAction.ENSURE_RUNNING, abort_destination=True, keep_final_archive=True)
    if phase in (Phase.FINAL_DUMPED, Phase.FINAL_TRANSFERRED):
        # No restore request was sent: the destination cannot be running it. Fence anyway (abort) so a
        # delayed request can never restore it later, then restore locally.
        return Rollback(SourceAction.RESTORE_LOCAL, abort_destination=True, keep_final_archive=True)
    # RESTORE_SENT
    if kind is FailureKind.REFUSED:
        # An explicit answer: the destination failed the restore and cleaned up (a failed criu restore
        # kills the partial tree).
        return Rollback(SourceAction.RESTORE_LOCAL, abort_destination=True, keep_final_archive=True)
    return Rollback(SourceAction.RESOLVE, abort_destination=True, keep_final_archive=True)


def after_abort(state: DestinationState) -> SourceAction:
    """The destination answered the abort fence with its state: restored there, or safe to restore here."""
    if state in (DestinationState.RESTORED, DestinationState.COMMITTED):
        return SourceAction.COMMIT
    if state is DestinationState.RESTORING:
        # Cannot be answered by a correct destination (abort waits for an in-flight restore); treat as unknown.
        return SourceAction.RESOLVE
    return SourceAction.RESTORE_LOCAL


class InDoubtAction(StrEnum):
    RESTORE_LOCAL = "restore-local"
    KEEP_IN_DOUBT = "keep-in-doubt"


def in_doubt_action(same_kernel: bool, restore_fenced_by_pid: bool) -> InDoubtAction:
    """The destination stayed unreachable past the resolve deadline after a restore request was sent.

    Restoring locally is safe only when a second copy is impossible: on the same kernel (same boot id) CRIU
    restores a process with its original PID, so a local restore fails if the destination already restored
    it. Across machines nothing fences it: keep C2, report in_doubt, and let an operator (or the
    destination's own restart reconciliation, answered on the next resolve) decide.
    """
    if same_kernel and restore_fenced_by_pid:
        return InDoubtAction.RESTORE_LOCAL
    return InDoubtAction.KEEP_IN_DOUBT


def reconcile_source(phase: Phase, process_alive: bool, final_image_complete: bool) -> SourceAction:
    """A restarted source agent finds an unfinished migration journaled at ``phase``."""
    if phase.terminal:
        return SourceAction.NOTHING
    if not phase.process_may_be_stopped:
        return SourceAction.NOTHING  # leave-running only so far: abort the destination, delete archives
    if phase is Phase.CUTOVER:
        if process_alive:
            return SourceAction.NOTHING  # the final dump did not happen (or failed and resumed the process)
        return SourceAction.RESOLVE if final_image_complete else SourceAction.ENSURE_RUNNING
    # FINAL_DUMPED and later: the process is stopped here; the destination may or may not run it.
    return SourceAction.RESOLVE


def reconcile_destination(state: DestinationState, restored_process_alive: bool) -> DestinationState:
    """A restarted destination agent finds a migration journaled at ``state``.

    A restore interrupted by the agent's death either produced the process (it is alive under the expected
    identity) or not; archives of anything unfinished stay until the source commits or aborts.
    """
    if state is DestinationState.RESTORING:
        return DestinationState.RESTORED if restored_process_alive else DestinationState.RESTORE_FAILED
    if state is DestinationState.RECEIVING:
        return DestinationState.UNKNOWN  # a partial upload is worthless: the source retries it or aborts
    return state
