"""The slack controller against a fake API server and Prometheus (aiohttp, in-process): leader terms on one
/metrics registry, the published gauges of deleted nodes, and clustering off the event loop."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client as k8s
from prometheus_client import CollectorRegistry
from sklearn.cluster import KMeans  # type: ignore[import-untyped]

from extender.colocation.controller import (
    SlackController,
    SlackMetrics,
    fit_from_prometheus,
    settings_from_config,
)
from extender.core.characterise import CharacteriseConfig
from extender.core.model import DEFAULT_CLASSES, Resources
from extender.kube.usage import PrometheusUsage
from extender.processes.serve import slack_term
from extender.settings.extender import ExtenderConfig, SlackConfig
from tests.golden.replay import node_objects

GI = 2**30


@dataclass
class Cluster:
    """What the fake API server lists, and what it was sent."""

    nodes: list[dict[str, Any]] = field(default_factory=node_objects)
    patched: list[str] = field(default_factory=list)
    on_patch: asyncio.Event | None = None  # set on every node status PATCH (ends a term after one refresh)
    usage: dict[str, float] = field(default_factory=dict)  # pod -> cpu cores, every container "c", whole range


def _app(cluster: Cluster) -> web.Application:
    async def nodes(_: web.Request) -> web.Response:
        return web.json_response({"kind": "NodeList", "items": cluster.nodes})

    async def pods(_: web.Request) -> web.Response:
        return web.json_response({"kind": "PodList", "items": []})

    async def patch(request: web.Request) -> web.Response:
        cluster.patched.append(request.match_info["name"])
        if cluster.on_patch is not None:
            cluster.on_patch.set()
        return web.json_response({"kind": "Node", "metadata": {"name": request.match_info["name"]}})

    async def query_range(request: web.Request) -> web.Response:
        start, end, step = (float(request.query[k]) for k in ("start", "end", "step"))
        times = [start + i * step for i in range(int((end - start) // step) + 1)]
        memory = "memory" in request.query["query"]
        result = [
            {
                "metric": {"namespace": "ns", "pod": pod, "container": "c"},
                "values": [[t, str(GI * cores if memory else cores)] for t in times],
            }
            for pod, cores in cluster.usage.items()
        ]
        return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": result}})

    app = web.Application()
    app.router.add_get("/api/v1/nodes", nodes)
    app.router.add_get("/api/v1/pods", pods)
    app.router.add_patch("/api/v1/nodes/{name}/status", patch)
    app.router.add_get("/api/v1/query_range", query_range)
    return app


@pytest.fixture
async def server() -> AsyncIterator[tuple[Cluster, str]]:
    cluster = Cluster()
    srv = TestServer(_app(cluster))
    await srv.start_server()
    try:
        yield cluster, str(srv.make_url("")).rstrip("/")
    finally:
        await srv.close()


def _slack(url: str, tmp_path: Path) -> SlackConfig:
    return SlackConfig(
        enabled=True,
        prometheus_url=url,
        model_path=str(tmp_path / "model.json"),
        refresh_seconds=600,
        history_seconds=3600,
        classify_seconds=86_400,
    )


def _published(registry: CollectorRegistry, node: str) -> float | None:
    return registry.get_sample_value("qos_extender_slack_published_batch_cpu_cores", {"node": node})


async def test_two_leader_terms_publish_on_one_registry(server: tuple[Cluster, str], tmp_path: Path) -> None:
    """serve runs one call per leader term on its /metrics registry: the second term (Lease lost and won
    again) must publish too, not fail on metrics the first one registered."""
    cluster, url = server
    registry = CollectorRegistry()
    api = k8s.ApiClient(configuration=k8s.Configuration(host=url))
    stop = asyncio.Event()
    cluster.on_patch = stop  # one refresh per term, then the term ends (as when the Lease is lost)
    publish = slack_term(ExtenderConfig(), _slack(url, tmp_path), api, registry, stop)
    try:
        for term in (1, 2):
            stop.clear()
            await publish()
            names = sorted(n["metadata"]["name"] for n in node_objects())
            assert sorted(cluster.patched) == sorted(names * term)  # no model yet: 0 published on every node
            assert all(_published(registry, n) == 0 for n in names)
            assert registry.get_sample_value("qos_extender_slack_refresh_failures_total") == 0
    finally:
        await api.close()


async def test_deleted_nodes_lose_their_published_series(server: tuple[Cluster, str], tmp_path: Path) -> None:
    cluster, url = server
    registry = CollectorRegistry()
    api = k8s.ApiClient(configuration=k8s.Configuration(host=url))
    try:
        async with aiohttp.ClientSession() as session:
            cfg = _slack(url, tmp_path)
            ctl = SlackController(
                settings_from_config(cfg, DEFAULT_CLASSES, ExtenderConfig().pod_defaults),
                k8s.CoreV1Api(api),
                PrometheusUsage(url, session),
                metrics=SlackMetrics(registry),
            )
            names = [n["metadata"]["name"] for n in cluster.nodes]
            assert len(names) >= 2
            assert set(await ctl.step()) == set(names)
            assert all(_published(registry, n) == 0 for n in names)
            gone = names[0]
            cluster.nodes = [n for n in cluster.nodes if n["metadata"]["name"] != gone]
            assert set(await ctl.step()) == set(names[1:])
            assert _published(registry, gone) is None
            memory = "qos_extender_slack_published_batch_memory_bytes"
            assert registry.get_sample_value(memory, {"node": gone}) is None
            assert all(_published(registry, n) == 0 for n in names[1:])
            cluster.nodes = node_objects()  # back again: published again
            await ctl.step()
            assert _published(registry, gone) == 0
    finally:
        await api.close()


async def test_fitting_runs_off_the_event_loop(server: tuple[Cluster, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """serve's event loop also answers /filter and /bind: k-means must run in a worker thread."""
    cluster, url = server
    cluster.usage = {"svc-a": 0.2, "svc-b": 0.6, "svc-c": 0.9}
    threads: list[threading.Thread] = []
    fit = KMeans.fit

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread())
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(KMeans, "fit", spy)
    requests = {f"ns/{p}": Resources(1000, 2 * GI) for p in cluster.usage}
    end = 2 * 86_400.0
    async with aiohttp.ClientSession() as session:
        model = await fit_from_prometheus(
            PrometheusUsage(url, session), requests, CharacteriseConfig(k=2, seeds=(0,)), end - 86_400, end, 300
        )
    assert not math.isnan(float(model.centres("cpu")[0][0]))
    assert threads and threading.main_thread() not in threads
