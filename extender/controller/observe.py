"""Advance every request's account from what its pods show (pure: pods, accounts and time in, accounts out).

A request is RUNNING while one of its pods is Running and not being deleted, otherwise PENDING — gated,
unscheduled, allocating, or between an evicted pod and its replacement all deny the service, which is what p
measures (paper 002 counts allocation time as pending).

Normal passes date a transition at ``now`` (the pass runs on the watch event, within milliseconds). After a
restart (``rebuild``) the stored state may be stale: what changed while nobody watched is dated from the
pods' own timestamps (Ready transition / creation), clamped to [since, now], so e/p continue rather than
restart and the error is bounded by the timestamp granularity (1 s).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from extender.controller.accounting import Account, RequestState
from extender.controller.state import PodInfo

__all__ = ["Observed", "observe"]


@dataclass(frozen=True, slots=True)
class Observed:
    accounts: dict[str, Account]
    changed: frozenset[str]  # requests whose state changed (persist now)
    finished: frozenset[str]  # requests without pods for longer than the grace: dropped


def observe(
    accounts: Mapping[str, Account],
    pods: Iterable[PodInfo],
    class_of: Mapping[str, str],
    now: float,
    *,
    rebuild: bool = False,
    absent_grace: float = 300.0,
    admitted_at: Mapping[str, float] | None = None,
) -> Observed:
    """``class_of`` maps pod key -> class; ``admitted_at`` (request -> owner creation time) dates a request
    first seen now (e.g. after a restart that lost its account) from its owner rather than its latest pod."""
    by_request: dict[str, list[PodInfo]] = {}
    for info in pods:
        by_request.setdefault(info.request, []).append(info)
    out = dict(accounts)
    changed: set[str] = set()
    finished: set[str] = set()
    for request, infos in by_request.items():
        running = [i for i in infos if i.running]
        state = RequestState.RUNNING if running else RequestState.PENDING
        acc = out.get(request)
        if acc is None:
            created = [i.created for i in infos if i.created is not None]
            admitted = min(created) if created else now
            if admitted_at is not None and request in admitted_at:
                admitted = min(admitted, admitted_at[request])
            cls = next((class_of[i.key] for i in infos if i.key in class_of), "")
            acc = Account.admit(cls, min(admitted, now))
            changed.add(request)
            rebuild_this = True  # a first sighting is dated from the pods, like a rebuild
        else:
            rebuild_this = rebuild
        if acc.state is not state:
            at = now
            if rebuild_this:
                if state is RequestState.RUNNING:
                    stamps = [i.running_since for i in running if i.running_since is not None]
                    at = min(stamps) if stamps else now
                else:
                    stamps = [i.created for i in infos if i.created is not None]
                    at = max(stamps) if stamps else now
                at = min(max(at, acc.since), now)
            acc = acc.transition(state, at)
            changed.add(request)
        if not acc.class_name:
            cls = next((class_of[i.key] for i in infos if i.key in class_of), "")
            if cls:
                acc = replace(acc, class_name=cls)
        out[request] = acc
    for request, acc in accounts.items():
        if request in by_request:
            continue
        if acc.state is RequestState.RUNNING:
            out[request] = acc.transition(RequestState.PENDING, now)  # its pod vanished: not serving
            changed.add(request)
        elif now - acc.since > absent_grace:
            del out[request]
            finished.add(request)
    return Observed(out, frozenset(changed), frozenset(finished))
