"""Per-container usage from Prometheus, as the characterisation of paper 004 needs it (issue 16, deliverable 2).

Where the numbers come from: the kubelet's resource metrics, scraped by Prometheus. A real kubelet exports
``container_cpu_usage_seconds_total`` (a counter of core-seconds) and ``container_memory_working_set_bytes`` at
``/metrics/resource`` (and cAdvisor at ``/metrics/cadvisor``, same names and labels); on the local cluster kwok
serves the same two series for its fake nodes from the usage declared on each pod (hack/kwok-usage.yaml,
scraped by hack/local-up.sh's ``kwok-resource`` job). The reader does not know or care which: one query serves
real and kwok nodes alike, and a container nobody measures has no series, so no number is ever made up here.

The queries take the *max* over series of one container: a cluster that scrapes both cAdvisor and the resource
endpoint has two series per container with the same value, which a sum would double. ``container=""`` (the
pod cgroup) and ``container="POD"`` (the sandbox) are cAdvisor's extra series, not containers.

Pure parts (parsing, joining, per-pod sums, profiles) are functions; :class:`PrometheusUsage` is the thin
HTTP shell around the ``/api/v1/query`` and ``/api/v1/query_range`` endpoints.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np

from extender.core.characterise import ServiceProfile, daily_profile
from extender.core.model import Resources

__all__ = [
    "CPU_QUERY",
    "MEMORY_QUERY",
    "ContainerKey",
    "ContainerUsage",
    "PrometheusUsage",
    "UsageSourceError",
    "UsageTrace",
    "join_usage",
    "parse_matrix",
    "parse_vector",
    "pod_traces",
    "pod_usage",
    "range_chunks",
    "service_profiles",
]

_SELECTOR = '{container!="",container!="POD"}'
# {window} is the rate window; Prometheus needs at least two scrapes inside it.
CPU_QUERY = "max by (namespace, pod, container) (rate(container_cpu_usage_seconds_total" + _SELECTOR + "[{window}]))"
MEMORY_QUERY = "max by (namespace, pod, container) (container_memory_working_set_bytes" + _SELECTOR + ")"
# Prometheus refuses a range query of more than 11,000 points per series; stay below it.
MAX_POINTS = 10_000


class UsageSourceError(RuntimeError):
    """Prometheus could not be asked, or answered something that is not the expected usage."""


@dataclass(frozen=True, slots=True, order=True)
class ContainerKey:
    namespace: str
    pod: str
    container: str

    @property
    def pod_key(self) -> str:
        """``namespace/name``, the core model's ``Pod.key``."""
        return f"{self.namespace}/{self.pod}"


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    """One container's usage at ``at`` (seconds since the epoch): cpu in millicores, memory in bytes."""

    key: ContainerKey
    at: float
    cpu_milli: float
    memory_bytes: float


@dataclass(frozen=True, slots=True)
class UsageTrace:
    """Samples of one quantity, times ascending (seconds since the epoch)."""

    times: tuple[float, ...]
    values: tuple[float, ...]


# --------------------------------------------------------------------------------------------------------
# pure: the answers of the Prometheus HTTP API
# --------------------------------------------------------------------------------------------------------


def _result(doc: Any, result_type: str) -> list[Any]:
    if not isinstance(doc, dict):
        raise UsageSourceError(f"Prometheus answered {type(doc).__name__}, not a JSON object")
    if doc.get("status") != "success":
        raise UsageSourceError(f"Prometheus query failed: {doc.get('errorType')}: {doc.get('error')}")
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != result_type or not isinstance(data.get("result"), list):
        raise UsageSourceError(f"Prometheus answered no {result_type} result: {str(data)[:200]}")
    result: list[Any] = data["result"]
    return result


def _key(series: Any) -> ContainerKey:
    metric = series.get("metric") if isinstance(series, dict) else None
    if not isinstance(metric, dict):
        raise UsageSourceError(f"series without labels: {str(series)[:200]}")
    try:
        return ContainerKey(str(metric["namespace"]), str(metric["pod"]), str(metric["container"]))
    except KeyError as exc:
        raise UsageSourceError(f"series without the {exc.args[0]!r} label: {metric}") from exc


