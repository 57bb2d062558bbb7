"""Tests of extender.core.qos against paper 002 (da Silva et al. 2020) §3, §4.1.2, §5.2."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from extender.core.model import DEFAULT_CLASSES, InvalidInputError, Node, Pod, Resources, ServiceClass
from extender.core.qos import (
    Feasibility,
    Instance,
    QosPolicy,
    availability,
    feasibility,
    gini,
    instance_q,
    may_preempt,
    narrow_victims,
    penalty_fraction,
    preemption_cost,
    preemption_overhead,
    priority_feasibility,
    priority_queue_order,
    q_metric,
    queue_order,
    rank_hosts,
    recoverability,
    request_penalty,
    time_to_violate,
)

GOLD, SILVER, BRONZE = DEFAULT_CLASSES["gold"], DEFAULT_CLASSES["silver"], DEFAULT_CLASSES["bronze"]
PAPER = QosPolicy()  # alpha 2 s, margins 10 s, no anti-thrashing: the paper's configuration
CLASS_NAMES = ("gold", "silver", "bronze")


def pod(name: str, cls: str = "bronze", cpu: int = 1000, node: str | None = None, priority: int = 0) -> Pod:
    return Pod(
        name,
        Resources.request(cpu_milli=cpu, memory_bytes=0, pods=0),
        class_name=cls,
        node_name=node,
        priority=priority,
        started_at=None if node is None else 0.0,
    )


def inst(
    name: str,
    cls: str = "bronze",
    e: float = 0.0,
    p: float = 0.0,
    cpu: int = 1000,
    node: str | None = None,
    n: int = 0,
    overhead: float = 0.0,
    run: float = 1e9,
) -> Instance:
    return Instance(pod(name, cls, cpu, node), e, p, n, overhead, run if node else 0.0)


def make_node(name: str, cpu: int, pods: tuple[Pod, ...] = ()) -> Node:
    return Node(name, Resources(cpu_milli=cpu, memory_bytes=0, pods=0), pods=pods)


# -------------------------------------------------------------------------------- paper's worked example


def test_paper_j_k_example() -> None:
    """§3.2: sigma 0.9; j ran 58 of 60 min -> may wait ~4.4 min; k ran 10 of 10 min -> ~1.1 min."""
    minute = 60.0
    assert availability(58 * minute, 2 * minute) == pytest.approx(0.9667, abs=1e-4)
    assert availability(10 * minute, 0.0) == 1.0
    assert time_to_violate(58 * minute, 2 * minute, 0.9) / minute == pytest.approx(4.44, abs=0.01)
    assert time_to_violate(10 * minute, 0.0, 0.9) / minute == pytest.approx(1.11, abs=0.01)
    # "after about 1.1 min in the pending queue, k would have availability 10/11.1 = 90.09 %"
    assert availability(10 * minute, 1.1 * minute) == pytest.approx(0.9009, abs=1e-4)
    # Q subtracts alpha (Eq. 4)
    assert q_metric(58 * minute, 2 * minute, 0.9, 2.0) == pytest.approx(58 * minute / 0.9 - 60 * minute - 2)


def test_paper_example_preempts_j_not_k() -> None:
    """The point of the example: preempt the one with the larger TTV (j), although its availability is lower."""
    j = inst("j", "silver", e=58 * 60, p=2 * 60, node="h")
    k = inst("k", "silver", e=10 * 60, p=0, node="h")
    newcomer = inst("new", "silver", e=0, p=0)
    node = make_node("h", 2000, (j.pod, k.pod))
    res = feasibility(newcomer, node, {"default/j": j, "default/k": k}, PAPER, random.Random(0))
    assert res.feasible
    assert res.victims == ("default/j",)


# ----------------------------------------------------------------------------------------- QoS metrics

times = st.floats(min_value=0.0, max_value=1e7, allow_nan=False, allow_infinity=False)
slos = st.floats(min_value=0.01, max_value=1.0, allow_nan=False)


@given(times, times, slos)
def test_ttv_and_recoverability_signs(e: float, p: float, slo: float) -> None:
    a = availability(e, p)
    assert 0.0 <= a <= 1.0
    v = time_to_violate(e, p, slo)
    r = recoverability(e, p, slo)
    assert v >= 0.0 >= r
    assert v == 0.0 or r == 0.0
    assert v + r == pytest.approx(e / slo - (e + p), rel=1e-9, abs=1e-6)
    assume(e + p > 1e-3 and abs(a - slo) > 1e-9)
    if a > slo:
        assert v > 0.0 and r == 0.0
    else:
        assert r < 0.0 and v == 0.0


@given(times, times, slos, st.floats(min_value=0.0, max_value=100.0))
def test_q_is_ttv_or_recoverability_minus_alpha(e: float, p: float, slo: float, alpha: float) -> None:
    q = q_metric(e, p, slo, alpha)
    if e + p == 0:
        assert q == 0.0
    elif availability(e, p) >= slo:
        assert q == pytest.approx(time_to_violate(e, p, slo) - alpha, rel=1e-9, abs=1e-6)
    else:
        assert q == pytest.approx(recoverability(e, p, slo) - alpha, rel=1e-9, abs=1e-6)


def test_q_monotonic_in_running_and_pending() -> None:
    """Q grows while running and shrinks while pending (§3.2: unlike EDF)."""
    assert q_metric(101.0, 10.0, 0.9, 2.0) > q_metric(100.0, 10.0, 0.9, 2.0)
    assert q_metric(100.0, 11.0, 0.9, 2.0) < q_metric(100.0, 10.0, 0.9, 2.0)
    # gold (sigma = 1): Q = -p - alpha whatever e
    assert q_metric(1000.0, 5.0, 1.0, 2.0) == pytest.approx(-7.0)


def test_brand_new_and_unadmitted_have_q_zero() -> None:
    assert q_metric(0.0, 0.0, 0.5, 2.0) == 0.0
    assert instance_q(inst("a", "gold"), PAPER) == 0.0
    unadmitted = Instance(pod("b", "silver"), 100.0, 500.0, admitted=False)
    assert instance_q(unadmitted, PAPER) == 0.0
    assert instance_q(Instance(pod("b", "silver"), 100.0, 500.0), PAPER) < 0.0


def test_preemption_overhead_eq8() -> None:
    assert preemption_overhead(inst("a", e=100.0, n=2, overhead=5.0)) == pytest.approx(0.05)
    assert preemption_overhead(inst("a", e=100.0, n=0, overhead=5.0)) == 0.0  # no preemption: empty sum
    assert preemption_overhead(inst("a", e=0.0, n=1, overhead=3.0)) == math.inf
    assert preemption_overhead(inst("a", e=0.0, n=1, overhead=0.0)) == 0.0


# ------------------------------------------------------------------------------------------- queue order


@st.composite
def instances(draw: st.DrawFn, name: str, node: str | None = None) -> Instance:
    cls = draw(st.sampled_from(CLASS_NAMES))
    e = draw(st.floats(min_value=0.0, max_value=500.0))
    p = draw(st.floats(min_value=0.0, max_value=500.0))
    cpu = draw(st.integers(min_value=1, max_value=4)) * 500
    n = draw(st.integers(min_value=0, max_value=3))
    overhead = draw(st.floats(min_value=0.0, max_value=30.0)) if n else 0.0
    run = draw(st.floats(min_value=0.0, max_value=100.0)) if node else 0.0
    return Instance(pod(name, cls, cpu, node), e, p, n, overhead, run)


@st.composite
def pending_queues(draw: st.DrawFn) -> list[Instance]:
    size = draw(st.integers(min_value=0, max_value=8))
    # coarse values so that ties in Q happen often
    out = []
    for i in range(size):
        cls = draw(st.sampled_from(CLASS_NAMES))
        e = float(draw(st.integers(0, 3)) * 10)
        p = float(draw(st.integers(0, 3)) * 10)
        out.append(Instance(pod(f"p{draw(st.integers(0, 3))}x{i}", cls), e, p))
    return out


@given(pending_queues(), st.randoms(use_true_random=False))
def test_queue_order_is_total_and_input_order_independent(queue: list[Instance], rnd: random.Random) -> None:
    ordered = queue_order(queue, PAPER)
    shuffled = list(queue)
    rnd.shuffle(shuffled)
    assert [i.pod.key for i in queue_order(shuffled, PAPER)] == [i.pod.key for i in ordered]
    assert sorted(i.pod.key for i in ordered) == sorted(i.pod.key for i in queue)
    keys = [(instance_q(i, PAPER), PAPER.cls(i.pod.class_name).importance, i.pod.key) for i in ordered]
    # strictly increasing: antisymmetric (no two distinct instances compare equal) and transitive
    assert all(a < b for a, b in itertools.pairwise(keys))


def test_queue_order_ties_by_importance_then_key() -> None:
    a = inst("a", "bronze")
    b = inst("b", "gold")
    c = inst("c", "gold")
    urgent = inst("z", "bronze", e=0.0, p=100.0)
    assert [i.pod.name for i in queue_order([a, c, b, urgent], PAPER)] == ["z", "b", "c", "a"]


def test_queue_order_rejects_duplicate_keys() -> None:
    with pytest.raises(InvalidInputError):
        queue_order([inst("a"), inst("a", e=5.0)], PAPER)


# ------------------------------------------------------------------------------------------ may_preempt

policies = st.builds(
    QosPolicy,
    alpha_seconds=st.sampled_from([0.0, 2.0]),
    min_run_quantum_seconds=st.sampled_from([0.0, 30.0]),
    q_hysteresis_seconds=st.sampled_from([0.0, 5.0]),
    overhead_cap=st.booleans(),
    relax_by_importance=st.booleans(),
)


@given(instances("v", node="h"), instances("j"), policies)
def test_may_preempt_respects_paper_rules(victim: Instance, pending: Instance, policy: QosPolicy) -> None:
    allowed = may_preempt(victim, pending, policy)
    q_v, q_p = instance_q(victim, policy), instance_q(pending, policy)
    vc, pc = policy.cls(victim.pod.class_name), policy.cls(pending.pod.class_name)
    both_below = q_v < vc.safety_margin_seconds and q_p < pc.safety_margin_seconds
    relaxation_i = policy.relax_by_importance and both_below and pc.importance < vc.importance
    if not allowed:
        return
    # never a victim with Q <= Q_pending (+ hysteresis between peers of one class), except via relaxation (i)
    h = policy.q_hysteresis_seconds if vc.name == pc.name else 0.0
    if q_v <= q_p + h:
        assert relaxation_i
    # never below the safety margin except via the relaxations
    if q_v < vc.safety_margin_seconds:
        assert policy.relax_by_importance and both_below and pc.importance <= vc.importance
    # overhead cap on same-class preemption
    if policy.overhead_cap and vc.name == pc.name:
        assert preemption_overhead(victim) <= vc.overhead_cap * (1 + 1e-9) + 1e-12
    # quantum: only a more important class that is violating (or has no slack) may preempt a young run
    urgent = pc.importance < vc.importance and (pc.slo >= 1.0 or q_p + policy.alpha_seconds < 0)
    assert victim.current_run_seconds >= policy.min_run_quantum_seconds or urgent


@given(instances("v", node="h"), instances("j"))
def test_may_preempt_grants_base_rule(victim: Instance, pending: Instance) -> None:
    """The converse, for the paper's configuration: the base rule is sufficient when no cap applies."""
    q_v, q_p = instance_q(victim, PAPER), instance_q(pending, PAPER)
    assume(victim.pod.class_name != pending.pod.class_name)
    if q_v > q_p and q_v >= PAPER.cls(victim.pod.class_name).safety_margin_seconds:
        assert may_preempt(victim, pending, PAPER)


