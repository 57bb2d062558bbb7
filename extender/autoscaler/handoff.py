"""The hand-off of under-utilised batch nodes to the consolidation flow of the node agent (issue #8).

The sidecar finds them (``core.reschedule.update_underutilized`` / ``sustained_underutilized``, paper 000
§5.3 and its Instance Cleaner, §4.4) and, for as many as can be emptied together, the all-or-nothing
migration plans (``core.reschedule.consolidation_plans``). It never evicts or migrates anything itself:
it calls ``ConsolidationHandoff.handoff`` once per scan with the current list, and the implementation
decides. Issue #8 plugs its agent-driven flow in here; until then ``RecordingHandoff`` keeps the latest
hand-off for /metrics, the log and one Event per node.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from extender.core.reschedule import MigrationPlan

__all__ = ["Consolidation", "ConsolidationHandoff", "RecordingHandoff"]

log = logging.getLogger("extender.autoscaler.handoff")


@dataclass(frozen=True, slots=True)
class Consolidation:
    """Batch nodes below the utilisation threshold for the sustain period (worst standing first), and the
    plans that would empty a subset of them together (``moves``: pod key -> destination node).

    ``since`` maps each candidate to when it went under the threshold. ``at`` is the scan time."""

    at: float
    candidates: tuple[str, ...]
    plans: tuple[MigrationPlan, ...]
    since: tuple[tuple[str, float], ...] = ()


class ConsolidationHandoff(Protocol):
    """Receives every scan's consolidation candidates. Must return quickly (the scan waits for it) and must
    tolerate the same node being handed off again next scan (the list is the current truth, not a delta)."""

    def handoff(self, consolidation: Consolidation) -> None: ...


class RecordingHandoff:
    """Issue #7's implementation: remember and log, never act. ``history`` keeps the last ``keep`` hand-offs."""

    def __init__(self, keep: int = 100) -> None:
        self.latest: Consolidation | None = None
        self.history: list[Consolidation] = []
        self._keep = keep

    def handoff(self, consolidation: Consolidation) -> None:
        self.latest = consolidation
        self.history.append(consolidation)
        del self.history[: -self._keep]
        if consolidation.candidates:
            log.info(
                "under-utilised batch nodes handed to consolidation",
                extra={
                    "decision": {
                        "candidates": list(consolidation.candidates),
                        "plans": {p.source: [list(m) for m in p.moves] for p in consolidation.plans},
                    }
                },
            )
