"""The ProvisioningRequest provider against a real kube-apiserver (the CRD of cluster-autoscaler 1.35.2 installed):
what it writes, what it reads back after a restart, what it does with CA's verdicts and with a request it cannot
create. CA's side (buying for the requests) is e2e/test_cluster_autoscaler.py with the real CA; here CA's
``Failed`` condition is written by the test, as CA writes it, to check our reaction. Needs KUBECONFIG (fails,
never skips)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from e2e.ca_support import apply_provisioning_request_crd
from e2e.kwok_autoscaling import autoscaled_namespace
from extender.autoscaler.loop import Notice, ProvisionRequest
from extender.autoscaler.metrics import AutoscalerMetrics
from extender.autoscaler.providers.provisioning_request import (
    CONSUME_ANNOTATION,
    GROUP,
    PLURAL,
    VERSION,
    ProvisioningRequestProvider,
)
from extender.core.model import Flavour, NodeGroup, Resources
from extender.kube.client import read_json

pytestmark = [pytest.mark.live]

GI = 2**30
SMALL = Flavour("s.small", Resources(2000, 4 * GI, 110), 0.10)
LABELS = {"qos.kube-qos-extender.io/node-group": "batch", "node.kubernetes.io/instance-type": "s.small"}


class Collected:
    """An Events sink that keeps what it is given (the provider's Events are the subject here)."""

    def __init__(self) -> None:
        self.notices: list[Notice] = []

    def emit(self, notice: Notice) -> None:
        self.notices.append(notice)


@pytest.fixture
async def api() -> AsyncIterator[tuple[Any, str]]:
    apply_provisioning_request_crd()
    async with autoscaled_namespace("provreq") as c:  # its own namespace, removed afterwards
        yield c


def _gated_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulingGates": [{"name": "example.com/held-by-this-test"}],
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }


async def _requests(custom: Any, ns: str) -> list[dict[str, Any]]:
    got = await read_json(
        await custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _preload_content=False)
    )
    items: list[dict[str, Any]] = got["items"]
    return items


async def test_requests_are_written_adopted_after_a_restart_and_deleted_once_fulfilled(api: tuple[Any, str]) -> None:
    client, ns = api
    core, custom = k8s.CoreV1Api(client), k8s.CustomObjectsApi(client)
    for name in ("a", "b"):
        await read_json(await core.create_namespaced_pod(ns, _gated_pod(name), _preload_content=False))
    metrics = AutoscalerMetrics()
    provider = ProvisioningRequestProvider(client, ns, metrics=metrics, clock=lambda: 1000.0)
    nodes = [
        ProvisionRequest("n0", SMALL, NodeGroup.BATCH, LABELS, (f"{ns}/a",), Resources(1500, GI, 1)),
        ProvisionRequest("n1", SMALL, NodeGroup.BATCH, LABELS, (f"{ns}/b",), Resources(700, 2 * GI, 1)),
    ]
    await provider.create_all(nodes)
    (req,) = await _requests(custom, ns)
    assert [s["count"] for s in req["spec"]["podSets"]] == [1, 1]
    assert req["spec"]["provisioningClassName"] == "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
    templates = await read_json(await core.list_namespaced_pod_template(ns, _preload_content=False))
    shapes = sorted(t["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] for t in templates["items"])
    assert shapes == ["1500m", "700m"]  # the API server kept each planned node's demand
    for name in ("a", "b"):
        pod = await read_json(await core.read_namespaced_pod(name, ns, _preload_content=False))
        assert pod["metadata"]["annotations"][CONSUME_ANNOTATION] == req["metadata"]["name"]

    # a restarted sidecar reads the request back from the cluster (its plan annotation)
    again = ProvisioningRequestProvider(client, ns, clock=lambda: 1001.0)
    adopted = await again.sync()
    assert sorted((g, f, n, t, p) for g, f, n, t, p in adopted) == [
        (NodeGroup.BATCH, "s.small", "n0", 1000.0, (f"{ns}/a",)),
        (NodeGroup.BATCH, "s.small", "n1", 1000.0, (f"{ns}/b",)),
    ]
    assert await again.sync() == []  # adopted once

    # fulfilled node by node: the request goes with its last planned node, templates too
    await again.fulfilled(["n0"])
    assert len(await _requests(custom, ns)) == 1
    await again.fulfilled(["n1"])
    assert await _requests(custom, ns) == []
    left = await read_json(await core.list_namespaced_pod_template(ns, _preload_content=False))
    assert left["items"] == []
    text = metrics.exposition().decode()
    assert 'provisioning_request_nodes_total{flavour="s.small",group="batch",outcome="created"} 2.0' in text


async def test_a_request_ca_failed_is_withdrawn_and_planned_again_with_an_event(api: tuple[Any, str]) -> None:
    client, ns = api
    custom = k8s.CustomObjectsApi(client)
    events = Collected()
    provider = ProvisioningRequestProvider(client, ns, events=events)
    await provider.create_all(
        [ProvisionRequest("n0", SMALL, NodeGroup.BATCH, LABELS, (f"{ns}/gone",), Resources(1, 1, 1))]
    )
    (req,) = await _requests(custom, ns)
    name = req["metadata"]["name"]
    # CA's verdict, as CA writes it (status subresource)
    status = {"status": {"conditions": [{
        "type": "Failed", "status": "True", "reason": "CapacityIsNotFound", "message": "no node group fits",
        "lastTransitionTime": "2026-11-25T00:00:00Z", "observedGeneration": 1,
    }]}}  # fmt: skip
    await read_json(
        await custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, ns, PLURAL, name, status, _preload_content=False,
            _content_type="application/merge-patch+json",
        )
    )  # fmt: skip
    assert await provider.sync() == []
    assert provider.drain_failed() == ["n0"]
    assert await _requests(custom, ns) == []
    (notice,) = events.notices
    assert notice.reason == "ProvisioningRequestFailed" and "no node group fits" in notice.message and notice.warning


async def test_a_request_that_cannot_be_created_leaves_nothing_and_says_why(api: tuple[Any, str]) -> None:
    client, ns = api
    core, custom = k8s.CoreV1Api(client), k8s.CustomObjectsApi(client)
    events = Collected()
    missing = f"{ns}-missing"  # the templates' namespace does not exist: the API refuses
    provider = ProvisioningRequestProvider(client, missing, events=events)
    await provider.create_all(
        [ProvisionRequest("n0", SMALL, NodeGroup.BATCH, LABELS, (f"{ns}/p",), Resources(1, 1, 1))]
    )
    assert provider.drain_not_created() == ["n0"] and provider.drain_failed() == []
    assert provider.history == [] and provider.requests == {}
    (notice,) = events.notices
    assert notice.reason == "ProvisioningRequestNotCreated" and "404" in notice.message
    assert await _requests(custom, ns) == []
    left = await read_json(await core.list_namespaced_pod_template(ns, _preload_content=False))
    assert left["items"] == []