def test_base_rule_examples() -> None:
    far = inst("v", "bronze", e=1000.0, p=0.0, node="h")  # Q = 998
    near = inst("w", "bronze", e=4.0, p=0.0, node="h")  # Q = 2, below margin 10
    newcomer = inst("j", "silver")  # Q = 0
    assert may_preempt(far, newcomer, PAPER)
    assert not may_preempt(near, newcomer, PAPER.__class__(relax_by_importance=False))
    # a victim can never preempt itself
    assert not may_preempt(far, far, PAPER)


def test_relaxation_i_more_important_class() -> None:
    victim = inst("v", "silver", e=4.0, p=0.0, node="h")  # Q = 4/0.9 - 4 - 2 = -1.56 < 10
    pending = inst("j", "gold", e=100.0, p=1.0)  # Q = -3 < 10, gold more important
    assert instance_q(victim, PAPER) > instance_q(pending, PAPER)
    assert may_preempt(victim, pending, PAPER)
    assert not may_preempt(victim, pending, QosPolicy(relax_by_importance=False))
    # and the lower-Q case: more important pending wins even with higher Q
    deep = inst("d", "silver", e=0.0, p=50.0, node="h")  # Q = -52
    assert may_preempt(deep, pending, PAPER)
    # but the less important class cannot use relaxation (i) against a more important one
    assert not may_preempt(inst("g", "gold", e=10.0, p=0.0, node="h"), inst("b", "bronze", p=50.0), PAPER)


