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
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from extender.config import NodeGroupsConfig, PodDefaults
from extender.controller.patches import escape
from extender.core.characterise import (
    CharacteriseConfig,
    ModelFormatError,
    ServiceProfile,
    WorkloadModel,
    classify_services,
    due_for_recluster,
    fit_model,
    is_complete,
    model_from_document,
    model_to_document,
    recluster_model,
)
from extender.core.model import DEFAULT_CLASSES, InvalidInputError, Node, Pod, Resources, WorkloadKind
from extender.core.slack import Amount, batch_capacity, service_idle
from extender.kube.client import ApiError, read_json
from extender.kube.convert import node_from_k8s, pod_from_k8s
from extender.kube.usage import PrometheusUsage, pod_traces, service_profiles

__all__ = [
    "BATCH_CPU",
    "BATCH_MEMORY",
    "SlackController",
    "SlackPublisher",
    "SlackSettings",
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
    for part in ("capacity", "allocatable"):
        current = status.get(part)
        if not isinstance(current, Mapping):
            ops.append({"op": "add", "path": f"/status/{part}", "value": dict(want)})
            continue
        for name, value in want.items():
            if current.get(name) != value:
                ops.append({"op": "add", "path": f"/status/{part}/{escape(name)}", "value": value})
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


@dataclass(frozen=True, slots=True)
class SlackSettings:
    """How the slack controller reads, fits and publishes.

    model_path: the model file (kept across restarts).
    history_seconds: usage history a (re)fit reads (the paper's traces cover 8 days).
    classify_seconds: usage history read every interval to profile and classify the running services; at least
       the observation time ``p``, or no new service ever qualifies.
    step_seconds: resolution of the range queries.
    node_selector: label selector of the nodes to publish on (None: every node).
    """

    model_path: Path
    config: CharacteriseConfig = field(default_factory=CharacteriseConfig)
    history_seconds: float = 8 * 86_400.0
    classify_seconds: float = 86_400.0
    step_seconds: float = 60.0
    defaults: PodDefaults = field(default_factory=PodDefaults)
    node_selector: str | None = None

    def __post_init__(self) -> None:
        if self.classify_seconds < self.config.observation_seconds:
            raise InvalidInputError(
                f"classify_seconds ({self.classify_seconds}) must cover the observation time "
                f"({self.config.observation_seconds}): no new service could ever be classified"
            )
        for name in ("history_seconds", "step_seconds"):
            if not getattr(self, name) > 0:
                raise InvalidInputError(f"{name} must be > 0")


class SlackController:
    """One refresh: list nodes and running pods, profile and classify the service pods from Prometheus,
    re-cluster when a cycle is due, publish each node's batch capacity. ``model`` may be given (tests, or a
    caller that loaded it); else :meth:`start` loads the file or fits from the history."""

    def __init__(
        self,
        settings: SlackSettings,
        core_api: Any,
        reader: PrometheusUsage,
        *,
        model: WorkloadModel | None = None,
        clock: Callable[[], float] = time.time,
        timeout: float = 10.0,
    ) -> None:
        self.settings = settings
        self.model = model
        self._core = core_api
        self._reader = reader
        self._clock = clock
        self._timeout = timeout
        self.publisher = SlackPublisher(core_api, timeout)

    async def _cluster(self) -> tuple[list[Node], dict[str, Any]]:
        kw: dict[str, Any] = {"_preload_content": False, "_request_timeout": self._timeout}
        selector = {"label_selector": self.settings.node_selector} if self.settings.node_selector else {}
        node_list = await read_json(await self._core.list_node(**selector, **kw))
        pod_list = await read_json(
            await self._core.list_pod_for_all_namespaces(field_selector="status.phase=Running", **kw)
        )
        statuses: dict[str, Any] = {}
        by_node: dict[str, list[Pod]] = {}
        for obj in pod_list.get("items", []):
            node = (obj.get("spec") or {}).get("nodeName")
            if not node:
                continue
            try:
                pod, _ = pod_from_k8s(obj, self.settings.defaults, DEFAULT_CLASSES)
            except InvalidInputError as exc:
                log.warning("pod skipped", extra={"pod": str(obj.get("metadata", {}).get("name")), "error": str(exc)})
                continue
            by_node.setdefault(node, []).append(pod)
        nodes: list[Node] = []
        for obj in node_list.get("items", []):
            try:
                n = node_from_k8s(obj, NodeGroupsConfig())
            except InvalidInputError as exc:
                log.warning("node skipped", extra={"node": str(obj.get("metadata", {}).get("name")), "error": str(exc)})
                continue
            for pod in by_node.get(n.name, []):
                n = n.with_pod(pod)
            nodes.append(n)
            statuses[n.name] = obj.get("status") or {}
        return nodes, statuses

    async def _profiles(self, services: Mapping[str, Resources], seconds: float) -> dict[str, ServiceProfile]:
        now = self._clock()
        cpu, mem = await self._reader.history(now - seconds, now, self.settings.step_seconds)
        profiles, _ = service_profiles(
            pod_traces(cpu), pod_traces(mem), services, self.settings.config.interval_seconds
        )
        return profiles

    async def start(self) -> str:
        """Load the model file, or fit one from the history (saved); ``none`` when no service has a whole day
        of usage yet (nothing is lent until one has)."""
        if self.model is not None:
            return "given"
        nodes, _ = await self._cluster()
        services = _services(nodes)

        async def refit() -> WorkloadModel:
            now = self._clock()
            return await fit_from_prometheus(
                self._reader,
                services,
                self.settings.config,
                now - self.settings.history_seconds,
                now,
                self.settings.step_seconds,
            )

        try:
            self.model, how = await load_or_refit(self.settings.model_path, refit)
        except InvalidInputError as exc:
            log.warning("no workload model yet", extra={"error": str(exc)})
            return "none"
        return how

    async def step(self) -> dict[str, Amount]:
        """One refresh; returns what each node was given (all 0 while there is no model)."""
        nodes, statuses = await self._cluster()
        services = _services(nodes)
        now = self._clock()
        classes: dict[str, dict[str, int]] = {}
        if self.model is not None and services:
            profiles = await self._profiles(services, self.settings.classify_seconds)
            cfg = self.settings.config
            if due_for_recluster(self.model, now, cfg.recluster_seconds):
                complete = {k: p for k, p in profiles.items() if is_complete(p.cpu) and is_complete(p.memory)}
                self.model = recluster_model(cfg, self.model, complete, now)
                save_model(self.settings.model_path, self.model)
            classes = classify_services(self.model, profiles, cfg.observation_seconds)
        if self.model is None:
            amounts = {n.name: Amount(0, 0) for n in nodes}
        else:
            amounts = plan(self.model, nodes, classes, now, self.settings.config.prediction_seconds)
        await self.publisher.publish(statuses, amounts)
        return amounts


def _services(nodes: Sequence[Node]) -> dict[str, Resources]:
    return {p.key: p.requests for n in nodes for p in n.pods if p.kind is WorkloadKind.SERVICE}
