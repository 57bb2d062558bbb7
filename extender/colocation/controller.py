"""Publishing the predicted slack of long-running services as extended resources (issue 16, deliverable 3).

Why extended resources: the kubelet admits pods by requests, so slack the scheduler cannot see cannot be used
safely. Each node's predicted reclaimable capacity (``sum I_i`` of paper 004 Eq. 3-4 over its service pods,
:func:`extender.core.slack.batch_capacity`) is written into its status as

* ``qos.kube-qos-extender.io/batch-cpu``: millicores (extended resources are integers: 1 unit = 1 m),
* ``qos.kube-qos-extender.io/batch-memory``: bytes,

in both ``capacity`` and ``allocatable`` (a kubelet recomputes allocatable from capacity; kwok nodes have no
kubelet doing so), refreshed every prediction interval. A batch pod that requests these instead of cpu/memory
is then admitted by kube-scheduler and the kubelet only where the prediction says there is room.

Safety: every refresh also measures the services' usage now. Where a node's batch pods (those requesting
the batch resources) no longer fit in what its services really leave idle, the fewest of them are evicted in
QoS order (:func:`extender.core.slack.choose_evictions`: lowest class first, then the most time to violate its
SLO), through the Eviction API so PodDisruptionBudgets are honoured, with a Warning Event on the pod and on
the node; that node then publishes no more than its real slack for the interval.

This module is the thin shell: the model file (load, save, refit when it is missing or bad), fitting from the
usage history in Prometheus, the node status PATCH and the evictions; every number and every choice is
decided in ``extender.core``. ``qos-extender serve`` starts it when the config's ``slack.enabled`` is true
(:mod:`extender.settings.extender`, :mod:`extender.processes.serve`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from extender.controller.patches import escape
from extender.core.characterise import (
    CharacteriseConfig,
    ModelFormatError,
    OwnLevel,
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
from extender.core.disruption import Action, Disruption, DisruptionKind, decide, unlimited
from extender.core.model import (
    DEFAULT_CLASSES,
    InvalidInputError,
    Node,
    Pod,
    Resources,
    ServiceClass,
    WorkloadKind,
    memory_bytes,
)
from extender.core.slack import (
    BATCH_CPU,
    BATCH_MEMORY,
    Amount,
    BatchTenant,
    batch_capacity,
    choose_evictions,
    lendable_after_miss,
    measured_idle,
    prediction_misses,
    real_slack,
    service_idle,
    service_spread,
    usage_stale,
)
from extender.kube.client import ApiError, read_json
from extender.kube.convert import node_from_k8s, pod_from_k8s
from extender.kube.usage import (
    ContainerKey,
    PrometheusUsage,
    UsageSourceError,
    UsageTrace,
    pod_traces,
    pod_usage,
    service_profiles,
)
from extender.settings.sections import DisruptionSettings, NodeGroupsConfig, PodDefaults, SlackConfig
from extender.signals import every

__all__ = [
    "BATCH_CPU",
    "BATCH_MEMORY",
    "EVICTION_REASON",
    "SlackController",
    "SlackMetrics",
    "SlackParams",
    "SlackPublisher",
    "batch_demand",
    "capacity_patch",
    "fit_from_prometheus",
    "load_model",
    "load_or_refit",
    "plan",
    "predicted_idle",
    "predicted_spread",
    "refresh_every",
    "run_slack_controller",
    "save_model",
    "settings_from_config",
]

log = logging.getLogger("extender.colocation.controller")

# The reason of the Events on a batch pod evicted (and on its node) because a service's usage grew.
EVICTION_REASON = "BatchSlackReclaimed"

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
    profiles: Mapping[str, ServiceProfile] | None = None,
    own: OwnLevel | None = None,
) -> dict[str, Amount]:
    """Per node, the batch capacity for ``[at, at + horizon)``: Eq. 3 for every service pod that has classes
    (:func:`extender.core.characterise.classify_services`), corrected by its own level when ``own`` is given
    (:func:`predicted_idle`), summed per node less the pooled margin of the pods' spreads
    (:func:`predicted_spread`, ``own.node_sigmas``), floored at 0."""
    idle = predicted_idle(model, nodes, classes_by_pod, at, horizon_seconds, profiles, own)
    if own is None:
        return batch_capacity(nodes, idle)
    spread = predicted_spread(model, nodes, classes_by_pod, at, profiles or {}, own)
    return batch_capacity(nodes, idle, spread, own.node_sigmas)


def predicted_idle(
    model: WorkloadModel,
    nodes: Sequence[Node],
    classes_by_pod: Mapping[str, Mapping[str, int]],
    at: float,
    horizon_seconds: float,
    profiles: Mapping[str, ServiceProfile] | None = None,
    own: OwnLevel | None = None,
) -> dict[str, Amount]:
    """Eq. 3 per service pod (by key) that has classes: what it is predicted to leave idle, i.e. what is lent.
    With ``own`` (``slack.own_level``) each class peak is corrected by the pod's own recent residuals against
    its centre, read from its profile in ``profiles`` (:func:`extender.core.slack.service_idle`); a pod
    without a profile gets Eq. 3 alone."""
    profiles = profiles or {}
    idle: dict[str, Amount] = {}
    for node in nodes:
        for pod in node.pods:
            classes = classes_by_pod.get(pod.key)
            if classes is not None:
                idle[pod.key] = service_idle(
                    model, classes, pod.requests, at, horizon_seconds, profiles.get(pod.key), own
                )
    return idle


def predicted_spread(
    model: WorkloadModel,
    nodes: Sequence[Node],
    classes_by_pod: Mapping[str, Mapping[str, int]],
    at: float,
    profiles: Mapping[str, ServiceProfile],
    own: OwnLevel,
) -> dict[str, Amount]:
    """Per service pod that has classes, the spread of its usage around its predicted level
    (:func:`extender.core.slack.service_spread`), which its node holds back pooled."""
    return {
        pod.key: service_spread(model, classes_by_pod[pod.key], pod.requests, at, profiles.get(pod.key), own)
        for node in nodes
        for pod in node.pods
        if pod.key in classes_by_pod
    }


def batch_demand(obj: Mapping[str, Any]) -> Amount | None:
    """What a Pod object requests of the batch resources (sum over its containers; the larger of that and
    any init container, as the scheduler counts); None when it requests neither (not on the lent slack)."""
    spec = obj.get("spec") or {}

    def one(c: Any) -> Amount:
        req = ((c or {}).get("resources") or {}).get("requests") or {}
        return Amount(memory_bytes(req.get(BATCH_CPU, 0)), memory_bytes(req.get(BATCH_MEMORY, 0)))

    total = Amount.total(one(c) for c in spec.get("containers") or [])
    for c in spec.get("initContainers") or []:
        i = one(c)
        total = Amount(max(total.cpu_milli, i.cpu_milli), max(total.memory_bytes, i.memory_bytes))
    return None if total == Amount(0, 0) else total


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
    # parsing and clustering are CPU-bound: off the event loop that also answers /filter and /bind
    profiles, skipped = await asyncio.to_thread(_profiles_of, cpu, mem, requests, config.interval_seconds)
    complete = {k: p for k, p in profiles.items() if is_complete(p.cpu) and is_complete(p.memory)}
    for pod, why in skipped.items():
        log.info("service not characterised", extra={"pod": pod, "error": why})
    if not complete:
        raise InvalidInputError(
            f"no service has usage for every interval of the day between {start:.0f} and {end:.0f}: nothing to fit"
        )
    return await asyncio.to_thread(fit_model, config, complete, end)


def _profiles_of(
    cpu: Mapping[ContainerKey, UsageTrace],
    mem: Mapping[ContainerKey, UsageTrace],
    requests: Mapping[str, Resources],
    interval_seconds: int,
) -> tuple[dict[str, ServiceProfile], dict[str, str]]:
    """Per-pod traces and daily profiles from a history (pure, CPU-bound: run in a worker thread)."""
    return service_profiles(pod_traces(cpu), pod_traces(mem), requests, interval_seconds)


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
    await every(interval_seconds, step, stop, log=log, failed="slack refresh failed", traceback=True)


@dataclass(frozen=True, slots=True)
class SlackParams:
    """How the slack controller reads, fits and publishes.

    model_path: the model file (kept across restarts).
    history_seconds: usage history a (re)fit reads (the paper's traces cover 8 days).
    classify_seconds: usage history read every interval to profile and classify the running services; at least
       the observation time ``p``, or no new service ever qualifies.
    step_seconds: resolution of the range queries.
    node_selector: label selector of the nodes to publish on (None: every node).
    classes: the service classes, for the QoS order of evictions (importance, SLO).
    evict: evict batch pods that no longer fit in the real slack (False: only count the misses).
    miss_tolerance: a service leaving less idle than predicted by more than this fraction of its request is a
       prediction miss (metric; the node then publishes no more than its real slack).
    stale_seconds: a service whose usage no instant reading measured for longer than this lends nothing; when
       the range query failed that long every node publishes 0 (:func:`extender.core.slack.usage_stale`).
    """

    model_path: Path
    config: CharacteriseConfig = field(default_factory=CharacteriseConfig)
    history_seconds: float = 8 * 86_400.0
    classify_seconds: float = 86_400.0
    step_seconds: float = 60.0
    defaults: PodDefaults = field(default_factory=PodDefaults)
    node_selector: str | None = None
    classes: Mapping[str, ServiceClass] = field(default_factory=lambda: dict(DEFAULT_CLASSES))
    evict: bool = True
    miss_tolerance: float = 0.05
    stale_seconds: float = 1800.0
    own_level: OwnLevel | None = field(default_factory=OwnLevel)
    """How each service's own recent residuals correct its class prediction (None: paper 004's Eq. 3 alone)."""
    guard: DisruptionSettings = field(default_factory=DisruptionSettings)
    """The extender's disruption guard rails (budgets, dry-run) for the evictions."""

    def __post_init__(self) -> None:
        if self.classify_seconds < self.config.observation_seconds:
            raise InvalidInputError(
                f"classify_seconds ({self.classify_seconds}) must cover the observation time "
                f"({self.config.observation_seconds}): no new service could ever be classified"
            )
        for name in ("history_seconds", "step_seconds"):
            if not getattr(self, name) > 0:
                raise InvalidInputError(f"{name} must be > 0")
        if not 0 <= self.miss_tolerance < 1:
            raise InvalidInputError(f"miss_tolerance must be in [0, 1), got {self.miss_tolerance!r}")