def test_relaxation_ii_equal_importance_needs_smaller_q() -> None:
    victim = inst("v", "bronze", e=5.0, p=0.0, node="h")  # Q = 3
    worse = inst("j", "bronze", e=0.0, p=10.0)  # Q = -12
    better = inst("k", "bronze", e=4.5, p=0.0)  # Q = 2.5 : still smaller, allowed
    best = inst("m", "bronze", e=6.0, p=0.0)  # Q = 4 : larger than victim
    assert may_preempt(victim, worse, PAPER)
    assert may_preempt(victim, better, PAPER)
    assert not may_preempt(victim, best, PAPER)
    # pending above its margin: the relaxations do not apply
    assert not may_preempt(victim, inst("x", "gold", e=1.0, p=0.0, n=0), QosPolicy(relax_by_importance=False))


def test_overhead_cap_blocks_same_class_only() -> None:
    # silver cap 0.1: overhead 40 s over 200 s of run = 0.2 > 0.1
    victim = inst("v", "silver", e=200.0, p=0.0, node="h", n=2, overhead=40.0)
    same = inst("j", "silver", e=0.0, p=20.0)
    other = inst("k", "bronze", e=0.0, p=20.0)
    assert instance_q(victim, PAPER) > 10.0
    assert not may_preempt(victim, same, PAPER)
    assert may_preempt(victim, same, QosPolicy(overhead_cap=False))
    assert may_preempt(victim, other, PAPER)
    # exactly at the cap is not "surpassing" it
    at_cap = inst("w", "silver", e=200.0, p=0.0, node="h", n=1, overhead=20.0)
    assert may_preempt(at_cap, same, PAPER)


