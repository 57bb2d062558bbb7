"""Consolidation (issue #8) on a real control plane with kwok nodes and the simulated agent backend.

The autoscaler sidecar (kwok provider = the local STAND-IN FOR A CLOUD API) runs with the consolidation flow
as its ``ConsolidationHandoff``. kwok nodes run no processes, so **one in-process agent per kwok node on
127.0.0.x stands in for the agent DaemonSet** (simulated backend: a pod's "progress" is its annotation
``qos.kube-qos-extender.io/progress-seconds``; mTLS with a throwaway CA made here, as tests/test_agent_tls.py
does); each node's ``qos.kube-qos-extender.io/agent-url`` annotation points at its stand-in agent.

Batch nodes (4 cpu / 8 Gi, all provisioned-by the autoscaler):
* ``under``  — two batch pods (0.25 utilised, progress 120 s and 300.5 s): emptied and deleted; its pods
  resume on another node with their progress, their source pods are gone;
* ``pinned`` — one batch pod annotated ``migratable: "false"``: stays, with its pod;
* ``svc``    — one service pod on the batch node: stays, with its pod;
* ``dest``   — 2.5 cpu of batch work (over the threshold): the destination.
Then a failure: a new under-utilised node ``flaky`` whose destination agent refuses the restore -> the
destination pod is deleted, the source keeps running with its progress, Events say why, the node is
uncordoned and left alone.

Needs KUBECONFIG (fails, never skips, without it):
    set -a; eval "$(QOS_STATE=/tmp/qos-e8 ... hack/local-up.sh)"; set +a
    pytest -m live e2e/test_consolidation_kwok.py -s
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client as k8s

from e2e.kwok_autoscaling import make_namespace
from extender.agent.backends.simulated import PROGRESS_ANNOTATION, KubeAnnotationProgressStore, SimulatedBackend
from extender.agent.client import AgentClient
from extender.agent.events import KubeEventSink
from extender.agent.server import Agent
from extender.agent.settings import AgentConfig, MigrationPolicyConfig
from extender.autoscaler.loop import PROVISIONED_BY_LABEL, PROVISIONED_BY_VALUE
from extender.autoscaler.settings import (
    AutoscalerSettings,
    MetricsSettings,
)
from extender.consolidation import policy
from extender.consolidation.flow import ConsolidationFlow
from extender.consolidation.settings import AgentEndpoint, ConsolidationSettings
from extender.core.model import Flavour, Resources
from extender.kube.client import ApiError, new_api_client, read_json
from extender.processes.sidecar import start_autoscaler
from extender.settings.extender import ExtenderConfig, KubernetesConfig
from tests.live import require_kubeconfig
from tests.test_agent_support import make_pki, serve_in_process

pytestmark = [pytest.mark.live]

GI = 2**30
FLAVOUR = Flavour("e2e.large", Resources(4000, 8 * GI, 110), 0.20)
PREFIX = "qos.kube-qos-extender.io/"


async def _until(what: str, timeout: float, check: Callable[[], Awaitable[Any]], every: float = 0.2) -> Any:
    started = time.monotonic()
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() - started > timeout:
            pytest.fail(f"timed out after {timeout}s waiting for: {what}", pytrace=False)
        await asyncio.sleep(every)


def _node(name: str, run: str, agent_url: str) -> Any:
    cap = {"cpu": "4", "memory": "8Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {
                "kwok.x-k8s.io/node": "fake",
                PREFIX + "price-per-hour": "0.2",
                policy.AGENT_URL_ANNOTATION: agent_url,
            },
            "labels": {
                "type": "kwok",
                "e2e-run": run,
                "kubernetes.io/hostname": name,
                "node.kubernetes.io/instance-type": FLAVOUR.name,
                PREFIX + "node-group": "batch",
                PROVISIONED_BY_LABEL: PROVISIONED_BY_VALUE,
            },
        },
        "spec": {},
        "status": {"allocatable": cap, "capacity": cap},
    }


def _pod(name: str, node: str, cpu: str, *, kind: str = "batch", progress: float | None = None,
         migratable: bool | None = None) -> dict[str, Any]:  # fmt: skip
    ann = {PREFIX + "kind": kind}
    if kind == "batch":
        ann[PREFIX + "runtime-seconds"] = "3600"
    if progress is not None:
        ann[PROGRESS_ANNOTATION] = repr(progress)
    if migratable is not None:
        ann[PREFIX + "migratable"] = str(migratable).lower()
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": ann, "labels": {"app": "qos-consolidation-e2e"}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": cpu, "memory": "512Mi"}},
                }
            ],
        },
    }


class World:
    def __init__(self, api: Any, ns: str, run: str) -> None:
        self.api, self.ns, self.run = api, ns, run
        self.core = k8s.CoreV1Api(api)
        self.nodes: list[str] = []

    async def pods(self) -> dict[str, dict[str, Any]]:
        items = await read_json(await self.core.list_namespaced_pod(self.ns, _preload_content=False))
        return {p["metadata"]["name"]: p for p in items["items"]}

    async def node(self, name: str) -> dict[str, Any] | None:
        try:
            got: dict[str, Any] = await read_json(await self.core.read_node(name, _preload_content=False))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return got

    async def events(self, namespace: str) -> list[dict[str, Any]]:
        items = await read_json(await self.core.list_namespaced_event(namespace, _preload_content=False))
        out: list[dict[str, Any]] = items["items"]
        return out

    async def create_pod(self, body: Any) -> None:
        await read_json(await self.core.create_namespaced_pod(self.ns, body, _preload_content=False))

    async def running(self, *names: str) -> bool:
        pods = await self.pods()
        return all(pods.get(n, {}).get("status", {}).get("phase") == "Running" for n in names)


@pytest.fixture
async def world() -> AsyncIterator[World]:
    api = await new_api_client(KubernetesConfig(kubeconfig=require_kubeconfig()))
    core = k8s.CoreV1Api(api)
    run = f"e2e-c8-{uuid.uuid4().hex[:5]}"
    await make_namespace(core, run)
    w = World(api, run, run)
    try:
        yield w
    finally:
        with contextlib.suppress(ApiError):
            await read_json(await core.delete_namespace(run, _preload_content=False))
        for n in w.nodes:
            with contextlib.suppress(ApiError):
                await read_json(await core.delete_node(n, _preload_content=False))
        await api.close()


async def test_underutilised_batch_node_is_emptied_through_the_agents_and_deleted(world: World, tmp_path: Path) -> None:
    t0 = time.monotonic()
    w, core, ns = world, world.core, world.ns
    roles = ["under", "pinned", "svc", "dest", "flaky"]
    # one certificate per stand-in agent, naming its node (CN qos-agent:<node>: extender/agent/authz.py)
    pki = make_pki(
        tmp_path / "pki",
        {**{f"agent-{i}": f"127.0.0.{i + 10}" for i in range(len(roles))}, "ctl": ""},
        {f"agent-{i}": f"qos-agent:{w.run}-{role}" for i, role in enumerate(roles)},
    )
    existing = await read_json(await core.list_node(_preload_content=False))
    assert not [n for n in existing["items"] if n["metadata"].get("labels", {}).get(PREFIX + "node-group")], (
        "start from an empty cluster: hack/local-up.sh with no node arguments"
    )
    # ---- one stand-in agent per kwok node (the DaemonSet's role), simulated backend, mTLS
    agents: dict[str, Agent] = {}
    runners: list[Any] = []
    urls: dict[str, str] = {}
    for i, role in enumerate(roles):
        name = f"{w.run}-{role}"
        host = f"127.0.0.{i + 10}"
        # the test's namespace opts in (its pods use no qos-scheduler); the agents read each pod before a checkpoint
        cfg = AgentConfig(node_name=name, host=host, tls=pki.tls(f"agent-{i}"), state_dir=str(tmp_path / role),
                          backend="simulated", simulated_store="kubernetes", test_fault_injection=True,
                          migration=MigrationPolicyConfig(namespaces=(ns,)))  # fmt: skip
        agent = Agent(cfg, SimulatedBackend(KubeAnnotationProgressStore(w.api)), events=KubeEventSink(w.api), api=w.api)
        runner, url = await serve_in_process(agent, host)
        agents[role], urls[role] = agent, url
        runners.append(runner)
    ctl = AgentClient(pki.tls("ctl"))
    try:
        # ---- nodes and pods (bound by nodeName: the e2e places them, the extender is not part of it)
        node = {role: f"{w.run}-{role}" for role in roles}
        for role in ("under", "pinned", "svc", "dest"):
            await read_json(await core.create_node(_node(node[role], w.run, urls[role]), _preload_content=False))
            w.nodes.append(node[role])
        pods = [
            _pod("job-a", node["under"], "500m", progress=120.0),
            _pod("job-b", node["under"], "500m", progress=300.5),
            _pod("job-pinned", node["pinned"], "500m", progress=10.0, migratable=False),
            _pod("web", node["svc"], "500m", kind="service"),
            _pod("big", node["dest"], "2500m", progress=5.0),
        ]
        for body in pods:
            await w.create_pod(body)
        await _until("all pods Running on kwok", 30, lambda: w.running(*(p["metadata"]["name"] for p in pods)))
        t_setup = time.monotonic() - t0

        # ---- the autoscaler with the flow as its hand-off
        config = ExtenderConfig(kubernetes=KubernetesConfig(kubeconfig=require_kubeconfig(), watch_timeout_seconds=60))
        settings = AutoscalerSettings(
            scheduler_names=("default-scheduler",),
            flavours=(FLAVOUR,),
            scan_interval_seconds=0.5,
            burst_debounce_seconds=0.2,
            batch_cycle_seconds=300.0,
            idle_seconds=3600.0,  # empty-node removal is not what is tested: only the flow deletes here
            underutil_sustain_seconds=2.0,
            batch_queue_quiet_seconds=2.0,
            metrics=MetricsSettings(port=0),
        )
        cert, key = pki.tls("ctl").cert_file, pki.tls("ctl").key_file
        flow = ConsolidationFlow(
            ConsolidationSettings(
                enabled=True,
                agent=AgentEndpoint(cert_file=cert, key_file=key, ca_file=str(pki.ca)),
                left_alone_seconds=3600.0,
            )
        )
        running = await start_autoscaler(config, settings, handoff=flow)
        await flow.start(running)
        try:
            t1 = time.monotonic()
            await _until("node 'under' deleted", 60, lambda: _gone(w, node["under"]))
            t_removed = time.monotonic() - t1
            done = [o for o in flow.outcomes if o.node == node["under"]]
            assert len(done) == 1 and done[0].removed, flow.outcomes
            moves = done[0].moves
            assert [m["outcome"] for m in moves] == ["succeeded", "succeeded"], moves
            now = await w.pods()
            assert "job-a" not in now and "job-b" not in now, "the source pods are deleted after the move"
            moved = {p["metadata"]["annotations"][policy.MIGRATED_FROM_ANNOTATION]: p for p in now.values()
                     if policy.MIGRATED_FROM_ANNOTATION in p["metadata"].get("annotations", {})}  # fmt: skip
            assert set(moved) == {f"{ns}/job-a", f"{ns}/job-b"}
            for src, want in ((f"{ns}/job-a", 120.0), (f"{ns}/job-b", 300.5)):
                p = moved[src]
                assert float(p["metadata"]["annotations"][PROGRESS_ANNOTATION]) == want, "resumes with its progress"
                assert p["spec"]["nodeName"] == node["dest"] and p["status"]["phase"] == "Running"
                assert p["spec"]["schedulerName"] == "qos-consolidation"
            # the pods that cannot move keep their nodes, which stay (and are not cordoned)
            for role, name in (("pinned", "job-pinned"), ("svc", "web")):
                n = await w.node(node[role])
                assert n is not None and not n["spec"].get("unschedulable"), role
                assert now[name]["spec"]["nodeName"] == node[role]
            assert flow.latest is not None and {node["pinned"], node["svc"]} <= set(flow.latest.candidates)
            assert all(o.node == node["under"] for o in flow.outcomes), "no plan for a node whose pod cannot move"

            # ---- a failing move: the destination agent refuses the restore
            await read_json(await core.create_node(_node(node["flaky"], w.run, urls["flaky"]), _preload_content=False))
            w.nodes.append(node["flaky"])
            for role in ("pinned", "svc", "dest"):
                await ctl.request("PUT", f"{urls[role]}/v1/test/faults", {"faults": {"destination.refuse.restore": 1}})
            await w.create_pod(_pod("job-c", node["flaky"], "500m", progress=77.0))
            await _until("job-c Running", 30, lambda: w.running("job-c"))
            t2 = time.monotonic()
            await _until(
                "a consolidation attempt on 'flaky'",
                60,
                lambda: _async([o for o in flow.outcomes if o.node == node["flaky"]]),
            )
            t_failed = time.monotonic() - t2
            failed = next(o for o in flow.outcomes if o.node == node["flaky"])
            assert not failed.removed and [m["outcome"] for m in failed.moves] == ["rolled_back"], failed
            assert "refuses restore" in failed.reason
            n = await w.node(node["flaky"])
            assert n is not None and not n["spec"].get("unschedulable"), "uncordoned"
            assert policy.CONSOLIDATION_ANNOTATION not in n["metadata"].get("annotations", {})
            # cluster-autoscaler may remove it again: the scale-down hold went with our cordon
            assert policy.SCALE_DOWN_DISABLED_ANNOTATION not in n["metadata"].get("annotations", {})
            now = await w.pods()
            c = now["job-c"]
            assert c["spec"]["nodeName"] == node["flaky"] and c["status"]["phase"] == "Running"
            assert float(c["metadata"]["annotations"][PROGRESS_ANNOTATION]) == 77.0, "the source keeps its progress"
            assert not [p for p in now.values() if p["metadata"].get("annotations", {}).get(
                policy.MIGRATED_FROM_ANNOTATION) == f"{ns}/job-c"], "the destination pod is deleted"  # fmt: skip
            await asyncio.sleep(2.0)  # left alone: not tried again while its back-off lasts
            assert len([o for o in flow.outcomes if o.node == node["flaky"]]) == 1

            async def events_said() -> Any:
                pod_ev = {(e["involvedObject"]["name"], e["reason"]) for e in await w.events(ns)}
                node_ev = {(e["involvedObject"]["name"], e["reason"]) for e in await w.events("default")}
                want_pod = {("job-c", "ConsolidationMoveRolledBack"), ("job-c", "MigrationRolledBack"),
                            ("job-a", "MigrationSucceeded")}  # fmt: skip
                want_node = {(node["under"], "ConsolidatedNodeRemoved"), (node["flaky"], "ConsolidationAborted")}
                return want_pod <= pod_ev and want_node <= node_ev

            await _until("Events on the pods and nodes", 15, events_said)

            # ---- metrics on the autoscaler's /metrics
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{running.metrics_port}/metrics") as resp,
            ):
                text = await resp.text()
            for line in (
                'qos_extender_consolidation_migrations_total{outcome="succeeded"} 2.0',
                'qos_extender_consolidation_migrations_total{outcome="rolled_back"} 1.0',
                "qos_extender_consolidation_nodes_removed_total 1.0",
                "qos_extender_consolidation_work_preserved_seconds_total 420.5",
                'qos_extender_consolidation_plans_total{result="aborted"} 1.0',
                'qos_extender_consolidation_checkpoint_seconds_count{stage="final"} 3.0',
            ):
                assert line in text, line
            assert "qos_extender_consolidation_bytes_moved_total" in text
            # the source agent keeps its own migration metrics too (qos_extender_work_preserved_seconds_total)
            assert agents["under"].metrics.work_preserved._value.get() == 420.5
            wall = time.monotonic() - t0
            per_move = [m["seconds"] for m in moves]
            print(
                f"\nconsolidation e2e: wall {wall:.1f}s (setup {t_setup:.1f}s, autoscaler start -> node deleted "
                f"{t_removed:.1f}s (sustain 2 s and quiet queue 2 s run concurrently), failing attempt "
                f"{t_failed:.1f}s); migrations "
                f"{len(moves)} succeeded + 1 rolled back; progress preserved 120.0 + 300.5 = 420.5 s; per move "
                f"{per_move} s; agent timings {[m['record']['timings'] for m in moves]}"
            )
        finally:
            await flow.stop()
            await running.stop()
    finally:
        await ctl.close()
        for r in runners:
            await r.cleanup()
        for a in agents.values():
            await a.client.close()


async def _gone(w: World, name: str) -> bool:
    return await w.node(name) is None


async def _async(value: Any) -> Any:
    return value
