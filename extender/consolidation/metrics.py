"""Metrics of the consolidation flow (prefix ``qos_extender_consolidation_``), registered in the autoscaler's
registry so they appear on its /metrics. Per-migration figures come from the source agent's outcome record
(the agents keep their own ``qos_extender_migrations_total``, ``..._checkpoint_seconds`` etc. on their
/metrics); these count what the flow itself saw, across all agents."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from extender.agent.metrics import MIGRATION_STEP_BUCKETS as _BUCKETS  # the same steps, timed by the flow

__all__ = ["ConsolidationMetrics"]

_P = "qos_extender_consolidation_"


class ConsolidationMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.migrations = Counter(
            _P + "migrations",
            "Pod migrations of the flow by outcome: succeeded, rolled_back, in_doubt, failed, refused, unknown.",
            ["outcome"],
            registry=r,
        )
        self.checkpoint_seconds = Histogram(
            _P + "checkpoint_seconds", "Checkpoint time per stage (precopy, final).", ["stage"], buckets=_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.transfer_seconds = Histogram(
            _P + "transfer_seconds", "Archive transfer + verify time per stage.", ["stage"], buckets=_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.restore_seconds = Histogram(
            _P + "restore_seconds",
            "Restore request time at the destination.",
            buckets=_BUCKETS,
            registry=r,
        )
        self.migration_seconds = Histogram(
            _P + "migration_seconds", "One pod move end to end (destination pod, bind, agents, cleanup).",
            buckets=_BUCKETS, registry=r,
        )  # fmt: skip
        self.bytes_moved = Counter(_P + "bytes_moved", "Archive bytes moved between agents.", registry=r)
        self.work_preserved = Counter(
            _P + "work_preserved_seconds", "Work carried by successful migrations (not restarted), seconds.",
            registry=r,
        )  # fmt: skip
        self.nodes_removed = Counter(
            _P + "nodes_removed", "Nodes emptied by migration and deleted through the provider.", registry=r
        )
        self.plans = Counter(
            _P + "plans",
            "Node consolidations by result: removed, emptied (left to cluster-autoscaler), aborted, skipped.",
            ["result"],
            registry=r,
        )
        self.disruptions = Counter(
            _P + "disruptions",
            "Consolidations and migrations not made as asked by the disruption guard rails, by kind (consolidation, "
            "migration) and decision: dry_run (reported, nothing changed), waited (a budget held it), pdb (a "
            "PodDisruptionBudget held the migration).",
            ["kind", "decision"],
            registry=r,
        )
        self.in_progress = Gauge(_P + "in_progress", "Nodes being consolidated now (cordoned by the flow).", registry=r)

    def observe_move(self, outcome: str, record: Mapping[str, Any] | None, seconds: float) -> None:
        self.migrations.labels(outcome).inc()
        self.migration_seconds.observe(seconds)
        if not record:
            return
        timings = record.get("timings") or {}
        for stage in ("precopy", "final"):
            if isinstance(timings.get(f"checkpoint_{stage}"), (int, float)):
                self.checkpoint_seconds.labels(stage).observe(float(timings[f"checkpoint_{stage}"]))
            if isinstance(timings.get(f"transfer_{stage}"), (int, float)):
                self.transfer_seconds.labels(stage).observe(float(timings[f"transfer_{stage}"]))
        if isinstance(timings.get("restore"), (int, float)):
            self.restore_seconds.observe(float(timings["restore"]))
        if isinstance(record.get("bytes"), int):
            self.bytes_moved.inc(record["bytes"])
        if outcome == "succeeded":
            self.work_preserved.inc(float(record.get("work_seconds") or 0.0))
