"""`qos-extender autoscaler` with the kwok provider against a real control plane (hack/local-up.sh).

An empty cluster gets a burst of batch and service pods (schedulerName default-scheduler: the extender is not
part of this cluster; a nodeSelector on the node-group label stands in for the extender's group filter). The
real kube-scheduler marks them Unschedulable; the sidecar plans with extender/core/autoscale and the kwok
provider -- the local STAND-IN FOR A CLOUD API -- creates kwok Nodes after a sampled lag; kwok makes them
Ready and runs the pods. Checked: pods are unschedulable first, then all run; nodes of at least two flavours
appeared; no pod was bought a node twice and a pod arriving while nodes boot rides on the room of a
provisioning node; a pod larger than every flavour gets an Event and no node; idle nodes go away after the
(short) idle period; plan metrics and Events exist.

Needs KUBECONFIG (fails, never skips, without it). Run:
    set -a; eval "$(QOS_STATE=/tmp/qos-as ... hack/local-up.sh)"; set +a
    pytest -m live e2e/test_autoscaler_kwok.py
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client as k8s

from e2e.kwok_autoscaling import autoscaled_namespace, burst_pod
from e2e.kwok_autoscaling import until as _until
from extender.autoscaler.loop import PROVISIONED_BY_LABEL, Decisions
from extender.autoscaler.settings import (
    AutoscalerSettings,
    KwokSettings,
    LagDistribution,
    LagSettings,
    MetricsSettings,
)
from extender.core.model import Flavour, Resources
from extender.kube.client import read_json
from extender.processes.sidecar import RunningAutoscaler, start_autoscaler
from extender.settings.extender import ExtenderConfig, KubernetesConfig
from tests.live import require_kubeconfig

pytestmark = [pytest.mark.live]

GI = 2**30
FLAVOURS = (
    Flavour("e2e.std", Resources(2000, 4 * GI, 110), 0.10),
    Flavour("e2e.cpu", Resources(4000, 4 * GI, 110), 0.16),
    Flavour("e2e.mem", Resources(1000, 8 * GI, 110), 0.12),
)
IDLE = 8.0


def _pod(name: str, cpu: str, memory: str, kind: str, runtime: int | None = None) -> dict[str, Any]:
    return burst_pod(name, cpu, memory, kind, "qos-as-e2e", runtime)


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[Any, str]]:
    async with autoscaled_namespace("qos-as-e2e") as c:
        yield c


async def test_burst_scale_up_ledger_and_idle_scale_down(cluster: tuple[Any, str]) -> None:
    api, ns = cluster
    core = k8s.CoreV1Api(api)
    t0 = time.monotonic()
    existing = await read_json(await core.list_node(_preload_content=False))
    assert not [n for n in existing["items"] if PROVISIONED_BY_LABEL in n["metadata"].get("labels", {})]
    # the cluster must have no node a burst pod could use, so the pods are truly unschedulable first
    usable = [
        n
        for n in existing["items"]
        if n["metadata"].get("labels", {}).get("qos.kube-qos-extender.io/node-group") in ("batch", "service")
    ]
    assert not usable, "start from an empty cluster: hack/local-up.sh with no node arguments"

    config = ExtenderConfig(kubernetes=KubernetesConfig(kubeconfig=require_kubeconfig(), watch_timeout_seconds=60))
    settings = AutoscalerSettings(
        scheduler_names=("default-scheduler",),
        flavours=FLAVOURS,
        scan_interval_seconds=1.0,
        burst_debounce_seconds=0.5,
        batch_cycle_seconds=5.0,
        idle_seconds=IDLE,
        provisioning_timeout_seconds=60.0,
        underutil_sustain_seconds=600.0,
        batch_queue_quiet_seconds=600.0,
        lag=LagSettings(default_seconds=5.0),
        metrics=MetricsSettings(port=0),
        kwok=KwokSettings(lag=LagDistribution(distribution="uniform", seconds=4.0, minimum=3.0, maximum=5.0, seed=7)),
    )
    running: RunningAutoscaler = await start_autoscaler(config, settings)
    decisions: list[Decisions] = []
    step = running.loop.step

    def recording_step(snap: Any, now: float) -> Decisions:
        d = step(snap, now)
        decisions.append(d)
        return d

    running.loop.step = recording_step  # type: ignore[method-assign]
    try:
        await _until("first scan", 30, lambda: _scanned(running))
        # ---- the burst: 4 cpu-heavy batch pods, 3 memory-heavy service pods, 1 pod no flavour can hold
        burst = [_pod(f"job-{i}", "1500m", "512Mi", "batch", runtime=3600) for i in range(4)]
        burst += [_pod(f"svc-{i}", "300m", "2500Mi", "service") for i in range(3)]
        huge = _pod("huge", "64", "1Gi", "service")
        for body in [*burst, huge]:
            await read_json(await core.create_namespaced_pod(ns, body, _preload_content=False))
        names = [b["metadata"]["name"] for b in burst]

        async def all_unschedulable() -> bool:
            pods = await _pods(core, ns)
            return all(_unschedulable(pods.get(n)) for n in names)

        await _until("every burst pod Unschedulable (no node can take it)", 30, all_unschedulable)
        t_unsched = time.monotonic() - t0
        await _until("a scale-up plan", 30, lambda: _planned(decisions))
        first = next(d for d in decisions if d.provision)
        t_plan = time.monotonic() - t0
        # ---- while the nodes boot: a small pod that fits the room of a provisioning node
        await read_json(
            await core.create_namespaced_pod(ns, _pod("late", "50m", "64Mi", "service"), _preload_content=False)
        )
        names.append("late")

        async def all_running() -> bool:
            pods = await _pods(core, ns)
            return all(pods.get(n, {}).get("status", {}).get("phase") == "Running" for n in names)

        await _until("every pod Running", 90, all_running, every=0.5)
        t_running = time.monotonic() - t0

        requests = [r for d in decisions for r in d.provision]
        keys = [k for r in requests for k in r.pods]
        assert len(keys) == len(set(keys)), f"a pod was bought a node twice: {keys}"
        assert f"{ns}/late" not in keys, "the late pod should ride on a provisioning node's room"
        assert f"{ns}/huge" not in keys
        flavours = {r.flavour.name for r in requests}
        assert len(flavours) >= 2, f"expected a heterogeneous plan, got {flavours}"
        nodes = await read_json(await core.list_node(_preload_content=False, label_selector=PROVISIONED_BY_LABEL))
        created = {n["metadata"]["name"]: n for n in nodes["items"]}
        assert set(created) == {r.name for r in requests}
        assert {n["metadata"]["labels"]["node.kubernetes.io/instance-type"] for n in created.values()} == flavours
        pods = await _pods(core, ns)
        assert pods["huge"]["spec"].get("nodeName") is None
        lags = [lag for d in decisions for _, lag in d.arrived]
        assert len(lags) == len(requests) and all(2.0 <= lag <= 8.0 for lag in lags), lags

        # ---- Events and metrics
        events = await read_json(await core.list_namespaced_event(ns, _preload_content=False))
        reasons = {(e["involvedObject"]["name"], e["reason"]) for e in events["items"]}
        assert ("huge", "NotServableByAnyFlavour") in reasons
        assert all((n, "TriggeredScaleUp") in reasons for n in names if n != "late")
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{running.metrics_port}/metrics") as resp,
        ):
            text = await resp.text()
        for metric in (
            "qos_extender_autoscaler_plan_cost_dollars_per_hour",
            "qos_extender_autoscaler_planned_nodes_total",
            "qos_extender_autoscaler_forecast_shortage_cpu_cores",
            "qos_extender_autoscaler_acquisition_lag_seconds_bucket",
            "qos_extender_autoscaler_unservable_pods 1.0",
        ):
            assert metric in text, metric

        # ---- scale-down: pods go, the nodes are idle, then removed after the idle period
        await read_json(
            await core.delete_collection_namespaced_pod(ns, _preload_content=False, label_selector="app=qos-as-e2e")
        )
        t_deleted = time.monotonic()

        async def nodes_gone() -> bool:
            left = await read_json(await core.list_node(_preload_content=False, label_selector=PROVISIONED_BY_LABEL))
            return not left["items"]

        await _until("idle nodes removed", IDLE + 30, nodes_gone, every=0.5)
        t_gone = time.monotonic() - t_deleted
        assert t_gone >= IDLE - 1.0, f"nodes removed after {t_gone:.1f}s, before the {IDLE}s idle period"
        print(
            f"\ne2e timing: unschedulable {t_unsched:.1f}s, plan {t_plan:.1f}s, all Running {t_running:.1f}s, "
            f"nodes {len(requests)} ({sorted(flavours)}), first plan {dict(first.plans[0].flavour_counts)}, "
            f"lags {[round(x, 1) for x in lags]}, idle removal {t_gone:.1f}s after the pods went"
        )
    finally:
        await running.stop()


async def _scanned(running: RunningAutoscaler) -> bool:
    return running.scans > 0


async def _planned(decisions: list[Decisions]) -> bool:
    return any(d.provision for d in decisions)


async def _pods(core: Any, ns: str) -> dict[str, Any]:
    items = await read_json(await core.list_namespaced_pod(ns, _preload_content=False))
    return {p["metadata"]["name"]: p for p in items["items"]}


def _unschedulable(pod: Any) -> bool:
    if pod is None or pod.get("spec", {}).get("nodeName"):
        return False
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return cond.get("reason") == "Unschedulable"
    return False
