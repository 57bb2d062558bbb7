"""Tests for extender.core.autoscale: worked examples from paper 000 Table 7 plus properties.

The properties are chosen so they can be proved from the algorithm (see each docstring), not merely
observed: plan_pods is never compared with plan_aggregate in the "cheaper" direction because the aggregate
plan ignores fragmentation and can be cheaper *and infeasible* (test_aggregate_can_be_cheaper_but_infeasible).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from extender.core.autoscale import (
    Provisioning,
    ProvisioningLedger,
    ScalePlan,
    ScoreWeights,
    cost_efficiency,
    fluid_lower_bound_per_hour,
    forecast_shortage,
    measured_lag,
    plan_aggregate,
    plan_batch,
    plan_pods,
    validate_catalogue,
    zero_bin_capacity,
)
from extender.core.model import (
    Flavour,
    InvalidInputError,
    Node,
    NodeGroup,
    Pod,
    Resources,
    WorkloadKind,
    memory_bytes,
)

GI = 2**30
MI = 2**20


def table7(slots: int = 110) -> list[Flavour]:
    """Paper 000 Table 7 (Nectar flavours, Azure B-series prices)."""
    rows = [
        ("t3.xsmall", 1, 1, 0.0198),
        ("m3.xsmall", 1, 2, 0.0344),
        ("m3.small", 2, 4, 0.0686),
        ("m1.medium", 2, 8, 0.1371),
        ("m1.large", 4, 16, 0.2746),
        ("m1.xlarge", 8, 32, 0.5479),
    ]
    return [Flavour(n, Resources(c * 1000, m * GI, slots), p) for n, c, m, p in rows]


T7 = table7()
BY_NAME = {f.name: f for f in T7}
HALF = ScoreWeights()


def pod(name: str, cpu: int, mem: int, **kw: object) -> Pod:
    return Pod(name, Resources.request(cpu, mem), **kw)  # type: ignore[arg-type]


def batch(name: str, cpu: int, mem: int, runtime: float, started: float = 0.0) -> Pod:
    return Pod(
        name,
        Resources.request(cpu, mem),
        kind=WorkloadKind.BATCH,
        runtime_seconds=runtime,
        started_at=started,
    )


def demand_of(pods: list[Pod]) -> Resources:
    return Resources.total(p.requests for p in pods)


def assert_valid_plan(plan: ScalePlan, pending: list[Pod], flavours: list[Flavour]) -> None:
    """Each pending key exactly once (a node or unservable); no node over-committed; no empty node;
    unservable == exactly the pods that fit no flavour."""
    by_key = {p.key: p for p in pending}
    placed = [k for _, keys in plan.nodes for k in keys]
    claimed = placed + list(plan.unservable)
    assert sorted(claimed) == sorted(by_key), "every pending pod exactly once"
    for flavour, keys in plan.nodes:
        assert keys, "a plan never buys an empty node"
        used = Resources.total(by_key[k].requests for k in keys)
        assert used.fits_in(flavour.capacity), f"{flavour.name} over-committed: {used}"
    for key in plan.unservable:
        assert not any(by_key[key].requests.fits_in(f.capacity) for f in flavours)
    for key in placed:
        assert any(by_key[key].requests.fits_in(f.capacity) for f in flavours)


# ------------------------------------------------------------------------------------ worked examples


def test_score_worked_example_table7() -> None:
    """Demand 800m / 4 GiB. nc = 0.5*min(0.8,cpu)/0.8 + 0.5*min(4,mem)/4 over the price."""
    d = Resources(800, 4 * GI)
    assert cost_efficiency(BY_NAME["t3.xsmall"], d, HALF) == pytest.approx((0.5 * 1 + 0.5 * 0.25) / 0.0198)
    assert cost_efficiency(BY_NAME["m3.xsmall"], d, HALF) == pytest.approx((0.5 + 0.5 * 0.5) / 0.0344)
    assert cost_efficiency(BY_NAME["m3.small"], d, HALF) == pytest.approx(1.0 / 0.0686)
    # m1.xlarge covers everything too, but at 8x the price of m3.small: capacity beyond demand is not "used"
    assert cost_efficiency(BY_NAME["m1.xlarge"], d, HALF) == pytest.approx(1.0 / 0.5479)


def test_plan_aggregate_follows_alg3_trace() -> None:
    """Hand trace of paper 000 Alg. 3 on (800m, 4 GiB):
    1. scores t3 31.6 > m3.xsmall 21.8 > m3.small 14.6 -> t3; left (0, 3 GiB)
    2. memory only: t3 0.5*(1/3)/0.0198=8.4, m3.xsmall 0.5*(2/3)/0.0344=9.7, m3.small 0.5/0.0686=7.3 -> m3.xsmall
    3. left (0, 1 GiB): t3 0.5/0.0198=25.3 -> t3; done."""
    plan = plan_aggregate(Resources(800, 4 * GI), T7, HALF)
    assert [f.name for f, _ in plan.nodes] == ["t3.xsmall", "m3.xsmall", "t3.xsmall"]
    assert all(keys == () for _, keys in plan.nodes)
    assert plan.unservable == ()
    assert plan.cost_per_hour == pytest.approx(0.0198 * 2 + 0.0344)
    assert plan.flavour_counts == {"m3.xsmall": 1, "t3.xsmall": 2}


def test_plan_pods_beats_ga_on_same_demand() -> None:
    """Eight 100m/512Mi pods: the small-tail rule finds one m3.small (0.0686) for what GA buys three
    nodes (0.0740) for; the fluid bound is 4 GiB at m1.xlarge's $/GiB = 0.0684875."""
    pods = [pod(f"p{i}", 100, 512 * MI) for i in range(8)]
    plan = plan_pods(pods, T7, HALF)
    assert plan.flavour_counts == {"m3.small": 1}
    assert_valid_plan(plan, pods, T7)
    lb = fluid_lower_bound_per_hour(demand_of(pods), T7)
    assert lb == pytest.approx(4 * 0.5479 / 32)
    assert lb <= plan.cost_per_hour < plan_aggregate(demand_of(pods), T7, HALF).cost_per_hour


