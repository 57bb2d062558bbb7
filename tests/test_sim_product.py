"""Issue 14's targets for the `product` policy (config/'s shipped defaults, all components on), asserted on the
deterministic simulator: the same seed gives the same figures on every machine, so these are not timing tests.

Targets: on the HTAS patterns, product costs >= 25 % less than `k8s` (default kube-scheduler +
cluster-autoscaler) and meets every class's SLO for at least as many requests; on paper 002's validation 1
(fixed hosts) it keeps gold min >= 0.999, silver min >= 0.89, bronze min >= 0.49. Stable and growing missed the
cost target (22.8 % / 21.2 %) until the shipped consolidation windows went from 300 / 300 s to 30 / 30 s
(extender/sim/README.md).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from extender.core import autoscale_scan
from extender.core.model import InvalidInputError, Pod, Resources, ServiceClass, WorkloadKind
from extender.sim.engine import SimConfig, simulate
from extender.sim.product import ProductSettings
from extender.sim.report import run_json
from extender.sim.workloads import htas, load_workload

PATTERNS = ("stable", "growing", "cycle", "onoff")
_runs: dict[str, dict[str, dict[str, Any]]] = {}


def runs(pattern: str) -> dict[str, dict[str, Any]]:
    """product, htas and k8s on one pattern (about a second each), computed once per test session."""
    if pattern not in _runs:
        w = htas(pattern)
        _runs[pattern] = {p: run_json(simulate(w, p)) for p in ("product", "htas", "k8s")}
    return _runs[pattern]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_product_meets_every_slo_for_at_least_as_many_requests_as_k8s(pattern: str) -> None:
    r = runs(pattern)
    product, k8s = r["product"], r["k8s"]
    assert set(product["classes"]) == set(k8s["classes"]) == {"bronze", "silver"}
    for name, stats in product["classes"].items():
        assert stats["slo_fulfillment"] >= k8s["classes"][name]["slo_fulfillment"], (pattern, name)
    assert product["requests_incomplete"] == 0


@pytest.mark.parametrize("pattern", ("growing", "cycle", "onoff"))
def test_htas_alone_pays_for_its_saving_in_bronze_slo(pattern: str) -> None:
    """Why the product is more than HTAS: without the QoS parts, bronze misses its SLO on these patterns."""
    r = runs(pattern)
    assert r["htas"]["classes"]["bronze"]["slo_fulfillment"] < r["k8s"]["classes"]["bronze"]["slo_fulfillment"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_product_costs_at_least_25_percent_less_than_k8s(pattern: str) -> None:
    r = runs(pattern)
    assert r["product"]["cost_usd"] <= 0.75 * r["k8s"]["cost_usd"], (r["product"]["cost_usd"], r["k8s"]["cost_usd"])


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_price_of_the_slos_is_a_fraction_of_the_saving(pattern: str) -> None:
    """product - htas (what meeting every SLO costs over HTAS alone) stays below a third of k8s - product."""
    r = runs(pattern)
    price = r["product"]["cost_usd"] - r["htas"]["cost_usd"]
    assert price < (r["k8s"]["cost_usd"] - r["product"]["cost_usd"]) / 3, price


def test_product_keeps_paper_002_validation_targets_on_fixed_hosts() -> None:
    """The full hour (about 30 s): the product's controller (BFD host score) keeps qos-driven's figures."""
    report = run_json(simulate(load_workload("qos-validation1"), "product"))
    c = report["classes"]
    assert c["gold"]["availability_min"] >= 0.999
    assert c["silver"]["availability_min"] >= 0.89
    assert c["bronze"]["availability_min"] >= 0.49
    assert report["cost_usd"] == 0.0 and report["nodes_added"] == 0  # fixed hosts: nothing autoscaled


def test_product_refuses_a_workload_whose_classes_it_does_not_configure() -> None:
    w = htas("stable")
    only_gold = {"gold": ServiceClass("gold", 1.0, 1)}
    with pytest.raises(InvalidInputError, match="not configured"):
        simulate(w, "product", SimConfig(product=ProductSettings(classes=only_gold)))


def test_product_settings_are_validated() -> None:
    with pytest.raises(InvalidInputError, match="watchdog_seconds"):
        ProductSettings(watchdog_seconds=0)
    with pytest.raises(InvalidInputError, match="host_score"):
        ProductSettings(host_score="random")
    with pytest.raises(InvalidInputError, match="slo of class"):
        autoscale_scan.ScanSettings(flavours=htas("stable").flavours, slo={"bronze": 1.5})


def test_without_consolidation_the_product_migrates_nothing() -> None:
    w = htas("cycle")
    on = run_json(simulate(w, "product"))
    off = run_json(simulate(w, "product", SimConfig(product=ProductSettings(consolidation=False))))
    assert on["migrations"] > 0 and off["migrations"] == 0
    assert on["lost_work_seconds"] == off["lost_work_seconds"] == 0  # migration keeps progress


def _batch(runtime: float, progress: float = 0.0) -> Pod:
    return Pod(
        "p", Resources.request(100, 2**20), kind=WorkloadKind.BATCH, runtime_seconds=runtime, progress_seconds=progress
    )


def test_slo_urgent_is_the_availability_a_pod_would_end_with() -> None:
    """R / (R + waited + horizon) >= slo  <=>  waited + horizon <= R (1 - slo) / slo."""
    pod = _batch(200.0)
    assert not autoscale_scan.slo_urgent(pod, waited=50.0, slo=0.5, horizon=150.0, now=0.0)  # 200 / 400 = 0.5
    assert autoscale_scan.slo_urgent(pod, waited=50.0, slo=0.5, horizon=150.1, now=0.0)
    assert autoscale_scan.slo_urgent(pod, waited=0.0, slo=0.9, horizon=23.0, now=0.0)  # 200 / 223 < 0.9
    assert not autoscale_scan.slo_urgent(_batch(200.0, progress=100.0), 0.0, 0.5, 100.0, 0.0)  # 100 left
    service = replace(pod, kind=WorkloadKind.SERVICE, runtime_seconds=None)
    assert not autoscale_scan.slo_urgent(service, waited=1e6, slo=1.0, horizon=1e6, now=0.0)


def test_scan_plans_the_batch_group_early_only_for_a_pod_that_cannot_wait() -> None:
    """The batch cycle just ran (so the next is 300 s away); an urgent bronze pod makes the plan due now, a
    patient one waits, and without the classes' SLOs (the sidecar's settings today) nothing changes."""
    flavours = htas("stable").flavours
    settings = autoscale_scan.ScanSettings(flavours=flavours, slo={"bronze": 0.5})
    pod = replace(_batch(100.0), class_name="bronze")

    def plans(s: autoscale_scan.ScanSettings, waited: float) -> int:
        state = autoscale_scan.ScanState()
        state.last_batch_plan = 1000.0
        res = autoscale_scan.scan(state, s, [], [pod], 1000.0, waited={pod.key: waited}, lag_seconds=60.0)
        return len(res.purchases)

    assert plans(settings, 0.0) == 1  # 0 + 300 + 60 > 100: would end at 100 / 460
    long = replace(pod, runtime_seconds=10_000.0)
    state = autoscale_scan.ScanState()
    state.last_batch_plan = 1000.0
    res = autoscale_scan.scan(state, settings, [], [long], 1000.0, waited={long.key: 0.0}, lag_seconds=60.0)
    assert res.purchases == ()  # 10,000 s of work can wait for the cycle
    assert plans(autoscale_scan.ScanSettings(flavours=flavours), 0.0) == 0


def test_no_early_plan_when_a_batch_node_frees_room_before_the_pods_slack_runs_out() -> None:
    """A full batch node whose pod finishes in 50 s will take the urgent pod (slack 100 s) in time: no node is
    bought; if its pod runs for another 500 s, the urgent pod gets its own node now."""
    from extender.core.model import Node, NodeGroup

    flavours = htas("stable").flavours
    settings = autoscale_scan.ScanSettings(flavours=flavours, slo={"bronze": 0.5})
    pod = replace(_batch(100.0), class_name="bronze")

    def bought(left: float) -> int:
        hog = Pod("hog", Resources.request(1000, 2**30), kind=WorkloadKind.BATCH, runtime_seconds=left)
        hog = replace(hog, started_at=1000.0)
        node = Node("b1", Resources(1000, 2**30, 110), group=NodeGroup.BATCH, pods=(hog,))
        state = autoscale_scan.ScanState()
        state.last_batch_plan = 1000.0
        res = autoscale_scan.scan(state, settings, [node], [pod], 1000.0, waited={pod.key: 0.0}, lag_seconds=60.0)
        return len(res.purchases)

    assert bought(50.0) == 0
    assert bought(500.0) == 1


def test_the_sidecar_runs_the_same_slo_trigger_on_a_gated_pod() -> None:
    """AutoscalerLoop.step passes the scan how long each gated pod has waited and its lag estimate: with the
    classes' SLOs (as `qos-extender autoscaler` builds it) a short batch pod held by the QoS gate gets a node
    between batch cycles; without them it waits for the cycle."""
    from extender.autoscaler.loop import AutoscalerLoop
    from extender.autoscaler.view import GATED_DEMAND_SECONDS, AutoscalerSnapshot
    from extender.settings.extender import ExtenderConfig
    from tests.autoscaler_settings import make_settings

    config = ExtenderConfig()
    pod = {
        "metadata": {
            "name": "short",
            "namespace": "default",
            "uid": "u1",
            "annotations": {
                "qos.kube-qos-extender.io/kind": "batch",
                "qos.kube-qos-extender.io/runtime-seconds": "100",
                "qos.kube-qos-extender.io/class": "bronze",
            },
        },
        "spec": {
            "schedulerName": "qos-scheduler",
            "schedulingGates": [{"name": config.controller.gate_name}],
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}],
        },
        "status": {"phase": "Pending"},
    }
    settings = make_settings(flavours=htas("stable").flavours)
    slo = {n: c.slo for n, c in config.policy.classes.items()}

    def bought(with_slo: bool) -> int:
        snap = AutoscalerSnapshot(config)
        snap.replace_nodes([], "1", now=0.0)
        snap.replace_pods([pod], "1", now=0.0)
        loop = AutoscalerLoop(settings, config.node_groups, slo=slo if with_slo else None)
        loop.state.last_batch_plan = 0.0  # a batch cycle just ran: the next is 300 s away
        return len(loop.step(snap, GATED_DEMAND_SECONDS + 1.0).provision)

    assert bought(with_slo=True) == 1
    assert bought(with_slo=False) == 0
