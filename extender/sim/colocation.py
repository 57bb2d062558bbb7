"""Batch on the slack of long-running services, in the simulator (issue 16, deliverable 4; paper 004).

Why a layer on the `product` run and not a policy of its own: co-location is something the product adds to
its own scheduling (the slack controller publishes ``batch-cpu``/``batch-memory``, the admission webhook makes
opted-in batch pods request them instead of cpu/memory), so `product-colocate` is the `product` run plus this
layer, and the difference between the two runs is the co-location alone.

The layer decides nothing itself. Every refresh (``slack.refresh_seconds``, 15 min) it does what
``extender.colocation.controller.SlackController._step`` does, with the same pure functions:

* profiles of the services over the last ``classify_seconds`` (``core.characterise.daily_profile`` of
  usage / request, what ``kube.usage.service_profiles`` does with Prometheus' samples), a model fitted once
  a service has a whole day (``core.characterise.fit_model``), re-clustered every cycle
  (``due_for_recluster`` / ``recluster_model``), the services classified (``classify_services``, after
  the observation time ``p``);
* the prediction (``core.slack.service_idle``, Eq. 3, for every classified service pod: the controller's
  ``predicted_idle``; the simulator may not import ``colocation.controller``, which talks to a cluster) and the
  capacity per node (``core.slack.batch_capacity``);
* the safety check: misses (``core.slack.prediction_misses``), the node's real slack (``real_slack``), the
  batch pods that no longer fit (``choose_evictions``, QoS order) evicted (their progress lost, as an
  Eviction API call loses it) and what the node may lend after a miss (``lendable_after_miss``).

Between refreshes, before each scheduling pass, pending batch pods of the co-located classes go onto the
published slack when some service node has room for them, filtered and ranked as the extender's verbs do a
pod requesting the batch resources (``core.slack.colocation_shortfall``, LRP on Eq. 4, paper 004 Alg. 1).
A co-located pod requests the batch resources and no cpu/memory, as the webhook's rewrite makes it; a pod
that finds no slack stays with the `product` flow (batch nodes). That is a difference from the cluster, where
the rewrite happens at admission and a rewritten pod can only wait for slack: here the choice is made when
the pod is scheduled.

``predictor="last-usage"`` is the naive comparison: a service is predicted to leave idle what it left idle at
the previous refresh (the last interval's usage), everything else identical. A third naive predictor, "the
request", predicts no idle at all: that is the `product` run without co-location.

Usage comes from the SYNTHETIC service trace (extender/sim/usage_trace.py) for services and is the request
for batch pods (the Alibaba 2017 batch file has no usage). The :class:`UsageMeter` samples it on every run,
co-located or not, so utilisation is usage / capacity of the nodes alive, the same measure for every policy.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from extender.core.characterise import (
    ServiceProfile,
    WorkloadModel,
    classify_services,
    daily_profile,
    due_for_recluster,
    fit_model,
    is_complete,
    recluster_model,
)
from extender.core.model import InvalidInputError, Node, Resources, ServiceClass, WorkloadKind
from extender.core.slack import (
    BATCH_CPU,
    BATCH_MEMORY,
    Amount,
    BatchTenant,
    batch_capacity,
    choose_evictions,
    colocation_shortfall,
    lendable,
    lendable_after_miss,
    lrp_choose,
    measured_idle,
    node_groups_for,
    prediction_misses,
    real_slack,
    service_idle,
    service_spread,
)
from extender.settings.sections import ColocateConfig, SlackConfig
from extender.sim.engine import Req, SimConfig, SimResult, Simulator, State
from extender.sim.usage_trace import ServiceUsage
from extender.sim.workloads import Workload

__all__ = [
    "COLOCATE_POLICIES",
    "Colocation",
    "ColocationStats",
    "UsageMeter",
    "colocation_settings",
    "simulate_colocation",
]

# policy name -> predictor; both run `product` underneath
COLOCATE_POLICIES: Mapping[str, str] = {
    "product-colocate": "class",
    "product-colocate-eq3": "class-eq3",
    "product-colocate-last": "last-usage",
}
PREDICTORS = ("class", "class-eq3", "last-usage")


def colocation_settings() -> SlackConfig:
    """The slack section the simulator runs with: the live defaults (settings.sections.SlackConfig: 15-min refresh,
    1-day observation and classification window, k = 20, 10 seeds, 24 h re-clustering, 5 % miss tolerance,
    evictions on) with co-location switched on for bronze."""
    return SlackConfig(enabled=True, colocate=ColocateConfig(enabled=True, classes=("bronze",)))


@dataclass(frozen=True)
class RefreshRecord:
    """What one refresh saw and decided (kept for the last refresh: tests recompute it with the core)."""

    at: float
    nodes: tuple[Node, ...]
    profiles: Mapping[str, ServiceProfile]
    classes: Mapping[str, Mapping[str, int]]
    idle: Mapping[str, Amount]
    planned: Mapping[str, Amount]  # batch_capacity before the safety check
    measured: Mapping[str, Amount]
    published: Mapping[str, Amount]
    evicted: tuple[str, ...]


@dataclass
class ColocationStats:
    """What a run measured beyond the engine's own result (every field goes into the JSON report)."""

    observe_from: float
    samples: int = 0
    usage_cpu_seconds: float = 0.0  # integral of sum(usage) over time, millicore-seconds
    usage_mem_seconds: float = 0.0
    capacity_cpu_seconds: float = 0.0
    capacity_mem_seconds: float = 0.0
    after_usage_cpu_seconds: float = 0.0  # the same from observe_from on (after the observation day)
    after_usage_mem_seconds: float = 0.0
    after_capacity_cpu_seconds: float = 0.0
    after_capacity_mem_seconds: float = 0.0
    service_samples: int = 0
    service_samples_starved: int = 0  # a service sample on a node whose usage exceeded its capacity
    node_samples_overloaded: int = 0
    refreshes: int = 0
    fits: int = 0
    reclusters: int = 0
    classified_last: int = 0
    prediction_misses: int = 0
    placed_on_slack: int = 0
    pods_on_slack: set[str] = field(default_factory=set)
    evictions: int = 0  # batch pods evicted because the slack they ran on was not there (a wrong prediction)
    evicted_pods: dict[str, int] = field(default_factory=dict)
    # per eviction, which resource the node's real slack was short of for its batch pods (diagnosis: a class
    # centre below a service's own level fails on memory; a stale last-usage on the CPU of a morning ramp)
    evictions_short_of: dict[str, int] = field(default_factory=lambda: {"cpu": 0, "memory": 0, "both": 0})
    lost_work_seconds: float = 0.0
    published_cpu_milli_last: int = 0
    published_memory_bytes_last: int = 0
    # what was lent over the run: each refresh's published total x the refresh interval (the lending a predictor
    # buys its evictions with, independent of how the batch pods then happened to fill it)
    published_cpu_milli_seconds: float = 0.0
    published_memory_byte_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        def ratio(a: float, b: float) -> float | None:
            return a / b if b > 0 else None

        return {
            "usage_utilization": {
                "cpu": ratio(self.usage_cpu_seconds, self.capacity_cpu_seconds),
                "memory": ratio(self.usage_mem_seconds, self.capacity_mem_seconds),
            },
            "usage_utilization_after_observation": {
                "from_seconds": self.observe_from,
                "cpu": ratio(self.after_usage_cpu_seconds, self.after_capacity_cpu_seconds),
                "memory": ratio(self.after_usage_mem_seconds, self.after_capacity_mem_seconds),
            },
            "usage_samples": self.samples,
            "service_usage_honoured": 1.0 - (ratio(self.service_samples_starved, self.service_samples) or 0.0),
            "service_samples": self.service_samples,
            "service_samples_starved": self.service_samples_starved,
            "node_samples_overloaded": self.node_samples_overloaded,
            "slack": {
                "refreshes": self.refreshes,
                "model_fits": self.fits,
                "reclusters": self.reclusters,
                "classified_services_at_end": self.classified_last,
                "prediction_misses": self.prediction_misses,
                "placements_on_slack": self.placed_on_slack,
                "pods_placed_on_slack": len(self.pods_on_slack),
                "evictions_wrong_prediction": self.evictions,
                "pods_evicted_wrong_prediction": len(self.evicted_pods),
                "pods_evicted_more_than_once": sum(1 for n in self.evicted_pods.values() if n > 1),
                "evictions_short_of": dict(self.evictions_short_of),
                "lost_work_seconds_wrong_prediction": self.lost_work_seconds,
                "published_cpu_core_hours": self.published_cpu_milli_seconds / 1000.0 / 3600.0,
                "published_memory_gib_hours": self.published_memory_byte_seconds / 2**30 / 3600.0,
            },
        }


