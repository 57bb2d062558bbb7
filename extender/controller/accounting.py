"""SLI accounting of requests (paper 002 Eq. 1): e and p since admission, preemptions and overheads.

A request is the owning workload (ReplicaSet, Job, StatefulSet, or a bare pod): its SLO survives its pods being
preempted and recreated, so the account is keyed by the owner, never by the pod. Pure: time is an argument.

An account stores e and p folded up to ``since`` and the state held since then. Everything after ``since``
follows from the state alone, which is why persisting only on transitions is exact: a restart that reads an
account back and advances it from ``since`` in the stored state loses nothing unless a transition happened
and was not written; the shell then estimates that transition from the pods' own timestamps
(``transition_time``), never resetting a request to zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import orjson

from extender.core.model import InvalidInputError

__all__ = [
    "ACCOUNT_ANNOTATION",
    "Account",
    "RequestState",
    "decode_account",
    "derivable_from_pod",
    "due_writes",
    "encode_account",
]

ACCOUNT_ANNOTATION = "qos.kube-qos-extender.io/sli"
_VERSION = 1


class RequestState(StrEnum):
    PENDING = "pending"  # no pod of the request runs (gated, unscheduled, allocating, or between pods)
    RUNNING = "running"  # a pod of the request is Running


@dataclass(frozen=True, slots=True)
class Account:
    """One request's SLI state. Times are wall-clock unix seconds; durations are real (uncompressed) seconds.

    e, p: accumulated running / pending time up to ``since``.
    state, since: the state held since ``since`` (the last transition, or the last fold).
    preemptions: times a pod of the request was evicted by the controller (n in Eq. 8).
    overhead: sum of the allocation times (release -> Running) of the restarts after preemption (Eq. 8).
    starts: pending -> running transitions so far (the first one is not an overhead).
    run_started: when the current run began (for the anti-thrashing quantum), None when pending.
    admitted: when the request was admitted (its first pod, or its owner, was created).
    class_name: the request's service class, for reports that outlive its pods.
    """

    e: float
    p: float
    state: RequestState
    since: float
    admitted: float
    class_name: str
    preemptions: int = 0
    overhead: float = 0.0
    starts: int = 0
    run_started: float | None = None
    released_at: float | None = None

    @staticmethod
    def admit(class_name: str, admitted: float) -> Account:
        """A new request: pending since its admission (its pending time counts from creation, gate included)."""
        return Account(0.0, 0.0, RequestState.PENDING, admitted, admitted, class_name)

    def ep(self, now: float) -> tuple[float, float]:
        """(e, p) at ``now`` without changing the account; a clock behind ``since`` adds nothing."""
        dt = max(0.0, now - self.since)
        if self.state is RequestState.RUNNING:
            return self.e + dt, self.p
        return self.e, self.p + dt

    def availability(self, now: float) -> float:
        e, p = self.ep(now)
        return 1.0 if e + p == 0 else e / (e + p)

    def current_run(self, now: float) -> float:
        if self.state is not RequestState.RUNNING or self.run_started is None:
            return 0.0
        return max(0.0, now - self.run_started)

    def fold(self, now: float) -> Account:
        """Move the time up to ``now`` into e or p (state unchanged): what a periodic write stores."""
        if now <= self.since:
            return self
        e, p = self.ep(now)
        return replace(self, e=e, p=p, since=now)

    def transition(self, state: RequestState, at: float) -> Account:
        """The request changed state at ``at`` (clamped to >= since, so time never runs backwards)."""
        if state is self.state:
            return self
        at = max(at, self.since)
        folded = self.fold(at)
        if state is RequestState.RUNNING:
            overhead = folded.overhead
            if folded.starts > 0 and folded.released_at is not None:
                overhead += max(0.0, at - folded.released_at)  # alpha^m of a restart (Eq. 8)
            return replace(
                folded, state=state, run_started=at, starts=folded.starts + 1, overhead=overhead, released_at=None
            )
        return replace(folded, state=state, run_started=None)

    def preempted(self) -> Account:
        return replace(self, preemptions=self.preemptions + 1)

    def released(self, at: float) -> Account:
        return replace(self, released_at=at)


def encode_account(acc: Account) -> str:
    """The annotation value: compact JSON with a version, so a later format can still read old accounts."""
    body: dict[str, Any] = {
        "v": _VERSION,
        "e": round(acc.e, 3),
        "p": round(acc.p, 3),
        "state": acc.state.value,
        "since": round(acc.since, 3),
        "admitted": round(acc.admitted, 3),
        "class": acc.class_name,
        "n": acc.preemptions,
        "overhead": round(acc.overhead, 3),
        "starts": acc.starts,
    }
    if acc.run_started is not None:
        body["run_started"] = round(acc.run_started, 3)
    if acc.released_at is not None:
        body["released_at"] = round(acc.released_at, 3)
    return orjson.dumps(body).decode()


def _num(body: Mapping[str, Any], key: str, default: float | None = None) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidInputError(f"account field {key!r} must be a finite number >= 0, got {value!r}")
    return float(value)


def decode_account(text: str) -> Account:
    """Parse an annotation written by ``encode_account``; anything malformed raises InvalidInputError (the
    shell then rebuilds the request from its pods' timestamps and says so in an Event)."""
    try:
        body = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidInputError(f"account annotation is not JSON: {exc}") from None
    if not isinstance(body, dict) or body.get("v") != _VERSION:
        raise InvalidInputError(f"account annotation has an unknown format: {text[:80]!r}")
    try:
        state = RequestState(str(body.get("state")))
    except ValueError:
        raise InvalidInputError(f"account state must be pending or running, got {body.get('state')!r}") from None
    cls = body.get("class")
    if not isinstance(cls, str) or not cls:
        raise InvalidInputError("account class must be a non-empty string")
    n = body.get("n", 0)
    starts = body.get("starts", 0)
    if not isinstance(n, int) or isinstance(n, bool) or n < 0 or not isinstance(starts, int) or starts < 0:
        raise InvalidInputError("account counters must be non-negative integers")
    run_started = _num(body, "run_started") if body.get("run_started") is not None else None
    released_at = _num(body, "released_at") if body.get("released_at") is not None else None
    return Account(
        e=_num(body, "e"),
        p=_num(body, "p"),
        state=state,
        since=_num(body, "since"),
        admitted=_num(body, "admitted"),
        class_name=cls,
        preemptions=n,
        overhead=_num(body, "overhead", 0.0),
        starts=starts,
        run_started=run_started,
        released_at=released_at,
    )


def due_writes(
    dirty: Iterable[str], written: Mapping[str, float], now: float, min_interval: float
) -> tuple[set[str], float | None]:
    """Which dirty accounts to write now, and when the next held-back one falls due (None: none held back).

    Why coalesce: one preemption changes two accounts three or four times within a second (victim preempted;
    preemptor released, then Running), and every write is a PATCH fanned out to every ReplicaSet watcher. At
    paper 002's scale that was 43 writes/s and the API server's largest CPU consumer, which in turn delayed
    the releases the policy depends on. Writing each account at most once per ``min_interval`` keeps the last
    state (nothing dirty is ever dropped, only delayed); a crash loses at most ``min_interval`` of transitions,
    which the rebuild dates from the pods' own timestamps like any other missed transition.
    """
    now_batch: set[str] = set()
    next_due: float | None = None
    for request in dirty:
        last = written.get(request)
        due = now if last is None else last + min_interval
        if due <= now:
            now_batch.add(request)
        elif next_due is None or due < next_due:
            next_due = due
    return now_batch, next_due


def derivable_from_pod(acc: Account) -> bool:
    """Whether a bare pod's account holds nothing its own timestamps do not: never preempted, no overhead, and
    pending since creation or running since its one start. A restart rebuilds exactly that from the pod
    (``observe`` dates a first sighting from creationTimestamp and the Ready transition), within the
    timestamps' 1 s granularity, so writing it would be a PATCH per pod per transition for nothing: at
    throughput two of a qos pod's ~9 API writes. Once the account has history (a preemption, a second start, a
    return to pending) it is written like any owner's. Owners with several pods (ReplicaSet, Job,
    StatefulSet) are always written: their pods come and go, so the current pods cannot date the first start.
    """
    if acc.preemptions or acc.overhead:
        return False
    if acc.state is RequestState.PENDING:
        return acc.starts == 0
    return acc.starts == 1