def test_quantum_blocks_young_runs() -> None:
    policy = QosPolicy(min_run_quantum_seconds=30.0)
    young = inst("v", "bronze", e=1000.0, node="h", run=29.0)
    old = inst("w", "bronze", e=1000.0, node="h", run=30.0)
    bronze_waiting = inst("j", "bronze", e=100.0, p=500.0)
    assert may_preempt(young, bronze_waiting, PAPER)
    assert not may_preempt(young, bronze_waiting, policy)
    assert may_preempt(old, bronze_waiting, policy)
    # a more important class is not held back by a less important victim's quantum when it is violating
    # its SLO (or promises 100 %), but one with slack left waits like everybody else
    gold_newcomer = inst("k", "gold")
    assert may_preempt(young, gold_newcomer, policy)
    silver_violating = inst("s", "silver", e=100.0, p=100.0)
    silver_comfortable = inst("c", "silver", e=900.0, p=10.0)
    assert may_preempt(young, silver_violating, policy)
    assert not may_preempt(young, silver_comfortable, policy)


def test_hysteresis_blocks_near_ties() -> None:
    policy = QosPolicy(q_hysteresis_seconds=5.0)
    victim = inst("v", "bronze", e=30.0, p=0.0, node="h")  # Q = 28
    close = inst("j", "bronze", e=26.0, p=0.0)  # Q = 24
    far = inst("k", "bronze", e=20.0, p=0.0)  # Q = 18
    assert may_preempt(victim, close, PAPER)
    assert not may_preempt(victim, close, policy)
    assert may_preempt(victim, far, policy)
    # across classes the hysteresis does not apply: moving capacity to another class is not churn
    silver_close = inst("s", "silver", e=0.0, p=0.0)
    silver_close = Instance(silver_close.pod, 243.0, 0.0)  # Q = 243/0.9 - 243 - 2 = 25
    assert instance_q(silver_close, policy) == pytest.approx(25.0)
    assert may_preempt(victim, silver_close, policy)


# ------------------------------------------------------------------------------------------ feasibility


@st.composite
def node_scenarios(draw: st.DrawFn) -> tuple[Instance, Node, dict[str, Instance]]:
    count = draw(st.integers(min_value=0, max_value=6))
    running: dict[str, Instance] = {}
    pods: list[Pod] = []
    for i in range(count):
        r = draw(instances(f"r{i}", node="h"))
        pods.append(r.pod)
        if draw(st.booleans()) or i == 0:
            running[r.pod.key] = r
    capacity = sum(p.requests.cpu_milli for p in pods) + draw(st.integers(0, 2)) * 500
    node = Node("h", Resources(cpu_milli=capacity), pods=tuple(pods))
    pending = draw(instances("pending"))
    return pending, node, running


