"""The autoscaler sidecar's scan on Snapshot objects built from Kubernetes JSON (no API server, no mocks)."""

from __future__ import annotations

from typing import Any

import pytest

from extender.autoscaler.handoff import RecordingHandoff
from extender.autoscaler.loop import PROVISIONED_BY_LABEL, PROVISIONED_BY_VALUE, AutoscalerLoop, Decisions
from extender.autoscaler.providers.kwok import node_manifest
from extender.autoscaler.settings import AutoscalerSettings
from extender.autoscaler.view import GATED_DEMAND_SECONDS, AutoscalerSnapshot
from extender.core import autoscale
from extender.core.model import Flavour, NodeGroup, Resources
from extender.settings.extender import ExtenderConfig
from tests.autoscaler_settings import make_settings

GI = 2**30
SMALL = Flavour("s.small", Resources(2000, 4 * GI, 110), 0.10)
LARGE = Flavour("s.large", Resources(8000, 16 * GI, 110), 0.36)
HIMEM = Flavour("s.himem", Resources(2000, 16 * GI, 110), 0.20)
CATALOGUE = (SMALL, LARGE, HIMEM)
CONFIG = ExtenderConfig()


def settings(**kw: Any) -> AutoscalerSettings:
    base: dict[str, Any] = {
        "scheduler_names": ("qos-scheduler",),
        "flavours": CATALOGUE,
        "batch_cycle_seconds": 300.0,
        "idle_seconds": 300.0,
        "provisioning_timeout_seconds": 600.0,
        "underutil_sustain_seconds": 60.0,
        "batch_queue_quiet_seconds": 60.0,
    }
    return make_settings(**{**base, **kw})


def counter() -> Any:
    n = iter(range(10**6))
    return lambda: f"{next(n):04d}"


def pod(
    name: str,
    cpu: str = "1",
    memory: str = "1Gi",
    *,
    kind: str = "service",
    runtime: float | None = None,
    node: str | None = None,
    unschedulable: bool = True,
    scheduler: str = "qos-scheduler",
    started: str | None = None,
) -> dict[str, Any]:
    annotations = {"qos.kube-qos-extender.io/kind": kind}
    if runtime is not None:
        annotations["qos.kube-qos-extender.io/runtime-seconds"] = str(runtime)
    status: dict[str, Any] = {"phase": "Running" if node else "Pending"}
    if node is None and unschedulable:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    if started:
        status["startTime"] = started
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": annotations},
        "spec": {
            "schedulerName": scheduler,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
            "nodeName": node,
        },
        "status": status,
    }


def node(name: str, flavour: Flavour, group: str, *, owned: bool = True, created: str | None = None) -> dict[str, Any]:
    labels = {"qos.kube-qos-extender.io/node-group": group, "node.kubernetes.io/instance-type": flavour.name}
    if owned:
        labels[PROVISIONED_BY_LABEL] = PROVISIONED_BY_VALUE
    cap = flavour.capacity
    res = {"cpu": f"{cap.cpu_milli}m", "memory": str(cap.memory_bytes), "pods": str(cap.pods)}
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if created:
        meta["creationTimestamp"] = created
    return {"metadata": meta, "spec": {}, "status": {"allocatable": res, "capacity": res}}


