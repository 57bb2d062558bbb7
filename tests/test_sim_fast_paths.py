"""The simulator's fast paths against the slow code they replace: the same numbers, the same decisions.

k8s scores a pending pod on all nodes at once (``packing.k8s_default_scores``, the engine's ``_K8sTable``), the
fluid lower bound is answered from the LP's dual vertices (``autoscale.FluidBound``), and the utilisation
integral is updated for the changed nodes only; the product's scan tests pending pods against the nodes at once
and, at its node limit, skips the plans it could buy nothing with.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from extender.core import autoscale, autoscale_scan, packing
from extender.core.model import InvalidInputError, Node, NodeGroup, Pod, Resources, WorkloadKind
from extender.sim import engine
from extender.sim.engine import SimConfig, simulate
from extender.sim.product import ProductSettings
from extender.sim.workloads import HTAS_FLAVOURS, RequestSpec, Workload, htas, rodriguez

MiB = 2**20


def _node(r: random.Random, i: int) -> Node:
    alloc = Resources(r.choice((0, 1000, 2000, 3750, 8000)), r.choice((0, 2048, 3840, 8192)) * MiB, 110)
    pods = tuple(
        Pod(f"n{i}p{k}", Resources.request(r.choice((0, 100, 250, 900)), r.choice((0, 64, 256, 1024)) * MiB, 1))
        for k in range(r.randint(0, 12))
    )
    return Node(f"node{i}", alloc, pods=pods)


@pytest.mark.parametrize("seed", range(60))
def test_k8s_scores_at_once_equal_the_scalar_scores(seed: int) -> None:
    r = random.Random(seed)
    nodes = [_node(r, i) for i in range(r.randint(1, 30))]
    alloc = np.array([[n.allocatable.cpu_milli for n in nodes], [n.allocatable.memory_bytes for n in nodes]])
    req = np.array([[n.requested.cpu_milli for n in nodes], [n.requested.memory_bytes for n in nodes]])
    nz = np.zeros((2, len(nodes)), dtype=np.int64)
    for i, n in enumerate(nodes):
        for p in n.pods:
            nz[0, i] += p.requests.cpu_milli or packing.DEFAULT_MILLI_CPU_REQUEST
            nz[1, i] += p.requests.memory_bytes or packing.DEFAULT_MEMORY_REQUEST
    for k in range(20):
        pod = Pod(f"x{k}", Resources.request(r.choice((0, 50, 500, 5000)), r.choice((0, 10, 700, 9000)) * MiB, 1))
        fast = packing.k8s_default_scores(alloc.astype(np.int64), nz, req.astype(np.int64), pod)
        assert fast.tolist() == [packing.k8s_default_score(n, pod) for n in nodes]


def test_fluid_bound_from_dual_vertices_equals_the_primal() -> None:
    r = random.Random(7)
    bound = autoscale.FluidBound(HTAS_FLAVOURS)
    demands = [Resources(r.randint(0, 10**6), r.randint(0, 10**13)) for _ in range(400)]
    demands += [Resources(r.randint(0, 40), r.randint(0, 40)) for _ in range(200)] + [Resources()]
    assert [bound.per_hour(d) for d in demands] == [
        autoscale.fluid_lower_bound_per_hour(d, HTAS_FLAVOURS) for d in demands
    ]
    with pytest.raises(InvalidInputError):
        autoscale.FluidBound([])


@pytest.mark.parametrize("workload", ["htas-stable", "htas-cycle", "rodriguez-bursty"])
def test_k8s_table_takes_the_per_node_loops_decisions(workload: str, monkeypatch: pytest.MonkeyPatch) -> None:
    w = htas(workload.split("-")[1]) if workload.startswith("htas") else rodriguez(workload.split("-")[1])
    fast = simulate(w, "k8s")
    monkeypatch.setattr(engine, "_VECTORISED_K8S", False)
    slow = simulate(w, "k8s")
    assert fast.cost_usd == slow.cost_usd
    assert fast.counters == slow.counters
    assert [(q.e, q.p, q.node, q.done_at) for q in fast.reqs] == [(q.e, q.p, q.node, q.done_at) for q in slow.reqs]


def test_utilisation_integral_counts_every_node_at_every_moment() -> None:
    """The per-changed-node update gives what summing requested / allocatable over every node at every event
    gives (up to float rounding): one run recomputed from its timeline of placements would be the same."""
    w = htas("growing")
    res = simulate(w, "htas")
    sim = engine.Simulator(w, "htas")
    seen: list[tuple[float, float]] = []
    integrate = sim._integrate

    def checked(t: float) -> None:
        if t > sim._last_integrate:
            full = sum(sim._requested(n).cpu_milli / n.allocatable.cpu_milli for n in sim.nodes.values())
            sim._refresh_util()
            seen.append((full, sim._util_rate[0]))
        integrate(t)

    sim._integrate = checked  # type: ignore[method-assign]
    again = sim.run()
    assert again.cost_usd == res.cost_usd
    assert seen and all(abs(a - b) <= 1e-9 * max(1.0, a) for a, b in seen)
    assert again.util_cpu == pytest.approx(res.util_cpu, rel=1e-12)


def test_a_pod_no_flavour_can_host_ends_the_run_instead_of_ticking_for_ever() -> None:
    """cluster-autoscaler's one m1.medium (2 cores) can never host a 3-core pod: once the rest is done and the
    idle nodes are gone, the run stops after STALL_SECONDS of ticks and reports the pod incomplete (the whole
    Alibaba trace under k8s ticked for 160+ simulated hours before this)."""
    big = RequestSpec("big", 0.0, 3000, 2**30, 60.0, "bronze", WorkloadKind.BATCH)
    small = RequestSpec("small", 0.0, 500, 2**30, 60.0, "bronze", WorkloadKind.BATCH)
    w = Workload("stuck", (big, small), flavours=HTAS_FLAVOURS, initial=(("m1.medium", NodeGroup.BATCH),))
    res = simulate(w, "k8s")
    states = {r.spec.request_id: r.state for r in res.reqs}
    assert states == {"big": engine.State.PENDING, "small": engine.State.DONE}
    assert engine.STALL_SECONDS <= res.end <= engine.STALL_SECONDS + 3600.0
    assert simulate(w, "product").reqs[0].state is engine.State.DONE  # product buys a larger flavour


def _grouped_node(r: random.Random, i: int) -> Node:
    alloc = Resources(r.choice((1000, 2000, 4000)), r.choice((1024, 2048, 4096)) * MiB, r.choice((3, 5, 110)))
    if r.random() < 0.1:
        alloc = alloc + Resources(extended=(("example.com/gpu", r.choice((1, 2))),))
    pods = tuple(
        Pod(f"n{i}p{k}", Resources.request(r.choice((100, 250, 500)), r.choice((128, 256, 512)) * MiB, 1))
        for k in range(r.randint(0, 6))
    )
    group = r.choice((NodeGroup.BATCH, NodeGroup.SERVICE, None))  # a node of no group takes no pod
    return Node(f"node{i}", alloc, group=group, pods=pods, unschedulable=r.random() < 0.1)


@pytest.mark.parametrize("seed", range(40))
def test_unschedulable_at_once_equals_the_per_node_loop(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Crowded groups (slots, cordons, extended resources, both kinds): the numpy check lists exactly the pods
    the per-node ``packing.fits`` loop lists, in the same order."""
    r = random.Random(seed)
    nodes = [_grouped_node(r, i) for i in range(r.randint(0, 25))]
    pending = []
    for k in range(r.randint(0, 300)):
        req = Resources.request(r.choice((100, 500, 1500, 3000, 5000)), r.choice((64, 512, 2048, 8192)) * MiB, 1)
        if r.random() < 0.05:
            req = req + Resources(extended=(("example.com/gpu", 1),))
        kind = r.choice((WorkloadKind.BATCH, WorkloadKind.SERVICE))
        pending.append(Pod(f"p{k}", req, kind=kind))
    fast = autoscale_scan.unschedulable(pending, nodes)
    monkeypatch.setattr(autoscale_scan, "_VECTORISED_UNSCHEDULABLE", False)
    slow = autoscale_scan.unschedulable(pending, nodes)
    assert [p.key for p in fast] == [p.key for p in slow]
    if len(pending) > 50 and sum(n.group is not None and not n.unschedulable for n in nodes) > 8:
        assert 0 < len(slow) < len(pending)  # the test sees both answers


