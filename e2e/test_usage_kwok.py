"""Usage from a real source (issue 16, deliverable 2): kwok emulates a known usage for pods on a kwok node, the
local Prometheus scrapes kwok's emulated kubelet /metrics/resource (hack/kwok-usage.yaml, local-up's
``kwok-resource`` job), and extender.kube.usage reads it back — the numbers declared, and nothing for a pod
whose usage nobody declared.

Needs only KUBECONFIG and PROMETHEUS_URL from hack/local-up.sh (QOS_KWOK_USAGE=1, the default): the reader does
not involve the extender, so this test does not either.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import numpy as np
import pytest

from e2e.kwok_usage import IMAGE, kwok_usage_node
from extender.core.model import Resources
from extender.kube.usage import ContainerKey, PrometheusUsage, pod_traces, pod_usage, service_profiles
from lab.kube_sync import Kube

pytestmark = [pytest.mark.live]

MI = 2**20


@pytest.fixture
def env() -> Iterator[tuple[Kube, str, str]]:
    with kwok_usage_node("usage") as (kube, prom, rid, _):
        yield kube, prom, rid


def _pod(name: str, node: str, containers: list[str], usage: tuple[str, str] | None) -> dict[str, Any]:
    ann = {"kwok.x-k8s.io/usage-cpu": usage[0], "kwok.x-k8s.io/usage-memory": usage[1]} if usage else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": ann},
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": c, "image": IMAGE, "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}
                for c in containers
            ],
        },
    }


async def test_reader_returns_the_usage_kwok_emulates(env: tuple[Kube, str, str]) -> None:
    kube, prom, ns = env
    node = f"{ns}-node"
    kube.create_pod(ns, _pod("web", node, ["app", "sidecar"], ("250m", "300Mi")))
    kube.create_pod(ns, _pod("big", node, ["app"], ("1", "1Gi")))
    kube.create_pod(ns, _pod("silent", node, ["app"], None))  # nobody declared its usage
    kube.wait(
        lambda: sum(p.get("status", {}).get("phase") == "Running" for p in kube.pods(ns)) == 3,
        "pods Running on the kwok node",
        timeout=60,
    )
    started = time.time()

    async with aiohttp.ClientSession() as session:
        # a 30-s rate window over 10-s scrapes: settled once a full window of samples exists
        reader = PrometheusUsage(prom, session, rate_window="30s")
        deadline = time.monotonic() + 150
        mine: dict[ContainerKey, Any] = {}
        while time.monotonic() < deadline:
            mine = {k: u for k, u in (await reader.current()).items() if k.namespace == ns}
            web = mine.get(ContainerKey(ns, "web", "app"))
            big = mine.get(ContainerKey(ns, "big", "app"))
            if len(mine) == 3 and web and big and abs(web.cpu_milli - 250) < 5 and abs(big.cpu_milli - 1000) < 20:
                break
            await asyncio.sleep(2)
        else:
            pytest.fail(f"usage never settled on what kwok emulates; last read: {mine}")

        assert sorted(mine) == [
            ContainerKey(ns, "big", "app"),
            ContainerKey(ns, "web", "app"),
            ContainerKey(ns, "web", "sidecar"),
        ]
        for c in ("app", "sidecar"):
            u = mine[ContainerKey(ns, "web", c)]
            assert u.memory_bytes == 300 * MI  # a gauge: exactly the declared quantity
            assert u.cpu_milli == pytest.approx(250, rel=0.02)  # rate() of kwok's integrated counter
        assert mine[ContainerKey(ns, "big", "app")].memory_bytes == 1024 * MI
        per_pod = pod_usage(mine.values())
        assert per_pod[f"{ns}/web"][1] == 600 * MI
        assert f"{ns}/silent" not in per_pod  # no series for undeclared usage: nothing invented

        cpu, mem = await reader.history(started, time.time(), 10.0)
    mem_pods = pod_traces({k: v for k, v in mem.items() if k.namespace == ns})
    cpu_pods = pod_traces({k: v for k, v in cpu.items() if k.namespace == ns})
    assert set(mem_pods) == {f"{ns}/web", f"{ns}/big"}
    assert set(mem_pods[f"{ns}/web"].values) == {600.0 * MI}
    requests = {
        f"{ns}/web": Resources(1000, 1024 * MI),
        f"{ns}/big": Resources(500, 512 * MI),
        f"{ns}/silent": Resources(500, 512 * MI),
    }
    profiles, skipped = service_profiles(cpu_pods, mem_pods, requests)
    assert skipped == {f"{ns}/silent": "no usage measured for it"}
    # web uses 600 Mi of the 1 Gi it requested, in whichever interval of the day this ran
    web_memory = profiles[f"{ns}/web"].memory
    seen = web_memory[np.isfinite(web_memory)]
    assert list(seen) and all(v == pytest.approx(600 / 1024) for v in seen)
    assert profiles[f"{ns}/big"].observed_seconds > 0
