"""Tests for extender.core.packing: kube-scheduler score worked examples, BFD, time bins, extender scores."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from extender.core.model import InvalidInputError, Node, NodeGroup, Pod, Resources, WorkloadKind
from extender.core.packing import (
    DEFAULT_MEMORY_REQUEST,
    balanced_allocation_score,
    bfd_choose,
    bfd_sort,
    fits,
    k8s_default_score,
    least_allocated_score,
    most_allocated_score,
    pack,
    score_nodes,
    time_bin,
    time_bin_bfd_choose,
    time_bin_order,
    to_extender_scores,
)

MI = 2**20
GI = 2**30
NOW = 1000.0
CYCLE = 100.0


def mk_pod(
    name: str,
    cpu: int,
    mem: int,
    *,
    kind: WorkloadKind = WorkloadKind.SERVICE,
    remaining: float | None = None,
    migratable: bool = True,
) -> Pod:
    """A pod; batch pods get a runtime such that ``remaining_runtime(NOW) == remaining`` (started at NOW)."""
    if kind is WorkloadKind.BATCH:
        return Pod(
            name,
            Resources.request(cpu, mem),
            kind=kind,
            runtime_seconds=remaining if remaining is not None else 0.0,
            started_at=NOW,
            migratable=migratable,
        )
    return Pod(name, Resources.request(cpu, mem), kind=kind, migratable=migratable)


def mk_node(
    name: str,
    cpu: int,
    mem: int,
    pods: tuple[Pod, ...] = (),
    *,
    slots: int = 110,
    unschedulable: bool = False,
    group: NodeGroup | None = None,
) -> Node:
    return Node(name, Resources(cpu, mem, slots), pods=pods, unschedulable=unschedulable, group=group)


# ------------------------------------------------------------------------------------------------------
# kube-scheduler scores: worked examples computed by hand from the upstream formulas
# ------------------------------------------------------------------------------------------------------


def test_brief_example_4000m_8gi_half_used() -> None:
    # Requested incl. pod: 2000m / 4Gi. LA: cpu (4000-2000)*100//4000 = 50, mem 50 -> (50+50)//2 = 50.
    # BA: fractions 0.5 and 0.5 -> std 0 -> 100. Default profile sum: 150.
    node = mk_node("n", 4000, 8 * GI, (mk_pod("a", 1000, 2 * GI),))
    pod = mk_pod("p", 1000, 2 * GI)
    assert least_allocated_score(node, pod) == 50
    assert balanced_allocation_score(node, pod) == 100
    assert most_allocated_score(node, pod) == 50
    assert k8s_default_score(node, pod) == 150.0


def test_upstream_differently_sized_nodes() -> None:
    # kube-scheduler's own table case "nothing scheduled, resources requested, differently sized nodes":
    # pod 3000m / 5000 bytes; node1 4000m/10000, node2 6000m/10000.
    pod = Pod("p", Resources.request(3000, 5000))
    n1 = mk_node("n1", 4000, 10000)
    n2 = mk_node("n2", 6000, 10000)
    # LA n1: cpu 1000*100//4000 = 25, mem 50 -> 75//2 = 37 ; n2: 50, 50 -> 50
    assert least_allocated_score(n1, pod) == 37
    assert least_allocated_score(n2, pod) == 50
    # BA n1: |0.75 - 0.5| / 2 = 0.125 -> int(87.5) = 87 ; n2: 0.5, 0.5 -> 100
    assert balanced_allocation_score(n1, pod) == 87
    assert balanced_allocation_score(n2, pod) == 100


def test_least_allocated_uses_non_zero_defaults_for_incoming_best_effort_pod() -> None:
    # Existing 3000m / 5000Mi, pod requests nothing -> counted as 100m / 200Mi.
    # cpu (4000-3100)*100//4000 = 22 (22.5 floored), mem (10000-5200)*100//10000 = 48 -> 70//2 = 35.
    node = mk_node("n", 4000, 10000 * MI, (mk_pod("a", 3000, 5000 * MI),))
    pod = mk_pod("be", 0, 0)
    assert least_allocated_score(node, pod) == 35
    # MostAllocated: cpu 3100*100//4000 = 77, mem 52 -> 129//2 = 64
    assert most_allocated_score(node, pod) == 64


def test_least_allocated_uses_non_zero_defaults_for_existing_pods() -> None:
    # One best-effort pod already bound, incoming best-effort: requested 200m / 400Mi of 1000m / 1000Mi.
    # cpu 800*100//1000 = 80, mem 600*100//1000 = 60 -> 70. With raw requests it would be 90.
    node = mk_node("n", 1000, 1000 * MI, (mk_pod("be1", 0, 0),))
    assert least_allocated_score(node, mk_pod("be2", 0, 0)) == 70


def test_balanced_allocation_uses_actual_requests_and_skips_best_effort() -> None:
    node = mk_node("n", 1000, 1000 * MI, (mk_pod("be1", 0, 0),))
    # Actual requests: cpu 100/1000 = 0.1, mem 0 -> std 0.05 -> 95 (non-zero defaults would give 90).
    assert balanced_allocation_score(node, mk_pod("p", 100, 0)) == 95
    # Best-effort incoming pod: upstream PreScore returns Skip -> contributes nothing.
    assert balanced_allocation_score(node, mk_pod("be2", 0, 0)) == 0


def test_balanced_allocation_caps_fractions_at_one() -> None:
    # cpu 8000/4000 = 2 -> capped at 1; mem 1/8 = 0.125 -> std 0.4375 -> int(56.25) = 56.
    node = mk_node("n", 4000, 8 * GI)
    assert balanced_allocation_score(node, mk_pod("p", 8000, GI)) == 56
    # Asymmetric, not capped: 0.75 vs 0.25 -> std 0.25 -> 75.
    assert balanced_allocation_score(node, mk_pod("q", 3000, 2 * GI)) == 75


def test_least_allocated_over_requested_resource_scores_zero_and_zero_allocatable_is_skipped() -> None:
    node = mk_node("n", 1000, 8 * GI)
    # cpu 2000 > 1000 -> 0; mem (8-2)/8 -> 75 -> (0+75)//2 = 37
    assert least_allocated_score(node, mk_pod("p", 2000, 2 * GI)) == 37
    # A node without cpu allocatable: only memory counts -> 75; BalancedAllocation with one fraction -> 100.
    no_cpu = mk_node("m", 0, 8 * GI)
    assert least_allocated_score(no_cpu, mk_pod("p", 500, 2 * GI)) == 75
    assert balanced_allocation_score(no_cpu, mk_pod("p", 500, 2 * GI)) == 100
    assert least_allocated_score(mk_node("z", 0, 0), mk_pod("p", 1, 1)) == 0


def test_default_memory_request_is_200mi() -> None:
    assert DEFAULT_MEMORY_REQUEST == 200 * 1024 * 1024


resources_cpu = st.integers(min_value=0, max_value=16000)
resources_mem = st.integers(min_value=0, max_value=32).map(lambda g: g * 512 * MI)


@st.composite
def pods_st(draw: st.DrawFn, name: str | None = None) -> Pod:
    kind = draw(st.sampled_from([WorkloadKind.BATCH, WorkloadKind.SERVICE]))
    n = name or draw(st.text(alphabet="abcdefgh", min_size=1, max_size=6))
    cpu = draw(st.integers(min_value=0, max_value=4000))
    mem = draw(st.integers(min_value=0, max_value=8)) * 512 * MI
    remaining = draw(st.floats(min_value=0, max_value=1000, allow_nan=False))
    return mk_pod(n, cpu, mem, kind=kind, remaining=remaining)


@st.composite
def nodes_st(draw: st.DrawFn, prefix: str = "n", max_nodes: int = 6) -> list[Node]:
    count = draw(st.integers(min_value=0, max_value=max_nodes))
    out: list[Node] = []
    for i in range(count):
        cpu = draw(st.integers(min_value=0, max_value=8)) * 1000
        mem = draw(st.integers(min_value=0, max_value=16)) * GI
        existing = draw(st.lists(pods_st(), max_size=3))
        # Keep existing pods within allocatable, as a real snapshot would be.
        kept: list[Pod] = []
        used = Resources()
        for j, p in enumerate(existing):
            p = Pod(
                f"{prefix}{i}-e{j}", p.requests, kind=p.kind, runtime_seconds=p.runtime_seconds, started_at=p.started_at
            )
            if (used + p.requests).fits_in(Resources(cpu, mem, 10**6)):
                kept.append(p)
                used = used + p.requests
        slots = draw(st.integers(min_value=len(kept), max_value=len(kept) + 3))
        out.append(mk_node(f"{prefix}{i}", cpu, mem, tuple(kept), slots=slots, unschedulable=draw(st.booleans())))
    return out


@given(nodes_st(), pods_st(name="p"))
def test_scores_are_in_range(nodes: list[Node], pod: Pod) -> None:
    for node in nodes:
        for score in (
            least_allocated_score(node, pod),
            most_allocated_score(node, pod),
            balanced_allocation_score(node, pod),
        ):
            assert 0 <= score <= 100


@given(nodes_st(max_nodes=1), pods_st(name="p"), pods_st(name="extra"))
def test_more_load_never_raises_least_allocated(nodes: list[Node], pod: Pod, extra: Pod) -> None:
    assume(nodes)
    node = nodes[0]
    assert least_allocated_score(node.with_pod(extra), pod) <= least_allocated_score(node, pod)
    assert most_allocated_score(node.with_pod(extra), pod) >= most_allocated_score(node, pod)


# ------------------------------------------------------------------------------------------------------
# fits, bfd_sort, bfd_choose
# ------------------------------------------------------------------------------------------------------


def test_fits_exact_boundary_slots_cordon_and_extended() -> None:
    node = mk_node("n", 1000, GI, (mk_pod("a", 500, GI // 2),), slots=2)
    assert fits(node, mk_pod("p", 500, GI // 2))  # exactly the remaining space
    assert not fits(node, mk_pod("p", 501, GI // 2))
    assert not fits(node, mk_pod("p", 500, GI // 2 + 1))
    full_slots = node.with_pod(mk_pod("b", 0, 0))
    assert not fits(full_slots, mk_pod("p", 0, 0))  # 2 pods bound, 2 slots
    # A pod whose Resources say pods=0 still takes a slot.
    zero_slot_pod = Pod("z", Resources(0, 0, 0))
    assert not fits(full_slots, zero_slot_pod)
    assert not fits(mk_node("c", 1000, GI, unschedulable=True), mk_pod("p", 0, 0))
    gpu_pod = Pod("g", Resources.request(0, 0, extended={"nvidia.com/gpu": 1}))
    assert not fits(node, gpu_pod)
    gpu_node = Node("g", Resources(1000, GI, 10, (("nvidia.com/gpu", 1),)))
    assert fits(gpu_node, gpu_pod)


def test_bfd_sort_memory_first_then_cpu_then_key() -> None:
    pods = [mk_pod("c", 4000, GI), mk_pod("a", 100, 2 * GI), mk_pod("b", 200, 2 * GI), mk_pod("d", 200, 2 * GI)]
    assert [p.name for p in bfd_sort(pods)] == ["b", "d", "a", "c"]


def test_bfd_choose_least_remaining_memory_then_cpu_then_name() -> None:
    pod = mk_pod("p", 1000, GI)
    roomy = mk_node("roomy", 8000, 16 * GI)
    tight_mem = mk_node("tight", 8000, 2 * GI)  # 1Gi left, lots of cpu
    tight_cpu = mk_node("cpu", 1000, 4 * GI)  # 3Gi left, 0 cpu left
    assert bfd_choose([roomy, tight_mem, tight_cpu], pod) is tight_mem  # memory outranks cpu
    twin_a = mk_node("a", 2000, 2 * GI)
    twin_b = mk_node("b", 2000, 2 * GI)
    less_cpu = mk_node("c", 1500, 2 * GI)
    assert bfd_choose([twin_b, twin_a], pod) is twin_a
    assert bfd_choose([twin_a, less_cpu], pod) is less_cpu
    assert bfd_choose([mk_node("x", 500, 8 * GI), mk_node("y", 8000, 8 * GI, unschedulable=True)], pod) is None


@given(nodes_st(), pods_st(name="p"))
def test_bfd_choice_has_least_remaining_memory_among_feasible(nodes: list[Node], pod: Pod) -> None:
    chosen = bfd_choose(nodes, pod)
    feasible = [n for n in nodes if fits(n, pod)]
    if not feasible:
        assert chosen is None
        return
    assert chosen is not None and fits(chosen, pod)
    left = chosen.free.memory_bytes - pod.requests.memory_bytes
    assert all(left <= n.free.memory_bytes - pod.requests.memory_bytes for n in feasible)


# ------------------------------------------------------------------------------------------------------
# time bins
# ------------------------------------------------------------------------------------------------------


def test_time_bin_floor_division() -> None:
    assert time_bin(0.0, 100.0) == 0
    assert time_bin(99.9, 100.0) == 0
    assert time_bin(100.0, 100.0) == 1
    assert time_bin(350.0, 100.0) == 3


@pytest.mark.parametrize("cycle", [0.0, -5.0, math.nan, math.inf])
def test_time_bin_rejects_bad_cycle(cycle: float) -> None:
    with pytest.raises(InvalidInputError):
        time_bin(10.0, cycle)


@pytest.mark.parametrize("remaining", [-1.0, math.nan, math.inf])
def test_time_bin_rejects_bad_remaining(remaining: float) -> None:
    with pytest.raises(InvalidInputError):
        time_bin(remaining, 100.0)


def _batch_node(name: str, remaining: float) -> Node:
    return mk_node(name, 8000, 16 * GI, (mk_pod(f"{name}-job", 100, GI, kind=WorkloadKind.BATCH, remaining=remaining),))


def test_time_bin_order_own_then_greater_ascending_then_lesser_descending() -> None:
    nodes = [_batch_node(f"b{b}", b * CYCLE + 10) for b in (7, 0, 5, 2, 3)] + [mk_node("empty", 1000, GI)]
    pod = mk_pod("p", 100, GI, kind=WorkloadKind.BATCH, remaining=3 * CYCLE + 50)
    order = time_bin_order(nodes, pod, NOW, CYCLE)
    assert [[n.name for n in g] for g in order] == [["b3"], ["b5"], ["b7"], ["b2"], ["b0", "empty"]]
    # Own bin absent: start with the next greater one.
    pod4 = mk_pod("p", 100, GI, kind=WorkloadKind.BATCH, remaining=4 * CYCLE)
    assert [[n.name for n in g] for g in time_bin_order(nodes, pod4, NOW, CYCLE)] == [
        ["b5"],
        ["b7"],
        ["b3"],
        ["b2"],
        ["b0", "empty"],
    ]


@given(
    st.lists(st.floats(min_value=0, max_value=2000, allow_nan=False), max_size=8),
    st.floats(min_value=0, max_value=2000, allow_nan=False),
)
def test_time_bin_order_property(remainings: list[float], pod_remaining: float) -> None:
    nodes = [_batch_node(f"n{i}", r) for i, r in enumerate(remainings)]
    pod = mk_pod("p", 1, 1, kind=WorkloadKind.BATCH, remaining=pod_remaining)
    groups = time_bin_order(nodes, pod, NOW, CYCLE)
    own = int(pod_remaining // CYCLE)
    bins = [int(g[0].remaining_runtime(NOW) // CYCLE) for g in groups]
    for g, b in zip(groups, bins, strict=True):
        assert all(int(n.remaining_runtime(NOW) // CYCLE) == b for n in g)
    assert sorted(n.name for g in groups for n in g) == sorted(n.name for n in nodes)
    expected = ([own] if own in bins else []) + sorted(b for b in bins if b > own)
    expected += sorted((b for b in bins if b < own), reverse=True)
    assert bins == expected


def test_time_bin_bfd_prefers_own_bin_over_tighter_fit_elsewhere() -> None:
    # b0 is the tighter BFD fit, but the pod (bin 5) belongs with the node whose job ends in bin 5.
    b5 = _batch_node("b5", 5 * CYCLE + 20)
    b0 = mk_node("b0", 2000, 2 * GI, (mk_pod("j", 100, GI, kind=WorkloadKind.BATCH, remaining=20),))
    pod = mk_pod("p", 500, GI // 2, kind=WorkloadKind.BATCH, remaining=5 * CYCLE + 80)
    assert bfd_choose([b5, b0], pod) is b0
    assert time_bin_bfd_choose([b5, b0], pod, NOW, CYCLE) is b5
    # When the own bin is full, the greater bin is tried before the lesser one.
    b5_full = mk_node("b5", 100, GI, (mk_pod("j5", 100, GI, kind=WorkloadKind.BATCH, remaining=520),))
    b7 = _batch_node("b7", 7 * CYCLE)
    assert time_bin_bfd_choose([b5_full, b0, b7], pod, NOW, CYCLE) is b7


@given(nodes_st(), pods_st(name="p"))
def test_time_bin_bfd_chooses_in_first_feasible_bin(nodes: list[Node], pod: Pod) -> None:
    chosen = time_bin_bfd_choose(nodes, pod, NOW, CYCLE)
    for group in time_bin_order(nodes, pod, NOW, CYCLE):
        best = bfd_choose(group, pod)
        if best is not None:
            assert chosen is best
            return
    assert chosen is None


# ------------------------------------------------------------------------------------------------------
# extender scores
# ------------------------------------------------------------------------------------------------------


def test_to_extender_scores_rank_based() -> None:
    assert to_extender_scores({"a": 5.0, "b": 3.0, "c": 3.0, "d": 1.0}) == {"a": 10, "b": 9, "c": 9, "d": 8}
    assert to_extender_scores({"a": 5.0, "b": 3.0}, higher_is_better=False) == {"a": 9, "b": 10}
    many = {f"n{i:02d}": float(i) for i in range(15)}
    scores = to_extender_scores(many)
    assert scores["n14"] == 10 and scores["n05"] == 1 and scores["n04"] == 0 and scores["n00"] == 0
    assert to_extender_scores({}) == {}
    with pytest.raises(InvalidInputError):
        to_extender_scores({"a": math.nan})


@given(st.dictionaries(st.text(min_size=1, max_size=4), st.floats(allow_nan=False), max_size=20), st.booleans())
def test_to_extender_scores_order_preserving(raw: dict[str, float], higher: bool) -> None:
    scores = to_extender_scores(raw, higher_is_better=higher)
    assert scores.keys() == raw.keys()
    assert all(0 <= s <= 10 for s in scores.values())
    sign = 1 if higher else -1
    for a in raw:
        for b in raw:
            if raw[a] == raw[b]:
                assert scores[a] == scores[b]
            elif sign * raw[a] > sign * raw[b]:
                assert scores[a] >= scores[b]
    if raw:
        best = max(raw.values()) if higher else min(raw.values())
        assert all(scores[n] == 10 for n, v in raw.items() if v == best)


@given(nodes_st(), pods_st(name="p"), st.sampled_from(["cost", "spread"]))
def test_score_nodes_infeasible_zero_and_chosen_on_top(nodes: list[Node], pod: Pod, profile: str) -> None:
    scores = score_nodes(profile, nodes, pod, NOW, CYCLE)
    assert scores.keys() == {n.name for n in nodes}
    for n in nodes:
        if not fits(n, pod):
            assert scores[n.name] == 0
    if profile == "cost" or pod.kind is WorkloadKind.BATCH:
        chosen = (
            time_bin_bfd_choose(nodes, pod, NOW, CYCLE) if pod.kind is WorkloadKind.BATCH else bfd_choose(nodes, pod)
        )
        if chosen is not None:
            assert scores[chosen.name] == 10
    else:
        feasible = [n for n in nodes if fits(n, pod)]
        if feasible:
            top = max(least_allocated_score(n, pod) for n in feasible)
            assert all(scores[n.name] == 10 for n in feasible if least_allocated_score(n, pod) == top)


def test_score_nodes_cost_vs_spread_for_a_service() -> None:
    pod = mk_pod("p", 1000, GI)
    full = mk_node("full", 4000, 4 * GI, (mk_pod("a", 2000, 2 * GI),))
    empty = mk_node("empty", 4000, 4 * GI)
    tiny = mk_node("tiny", 500, GI)
    assert score_nodes("cost", [full, empty, tiny], pod, NOW, CYCLE) == {"full": 10, "empty": 9, "tiny": 0}
    assert score_nodes("spread", [full, empty, tiny], pod, NOW, CYCLE) == {"full": 9, "empty": 10, "tiny": 0}


def test_score_nodes_batch_is_time_bin_bfd_even_when_spreading() -> None:
    b5 = _batch_node("b5", 5 * CYCLE + 20)
    b0 = mk_node("b0", 2000, 2 * GI, (mk_pod("j", 100, GI, kind=WorkloadKind.BATCH, remaining=20),))
    pod = mk_pod("p", 500, GI // 2, kind=WorkloadKind.BATCH, remaining=5 * CYCLE + 80)
    for profile in ("cost", "spread"):
        assert score_nodes(profile, [b5, b0], pod, NOW, CYCLE) == {"b5": 10, "b0": 9}


def test_score_nodes_bad_inputs() -> None:
    node = mk_node("n", 1000, GI)
    pod = mk_pod("p", 1, 1)
    with pytest.raises(InvalidInputError):
        score_nodes("fastest", [node], pod, NOW, CYCLE)
    with pytest.raises(InvalidInputError):
        score_nodes("cost", [node], pod, math.nan, CYCLE)
    with pytest.raises(InvalidInputError):
        score_nodes("cost", [node], pod, NOW, 0.0)
    with pytest.raises(InvalidInputError):
        score_nodes("cost", [node, node], pod, NOW, CYCLE)


# ------------------------------------------------------------------------------------------------------
# pack
# ------------------------------------------------------------------------------------------------------


def _assert_no_overcommit(nodes: list[Node], pods: list[Pod], placed: dict[str, str]) -> None:
    by_key = {p.key: p for p in pods}
    for node in nodes:
        mine = [by_key[k] for k, n in placed.items() if n == node.name]
        if node.unschedulable:
            assert not mine
        total = node.requested + Resources.total(p.requests for p in mine)
        assert total.cpu_milli <= node.allocatable.cpu_milli
        assert total.memory_bytes <= node.allocatable.memory_bytes
        assert len(node.pods) + len(mine) <= node.allocatable.pods


@settings(max_examples=150)
@given(
    nodes_st(max_nodes=5),
    st.lists(pods_st(), max_size=10, unique_by=lambda p: p.key),
    st.sampled_from(["bfd", "time-bin-bfd", "least-allocated", "k8s-default"]),
)
def test_pack_never_overcommits_and_accounts_for_every_pod(nodes: list[Node], pods: list[Pod], strategy: str) -> None:
    placed, unplaced = pack(pods, nodes, NOW, CYCLE, strategy)
    assert set(placed) | {p.key for p in unplaced} == {p.key for p in pods}
    assert not set(placed) & {p.key for p in unplaced}
    assert set(placed.values()) <= {n.name for n in nodes}
    _assert_no_overcommit(nodes, pods, placed)


def test_pack_bfd_uses_fewer_nodes_than_least_allocated() -> None:
    nodes = [mk_node(f"n{i}", 4000, 8 * GI) for i in range(4)]
    pods = [mk_pod(f"p{i}", 1000, 2 * GI) for i in range(4)]
    bfd, left_bfd = pack(pods, nodes, NOW, CYCLE, "bfd")
    la, left_la = pack(pods, nodes, NOW, CYCLE, "least-allocated")
    assert not left_bfd and not left_la
    assert set(bfd.values()) == {"n0"}
    assert set(la.values()) == {"n0", "n1", "n2", "n3"}


def test_pack_time_bin_groups_by_runtime_longest_first() -> None:
    nodes = [mk_node("a", 4000, 4 * GI), mk_node("b", 4000, 4 * GI)]
    long1 = mk_pod("long1", 1000, 2 * GI, kind=WorkloadKind.BATCH, remaining=900)
    long2 = mk_pod("long2", 1000, 2 * GI, kind=WorkloadKind.BATCH, remaining=950)
    short1 = mk_pod("short1", 1000, 2 * GI, kind=WorkloadKind.BATCH, remaining=50)
    short2 = mk_pod("short2", 1000, 2 * GI, kind=WorkloadKind.BATCH, remaining=60)
    placed, unplaced = pack([short1, long1, short2, long2], nodes, NOW, CYCLE, "time-bin-bfd")
    assert not unplaced
    assert placed["default/long1"] == placed["default/long2"]
    assert placed["default/short1"] == placed["default/short2"]
    assert placed["default/long1"] != placed["default/short1"]


def test_pack_reports_unplaced_and_bad_inputs() -> None:
    nodes = [mk_node("a", 1000, GI)]
    big = mk_pod("big", 2000, GI)
    placed, unplaced = pack([big], nodes, NOW, CYCLE, "bfd")
    assert placed == {} and unplaced == [big]
    with pytest.raises(InvalidInputError):
        pack([big], nodes, NOW, CYCLE, "first-fit")
    with pytest.raises(InvalidInputError):
        pack([big], nodes, NOW, -1.0, "bfd")
    with pytest.raises(InvalidInputError):
        pack([big], nodes, math.nan, CYCLE, "bfd")
    with pytest.raises(InvalidInputError):
        pack([big, big], nodes, NOW, CYCLE, "bfd")
