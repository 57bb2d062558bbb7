"""Slack withdrawn while the usage cannot be read (issue 16): a refresh failing keeps what was published, but
once Prometheus has been unreadable for longer than ``slack.stale_seconds`` every node publishes 0 (no safety
check can run without usage), and lending resumes when it answers again. Against an in-process API server and
Prometheus (aiohttp) and a controller clock the test moves."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client as k8s
from prometheus_client import CollectorRegistry

from extender.colocation.controller import BATCH_CPU, SlackController, SlackMetrics, SlackParams
from extender.core.characterise import DAY_SECONDS, CharacteriseConfig, ServiceProfile, fit_model
from extender.core.model import InvalidInputError
from extender.core.slack import Amount, usage_stale
from extender.kube.usage import UsageSourceError
from extender.settings.extender import parse_config

GI = 2**30
CFG = CharacteriseConfig(k=2, seeds=(0,), observation_seconds=20.0)
STALE = 1800.0


@dataclass
class Fake:
    down: bool = False  # every query fails
    instant: str = "ok"  # the instant query alone: "ok", "down" (503) or "empty" (no series: scrapes stopped)
    patches: list[Any] = field(default_factory=list)


def _app(fake: Fake) -> web.Application:
    node = {
        "metadata": {"name": "n1", "uid": "u-n1"},
        "spec": {},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}},
    }
    pod = {
        "metadata": {"name": "svc", "namespace": "ns", "uid": "u-svc"},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}],
        },
        "status": {"phase": "Running"},
    }

    async def nodes(_: web.Request) -> web.Response:
        return web.json_response({"kind": "NodeList", "items": [node]})

    async def pods(_: web.Request) -> web.Response:
        return web.json_response({"kind": "PodList", "items": [pod]})

    async def patch(request: web.Request) -> web.Response:
        fake.patches.append(await request.json())
        return web.json_response({"kind": "Node", "metadata": {"name": "n1"}})

    def usage(query: str) -> float:
        return GI * 1.0 if "memory" in query else 0.5  # a quarter of the request, all day

    async def query_range(request: web.Request) -> web.Response:
        if fake.down:
            return web.Response(status=503, text="Service Unavailable")
        start, end, step = (float(request.query[k]) for k in ("start", "end", "step"))
        times = [start + i * step for i in range(int((end - start) // step) + 1)]
        v = usage(request.query["query"])
        result = [
            {"metric": {"namespace": "ns", "pod": "svc", "container": "c"}, "values": [[t, str(v)] for t in times]}
        ]
        return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": result}})

    async def query(request: web.Request) -> web.Response:
        if fake.down or fake.instant == "down":
            return web.Response(status=503, text="Service Unavailable")
        v = usage(request.query["query"])
        result = [{"metric": {"namespace": "ns", "pod": "svc", "container": "c"}, "value": [time.time(), str(v)]}]
        if fake.instant == "empty":
            result = []
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})

    app = web.Application()
    app.router.add_get("/api/v1/nodes", nodes)
    app.router.add_get("/api/v1/pods", pods)
    app.router.add_patch("/api/v1/nodes/{name}/status", patch)
    app.router.add_get("/api/v1/query_range", query_range)
    app.router.add_get("/api/v1/query", query)
    return app


@pytest.fixture
async def server() -> AsyncIterator[tuple[Fake, str]]:
    fake = Fake()
    srv = TestServer(_app(fake))
    await srv.start_server()
    try:
        yield fake, str(srv.make_url("")).rstrip("/")
    finally:
        await srv.close()


def _published_cpu(fake: Fake) -> str:
    """The batch-cpu value of the last status patch."""
    ops = fake.patches[-1]
    values = [op["value"] for op in ops if op["path"].endswith(BATCH_CPU.replace("/", "~1"))]
    assert values, ops
    return str(values[-1])


def _model(now: float) -> Any:
    return fit_model(
        CFG,
        {
            "fixture/quarter": ServiceProfile(np.full(CFG.slots, 0.25), np.full(CFG.slots, 0.25), DAY_SECONDS),
            "fixture/three-quarters": ServiceProfile(np.full(CFG.slots, 0.75), np.full(CFG.slots, 0.75), DAY_SECONDS),
        },
        now=now,
    )


@pytest.mark.parametrize("instant", ["down", "empty"])
async def test_slack_is_withdrawn_when_only_the_instant_reading_is_stale(
    server: tuple[Fake, str], tmp_path: Path, instant: str
) -> None:
    """The range query keeps answering (old samples stay in its window long after the scrapes stop), but the
    instant reading the safety check needs fails or no longer has the service: past stale_seconds the slack
    is withdrawn all the same, and lent again once the instant reading measures the service."""
    from extender.kube.usage import PrometheusUsage

    fake, url = server
    now = [time.time()]
    settings = SlackParams(
        model_path=tmp_path / "model.json", config=CFG, history_seconds=600.0, classify_seconds=600.0,
        step_seconds=30.0, stale_seconds=STALE,
    )  # fmt: skip
    registry = CollectorRegistry()
    api = k8s.ApiClient(configuration=k8s.Configuration(host=url))
    try:
        async with aiohttp.ClientSession() as session:
            ctl = SlackController(
                settings, k8s.CoreV1Api(api), PrometheusUsage(url, session), model=_model(now[0]),
                clock=lambda: now[0], metrics=SlackMetrics(registry),
            )  # fmt: skip
            assert (await ctl.step())["n1"] == Amount(1500, 3 * GI)
            fake.instant = instant
            now[0] += STALE - 1  # a missed reading, not stale yet: the service counts as its prediction
            assert (await ctl.step())["n1"] == Amount(1500, 3 * GI)
            assert registry.get_sample_value("qos_extender_slack_withdrawn") == 0
            now[0] += 2  # STALE + 1 s since the instant reading last measured the service
            assert (await ctl.step())["n1"] == Amount(0, 0)
            assert _published_cpu(fake) == "0"
            assert registry.get_sample_value("qos_extender_slack_withdrawn") == 1
            fake.instant = "ok"
            now[0] += 30
            assert (await ctl.step())["n1"] == Amount(1500, 3 * GI)
            assert registry.get_sample_value("qos_extender_slack_withdrawn") == 0
    finally:
        await api.close()


async def test_slack_is_withdrawn_after_the_staleness_and_lent_again(server: tuple[Fake, str], tmp_path: Path) -> None:
    from extender.kube.usage import PrometheusUsage

    fake, url = server
    now = [time.time()]
    model = fit_model(
        CFG,
        {
            "fixture/quarter": ServiceProfile(np.full(CFG.slots, 0.25), np.full(CFG.slots, 0.25), DAY_SECONDS),
            "fixture/three-quarters": ServiceProfile(np.full(CFG.slots, 0.75), np.full(CFG.slots, 0.75), DAY_SECONDS),
        },
        now=now[0],
    )
    settings = SlackParams(
        model_path=tmp_path / "model.json",
        config=CFG,
        history_seconds=600.0,
        classify_seconds=600.0,
        step_seconds=30.0,
        stale_seconds=STALE,
    )
    registry = CollectorRegistry()
    api = k8s.ApiClient(configuration=k8s.Configuration(host=url))
    try:
        async with aiohttp.ClientSession() as session:
            ctl = SlackController(
                settings,
                k8s.CoreV1Api(api),
                PrometheusUsage(url, session),
                model=model,
                clock=lambda: now[0],
                metrics=SlackMetrics(registry),
            )
            assert (await ctl.step())["n1"] == Amount(1500, 3 * GI)
            assert _published_cpu(fake) == "1500"
            patches = len(fake.patches)

            fake.down = True
            now[0] += STALE - 1  # unreadable, not stale yet: the refresh fails, the published values stay
            with pytest.raises(UsageSourceError):
                await ctl.step()
            assert len(fake.patches) == patches
            assert registry.get_sample_value("qos_extender_slack_withdrawn") == 0

            now[0] += 2  # STALE + 1 s since the last read
            assert (await ctl.step())["n1"] == Amount(0, 0)
            assert _published_cpu(fake) == "0"
            assert registry.get_sample_value("qos_extender_slack_withdrawn") == 1
            assert registry.get_sample_value("qos_extender_slack_published_batch_cpu_cores", {"node": "n1"}) == 0

            fake.down = False
            now[0] += 30
            assert (await ctl.step())["n1"] == Amount(1500, 3 * GI)
            assert _published_cpu(fake) == "1500"
            assert registry.get_sample_value("qos_extender_slack_withdrawn") == 0
            assert registry.get_sample_value("qos_extender_slack_published_batch_cpu_cores", {"node": "n1"}) == 1.5
    finally:
        await api.close()


def test_usage_stale_rule() -> None:
    assert not usage_stale(100.0, 100.0 + STALE, STALE)  # exactly the staleness: still fresh
    assert usage_stale(100.0, 100.0 + STALE + 0.001, STALE)
    for bad in ((0.0, 1.0, 0.0), (0.0, float("nan"), 1.0), (True, 1.0, 1.0)):
        with pytest.raises(InvalidInputError):
            usage_stale(*bad)


def test_stale_seconds_is_configurable_and_checked() -> None:
    assert parse_config({}).slack.stale_seconds == 1800.0
    assert parse_config({"slack": {"stale_seconds": 60}}).slack.stale_seconds == 60.0
    with pytest.raises(ValueError, match=r"slack\.stale_seconds"):
        parse_config({"slack": {"stale_seconds": 0}})