def _batch_resources(r: Req) -> Resources:
    """What a co-located pod requests once rewritten: the batch resources, no cpu/memory (the webhook's rewrite)."""
    req = r.spec.requests
    return Resources.request(0, 0, extended={BATCH_CPU: req.cpu_milli, BATCH_MEMORY: req.memory_bytes})


class UsageMeter:
    """Samples usage every ``usage.sample_seconds`` on any run: services from the SYNTHETIC trace, batch pods
    at their request; integrates usage and capacity of the nodes alive, and counts the service samples on a
    node whose usage exceeded its capacity (the services there did not get what they used: the SLO risk of
    co-location)."""

    def __init__(self, usage: ServiceUsage, observe_from: float, horizon: float) -> None:
        self.usage = usage
        self.step = float(usage.sample_seconds)
        self.horizon = horizon
        self.stats = ColocationStats(observe_from)
        self.history_cpu: dict[str, tuple[list[float], list[float]]] = {}
        self.history_mem: dict[str, tuple[list[float], list[float]]] = {}
        self.last_usage: dict[str, tuple[float, float]] = {}  # pod key -> (cpu milli, memory bytes) now

    def attach(self, sim: Simulator) -> None:
        if sim.hook is not None:
            raise InvalidInputError("the run already has a hook")
        sim.hook = self
        sim.push(0.0, "hook", "sample")

    # SimHook
    def before_schedule(self, sim: Simulator) -> None:
        return None

    def on_unplace(self, sim: Simulator, r: Req) -> None:
        return None

    def on_event(self, sim: Simulator, payload: object) -> None:
        if payload != "sample":
            raise InvalidInputError(f"unknown hook event {payload!r}")
        self.sample(sim)
        self.after_sample(sim)
        nxt = sim.now + self.step
        if nxt < self.horizon:
            sim.push(nxt, "hook", "sample")

    def after_sample(self, sim: Simulator) -> None:
        return None

    def pod_usage(self, r: Req, now: float) -> tuple[float, float]:
        """Usage of a placed instance now: 0 while allocating or migrating; a service's from the trace; a batch
        pod's its request."""
        if r.state is not State.RUNNING:
            return 0.0, 0.0
        s = r.spec
        if s.kind is WorkloadKind.SERVICE and s.request_id in self.usage.cpu:
            cpu_rate, mem_rate = self.usage.rate_at(s.request_id, now)
            return cpu_rate * s.cpu_milli, mem_rate * s.memory_bytes
        return float(s.cpu_milli), float(s.memory_bytes)

    def sample(self, sim: Simulator) -> None:
        now = sim.now
        st = self.stats
        st.samples += 1
        dt = min(self.step, self.horizon - now)
        used_c = used_m = cap_c = cap_m = 0.0
        self.last_usage = {}
        for node in sim.nodes.values():
            nc = nm = 0.0
            services_here = 0
            for key, rid in node.pods.items():
                r = sim.reqs[rid]
                c, m = self.pod_usage(r, now)
                nc += c
                nm += m
                if r.spec.kind is WorkloadKind.SERVICE and r.state is State.RUNNING:
                    services_here += 1
                    self.last_usage[key] = (c, m)
                    hc = self.history_cpu.setdefault(key, ([], []))
                    hm = self.history_mem.setdefault(key, ([], []))
                    hc[0].append(now)
                    hc[1].append(c)
                    hm[0].append(now)
                    hm[1].append(m)
            alloc = node.allocatable
            used_c += nc
            used_m += nm
            cap_c += alloc.cpu_milli
            cap_m += alloc.memory_bytes
            st.service_samples += services_here
            if nc > alloc.cpu_milli or nm > alloc.memory_bytes:
                st.node_samples_overloaded += 1
                st.service_samples_starved += services_here
        st.usage_cpu_seconds += used_c * dt
        st.usage_mem_seconds += used_m * dt
        st.capacity_cpu_seconds += cap_c * dt
        st.capacity_mem_seconds += cap_m * dt
        if now >= st.observe_from:
            st.after_usage_cpu_seconds += used_c * dt
            st.after_usage_mem_seconds += used_m * dt
            st.after_capacity_cpu_seconds += cap_c * dt
            st.after_capacity_mem_seconds += cap_m * dt