def _sample(pair: Any) -> tuple[float, float] | None:
    """(time, value) of one ``[time, "value"]`` pair; None for a NaN/Inf value (no usage, not zero usage)."""
    if not isinstance(pair, list) or len(pair) != 2:
        raise UsageSourceError(f"malformed sample {pair!r}")
    try:
        t, v = float(pair[0]), float(pair[1])
    except (TypeError, ValueError) as exc:
        raise UsageSourceError(f"malformed sample {pair!r}") from exc
    if not math.isfinite(t):
        raise UsageSourceError(f"malformed sample time {pair!r}")
    if not math.isfinite(v):
        return None
    if v < 0:
        raise UsageSourceError(f"negative usage {pair!r}")
    return t, v


def parse_vector(doc: Any) -> dict[ContainerKey, tuple[float, float]]:
    """An instant query's answer -> container -> (time, value); containers with a NaN value are left out."""
    out: dict[ContainerKey, tuple[float, float]] = {}
    for series in _result(doc, "vector"):
        key = _key(series)
        sample = _sample(series.get("value"))
        if sample is not None:
            out[key] = sample
    return out


def parse_matrix(doc: Any) -> dict[ContainerKey, UsageTrace]:
    """A range query's answer -> container -> trace (NaN samples left out, times ascending)."""
    out: dict[ContainerKey, UsageTrace] = {}
    for series in _result(doc, "matrix"):
        key = _key(series)
        values = series.get("values")
        if not isinstance(values, list):
            raise UsageSourceError(f"series {key} without values")
        samples = sorted(s for s in (_sample(p) for p in values) if s is not None)
        if samples:
            out[key] = UsageTrace(tuple(t for t, _ in samples), tuple(v for _, v in samples))
    return out


def join_usage(
    cpu_cores: Mapping[ContainerKey, tuple[float, float]], memory: Mapping[ContainerKey, tuple[float, float]]
) -> dict[ContainerKey, ContainerUsage]:
    """Containers measured for both resources (cpu converted from cores to millicores); a container with
    one of the two missing is left out rather than given a made-up 0."""
    out: dict[ContainerKey, ContainerUsage] = {}
    for key in sorted(cpu_cores.keys() & memory.keys()):
        t_cpu, cores = cpu_cores[key]
        _, mem = memory[key]
        out[key] = ContainerUsage(key, t_cpu, cores * 1000.0, mem)
    return out


def pod_usage(containers: Iterable[ContainerUsage]) -> dict[str, tuple[float, float]]:
    """Sum per pod (``namespace/name``): (cpu millicores, memory bytes)."""
    out: dict[str, tuple[float, float]] = {}
    for c in containers:
        cpu, mem = out.get(c.key.pod_key, (0.0, 0.0))
        out[c.key.pod_key] = (cpu + c.cpu_milli, mem + c.memory_bytes)
    return out


def pod_traces(traces: Mapping[ContainerKey, UsageTrace]) -> dict[str, UsageTrace]:
    """Per pod, the sum of its containers at the timestamps *all* of them have (a range query's timestamps are
    aligned on its step, so this keeps every step at which the pod was fully measured)."""
    by_pod: dict[str, list[UsageTrace]] = {}
    for key, trace in sorted(traces.items()):
        by_pod.setdefault(key.pod_key, []).append(trace)
    out: dict[str, UsageTrace] = {}
    for pod, parts in by_pod.items():
        common = set(parts[0].times)
        for p in parts[1:]:
            common &= set(p.times)
        times = sorted(common)
        sums = [sum(dict(zip(p.times, p.values, strict=True))[t] for p in parts) for t in times]
        if times:
            out[pod] = UsageTrace(tuple(times), tuple(sums))
    return out


def service_profiles(
    cpu_milli: Mapping[str, UsageTrace],
    memory_bytes: Mapping[str, UsageTrace],
    requests: Mapping[str, Resources],
    interval_seconds: int = 900,
) -> tuple[dict[str, ServiceProfile], dict[str, str]]:
    """Per pod key, the daily profiles (utilisation = usage / request) the characterisation clusters.

    Returns (profiles, skipped): a pod is skipped, with the reason, when it lacks a cpu or memory request
    (nothing reserved, nothing to lend, no rate) or a trace of either resource. ``observed_seconds`` is the
    span both traces cover.
    """
    profiles: dict[str, ServiceProfile] = {}
    skipped: dict[str, str] = {}
    for pod in sorted(requests):
        req = requests[pod]
        if req.cpu_milli <= 0 or req.memory_bytes <= 0:
            skipped[pod] = "no cpu or memory request: nothing reserved to characterise"
            continue
        cpu, mem = cpu_milli.get(pod), memory_bytes.get(pod)
        if cpu is None or mem is None or not cpu.times or not mem.times:
            skipped[pod] = "no usage measured for it"
            continue
        cpu_rate = np.asarray(cpu.values) / req.cpu_milli
        mem_rate = np.asarray(mem.values) / req.memory_bytes
        observed = max(0.0, min(cpu.times[-1], mem.times[-1]) - max(cpu.times[0], mem.times[0]))
        profiles[pod] = ServiceProfile(
            daily_profile(cpu.times, cpu_rate, interval_seconds),
            daily_profile(mem.times, mem_rate, interval_seconds),
            observed,
        )
    return profiles, skipped


