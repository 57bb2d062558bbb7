"""Tests for extender.core.reschedule: under-utilisation clock, Alg. 5 plans, consolidation, SRR."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.core.model import InvalidInputError, Node, NodeGroup, Pod, Resources, WorkloadKind
from extender.core.packing import time_bin_bfd_choose
from extender.core.reschedule import (
    MigrationPlan,
    UnderutilState,
    consolidation_plans,
    migration_plan,
    shortest_runtime_reschedule,
    sustained_underutilized,
    update_underutilized,
)

GI = 2**30
NOW = 1000.0
CYCLE = 100.0
B = WorkloadKind.BATCH


def job(name: str, cpu: int, mem: int, remaining: float = 50.0, *, started: float = NOW, **kw: object) -> Pod:
    """A running batch pod with ``remaining_runtime(NOW) == remaining`` (it started at ``started``)."""
    runtime = remaining + (NOW - started)
    return Pod(
        name,
        Resources.request(cpu, mem),
        kind=B,
        runtime_seconds=runtime,
        started_at=started,
        **kw,  # type: ignore[arg-type]
    )


def node(
    name: str,
    cpu: int = 4000,
    mem: int = 8 * GI,
    pods: tuple[Pod, ...] = (),
    *,
    unschedulable: bool = False,
    group: NodeGroup | None = NodeGroup.BATCH,
) -> Node:
    return Node(name, Resources(cpu, mem, 110), pods=pods, unschedulable=unschedulable, group=group)


def apply(nodes: list[Node], source: str, moves: tuple[tuple[str, str], ...], *, empty: bool) -> dict[str, Node]:
    """Apply moves to a snapshot, independently of the code under test."""
    world = {n.name: n for n in nodes}
    by_key = {p.key: p for p in world[source].pods}
    for key, dest in moves:
        world[dest] = world[dest].with_pod(by_key[key])
    world[source] = world[source].without_pods(k for k, _ in moves)
    if empty:
        assert not world[source].pods
    return world


def assert_within_allocatable(n: Node) -> None:
    req = n.requested
    assert req.cpu_milli <= n.allocatable.cpu_milli
    assert req.memory_bytes <= n.allocatable.memory_bytes
    assert len(n.pods) <= n.allocatable.pods


# ------------------------------------------------------------------------------------------------------
# under-utilisation clock
# ------------------------------------------------------------------------------------------------------


def test_underutil_clock_keeps_earliest_start_and_resets_on_interruption() -> None:
    low = node("low", pods=(job("a", 400, GI),))  # max(0.1, 0.125) = 0.125
    high = node("high", pods=(job("b", 3000, GI),))  # 0.75
    state = update_underutilized(UnderutilState(), [low, high], now=100.0)
    assert dict(state.since) == {"low": 100.0}
    state = update_underutilized(state, [low, high], now=200.0)
    assert dict(state.since) == {"low": 100.0}
    assert sustained_underutilized(state, now=399.0, sustain_seconds=300.0) == []
    assert sustained_underutilized(state, now=400.0, sustain_seconds=300.0) == ["low"]
    # It goes above the threshold once: the clock restarts.
    busy = node("low", pods=(job("a", 400, 5 * GI),))
    state = update_underutilized(state, [busy, high], now=300.0)
    assert dict(state.since) == {}
    state = update_underutilized(state, [low], now=350.0)
    assert dict(state.since) == {"low": 350.0}
    # Deleted nodes are forgotten.
    assert dict(update_underutilized(state, [], now=360.0).since) == {}


def test_underutil_threshold_is_strict() -> None:
    half = node("half", pods=(job("a", 2000, GI),))  # utilisation exactly 0.5
    assert dict(update_underutilized(UnderutilState(), [half], 0.0, threshold=0.5).since) == {}
    assert dict(update_underutilized(UnderutilState(), [half], 0.0, threshold=0.51).since) == {"half": 0.0}


def test_sustained_orders_longest_first() -> None:
    state = UnderutilState({"b": 10.0, "a": 10.0, "c": 5.0, "d": 99.0})
    assert sustained_underutilized(state, now=100.0, sustain_seconds=50.0) == ["c", "a", "b"]


def test_underutil_state_is_a_private_copy() -> None:
    raw = {"a": 1.0}
    state = UnderutilState(raw)
    raw["b"] = 2.0
    assert dict(state.since) == {"a": 1.0}


@pytest.mark.parametrize("threshold", [0.0, -0.1, 1.01, math.nan, math.inf])
def test_underutil_rejects_bad_threshold(threshold: float) -> None:
    with pytest.raises(InvalidInputError):
        update_underutilized(UnderutilState(), [node("n")], 0.0, threshold=threshold)


def test_underutil_rejects_bad_now_and_sustain_and_state() -> None:
    with pytest.raises(InvalidInputError):
        update_underutilized(UnderutilState(), [node("n")], math.nan)
    with pytest.raises(InvalidInputError):
        sustained_underutilized(UnderutilState(), math.nan, 1.0)
    with pytest.raises(InvalidInputError):
        sustained_underutilized(UnderutilState(), 1.0, -1.0)
    with pytest.raises(InvalidInputError):
        UnderutilState({"a": math.inf})


def test_threshold_one_is_allowed() -> None:
    full = node("full", pods=(job("a", 4000, 8 * GI),))
    part = node("part", pods=(job("b", 3999, GI),))
    assert dict(update_underutilized(UnderutilState(), [full, part], 5.0, threshold=1.0).since) == {"part": 5.0}


# ------------------------------------------------------------------------------------------------------
# migration_plan (Alg. 5)
# ------------------------------------------------------------------------------------------------------


def test_migration_plan_moves_everything_by_bfd() -> None:
    src = node("src", pods=(job("a", 1000, 2 * GI), job("b", 500, GI)))
    roomy = node("roomy")
    snug = node("snug", pods=(job("x", 2000, 5 * GI),))  # 3Gi free
    plan = migration_plan(src, [roomy, snug, src], NOW, CYCLE)
    # a (bigger, first) -> snug (least memory left: 1Gi); b -> snug (0Gi left) beats roomy.
    assert plan == MigrationPlan("src", (("default/a", "snug"), ("default/b", "snug")))


def test_migration_plan_is_all_or_nothing() -> None:
    src = node("src", pods=(job("a", 1000, 3 * GI), job("b", 1000, 3 * GI)))
    only_one_fits = node("d", pods=(job("x", 1000, 4 * GI),))  # 4Gi free: one of the two
    assert migration_plan(src, [only_one_fits], NOW, CYCLE) is None
    assert migration_plan(src, [only_one_fits, node("e")], NOW, CYCLE) is not None


def test_migration_plan_refuses_services_and_unmigratable_pods() -> None:
    service = Pod("web", Resources.request(100, GI))
    pinned = job("pinned", 100, GI, migratable=False)
    for bad in (service, pinned):
        src = node("src", pods=(job("a", 100, GI), bad))
        assert migration_plan(src, [node("d")], NOW, CYCLE) is None


def test_migration_plan_never_targets_cordoned_other_group_or_itself() -> None:
    src = node("src", pods=(job("a", 100, GI),))
    cordoned = node("cordoned", unschedulable=True)
    service_node = node("svc", group=NodeGroup.SERVICE)
    assert migration_plan(src, [src, cordoned, service_node], NOW, CYCLE) is None
    # Same name as the source (e.g. a second copy of the snapshot) is still the source.
    assert migration_plan(src, [node("src")], NOW, CYCLE) is None


def test_migration_plan_empty_node_needs_no_moves() -> None:
    assert migration_plan(node("idle"), [], NOW, CYCLE) == MigrationPlan("idle", ())


def test_migration_plan_uses_time_bins() -> None:
    # The pod has ~5 cycles left: it goes to the node whose job ends in the same bin, not the tighter fit.
    src = node("src", pods=(job("a", 500, GI, remaining=530),))
    same_bin = node("same", pods=(job("x", 500, GI, remaining=560),))
    tighter = node("tight", 4000, 2 * GI, pods=(job("y", 500, GI, remaining=30),))
    assert migration_plan(src, [same_bin, tighter], NOW, CYCLE) == MigrationPlan("src", (("default/a", "same"),))


def test_migration_plan_bad_inputs() -> None:
    with pytest.raises(InvalidInputError):
        migration_plan(node("s"), [], math.nan, CYCLE)
    with pytest.raises(InvalidInputError):
        migration_plan(node("s"), [], NOW, 0.0)


@st.composite
def cluster(draw: st.DrawFn) -> list[Node]:
    count = draw(st.integers(min_value=1, max_value=5))
    nodes: list[Node] = []
    for i in range(count):
        cpu = draw(st.integers(min_value=1, max_value=8)) * 1000
        mem = draw(st.integers(min_value=1, max_value=16)) * GI
        pods: list[Pod] = []
        used = Resources()
        for j in range(draw(st.integers(min_value=0, max_value=4))):
            req = Resources.request(
                draw(st.integers(min_value=0, max_value=3000)), draw(st.integers(min_value=0, max_value=8)) * GI // 2
            )
            if not (used + req).fits_in(Resources(cpu, mem, 10**6)):
                continue
            used = used + req
            kind = draw(st.sampled_from([B, B, B, WorkloadKind.SERVICE]))
            pods.append(
                Pod(
                    f"n{i}p{j}",
                    req,
                    kind=kind,
                    runtime_seconds=draw(st.floats(min_value=0, max_value=1000)) if kind is B else None,
                    started_at=NOW,
                    migratable=draw(st.booleans()) or draw(st.booleans()),
                )
            )
        nodes.append(node(f"n{i}", cpu, mem, tuple(pods), unschedulable=draw(st.integers(0, 4)) == 0))
    return nodes


@settings(max_examples=200)
@given(cluster(), st.data())
def test_migration_plan_properties(nodes: list[Node], data: st.DataObject) -> None:
    src = data.draw(st.sampled_from(nodes))
    plan = migration_plan(src, nodes, NOW, CYCLE)
    movable = all(p.kind is B and p.migratable for p in src.pods)
    if not movable:
        assert plan is None
        return
    if plan is None:
        return
    assert plan.source == src.name
    # All or nothing: every pod exactly once.
    assert sorted(k for k, _ in plan.moves) == sorted(p.key for p in src.pods)
    cordoned = {n.name for n in nodes if n.unschedulable}
    for _, dest in plan.moves:
        assert dest != src.name and dest not in cordoned
    world = apply(nodes, src.name, plan.moves, empty=True)
    for n in world.values():
        assert_within_allocatable(n)


# ------------------------------------------------------------------------------------------------------
# consolidation_plans
# ------------------------------------------------------------------------------------------------------


def test_consolidation_never_refills_an_emptied_node() -> None:
    a = node("a", pods=(job("pa", 1000, GI),))  # utilisation 0.25 (cpu)
    b = node("b", pods=(job("pb", 1200, 3 * GI // 2),))  # 0.3
    c = node("c", pods=(job("pc", 2800, 13 * GI // 2),))  # free 1200m / 1.5Gi
    plans = consolidation_plans([a, b, c], ["b", "a"], NOW, CYCLE)
    # a first (worst utilised) -> c is the best fit; b's only remaining room would be a, now emptied.
    assert plans == [MigrationPlan("a", (("default/pa", "c"),))]


def test_consolidation_accumulates_destinations_and_skips_receivers() -> None:
    a = node("a", pods=(job("pa", 1000, 2 * GI),))
    b = node("b", pods=(job("pb", 1000, 2 * GI),))
    d = node("d", pods=(job("pd", 3000, 6 * GI),))  # room for exactly one of them
    e = node("e", 4000, 8 * GI, pods=(job("pe", 1000, 3 * GI),))
    plans = consolidation_plans([a, b, d, e], ["a", "b", "ghost"], NOW, CYCLE)
    assert [p.source for p in plans] == ["a", "b"]
    assert plans[0].moves == (("default/pa", "d"),)
    assert plans[1].moves == (("default/pb", "e"),)  # d is full now
    # A candidate that received pods is not emptied in the same round (no double migration).
    small = node("small", pods=(job("ps", 500, GI),))
    mid = node("mid", pods=(job("pm", 1000, 2 * GI),))
    spare = node("spare", 8000, 16 * GI)
    assert consolidation_plans([small, mid, spare], ["small", "mid"], NOW, CYCLE) == [
        MigrationPlan("small", (("default/ps", "mid"),))
    ]
    # An empty candidate is planned with no moves, and then nobody may move onto it.
    idle = node("idle", 1000, 2 * GI)
    assert consolidation_plans([a, idle], ["a", "idle"], NOW, CYCLE) == [MigrationPlan("idle", ())]


@settings(max_examples=200)
@given(cluster(), st.data())
def test_consolidation_properties(nodes: list[Node], data: st.DataObject) -> None:
    names = [n.name for n in nodes]
    candidates = data.draw(st.lists(st.sampled_from(names), unique=True))
    plans = consolidation_plans(nodes, candidates, NOW, CYCLE)
    sources = [p.source for p in plans]
    assert len(set(sources)) == len(sources) and set(sources) <= set(candidates)
    emptied: set[str] = set()
    world = {n.name: n for n in nodes}
    cordoned = {n.name for n in nodes if n.unschedulable}
    for plan in plans:
        dests = {d for _, d in plan.moves}
        assert not dests & set(sources), "an emptied (or to-be-emptied) node is used as destination"
        assert not dests & cordoned
        assert plan.source not in emptied
        world = apply(list(world.values()), plan.source, plan.moves, empty=True)
        emptied.add(plan.source)
    for n in world.values():
        assert_within_allocatable(n)


def test_consolidation_bad_inputs() -> None:
    with pytest.raises(InvalidInputError):
        consolidation_plans([node("a"), node("a")], ["a"], NOW, CYCLE)
    with pytest.raises(InvalidInputError):
        consolidation_plans([node("a")], ["a"], NOW, math.inf)


# ------------------------------------------------------------------------------------------------------
# shortest_runtime_reschedule (seed 004 Alg. 2)
# ------------------------------------------------------------------------------------------------------


def overloaded() -> Node:
    # 6000m / 9Gi requested on 4000m / 8Gi (e.g. after a resize): over-committed.
    return node(
        "hot",
        pods=(
            job("p300", 2000, 3 * GI, remaining=300, started=NOW - 10),
            job("p100", 2000, 3 * GI, remaining=100, started=NOW - 500),
            job("p200", 2000, 3 * GI, remaining=200, started=NOW - 50),
        ),
    )


def test_srr_sheds_shortest_remaining_first_until_fixed() -> None:
    moves = shortest_runtime_reschedule(overloaded(), [node("cold")], NOW, CYCLE)
    assert moves == (("default/p100", "cold"),)


def test_srr_elapsed_order_is_the_papers_most_recently_deployed() -> None:
    moves = shortest_runtime_reschedule(overloaded(), [node("cold")], NOW, CYCLE, order="elapsed")
    assert moves == (("default/p300", "cold"),)


def test_srr_threshold_sheds_more_and_skips_when_no_room() -> None:
    hot = overloaded()
    # With threshold 0.5 it keeps shedding while utilisation >= 0.5: after two moves the node is at exactly
    # 0.5 (cpu 2000/4000), so it would shed the third, but "cold" already holds 4000m of moved pods
    # (destinations accumulate) and the third does not fit: it stays.
    moves = shortest_runtime_reschedule(hot, [node("cold")], NOW, CYCLE, threshold=0.5)
    assert moves == (("default/p100", "cold"), ("default/p200", "cold"))
    assert shortest_runtime_reschedule(hot, [node("tiny", 100, GI)], NOW, CYCLE) == ()


def test_srr_noop_when_not_overloaded_and_never_to_cordoned_or_itself() -> None:
    calm = node("calm", pods=(job("a", 1000, GI),))
    assert shortest_runtime_reschedule(calm, [node("cold")], NOW, CYCLE) == ()
    hot = overloaded()
    assert shortest_runtime_reschedule(hot, [hot, node("c", unschedulable=True)], NOW, CYCLE) == ()


def test_srr_bad_inputs() -> None:
    with pytest.raises(InvalidInputError):
        shortest_runtime_reschedule(overloaded(), [], math.nan, CYCLE)
    with pytest.raises(InvalidInputError):
        shortest_runtime_reschedule(overloaded(), [], NOW, -1.0)
    with pytest.raises(InvalidInputError):
        shortest_runtime_reschedule(overloaded(), [], NOW, CYCLE, threshold=0.0)
    with pytest.raises(InvalidInputError):
        shortest_runtime_reschedule(overloaded(), [], NOW, CYCLE, order="random")  # type: ignore[arg-type]


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=1, max_value=3000),
            st.integers(min_value=1, max_value=6),
            st.floats(min_value=0, max_value=1000),
        ),
        min_size=1,
        max_size=6,
    ),
    cluster(),
)
def test_srr_properties(specs: list[tuple[int, int, float]], others: list[Node]) -> None:
    pods = tuple(job(f"h{i}", cpu, mem * GI // 2, remaining=r) for i, (cpu, mem, r) in enumerate(specs))
    hot = Node("hot", Resources(2000, 2 * GI, 110), pods=pods, group=NodeGroup.BATCH)
    moves = shortest_runtime_reschedule(hot, others, NOW, CYCLE)
    remaining = {p.key: p.remaining_runtime(NOW) for p in pods}
    moved = [k for k, _ in moves]
    # Shortest first: the moved pods appear in ascending remaining runtime.
    assert [remaining[k] for k in moved] == sorted(remaining[k] for k in moved)
    cordoned = {n.name for n in others if n.unschedulable}
    assert not {d for _, d in moves} & (cordoned | {"hot"})
    world = {n.name: n for n in others} | {"hot": hot}
    world = apply(list(world.values()), "hot", moves, empty=False)
    for name, n in world.items():
        if name != "hot":
            assert_within_allocatable(n)
    # It stops as soon as the node is no longer over-committed: before the last move it still was.
    if moves:
        before_last = hot.without_pods(moved[:-1])
        assert not before_last.free.is_nonnegative()
    # And if it is still over-committed, no further shortest-first pod had a destination.
    after = world["hot"]
    if not after.free.is_nonnegative():
        dests = [world[n.name] for n in others if not n.unschedulable and n.group == hot.group]
        for p in after.pods:
            if time_bin_bfd_choose(dests, p, NOW, CYCLE) is not None:
                free = after.free
                # Only pods that would relieve nothing may be left behind with a destination available.
                assert not (
                    (free.cpu_milli < 0 and p.requests.cpu_milli > 0)
                    or (free.memory_bytes < 0 and p.requests.memory_bytes > 0)
                )


def test_select_plan_is_the_first_candidate_plan_not_busy_not_left_alone_and_owned() -> None:
    """The flow's choice of the next node to empty, in core so the simulator's product policy makes it too."""
    from extender.core.reschedule import MigrationPlan, select_plan

    p1, p2, p3 = (MigrationPlan(n, ()) for n in ("a", "b", "c"))
    plans = (p1, p2, p3)
    assert select_plan(plans, ("a", "b", "c"), now=10.0) is p1
    assert select_plan(plans, ("a", "b", "c"), busy=frozenset({"a"}), now=10.0) is p2
    assert select_plan(plans, ("a", "b", "c"), left_alone={"a": 20.0, "b": 5.0}, now=10.0) is p2
    assert select_plan(plans, ("a", "b", "c"), left_alone={"a": 20.0}, owned=frozenset({"c"}), now=10.0) is p3
    assert select_plan(plans, ("b",), left_alone={"b": 11.0}, now=10.0) is None
