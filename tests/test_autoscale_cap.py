"""The node cap (autoscaler.limits.max_nodes) buys capacity, the per-scan limit only delays (issue 14).

The planner buys the flavour cheapest per unit of demand, which on small pods is the smallest one; under a total
node limit that spent the cap on 1-core nodes and starved the Alibaba replay at the shipped 200 nodes. These tests
pin the rule that replaced it: when the cheapest plan needs more nodes than the cap still allows, the plan is
re-made for capacity per node (``autoscale.plan_pods(max_nodes=...)``, ``autoscale_scan.scan(cap=...)``), while a
per-scan limit (``budget``) buys the cheapest plan's first nodes with its mix unchanged; the sidecar's loop and
the simulator pass the two limits alike.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.autoscaler.loop import AutoscalerLoop
from extender.autoscaler.metrics import AutoscalerMetrics
from extender.autoscaler.view import AutoscalerSnapshot
from extender.core import autoscale, autoscale_scan
from extender.core.autoscale_scan import ScanSettings, ScanState
from extender.core.model import Flavour, InvalidInputError, Pod, Resources, WorkloadKind
from extender.settings.extender import ExtenderConfig
from tests.autoscaler_settings import make_settings

GI = 2**30
# cheapest per core: C1 (0.050) < C4 (0.055) < C8 (0.0575): uncapped, small pods are planned onto C1
C1 = Flavour("c1", Resources(1000, 2 * GI, 110), 0.05)
C4 = Flavour("c4", Resources(4000, 8 * GI, 110), 0.22)
C8 = Flavour("c8", Resources(8000, 16 * GI, 110), 0.46)
CATALOGUE = (C1, C4, C8)
W = autoscale.ScoreWeights()
CONFIG = ExtenderConfig()


def pods(n: int, cpu: int = 1000, mem: int = GI, kind: WorkloadKind = WorkloadKind.SERVICE) -> list[Pod]:
    runtime = 3600.0 if kind is WorkloadKind.BATCH else None
    return [Pod(f"p{i:03d}", Resources(cpu, mem), kind=kind, runtime_seconds=runtime) for i in range(n)]


def flavours(plan: autoscale.ScalePlan | list[autoscale_scan.Purchase]) -> dict[str, int]:
    if isinstance(plan, autoscale.ScalePlan):
        return dict(Counter(f.name for f, _ in plan.nodes))
    return dict(Counter(p.flavour.name for p in plan))


def covered(keys: set[str], by_key: dict[str, Pod], demand: Resources) -> Fraction:
    """The planner's measure of demand covered: nc's weighted share of the pending cpu and memory."""
    cpu = sum(by_key[k].requests.cpu_milli for k in keys)
    mem = sum(by_key[k].requests.memory_bytes for k in keys)
    c = Fraction(W.cpu) * Fraction(cpu, demand.cpu_milli) if demand.cpu_milli else Fraction(0)
    m = Fraction(W.memory) * Fraction(mem, demand.memory_bytes) if demand.memory_bytes else Fraction(0)
    return c + m


# ---------------------------------------------------------------------------------------------- planner


def test_the_uncapped_plan_buys_the_smallest_flavour() -> None:
    """The premise: 12 one-core pods are cheapest on twelve 1-core nodes (the cap tests below mean something)."""
    plan = autoscale.plan_pods(pods(12), CATALOGUE, W)
    assert flavours(plan) == {"c1": 12} and not plan.deferred and not plan.reshaped


def test_when_the_cap_binds_the_plan_covers_the_demand_with_larger_flavours() -> None:
    plan = autoscale.plan_pods(pods(12), CATALOGUE, W, max_nodes=3)
    assert flavours(plan) == {"c4": 3}  # all 12 cores within 3 nodes, the cheapest such plan (2 x c8 costs more)
    assert sorted(k for _, keys in plan.nodes for k in keys) == [p.key for p in pods(12)]
    assert plan.deferred == () and plan.reshaped
    assert plan.cost_per_hour == pytest.approx(0.66)


def test_a_cap_the_cheapest_plan_fits_under_changes_nothing() -> None:
    assert autoscale.plan_pods(pods(12), CATALOGUE, W, max_nodes=12) == autoscale.plan_pods(pods(12), CATALOGUE, W)


def test_when_even_the_largest_flavour_cannot_cover_it_the_rest_is_deferred() -> None:
    plan = autoscale.plan_pods(pods(40), CATALOGUE, W, max_nodes=3)
    assert flavours(plan) == {"c8": 3}
    assert sum(len(keys) for _, keys in plan.nodes) == 24 and len(plan.deferred) == 16


def test_a_zero_cap_plans_nothing_and_defers_every_servable_pod() -> None:
    big = Pod("huge", Resources(64_000, GI))
    plan = autoscale.plan_pods([*pods(3), big], CATALOGUE, W, max_nodes=0)
    assert plan.nodes == () and plan.unservable == ("default/huge",) and len(plan.deferred) == 3


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_a_bad_cap_is_refused(bad: object) -> None:
    with pytest.raises(InvalidInputError, match="max_nodes"):
        autoscale.plan_pods(pods(3), CATALOGUE, W, max_nodes=bad)  # type: ignore[arg-type]


def test_the_batch_plan_takes_the_cap_after_the_zero_bin_deduction() -> None:
    plan = autoscale.plan_batch(pods(12, kind=WorkloadKind.BATCH), [], CATALOGUE, W, 0.0, 300.0, max_nodes=3)
    assert flavours(plan) == {"c4": 3} and plan.reshaped


def test_capacity_order_is_smallest_first_by_the_planners_weights() -> None:
    himem = Flavour("himem", Resources(1000, 16 * GI, 110), 0.10)
    order = autoscale.capacity_order([C8, himem, C4, C1], W)
    assert [f.name for f in order] == ["c1", "c4", "himem", "c8"]
    cpu_only = autoscale.capacity_order([C8, himem, C4, C1], autoscale.ScoreWeights(cpu=1.0, memory=0.0))
    assert [f.name for f in cpu_only] == ["c1", "himem", "c4", "c8"]  # equal cpu: the cheaper first


shapes = st.tuples(st.integers(100, 9000), st.integers(2**26, 20 * GI))


@settings(max_examples=60, deadline=None)
@given(st.lists(shapes, min_size=1, max_size=40), st.integers(0, 12))
def test_a_capped_plan_never_exceeds_the_cap_and_covers_at_least_the_cheapest_plans_first_nodes(
    requests: list[tuple[int, int]], cap: int
) -> None:
    pending = [Pod(f"p{i:03d}", Resources(c, m)) for i, (c, m) in enumerate(requests)]
    by_key = {p.key: p for p in pending}
    cheapest = autoscale.plan_pods(pending, CATALOGUE, W)
    capped = autoscale.plan_pods(pending, CATALOGUE, W, max_nodes=cap)
    assert len(capped.nodes) <= cap
    planned = [k for _, keys in capped.nodes for k in keys]
    everything = sorted([*planned, *capped.unservable, *capped.deferred])
    assert everything == sorted(by_key)  # every pod exactly once
    assert capped.unservable == cheapest.unservable
    for flavour, keys in capped.nodes:  # no node over-committed
        assert Resources.total(by_key[k].requests for k in keys).fits_in(flavour.capacity)
        assert len(keys) <= flavour.capacity.pods
    servable = Resources.total(by_key[k].requests for k in by_key if k not in cheapest.unservable)
    first = {k for _, keys in cheapest.nodes[:cap] for k in keys}
    assert covered(set(planned), by_key, servable) >= covered(first, by_key, servable)
    if len(cheapest.nodes) <= cap:
        assert capped == cheapest


# -------------------------------------------------------------------------------------------------- scan


def scan(pending: list[Pod], *, budget: float = math.inf, cap: float = math.inf) -> autoscale_scan.ScanResult:
    return autoscale_scan.scan(ScanState(), ScanSettings(flavours=CATALOGUE), [], pending, 0.0, budget=budget, cap=cap)


def test_the_scan_reshapes_under_the_cap_and_reports_it() -> None:
    result = scan(pods(12), budget=50, cap=3)
    assert flavours(list(result.purchases)) == {"c4": 3}
    assert result.plans[0].reshaped and not result.limited


def test_a_per_scan_limit_alone_keeps_the_cheapest_mix() -> None:
    """Only the per-scan limit binds: the scan buys the cheapest plan's first nodes (1-core), as before."""
    cheapest = autoscale.plan_pods(pods(12), CATALOGUE, W)
    for cap in (math.inf, 100):
        result = scan(pods(12), budget=2, cap=cap)
        assert [(p.flavour, p.pods) for p in result.purchases] == list(cheapest.nodes[:2])
        assert result.limited and not result.plans[0].reshaped


