"""Publishing the predicted slack of long-running services as extended resources (issue 16, deliverable 3).

Why extended resources: the kubelet admits pods by requests, so slack the scheduler cannot see cannot be used
safely. Each node's predicted reclaimable capacity (``sum I_i`` of paper 004 Eq. 3-4 over its service pods,
:func:`extender.core.slack.batch_capacity`) is written into its status as

* ``qos.kube-qos-extender.io/batch-cpu``: millicores (extended resources are integers: 1 unit = 1 m),
* ``qos.kube-qos-extender.io/batch-memory``: bytes,

in both ``capacity`` and ``allocatable`` (a kubelet recomputes allocatable from capacity; kwok nodes have no
kubelet doing so), refreshed every prediction interval. A batch pod that requests these instead of cpu/memory
is then admitted by kube-scheduler and the kubelet only where the prediction says there is room.

This module is the thin shell: the model file (load, save, refit when it is missing or bad), fitting from the
usage history in Prometheus, and the node status PATCH; every number is decided in ``extender.core``. It is
not wired into ``serve`` yet (the webhook's rewrite of batch requests and the eviction on a wrong prediction
are the next steps of issue 16).
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from extender.controller.patches import escape
from extender.core.characterise import (
    CharacteriseConfig,
    ModelFormatError,
    WorkloadModel,
    classify_services,
    fit_model,
    is_complete,
    model_from_document,
    model_to_document,
)
from extender.core.model import InvalidInputError, Node, Resources
from extender.core.slack import Amount, batch_capacity, service_idle
from extender.kube.client import ApiError, read_json
from extender.kube.usage import PrometheusUsage, pod_traces, service_profiles

__all__ = [
    "BATCH_CPU",
    "BATCH_MEMORY",
    "SlackPublisher",
    "capacity_patch",
    "fit_from_prometheus",
    "load_model",
    "load_or_refit",
    "plan",
    "refresh_every",
    "save_model",
]

log = logging.getLogger("extender.controller.slack")

BATCH_CPU = "qos.kube-qos-extender.io/batch-cpu"
BATCH_MEMORY = "qos.kube-qos-extender.io/batch-memory"

Op = dict[str, Any]


# --------------------------------------------------------------------------------------------------------
# pure: what to publish, and the patch that publishes it
# --------------------------------------------------------------------------------------------------------


def plan(
    model: WorkloadModel,
    nodes: Sequence[Node],
    classes_by_pod: Mapping[str, Mapping[str, int]],
    at: float,
    horizon_seconds: float,
) -> dict[str, Amount]:
    """Per node, the batch capacity for ``[at, at + horizon)``: Eq. 3 for every service pod that has classes
    (:func:`extender.core.characterise.classify_services`), summed per node and floored at 0."""
    idle: dict[str, Amount] = {}
    for node in nodes:
        for pod in node.pods:
            classes = classes_by_pod.get(pod.key)
            if classes is not None:
                idle[pod.key] = service_idle(model, classes, pod.requests, at, horizon_seconds)
    return batch_capacity(nodes, idle)


def capacity_patch(status: Mapping[str, Any], amount: Amount) -> list[Op]:
    """A JSON Patch (RFC 6902) of a node's ``status`` setting both extended resources in ``capacity`` and
    ``allocatable``; [] when they already hold these values (no write for nothing)."""
    if amount.cpu_milli < 0 or amount.memory_bytes < 0:
        raise InvalidInputError(f"an extended resource cannot be negative: {amount}")
    want = {BATCH_CPU: str(amount.cpu_milli), BATCH_MEMORY: str(amount.memory_bytes)}
    ops: list[Op] = []
    for field in ("capacity", "allocatable"):
        current = status.get(field)
        if not isinstance(current, Mapping):
            ops.append({"op": "add", "path": f"/status/{field}", "value": dict(want)})
            continue
        for name, value in want.items():
            if current.get(name) != value:
                ops.append({"op": "add", "path": f"/status/{field}/{escape(name)}", "value": value})
    return ops


# --------------------------------------------------------------------------------------------------------
# the model file
# --------------------------------------------------------------------------------------------------------


def load_model(path: str | Path) -> WorkloadModel | None:
    """The model saved at ``path``; None when there is no file; :class:`ModelFormatError` (naming the file)
    when it cannot be read as a model of this version."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ModelFormatError(f"{p}: cannot read the workload model: {exc}") from exc
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ModelFormatError(f"{p}: not JSON ({exc}); the file is damaged") from exc
    try:
        return model_from_document(doc)
    except ModelFormatError as exc:
        raise ModelFormatError(f"{p}: {exc}") from exc