@pytest.mark.parametrize("pattern", ["growing", "cycle"])
def test_product_at_max_nodes_skips_unbuyable_plans_with_the_same_decisions(
    pattern: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At its node limit the product's scan skips the plans it could buy nothing with, and tests pending pods
    against the nodes at once: the run takes the same decisions as with the plans computed and the loop."""
    w = htas(pattern)
    cfg = SimConfig(product=ProductSettings(max_nodes=3))
    plans = 0
    plan_batch = autoscale.plan_batch

    def counted(*args: object, **kwargs: object) -> autoscale.ScalePlan:
        nonlocal plans
        plans += 1
        return plan_batch(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(autoscale, "plan_batch", counted)
    fast = simulate(w, "product", cfg)
    fast_plans, plans = plans, 0
    monkeypatch.setattr(engine, "_SKIP_UNBUYABLE_PLANS", False)
    monkeypatch.setattr(autoscale_scan, "_VECTORISED_UNSCHEDULABLE", False)
    slow = simulate(w, "product", cfg)
    assert fast_plans < plans  # the limit was reached and plans were skipped
    assert fast.cost_usd == slow.cost_usd
    assert fast.counters == slow.counters
    assert [(q.e, q.p, q.node, q.done_at) for q in fast.reqs] == [(q.e, q.p, q.node, q.done_at) for q in slow.reqs]


def test_cost_terms_add_up_to_the_bill_and_match_a_full_recount() -> None:
    """Issue 33 part 3: the per-changed-node cost terms are what a recount over every node at every event gives,
    and the breakdown adds up to the bill with each term of its sign (only ``waiting`` may be negative)."""
    w = htas("growing")
    sim = engine.Simulator(w, "product")
    assert sim._fluid is not None
    bound = sim._fluid
    full = engine.CostTerms()
    integrate = sim._integrate

    def checked(t: float) -> None:
        dt = t - sim._last_integrate
        if dt > 0:
            occupied = [n for n in sim.nodes.values() if n.pods]
            cap = Resources(
                sum(n.allocatable.cpu_milli for n in occupied), sum(n.allocatable.memory_bytes for n in occupied)
            )
            req = Resources(
                sum(sim._requested(n).cpu_milli for n in occupied),
                sum(sim._requested(n).memory_bytes for n in occupied),
            )
            h = dt / 3600.0
            full.booting += h * sum(n.price_per_hour for n in sim.provisioning.values())
            full.empty_nodes += h * sum(n.price_per_hour for n in sim.nodes.values() if not n.pods)
            full.occupied_nodes += h * sum(n.price_per_hour for n in occupied)
            full.fluid_capacity += h * bound.per_hour(cap)
            full.fluid_requested += h * bound.per_hour(req)
            full.capacity_core_hours += h * cap.cpu_milli / 1000
            full.requested_gib_hours += h * req.memory_bytes / 2**30
            full.under_half_nodes += h * sum(
                n.price_per_hour
                for n in occupied
                if 2 * sim._requested(n).cpu_milli < n.allocatable.cpu_milli
                and 2 * sim._requested(n).memory_bytes < n.allocatable.memory_bytes
            )
        integrate(t)

    sim._integrate = checked  # type: ignore[method-assign]
    res = sim.run()
    got = res.cost_terms
    names = ("booting", "empty_nodes", "occupied_nodes", "fluid_capacity", "fluid_requested", "under_half_nodes")
    for name in (*names, "capacity_core_hours", "requested_gib_hours"):
        assert getattr(got, name) == pytest.approx(getattr(full, name), rel=1e-9, abs=1e-12), name
    assert got.booting > 0 and got.empty_nodes > 0 and 0 < got.under_half_nodes < got.occupied_nodes
    terms = got.breakdown(res.cost_usd, res.fluid_usd)
    assert sum(terms.values()) == pytest.approx(res.cost_usd, rel=1e-12)
    assert terms["waiting"] <= 1e-12
    assert all(v >= -1e-9 for k, v in terms.items() if k != "waiting"), terms


def test_cost_terms_of_one_pod_on_one_node_by_hand() -> None:
    """One 500m / 1 GiB pod for an hour on the initial m1.medium: the node is empty until the pod is placed and
    occupied after; while occupied, the capacity term is the bound of the node's capacity and the requested term
    the bound of the pod; the wait before placement is the (negative) waiting term."""
    pod = RequestSpec("p", 0.0, 500, 2**30, 3600.0, "bronze", WorkloadKind.BATCH)
    w = Workload("one", (pod,), flavours=HTAS_FLAVOURS, initial=(("m1.medium", NodeGroup.BATCH),))
    res = simulate(w, "k8s")
    medium = w.flavour("m1.medium")
    bound = autoscale.FluidBound(HTAS_FLAVOURS)
    price, b_cap, b_pod = medium.price_per_hour, bound.per_hour(medium.capacity), bound.per_hour(Resources(500, 2**30))
    t = res.cost_terms
    occupied_h = t.occupied_nodes / price
    assert 3600.0 <= occupied_h * 3600.0 < res.end  # placed after a scheduling delay, held to completion
    assert (t.empty_nodes + t.occupied_nodes) * 3600.0 / price == pytest.approx(res.end)
    assert t.fluid_capacity == pytest.approx(b_cap * occupied_h)
    assert t.fluid_requested == pytest.approx(b_pod * occupied_h)
    assert res.fluid_usd == pytest.approx(b_pod * res.end / 3600.0)
    assert t.booting == 0
    terms = t.breakdown(res.cost_usd, res.fluid_usd)
    assert terms["waiting"] == pytest.approx(-b_pod * (res.end / 3600.0 - occupied_h))
    assert terms["packing"] > 0 and terms["flavour_mix"] >= 0
    assert terms["billing"] == pytest.approx(price * (math.ceil(res.end / 60.0) * 60.0 - res.end) / 3600.0)