@given(node_scenarios(), policies, st.integers(0, 1000))
@settings(max_examples=300)
def test_feasibility_never_overcommits(
    scenario: tuple[Instance, Node, dict[str, Instance]], policy: QosPolicy, seed: int
) -> None:
    pending, node, running = scenario
    res = feasibility(pending, node, running, policy, random.Random(seed))
    assert res.node == "h"
    pod_keys = {p.key for p in node.pods}
    if not res.feasible:
        assert res.victims == () and res.reason
        # nothing the rules allow would have freed enough
        eligible = [running[k] for k in running if may_preempt(running[k], pending, policy)]
        freed = node.free + Resources.total(i.pod.requests for i in eligible)
        assert not pending.pod.requests.fits_in(freed)
        return
    assert set(res.victims) <= pod_keys and set(res.victims) <= set(running)
    assert len(set(res.victims)) == len(res.victims)
    after = node.without_pods(res.victims)
    assert pending.pod.requests.fits_in(after.free)
    assert all(may_preempt(running[k], pending, policy) for k in res.victims)
    if res.victims:
        assert res.cost == preemption_cost([running[k] for k in res.victims], policy)
        # minimal prefix: without the last victim it would not have fit
        assert not pending.pod.requests.fits_in(node.without_pods(res.victims[:-1]).free)
    else:
        assert res.cost == () and pending.pod.requests.fits_in(node.free)


@given(node_scenarios(), st.integers(0, 1000), st.randoms(use_true_random=False))
def test_feasibility_independent_of_pod_order(
    scenario: tuple[Instance, Node, dict[str, Instance]], seed: int, rnd: random.Random
) -> None:
    pending, node, running = scenario
    pods = list(node.pods)
    rnd.shuffle(pods)
    shuffled = Node(node.name, node.allocatable, pods=tuple(pods))
    a = feasibility(pending, node, running, PAPER, random.Random(seed))
    b = feasibility(pending, shuffled, running, PAPER, random.Random(seed))
    assert a == b


def test_feasibility_largest_q_first_and_skips_ineligible() -> None:
    gold = inst("g", "gold", e=500.0, p=0.0, node="h")  # Q = -2: never eligible for bronze
    b1 = inst("b1", "bronze", e=200.0, p=0.0, node="h")  # Q = 198
    b2 = inst("b2", "bronze", e=100.0, p=0.0, node="h")  # Q = 98
    running = {i.pod.key: i for i in (gold, b1, b2)}
    node = make_node("h", 3000, (gold.pod, b1.pod, b2.pod))
    res = feasibility(inst("j", "bronze", p=30.0), node, running, PAPER, random.Random(1))
    assert res.feasible and res.victims == ("default/b1",)
    big = inst("j2", "bronze", p=30.0, cpu=2000)
    res2 = feasibility(big, node, running, PAPER, random.Random(1))
    assert res2.victims == ("default/b1", "default/b2")
    huge = inst("j3", "bronze", p=30.0, cpu=3000)
    res3 = feasibility(huge, node, running, PAPER, random.Random(1))
    assert not res3.feasible and "cpu" in res3.reason
    # an ineligible instance with the LARGEST Q (protected by the quantum) is skipped, not a stop sign
    young = Instance(pod("y", "bronze", 1000, "h"), 1000.0, 0.0, current_run_seconds=5.0)  # Q = 998
    node4 = make_node("h", 4000, (young.pod, gold.pod, b1.pod, b2.pod))
    res4 = feasibility(
        inst("j", "bronze", p=30.0),
        node4,
        {**running, young.pod.key: young},
        QosPolicy(min_run_quantum_seconds=60.0),
        random.Random(1),
    )
    assert res4.feasible and res4.victims == ("default/b1",)


def test_feasibility_random_tie_break_uses_rng() -> None:
    twins = [inst(f"t{i}", "bronze", e=100.0, node="h") for i in range(6)]
    node = make_node("h", 6000, tuple(t.pod for t in twins))
    running = {t.pod.key: t for t in twins}
    chosen = {
        feasibility(inst("j", "bronze", p=5.0), node, running, PAPER, random.Random(s)).victims for s in range(40)
    }
    assert len(chosen) > 1
    assert all(len(v) == 1 for v in chosen)


def test_feasibility_unknown_pods_and_cordon() -> None:
    stranger = pod("s", "bronze", 1000, "h")
    node = make_node("h", 1000, (stranger,))
    res = feasibility(inst("j", "gold"), node, {}, PAPER, random.Random(0))
    assert not res.feasible
    cordoned = Node("c", Resources(cpu_milli=5000), unschedulable=True)
    assert not feasibility(inst("j", "gold"), cordoned, {}, PAPER, random.Random(0)).feasible