def save_model(path: str | Path, model: WorkloadModel) -> None:
    """Write atomically (temp file, fsync, rename): a crash mid-write leaves the previous model, never half."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = orjson.dumps(model_to_document(model), option=orjson.OPT_INDENT_2)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


async def load_or_refit(path: str | Path, refit: Callable[[], Awaitable[WorkloadModel]]) -> tuple[WorkloadModel, str]:
    """The saved model, or a new one from ``refit`` (saved at once) when there is none or it is bad.

    Returns (model, how): ``loaded``, ``fitted`` (no file) or ``refitted`` (the file was bad: logged as an
    error with the reason, and replaced).
    """
    try:
        model = load_model(path)
    except ModelFormatError as exc:
        log.error("workload model unusable, refitting from the usage history", extra={"error": str(exc)})
        how = "refitted"
    else:
        if model is not None:
            return model, "loaded"
        how = "fitted"
    model = await refit()
    save_model(path, model)
    return model, how


async def fit_from_prometheus(
    reader: PrometheusUsage,
    requests: Mapping[str, Resources],
    config: CharacteriseConfig,
    start: float,
    end: float,
    step: float = 60.0,
) -> WorkloadModel:
    """Fit a model on the services (pod key -> requests) whose usage between ``start`` and ``end`` covers every
    interval of the day; the paper's history is 8 days. Refuses (InvalidInputError) when no service does yet:
    no model then, so nothing is lent."""
    cpu, mem = await reader.history(start, end, step)
    profiles, skipped = service_profiles(pod_traces(cpu), pod_traces(mem), requests, config.interval_seconds)
    complete = {k: p for k, p in profiles.items() if is_complete(p.cpu) and is_complete(p.memory)}
    for pod, why in skipped.items():
        log.info("service not characterised", extra={"pod": pod, "error": why})
    if not complete:
        raise InvalidInputError(
            f"no service has usage for every interval of the day between {start:.0f} and {end:.0f}: nothing to fit"
        )
    return fit_model(config, complete, end)


# --------------------------------------------------------------------------------------------------------
# the node status writer and the refresh loop
# --------------------------------------------------------------------------------------------------------


class SlackPublisher:
    """PATCHes node status with the batch capacity (``core_api``: a kubernetes_asyncio CoreV1Api)."""

    def __init__(self, core_api: Any, timeout: float = 10.0) -> None:
        self._core = core_api
        self._timeout = timeout

    async def publish(self, statuses: Mapping[str, Mapping[str, Any]], amounts: Mapping[str, Amount]) -> dict[str, str]:
        """Per node: ``patched``, ``unchanged``, ``gone`` (404) or ``error: ...``; one failing node does not
        stop the others (the next interval retries it)."""
        out: dict[str, str] = {}
        for name, amount in sorted(amounts.items()):
            ops = capacity_patch(statuses.get(name, {}), amount)
            if not ops:
                out[name] = "unchanged"
                continue
            try:
                response = await self._core.patch_node_status(
                    name, ops, _preload_content=False, _request_timeout=self._timeout
                )
                await read_json(response)
            except ApiError as exc:
                out[name] = "gone" if exc.status == 404 else f"error: {exc}"
            except (OSError, TimeoutError) as exc:
                out[name] = f"error: {exc!r}"
            else:
                out[name] = "patched"
            if out[name].startswith("error"):
                log.warning("batch capacity not published", extra={"node": name, "error": out[name]})
        return out


async def refresh_every(interval_seconds: float, step: Callable[[], Awaitable[object]], stop: asyncio.Event) -> None:
    """Run ``step`` now and then every interval until ``stop`` is set; a failing step is logged, not fatal
    (the published values stay as they were until the next one succeeds)."""
    while not stop.is_set():
        try:
            await step()
        except Exception as exc:
            log.exception("slack refresh failed", extra={"error": repr(exc)})
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval_seconds)
        except TimeoutError:
            continue


def classify(
    model: WorkloadModel, profiles: Mapping[str, Any], config: CharacteriseConfig
) -> dict[str, dict[str, int]]:
    """:func:`classify_services` with the configured observation time (a convenience for the shell)."""
    return classify_services(model, profiles, config.observation_seconds)