_REFRESH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class SlackMetrics:
    """The publisher's metrics (prefix ``qos_extender_slack_``), in the extender's registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry()
        self.published_cpu = Gauge(
            "qos_extender_slack_published_batch_cpu_cores",
            f"{BATCH_CPU} last published per node, in cores (Prometheus base unit; the resource counts millicores).",
            ["node"],
            registry=r,
        )
        self.published_memory = Gauge(
            "qos_extender_slack_published_batch_memory_bytes",
            f"{BATCH_MEMORY} last published per node (bytes).",
            ["node"],
            registry=r,
        )
        self.refresh_duration = Histogram(
            "qos_extender_slack_refresh_duration_seconds",
            "One refresh: list, measure, classify, (re)cluster when due, evict, publish.",
            buckets=_REFRESH_BUCKETS,
            registry=r,
        )
        self.refresh_failures = Counter(
            "qos_extender_slack_refresh_failures", "Refreshes that raised (the published values stay).", registry=r
        )
        self.model_classes = Gauge(
            "qos_extender_slack_model_classes",
            "Classes of the workload model per resource (0: no model, nothing lent).",
            ["resource"],
            registry=r,
        )
        self.refits = Counter(
            "qos_extender_slack_refits",
            "Models fitted or re-clustered: fitted (no file), refitted (bad file), reclustered (cycle due).",
            ["how"],
            registry=r,
        )
        self.prediction_misses = Counter(
            "qos_extender_slack_prediction_misses",
            "Service observations leaving less idle than predicted (beyond miss_tolerance of the request).",
            registry=r,
        )
        self.evictions = Counter(
            "qos_extender_slack_evictions",
            "Batch pods evicted because the real slack no longer held them, by result: evicted, gone (404), "
            "pdb (429: a PodDisruptionBudget refused), error.",
            ["result"],
            registry=r,
        )
        self.disruptions = Counter(
            "qos_extender_slack_disruptions",
            "Slack evictions not made as asked by the disruption guard rails, by kind (slack-eviction) and decision: "
            "dry_run (each reported once per report interval, nothing evicted), waited (a refresh a budget held "
            "it in).",
            ["kind", "decision"],
            registry=r,
        )
        self.withdrawn = Gauge(
            "qos_extender_slack_withdrawn",
            "1 while slack is withdrawn: some service's usage (or every node's) unread for longer than stale_seconds.",
            registry=r,
        )
        self.classified_services = Gauge(
            "qos_extender_slack_classified_services", "Service pods with a class (their slack is lent).", registry=r
        )
        self._nodes: set[str] = set()  # the nodes whose published gauges have a series

    def published(self, amounts: Mapping[str, Amount]) -> None:
        """Set each listed node's gauges and drop the series of nodes no longer listed (deleted, or out of
        the node selector), so /metrics never shows capacity for a node that is gone."""
        for name in self._nodes - amounts.keys():
            self.published_cpu.remove(name)
            self.published_memory.remove(name)
        for name, amount in amounts.items():
            self.published_cpu.labels(name).set(amount.cpu_milli / 1000)
            self.published_memory.labels(name).set(amount.memory_bytes)
        self._nodes = set(amounts)

    def model(self, model: WorkloadModel | None) -> None:
        for r in ("cpu", "memory"):
            self.model_classes.labels(r).set(0 if model is None else model.centres(r).shape[0])


@dataclass(frozen=True, slots=True)
class _Cluster:
    nodes: list[Node]
    statuses: dict[str, Any]
    demand: dict[str, Amount]  # batch pods on the lent slack: pod key -> batch resources requested
    uids: dict[str, str]
    node_uids: dict[str, str]


class SlackController:
    """One refresh: list nodes and running pods, profile and classify the service pods from Prometheus,
    re-cluster when a cycle is due, evict the batch pods a wrong prediction left without room, publish each
    node's batch capacity. ``model`` may be given (tests, or a caller that loaded it); else :meth:`start` loads
    the file or fits from the history."""

    def __init__(
        self,
        settings: SlackParams,
        core_api: Any,
        reader: PrometheusUsage,
        *,
        model: WorkloadModel | None = None,
        clock: Callable[[], float] = time.time,
        timeout: float = 10.0,
        metrics: SlackMetrics | None = None,
        event_component: str | None = "qos-extender",
    ) -> None:
        self.settings = settings
        self.model = model
        self._core = core_api
        self._reader = reader
        self._clock = clock
        self._timeout = timeout
        self.publisher = SlackPublisher(core_api, timeout)
        self.metrics = metrics if metrics is not None else SlackMetrics()
        self._component = event_component
        self.evicted: list[str] = []  # every pod this controller evicted, in order (tests, logs)
        self._evicting: dict[str, tuple[Disruption, float]] = {}  # evicted, in motion until the pod is gone
        self._said: dict[tuple[str, str], float] = {}  # (reason, pod) -> until when an Event is not said again
        # The staleness clocks run on the instant reading (``PrometheusUsage.current``), the one the safety check
        # needs, not on the range query: a range over the classify window still returns samples for an hour
        # after the scrapes stopped, and the profiles alone cannot tell a service grew under its batch tenants.
        self.usage_read_at = clock()  # the last instant reading that answered (start counts: nothing lent yet)
        self._started = self.usage_read_at
        self.measured_at: dict[str, float] = {}  # service pod -> the last instant reading that measured it

    async def _cluster(self) -> _Cluster:
        kw: dict[str, Any] = {"_preload_content": False, "_request_timeout": self._timeout}
        selector = {"label_selector": self.settings.node_selector} if self.settings.node_selector else {}
        node_list = await read_json(await self._core.list_node(**selector, **kw))
        pod_list = await read_json(
            await self._core.list_pod_for_all_namespaces(field_selector="status.phase=Running", **kw)
        )
        statuses: dict[str, Any] = {}
        by_node: dict[str, list[Pod]] = {}
        demand: dict[str, Amount] = {}
        uids: dict[str, str] = {}
        for obj in pod_list.get("items", []):
            node = (obj.get("spec") or {}).get("nodeName")
            if not node:
                continue
            try:
                pod, _ = pod_from_k8s(obj, self.settings.defaults, self.settings.classes)
                want = batch_demand(obj)
            except InvalidInputError as exc:
                log.warning("pod skipped", extra={"pod": str(obj.get("metadata", {}).get("name")), "error": str(exc)})
                continue
            by_node.setdefault(node, []).append(pod)
            uids[pod.key] = pod.uid
            if want is not None:
                demand[pod.key] = want
        nodes: list[Node] = []
        node_uids: dict[str, str] = {}
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
            node_uids[n.name] = str((obj.get("metadata") or {}).get("uid") or "")
        return _Cluster(nodes, statuses, demand, uids, node_uids)

    async def _profiles(self, services: Mapping[str, Resources], seconds: float) -> dict[str, ServiceProfile]:
        now = self._clock()
        cpu, mem = await self._reader.history(now - seconds, now, self.settings.step_seconds)
        profiles, _ = await asyncio.to_thread(_profiles_of, cpu, mem, services, self.settings.config.interval_seconds)
        return profiles

    async def start(self) -> str:
        """Load the model file, or fit one from the history (saved); ``none`` when no service has a whole day
        of usage yet (nothing is lent until one has)."""
        if self.model is not None:
            self.metrics.model(self.model)
            return "given"
        services = _services((await self._cluster()).nodes)

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
            self.metrics.model(None)
            return "none"
        if how != "loaded":
            self.metrics.refits.labels(how).inc()
        self.metrics.model(self.model)
        return how

    async def _measured(self, services: Mapping[str, Resources], now: float) -> dict[str, Amount] | None:
        """Each service's idle now (request minus measured usage); None when Prometheus cannot say (the
        safety check then waits for the next refresh rather than act on nothing). Moves the staleness clocks:
        ``usage_read_at`` when the reading answered, ``measured_at`` for each service it measured."""
        try:
            usage = pod_usage((await self._reader.current()).values())
        except UsageSourceError as exc:
            log.warning("current usage unavailable, no safety check this refresh", extra={"error": str(exc)})
            return None
        self.usage_read_at = now
        measured = {k: measured_idle(services[k], cpu, mem) for k, (cpu, mem) in usage.items() if k in services}
        for k in measured:
            self.measured_at[k] = now
        for k in set(self.measured_at) - services.keys():
            del self.measured_at[k]  # a service gone: its clock with it
        return measured

    def _fresh(self, idle: Mapping[str, Amount], now: float) -> dict[str, Amount]:
        """``idle`` without the services whose usage no instant reading has shown for longer than
        ``stale_seconds`` (their slack is withdrawn, :func:`extender.core.slack.usage_stale`): a service
        missing from one reading counts as its prediction, one missing that long cannot be checked at all."""
        stale = self.settings.stale_seconds
        return {k: v for k, v in idle.items() if not usage_stale(self.measured_at.get(k, self._started), now, stale)}

    async def step(self) -> dict[str, Amount]:
        """One refresh; returns what each node was given (all 0 while there is no model)."""
        started = time.monotonic()
        try:
            return await self._step()
        except Exception:
            self.metrics.refresh_failures.inc()
            raise
        finally:
            self.metrics.refresh_duration.observe(time.monotonic() - started)

    async def _step(self) -> dict[str, Amount]:
        cluster = await self._cluster()
        nodes = cluster.nodes
        services = _services(nodes)
        now = self._clock()
        classes: dict[str, dict[str, int]] = {}
        profiles: dict[str, ServiceProfile] = {}
        if self.model is not None and services:
            try:
                profiles = await self._profiles(services, self.settings.classify_seconds)
            except UsageSourceError as exc:
                if not usage_stale(self.usage_read_at, now, self.settings.stale_seconds):
                    raise  # a refresh failing: the published values stay until the usage is stale
                zeros = {n.name: Amount(0, 0) for n in nodes}
                log.warning(
                    "usage unreadable for longer than stale_seconds: slack withdrawn",
                    extra={"error": str(exc), "decision": {"since": self.usage_read_at, "nodes": len(zeros)}},
                )
                self.metrics.withdrawn.set(1)
                await self.publisher.publish(cluster.statuses, zeros)
                self.metrics.published(zeros)
                return zeros
            cfg = self.settings.config
            if due_for_recluster(self.model, now, cfg.recluster_seconds):
                complete = {k: p for k, p in profiles.items() if is_complete(p.cpu) and is_complete(p.memory)}
                self.model = await asyncio.to_thread(recluster_model, cfg, self.model, complete, now)
                save_model(self.settings.model_path, self.model)
                self.metrics.refits.labels("reclustered").inc()
                self.metrics.model(self.model)
            classes = await asyncio.to_thread(classify_services, self.model, profiles, cfg.observation_seconds)
        self.metrics.classified_services.set(len(classes))
        if self.model is None:
            amounts = {n.name: Amount(0, 0) for n in nodes}
        else:
            idle = predicted_idle(
                self.model,
                nodes,
                classes,
                now,
                self.settings.config.prediction_seconds,
                profiles,
                self.settings.own_level,
            )
            measured = await self._measured(services, now) if services else None
            fresh = self._fresh(idle, now)
            withdrawn = len(fresh) < len(idle)
            if withdrawn:
                log.warning(
                    "usage of some services unread by the instant query for longer than stale_seconds: "
                    "their slack withdrawn",
                    extra={"decision": {"stale": sorted(idle.keys() - fresh.keys()), "since": self.usage_read_at}},
                )
            self.metrics.withdrawn.set(1 if withdrawn else 0)
            idle = fresh
            own = self.settings.own_level
            if own is None:
                amounts = batch_capacity(nodes, idle)
            else:
                spread = predicted_spread(self.model, nodes, classes, now, profiles, own)
                amounts = batch_capacity(nodes, idle, spread, own.node_sigmas)
            if idle and measured is not None:
                await self._safety(cluster, services, idle, amounts, now, measured)
        await self.publisher.publish(cluster.statuses, amounts)
        self.metrics.published(amounts)
        return amounts

    async def _safety(
        self,
        cluster: _Cluster,
        services: Mapping[str, Resources],
        idle: Mapping[str, Amount],
        amounts: dict[str, Amount],
        now: float,
        measured: Mapping[str, Amount],
    ) -> None:
        """Compare the lent slack with the measured one: count the misses, evict what no longer fits (the
        choice is :func:`extender.core.slack.choose_evictions`), and let a missed node publish only its real
        slack (``amounts`` is updated in place)."""
        misses = set(prediction_misses(idle, measured, services, self.settings.miss_tolerance))
        self.metrics.prediction_misses.inc(len(misses))
        for node in cluster.nodes:
            lent = {p.key: idle[p.key] for p in node.pods if p.key in idle}
            if not lent:
                continue  # nothing lent here: batch pods here are not on a prediction of ours
            real = real_slack(lent, measured)
            tenants = [
                BatchTenant(
                    p.key,
                    cluster.demand[p.key],
                    _importance(self.settings.classes, p.class_name),
                    _slo(self.settings.classes, p.class_name),
                    max(0.0, now - p.started_at) if p.started_at is not None else 0.0,
                )
                for p in node.pods
                if p.key in cluster.demand
            ]
            victims = choose_evictions(real, tenants)
            if victims or misses & lent.keys():
                amounts[node.name] = lendable_after_miss(amounts[node.name], real)
            if not victims:
                continue
            missed = sorted(misses & lent.keys())
            log.warning(
                "batch pods no longer fit in the real slack",
                extra={"node": node.name, "decision": {"real": str(real), "victims": list(victims), "missed": missed}},
            )
            if not self.settings.evict:
                continue
            running = {p.key for n in cluster.nodes for p in n.pods}
            now_wall = self._clock()
            self._evicting = {k: v for k, v in self._evicting.items() if k in running and v[1] > now_wall}
            group = node.group.value if node.group is not None else "none"
            for key in victims:
                d = Disruption(DisruptionKind.SLACK_EVICTION, node.name, group, key)
                if not await self._guarded(d, cluster.uids.get(key, ""), now_wall):
                    continue
                demand = Amount.total(t.demand for t in tenants)
                why = (
                    f"the services lending on {node.name} ({', '.join(sorted(lent))}) use more than predicted: "
                    f"{real.cpu_milli}m cpu / {real.memory_bytes} B memory really idle for "
                    f"{demand.cpu_milli}m / {demand.memory_bytes} B of batch pods; {key} evicted first in QoS order"
                    + (f" (prediction missed: {', '.join(missed)})" if missed else "")
                )
                result = await self._evict(key, cluster.uids.get(key, ""))
                self.metrics.evictions.labels(result).inc()
                if result == "evicted":
                    self.evicted.append(key)
                    self._evicting[key] = (d, now_wall + 120.0)
                    await self._event(
                        key, cluster.uids.get(key, ""), node.name, cluster.node_uids.get(node.name, ""), why
                    )

    async def _guarded(self, d: Disruption, uid: str, now: float) -> bool:
        """May this eviction be made now (``core.disruption.decide`` on the extender's budgets and what this
        controller is evicting)? A held or dry-run eviction is counted, logged and said once per
        ``report_interval_seconds`` (Event on the pod)."""
        g = self.settings.guard
        budgets = g.core_budgets
        if not g.dry_run and unlimited(budgets):
            return True
        motion = [m for m, _ in self._evicting.values()]
        verdict = decide(budgets, motion, [d], now, dry_run=g.dry_run)[0]
        if verdict.action is Action.GO:
            return True
        assert d.pod is not None
        dry = verdict.action is Action.REPORT
        reason = "QosDisruptionDryRun" if dry else "QosDisruptionWaiting"
        said = self._said.get((reason, d.pod), float("-inf")) > now
        if not dry or not said:  # a dry-run report counts once per report interval, as it is said
            self.metrics.disruptions.labels(d.kind.value, "dry_run" if dry else "waited").inc()
        message = (
            f"dry-run: would evict from {d.node} (the real slack no longer holds it); nothing changed"
            if dry
            else f"slack eviction from {d.node} waits: {verdict.reason}"
        )
        log.info("slack eviction guarded", extra={"pod": d.pod, "decision": {"action": verdict.action.value,
                                                                             "reason": verdict.reason}})  # fmt: skip
        if not said:
            self._said = {k: t for k, t in self._said.items() if t > now}
            self._said[(reason, d.pod)] = now + g.report_interval_seconds
            await self._event(d.pod, uid, d.node, "", message, reason=reason, warning=False, on_node=False)
        return False

    async def _evict(self, key: str, uid: str) -> str:
        namespace, name = key.split("/", 1)
        body: Any = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}} if uid else {},
        }
        try:
            response = await self._core.create_namespaced_pod_eviction(
                name, namespace, body, _preload_content=False, _request_timeout=self._timeout
            )
            await read_json(response)
        except ApiError as exc:
            if exc.status == 404:
                return "gone"
            result = "pdb" if exc.status == 429 else "error"
            log.warning("batch pod not evicted", extra={"pod": key, "error": f"{result}: {exc}"})
            return result
        except (OSError, TimeoutError) as exc:
            log.warning("batch pod not evicted", extra={"pod": key, "error": repr(exc)})
            return "error"
        log.info("batch pod evicted", extra={"pod": key})
        return "evicted"

    async def _event(
        self,
        key: str,
        uid: str,
        node: str,
        node_uid: str,
        message: str,
        *,
        reason: str = EVICTION_REASON,
        warning: bool = True,
        on_node: bool = True,
    ) -> None:
        """A Warning Event on the evicted pod and one on its node (best effort: logged when refused)."""
        if self._component is None:
            return
        namespace, name = key.split("/", 1)
        stamp = datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        objects = [(namespace, {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace, "uid": uid})]
        if on_node:
            objects.append(("default", {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}))
        for ns, obj in objects:
            event = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{obj['name']}.", "namespace": ns},
                "involvedObject": obj,
                "reason": reason,
                "message": message[:1024],
                "type": "Warning" if warning else "Normal",
                "source": {"component": self._component},
                "reportingComponent": self._component,
                "reportingInstance": socket.gethostname(),
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
            }
            try:
                await read_json(
                    await self._core.create_namespaced_event(
                        ns, event, _preload_content=False, _request_timeout=self._timeout
                    )
                )
            except (ApiError, OSError, TimeoutError) as exc:
                log.warning("event not posted", extra={"pod": key, "node": node, "error": repr(exc)})


def _importance(classes: Mapping[str, ServiceClass], name: str) -> int:
    """A class missing from the settings counts as less important than every known one."""
    c = classes.get(name)
    return c.importance if c is not None else max((x.importance for x in classes.values()), default=0) + 1


def _slo(classes: Mapping[str, ServiceClass], name: str) -> float:
    c = classes.get(name)
    return c.slo if c is not None else 1.0


def _services(nodes: Sequence[Node]) -> dict[str, Resources]:
    return {p.key: p.requests for n in nodes for p in n.pods if p.kind is WorkloadKind.SERVICE}


def settings_from_config(cfg: SlackConfig, classes: Mapping[str, ServiceClass], defaults: PodDefaults) -> SlackParams:
    """The controller's settings from a validated ``slack`` section (:mod:`extender.settings.extender`)."""
    return SlackParams(
        model_path=Path(cfg.model_path),
        config=cfg.characterise.core(),
        history_seconds=cfg.history_seconds,
        classify_seconds=cfg.classify_seconds,
        step_seconds=cfg.step_seconds,
        defaults=defaults,
        node_selector=cfg.node_selector,
        classes=dict(classes),
        evict=cfg.evict,
        miss_tolerance=cfg.miss_tolerance,
        stale_seconds=cfg.stale_seconds,
        own_level=cfg.own_level.core(),
    )


