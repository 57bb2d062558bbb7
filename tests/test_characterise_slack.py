"""Paper 004 Eq. 2 and 4, the published reclaimable capacity and LRP (Alg. 1) in extender/core/slack.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.core.model import InvalidInputError, Node, Pod, Resources, WorkloadKind
from extender.core.slack import (
    LRP_WEIGHTS,
    Amount,
    available,
    available_for_batch,
    fits,
    lrp_choose,
    lrp_score,
    node_available,
    node_available_for_batch,
    reclaimable,
)

GI = 2**30
CAP = Resources(cpu_milli=4000, memory_bytes=8 * GI, pods=110)


def test_eq2_and_eq4_by_hand() -> None:
    requests = [Resources(1000, 2 * GI), Resources(2000, 4 * GI)]
    assert available(CAP, requests) == Amount(1000, 2 * GI)  # 4000 - 3000, 8 Gi - 6 Gi
    idle = [Amount(600, GI), Amount(-100, 0)]  # the second service is predicted above its request
    assert available_for_batch(CAP, requests, idle) == Amount(1500, 3 * GI)
    assert reclaimable(idle) == Amount(500, GI)
    assert reclaimable([Amount(-100, -5)]) == Amount(0, 0)  # nothing to lend, never negative


def test_eq4_on_a_node_counts_service_pods_only() -> None:
    svc = Pod("svc", Resources.request(2000, 4 * GI), namespace="a", kind=WorkloadKind.SERVICE)
    batch = Pod("job", Resources.request(500, GI), namespace="a", kind=WorkloadKind.BATCH)
    node = Node("n1", CAP, pods=(svc, batch))
    assert node_available(node) == Amount(1500, 3 * GI)
    idle = {"a/svc": Amount(1200, GI), "a/job": Amount(400, GI), "a/elsewhere": Amount(999, 999)}
    assert node_available_for_batch(node, idle) == Amount(2700, 4 * GI)


def test_lrp_score_by_hand() -> None:
    # after the pod: 2000 m of 4000 (0.5) and 2 Gi of 8 (0.25) left -> 100 * (0.38*0.5 + 0.62*0.25) = 34.5
    assert lrp_score(CAP, Amount(3000, 4 * GI), Resources(1000, 2 * GI)) == 34
    assert lrp_score(CAP, Amount(4000, 8 * GI), Resources()) == 100
    assert lrp_score(CAP, Amount(500, GI), Resources(1000, 2 * GI)) == 0  # does not fit: 0, filter first
    assert lrp_score(Resources(4000, 0), Amount(2000, 0), Resources()) == 50  # zero-capacity memory left out
    with pytest.raises(InvalidInputError, match="weights"):
        lrp_score(CAP, Amount(), Resources(), (0.0, 0.0))
    with pytest.raises(InvalidInputError, match="weights"):
        lrp_score(CAP, Amount(), Resources(), (-1.0, 2.0))


def test_memory_weighs_more_than_cpu() -> None:
    demand = Resources(1000, GI)
    cpu_rich = ("cpu-rich", CAP, Amount(4000, 2 * GI))  # 3000 m / 1 Gi left: 0.38*0.75 + 0.62*0.125
    mem_rich = ("mem-rich", CAP, Amount(1500, 8 * GI))  # 500 m / 7 Gi left: 0.38*0.125 + 0.62*0.875
    assert lrp_choose([cpu_rich, mem_rich], demand) == "mem-rich"
    # with equal weights the two would be 0.4375 vs 0.5: the paper's weights widen the gap, same pick
    assert lrp_choose([cpu_rich, mem_rich], demand, (1.0, 1.0)) == "mem-rich"
    assert lrp_choose([cpu_rich, mem_rich], demand, (1.0, 0.0)) == "cpu-rich"


def test_lrp_choose_filters_and_breaks_ties_by_order() -> None:
    demand = Resources(1000, GI)
    assert lrp_choose([("small", CAP, Amount(500, 8 * GI))], demand) is None
    same = Amount(2000, 4 * GI)
    assert lrp_choose([("b", CAP, same), ("a", CAP, same)], demand) == "b"
    assert fits(Amount(1000, GI), demand)
    assert not fits(Amount(999, 8 * GI), demand)


def test_amount_is_integer() -> None:
    with pytest.raises(InvalidInputError):
        Amount(1.5, 0)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        Amount(True, 0)


amounts = st.builds(Amount, st.integers(-8000, 8000), st.integers(-16 * GI, 16 * GI))
resources = st.builds(Resources, st.integers(0, 8000), st.integers(0, 16 * GI))


@settings(max_examples=300, deadline=None)
@given(resources, amounts, amounts, resources)
def test_lrp_properties(capacity: Resources, a: Amount, extra: Amount, demand: Resources) -> None:
    s = lrp_score(capacity, a, demand)
    assert 0 <= s <= 100
    more = Amount(a.cpu_milli + abs(extra.cpu_milli), a.memory_bytes + abs(extra.memory_bytes))
    assert lrp_score(capacity, more, demand) >= s  # more available never scores lower
    assert LRP_WEIGHTS == (0.38, 0.62)


@settings(max_examples=200, deadline=None)
@given(st.lists(resources, max_size=6), st.lists(amounts, max_size=6))
def test_eq4_is_eq2_plus_the_idle_sum(requests: list[Resources], idle: list[Amount]) -> None:
    a = available(CAP, requests)
    a2 = available_for_batch(CAP, requests, idle)
    assert a2 == a + Amount.total(idle)
    r = reclaimable(idle)
    assert r.cpu_milli >= 0 and r.memory_bytes >= 0
    assert r.cpu_milli == max(0, sum(i.cpu_milli for i in idle))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(resources, amounts), max_size=6), resources)
def test_lrp_choose_picks_a_fitting_node_with_the_top_score(
    nodes: list[tuple[Resources, Amount]], demand: Resources
) -> None:
    cands = [(f"n{i}", cap, a) for i, (cap, a) in enumerate(nodes)]
    got = lrp_choose(cands, demand)
    feasible = [(n, c, a) for n, c, a in cands if fits(a, demand)]
    if not feasible:
        assert got is None
        return
    scores = {n: lrp_score(c, a, demand) for n, c, a in feasible}
    assert got in scores
    assert scores[got] == max(scores.values())
