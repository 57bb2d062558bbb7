"""Prometheus metrics of the agent (prefix ``qos_extender_``), in a registry of their own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["MIGRATION_STEP_BUCKETS", "AgentMetrics"]

# Dump/restore of small processes take tens of milliseconds; large images seconds to minutes. Shared with the
# consolidation flow, which times the same steps from the orchestrating side: their histograms line up.
MIGRATION_STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.migrations = Counter(
            "qos_extender_migrations",
            "Migrations coordinated by this agent (as source), by outcome: succeeded, rolled_back, in_doubt, failed.",
            ["outcome"],
            registry=r,
        )
        self.checkpoint_seconds = Histogram(
            "qos_extender_checkpoint_seconds",
            "Time of one checkpoint (stage precopy: leave-running dump; final: the dump that stops the source).",
            ["stage"],
            buckets=MIGRATION_STEP_BUCKETS,
            registry=r,
        )
        self.transfer_seconds = Histogram(
            "qos_extender_transfer_seconds",
            "Time to stream one archive to the destination and have it verified (sha256) and unpacked.",
            ["stage"],
            buckets=MIGRATION_STEP_BUCKETS,
            registry=r,
        )
        self.restore_seconds = Histogram(
            "qos_extender_restore_seconds",
            "Time of one restore, where: destination (migration) or source (rollback).",
            ["where"],
            buckets=MIGRATION_STEP_BUCKETS,
            registry=r,
        )
        self.bytes_moved = Counter(
            "qos_extender_migration_bytes",
            "Archive bytes sent to destinations and verified there.",
            registry=r,
        )
        self.work_preserved = Counter(
            "qos_extender_work_preserved_seconds",
            "Work kept by successful migrations instead of restarting (process age / simulated progress), seconds.",
            registry=r,
        )
        self.retries = Counter(
            "qos_extender_migration_retries",
            "Protocol steps retried after a transient failure, by step.",
            ["step"],
            registry=r,
        )
        self.refused = Counter(
            "qos_extender_agent_requests_refused",
            "Requests this agent refused before acting, by route and why: identity (the caller's certificate may "
            "not call the route), owner (another agent's migration), policy (the pod may not be migrated), "
            "destination (not the agent of the node named, or not https), staging (no room for the archive).",
            ["route", "reason"],
            registry=r,
        )
        self.certificate_reloads = Counter(
            "qos_extender_certificate_reloads",
            "Reloads of this agent's certificate files after they changed, by result (ok, failed).",
            ["result"],
            registry=r,
        )
