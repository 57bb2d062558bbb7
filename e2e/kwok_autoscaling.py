"""Shared by the kwok autoscaling e2e tests (sidecar loop and externalgrpc provider): a namespace of their own
on the live cluster, and the nodes the autoscaler bought removed afterwards, whatever the test did."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from extender.autoscaler.loop import PROVISIONED_BY_LABEL
from extender.kube.client import ApiError, new_api_client, read_json
from extender.settings.extender import KubernetesConfig
from tests.live import require_kubeconfig


def burst_pod(name: str, cpu: str, memory: str, kind: str, app: str, runtime: int | None = None) -> dict[str, Any]:
    """A default-scheduler pod of node group ``kind`` (a nodeSelector stands in for the extender's group filter)
    that tolerates kwok nodes, labelled ``app`` so a test can delete its own."""
    annotations = {"qos.kube-qos-extender.io/kind": kind}
    if runtime is not None:
        annotations["qos.kube-qos-extender.io/runtime-seconds"] = str(runtime)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations, "labels": {"app": app}},
        "spec": {
            "schedulerName": "default-scheduler",
            "nodeSelector": {"qos.kube-qos-extender.io/node-group": kind},
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": cpu, "memory": memory}},
                }
            ],
        },
    }


async def until(what: str, timeout: float, check: Callable[[], Awaitable[bool]], every: float = 0.25) -> float:
    """Seconds until ``check`` holds; the test fails (never skips) after ``timeout``."""
    started = time.monotonic()
    while True:
        if await check():
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            pytest.fail(f"timed out after {timeout}s waiting for: {what}", pytrace=False)
        await asyncio.sleep(every)


async def make_namespace(core: Any, ns: str) -> None:
    """Create ``ns`` and wait for its default ServiceAccount (pods are refused until it exists)."""
    body: Any = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
    await read_json(await core.create_namespace(body, _preload_content=False))

    async def has_sa() -> bool:
        try:
            await read_json(await core.read_namespaced_service_account("default", ns, _preload_content=False))
            return True
        except ApiError:
            return False

    await until("default ServiceAccount", 30, has_sa)


@contextlib.asynccontextmanager
async def autoscaled_namespace(prefix: str) -> AsyncIterator[tuple[Any, str]]:
    """(api client, namespace) with its default ServiceAccount; on exit the namespace and every node labelled
    provisioned-by the autoscaler are deleted."""
    api = await new_api_client(KubernetesConfig(kubeconfig=require_kubeconfig()))
    core = k8s.CoreV1Api(api)
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    await make_namespace(core, ns)
    try:
        yield api, ns
    finally:
        with contextlib.suppress(ApiError):
            await read_json(await core.delete_namespace(ns, _preload_content=False))
        nodes = await read_json(await core.list_node(_preload_content=False, label_selector=PROVISIONED_BY_LABEL))
        for n in nodes.get("items", []):
            with contextlib.suppress(ApiError):
                await read_json(await core.delete_node(n["metadata"]["name"], _preload_content=False))
        await api.close()