async def run_slack_controller(
    cfg: SlackConfig,
    api_client: Any,
    *,
    classes: Mapping[str, ServiceClass],
    defaults: PodDefaults,
    metrics: SlackMetrics | None = None,
    event_component: str | None = "qos-extender",
    stop: asyncio.Event | None = None,
    disruption: DisruptionSettings | None = None,
) -> None:
    """The publisher as a long-running task of ``serve``: load or fit the model (retried every refresh while
    there is none), then refresh every ``refresh_seconds`` until ``stop`` is set or the task is cancelled.

    ``metrics``: created once by the caller and given to every call (each leader term is one call): a
    registry refuses the same metric names twice, so a second term building its own would fail at once."""
    import aiohttp
    from kubernetes_asyncio import client as k8s  # the heavy client only where a cluster is used

    stop = stop if stop is not None else asyncio.Event()
    metrics = metrics if metrics is not None else SlackMetrics()
    async with aiohttp.ClientSession() as session:
        reader = PrometheusUsage(cfg.prometheus_url, session, rate_window=cfg.rate_window)
        params = settings_from_config(cfg, classes, defaults)
        if disruption is not None:
            params = replace(params, guard=disruption)
        ctl = SlackController(
            params,
            k8s.CoreV1Api(api_client),
            reader,
            metrics=metrics,
            event_component=event_component,
        )
        log.info("slack controller starting", extra={"decision": {"prometheus": cfg.prometheus_url}})

        async def refresh() -> None:
            if ctl.model is None:
                how = await ctl.start()
                log.info("workload model", extra={"decision": {"how": how}})
            await ctl.step()

        await refresh_every(cfg.refresh_seconds, refresh, stop)