class Colocation(UsageMeter):
    """The slack controller's refresh and the co-located placement on a `product` run (see the module doc)."""

    def __init__(
        self,
        usage: ServiceUsage,
        horizon: float,
        settings: SlackConfig,
        classes: Mapping[str, ServiceClass],
        predictor: str = "class",
    ) -> None:
        if predictor not in PREDICTORS:
            raise InvalidInputError(f"unknown predictor {predictor!r} (known: {', '.join(PREDICTORS)})")
        if not settings.enabled or not settings.colocate.enabled:
            raise InvalidInputError("co-location needs slack.enabled and slack.colocate.enabled")
        if settings.refresh_seconds % usage.sample_seconds:
            raise InvalidInputError(
                f"slack.refresh_seconds ({settings.refresh_seconds}) must be a multiple of the usage sample step"
                f" ({usage.sample_seconds} s): a refresh reads the usage sampled at that instant"
            )
        super().__init__(usage, settings.classify_seconds, horizon)
        self.settings = settings
        self.classes = classes
        self.predictor = predictor
        self.model: WorkloadModel | None = None
        self.published: dict[str, Amount] = {}
        self.colocated: set[str] = set()  # request ids running (or allocating) on lent slack
        self.previous_usage: dict[str, tuple[float, float]] = {}  # pod key -> usage at the previous refresh
        self.last_refresh: RefreshRecord | None = None
        self._evicted_now: list[str] = []

    # ---- the refresh: SlackController._step with the simulator's state -------------------------------

    def after_sample(self, sim: Simulator) -> None:
        now = sim.now
        if round(now) % round(self.settings.refresh_seconds) == 0:
            self.refresh(sim)

    def _profiles(self, services: Mapping[str, Resources], now: float) -> dict[str, ServiceProfile]:
        """Each service's daily profiles over the last ``classify_seconds`` (``core.characterise.daily_profile``
        of usage / request, the controller's ``kube.usage.service_profiles`` on the simulator's samples)."""
        since = now - self.settings.classify_seconds
        interval = self.settings.characterise.interval_seconds
        out: dict[str, ServiceProfile] = {}
        for key, req in services.items():
            hc, hm = self.history_cpu.get(key), self.history_mem.get(key)
            if hc is None or hm is None or req.cpu_milli <= 0 or req.memory_bytes <= 0:
                continue
            lo = bisect.bisect_left(hc[0], since)
            times = hc[0][lo:]
            if not times:
                continue
            cpu = np.asarray(hc[1][lo:]) / req.cpu_milli
            mem = np.asarray(hm[1][lo:]) / req.memory_bytes
            out[key] = ServiceProfile(
                daily_profile(times, cpu, interval), daily_profile(times, mem, interval), times[-1] - times[0]
            )
        return out

    def refresh(self, sim: Simulator) -> None:
        st = self.stats
        st.refreshes += 1
        now = sim.now
        cfg = self.settings.characterise.core()
        nodes = [sim._core_node(n) for n in sim.nodes.values()]
        services = {p.key: p.requests for n in nodes for p in n.pods if p.kind is WorkloadKind.SERVICE}
        classes: dict[str, dict[str, int]] = {}
        profiles: dict[str, ServiceProfile] = {}
        self._evicted_now = []
        if services:
            profiles = self._profiles(services, now)
            complete = {k: p for k, p in profiles.items() if is_complete(p.cpu) and is_complete(p.memory)}
            if self.model is None:
                # the controller's start(): fit once some service has a whole day of usage
                if complete:
                    self.model = fit_model(cfg, complete, now)
                    st.fits += 1
            elif due_for_recluster(self.model, now, cfg.recluster_seconds) and complete:
                self.model = recluster_model(cfg, self.model, complete, now)
                st.reclusters += 1
            if self.model is not None:
                classes = classify_services(self.model, profiles, cfg.observation_seconds)
        st.classified_last = len(classes)
        if self.model is None:
            self.published = {}
            self.previous_usage = dict(self.last_usage)
            return
        idle = self._predict(nodes, classes, profiles, now)
        own = self.settings.own_level.core() if self.predictor == "class" else None
        if own is None:
            amounts = batch_capacity(nodes, idle)
        else:
            # the controller's predicted_spread: each service's spread, held back pooled per node
            spread = {
                pod.key: service_spread(self.model, classes[pod.key], pod.requests, now, profiles.get(pod.key), own)
                for node in nodes
                for pod in node.pods
                if pod.key in classes
            }
            amounts = batch_capacity(nodes, idle, spread, own.node_sigmas)
        planned = dict(amounts)
        measured = {k: measured_idle(services[k], c, m) for k, (c, m) in self.last_usage.items() if k in services}
        if idle:
            self._safety(sim, services, idle, measured, amounts, now)
        self.published = amounts
        self.last_refresh = RefreshRecord(
            now, tuple(nodes), profiles, classes, idle, planned, measured, dict(amounts), tuple(self._evicted_now)
        )
        self.previous_usage = dict(self.last_usage)
        st.published_cpu_milli_last = sum(a.cpu_milli for a in amounts.values())
        st.published_memory_bytes_last = sum(a.memory_bytes for a in amounts.values())
        st.published_cpu_milli_seconds += st.published_cpu_milli_last * self.settings.refresh_seconds
        st.published_memory_byte_seconds += st.published_memory_bytes_last * self.settings.refresh_seconds

    def _predict(
        self,
        nodes: Sequence[Any],
        classes: Mapping[str, Mapping[str, int]],
        profiles: Mapping[str, ServiceProfile],
        now: float,
    ) -> dict[str, Amount]:
        assert self.model is not None
        if self.predictor in ("class", "class-eq3"):
            # the live controller's predicted_idle: Eq. 3 for every service pod that has classes, corrected by
            # the service's own level (slack.own_level) unless the paper's Eq. 3 alone is asked for
            horizon = self.settings.characterise.prediction_seconds
            own = self.settings.own_level.core() if self.predictor == "class" else None
            return {
                pod.key: service_idle(
                    self.model, classes[pod.key], pod.requests, now, horizon, profiles.get(pod.key), own
                )
                for node in nodes
                for pod in node.pods
                if pod.key in classes
            }
        # naive: the idle of the previous refresh's measurement, for the same (classified) services
        out: dict[str, Amount] = {}
        for node in nodes:
            for pod in node.pods:
                if pod.key in classes and pod.key in self.previous_usage:
                    c, m = self.previous_usage[pod.key]
                    out[pod.key] = measured_idle(pod.requests, c, m)
        return out

    def _safety(
        self,
        sim: Simulator,
        services: Mapping[str, Resources],
        idle: Mapping[str, Amount],
        measured: Mapping[str, Amount],
        amounts: dict[str, Amount],
        now: float,
    ) -> None:
        """SlackController._safety on the simulator: count misses, evict what no longer fits, and let a missed
        node lend only its real slack."""
        misses = set(prediction_misses(idle, measured, services, self.settings.miss_tolerance))
        self.stats.prediction_misses += len(misses)
        for name, node in list(sim.nodes.items()):
            lent = {k: idle[k] for k in node.pods if k in idle}
            if not lent:
                continue
            real = real_slack(lent, measured)
            tenants = []
            for key, rid in node.pods.items():
                if rid not in self.colocated:
                    continue
                r = sim.reqs[rid]
                cls = self.classes.get(r.spec.class_name)
                running = max(0.0, now - r.run_started) if r.state is State.RUNNING else 0.0
                tenants.append(
                    BatchTenant(
                        key,
                        Amount(r.spec.cpu_milli, r.spec.memory_bytes),
                        cls.importance if cls is not None else max(c.importance for c in self.classes.values()) + 1,
                        cls.slo if cls is not None else 1.0,
                        running,
                    )
                )
            victims = choose_evictions(real, tenants)
            if victims or misses & lent.keys():
                amounts[name] = lendable_after_miss(amounts.get(name, Amount()), real)
            if not self.settings.evict:
                continue
            if victims:
                demand = Amount.total(t.demand for t in tenants)
                cpu_short, mem_short = demand.cpu_milli > real.cpu_milli, demand.memory_bytes > real.memory_bytes
                short = "both" if cpu_short and mem_short else "cpu" if cpu_short else "memory"
                self.stats.evictions_short_of[short] += len(victims)
            for key in victims:
                r = sim.reqs[node.pods[key]]
                self.stats.evictions += 1
                rid = r.spec.request_id
                self.stats.evicted_pods[rid] = self.stats.evicted_pods.get(rid, 0) + 1
                r.fold(now)
                self.stats.lost_work_seconds += r.work
                self._evicted_now.append(key)
                sim._unplace(r, lose_work=True)
            if victims:
                sim.request_schedule()

    # ---- placement on the published slack ------------------------------------------------------------

    def before_schedule(self, sim: Simulator) -> None:
        """Pending pods of the co-located classes onto the published slack, as the verbs treat a pod that
        requests the batch resources: each node's published amount is its batch allocatable, the filter is
        ``core.slack.colocation_shortfall`` (the slack left covers the demand) and the choice is LRP on Eq. 4's
        predicted availability (free by requests + slack left, ``core.slack.lendable``), the node
        ``core.slack.colocated_scores`` ranks first (``lrp_choose``, cpu 0.38 / memory 0.62)."""
        if not any(a.cpu_milli > 0 and a.memory_bytes > 0 for a in self.published.values()):
            return
        wanted = self.settings.colocate.classes
        alloc: dict[str, Resources] = {}
        for name, amount in self.published.items():
            node = sim.nodes.get(name)
            if node is None or node.cordoned:
                continue
            a = node.allocatable
            alloc[name] = Resources.request(
                a.cpu_milli, a.memory_bytes, a.pods, {BATCH_CPU: amount.cpu_milli, BATCH_MEMORY: amount.memory_bytes}
            )
        for r in sim._pending():
            s = r.spec
            if s.kind is not WorkloadKind.BATCH or s.class_name not in wanted:
                continue
            demand = Resources(s.cpu_milli, s.memory_bytes, 1)
            groups = node_groups_for(s.kind, _batch_resources(r))
            candidates: list[tuple[str, Resources, Amount]] = []
            for name, al in alloc.items():
                node = sim.nodes[name]
                if node.group not in groups:
                    continue
                requested = sim._core_node(node).requested
                if colocation_shortfall(al, requested, demand) is not None:
                    continue
                free = Amount(al.cpu_milli - requested.cpu_milli, al.memory_bytes - requested.memory_bytes)
                capacity = Resources(al.cpu_milli, al.memory_bytes, al.pods)
                candidates.append((name, capacity, free + lendable(al, requested)))
            choice = lrp_choose(candidates, demand)
            if choice is None:
                continue
            self.colocated.add(s.request_id)
            sim._requests[s.request_id] = _batch_resources(r)
            sim._place(r, sim.nodes[choice])
            self.stats.placed_on_slack += 1
            self.stats.pods_on_slack.add(s.request_id)

    def on_unplace(self, sim: Simulator, r: Req) -> None:
        """A co-located instance left its node (done, evicted, preempted or moved): it requests cpu/memory
        again, as a pod re-created by its owner would before the webhook rewrites it once more."""
        rid = r.spec.request_id
        if rid in self.colocated:
            self.colocated.discard(rid)
            sim._requests[rid] = r.spec.requests