# -------------------------------------------------------------------------------------- cost and ranking


def test_preemption_cost_eq9() -> None:
    assert preemption_cost([], PAPER) == ()
    far = inst("a", "bronze", e=112.0, node="h")  # Q = 110, Q - phi = 100
    farther = inst("b", "bronze", e=1012.0, node="h")  # Q - phi = 1000
    cost_far = preemption_cost([far], PAPER)
    assert cost_far[:3] == (-math.inf, -math.inf, -math.inf)
    assert cost_far[3] == pytest.approx(0.01)
    assert len(cost_far) == 4
    assert preemption_cost([farther], PAPER) < cost_far  # farther from violating is cheaper
    assert preemption_cost([far, farther], PAPER)[-1] == pytest.approx(1 / 1100)
    gold = inst("g", "gold", e=100.0, node="h")  # Q = -2, Q - phi = -12
    bronze_violating = inst("v", "bronze", e=0.0, p=100.0, node="h")  # Q = -102
    c_gold = preemption_cost([gold], PAPER)
    c_bronze = preemption_cost([bronze_violating], PAPER)
    assert c_gold[0] == pytest.approx(-1 / 12)
    assert c_bronze[2] == pytest.approx(-1 / 112)
    assert c_bronze < c_gold  # any gold victim is costlier than bronze ones
    assert c_bronze > cost_far  # a violating victim is costlier than one far from its margin


def test_rank_hosts() -> None:
    free_low = Feasibility("a", True, (), (), "")
    free_high = Feasibility("b", True, (), (), "")
    cheap = Feasibility("c", True, ("x",), (-math.inf, -math.inf, -math.inf, 0.01), "")
    cheap2 = Feasibility("d", True, ("y",), (-math.inf, -math.inf, -math.inf, 0.01), "")
    dear = Feasibility("e", True, ("z",), (-0.5, -math.inf, -math.inf, 0.0), "")
    bad = Feasibility("f", False, (), (), "no room")
    scores = {"a": 10.0, "b": 20.0, "c": 1.0, "d": 5.0, "e": 100.0, "f": 1000.0}
    assert rank_hosts([cheap, free_low, free_high, bad], scores) == free_high
    assert rank_hosts([cheap, free_low, bad], {**scores, "a": 0.0}) == free_low  # no-preemption wins
    assert rank_hosts([dear, cheap, cheap2, bad], scores) == cheap2  # cost, then score
    assert rank_hosts([dear, cheap, bad], scores) == cheap  # lexicographic: gold slot first
    assert rank_hosts([cheap, cheap2], {"c": 1.0, "d": 1.0}) == cheap  # then node name
    assert rank_hosts([bad], scores) is None
    assert rank_hosts([], scores) is None
    with pytest.raises(InvalidInputError):
        rank_hosts([cheap, cheap], scores)
    with pytest.raises(InvalidInputError):
        rank_hosts([cheap], {"c": math.nan})


@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.booleans(),
            st.tuples(st.floats(-10, 0), st.floats(0, 10)),
            st.floats(0, 100),
        ),
        max_size=8,
    )
)
def test_rank_hosts_properties(raw: list[tuple[bool, bool, tuple[float, float], float]]) -> None:
    options = [
        Feasibility(f"n{i}", ok, ("v",) if pre else (), cost if pre else (), "")
        for i, (ok, pre, cost, _) in enumerate(raw)
    ]
    scores = {f"n{i}": s for i, (*_, s) in enumerate(raw)}
    best = rank_hosts(options, scores)
    feasible = [o for o in options if o.feasible]
    if not feasible:
        assert best is None
        return
    assert best is not None and best.feasible
    no_pre = [o for o in feasible if not o.victims]
    if no_pre:
        assert not best.victims
        assert scores[best.node] == max(scores[o.node] for o in no_pre)
    else:
        assert best.cost == min(o.cost for o in feasible)
    assert rank_hosts(list(reversed(options)), scores) == best


# ------------------------------------------------------------------------------------------ narrow_victims


