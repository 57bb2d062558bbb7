"""The QoS controller's preemptions under the disruption guard rails (issue 32 part 4), against a real
kube-apiserver + kube-scheduler + kwok (hack/local-up.sh): a gold pod that needs the room of a running bronze pod
(relaxation (i) of paper 002: a more important class may preempt a less important one)

1. in dry-run: the bronze pod gets an Event QosDisruptionDryRun naming the gold pod, stays Running, the gold pod
   stays gated, the metric counts it;
2. with a budget of no pod in motion: the gold pod gets an Event QosDisruptionWaiting naming the budget, nothing
   is evicted;
3. without the guard rails: bronze is evicted (QoSPreempted) and gold released, as ever.

Pods are created already gated (what the admission webhook would do). FAILS without KUBECONFIG.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from extender.kube.client import new_api_client, read_json
from extender.processes.webhook import Running, start
from extender.settings import load_settings
from extender.settings.extender import ExtenderConfig, KubernetesConfig, QosSettings
from extender.settings.sections import DisruptionSettings
from tests.live import require_kubeconfig
from tests.test_controller_live import _clean_up, _config, _eventually, _kwok_node, _pod

pytestmark = [pytest.mark.live]


def _with_guard(config: ExtenderConfig, guard: DisruptionSettings) -> ExtenderConfig:
    # no run quantum: the bronze pod may be preempted seconds after it started
    qos = QosSettings(min_run_quantum_seconds=0.0, q_hysteresis_seconds=0.0)
    # the gold pod stays gated while its preemption is held (the shared config releases a gate after 3 s)
    controller = config.controller.model_copy(update={"max_gate_seconds": 300.0})
    return config.model_copy(update={"disruption": guard, "qos": qos, "controller": controller})


async def test_dry_run_and_a_budget_hold_a_qos_preemption_and_without_them_it_goes() -> None:
    kubeconfig = require_kubeconfig()
    run = f"grd-{uuid.uuid4().hex[:6]}"
    api = await new_api_client(KubernetesConfig(kubeconfig=kubeconfig))
    core = k8s.CoreV1Api(api)
    running: Running | None = None
    try:
        await read_json(await core.create_node(_kwok_node(run, run, "1"), _preload_content=False))
        namespace = {"metadata": {"name": run, "labels": {"qos.kube-qos-extender.io/controller": run}}}
        await read_json(await core.create_namespace(namespace, _preload_content=False))
        dry = load_settings(DisruptionSettings, {"dry_run": True})
        running = await start(_with_guard(_config(kubeconfig, run, "a"), dry))

        async def get(name: str) -> dict[str, Any]:
            body: dict[str, Any] = await read_json(await core.read_namespaced_pod(name, run, _preload_content=False))
            return body

        async def events(reason: str) -> list[dict[str, Any]]:
            page = await read_json(await core.list_namespaced_event(run, _preload_content=False))
            return [e for e in page["items"] if e["reason"] == reason]

        bronze = _pod("bronze", run, "800m")
        bronze["metadata"]["annotations"]["qos.kube-qos-extender.io/class"] = "bronze"
        await read_json(await core.create_namespaced_pod(run, bronze, _preload_content=False))

        async def bronze_running() -> bool:
            p = await get("bronze")
            return not p["spec"].get("schedulingGates") and p["status"].get("phase") == "Running"

        await _eventually(bronze_running, "bronze released and Running")
        await asyncio.sleep(2.0)
        gold = _pod("gold", run, "800m")
        gold["metadata"]["annotations"]["qos.kube-qos-extender.io/class"] = "gold"
        await read_json(await core.create_namespaced_pod(run, gold, _preload_content=False))

        # ---- 1. dry-run: reported on the victim, nothing evicted, gold not released
        t0 = time.monotonic()
        reported = await _eventually(lambda: events("QosDisruptionDryRun"), "QosDisruptionDryRun on bronze")
        dry_seconds = time.monotonic() - t0
        assert reported[0]["involvedObject"]["name"] == "bronze", reported
        assert f"would evict for {run}/gold" in reported[0]["message"], reported[0]["message"]
        await asyncio.sleep(2.0)  # more passes: still nothing evicted
        assert await bronze_running() and (await get("gold"))["spec"].get("schedulingGates")
        assert not await events("QoSPreempted")
        assert running.controller is not None
        assert running.controller.metrics.disruptions.labels("preemption", "dry_run")._value.get() == 1

        # ---- 2. a budget of no pod in motion: gold waits, with the budget named
        running.controller.guard = load_settings(DisruptionSettings, {"budgets": [{"name": "frozen", "max_pods": 0}]})
        waits = await _eventually(lambda: events("QosDisruptionWaiting"), "QosDisruptionWaiting on gold")
        assert waits[0]["involvedObject"]["name"] == "gold" and "frozen" in waits[0]["message"], waits
        assert await bronze_running() and not await events("QoSPreempted")

        # ---- 3. no guard rails: preempted and released as ever
        running.controller.guard = DisruptionSettings()
        t1 = time.monotonic()
        await _eventually(lambda: events("QoSPreempted"), "bronze preempted")
        go_seconds = time.monotonic() - t1

        async def gold_released() -> bool:
            return not (await get("gold"))["spec"].get("schedulingGates")

        await _eventually(gold_released, "gold released")
        print(
            f"\ncontroller guard: dry-run reported in {dry_seconds:.2f}s; preempted {go_seconds:.2f}s after unguarded"
        )
    finally:
        await _clean_up(api, running, run, (run,))
