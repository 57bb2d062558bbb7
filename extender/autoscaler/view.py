"""The shared Snapshot, plus the two pod facts the sidecar needs and the Snapshot does not keep.

``extender.kube.snapshot.Snapshot`` converts pods to the core model and drops ``spec.schedulerName`` and the
PodScheduled condition; the autoscaler needs both (which pods are *unschedulable pods of our profile*).
``AutoscalerSnapshot`` is the same Snapshot fed by the same list+watch reflectors, recording those two
fields on the side; nothing is duplicated, the conversion and indexing stay in extender.kube.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from extender.core.autoscale_scan import group_of
from extender.core.model import Node, NodeGroup, Pod
from extender.core.taints import withholds
from extender.kube.convert import Problem, pod_key
from extender.kube.snapshot import Snapshot
from extender.settings.extender import ExtenderConfig

__all__ = ["GATED_DEMAND_SECONDS", "AutoscalerSnapshot", "PendingInfo", "group_of"]

# A pod the QoS controller keeps gated this long found no room, not even by QoS preemption: the controller
# walks gated pods every 10 s (paper 002 §4.1.3) and on every pod event, and releases a pod as soon as some
# node can hold it. kube-scheduler never sees a gated pod, so without this it would never be marked
# Unschedulable and the sidecar would never buy a node for it (found by the deployed-for-real e2e: the QoS
# controller and the autoscaler together left an oversized pod gated for max_gate_seconds).
GATED_DEMAND_SECONDS = 15.0


@dataclass(frozen=True, slots=True)
class PendingInfo:
    scheduler_name: str
    unschedulable: bool  # PodScheduled=False with reason Unschedulable: the scheduler tried and failed
    uid: str
    gated_since: float | None = None  # first seen holding the QoS controller's scheduling gate


def _pending_info(obj: Mapping[str, Any], gate: str = "", now: float | None = None) -> PendingInfo | None:
    spec = obj.get("spec")
    if not isinstance(spec, dict) or spec.get("nodeName"):
        return None
    gates = spec.get("schedulingGates")
    gated = bool(gate) and isinstance(gates, list) and any(isinstance(g, dict) and g.get("name") == gate for g in gates)
    status = obj.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    unschedulable = False
    if isinstance(conditions, list):
        for cond in conditions:
            if (
                isinstance(cond, dict)
                and cond.get("type") == "PodScheduled"
                and cond.get("status") == "False"
                and cond.get("reason") == "Unschedulable"
            ):
                unschedulable = True
    meta = obj.get("metadata")
    uid = meta.get("uid") if isinstance(meta, dict) else None
    name = spec.get("schedulerName")
    return PendingInfo(
        name if isinstance(name, str) and name else "default-scheduler",
        unschedulable,
        str(uid or ""),
        now if gated else None,
    )


class AutoscalerSnapshot(Snapshot):
    """Snapshot + pending-pod facts. ``on_unschedulable`` fires when a pod newly becomes unschedulable."""

    def __init__(self, config: ExtenderConfig, on_unschedulable: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.pending: dict[str, PendingInfo] = {}
        # The gate is ours whether or not this process runs the controller (the sidecar never does).
        self._gate = config.controller.gate_name
        self._on_unschedulable = on_unschedulable

    def apply_pod(self, event_type: str, obj: Mapping[str, Any], now: float | None = None) -> tuple[Problem, ...]:
        problems = super().apply_pod(event_type, obj, now)
        try:
            key = pod_key(obj)
        except Exception:  # the base class counted it as a conversion error already
            return problems
        info = None if event_type == "DELETED" or key not in self.pods else _pending_info(obj, self._gate, now)
        before = self.pending.pop(key, None)
        if info is not None and info.gated_since is not None and before is not None and before.gated_since is not None:
            info = dataclasses.replace(info, gated_since=before.gated_since)
        if info is not None:
            self.pending[key] = info
            if info.unschedulable and (before is None or not before.unschedulable) and self._on_unschedulable:
                self._on_unschedulable()
        return problems

    def replace_pods(
        self, items: Iterable[Mapping[str, Any]], resource_version: str | None, now: float | None = None
    ) -> list[tuple[str, tuple[Problem, ...]]]:
        self.pending.clear()
        return super().replace_pods(items, resource_version, now)

    # ------------------------------------------------------------------------------------------ reads

    def node_views(self) -> list[Node]:
        """Every node with its pods (observed + assumed), by name."""
        out = []
        for name in sorted(self.nodes):
            view = self.node_view(name)
            if view is not None:
                out.append(view)
        return out

    def accepts(self, node: str, group: NodeGroup) -> bool:
        entry = self.nodes.get(node)
        return entry is not None and group in entry.accepts

    def withheld(self, node: str) -> bool:
        """Whether a taint keeps ordinary pods off the node (``core.taints.withholds``)."""
        entry = self.nodes.get(node)
        return entry is not None and withholds(entry.taints)

    def unschedulable_pods(
        self,
        scheduler_names: Iterable[str],
        now: float | None = None,
        gated_after: float = GATED_DEMAND_SECONDS,
        *,
        gated_only: bool = False,
    ) -> list[Pod]:
        """Pods of our scheduler profile(s) the scheduler reported Unschedulable (unless ``gated_only``), or that the
        QoS controller has kept gated for ``gated_after`` seconds (at ``now``), not being deleted."""
        names = frozenset(scheduler_names)
        out: list[Pod] = []
        for key in sorted(self.pending):
            info = self.pending[key]
            entry = self.pods.get(key)
            held = info.gated_since is not None and now is not None and now - info.gated_since >= gated_after
            wanted = held or (info.unschedulable and not gated_only)
            if entry is None or entry.deleting or not wanted or info.scheduler_name not in names:
                continue
            if entry.pod.node_name is None and key not in self.ledger:
                out.append(entry.pod)
        return out

    def pending_uid(self, key: str) -> str:
        info = self.pending.get(key)
        if info is not None and info.uid:
            return info.uid
        entry = self.pods.get(key)
        return entry.pod.uid if entry is not None else ""
