"""Predicted slack published as extended resources that kube-scheduler honours (issue 16, deliverables 2-3).

A service pod on a kwok node uses (as kwok emulates and Prometheus scrapes) a quarter of what it requests. It
is classified from that measured usage against a model with two classes, "a quarter all day" and "three
quarters all day" (a fixture model: the live cluster has no day of history to fit one from, so the *classes* are
given and everything else is measured). extender.colocation.controller.SlackController lists the node and its pods,
reads the usage, classifies the service once observed for p, and writes the node's reclaimable capacity (Eq. 3:
request minus the class's peak) as qos.kube-qos-extender.io/batch-cpu / batch-memory into the node status; the
stock default-scheduler then binds a batch pod that requests them, and leaves a second one Pending for lack of
them. Without a model (no file, no day of history) the same controller publishes 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client as k8s

from e2e.kwok_usage import (
    IMAGE,
    controller_settings,
    fixture_model,
    kwok_usage_node,
    service_pod,
    until_classified,
)
from extender.colocation.controller import BATCH_CPU, BATCH_MEMORY, SlackController
from extender.core.characterise import OwnLevel
from extender.core.slack import Amount
from extender.kube.client import new_api_client
from extender.kube.usage import PrometheusUsage
from extender.settings.extender import KubernetesConfig
from lab.kube_sync import Kube

pytestmark = [pytest.mark.live]

GI = 2**30


@pytest.fixture
def env() -> Iterator[tuple[Kube, str, str, str]]:
    with kwok_usage_node("slack") as run:
        yield run


def _batch_pod(name: str, rid: str, cpu_milli: int, memory: int) -> dict[str, Any]:
    want = {BATCH_CPU: str(cpu_milli), BATCH_MEMORY: str(memory)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"qos.kube-qos-extender.io/kind": "batch"}},
        "spec": {
            "nodeSelector": {"e2e-run": rid},
            "tolerations": [{"key": "e2e-run", "operator": "Equal", "value": rid, "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": IMAGE, "resources": {"requests": want, "limits": want}}],
        },
    }


async def test_published_slack_admits_a_batch_pod_and_no_more(env: tuple[Kube, str, str, str], tmp_path: Path) -> None:
    kube, prom, ns, kubeconfig = env
    node = f"{ns}-node"
    kube.create_pod(ns, service_pod(node))
    kube.wait(lambda: kube.pods(ns) and kube.pods(ns)[0].get("status", {}).get("phase") == "Running", "svc Running")

    given = fixture_model()
    settings = controller_settings(tmp_path / "model.json", f"e2e-run={ns}")
    api = await new_api_client(KubernetesConfig(kubeconfig=kubeconfig))
    try:
        async with aiohttp.ClientSession() as session:
            reader = PrometheusUsage(prom, session, rate_window="30s")
            core = k8s.CoreV1Api(api)
            # no model file and no service with a whole day of usage: no model, nothing lent
            bare = SlackController(settings, core, reader)
            assert await bare.start() == "none"
            assert await bare.step() == {node: Amount(0, 0)}
            assert kube.get(f"/api/v1/nodes/{node}")["status"]["allocatable"][BATCH_CPU] == "0"

            ctl = SlackController(settings, core, reader, model=given)
            assert await ctl.start() == "given"
            amounts = await until_classified(ctl, node)  # svc observed for p (20 s) through Prometheus
            assert await ctl.publisher.publish({node: kube.get(f"/api/v1/nodes/{node}")["status"]}, amounts) == {
                node: "unchanged"
            }
    finally:
        await api.close()
    # classified "a quarter" from its measured usage -> Eq. 3: 2000 m - ceil(2000 x 0.25) and 4 Gi x 0.75
    assert amounts == {node: Amount(2000 - math.ceil(2000 * 0.25), 3 * GI)}
    status = kube.get(f"/api/v1/nodes/{node}")["status"]
    for part in ("capacity", "allocatable"):
        assert status[part][BATCH_CPU] == "1500"
        assert status[part][BATCH_MEMORY] == str(3 * GI)

    kube.create_pod(ns, _batch_pod("batch-1", ns, 1000, 2 * GI))
    kube.wait(
        lambda: kube.get(f"/api/v1/namespaces/{ns}/pods/batch-1")["spec"].get("nodeName") == node, "batch-1 bound"
    )
    kube.create_pod(ns, _batch_pod("batch-2", ns, 1000, 2 * GI))  # 1000 + 1000 > 1500 published

    def refused() -> bool:
        events = kube.events(ns)
        return any(
            e.get("reason") == "FailedScheduling"
            and e.get("involvedObject", {}).get("name") == "batch-2"
            and f"Insufficient {BATCH_CPU}" in e.get("message", "")
            for e in events
        )

    kube.wait(refused, "batch-2 refused for lack of batch-cpu", timeout=60)
    assert not kube.get(f"/api/v1/namespaces/{ns}/pods/batch-2")["spec"].get("nodeName")
    # kwok's heartbeats kept what was published
    assert kube.get(f"/api/v1/nodes/{node}")["status"]["allocatable"][BATCH_CPU] == "1500"


async def test_own_level_lends_what_a_service_above_its_class_leaves(
    env: tuple[Kube, str, str, str], tmp_path: Path
) -> None:
    """``slack.own_level`` as shipped (issue 33 part 4), through the real API server and Prometheus: svc uses
    0.28125 of its request (562m, 1.125 GiB: kwok's emulated usage), nearest the "a quarter" class, and within
    the safety check's 5 % miss tolerance of it, so Eq. 3 alone would publish 1500m / 3 GiB and nothing would
    correct it until a batch pod were evicted. With the own level the node publishes the class's prediction
    moved by the service's own median residual: memory 4 GiB - 1.125 GiB to the byte (its working set does not
    move: no spread, no margin), CPU below Eq. 3's 1500m by the ~62m svc uses above its class (less the pooled
    margin of the rate's jitter)."""
    kube, prom, ns, kubeconfig = env
    node = f"{ns}-node"
    pod = service_pod(node)
    pod["metadata"]["annotations"] = {"kwok.x-k8s.io/usage-cpu": "562m", "kwok.x-k8s.io/usage-memory": str(9 * GI // 8)}
    kube.create_pod(ns, pod)
    kube.wait(lambda: kube.pods(ns) and kube.pods(ns)[0].get("status", {}).get("phase") == "Running", "svc Running")

    settings = dataclasses.replace(controller_settings(tmp_path / "model.json", f"e2e-run={ns}"), own_level=OwnLevel())
    api = await new_api_client(KubernetesConfig(kubeconfig=kubeconfig))
    try:
        async with aiohttp.ClientSession() as session:
            ctl = SlackController(settings, k8s.CoreV1Api(api), PrometheusUsage(prom, session, rate_window="30s"),
                                  model=fixture_model())  # fmt: skip
            assert await ctl.start() == "given"
            await until_classified(ctl, node)
            # a rate window more of samples: the first rates read a window svc was not in all along
            for _ in range(12):
                await asyncio.sleep(3)
                amounts = await ctl.step()
    finally:
        await api.close()
    got = amounts[node]
    assert got.memory_bytes == 4 * GI - 9 * GI // 8, got
    # below Eq. 3's 1500m by at least part of the ~62m level correction, and held back by no more than the level
    # plus one pooled sd of the 30 s rate's sample-to-sample jitter: that sd was 40-68m on the CI machine (68m,
    # got 1370, with the host loaded at stop 42), so 150m leaves room for a loaded host while an unpooled or
    # doubled margin (or the 3/4 class: 500m) still fails
    assert 2000 - 562 - 150 <= got.cpu_milli < 1500 - 30, got
    status = kube.get(f"/api/v1/nodes/{node}")["status"]
    assert status["allocatable"][BATCH_MEMORY] == str(got.memory_bytes)
    assert status["allocatable"][BATCH_CPU] == str(got.cpu_milli)