@given(node_scenarios(), st.data())
def test_narrow_victims_subset_and_fits(
    scenario: tuple[Instance, Node, dict[str, Instance]], data: st.DataObject
) -> None:
    pending, node, running = scenario
    keys = [p.key for p in node.pods] + ["default/ghost", pending.pod.key]
    proposed = data.draw(st.lists(st.sampled_from(keys), max_size=8))
    out = narrow_victims(pending, node, proposed, running, PAPER)
    if out is None:
        eligible = {k for k in proposed if k in running and may_preempt(running[k], pending, PAPER)}
        freed = node.without_pods(eligible).free
        assert not pending.pod.requests.fits_in(freed)
        return
    assert set(out) <= set(proposed)
    assert len(set(out)) == len(out)
    assert all(may_preempt(running[k], pending, PAPER) for k in out)
    assert pending.pod.requests.fits_in(node.without_pods(out).free)


def test_narrow_victims_drops_protected() -> None:
    gold = inst("g", "gold", e=500.0, node="h")
    b1 = inst("b1", "bronze", e=200.0, node="h")
    b2 = inst("b2", "bronze", e=300.0, node="h")
    running = {i.pod.key: i for i in (gold, b1, b2)}
    node = make_node("h", 3000, (gold.pod, b1.pod, b2.pod))
    pending = inst("j", "bronze", p=30.0)
    assert narrow_victims(pending, node, ["default/g", "default/b1", "default/b2"], running, PAPER) == ("default/b2",)
    assert narrow_victims(pending, node, ["default/g"], running, PAPER) is None
    assert narrow_victims(pending, make_node("h", 4000, (gold.pod,)), ["default/g"], running, PAPER) == ()


# ----------------------------------------------------------------------------------- priority reference


@st.composite
def priority_scenarios(draw: st.DrawFn) -> tuple[Pod, Node]:
    prios = st.sampled_from([100, 500, 1000])
    count = draw(st.integers(0, 6))
    pods = tuple(pod(f"r{i}", cpu=draw(st.integers(1, 4)) * 500, node="h", priority=draw(prios)) for i in range(count))
    capacity = sum(p.requests.cpu_milli for p in pods) + draw(st.integers(0, 2)) * 500
    pending = pod("pending", cpu=draw(st.integers(1, 4)) * 500, priority=draw(prios))
    return pending, Node("h", Resources(cpu_milli=capacity), pods=pods)


@given(priority_scenarios())
@settings(max_examples=300)
def test_priority_never_preempts_equal_or_higher(scenario: tuple[Pod, Node]) -> None:
    pending, node = scenario
    res = priority_feasibility(pending, node, PAPER)
    by_key = {p.key: p for p in node.pods}
    lower_total = node.free + Resources.total(p.requests for p in node.pods if p.priority < pending.priority)
    if not res.feasible:
        assert not pending.requests.fits_in(lower_total)
        return
    assert all(by_key[k].priority < pending.priority for k in res.victims)
    assert pending.requests.fits_in(node.without_pods(res.victims).free)
    prios = [by_key[k].priority for k in res.victims]
    assert prios == sorted(prios)  # lowest first
    assert sum(res.cost) == len(res.victims)


def test_priority_reprieve_keeps_more_important() -> None:
    low = pod("low", cpu=1000, node="h", priority=100)
    mid = pod("mid", cpu=3000, node="h", priority=500)
    node = make_node("h", 4000, (low, mid))
    res = priority_feasibility(pod("new", cpu=2000, priority=1000), node, PAPER)
    # evicting only "low" frees 1000 < 2000, so "mid" must go, and then "low" is reprieved (Kubernetes)
    assert res.victims == ("default/mid",)
    assert res.cost == (0.0, 1.0, 0.0)
    same = priority_feasibility(pod("peer", cpu=2000, priority=500), node, PAPER)
    assert not same.feasible


def test_priority_queue_order() -> None:
    a, b, c = pod("a", priority=100), pod("b", priority=1000), pod("c", priority=100)
    assert [p.name for p in priority_queue_order([c, a, b])] == ["b", "c", "a"]  # FIFO among equals
    times = {"default/a": 1.0, "default/b": 5.0, "default/c": 0.5}
    assert [p.name for p in priority_queue_order([a, b, c], times)] == ["b", "c", "a"]
    with pytest.raises(InvalidInputError):
        priority_queue_order([a], {})


# -------------------------------------------------------------------------------------------- SLI reports


@given(st.floats(0.0, 1.0), st.integers(1, 50))
def test_gini_equal_values_is_zero(value: float, n: int) -> None:
    assert gini([value] * n) == pytest.approx(0.0, abs=1e-12)


@given(st.integers(1, 200))
def test_gini_one_has_everything(n: int) -> None:
    assert gini([0.0] * (n - 1) + [1.0]) == pytest.approx((n - 1) / n)