def snap(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> AutoscalerSnapshot:
    s = AutoscalerSnapshot(CONFIG)
    s.replace_nodes(nodes, "1", now=0.0)
    s.replace_pods(pods, "1", now=0.0)
    return s


def loop(**kw: Any) -> AutoscalerLoop:
    return AutoscalerLoop(settings(**kw), CONFIG.node_groups, name_suffix=counter())


def joined(d: Decisions, s: AutoscalerSnapshot, created: str | None = None) -> None:
    """The provider delivered every requested node (the shape the kwok provider creates)."""
    for request in d.provision:
        manifest = node_manifest(request)
        if created:
            manifest["metadata"]["creationTimestamp"] = created
        s.apply_node("ADDED", manifest)


# --------------------------------------------------------------------------------------------- scale-up


def test_mixed_burst_plans_both_groups_with_the_core_planner() -> None:
    pods = [pod(f"svc-{i}", "500m", "3Gi") for i in range(6)] + [
        pod(f"job-{i}", "1500m", "1Gi", kind="batch", runtime=600) for i in range(5)
    ]
    s = snap([], pods)
    lp = loop()
    d = lp.step(s, now=1000.0)
    groups = {r.group for r in d.provision}
    assert groups == {NodeGroup.SERVICE, NodeGroup.BATCH}
    # exactly what the core planner says for each group (the sidecar adds no policy of its own)
    svc = [p for p in s.unschedulable_pods(["qos-scheduler"]) if p.name.startswith("svc")]
    job = [p for p in s.unschedulable_pods(["qos-scheduler"]) if p.name.startswith("job")]
    expect_svc = autoscale.plan_pods(svc, list(CATALOGUE), autoscale.ScoreWeights())
    expect_job = autoscale.plan_batch(job, [], list(CATALOGUE), autoscale.ScoreWeights(), 1000.0, 300.0)
    got = {g: sorted(r.flavour.name for r in d.provision if r.group is g) for g in NodeGroup}
    assert got[NodeGroup.SERVICE] == sorted(f.name for f, _ in expect_svc.nodes)
    assert got[NodeGroup.BATCH] == sorted(f.name for f, _ in expect_job.nodes)
    plans = {p.group: p for p in d.plans}
    assert plans[NodeGroup.SERVICE].cost_per_hour == pytest.approx(expect_svc.cost_per_hour)
    # every pod is covered exactly once; labels put each node in its group
    covered = [k for r in d.provision for k in r.pods]
    assert sorted(covered) == sorted(f"default/{p['metadata']['name']}" for p in pods)
    for r in d.provision:
        assert r.labels["qos.kube-qos-extender.io/node-group"] == r.group.value
        assert r.labels["node.kubernetes.io/instance-type"] == r.flavour.name
    assert {n.reason for n in d.notices} == {"TriggeredScaleUp"}


def test_ledger_no_second_node_for_covered_pods_then_arrival_measures_lag() -> None:
    s = snap([], [pod("a", "500m", "1Gi"), pod("b", "500m", "1Gi")])
    lp = loop()
    d1 = lp.step(s, now=1000.0)
    assert len(d1.provision) == 1
    for t in (1010.0, 1020.0, 1030.0):
        assert lp.step(s, now=t).provision == []
    # a third pod arrives that fits the room left on the provisioning node: still covered (paper 003 Alg. 7)
    s.apply_pod("ADDED", pod("c", "100m", "100Mi"))
    assert lp.step(s, now=1040.0).provision == []
    joined(d1, s, created="1970-01-01T00:17:25Z")  # 1045 s
    d2 = lp.step(s, now=1050.0)
    assert d2.arrived == [(d1.provision[0].name, 45.0)]
    assert lp.lag_estimate() == 45.0
    assert lp.ledger.entries == ()
    # the scheduler has not placed them yet, but they fit the new node: nothing is bought
    assert d2.provision == []


def test_provisioning_timeout_forgets_the_node_with_an_event_and_replans() -> None:
    s = snap([], [pod("a")])
    lp = loop(provisioning_timeout_seconds=100.0)
    d1 = lp.step(s, now=0.0)
    assert lp.step(s, now=100.0).cancel == []
    d2 = lp.step(s, now=100.5)
    assert [e.node_name for e in d2.cancel] == [d1.provision[0].name]
    reasons = [(n.kind, n.reason) for n in d2.notices]
    assert ("Node", "ProvisioningTimedOut") in reasons and ("Pod", "ProvisioningTimedOut") in reasons
    assert len(d2.provision) == 1 and d2.provision[0].name != d1.provision[0].name


def test_only_unschedulable_pods_of_our_profiles_fitting_no_node_are_planned() -> None:
    s = snap(
        [node("n1", SMALL, "service", owned=False)],
        [
            pod("fits-existing", "1", "1Gi"),
            pod("other-scheduler", "1", "8Gi", scheduler="default-scheduler"),
            pod("not-tried-yet", "1", "8Gi", unschedulable=False),
            pod("needs-node", "1", "8Gi"),
        ],
    )
    d = loop().step(s, now=0.0)
    assert [k for r in d.provision for k in r.pods] == ["default/needs-node"]
    assert d.unschedulable[NodeGroup.SERVICE] == 1
    d2 = loop(scheduler_names=("qos-scheduler", "default-scheduler")).step(s, now=0.0)
    assert sorted(k for r in d2.provision for k in r.pods) == ["default/needs-node", "default/other-scheduler"]


def test_pods_the_qos_controller_keeps_gated_become_demand_after_a_while() -> None:
    """kube-scheduler never tries a gated pod, so it is never Unschedulable: a pod the controller could not place
    (no room even by QoS preemption) is demand once held GATED_DEMAND_SECONDS; other gates are not ours."""
    held = pod("held", "1", "8Gi", unschedulable=False)
    held["spec"]["schedulingGates"] = [{"name": CONFIG.controller.gate_name}]
    foreign = pod("foreign", "1", "8Gi", unschedulable=False)
    foreign["spec"]["schedulingGates"] = [{"name": "example.com/other"}]
    s = AutoscalerSnapshot(CONFIG)
    s.replace_nodes([node("n1", SMALL, "service", owned=False)], "1", now=100.0)
    s.apply_pod("ADDED", held, now=100.0)
    s.apply_pod("ADDED", foreign, now=100.0)
    assert loop().step(s, now=100.0 + GATED_DEMAND_SECONDS - 1).provision == []
    # a later event for the same gated pod keeps the first time it was seen gated
    s.apply_pod("MODIFIED", held, now=100.0 + GATED_DEMAND_SECONDS - 0.5)
    d = loop().step(s, now=100.0 + GATED_DEMAND_SECONDS)
    assert [k for r in d.provision for k in r.pods] == ["default/held"]
    # released (gate removed) and not yet tried by the scheduler: no longer demand
    released = pod("held", "1", "8Gi", unschedulable=False)
    s.apply_pod("MODIFIED", released, now=200.0)
    assert loop().step(s, now=300.0).provision == []


# ------------------------------------------------------------------------------------------ batch group


def test_batch_zero_bin_capacity_is_deducted_first() -> None:
    # a batch node whose only pod finishes within the cycle: a pending batch pod waits for it, nothing bought
    running = pod("old", "2", "3Gi", kind="batch", runtime=100, node="b1", started="1970-01-01T00:16:40Z")
    s = snap([node("b1", SMALL, "batch", owned=False)], [running, pod("new", "2", "3Gi", kind="batch", runtime=60)])
    d = loop().step(s, now=1010.0)
    assert d.provision == [] and d.uncovered[NodeGroup.BATCH] == 1
    # the same node with a long-running batch pod is in bin >= 1: a node is bought
    long = pod("old", "2", "3Gi", kind="batch", runtime=5000, node="b1", started="1970-01-01T00:16:40Z")
    s2 = snap([node("b1", SMALL, "batch", owned=False)], [long, pod("new", "2", "3Gi", kind="batch", runtime=60)])
    assert len(loop().step(s2, now=1010.0).provision) == 1


def test_batch_waits_for_the_cycle_unless_burst() -> None:
    s = snap([], [pod("j1", "1", "1Gi", kind="batch", runtime=60)])
    lp = loop(batch_cycle_seconds=300.0, provisioning_timeout_seconds=10_000.0)
    assert len(lp.step(s, now=0.0).provision) == 1
    s.apply_pod("ADDED", pod("j2", "2", "16Gi", kind="batch", runtime=60))  # fits no room on the s.small
    assert lp.step(s, now=10.0).provision == []  # not due, not a burst (fits the largest flavour)
    assert len(lp.step(s, now=300.0).provision) == 1  # due
    for i in range(3):  # a burst: more than the largest flavour holds -> planned at once
        s.apply_pod("ADDED", pod(f"burst-{i}", "4", "10Gi", kind="batch", runtime=60))
    assert len(lp.step(s, now=310.0).provision) >= 2


# ------------------------------------------------------------------------------------------- bad input


def test_planned_nodes_keep_room_for_the_daemonset_pods_every_node_carries() -> None:
    """Bought by the sidecar itself (kwok provider) a node carries the DaemonSet pods too: a pod of exactly a small
    flavour's memory does not fit one beside them (on kind: a t3.xsmall bought three times for a 1 GiB pod and
    its route DaemonSet's 16 MiB, then ScaleUpGaveUp, issue 31). The plan leaves the most DaemonSet requests any
    node carries; the node requested is the catalogue's flavour, whole."""
    exact = pod("exact", "1", "4Gi")  # SMALL's memory exactly
    assert [r.flavour.name for r in loop().step(snap([], [exact]), now=0.0).provision] == [SMALL.name]
    ds = pod("routes-x", "5m", "16Mi", node="n1", unschedulable=False)
    ds["metadata"]["ownerReferences"] = [{"kind": "DaemonSet", "name": "routes", "uid": "d1", "controller": True}]
    busy = pod("busy", "8", "16Gi", node="n1", unschedulable=False)  # n1 (a LARGE) is full
    d = loop().step(snap([node("n1", LARGE, "service", owned=False)], [exact, ds, busy]), now=0.0)
    assert [r.flavour for r in d.provision] == [HIMEM], "the next cheapest flavour holding 4 GiB + 16 MiB, whole"


def test_pod_larger_than_every_flavour_gets_one_event_and_never_a_node() -> None:
    s = snap([], [pod("huge", "64", "1Gi"), pod("ok", "1", "1Gi")])
    lp = loop()
    decisions = [lp.step(s, now=float(t)) for t in range(0, 700, 30)]
    bought = [r for d in decisions for r in d.provision]
    assert [k for r in bought for k in r.pods] == ["default/ok"] or all("default/huge" not in r.pods for r in bought)
    assert all("default/huge" not in r.pods for r in bought)
    unservable = [n for d in decisions for n in d.notices if n.reason == "NotServableByAnyFlavour"]
    assert len(unservable) == 1 and unservable[0].name == "huge" and unservable[0].warning
    assert "fit no flavour" in unservable[0].message
    assert all(d.unservable == 1 for d in decisions)


def test_flavour_too_small_for_any_pod_is_never_bought_and_the_loop_converges() -> None:
    tiny = Flavour("tiny", Resources(250, GI // 4, 110), 0.001)  # cheapest by far, holds none of the pods
    lp = loop(flavours=(tiny, LARGE))
    s = snap([], [pod(f"p{i}", "1", "2Gi") for i in range(6)])
    d = lp.step(s, now=0.0)
    assert d.provision and all(r.flavour.name == "s.large" for r in d.provision)
    joined(d, s)
    for t in range(10, 200, 10):
        assert lp.step(s, now=float(t)).provision == []


def test_a_pod_that_never_schedules_stops_after_max_attempts() -> None:
    s = snap([], [pod("stuck", "1", "1Gi")])
    lp = loop(max_attempts_per_pod=2)
    bought = 0
    gave_up = []
    for t in range(0, 1000, 10):
        d = lp.step(s, now=float(t))
        bought += len(d.provision)
        gave_up += [n for n in d.notices if n.reason == "ScaleUpGaveUp"]
        for r in d.provision:  # the node joins, but is full (something the planner does not model took it)
            s.apply_node("ADDED", node_manifest(r))
            s.apply_pod("ADDED", pod(f"filler-{r.name}", "2", "4Gi", node=r.name))
    assert bought == 2 and len(gave_up) == 1


def test_limits_cap_one_scan() -> None:
    s = snap([], [pod(f"p{i}", "2", "4Gi") for i in range(10)])
    lp = loop(flavours=(SMALL,), max_nodes_per_cycle=3, max_nodes=5)
    d = lp.step(s, now=0.0)
    assert len(d.provision) == 3 and d.limited
    assert len(lp.step(s, now=1.0).provision) == 2
    assert lp.step(s, now=2.0).provision == []


# ------------------------------------------------------------------------------------------ scale-down


def test_empty_owned_nodes_go_after_the_idle_period_others_never() -> None:
    s = snap([node("mine", SMALL, "service"), node("static", SMALL, "service", owned=False)], [])
    lp = loop(idle_seconds=60.0)
    assert lp.step(s, now=0.0).delete == []
    assert lp.step(s, now=59.0).delete == []
    d = lp.step(s, now=60.0)
    assert d.delete == ["mine"] and [n.reason for n in d.notices] == ["ScaleDownEmpty"]
    assert lp.step(s, now=61.0).delete == []  # asked once
    # a pod on a node restarts its idle clock
    s2 = snap([node("busy", SMALL, "service")], [pod("x", node="busy")])
    lp2 = loop(idle_seconds=60.0)
    lp2.step(s2, now=0.0)
    s2.apply_pod("DELETED", pod("x", node="busy"))
    assert lp2.step(s2, now=100.0).delete == []  # first seen empty now
    assert lp2.step(s2, now=159.0).delete == []
    assert lp2.step(s2, now=160.0).delete == ["busy"]


def test_underutilised_batch_nodes_are_handed_off_never_evicted() -> None:
    pods = [
        pod("small-1", "200m", "256Mi", kind="batch", runtime=9000, node="b1", started="1970-01-01T00:00:00Z"),
        pod("small-2", "200m", "256Mi", kind="batch", runtime=9000, node="b2", started="1970-01-01T00:00:00Z"),
    ]
    s = snap([node("b1", SMALL, "batch"), node("b2", SMALL, "batch")], pods)
    lp = loop(underutil_sustain_seconds=60.0, batch_queue_quiet_seconds=30.0)
    handoff = RecordingHandoff()
    for t in (0.0, 30.0, 59.0):
        d = lp.step(s, now=t)
        assert d.consolidation is not None and d.consolidation.candidates == ()
        handoff.handoff(d.consolidation)
    d = lp.step(s, now=61.0)
    assert d.consolidation is not None
    handoff.handoff(d.consolidation)
    assert set(d.consolidation.candidates) == {"b1", "b2"}
    assert len(d.consolidation.plans) == 1  # one node can be emptied into the other
    assert handoff.latest is d.consolidation
    assert d.delete == [] and d.provision == []
    assert sorted(n.name for n in d.notices if n.reason == "UnderutilizedBatchNode") == ["b1", "b2"]
    # a pending batch pod resets the quiet period: no hand-off
    s.apply_pod("ADDED", pod("waiting", "1", "1Gi", kind="batch", runtime=10, unschedulable=False))
    d = lp.step(s, now=62.0)
    assert d.consolidation is not None and d.consolidation.candidates == ()


# -------------------------------------------------------------------------------------------- forecast


def test_forecast_uses_running_batch_runtimes_and_measured_lag() -> None:
    # b1 (2 cpu) runs a batch pod with 50 s left; 2 cpu of batch work is pending
    running = pod("r", "2", "1Gi", kind="batch", runtime=100, node="b1", started="1970-01-01T00:00:00Z")
    s = snap([node("b1", SMALL, "batch", owned=False)], [running, pod("p", "2", "1Gi", kind="batch", runtime=10)])
    short_lag = loop(lag_default_seconds=10.0).step(s, now=50.0)
    assert short_lag.forecast.cpu_milli == 2000  # r still runs at now + 10 s
    long_lag = loop(lag_default_seconds=120.0).step(s, now=50.0)
    assert long_lag.forecast.cpu_milli == 0  # r has released its cpu by now + 120 s
    assert long_lag.lag_estimate == 120.0
