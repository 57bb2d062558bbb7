"""Guard rails for every disruption we cause (issue 32 part 4): which candidate disruptions may go now.

Every disruption the product makes — a checkpoint migration, a QoS preemption, a node consolidation, a slack
eviction — is a *candidate* handed to :func:`decide` with the *budgets* and what is *in motion* now. The
answer says, per candidate, whether it goes, waits (and which budget held it) or, in dry-run, is only
reported. The shells (consolidation flow, QoS controller, slack controller) apply the answer; nothing here
reads a clock (``now`` is Unix seconds, UTC) or the cluster.

A budget (Karpenter's NodePool disruption budgets, descheduler's eviction limits) caps, for the node group it
names (``None``: every group) and the kinds it covers (empty: every kind), how many distinct nodes and pods may
be in motion at once. It applies only inside its windows when it has any (a daily UTC start, a duration,
optionally some weekdays: Karpenter's ``schedule`` + ``duration``); ``max_nodes=0`` inside a window is "no
disruption then". When several budgets apply to a candidate, each must hold (the most restrictive wins).

Counting: the nodes and pods in motion of the candidate's group and of the kinds the budget covers; a candidate
on a node already in motion adds no node, a candidate with no pod (a whole node) adds no pod. Candidates are
decided in the order given and each one that goes counts for the next (so one call never lets two go where the
budget has room for one). In dry-run nothing goes: what would go is *reported* and does not count as in motion
(nothing moved), what would wait waits, with the same reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = [
    "Budget",
    "Disruption",
    "DisruptionKind",
    "Verdict",
    "Window",
    "decide",
    "in_window",
    "unlimited",
]

_DAY = 86400.0
_WEEK_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class DisruptionKind(StrEnum):
    MIGRATION = "migration"  # a pod checkpointed and restored elsewhere (the source pod deleted)
    PREEMPTION = "preemption"  # a pod evicted by the QoS controller for a pod of lower Q
    CONSOLIDATION = "consolidation"  # a node cordoned and emptied (its pods migrate), then removed
    SLACK_EVICTION = "slack-eviction"  # a batch pod evicted because the services' idle capacity shrank


class Action(StrEnum):
    GO = "go"  # make the disruption now
    WAIT = "wait"  # a budget holds it: try again later
    REPORT = "report"  # dry-run: it would go; report it, change nothing


@dataclass(frozen=True, slots=True)
class Window:
    """A daily UTC window: from ``start_minute`` (minutes after 00:00 UTC) for ``duration_seconds``, on the
    given weekdays (0 = Monday; empty: every day). A window may run past midnight (into the next day)."""

    start_minute: int
    duration_seconds: float
    weekdays: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if not 0 <= self.start_minute < 24 * 60:
            raise ValueError(f"start_minute {self.start_minute} not in [0, 1440)")
        if not 0 < self.duration_seconds <= 7 * _DAY:
            raise ValueError(f"duration_seconds {self.duration_seconds} not in (0, 7 days]")
        if not self.weekdays <= frozenset(range(7)):
            raise ValueError(f"weekdays {sorted(self.weekdays)} not in 0..6 (Monday = 0)")

    def contains(self, now: float) -> bool:
        day = int(now // _DAY)
        # every start at or before now that could still be open: back as many days as the duration spans
        for back in range(int(self.duration_seconds // _DAY) + 2):
            d = day - back
            weekday = (d + 3) % 7  # 1970-01-01 was a Thursday
            if self.weekdays and weekday not in self.weekdays:
                continue
            start = d * _DAY + self.start_minute * 60.0
            if start <= now < start + self.duration_seconds:
                return True
        return False

    def describe(self) -> str:
        days = ",".join(_WEEK_DAYS[d] for d in sorted(self.weekdays)) if self.weekdays else "daily"
        return f"{days} {self.start_minute // 60:02d}:{self.start_minute % 60:02d} UTC for {self.duration_seconds:g}s"


@dataclass(frozen=True, slots=True)
class Budget:
    """At most ``max_nodes`` distinct nodes and ``max_pods`` pods of ``group`` (None: any group) in motion at
    once by the ``kinds`` covered (empty: all), inside ``windows`` (empty: always). None: no cap on that count."""

    name: str
    group: str | None = None
    kinds: frozenset[DisruptionKind] = frozenset()
    max_nodes: int | None = None
    max_pods: int | None = None
    windows: tuple[Window, ...] = ()

    def __post_init__(self) -> None:
        for label, value in (("max_nodes", self.max_nodes), ("max_pods", self.max_pods)):
            if value is not None and value < 0:
                raise ValueError(f"budget {self.name}: {label} {value} < 0")

    def covers(self, d: Disruption) -> bool:
        return (self.group is None or self.group == d.group) and (not self.kinds or d.kind in self.kinds)

    def active(self, now: float) -> bool:
        return not self.windows or any(w.contains(now) for w in self.windows)


@dataclass(frozen=True, slots=True)
class Disruption:
    """One disruption, candidate or in motion: its kind, the node it disrupts and that node's group, and the pod
    (``namespace/name``; None for a whole node)."""

    kind: DisruptionKind
    node: str
    group: str
    pod: str | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with one candidate, and why (the budget that held it, when one did)."""

    disruption: Disruption
    action: Action
    reason: str
    budget: str | None = None


