"""Prometheus metrics of the extender (prefix ``qos_extender_``), in a registry of their own.

Names follow the Prometheus conventions: base units in the name (``_seconds``), ``_total`` on counters, one
metric per meaning with labels for the dimensions. A private registry keeps tests and several apps in one
process from colliding, and /metrics exposes exactly these.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from extender.kube.snapshot import Snapshot

__all__ = ["VERBS", "Metrics"]

VERBS = ("filter", "prioritize", "preempt", "bind")

# Verb latency buckets: sub-millisecond (nodeCacheCapable, small clusters) up to the 45 s httpTimeout, fine enough
# between 10 ms and 1 s to read a bind's p50/p99 against the API server's own POST binding latency (whose
# apiserver_request_duration_seconds buckets are as fine there; bench/e2e_throughput.py prints both per phase).
_SUBSECOND = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75)
_BUCKETS = (*_SUBSECOND, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.request_duration = Histogram(
            "qos_extender_request_duration_seconds",
            "Time to answer one extender verb request, body parsing and serialisation included.",
            ["verb"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "qos_extender_requests",
            "Extender verb requests by outcome: ok, error (answered in the protocol's Error field), "
            "bad_request, too_large, not_ready, timeout, internal.",
            ["verb", "outcome"],
            registry=r,
        )
        self.filtered_nodes = Counter(
            "qos_extender_filtered_nodes",
            "Nodes the filter verb rejected, by reason.",
            ["reason"],
            registry=r,
        )
        self.bind_retries = Counter("qos_extender_bind_retries", "Binding attempts retried.", registry=r)
        self.bind_failures = Counter(
            "qos_extender_bind_failures", "Bind verb calls answered with an Error.", registry=r
        )
        self.decisions = Counter(
            "qos_extender_decisions",
            "Placement decisions by policy (filter, bfd, time-bin-bfd, least-allocated, qos-preemption).",
            ["policy"],
            registry=r,
        )
        self.preemption_victims = Counter(
            "qos_extender_preemption_victims",
            "Victims proposed by kube-scheduler that the QoS rules kept or dropped.",
            ["outcome"],
            registry=r,
        )
        self.annotation_problems = Counter(
            "qos_extender_annotation_problems",
            "Malformed qos.kube-qos-extender.io/ annotations found (each reported with an Event).",
            registry=r,
        )
        self.watch_restarts = Counter(
            "qos_extender_watch_restarts",
            "Restarts of a list+watch, by resource and reason (timeout, gone, error).",
            ["resource", "reason"],
            registry=r,
        )
        self.ledger_expired = Counter(
            "qos_extender_ledger_expired",
            "Assumed bindings that expired before the watch showed the pod bound.",
            registry=r,
        )
        self.snapshot_age = Gauge(
            "qos_extender_snapshot_age_seconds",
            "Seconds since the snapshot last applied a list or a watch event (-1 before the first).",
            registry=r,
        )
        self.snapshot_ready = Gauge(
            "qos_extender_snapshot_ready", "1 once nodes and pods were fully listed, else 0.", registry=r
        )
        self.snapshot_objects = Gauge(
            "qos_extender_snapshot_objects",
            "Objects in the snapshot: nodes, pods, bound_pods, assumed_pods (our binds not yet seen).",
            ["kind"],
            registry=r,
        )
        self.binds = Gauge(
            "qos_extender_binds",
            "Bind verb calls in the binder by state: in_flight (holding one of bind.max_in_flight slots, its POST on "
            "the wire or being retried) and waiting (for a slot). Waiting that stays up means the API server binds "
            "slower than kube-scheduler schedules.",
            ["state"],
            registry=r,
        )
        self.requests_refused = Counter(
            "qos_extender_requests_refused",
            "Requests refused before any work, by server (extender: the TLS listener, extender-loopback), route "
            "(other: an unknown path) and reason: no_certificate, identity_not_allowed, no_identity_configured "
            "(403); body_too_large (413), read_timeout (408); pod_already_bound, pod_not_ours, pod_unknown (/bind, "
            "answered in its Error field).",
            ["server", "route", "reason"],
            registry=r,
        )
        self.certificate_reloads = Counter(
            "qos_extender_certificate_reloads",
            "Certificate files re-read after they changed, by listener (extender: the TLS listener) and result "
            "(ok; failed: the old chain stays in use and the next check tries again). Same labels as the "
            "autoscaler's, so one alert covers both.",
            ["listener", "result"],
            registry=r,
        )
        for verb in VERBS:
            self.request_duration.labels(verb)
        for result in ("ok", "failed"):
            self.certificate_reloads.labels("extender", result)

    def update_snapshot(self, snapshot: Snapshot, now: float) -> None:
        age = snapshot.age(now)
        self.snapshot_age.set(-1.0 if age is None else age)
        self.snapshot_ready.set(1.0 if snapshot.ready else 0.0)
        for kind, count in snapshot.counts().items():
            self.snapshot_objects.labels(kind).set(count)

    def update_binder(self, binder: object) -> None:
        """From the binder's own counts (kube.binder.KubeBinder); a binder without them (tests' stand-ins,
        replays) leaves the gauge unset."""
        for state in ("in_flight", "waiting"):
            count = getattr(binder, state, None)
            if isinstance(count, int):
                self.binds.labels(state).set(count)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