def test_both_limits_buy_the_capped_plans_largest_nodes_first() -> None:
    result = scan(pods(14), budget=1, cap=3)  # 14 cores within 3 nodes: 2 x c8 covers them all; 1 bought now
    plan = result.plans[0].plan
    assert flavours(plan) == {"c8": 2} and not plan.deferred and plan.reshaped
    assert [p.flavour for p in result.purchases] == [C8] and result.limited


def test_the_service_groups_purchases_leave_the_batch_group_the_rest_of_the_cap() -> None:
    """Services first: their cheapest plan (4 x c1) fits the cap of 5, so its mix stays; the batch group gets the
    one node left and takes the largest flavour for it, deferring what even that cannot hold."""
    pending = [*pods(4), *(dataclasses.replace(p, name="b" + p.name) for p in pods(12, kind=WorkloadKind.BATCH))]
    result = scan(pending, budget=50, cap=5)
    by_group = {up.group.value: flavours(up.plan) for up in result.plans}
    assert by_group == {"service": {"c1": 4}, "batch": {"c8": 1}}
    assert [up.reshaped for up in result.plans] == [False, True]
    assert len(result.plans[1].plan.deferred) == 4 and len(result.purchases) == 5 and result.limited


@pytest.mark.parametrize("limit", ["budget", "cap"])
@pytest.mark.parametrize("bad", [math.nan, True, "5"])
def test_bad_limits_are_refused(limit: str, bad: object) -> None:
    with pytest.raises(InvalidInputError, match=f"scan {limit}"):
        scan(pods(2), **{limit: bad})  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------- the sidecar's loop


