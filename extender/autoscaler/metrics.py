"""Prometheus metrics of the autoscaler sidecar (prefix ``qos_extender_autoscaler_``), in a registry of their own.

Base units in names (seconds, bytes, cores; money as ``dollars_per_hour``), ``_total`` added to counters by the
client library, labels for the dimensions (group, flavour, reason, outcome).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from extender.autoscaler.loop import Decisions
from extender.core.model import NodeGroup

__all__ = ["AutoscalerMetrics"]

_P = "qos_extender_autoscaler_"
_LAG_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 90, 120, 180, 240, 300, 600, 900, 1800)
# request sizes: powers of two from 1 KiB to 512 MiB (the gRPC receive limits are sized from these)
_BYTES = tuple(float(2**k) for k in range(10, 30))
_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class AutoscalerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.planned_nodes = Counter(
            _P + "planned_nodes",
            "Nodes the planner decided to add, by node group and flavour.",
            ["group", "flavour"],
            registry=r,
        )
        self.plan_cost = Gauge(
            _P + "plan_cost_dollars_per_hour",
            "Predicted cost per hour of the nodes in the group's latest non-empty plan.",
            ["group"],
            registry=r,
        )
        self.plan_nodes = Gauge(
            _P + "plan_nodes",
            "Nodes per flavour in the group's latest non-empty plan.",
            ["group", "flavour"],
            registry=r,
        )
        self.cluster_cost = Gauge(
            _P + "nodes_cost_dollars_per_hour",
            "Price per hour of the catalogued nodes present plus those being provisioned.",
            registry=r,
        )
        self.unschedulable = Gauge(
            _P + "unschedulable_pods",
            "Unschedulable pods of our scheduler profile(s) that fit no node now.",
            ["group"],
            registry=r,
        )
        self.uncovered = Gauge(
            _P + "uncovered_pods", "Unschedulable pods not covered by a node being provisioned.", ["group"], registry=r
        )
        self.unservable = Gauge(
            _P + "unservable_pods", "Pods no flavour of the catalogue can hold (never planned).", registry=r
        )
        self.gave_up = Gauge(
            _P + "given_up_pods", "Pods still unschedulable after max_attempts_per_pod nodes were added.", registry=r
        )
        self.provisioning = Gauge(_P + "provisioning_nodes", "Nodes requested and not joined yet.", registry=r)
        self.timeouts = Counter(
            _P + "provisioning_timeouts", "Requested nodes forgotten after the provisioning timeout.", registry=r
        )
        self.lag = Histogram(
            _P + "acquisition_lag_seconds",
            "Measured request-to-join time of our nodes.",
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self.lag_estimate = Gauge(
            _P + "acquisition_lag_estimate_seconds",
            "Lag the forecast uses (quantile of recent measurements).",
            registry=r,
        )
        self.forecast_cpu = Gauge(
            _P + "forecast_shortage_cpu_cores", "Batch-group cpu shortage at now + lag (paper 001 Eq. 2).", registry=r
        )
        self.forecast_memory = Gauge(
            _P + "forecast_shortage_memory_bytes",
            "Batch-group memory shortage at now + lag (paper 001 Eq. 2).",
            registry=r,
        )
        self.scaled_down = Counter(
            _P + "scaled_down_nodes", "Nodes removed, by reason (idle, timeout).", ["reason"], registry=r
        )
        self.underutilized = Gauge(
            _P + "underutilized_batch_nodes", "Batch nodes handed to consolidation in the latest scan.", registry=r
        )
        self.limited = Counter(
            _P + "limited_scans", "Scans whose plan was cut by max_nodes_per_cycle / max_nodes.", registry=r
        )
        self.reshaped = Counter(
            _P + "cap_reshaped_plans",
            "Plans re-made with larger flavours because the cheapest one needed more nodes than max_nodes allows.",
            ["group"],
            registry=r,
        )
        self.scan_duration = Histogram(
            _P + "scan_duration_seconds", "Time of one planning scan.", buckets=_FAST, registry=r
        )
        self.expander_requests = Counter(
            _P + "expander_requests", "cluster-autoscaler BestOptions calls by outcome.", ["outcome"], registry=r
        )
        self.expander_duration = Histogram(
            _P + "expander_duration_seconds", "Time to answer one BestOptions call.", buckets=_FAST, registry=r
        )
        self.expander_choice = Counter(
            _P + "expander_choices", "Flavour chosen among cluster-autoscaler's options.", ["flavour"], registry=r
        )
        self.cloudprovider_requests = Counter(
            _P + "cloudprovider_requests",
            "cluster-autoscaler externalgrpc CloudProvider calls by method and gRPC status code.",
            ["method", "code"],
            registry=r,
        )
        self.cloudprovider_duration = Histogram(
            _P + "cloudprovider_duration_seconds",
            "Time to answer one externalgrpc CloudProvider call.",
            ["method"],
            buckets=_FAST,
            registry=r,
        )
        self.cloudprovider_nodes = Counter(
            _P + "cloudprovider_nodes",
            "Nodes cluster-autoscaler asked for through the externalgrpc provider, by node group and action "
            "(requested, deleted, cancelled, expired).",
            ["node_group", "action"],
            registry=r,
        )
        self.expander_nodes = Counter(
            _P + "expander_chosen_nodes",
            "Nodes of the option our expander chose for cluster-autoscaler, by flavour and demand "
            "(provisioning-request: our own requests' pods; pods: ordinary pending pods).",
            ["flavour", "demand"],
            registry=r,
        )
        self.provreq_nodes = Counter(
            _P + "provisioning_request_nodes",
            "Planned nodes handed to cluster-autoscaler as ProvisioningRequest pod sets, by node group, flavour and "
            "outcome (created, create_failed, provisioned, fulfilled, failed, timed_out): the plans CA carried out "
            "against ours.",
            ["group", "flavour", "outcome"],
            registry=r,
        )
        self.provreq_seconds_hist = Histogram(
            _P + "provisioning_request_seconds",
            "Age of a ProvisioningRequest when cluster-autoscaler marked it Provisioned (stage=provisioned) and when "
            "every pod it was made for was bound (stage=fulfilled).",
            ["stage"],
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self.provreq_pending = Gauge(
            _P + "provisioning_requests_open",
            "ProvisioningRequests of ours cluster-autoscaler has not fulfilled yet.",
            registry=r,
        )
        self.grpc_message_bytes = Histogram(
            _P + "grpc_message_bytes",
            "Size of each request message cluster-autoscaler sent to our gRPC servers (server: expander, "
            "cloudprovider), by method: what max_message_bytes is sized from.",
            ["server", "method"],
            buckets=_BYTES,
            registry=r,
        )
        self.refused_calls = Counter(
            _P + "refused_calls",
            "Calls to the sidecar's servers (expander, cloudprovider, metrics) refused or failed, by method or path "
            "and reason (too_large, permission_denied, no_certificate, invalid_argument, internal, unknown, "
            "deadline_exceeded, error): on the gRPC servers cluster-autoscaler then falls back to its own choice.",
            ["server", "method", "reason"],
            registry=r,
        )
        self.certificate_reloads = Counter(
            "qos_extender_certificate_reloads",
            "Certificate files re-read after they changed, by listener and result (ok; failed: the old chain "
            "stays in use).",
            ["listener", "result"],
            registry=r,
        )

        self._plan_labels: dict[str, set[str]] = {}

    def reloaded(self, listener: str) -> Callable[[bool], None]:
        """The on_reload callback of one listener's certificates."""
        return lambda ok: self.certificate_reloads.labels(listener, "ok" if ok else "failed").inc()

    def provreq_outcome(self, group: str, flavour: str, outcome: str, nodes: int = 1) -> None:
        self.provreq_nodes.labels(group, flavour, outcome).inc(nodes)

    def provreq_seconds(self, stage: str, seconds: float) -> None:
        self.provreq_seconds_hist.labels(stage).observe(max(0.0, seconds))

    def observe(self, d: Decisions) -> None:
        for group in NodeGroup:
            self.unschedulable.labels(group.value).set(d.unschedulable.get(group, 0))
            self.uncovered.labels(group.value).set(d.uncovered.get(group, 0))
        for plan in d.plans:
            if plan.reshaped:
                self.reshaped.labels(plan.group.value).inc()
            if not plan.flavour_counts:
                continue
            self.plan_cost.labels(plan.group.value).set(plan.cost_per_hour)
            for old in self._plan_labels.get(plan.group.value, set()) - set(plan.flavour_counts):
                self.plan_nodes.remove(plan.group.value, old)
            self._plan_labels[plan.group.value] = set(plan.flavour_counts)
            for flavour, n in plan.flavour_counts.items():
                self.plan_nodes.labels(plan.group.value, flavour).set(n)
        for request in d.provision:
            self.planned_nodes.labels(request.group.value, request.flavour.name).inc()
        for _, lag in d.arrived:
            self.lag.observe(lag)
        self.timeouts.inc(len(d.cancel))
        self.scaled_down.labels("idle").inc(len(d.delete))
        self.unservable.set(d.unservable)
        self.gave_up.set(d.gave_up)
        self.provisioning.set(d.provisioning)
        self.lag_estimate.set(d.lag_estimate)
        self.forecast_cpu.set(d.forecast.cpu_milli / 1000)
        self.forecast_memory.set(d.forecast.memory_bytes)
        self.cluster_cost.set(d.nodes_cost_per_hour)
        if d.consolidation is not None:
            self.underutilized.set(len(d.consolidation.candidates))
        if d.limited:
            self.limited.inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
