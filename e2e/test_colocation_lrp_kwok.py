"""Filter and score use the same prediction (issue 16, deliverable 3), on the local cluster: two kwok service
nodes publish different slack, and a co-located batch pod created for qos-scheduler lands on the node LRP (cpu
0.38 / memory 0.62) ranks first over Eq. 4's predicted availability, not on the fuller one BFD would pick.

Node A runs a service of 2 cpu / 4 GiB using a quarter (lends 1500 m / 3 GiB), node B one of 1 cpu / 2 GiB using a
quarter (lends 750 m / 1.5 GiB); both 4 cpu / 8 GiB. For a pod of 500 m / 1 GiB on the slack, the predicted
availability left is 3000 m / 6 GiB on A (LRP 75) and 3250 m / 6.5 GiB on B (LRP 81): B. The QoS controller pins
the pod by that ranking (host_score profile: the prioritize verb's), the extender's filter passes B on its
published slack (node_groups.enforce on, both nodes in the service group) and binds it.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client as k8s
from prometheus_client import CollectorRegistry

from e2e.kwok_usage import IMAGE, controller_settings, fixture_model, kwok_usage_node, service_pod
from extender.colocation.controller import SlackController, SlackMetrics
from extender.core.slack import BATCH_CPU, BATCH_MEMORY, Amount
from extender.kube.client import new_api_client
from extender.kube.usage import PrometheusUsage
from extender.settings.extender import KubernetesConfig
from lab.kube_sync import Kube

pytestmark = [pytest.mark.live]

GI = 2**30


@pytest.fixture
def env() -> Iterator[tuple[Kube, str, str, str]]:
    """kwok_usage_node's node A, plus node B (same shape) removed afterwards."""
    with kwok_usage_node("colrp") as (kube, prom, rid, kubeconfig):
        a = kube.get(f"/api/v1/nodes/{rid}-node")
        b = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": f"{rid}-node-b",
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {**a["metadata"]["labels"], "kubernetes.io/hostname": f"{rid}-node-b"},
            },
            "spec": {"taints": a["spec"]["taints"]},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                       "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"}},
        }  # fmt: skip
        kube.create_node(b)
        try:
            yield kube, prom, rid, kubeconfig
        finally:
            kube.delete_node(f"{rid}-node-b")


def _small_service(node: str) -> dict[str, Any]:
    pod = copy.deepcopy(service_pod(node))
    pod["metadata"] = {
        "name": "svc-b",
        "annotations": {"kwok.x-k8s.io/usage-cpu": "250m", "kwok.x-k8s.io/usage-memory": "512Mi"},
    }
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "2Gi"}}
    return pod


def _colocated(rid: str) -> dict[str, Any]:
    want = {BATCH_CPU: "500", BATCH_MEMORY: str(GI)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "co",
            "annotations": {"qos.kube-qos-extender.io/kind": "batch", "qos.kube-qos-extender.io/class": "bronze"},
        },
        "spec": {
            "schedulerName": "qos-scheduler",
            "nodeSelector": {"e2e-run": rid},
            "tolerations": [{"key": "e2e-run", "operator": "Equal", "value": rid, "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": IMAGE, "resources": {"requests": want, "limits": want}}],
        },
    }


async def test_a_colocated_pod_lands_where_lrp_on_the_prediction_ranks_first(
    env: tuple[Kube, str, str, str], tmp_path: Path
) -> None:
    kube, prom, ns, kubeconfig = env
    a, b = f"{ns}-node", f"{ns}-node-b"
    kube.create_pod(ns, service_pod(a))
    kube.create_pod(ns, _small_service(b))
    settings = controller_settings(tmp_path / "model.json", f"e2e-run={ns}")
    want = {a: Amount(1500, 3 * GI), b: Amount(750, 3 * GI // 2)}
    api = await new_api_client(KubernetesConfig(kubeconfig=kubeconfig))
    try:
        async with aiohttp.ClientSession() as session:
            reader = PrometheusUsage(prom, session, rate_window="30s")
            ctl = SlackController(
                settings, k8s.CoreV1Api(api), reader, model=fixture_model(), metrics=SlackMetrics(CollectorRegistry())
            )
            deadline = time.monotonic() + 150
            amounts: dict[str, Amount] = {}
            while time.monotonic() < deadline:
                amounts = await ctl.step()
                if amounts == want:
                    break
                await asyncio.sleep(3)
            else:
                pytest.fail(f"both services never classified as a quarter: {amounts}")
    finally:
        await api.close()
    kube.create_pod(ns, _colocated(ns))
    pod = kube.wait(
        lambda: (p := kube.get(f"/api/v1/namespaces/{ns}/pods/co"))["spec"].get("nodeName") and p,
        "co bound by qos-scheduler",
        timeout=90,
        interval=0.5,
    )
    assert pod["spec"]["nodeName"] == b, pod["spec"].get("nodeName")
