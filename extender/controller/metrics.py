"""Prometheus metrics of the QoS controller (prefix ``qos_extender_controller_``), in the extender's registry.

Counters and the gate-wait histogram are updated as things happen. The SLI distributions (availability per
class, SLO fulfilment, Q of pending and running requests) describe the CURRENT state of every live request,
which a cumulative Histogram cannot express (a request's availability moves both ways), so a custom collector
computes them at scrape time from the running controller's accounts (and the last pass's Q values).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["AVAILABILITY_BUCKETS", "ControllerMetrics", "RequestSample"]

AVAILABILITY_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.97, 0.99, 0.999, 1.0)
Q_BUCKETS = (-3600.0, -600.0, -120.0, -60.0, -10.0, 0.0, 10.0, 60.0, 120.0, 600.0, 3600.0, 36000.0)
GATE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


@dataclass(frozen=True, slots=True)
class RequestSample:
    class_name: str
    state: str  # pending | running
    availability: float
    q: float | None
    slo: float


def _histogram(
    name: str, doc: str, labels: list[str], groups: Mapping[tuple[str, ...], list[float]], buckets: tuple[float, ...]
) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=labels)
    for label_values, values in sorted(groups.items()):
        counts = []
        for b in buckets:
            counts.append((repr(float(b)), float(sum(v <= b for v in values))))
        counts.append(("+Inf", float(len(values))))
        fam.add_metric(list(label_values), counts, sum_value=float(sum(values)))
    return fam


@dataclass(eq=False)  # registries key collectors by identity: keep the default hash
class _SliCollector(Collector):
    samples: list[RequestSample] = field(default_factory=list)
    # Computed when scraped, on the event loop that serves /metrics and owns the accounts: a pass used to build
    # one sample per live request every second, O(requests) on the loop the verbs share, for a scrape every
    # 15-30 s (at 10,000 pods it was a quarter of each pass while binding; issue 34).
    source: Callable[[], list[RequestSample]] | None = None

    def collect(self) -> Iterator[Metric]:
        by_class: dict[tuple[str, ...], list[float]] = {}
        q_by: dict[tuple[str, ...], list[float]] = {}
        ok: dict[str, list[bool]] = {}
        samples = self.source() if self.source is not None else self.samples
        for s in samples:
            by_class.setdefault((s.class_name,), []).append(s.availability)
            ok.setdefault(s.class_name, []).append(s.availability >= s.slo - 1e-9)
            if s.q is not None:
                q_by.setdefault((s.class_name, s.state), []).append(s.q)
        yield _histogram(
            "qos_extender_controller_request_availability",
            "Current availability e/(e+p) of every live request, by class (not cumulative: computed when scraped).",
            ["class"],
            by_class,
            AVAILABILITY_BUCKETS,
        )
        yield _histogram(
            "qos_extender_controller_request_q_seconds",
            "Current QoS metric Q (TTV when >= 0, recoverability when < 0; workload seconds) by class and state.",
            ["class", "state"],
            q_by,
            Q_BUCKETS,
        )
        g = GaugeMetricFamily(
            "qos_extender_controller_slo_fulfillment",
            "Share of live requests of the class at or above its SLO.",
            labels=["class"],
        )
        for name, flags in sorted(ok.items()):
            g.add_metric([name], sum(flags) / len(flags))
        yield g
        n = GaugeMetricFamily(
            "qos_extender_controller_requests", "Live requests by class and state.", labels=["class", "state"]
        )
        counts: dict[tuple[str, str], int] = {}
        for s in samples:
            counts[(s.class_name, s.state)] = counts.get((s.class_name, s.state), 0) + 1
        for (cls, state), value in sorted(counts.items()):
            n.add_metric([cls, state], value)
        yield n


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.preemptions = Counter(
            "qos_extender_controller_preemptions",
            "Evictions for QoS preemption, by the rule that allowed them: qos (base rule, victim above its safety "
            "margin), importance (relaxation i), peer (relaxation ii).",
            ["reason"],
            registry=r,
        )
        self.disruptions = Counter(
            "qos_extender_controller_disruptions",
            "QoS preemptions not made as asked by the disruption guard rails, by kind (preemption) and decision: "
            "dry_run (each victim reported, once per report interval; nothing evicted, the pod not released), waited "
            "(a pass a budget held it in).",
            ["kind", "decision"],
            registry=r,
        )
        self.eviction_failures = Counter(
            "qos_extender_controller_eviction_failures",
            "Evictions refused (pdb: 429 from a PodDisruptionBudget; error: anything else); the pod waits.",
            ["reason"],
            registry=r,
        )
        self.releases = Counter(
            "qos_extender_controller_releases",
            "Scheduling gates removed: fits (free space), preemption (after evictions), priority (handed to "
            "kube-scheduler's priority preemption), timeout (max_gate_seconds).",
            ["reason"],
            registry=r,
        )
        self.gate_timeouts = Counter(
            "qos_extender_controller_gate_timeouts",
            "Gates held longer than controller.max_gate_seconds and released.",
            registry=r,
        )
        self.requeued = Counter(
            "qos_extender_controller_requeued_pods",
            "Released pods put back in the queue because the host they were pinned to lost its room (or went) "
            "before kube-scheduler bound them: recreated (a bare pod, re-created gated and unpinned), deleted (an "
            "owned pod, its owner re-creates it), failed (left as it was; retried next pass).",
            ["outcome"],
            registry=r,
        )
        self.gate_wait = Histogram(
            "qos_extender_controller_gate_wait_seconds",
            "Wall-clock time a pod spent behind the ordering gate before release.",
            ["class"],
            buckets=GATE_BUCKETS,
            registry=r,
        )
        self.passes = Counter(
            "qos_extender_controller_passes", "Controller passes (event-driven or watchdog).", registry=r
        )
        self.pass_duration = Histogram(
            "qos_extender_controller_pass_duration_seconds",
            "Time of one decision pass (observe, decide), API calls excluded.",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        )
        self.account_writes = Counter(
            "qos_extender_controller_account_writes",
            "Writes of SLI accounts to owner annotations, by outcome (ok, error, unsupported owner, gone: the "
            "owner was deleted, nothing written).",
            ["outcome"],
            registry=r,
        )
        self.accounts_loaded = Counter(
            "qos_extender_controller_accounts_loaded",
            "Accounts rebuilt from annotations at start, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.admission_bypassed = Counter(
            "qos_extender_controller_admission_bypassed",
            "qos-scheduler pods of this instance created without our admission webhook (it did not answer and its "
            "failurePolicy is Ignore): scheduled without Q ordering, still accounted. Each pod once (annotated).",
            registry=r,
        )
        self.leader = Gauge(
            "qos_extender_controller_leader",
            "1 while this replica holds the controller's Lease (or runs without leader election), else 0. "
            "Exactly one replica per controller instance should report 1.",
            registry=r,
        )
        self._sli = _SliCollector()
        r.register(self._sli)

    def set_samples(self, samples: list[RequestSample]) -> None:
        """Fixed samples (a term that ended sets none), in place of any source."""
        self._sli.samples = samples
        self._sli.source = None

    def set_sample_source(self, source: Callable[[], list[RequestSample]]) -> None:
        """The running controller's samples, computed at each scrape."""
        self._sli.source = source
