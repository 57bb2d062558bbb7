"""``qos.feasibility``'s victim walk against the code it replaced (kept here as the reference): the same
options, victims, Eq. 9 costs and random stream, on crowded nodes where many candidates share a Q (equal
accounts: the tie-break draws decide) and with or without the caller's ``q_of``."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

import pytest

from extender.core import qos
from extender.core.model import DEFAULT_CLASSES, Node, Pod, Resources


def _reference_cost(victims: Sequence[qos.Instance], policy: qos.QosPolicy) -> tuple[float, ...]:
    if not victims:
        return ()
    levels = tuple(sorted({c.importance for c in policy.classes.values()}))
    minus = [0.0] * len(levels)
    has_minus = [False] * len(levels)
    plus = 0.0
    has_plus = False
    for inst in victims:
        cls = policy.cls(inst.pod.class_name)
        d = qos.instance_q(inst, policy) - cls.safety_margin_seconds
        if d >= 0:
            plus += d
            has_plus = True
        else:
            i = levels.index(cls.importance)
            minus[i] += d
            has_minus[i] = True
    s_minus = tuple((1.0 / m) if has else -math.inf for m, has in zip(minus, has_minus, strict=True))
    s_plus = 0.0 if not has_plus else (math.inf if plus == 0 else 1.0 / plus)
    return (*s_minus, s_plus)


def _reference(
    pending: qos.Instance,
    node: Node,
    running: Mapping[str, qos.Instance],
    policy: qos.QosPolicy,
    rng: random.Random,
    q_of: Mapping[str, float] | None,
) -> tuple[str, bool, tuple[str, ...], tuple[float, ...]]:
    """The walk as it was before the tuple sort and the cached Q (commit 0e5d089)."""
    policy.cls(pending.pod.class_name)
    if node.unschedulable:
        return node.name, False, (), ()
    request = pending.pod.requests
    free = node.free
    if request.fits_in(free):
        return node.name, True, (), ()
    on_node = {p.key: p for p in node.pods if p.key in running and p.key != pending.pod.key}
    candidates = [running[key] for key in sorted(on_node)]

    def q(inst: qos.Instance) -> float:
        if q_of is not None and inst.pod.key in q_of:
            return q_of[inst.pod.key]
        return qos.instance_q(inst, policy)

    keyed = [(-q(inst), rng.random(), inst) for inst in candidates]
    keyed.sort(key=lambda t: (t[0], t[1]))
    q_pending = q(pending)
    victims: list[qos.Instance] = []
    for neg_q, _, inst in keyed:
        if not qos._may_preempt(inst, -neg_q, pending, q_pending, policy):
            continue
        victims.append(inst)
        free = free + on_node[inst.pod.key].requests
        if request.fits_in(free):
            return node.name, True, tuple(v.pod.key for v in victims), _reference_cost(victims, policy)
    return node.name, False, (), ()


@pytest.mark.parametrize("seed", range(30))
def test_feasibility_takes_the_reference_walks_victims_costs_and_draws(seed: int) -> None:
    r = random.Random(seed)
    policy = qos.QosPolicy(
        classes=DEFAULT_CLASSES,
        alpha_seconds=2.0,
        min_run_quantum_seconds=r.choice((0.0, qos.RECOMMENDED_QUANTUM_SECONDS)),
        q_hysteresis_seconds=r.choice((0.0, qos.RECOMMENDED_HYSTERESIS_SECONDS)),
    )
    classes = ("gold", "silver", "bronze")
    feasible_with_victims = 0
    for n in range(20):
        running: dict[str, qos.Instance] = {}
        pods = []
        shared = (r.uniform(0, 3000), r.uniform(0, 2000))  # siblings with equal accounts: equal Q
        for k in range(r.randint(0, 12)):
            cls = r.choice(classes)
            pod = Pod(f"n{n}p{k}", Resources.request(r.choice((250, 500, 1000)), r.choice((256, 512)) * 2**20, 1))
            pod = Pod(pod.name, pod.requests, class_name=cls, node_name=f"node{n}")
            pods.append(pod)
            if r.random() < 0.9:
                e, p = shared if r.random() < 0.5 else (r.uniform(0, 3000), r.uniform(0, 2000))
                running[pod.key] = qos.Instance(
                    pod,
                    e,
                    p,
                    preemptions=r.choice((0, 1)),
                    overhead_seconds=r.choice((0.0, 50.0)),
                    current_run_seconds=r.choice((10.0, 500.0)),
                )
        node = Node(f"node{n}", Resources(4000, 4096 * 2**20, 110), pods=tuple(pods), unschedulable=r.random() < 0.05)
        cls = r.choice(classes)
        want = Pod("pending", Resources.request(r.choice((1000, 2500, 4000)), r.choice((512, 2048)) * 2**20, 1))
        pending = qos.Instance(Pod(want.name, want.requests, class_name=cls), r.uniform(0, 1000), r.uniform(0, 5000))
        q_of = {k: qos.instance_q(v, policy) for k, v in running.items()} if r.random() < 0.5 else None
        a, b = random.Random(n), random.Random(n)
        got = qos.feasibility(pending, node, running, policy, a, q_of)
        assert (got.node, got.feasible, got.victims, got.cost) == _reference(pending, node, running, policy, b, q_of)
        assert a.getstate() == b.getstate()
        feasible_with_victims += bool(got.victims)
    assert feasible_with_victims > 0