def test_gini_known_value_and_inputs() -> None:
    assert gini([1.0, 2.0, 3.0, 4.0]) == pytest.approx(0.25)
    assert gini([4.0, 1.0, 3.0, 2.0]) == pytest.approx(0.25)
    assert gini([]) == 0.0
    with pytest.raises(InvalidInputError):
        gini([0.5, -0.1])
    with pytest.raises(InvalidInputError):
        gini([math.nan])


@pytest.mark.parametrize(
    ("cls", "a", "credit"),
    [
        (GOLD, 1.0, 0.0),
        (GOLD, 0.99995, 0.0),
        (GOLD, 0.9998, 0.1),
        (GOLD, 0.99, 0.1),
        (GOLD, 0.9899, 0.3),
        (GOLD, 0.95, 0.3),
        (GOLD, 0.9499, 1.0),
        (SILVER, 0.90, 0.0),
        (SILVER, 0.8999, 0.1),
        (SILVER, 0.8912, 0.1),
        (SILVER, 0.8910, 0.3),
        (SILVER, 0.86, 0.3),
        (SILVER, 0.85, 1.0),
        (BRONZE, 0.7, 0.0),
        (BRONZE, 0.4999, 0.1),
        (BRONZE, 0.4951, 0.1),
        (BRONZE, 0.4949, 0.3),
        (BRONZE, 0.4751, 0.3),
        (BRONZE, 0.4749, 1.0),
        (BRONZE, 0.0, 1.0),
    ],
)
def test_penalty_fraction_table2(cls: ServiceClass, a: float, credit: float) -> None:
    assert penalty_fraction(a, cls) == credit


def test_request_penalty_eqs_10_11() -> None:
    # silver at 88 %: D = 0.02, 30 % bracket -> P = 0.02 * charge * 1.3
    assert request_penalty(0.88, SILVER, 100.0) == pytest.approx(0.02 * 100.0 * 1.3)
    assert request_penalty(0.95, SILVER, 100.0) == 0.0
    assert request_penalty(0.5, BRONZE, 100.0) == 0.0
    # gold just under 100 %: deficit paid, no bonus
    assert request_penalty(0.99995, GOLD, 1000.0) == pytest.approx(0.00005 * 1000.0)
    assert request_penalty(0.2, BRONZE, 10.0) == pytest.approx(0.3 * 10.0 * 2.0)


# -------------------------------------------------------------------------------------------- bad inputs


def test_bad_inputs_raise() -> None:
    with pytest.raises(InvalidInputError):
        availability(math.nan, 1.0)
    with pytest.raises(InvalidInputError):
        availability(1.0, -1.0)
    with pytest.raises(InvalidInputError):
        q_metric(1.0, 1.0, 0.0, 2.0)
    with pytest.raises(InvalidInputError):
        q_metric(1.0, 1.0, 0.9, math.inf)
    with pytest.raises(InvalidInputError):
        time_to_violate(1.0, 1.0, 1.5)
    with pytest.raises(InvalidInputError):
        Instance(pod("a"), math.nan, 0.0)
    with pytest.raises(InvalidInputError):
        Instance(pod("a"), 1.0, -0.5)
    with pytest.raises(InvalidInputError):
        Instance(pod("a"), 1.0, 1.0, preemptions=-1)
    with pytest.raises(InvalidInputError):
        PAPER.cls("platinum")
    with pytest.raises(InvalidInputError):
        instance_q(inst("a", "platinum"), PAPER)
    with pytest.raises(InvalidInputError):
        may_preempt(inst("v", "platinum", node="h"), inst("j"), PAPER)
    with pytest.raises(InvalidInputError):
        QosPolicy(alpha_seconds=-1.0)
    with pytest.raises(InvalidInputError):
        QosPolicy(q_hysteresis_seconds=math.nan)
    with pytest.raises(InvalidInputError):
        QosPolicy(classes={})
    with pytest.raises(InvalidInputError):
        QosPolicy(classes={"gold": SILVER})
    with pytest.raises(InvalidInputError):
        penalty_fraction(1.2, GOLD)
    with pytest.raises(InvalidInputError):
        request_penalty(0.5, GOLD, -1.0)


def test_policy_copies_classes() -> None:
    classes = dict(DEFAULT_CLASSES)
    policy = QosPolicy(classes=classes)
    classes["extra"] = ServiceClass("extra", 0.1, 4)
    with pytest.raises(InvalidInputError):
        policy.cls("extra")