def range_chunks(start: float, end: float, step: float, max_points: int = MAX_POINTS) -> list[tuple[float, float]]:
    """Split ``[start, end]`` into consecutive ranges of at most ``max_points`` steps each (Prometheus caps a
    range query at 11,000 points per series); chunks share no timestamp."""
    if not (math.isfinite(start) and math.isfinite(end) and math.isfinite(step)) or step <= 0 or end < start:
        raise ValueError(f"need finite start <= end and step > 0, got {start!r}, {end!r}, {step!r}")
    if max_points < 1:
        raise ValueError("max_points must be >= 1")
    out: list[tuple[float, float]] = []
    t = start
    span = step * (max_points - 1)
    while t <= end:
        stop = min(end, t + span)
        out.append((t, stop))
        t = stop + step
    return out


# --------------------------------------------------------------------------------------------------------
# the shell
# --------------------------------------------------------------------------------------------------------


class PrometheusUsage:
    """Reads container usage from a Prometheus server (``base_url`` like ``http://127.0.0.1:9090``).

    rate_window: the ``rate()`` window of the cpu query; it must hold two scrapes or more (4x the scrape
    interval is the usual advice), or Prometheus returns nothing for the container.
    """

    def __init__(
        self, base_url: str, session: aiohttp.ClientSession, *, rate_window: str = "1m", timeout: float = 10.0
    ) -> None:
        self._base = base_url.rstrip("/")
        self._session = session
        self._window = rate_window
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def _get(self, path: str, params: Sequence[tuple[str, str]]) -> Any:
        url = f"{self._base}{path}"
        try:
            async with self._session.get(url, params=list(params), timeout=self._timeout) as resp:
                # Prometheus answers errors (400 bad query, 422, 503) with the same JSON envelope.
                doc = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise UsageSourceError(f"cannot query Prometheus at {url}: {exc!r}") from exc
        return doc

    def _queries(self) -> tuple[str, str]:
        return CPU_QUERY.replace("{window}", self._window), MEMORY_QUERY

    async def current(self, at: float | None = None) -> dict[ContainerKey, ContainerUsage]:
        """Every measured container's usage now (or at ``at``)."""
        cpu_q, mem_q = self._queries()
        extra = [("time", repr(float(at)))] if at is not None else []
        cpu = parse_vector(await self._get("/api/v1/query", [("query", cpu_q), *extra]))
        mem = parse_vector(await self._get("/api/v1/query", [("query", mem_q), *extra]))
        return join_usage(cpu, mem)

    async def history(
        self, start: float, end: float, step: float
    ) -> tuple[dict[ContainerKey, UsageTrace], dict[ContainerKey, UsageTrace]]:
        """(cpu millicores, memory bytes) traces per container over ``[start, end]`` at ``step`` seconds."""
        cpu_q, mem_q = self._queries()
        cpu: dict[ContainerKey, list[tuple[float, float]]] = {}
        mem: dict[ContainerKey, list[tuple[float, float]]] = {}
        for lo, hi in range_chunks(start, end, step):
            for query, sink, scale in ((cpu_q, cpu, 1000.0), (mem_q, mem, 1.0)):
                params = [("query", query), ("start", repr(lo)), ("end", repr(hi)), ("step", repr(float(step)))]
                for key, trace in parse_matrix(await self._get("/api/v1/query_range", params)).items():
                    sink.setdefault(key, []).extend(
                        (t, v * scale) for t, v in zip(trace.times, trace.values, strict=True)
                    )

        def traces(samples: dict[ContainerKey, list[tuple[float, float]]]) -> dict[ContainerKey, UsageTrace]:
            return {
                k: UsageTrace(tuple(t for t, _ in sorted(s)), tuple(v for _, v in sorted(s)))
                for k, s in samples.items()
            }

        return traces(cpu), traces(mem)