# --------------------------------------------------------------------------------------------------------
# a run and its figures
# --------------------------------------------------------------------------------------------------------


@dataclass
class ColocationRun:
    result: SimResult
    stats: ColocationStats


def simulate_colocation(
    workload: Workload,
    usage: ServiceUsage,
    policy: str,
    config: SimConfig | None = None,
    settings: SlackConfig | None = None,
) -> ColocationRun:
    """One run of ``policy`` (`product-colocate`, `product-colocate-last`, or any engine policy: then usage
    is only measured) on a workload whose services have a usage trace."""
    if workload.horizon is None:
        raise InvalidInputError(f"workload {workload.name}: co-location runs need a horizon")
    services = {r.request_id for r in workload.requests if r.kind is WorkloadKind.SERVICE}
    missing = sorted(services - set(usage.cpu))
    if missing:
        raise InvalidInputError(f"workload {workload.name}: no usage trace for services {missing[:3]}")
    predictor = COLOCATE_POLICIES.get(policy)
    sim = Simulator(workload, "product" if predictor is not None else policy, config)
    slack = settings or colocation_settings()
    meter: UsageMeter
    if predictor is None:
        meter = UsageMeter(usage, slack.classify_seconds, workload.horizon)
    else:
        meter = Colocation(usage, workload.horizon, slack, sim.prod.classes, predictor)
    meter.attach(sim)
    result = sim.run()
    result.policy = policy
    return ColocationRun(result, meter.stats)