def pod_json(name: str) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": {}},
        "spec": {
            "schedulerName": "qos-scheduler",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
        },
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        },
    }


def sidecar(max_nodes: int, per_cycle: int) -> tuple[AutoscalerLoop, AutoscalerSnapshot]:
    s = make_settings(
        scheduler_names=("qos-scheduler",), flavours=CATALOGUE, max_nodes=max_nodes, max_nodes_per_cycle=per_cycle
    )
    snap = AutoscalerSnapshot(CONFIG)
    snap.replace_nodes([], "1", now=0.0)
    snap.replace_pods([pod_json(f"p{i:02d}") for i in range(12)], "1", now=0.0)
    names = iter(range(10**6))
    return AutoscalerLoop(s, CONFIG.node_groups, name_suffix=lambda: f"{next(names):04d}"), snap


def test_the_sidecar_buys_capacity_within_max_nodes_and_says_so() -> None:
    loop, snap = sidecar(max_nodes=3, per_cycle=50)
    d = loop.step(snap, 0.0)
    assert Counter(r.flavour.name for r in d.provision) == {"c4": 3}
    assert d.plans[0].reshaped
    events = [n for n in d.notices if n.reason == "TriggeredScaleUp"]
    assert events and all("autoscaler.limits.max_nodes 3" in n.message for n in events)
    metrics = AutoscalerMetrics()
    metrics.observe(d)
    text = metrics.exposition().decode()
    assert 'qos_extender_autoscaler_cap_reshaped_plans_total{group="service"} 1.0' in text
    assert loop.step(snap, 1.0).provision == []  # the ledger covers the 12 pods; the cap is used up


def test_the_sidecars_per_cycle_limit_keeps_the_cheapest_mix() -> None:
    loop, snap = sidecar(max_nodes=200, per_cycle=2)
    d = loop.step(snap, 0.0)
    assert [r.flavour.name for r in d.provision] == ["c1", "c1"] and d.limited
    assert not d.plans[0].reshaped
    assert all("max_nodes" not in n.message for n in d.notices)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9000), st.integers(0, 20 * GI), st.integers(0, 2)), max_size=60))
def test_the_packers_running_totals_equal_a_recount_after_every_node(requests: list[tuple[int, int, int]]) -> None:
    """The planner keeps the remaining count, cpu and memory and the active groups' minimums up to date as nodes
    take pods (recomputing them per node made capped plans of thousands of pods slow); they must equal a recount."""
    pending = [Pod(f"p{i:03d}", Resources(c, m, s)) for i, (c, m, s) in enumerate(requests)]
    servable, _ = autoscale._split_servable(pending, CATALOGUE)
    groups = autoscale._Groups(servable, CATALOGUE)
    while groups.remaining() > 0:
        groups.pop(groups.fill(C8.capacity))
        active = [i for i in range(len(groups.left)) if groups.left[i] > 0]
        assert groups.active == active
        assert groups.remaining() == sum(groups.left)
        assert groups.demand() == groups.used({i: groups.left[i] for i in active})
        if active:
            assert groups.mins == tuple(min(groups.shapes[i][d] for i in active) for d in range(3))
