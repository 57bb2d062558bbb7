"""A wrong prediction evicts the co-located batch pods in QoS order (issue 16, deliverable 3), on the local
cluster: real kube-apiserver, kube-controller-manager (disruption controller), qos-scheduler with the extender
(host process, QoS controller on), kwok and Prometheus scraping kwok's emulated usage.

A service pod (2 cpu / 4 GiB requested) uses a quarter of it; with the fixture classes of e2e/test_slack_kwok.py
its (service-group) node publishes 1500 m / 3 GiB of batch capacity, and qos-scheduler through the extender
binds two batch pods of 500 m / 1 GiB each on it: a bronze one and a gold one. The service's memory usage then
rises to 2.5 GiB (its kwok usage annotation): only 1.5 GiB is really idle for 2 GiB of batch pods. The slack
controller measures that through Prometheus and evicts the bronze pod through the Eviction API: first refused
(429) while a PodDisruptionBudget covers it, then, once the budget is gone, evicted with a Warning Event on the
pod and on the node; the gold pod keeps running, and the node publishes no more than its real slack (1.5 GiB).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client as k8s
from prometheus_client import CollectorRegistry

from e2e.kwok_usage import (
    IMAGE,
    controller_settings,
    fixture_model,
    kwok_usage_node,
    service_pod,
    until_classified,
)
from extender.colocation.controller import (
    BATCH_CPU,
    BATCH_MEMORY,
    EVICTION_REASON,
    SlackController,
    SlackMetrics,
)
from extender.core.slack import Amount
from extender.kube.client import new_api_client
from extender.kube.usage import PrometheusUsage
from extender.settings.extender import KubernetesConfig
from lab.kube_sync import Kube

pytestmark = [pytest.mark.live]

GI = 2**30


@pytest.fixture
def env() -> Iterator[tuple[Kube, str, str, str]]:
    with kwok_usage_node("coloc") as run:
        yield run


def _batch_pod(name: str, rid: str, cls: str) -> dict[str, Any]:
    want = {BATCH_CPU: "500", BATCH_MEMORY: str(GI)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app": name},
            "annotations": {"qos.kube-qos-extender.io/kind": "batch", "qos.kube-qos-extender.io/class": cls},
        },
        "spec": {
            # the product path: the qos webhook gates and marks it, the QoS controller releases it, the extender
            # filters it onto the service node's published slack (node_groups.enforce) and binds it
            "schedulerName": "qos-scheduler",
            "nodeSelector": {"e2e-run": rid},
            "tolerations": [{"key": "e2e-run", "operator": "Equal", "value": rid, "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": IMAGE, "resources": {"requests": want, "limits": want}}],
        },
    }


def _running(kube: Kube, ns: str, name: str) -> bool:
    try:
        pod = kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    except Exception:
        return False
    return pod.get("status", {}).get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    """The slack metrics, for failure messages."""
    return {
        f"{s.name}{s.labels}": s.value
        for m in registry.collect()
        for s in m.samples
        if "evictions" in s.name or "misses" in s.name or "published" in s.name
    }


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    got = registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


async def test_a_grown_service_evicts_the_bronze_batch_pod_and_keeps_the_gold_one(
    env: tuple[Kube, str, str, str], tmp_path: Path
) -> None:
    kube, prom, ns, kubeconfig = env
    node = f"{ns}-node"
    kube.create_pod(ns, service_pod(node))
    kube.wait(lambda: _running(kube, ns, "svc"), "svc Running")
    model = fixture_model()
    settings = controller_settings(tmp_path / "model.json", f"e2e-run={ns}")
    registry = CollectorRegistry()
    api = await new_api_client(KubernetesConfig(kubeconfig=kubeconfig))
    try:
        async with aiohttp.ClientSession() as session:
            reader = PrometheusUsage(prom, session, rate_window="30s")
            ctl = SlackController(settings, k8s.CoreV1Api(api), reader, model=model, metrics=SlackMetrics(registry))
            assert await ctl.start() == "given"
            amounts = await until_classified(ctl, node)
            assert amounts[node] == Amount(1500, 3 * GI)
            assert _value(registry, "qos_extender_slack_published_batch_memory_bytes", node=node) == 3 * GI

            for name, cls in (("bronze", "bronze"), ("gold", "gold")):
                kube.create_pod(ns, _batch_pod(name, ns, cls))
            kube.wait(
                lambda: _running(kube, ns, "bronze") and _running(kube, ns, "gold"),
                "both bound and Running",
                timeout=90,
            )
            await ctl.step()  # both fit: 1000 m / 2 GiB of 1500 m / 3 GiB
            misses = _value(registry, "qos_extender_slack_prediction_misses_total")
            assert ctl.evicted == [] and misses == 0, (ctl.evicted, misses)

            kube.create(
                f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
                {
                    "apiVersion": "policy/v1",
                    "kind": "PodDisruptionBudget",
                    "metadata": {"name": "keep-bronze"},
                    "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "bronze"}}},
                },
            )
            kube.request(
                "PATCH",
                f"/api/v1/namespaces/{ns}/pods/svc",
                {"metadata": {"annotations": {"kwok.x-k8s.io/usage-memory": "2560Mi"}}},
                content_type="application/merge-patch+json",
            )
            # Prometheus sees the new working set after its next scrape of kwok; the PDB refuses the eviction
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                await ctl.step()
                if _value(registry, "qos_extender_slack_evictions_total", result="pdb") > 0:
                    break
                await asyncio.sleep(2)
            else:
                pytest.fail(f"the eviction of bronze was never refused by its budget: {_samples(registry)}")
            assert ctl.evicted == [] and _running(kube, ns, "bronze") and _running(kube, ns, "gold")

            kube.request("DELETE", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/keep-bronze")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not ctl.evicted:
                amounts = await ctl.step()
                await asyncio.sleep(1)
    finally:
        await api.close()
    assert ctl.evicted == [f"{ns}/bronze"], (ctl.evicted, _samples(registry))  # 1 GiB of gold fits in 1.5 GiB
    kube.wait(lambda: not _running(kube, ns, "bronze"), "bronze gone", timeout=60)
    assert _running(kube, ns, "gold")
    assert _value(registry, "qos_extender_slack_evictions_total", result="evicted") == 1
    # The node lends no more than is really idle (4 GiB - 2.5 GiB). Which bound applies depends on the clock:
    # the service is re-classified every refresh from its profile, whose value for the current 15 min of the
    # day is the sample closest to its start; once that sample carries the new usage the service is "three
    # quarters" (predicted 1 GiB idle), before that it is still "a quarter" (3 GiB predicted, missed: the real
    # 1.5 GiB is published). Either way never the 3 GiB published before.
    real = 4 * GI - 2560 * 2**20
    assert amounts[node].memory_bytes in (real, GI), (amounts, _samples(registry))
    assert kube.get(f"/api/v1/nodes/{node}")["status"]["allocatable"][BATCH_MEMORY] == str(amounts[node].memory_bytes)

    def reason(items: list[dict[str, Any]], kind: str, name: str) -> list[str]:
        return [
            e.get("message", "")
            for e in items
            if e.get("reason") == EVICTION_REASON
            and e.get("involvedObject", {}).get("kind") == kind
            and e.get("involvedObject", {}).get("name") == name
        ]

    (pod_event,) = reason(kube.events(ns), "Pod", "bronze")
    assert f"{ns}/svc" in pod_event and f"{ns}/bronze evicted" in pod_event
    assert reason(kube.events("default"), "Node", node)
    assert not reason(kube.events(ns), "Pod", "gold")