def test_plan_pods_kubernetes_rounding_and_fragmentation() -> None:
    """Ten nginx pods (Table 4: 100m, 0.4 GiB). 0.4Gi rounds up to 429496730 bytes, so ten need 4 bytes
    more than 4 GiB: m3.small holds nine and a t3.xsmall the tenth (0.0884), cheaper than one m1.medium
    (0.1371), five t3 (0.099) or three m3.xsmall (0.1032)."""
    pods = [pod(f"nginx-{i}", 100, memory_bytes("0.4Gi")) for i in range(10)]
    plan = plan_pods(pods, T7, HALF)
    assert plan.flavour_counts == {"m3.small": 1, "t3.xsmall": 1}
    assert plan.cost_per_hour == pytest.approx(0.0686 + 0.0198)
    assert_valid_plan(plan, pods, T7)


def test_aggregate_can_be_cheaper_but_infeasible() -> None:
    """100 batch_large pods (300m, 0.9 GiB). GA buys by volume and counts t3.xsmall's spare cpu; but a
    t3.xsmall holds one such pod, m3.small 4, m1.medium 6, m1.large 13, m1.xlarge 26: its nodes hold
    fewer than 100 pods. plan_pods buys 25 m3.small, 4 pods each (0.01715 $/pod, the best of Table 7)."""
    pods = [pod(f"b{i}", 300, memory_bytes("0.9Gi")) for i in range(100)]
    agg = plan_aggregate(demand_of(pods), T7, HALF)
    per_node = {
        f.name: min(f.capacity.cpu_milli // 300, f.capacity.memory_bytes // memory_bytes("0.9Gi"), f.capacity.pods)
        for f in T7
    }
    assert sum(per_node[f.name] for f, _ in agg.nodes) < 100, "the aggregate plan cannot host the pods"
    plan = plan_pods(pods, T7, HALF)
    assert_valid_plan(plan, pods, T7)
    assert plan.flavour_counts == {"m3.small": 25}
    assert agg.cost_per_hour < plan.cost_per_hour  # cheaper only because it does not fit


def test_weights_of_paper_004_change_the_choice() -> None:
    """Same price, mirrored shapes: 0.5/0.5 ties (then the name decides), 0.38/0.62 favours memory."""
    cpu_rich = Flavour("a-cpu-rich", Resources(2000, 1 * GI, 110), 0.05)
    mem_rich = Flavour("b-mem-rich", Resources(1000, 2 * GI, 110), 0.05)
    d = Resources(2000, 2 * GI)
    assert cost_efficiency(cpu_rich, d, HALF) == pytest.approx(cost_efficiency(mem_rich, d, HALF))
    w004 = ScoreWeights(cpu=0.38, memory=0.62)
    assert cost_efficiency(mem_rich, d, w004) > cost_efficiency(cpu_rich, d, w004)
    assert plan_aggregate(d, [cpu_rich, mem_rich], HALF).nodes[0][0] is cpu_rich
    assert plan_aggregate(d, [cpu_rich, mem_rich], w004).nodes[0][0] is mem_rich


def test_small_tail_rule_closes_with_one_node() -> None:
    """Z (20 cores) fits only Y; ten 1-core pods remain after it. For them W ($0.85) holds all ten, but X
    ($0.75, nine of them) scores higher (0.9/0.75 = 1.2 > 1/0.85), and then the tenth needs another X:
    Y+X+X = $3.00, and Y-only FFD is 2 x $1.50 = $3.00. Closing with the cheapest whole-remainder flavour
    gives Y+W = $2.35."""
    x = Flavour("x", Resources(9000, 9 * GI, 110), 0.75)
    w = Flavour("w", Resources(10_000, 10 * GI, 110), 0.85)
    y = Flavour("y", Resources(20_000, 20 * GI, 110), 1.5)
    pods = [pod("z", 20_000, 20 * GI), *(pod(f"s{i}", 1000, GI) for i in range(10))]
    plan = plan_pods(pods, [x, w, y], HALF)
    assert plan.flavour_counts == {"w": 1, "y": 1}
    assert plan.cost_per_hour == pytest.approx(2.35)
    assert_valid_plan(plan, pods, [x, w, y])


def test_pod_slots_are_capacity() -> None:
    """Twelve tiny pods on 5-slot flavours need three nodes even though cpu/memory fit one."""
    small = [Flavour("tiny", Resources(8000, 32 * GI, 5), 0.1)]
    pods = [pod(f"t{i}", 1, MI) for i in range(12)]
    plan = plan_pods(pods, small, HALF)
    assert len(plan.nodes) == 3
    assert_valid_plan(plan, pods, small)


def test_extended_resources_respected() -> None:
    gpu = Flavour("gpu", Resources(4000, 16 * GI, 110, (("nvidia.com/gpu", 1),)), 1.0)
    cpu = Flavour("cpu", Resources(4000, 16 * GI, 110), 0.1)
    pods = [Pod(f"g{i}", Resources.request(100, MI, extended={"nvidia.com/gpu": 1})) for i in range(3)]
    plan = plan_pods([*pods, pod("plain", 100, MI)], [gpu, cpu], HALF)
    assert plan.flavour_counts == {"gpu": 3}  # the plain pod rides along on a GPU node
    assert_valid_plan(plan, [*pods, pod("plain", 100, MI)], [gpu, cpu])
    assert plan_pods(pods, [cpu], HALF).unservable == tuple(sorted(p.key for p in pods))


def test_pod_larger_than_every_flavour_is_unservable() -> None:
    huge = pod("huge", 16_000, 64 * GI)
    ok = pod("ok", 500, GI)
    plan = plan_pods([huge, ok], T7, HALF)
    assert plan.unservable == ("default/huge",)
    assert [keys for _, keys in plan.nodes] == [("default/ok",)]
    assert plan_pods([huge], T7, HALF) == ScalePlan((), ("default/huge",))


def test_empty_pending_is_an_empty_plan() -> None:
    assert plan_pods([], T7, HALF) == ScalePlan()
    assert plan_aggregate(Resources(), T7, HALF) == ScalePlan()
    assert ScalePlan().cost_per_hour == 0.0


# ------------------------------------------------------------------------------------------- properties

flavour_st = st.builds(
    lambda i, c, m, s, p: Flavour(f"f{i}", Resources(c, m, s), p),
    st.integers(0, 10**6),
    st.integers(250, 16_000),
    st.integers(GI // 4, 64 * GI),
    st.integers(1, 12),
    st.floats(0.01, 2.0),
)
catalogue_st = st.lists(flavour_st, min_size=1, max_size=4, unique_by=lambda f: f.name)
pods_st = st.lists(
    st.tuples(st.integers(0, 20_000), st.integers(0, 80 * GI), st.integers(0, 1)),
    max_size=25,
).map(lambda rows: [Pod(f"p{i}", Resources(c, m, s)) for i, (c, m, s) in enumerate(rows)])
weights_st = st.builds(ScoreWeights, st.floats(0, 1), st.floats(0.01, 1))


@settings(max_examples=150, deadline=None)
@given(pods=pods_st, flavours=catalogue_st, weights=weights_st)
def test_plan_pods_is_a_valid_cover(pods: list[Pod], flavours: list[Flavour], weights: ScoreWeights) -> None:
    plan = plan_pods(pods, flavours, weights)
    assert_valid_plan(plan, pods, flavours)
    servable = [p for p in pods if p.key not in plan.unservable]
    lb = fluid_lower_bound_per_hour(demand_of(servable), flavours)
    assert lb <= plan.cost_per_hour * (1 + 1e-9) + 1e-12


@settings(max_examples=150, deadline=None)
@given(flavours=catalogue_st, data=st.data())
def test_plan_pods_no_worse_than_one_node_when_everything_fits_one(
    flavours: list[Flavour], data: st.DataObject
) -> None:
    """If the pods' total fits one node of f, first-fit packs them all there, so the small-tail rule has
    a one-node candidate costing the cheapest such price. Pods are drawn to fit a chosen flavour (not
    filtered), each at most its 1/n share in every dimension."""
    host = data.draw(st.sampled_from(flavours))
    cap = host.capacity
    n = data.draw(st.integers(1, min(cap.pods, 20)))
    pods = [
        Pod(
            f"p{i}",
            Resources(
                data.draw(st.integers(0, cap.cpu_milli // n)), data.draw(st.integers(0, cap.memory_bytes // n)), 1
            ),
        )
        for i in range(n)
    ]
    total = demand_of(pods)
    fitting = [f.price_per_hour for f in flavours if total.fits_in(f.capacity)]
    assert host.price_per_hour in fitting
    assert plan_pods(pods, flavours, HALF).cost_per_hour <= min(fitting) + 1e-12


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 300),
    cpu=st.integers(1, 4000),
    mem=st.integers(MI, 16 * GI),
    flavours=catalogue_st,
    weights=weights_st,
)
def test_plan_pods_no_worse_than_best_homogeneous_ffd(
    n: int, cpu: int, mem: int, flavours: list[Flavour], weights: ScoreWeights
) -> None:
    """Identical replicas: FFD into flavour f uses exactly ceil(n / k_f) nodes, k_f = pods per node.
    plan_pods evaluates every single-flavour FFD, so it never costs more than the best of them."""
    pods = [pod(f"r{i}", cpu, mem) for i in range(n)]
    per_node = {
        f.name: min(f.capacity.cpu_milli // cpu, f.capacity.memory_bytes // mem, f.capacity.pods) for f in flavours
    }
    homog = [math.ceil(n / per_node[f.name]) * f.price_per_hour for f in flavours if per_node[f.name] > 0]
    plan = plan_pods(pods, flavours, weights)
    assert_valid_plan(plan, pods, flavours)
    if not homog:
        assert len(plan.unservable) == n
    else:
        assert plan.cost_per_hour <= min(homog) * (1 + 1e-12)


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 400),
    k_cpu=st.integers(1, 16),
    k_mem=st.integers(1, 16),
    unit_cpu=st.integers(1, 500),
    unit_mem=st.integers(MI, 512 * MI),
    price=st.floats(0.01, 1.0),
)
def test_tiny_divisible_pods_aggregate_equals_pods(
    n: int, k_cpu: int, k_mem: int, unit_cpu: int, unit_mem: int, price: float
) -> None:
    """One flavour, identical pods dividing its capacity, slots not binding: no fragmentation exists, so
    GA's volume count ceil(max(n/k_cpu, n/k_mem)) is exactly the pod packing's ceil(n / min(k_cpu, k_mem))."""
    f = Flavour("only", Resources(unit_cpu * k_cpu, unit_mem * k_mem, 1000), price)
    pods = [pod(f"r{i}", unit_cpu, unit_mem) for i in range(n)]
    by_pods = plan_pods(pods, [f], HALF)
    by_volume = plan_aggregate(demand_of(pods), [f], HALF)
    assert len(by_pods.nodes) == len(by_volume.nodes) == math.ceil(n / min(k_cpu, k_mem))


@settings(max_examples=100, deadline=None)
@given(cpu=st.integers(0, 100_000), mem=st.integers(0, 400 * GI), flavours=catalogue_st, weights=weights_st)
def test_plan_aggregate_covers_volume(cpu: int, mem: int, flavours: list[Flavour], weights: ScoreWeights) -> None:
    """Alg. 3 stops only when both volumes are covered; and dropping its last node uncovers one."""
    plan = plan_aggregate(Resources(cpu, mem), flavours, weights)
    got_cpu = sum(f.capacity.cpu_milli for f, _ in plan.nodes)
    got_mem = sum(f.capacity.memory_bytes for f, _ in plan.nodes)
    assert got_cpu >= cpu and got_mem >= mem
    if plan.nodes:
        last = plan.nodes[-1][0].capacity
        assert got_cpu - last.cpu_milli < cpu or got_mem - last.memory_bytes < mem
    assert fluid_lower_bound_per_hour(Resources(cpu, mem), flavours) <= plan.cost_per_hour * (1 + 1e-9) + 1e-12


# -------------------------------------------------------------------------------------------- fluid LB


@settings(max_examples=200, deadline=None)
@given(cpu=st.integers(0, 200_000), mem=st.integers(0, 800 * GI), flavours=catalogue_st)
def test_fluid_bound_matches_linprog(cpu: int, mem: int, flavours: list[Flavour]) -> None:
    """The closed form (vertex enumeration) equals scipy's LP optimum."""
    got = fluid_lower_bound_per_hour(Resources(cpu, mem), flavours)
    res = linprog(
        c=[f.price_per_hour for f in flavours],
        A_ub=[[-f.capacity.cpu_milli / 1000 for f in flavours], [-f.capacity.memory_bytes / GI for f in flavours]],
        b_ub=[-cpu / 1000, -mem / GI],
        bounds=[(0, None)] * len(flavours),
        method="highs",
    )
    assert res.status == 0
    assert got == pytest.approx(res.fun, rel=1e-7, abs=1e-6)  # HiGHS feasibility tolerance is ~1e-7


@settings(max_examples=200, deadline=None)
@given(
    cpu=st.integers(0, 40_000),
    mem=st.integers(0, 160 * GI),
    flavours=catalogue_st,
    counts=st.lists(st.integers(0, 12), min_size=4, max_size=4),
)
def test_fluid_bound_below_any_integer_cover(cpu: int, mem: int, flavours: list[Flavour], counts: list[int]) -> None:
    mix = list(zip(flavours, counts, strict=False))
    assume(sum(f.capacity.cpu_milli * k for f, k in mix) >= cpu)
    assume(sum(f.capacity.memory_bytes * k for f, k in mix) >= mem)
    cost = math.fsum(f.price_per_hour * k for f, k in mix)
    assert fluid_lower_bound_per_hour(Resources(cpu, mem), flavours) <= cost * (1 + 1e-12) + 1e-15


@settings(max_examples=150, deadline=None)
@given(cpu=st.integers(0, 100_000), mem=st.integers(0, 400 * GI), others=catalogue_st, discount=st.floats(0.1, 1.0))
def test_fluid_bound_single_flavour_when_dominant(cpu: int, mem: int, others: list[Flavour], discount: float) -> None:
    """A flavour cheapest per core AND per byte is optimal alone (dual: y = its per-unit price on the
    binding dimension), so the bound is its price times max(C/cpu, M/mem)."""
    cap = Resources(4000, 16 * GI, 110)
    per_cpu = min(f.price_per_hour / f.capacity.cpu_milli for f in others) * cap.cpu_milli
    per_mem = min(f.price_per_hour / f.capacity.memory_bytes for f in others) * cap.memory_bytes
    best = Flavour("dominant", cap, min(per_cpu, per_mem) * discount)
    expect = best.price_per_hour * max(cpu / cap.cpu_milli, mem / cap.memory_bytes)
    assert fluid_lower_bound_per_hour(Resources(cpu, mem), [*others, best]) == pytest.approx(expect, rel=1e-9)


def test_fluid_bound_mixes_two_flavours() -> None:
    """cpu-cheap A (4 cores/4 GiB, $1) + mem-cheap B (1 core/16 GiB, $1): for 4 cores + 16 GiB the pair
    vertex x_A = 12/15, x_B = 12/15 costs 1.6 < any single flavour (A alone: 4, B alone: 4)."""
    a = Flavour("a", Resources(4000, 4 * GI, 10), 1.0)
    b = Flavour("b", Resources(1000, 16 * GI, 10), 1.0)
    assert fluid_lower_bound_per_hour(Resources(4000, 16 * GI), [a, b]) == pytest.approx(1.6)
    assert fluid_lower_bound_per_hour(Resources(), [a, b]) == 0.0


# --------------------------------------------------------------------------------------------- 0-bin


def bnode(name: str, pods: tuple[Pod, ...], *, cpu: int = 4000, mem: int = 16 * GI, **kw: object) -> Node:
    return Node(name, Resources(cpu, mem, 110), group=NodeGroup.BATCH, pods=pods, **kw)  # type: ignore[arg-type]


def test_zero_bin_capacity_reading() -> None:
    """cycle 60 s at now=100: a node whose batch pods all end before 160 offers its whole allocatable
    (free + releasing); one pod ending at/after 160 puts the node in bin >= 1; a service pod on a bin-0
    node keeps its share; an empty batch node counts; a cordoned node does not."""
    short = batch("short", 1000, 2 * GI, runtime=120, started=10)  # 30 s left
    edge = batch("edge", 1000, 2 * GI, runtime=60, started=100)  # exactly one cycle left: bin 1
    svc = pod("svc", 500, GI)
    nodes = [
        bnode("a", (short,)),
        bnode("b", (batch("short2", 1000, GI, 120, 10), edge)),
        bnode("c", (batch("short3", 1000, GI, 70, 50), svc)),
        bnode("d", ()),
        bnode("e", (), unschedulable=True),
    ]
    got = zero_bin_capacity(nodes, now=100.0, cycle_seconds=60.0)
    assert got == Resources(4000 + 3500 + 4000, 16 * GI + 15 * GI + 16 * GI, 110 + 109 + 110)


def test_zero_bin_unknown_runtime_holds_resources() -> None:
    unknown = Pod("u", Resources.request(1000, GI), kind=WorkloadKind.BATCH, started_at=0.0)
    got = zero_bin_capacity([bnode("a", (unknown,))], now=0.0, cycle_seconds=60.0)
    assert got == Resources(3000, 15 * GI, 109)


def test_plan_batch_deducts_zero_bin_per_node() -> None:
    """Two bin-0 nodes with 1 core each releasing: two 1-core pods wait for them, a third is planned. The
    summed 0-bin capacity (2 cores, 2 GiB) would also 'cover' one 2-core pod, but no single node holds
    it, so Alg. 4's aggregate deduction would wrongly buy nothing for it."""
    nodes = [
        bnode("a", (batch("x", 1000, GI, 30),), cpu=1000, mem=GI),
        bnode("b", (batch("y", 1000, GI, 30),), cpu=1000, mem=GI),
    ]
    pending = [pod(f"q{i}", 1000, GI // 2) for i in range(3)]
    plan = plan_batch(pending, nodes, T7, HALF, now=0.0, cycle_seconds=60.0)
    planned = [k for _, ks in plan.nodes for k in ks]
    assert len(planned) == 1 and plan.unservable == ()
    wide = pod("wide", 2000, GI)
    plan = plan_batch([wide], nodes, T7, HALF, now=0.0, cycle_seconds=60.0)
    assert [k for _, ks in plan.nodes for k in ks] == ["default/wide"]
    assert Resources.request(2000, GI).fits_in(zero_bin_capacity(nodes, 0.0, 60.0))


@settings(max_examples=100, deadline=None)
@given(
    pods=pods_st,
    rts=st.lists(st.floats(0, 300), min_size=0, max_size=5),
    cycle=st.floats(1, 200),
)
def test_plan_batch_partitions_pending(pods: list[Pod], rts: list[float], cycle: float) -> None:
    nodes = [bnode(f"n{i}", (batch(f"b{i}", 500, GI, rt),)) for i, rt in enumerate(rts)]
    plan = plan_batch(pods, nodes, T7, HALF, now=0.0, cycle_seconds=cycle)
    planned = [k for _, ks in plan.nodes for k in ks] + list(plan.unservable)
    assert len(planned) == len(set(planned))
    absorbed = [p for p in pods if p.key not in set(planned)]
    assert demand_of(absorbed).fits_in(zero_bin_capacity(nodes, 0.0, cycle))
    if not any(rt < cycle for rt in rts):
        assert absorbed == []


# ------------------------------------------------------------------------------------------ ledger


def prov(name: str, flavour: str, at: float, *pods: str) -> Provisioning:
    return Provisioning(name, BY_NAME[flavour], at, pods)


def test_ledger_covers_by_key_and_by_room() -> None:
    a = pod("a", 3000, 8 * GI)
    b = pod("b", 500, GI)  # not named, fits the room left on n1 (m1.large: 4 cores, 16 GiB)
    c = pod("c", 2000, GI)  # not named, does not fit what is left after a and b
    ledger = ProvisioningLedger().add(prov("n1", "m1.large", 0.0, a.key))
    assert ledger.uncovered([c, a, b]) == [c]
    # a went elsewhere (no longer pending): its space is free again, c fits now
    assert ledger.uncovered([c, b]) == []


@settings(max_examples=100, deadline=None)
@given(pods=pods_st)
def test_ledger_pods_are_not_planned_again(pods: list[Pod]) -> None:
    """Plan, record every planned node with its pods, then re-plan the same pending set: nothing new."""
    ledger = ProvisioningLedger()
    plan = plan_pods(ledger.uncovered(pods), T7, HALF)
    for i, (flavour, keys) in enumerate(plan.nodes):
        ledger = ledger.add(Provisioning(f"new-{i}", flavour, 0.0, keys))
    unservable = set(plan.unservable)
    again = ledger.uncovered(pods)
    assert {p.key for p in again} == unservable
    assert plan_pods(again, T7, HALF).nodes == ()


@settings(max_examples=200, deadline=None)
@given(
    times=st.lists(st.floats(-1e6, 1e6), max_size=10),
    now=st.floats(-1e6, 2e6),
    timeout=st.floats(0.001, 1e6),
)
def test_expire_returns_exactly_the_timed_out(times: list[float], now: float, timeout: float) -> None:
    ledger = ProvisioningLedger()
    for i, t in enumerate(times):
        ledger = ledger.add(prov(f"n{i}", "m3.small", t, f"default/p{i}"))
    kept, expired = ledger.expire(now, timeout)
    assert {e.node_name for e in expired} == {f"n{i}" for i, t in enumerate(times) if now - t > timeout}
    assert {e.node_name for e in kept.entries} | {e.node_name for e in expired} == {e.node_name for e in ledger.entries}
    assert not {e.node_name for e in kept.entries} & {e.node_name for e in expired}


def test_arrived_forgets_node_and_unknown_is_noop() -> None:
    p = pod("p", 100, MI)
    ledger = ProvisioningLedger().add(prov("n1", "t3.xsmall", 0.0, p.key))
    assert ledger.uncovered([p]) == []
    after = ledger.arrived("n1")
    assert after.entries == () and after.uncovered([p]) == [p]
    assert ledger.arrived("someone-else") == ledger


def test_ledger_bad_inputs() -> None:
    ledger = ProvisioningLedger().add(prov("n1", "t3.xsmall", 0.0, "default/p"))
    with pytest.raises(InvalidInputError, match="already tracks"):
        ledger.add(prov("n1", "t3.xsmall", 1.0))
    with pytest.raises(InvalidInputError, match="bound to both"):
        ledger.add(prov("n2", "t3.xsmall", 1.0, "default/p"))
    with pytest.raises(InvalidInputError):
        prov("", "t3.xsmall", 0.0)
    with pytest.raises(InvalidInputError):
        prov("n3", "t3.xsmall", math.nan)
    with pytest.raises(InvalidInputError):
        ledger.expire(0.0, -1.0)


# ---------------------------------------------------------------------------------------- forecast


def test_forecast_counts_releases_before_lag() -> None:
    """Capacity 4 cores; running: 1 core ending in 30 s, 1 core ending in 300 s, a 1-core service.
    Pending 2 cores. At lag 60: still running 2 cores (long + service) -> 2 + 2 - 4 = 0 short;
    at lag 10 nothing has released yet -> 1 core short."""
    running = [batch("soon", 1000, GI, 40, 0), batch("late", 1000, GI, 310, 0), pod("svc", 1000, GI)]
    cap = Resources(4000, 16 * GI, 110)
    d = Resources(2000, 2 * GI, 2)
    assert forecast_shortage(d, running, cap, now=10.0, lag_seconds=60.0) == Resources()
    assert forecast_shortage(d, running, cap, now=10.0, lag_seconds=10.0) == Resources(1000, 0, 0)


running_st = st.lists(
    st.tuples(st.integers(0, 4000), st.integers(0, 8 * GI), st.floats(0, 1000), st.booleans()), max_size=8
).map(
    lambda rows: [
        batch(f"r{i}", c, m, rt) if is_batch else pod(f"r{i}", c, m) for i, (c, m, rt, is_batch) in enumerate(rows)
    ]
)
res_st = st.builds(Resources, st.integers(0, 50_000), st.integers(0, 100 * GI), st.integers(0, 200))


@settings(max_examples=200, deadline=None)
@given(d=res_st, extra=res_st, running=running_st, cap=res_st, lag=st.floats(0, 2000), lag2=st.floats(0, 2000))
def test_forecast_properties(
    d: Resources, extra: Resources, running: list[Pod], cap: Resources, lag: float, lag2: float
) -> None:
    short = forecast_shortage(d, running, cap, 0.0, lag)
    assert short.is_nonnegative()
    # monotone in demand
    bigger = forecast_shortage(d + extra, running, cap, 0.0, lag)
    assert short.fits_in(bigger)
    # a longer lag only lets more pods release
    lo, hi = sorted((lag, lag2))
    assert forecast_shortage(d, running, cap, 0.0, hi).fits_in(forecast_shortage(d, running, cap, 0.0, lo))
    # zero when capacity suffices even if nothing releases
    everything = d + Resources.total(p.requests for p in running)
    assert forecast_shortage(d, running, everything + extra, 0.0, lag) == Resources()


def test_measured_lag() -> None:
    assert measured_lag([], default=120.0) == 120.0
    samples = [float(s) for s in range(1, 11)]  # 1..10: nearest-rank p90 = 9
    assert measured_lag(samples, default=0.0) == 9.0
    assert measured_lag(samples, default=0.0, quantile=0.5) == 5.0
    assert measured_lag([1000.0, *samples], default=0.0, window=10) == 9.0  # old outlier out of window
    assert measured_lag([157.0], default=0.0) == 157.0


# -------------------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    "call",
    [
        lambda: Flavour("free", Resources(1000, GI, 10), 0.0),
        lambda: validate_catalogue([]),
        lambda: validate_catalogue([T7[0], Flavour("t3.xsmall", Resources(2000, GI, 10), 1.0)]),
        lambda: plan_pods([], [], HALF),
        lambda: plan_aggregate(Resources(1, 1), [T7[0], T7[0]], HALF),
        lambda: ScoreWeights(math.nan, 0.5),
        lambda: ScoreWeights(0.5, math.inf),
        lambda: ScoreWeights(-0.1, 0.5),
        lambda: ScoreWeights(0.0, 0.0),
        lambda: measured_lag([], default=-1.0),
        lambda: measured_lag([-5.0], default=1.0),
        lambda: measured_lag([math.nan], default=1.0),
        lambda: measured_lag([1.0], default=1.0, quantile=0.0),
        lambda: forecast_shortage(Resources(), [], Resources(), 0.0, -1.0),
        lambda: forecast_shortage(Resources(), [], Resources(), math.nan, 1.0),
        lambda: forecast_shortage(Resources(-1), [], Resources(), 0.0, 1.0),
        lambda: plan_pods([pod("x", 1, 1), pod("x", 2, 2)], T7, HALF),
        lambda: plan_aggregate(Resources(-5, 0), T7, HALF),
        lambda: zero_bin_capacity([], 0.0, 0.0),
        lambda: zero_bin_capacity([Node("s", Resources(1, 1, 1), group=NodeGroup.SERVICE)], 0.0, 60.0),
        lambda: plan_batch([], [], T7, HALF, math.inf, 60.0),
        lambda: fluid_lower_bound_per_hour(Resources(1, 1), []),
        lambda: cost_efficiency(T7[0], Resources(-1, 0), HALF),
    ],
)
def test_bad_inputs_raise(call: object) -> None:
    with pytest.raises(InvalidInputError):
        call()  # type: ignore[operator]
