"""Moving running batch pods: emptying under-used nodes (seed 000 §5.3, Alg. 5) and relieving over-committed
ones (seed 004 §IV-B, Alg. 2).

Only *plans* are made here. The controller executes them through the node agent (CRIU checkpoint ->
transfer -> restore, seed 000 §4.2), and the simulator applies them to its own state; both need the same
guarantees, which these functions give by construction:
* no destination is ever over-committed — every move is checked with ``packing.fits`` against the
  destination *including the moves planned before it*;
* a node being emptied is never a destination, and neither is a cordoned node;
* emptying is all-or-nothing: a node is only worth draining if it can then be removed (seed 000 §5.3).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from extender.core.model import InvalidInputError, Node, Pod, WorkloadKind
from extender.core.packing import _check_cycle, _check_now, _check_unique_names, bfd_sort, time_bin_bfd_choose

__all__ = [
    "MigrationPlan",
    "UnderutilState",
    "consolidation_plans",
    "migration_plan",
    "select_plan",
    "shortest_runtime_reschedule",
    "sustained_underutilized",
    "update_underutilized",
]


@dataclass(frozen=True, slots=True)
class UnderutilState:
    """When each node went (and stayed) below the utilisation threshold.

    Seed 000 §3.2 (3) and §5.3 drain a node only after it "continuously stays" under the threshold, so a
    momentary dip (a batch pod finishing just before the next one is bound) must not trigger a migration.
    The state is a value: the controller keeps the latest one, the simulator one per run.
    """

    since: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        copy = dict(self.since)
        for name, t in copy.items():
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
                raise InvalidInputError(f"under-utilisation start of node {name!r} must be finite, got {t!r}")
        # A private read-only copy: the caller's dict cannot change a state after the fact.
        object.__setattr__(self, "since", MappingProxyType(copy))


def _check_threshold(threshold: float) -> None:
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, (int, float))
        or not math.isfinite(threshold)
        or not 0.0 < threshold <= 1.0
    ):
        raise InvalidInputError(f"utilisation threshold must be in (0, 1], got {threshold!r}")


def update_underutilized(
    state: UnderutilState, nodes: Sequence[Node], now: float, threshold: float = 0.5
) -> UnderutilState:
    """Advance the under-utilisation clock with a new snapshot (threshold 50 %: seed 000 Table 6).

    A node strictly below ``threshold`` (``Node.utilization``: max of cpu and memory requested fractions,
    the measure cluster-autoscaler uses) keeps its earliest start time, or starts now; a node at or above
    it, or absent from the snapshot (deleted), is forgotten — "continuously" means any interruption
    restarts the clock.
    """
    _check_now(now)
    _check_threshold(threshold)
    _check_unique_names(nodes)
    since: dict[str, float] = {}
    for node in nodes:
        if node.utilization() < threshold:
            since[node.name] = state.since.get(node.name, now)
    return UnderutilState(since)


def sustained_underutilized(state: UnderutilState, now: float, sustain_seconds: float) -> list[str]:
    """Nodes under the threshold for at least ``sustain_seconds`` (seed 000 §4 step 5 uses e.g. 5 minutes),
    longest-standing first, then by name."""
    _check_now(now)
    if (
        isinstance(sustain_seconds, bool)
        or not isinstance(sustain_seconds, (int, float))
        or not math.isfinite(sustain_seconds)
        or sustain_seconds < 0
    ):
        raise InvalidInputError(f"sustain period must be a finite number of seconds >= 0, got {sustain_seconds!r}")
    due = [(t, name) for name, t in state.since.items() if now - t >= sustain_seconds]
    return [name for _, name in sorted(due)]


@dataclass(frozen=True, slots=True)
class MigrationPlan:
    """Empty ``source`` by moving each (pod key, destination node). No moves = already empty, remove it."""

    source: str
    moves: tuple[tuple[str, str], ...]


def _destinations(source: Node, others: Sequence[Node]) -> list[Node]:
    # Seed 000 Alg. 5 line 1: an <- ng - n, the other nodes of the same node group; cordoned nodes are
    # being drained or repaired and must not receive work.
    return [n for n in others if n.name != source.name and not n.unschedulable and n.group == source.group]


def stays_with_node(pod: Pod) -> bool:
    """A DaemonSet's pod (``request_id`` = its owner, ``<ns>/DaemonSet/<name>``): it runs on every node its
    selector picks and goes with its node. Consolidation neither moves it nor lets it keep the node (the
    autoscaler's idle rule does not count it either); without this, no real node (every one runs the agent
    DaemonSet) could ever be consolidated."""
    return "/DaemonSet/" in pod.request_id


def migration_plan(source: Node, others: Sequence[Node], now: float, cycle_seconds: float) -> MigrationPlan | None:
    """Seed 000 Alg. 5: a plan moving *every* pod off ``source``, or None.

    None when any pod is not a migratable batch pod (services are not checkpointed, seed 000 §4.4) or any
    pod finds no destination (Alg. 5 lines 4-5, 11: "not triggered due to resource shortage"). Pods are
    placed biggest first (``bfd_sort``) — the order that most often lets all of them fit — each with
    time-bin BFD (Alg. 2, the scheduler batch pods always get), cumulatively: later pods see the earlier
    moves, so two pods never claim the same free space. Migrated pods keep their progress (CRIU), so a
    destination's time bin is computed from their true remaining runtime.
    """
    _check_now(now)
    _check_cycle(cycle_seconds)
    movable = [p for p in source.pods if not stays_with_node(p)]
    for pod in movable:
        if pod.kind is not WorkloadKind.BATCH or not pod.migratable:
            return None
    working = {n.name: n for n in _destinations(source, others)}
    moves: list[tuple[str, str]] = []
    for pod in bfd_sort(movable):
        dest = time_bin_bfd_choose(list(working.values()), pod, now, cycle_seconds)
        if dest is None:
            return None
        working[dest.name] = dest.with_pod(pod)
        moves.append((pod.key, dest.name))
    return MigrationPlan(source.name, tuple(moves))


def consolidation_plans(
    nodes: Sequence[Node], candidates: Sequence[str], now: float, cycle_seconds: float
) -> list[MigrationPlan]:
    """Plans for as many candidate nodes as can be emptied together (seed 000 §4.4 Instance Cleaner).

    Candidates are tried worst-utilised first (§4.4: "starts the rescheduling process from the
    worst-utilized node"), ties by name. Each accepted plan is applied to the working snapshot before the
    next candidate: its destinations carry the moved pods, and the emptied node is never a destination
    afterwards. A candidate that has just received pods is not emptied in the same round (that would
    migrate the same pods twice). Names not in ``nodes`` are ignored: the node went away meanwhile.
    """
    _check_now(now)
    _check_cycle(cycle_seconds)
    _check_unique_names(nodes)
    working: dict[str, Node] = {n.name: n for n in nodes}
    present = [name for name in dict.fromkeys(candidates) if name in working]
    ordered = sorted(present, key=lambda name: (working[name].utilization(), name))
    emptied: set[str] = set()
    received: set[str] = set()
    plans: list[MigrationPlan] = []
    for name in ordered:
        if name in received:
            continue
        source = working[name]
        others = [n for n in working.values() if n.name not in emptied and n.name != name]
        plan = migration_plan(source, others, now, cycle_seconds)
        if plan is None:
            continue
        by_key = {p.key: p for p in source.pods}
        for key, dest in plan.moves:
            working[dest] = working[dest].with_pod(by_key[key])
            received.add(dest)
        working[name] = source.without_pods(by_key)
        emptied.add(name)
        plans.append(plan)
    return plans


def select_plan(
    plans: Sequence[MigrationPlan],
    candidates: Sequence[str],
    *,
    busy: frozenset[str] = frozenset(),
    left_alone: Mapping[str, float] | None = None,
    owned: frozenset[str] | None = None,
    now: float,
) -> MigrationPlan | None:
    """The consolidation flow's choice of the next node to empty (one at a time): plans come worst-utilised
    node first (``consolidation_plans``), so the first whose source is a sustained candidate, not being
    consolidated, not left alone after a failed attempt (until its back-off ends) and, when ``owned`` is given,
    one of the nodes we may remove. Here, below both callers, so the flow (``consolidation.policy``) and the
    simulator's ``product`` policy take the same decision (issue 14)."""
    wanted = set(candidates)
    alone = left_alone or {}
    for plan in plans:
        src = plan.source
        if src not in wanted or src in busy or alone.get(src, -1.0) > now:
            continue
        if owned is not None and src not in owned:
            continue
        return plan
    return None


def _overloaded(node: Node, threshold: float | None) -> bool:
    if not node.free.is_nonnegative():
        return True
    return threshold is not None and node.utilization() >= threshold


def _relieves(pod: Pod, node: Node) -> bool:
    # Moving a pod that requests nothing in any over-committed dimension migrates work for no gain.
    free = node.free
    req = pod.requests
    if not free.is_nonnegative():
        return (
            (free.cpu_milli < 0 and req.cpu_milli > 0)
            or (free.memory_bytes < 0 and req.memory_bytes > 0)
            or (free.pods < 0 and req.pods > 0)
            or any(amount < 0 and req.ext(name) > 0 for name, amount in free.extended)
        )
    return req.cpu_milli > 0 or req.memory_bytes > 0


def shortest_runtime_reschedule(
    node: Node,
    others: Sequence[Node],
    now: float,
    cycle_seconds: float,
    *,
    order: Literal["remaining", "elapsed"] = "remaining",
    threshold: float | None = None,
) -> tuple[tuple[str, str], ...]:
    """Seed 004 Alg. 2 (Shortest Runtime Rescheduling): shed batch pods from an overloaded node, shortest
    first, until it is no longer overloaded; returns the (pod key, destination) moves in order.

    * Overloaded: requests exceed allocatable in some dimension (the node was resized, or the simulator
      replays usage above requests); with ``threshold`` (seed 004 §V uses 0.8) also utilisation >= it.
    * Shortest: ``order="remaining"`` (default) sheds the pod with the least remaining runtime first —
      with checkpoint/restore no progress is lost, and short pods are the cheapest to move;
      ``order="elapsed"`` is seed 004's literal reading ("shortest current lifetime, most recently
      deployed") for eviction without checkpoints, where it minimises lost progress (its Eq. 8).
      Batch pods without a runtime estimate go last in "remaining" order: they are not known to be short.
    * Each pod goes to a time-bin BFD destination (where seed 004 uses LRP: here batch placement is
      always time-bin BFD so batch nodes keep draining together) among the same group's schedulable
      nodes, cumulatively. A pod with no destination, or one that frees nothing that is short, is skipped
      and the next one tried (Alg. 2 would evict it to pending; a plan never strands a running pod).
    """
    _check_now(now)
    _check_cycle(cycle_seconds)
    if order not in ("remaining", "elapsed"):
        raise InvalidInputError(f"unknown shedding order {order!r} (expected 'remaining' or 'elapsed')")
    if threshold is not None:
        _check_threshold(threshold)

    def remaining_key(p: Pod) -> tuple[bool, float, str]:
        return (p.runtime_seconds is None, p.remaining_runtime(now), p.key)

    def elapsed_key(p: Pod) -> tuple[bool, float, str]:
        ran = p.progress_seconds + (max(0.0, now - p.started_at) if p.started_at is not None else 0.0)
        return (False, ran, p.key)

    # Alg. 2 line 1: the active batch jobs on o, sorted ascending.
    batches = sorted(
        (p for p in node.pods if p.kind is WorkloadKind.BATCH and p.migratable),
        key=remaining_key if order == "remaining" else elapsed_key,
    )
    working = {n.name: n for n in _destinations(node, others)}  # Alg. 2 line 2: av <- ng - o
    current = node
    moves: list[tuple[str, str]] = []
    for pod in batches:  # Alg. 2 lines 3-9
        if not _overloaded(current, threshold):
            break
        if not _relieves(pod, current):
            continue
        dest = time_bin_bfd_choose(list(working.values()), pod, now, cycle_seconds)
        if dest is None:
            continue
        working[dest.name] = dest.with_pod(pod)
        current = current.without_pods([pod.key])
        moves.append((pod.key, dest.name))
    return tuple(moves)
