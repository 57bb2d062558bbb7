"""The simulated backend against a real kube-apiserver: progress in pod annotations, Events on the pods.

Needs KUBECONFIG pointing at a reachable API server (hack/local-up.sh prints KUBECONFIG=...). Without it the
tests FAIL, on purpose (as tests/test_webhook_live.py): a skipped live test proves nothing. Marked ``live``.
Pods use a schedulerName nobody serves: they stay pending, only their annotations matter.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from extender.agent.backends.simulated import (
    PROGRESS_ANNOTATION,
    STOPPED_ANNOTATION,
    KubeAnnotationProgressStore,
    SimulatedBackend,
)
from extender.agent.client import AgentClient
from extender.agent.events import KubeEventSink
from extender.agent.server import Agent
from extender.agent.settings import AgentConfig, MigrationPolicyConfig
from extender.kube.client import new_api_client
from extender.settings.extender import KubernetesConfig
from tests.live import require_kubeconfig
from tests.test_agent_support import Pki, make_pki, serve_in_process

pytestmark = [pytest.mark.live]


@pytest.fixture
async def api() -> AsyncIterator[Any]:
    client = await new_api_client(KubernetesConfig(kubeconfig=require_kubeconfig()))
    yield client
    await client.close()


@pytest.fixture
async def namespace(api: Any) -> AsyncIterator[str]:
    core = k8s.CoreV1Api(api)
    ns = f"qos-agent-live-{uuid.uuid4().hex[:6]}"
    await core.create_namespace({"metadata": {"name": ns}})
    yield ns
    await core.delete_namespace(ns)


async def _pod(core: Any, ns: str, name: str, annotations: dict[str, str]) -> None:
    body = {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"schedulerName": "qos-live-nobody", "containers": [{"name": "c", "image": "busybox"}]},
    }
    for _ in range(100):  # the namespace's default ServiceAccount appears shortly after the namespace
        try:
            await core.create_namespaced_pod(ns, body)
            return
        except ApiException as exc:
            if exc.status != 403 or "serviceaccount" not in str(exc.body):
                raise
            await asyncio.sleep(0.1)
    raise AssertionError("default ServiceAccount never appeared")


async def _annotations(core: Any, ns: str, name: str) -> dict[str, str]:
    pod = await core.read_namespaced_pod(name, ns)
    return dict(pod.metadata.annotations or {})


async def _events(core: Any, ns: str, pod: str) -> list[Any]:
    for _ in range(50):
        evs = await core.list_namespaced_event(ns, field_selector=f"involvedObject.name={pod}")
        if evs.items:
            return list(evs.items)
        await asyncio.sleep(0.1)
    return []


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(
        tmp_path_factory.mktemp("pki"),
        {"agent-a": "127.0.0.1", "agent-b": "127.0.0.2", "ctl": ""},
        {"agent-a": "qos-agent:kwok-a", "agent-b": "qos-agent:kwok-b"},
    )


async def test_simulated_migration_through_pod_annotations_with_events(
    api: Any, namespace: str, pki: Pki, tmp_path: Path
) -> None:
    core = k8s.CoreV1Api(api)
    await _pod(core, namespace, "job-src", {PROGRESS_ANNOTATION: "1234.5"})
    await _pod(core, namespace, "job-dst", {})
    await _pod(core, namespace, "job2-src", {PROGRESS_ANNOTATION: "77.0"})
    agents = []
    runners = []
    ctl = AgentClient(pki.tls("ctl"))
    try:
        urls = []
        for name, host, cert in (("kwok-a", "127.0.0.1", "agent-a"), ("kwok-b", "127.0.0.2", "agent-b")):
            cfg = AgentConfig(node_name=name, host=host, tls=pki.tls(cert), state_dir=str(tmp_path / name),
                              backend="simulated", simulated_store="kubernetes", test_fault_injection=True,
                              migration=MigrationPolicyConfig(check_pods=False))  # fmt: skip
            agent = Agent(cfg, SimulatedBackend(KubeAnnotationProgressStore(api)), events=KubeEventSink(api))
            runner, url = await serve_in_process(agent, host)
            agents.append(agent)
            runners.append(runner)
            urls.append(url)
        a, b = urls

        body = {
            "id": "live-1",
            "workload": {"namespace": namespace, "pod": "job-src"},
            "destination": {"url": b, "node": "kwok-b", "workload": {"namespace": namespace, "pod": "job-dst"}},
        }
        rec = await ctl.request("POST", f"{a}/v1/migrations", body)
        assert rec["outcome"] == "succeeded", rec
        dst = await _annotations(core, namespace, "job-dst")
        assert float(dst[PROGRESS_ANNOTATION]) == 1234.5, "the migrated pod resumes where it stopped"
        assert STOPPED_ANNOTATION not in dst
        src = await _annotations(core, namespace, "job-src")
        assert PROGRESS_ANNOTATION not in src and src[STOPPED_ANNOTATION] == "true"
        evs = await _events(core, namespace, "job-src")
        assert [(e.reason, e.type) for e in evs] == [("MigrationSucceeded", "Normal")]

        # refused restore: rolled back, the source keeps its progress and runs again; a Warning Event says why
        await ctl.request("PUT", f"{b}/v1/test/faults", {"faults": {"destination.refuse.restore": 1}})
        body = {
            "id": "live-2",
            "workload": {"namespace": namespace, "pod": "job2-src"},
            "destination": {"url": b, "node": "kwok-b"},
        }
        rec = await ctl.request("POST", f"{a}/v1/migrations", body)
        assert rec["outcome"] == "rolled_back" and "refuses restore" in rec["reason"]
        src2 = await _annotations(core, namespace, "job2-src")
        assert float(src2[PROGRESS_ANNOTATION]) == 77.0 and STOPPED_ANNOTATION not in src2
        evs = await _events(core, namespace, "job2-src")
        assert [(e.reason, e.type) for e in evs] == [("MigrationRolledBack", "Warning")]
        assert "refuses restore" in evs[0].message
    finally:
        await ctl.close()
        for r in runners:
            await r.cleanup()
        for ag in agents:
            await ag.client.close()
