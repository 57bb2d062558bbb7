"""A one-class trace of short and long batch tasks, as Alibaba 2017 is (issue 33), on the deterministic simulator.

On Alibaba 2017 `product` met bronze's SLO for fewer requests than `k8s` (97.2 vs 98.7 %) with 81,220 QoS
preemptions for 165,223 pods: the paper's Q made a task of seconds as urgent as an hour-long one that waited as
long (the short ones waited for room and missed), and any peer with a lower Q took a long task's room, bouncing
it again and again. The trace file is not in the repository, so this replays a small trace of the same shape
(70 % of tasks 3-60 s, 25 % 2-10 min, 5 % 0.5-1 h, every one bronze batch with its runtime declared). Before
the fix, seeds 1 and 3 gave bronze SLO met 95.6 / 93.0 % under product against 96.0 / 95.8 % under k8s, with
945 / 694 preemptions for 800 tasks.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from extender.core.model import NodeGroup, WorkloadKind
from extender.sim.engine import simulate
from extender.sim.report import run_json
from extender.sim.workloads import HTAS_FLAVOURS, RequestSpec, Workload

TASKS = 800


def one_class(seed: int, n: int = TASKS, hours: float = 1.0) -> Workload:
    rng = random.Random(seed)
    reqs = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(n / (hours * 3600))
        u = rng.random()
        runtime = rng.uniform(3, 60) if u < 0.7 else (rng.uniform(120, 600) if u < 0.95 else rng.uniform(1800, 3600))
        cpu = rng.choice((500, 1000))
        memory = int(rng.uniform(0.25, 1.0) * 2**30)
        reqs.append(RequestSpec(f"t{i}", round(t, 1), cpu, memory, round(runtime), "bronze", WorkloadKind.BATCH))
    return Workload("one-class", tuple(reqs), flavours=HTAS_FLAVOURS, initial=(("m1.xlarge", NodeGroup.BATCH),))


@pytest.mark.parametrize("seed", [1, 3])
def test_product_serves_a_one_class_trace_as_well_as_k8s_with_few_preemptions(seed: int) -> None:
    w = one_class(seed)
    runs: dict[str, dict[str, Any]] = {p: run_json(simulate(w, p)) for p in ("product", "k8s")}
    product, k8s = runs["product"], runs["k8s"]
    assert product["requests_incomplete"] == 0
    assert product["classes"]["bronze"]["slo_fulfillment"] >= k8s["classes"]["bronze"]["slo_fulfillment"]
    assert product["cost_usd"] <= 0.6 * k8s["cost_usd"]
    # a preemption only rescues a task about to miss: fewer than one per three tasks (before: more than one each)
    assert product["preemptions"] < TASKS / 3, product["preemptions"]
