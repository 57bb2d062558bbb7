"""extender/kube/usage.py without a cluster: Prometheus answers (as the HTTP API documents them) -> usage,
per-pod sums, profiles, and refusals of anything malformed. The live counterpart is e2e/test_usage_kwok.py."""

from __future__ import annotations

import math

import aiohttp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.core.model import Resources
from extender.kube.usage import (
    CPU_QUERY,
    MEMORY_QUERY,
    ContainerKey,
    PrometheusUsage,
    UsageSourceError,
    UsageTrace,
    join_usage,
    parse_matrix,
    parse_vector,
    pod_traces,
    pod_usage,
    range_chunks,
    service_profiles,
)

MI = 2**20


def vector(*series: tuple[dict[str, str], list[object]]) -> dict[str, object]:
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": m, "value": v} for m, v in series]},
    }


def matrix(*series: tuple[dict[str, str], list[list[object]]]) -> dict[str, object]:
    return {
        "status": "success",
        "data": {"resultType": "matrix", "result": [{"metric": m, "values": v} for m, v in series]},
    }


def labels(pod: str, container: str = "app", ns: str = "a") -> dict[str, str]:
    return {"namespace": ns, "pod": pod, "container": container}


def test_queries_exclude_cadvisor_pseudo_containers_and_never_sum_duplicates() -> None:
    assert 'container!="POD"' in CPU_QUERY and 'container!=""' in CPU_QUERY
    assert CPU_QUERY.startswith("max by (namespace, pod, container)")
    assert MEMORY_QUERY.startswith("max by (namespace, pod, container)")


def test_instant_usage_joined_per_container_and_summed_per_pod() -> None:
    cpu = parse_vector(
        vector(
            (labels("web", "app"), [100.0, "0.25"]),
            (labels("web", "side"), [100.0, "0.05"]),
            (labels("cpu-only"), [100.0, "1"]),
            (labels("gone"), [100.0, "NaN"]),
        )
    )
    mem = parse_vector(
        vector(
            (labels("web", "app"), [100.0, "314572800"]),
            (labels("web", "side"), [100.0, "10485760"]),
            (labels("gone"), [100.0, "1"]),
        )
    )
    assert ContainerKey("a", "gone", "app") not in cpu  # NaN is "no value", not zero
    joined = join_usage(cpu, mem)
    assert sorted(k.pod for k in joined) == ["web", "web"]  # cpu-only and gone lack one resource: left out
    app = joined[ContainerKey("a", "web", "app")]
    assert (app.cpu_milli, app.memory_bytes, app.at) == (250.0, 300 * MI, 100.0)
    per_pod = pod_usage(joined.values())
    assert list(per_pod) == ["a/web"]
    assert per_pod["a/web"][0] == pytest.approx(300.0) and per_pod["a/web"][1] == 310 * MI


def test_range_traces_per_pod_keep_common_steps_only() -> None:
    traces = parse_matrix(
        matrix(
            (labels("web", "app"), [[30, "3"], [10, "1"], [20, "2"]]),  # out of order: sorted
            (labels("web", "side"), [[10, "10"], [30, "30"]]),  # no sample at 20
            (labels("db"), [[10, "5"], [20, "NaN"]]),
        )
    )
    assert traces[ContainerKey("a", "web", "app")] == UsageTrace((10.0, 20.0, 30.0), (1.0, 2.0, 3.0))
    assert traces[ContainerKey("a", "db", "app")] == UsageTrace((10.0,), (5.0,))
    pods = pod_traces(traces)
    assert pods["a/web"] == UsageTrace((10.0, 30.0), (11.0, 33.0))


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"status": "error", "errorType": "bad_data", "error": "parse error"}, "bad_data: parse error"),
        ([], "not a JSON object"),
        ({"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}}, "no vector"),
        (vector(({"pod": "x", "namespace": "a"}, [1, "1"])), "'container'"),
        (vector((labels("x"), [1])), "malformed sample"),
        (vector((labels("x"), [1, "lots"])), "malformed sample"),
        (vector((labels("x"), [1, "-1"])), "negative"),
        ({"status": "success", "data": {"resultType": "vector", "result": ["x"]}}, "without labels"),
    ],
)
def test_malformed_answers_are_refused(doc: object, message: str) -> None:
    with pytest.raises(UsageSourceError, match=message):
        parse_vector(doc)


def test_service_profiles_are_rates_of_the_request() -> None:
    t = (0.0, 900.0, 1800.0)
    cpu = {"a/web": UsageTrace(t, (100.0, 200.0, 300.0))}
    mem = {"a/web": UsageTrace(t, (256.0 * MI, 256.0 * MI, 512.0 * MI))}
    reqs = {
        "a/web": Resources(400, 512 * MI),
        "a/best-effort": Resources(0, 0),
        "a/unmeasured": Resources(100, MI),
    }
    profiles, skipped = service_profiles(cpu, mem, reqs)
    web = profiles["a/web"]
    assert web.cpu[:3].tolist() == [0.25, 0.5, 0.75]
    assert web.memory[:3].tolist() == [0.5, 0.5, 1.0]
    assert bool(np.isnan(web.cpu[3:]).all())
    assert web.observed_seconds == 1800.0
    assert set(skipped) == {"a/best-effort", "a/unmeasured"}
    assert "request" in skipped["a/best-effort"]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 10**6), st.sampled_from([1.0, 15.0, 60.0]), st.integers(1, 50))
def test_range_chunks_cover_every_step_once(start: int, length: int, step: float, max_points: int) -> None:
    end = start + length
    chunks = range_chunks(start, end, step, max_points)
    steps: list[float] = []
    for lo, hi in chunks:
        n = math.floor((hi - lo) / step) + 1
        assert n <= max_points
        steps.extend(lo + i * step for i in range(n))
    expected = [start + i * step for i in range(math.floor(length / step) + 1)]
    assert steps == pytest.approx(expected)


def test_range_chunks_bad_input() -> None:
    with pytest.raises(ValueError, match="step"):
        range_chunks(0, 10, 0)
    with pytest.raises(ValueError, match="start <= end"):
        range_chunks(10, 0, 1)


async def test_unreachable_prometheus_is_a_clear_error() -> None:
    # port 9 (discard) on localhost: nothing listens, the connection is refused at once
    async with aiohttp.ClientSession() as session:
        reader = PrometheusUsage("http://127.0.0.1:9", session, timeout=5)
        with pytest.raises(UsageSourceError, match=r"cannot query Prometheus at http://127\.0\.0\.1:9/api/v1/query"):
            await reader.current()
