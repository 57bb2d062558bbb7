"""The QoS controller's World built from a real TrackingSnapshot fed Kubernetes objects (no cluster: nothing
the pass calls goes to the API server; the client points at a closed port)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from prometheus_client import CollectorRegistry

from extender.controller.accounting import ACCOUNT_ANNOTATION
from extender.controller.loop import QosController
from extender.controller.metrics import ControllerMetrics
from extender.controller.state import TrackingSnapshot
from extender.settings.extender import ExtenderConfig

CONFIG = ExtenderConfig()
GROUP = "qos.kube-qos-extender.io/node-group"
KIND = "qos.kube-qos-extender.io/kind"


def node(name: str, group: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {GROUP: group}},
        "spec": {},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}},
    }


def gated_pod(name: str, kind: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "labels": {KIND: kind}},
        "spec": {
            "schedulerName": CONFIG.controller.scheduler_name,
            "schedulingGates": [{"name": CONFIG.controller.gate_name}],
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}],
        },
        "status": {"phase": "Pending"},
    }


@pytest.fixture
async def api() -> AsyncIterator[Any]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = k8s.ApiClient(configuration=k8s.Configuration(host=f"http://127.0.0.1:{port}"))
    yield client
    await client.close()


async def test_gated_pods_of_one_node_group_share_one_eligible_set_per_pass(api: Any) -> None:
    """The eligible nodes of a pod depend only on its node groups: the union is built once per distinct group
    set in a pass (thousands of gated pods x hundreds of nodes were one set copy per pod), with the same
    content as before."""
    snap = TrackingSnapshot(CONFIG, ACCOUNT_ANNOTATION)
    nodes = [node(f"s{i}", "service") for i in range(3)] + [node(f"b{i}", "batch") for i in range(2)]
    snap.replace_nodes(nodes, "1", now=0.0)
    pods = [gated_pod(f"svc{i}", "service") for i in range(4)] + [gated_pod(f"bat{i}", "batch") for i in range(3)]
    snap.replace_pods(pods, "1", now=0.0)
    ctl = QosController(api, snap, CONFIG, ControllerMetrics(CollectorRegistry()))
    world = ctl.world(10.0)
    by_name = {g.pod.name: g.eligible_nodes for g in world.gated}
    assert set(by_name) == {f"svc{i}" for i in range(4)} | {f"bat{i}" for i in range(3)}
    services = [by_name[f"svc{i}"] for i in range(4)]
    batches = [by_name[f"bat{i}"] for i in range(3)]
    assert services[0] == frozenset({"s0", "s1", "s2"})
    assert batches[0] == frozenset({"b0", "b1"})
    assert all(s is services[0] for s in services), "one set per group set and pass, not one per pod"
    assert all(b is batches[0] for b in batches)
    # a new pass builds its own (nodes may have changed between passes)
    snap.replace_nodes([*nodes, node("s3", "service")], "2", now=1.0)
    again = {g.pod.name: g.eligible_nodes for g in ctl.world(11.0).gated}
    assert again["svc0"] == frozenset({"s0", "s1", "s2", "s3"})
    assert again["svc0"] is again["svc3"]