def in_window(budget: Budget, now: float) -> bool:
    return budget.active(now)


def unlimited(budgets: Iterable[Budget]) -> bool:
    """True when no budget can ever hold anything (the shells then skip the guard: today's behaviour)."""
    return all(b.max_nodes is None and b.max_pods is None for b in budgets)


@dataclass
class _Counts:
    nodes: set[str] = field(default_factory=set)
    pods: set[str] = field(default_factory=set)


def _count(budget: Budget, motion: Iterable[Disruption], like: Disruption) -> _Counts:
    c = _Counts()
    for m in motion:
        if budget.covers(m) and m.group == like.group:
            c.nodes.add(m.node)
            if m.pod is not None:
                c.pods.add(m.pod)
    return c


def _held_by(budget: Budget, motion: Sequence[Disruption], d: Disruption) -> str | None:
    c = _count(budget, motion, d)
    if budget.max_nodes is not None and d.node not in c.nodes and len(c.nodes) + 1 > budget.max_nodes:
        return f"budget {budget.name}: {len(c.nodes)} node(s) of group {d.group} in motion, at most {budget.max_nodes}"
    if budget.max_pods is not None and d.pod is not None and d.pod not in c.pods and len(c.pods) + 1 > budget.max_pods:
        return f"budget {budget.name}: {len(c.pods)} pod(s) of group {d.group} in motion, at most {budget.max_pods}"
    return None


def decide(
    budgets: Sequence[Budget],
    in_motion: Sequence[Disruption],
    candidates: Sequence[Disruption],
    now: float,
    *,
    dry_run: bool = False,
) -> tuple[Verdict, ...]:
    """A verdict per candidate, in their order: GO (or REPORT in dry-run) when every budget that is active now
    and covers it has room, else WAIT with the first budget that held it."""
    active = [b for b in budgets if b.active(now)]
    motion = list(in_motion)
    verdicts: list[Verdict] = []
    for d in candidates:
        held: tuple[str, str] | None = None
        for b in active:
            if not b.covers(d):
                continue
            why = _held_by(b, motion, d)
            if why is not None:
                held = (b.name, why)
                break
        if held is not None:
            verdicts.append(Verdict(d, Action.WAIT, held[1], held[0]))
        elif dry_run:
            verdicts.append(Verdict(d, Action.REPORT, "dry-run: would go, nothing changed"))
        else:
            verdicts.append(Verdict(d, Action.GO, "within every budget"))
            motion.append(d)
    return tuple(verdicts)
