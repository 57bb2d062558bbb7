"""One scan of the autoscaler sidecar: snapshot in, decisions out. No I/O and no clock reads (``now`` is given).

The decisions are the calls extender/sim/engine.py makes in ``_htas_scale_up`` / ``_htas_scale_down``, on the
live snapshot instead of the simulator's state:

* service group, every scan: ``ledger.uncovered`` of the unschedulable service pods -> ``plan_pods``
  (greedy heterogeneous packing of the actual pods into flavours by cost-efficiency, paper 000/004);
* batch group, every ``batch_cycle_seconds`` or at once on a burst (the uncovered batch demand does not fit
  the largest flavour, as in the simulator): ``plan_batch`` (0-bin capacity deducted first, paper 000 Alg. 4);
* provisioning ledger (paper 003 Alg. 7): nodes bought and not joined yet cover their pods and the room left
  on them; a node that joins is ``arrived`` and its acquisition lag recorded; one that does not join within
  ``provisioning_timeout_seconds`` is ``expire``d (cancelled at the provider, Event), its pods planned again;
* forecast (paper 001): ``forecast_shortage`` of the batch group at now + ``measured_lag`` of our own
  provisioning history -- reported (metric, Events), not used to gate purchases, exactly as the simulator;
* scale-down: nodes without pods (DaemonSet pods do not count) for ``idle_seconds`` are deleted (paper 004);
  batch nodes under ``underutil_threshold`` for ``underutil_sustain_seconds``, once the batch queue has
  been quiet for ``batch_queue_quiet_seconds``, are handed to the consolidation flow -- never evicted here.

What the simulator does not need and the cluster does: pods only count when the scheduler marked them
Unschedulable and they fit no existing node of their group; a pod no flavour can hold gets one Event and is
never planned; a pod that was bought for ``max_attempts_per_pod`` times and is still unschedulable (node
affinity, taints: things the planner does not model) gets one Event and is no longer planned; each scan buys
at most ``max_nodes_per_cycle`` nodes and never more than ``max_nodes`` provisioned in total.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from extender.autoscaler.config import AutoscalerSettings
from extender.autoscaler.handoff import Consolidation
from extender.autoscaler.view import AutoscalerSnapshot, group_of
from extender.config import NodeGroupsConfig
from extender.core import autoscale, packing, reschedule
from extender.core.model import Flavour, Node, NodeGroup, Pod, Resources, WorkloadKind

__all__ = [
    "PROVISIONED_BY_LABEL",
    "PROVISIONED_BY_VALUE",
    "AutoscalerLoop",
    "Decisions",
    "GroupPlan",
    "Notice",
    "ProvisionRequest",
]

PROVISIONED_BY_LABEL = "qos.kube-qos-extender.io/provisioned-by"
PROVISIONED_BY_VALUE = "qos-autoscaler"


@dataclass(frozen=True, slots=True)
class ProvisionRequest:
    """Ask the provider for one node: its name, flavour, group, labels, and the pods it was bought for."""

    name: str
    flavour: Flavour
    group: NodeGroup
    labels: Mapping[str, str]
    pods: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Notice:
    """An Event to post: on a Pod (namespace/name/uid) or a Node (namespace "")."""

    kind: str
    namespace: str
    name: str
    uid: str
    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True, slots=True)
class GroupPlan:
    group: NodeGroup
    pods: int
    flavour_counts: Mapping[str, int]
    cost_per_hour: float
    unservable: tuple[str, ...]


@dataclass(slots=True)
class Decisions:
    now: float
    provision: list[ProvisionRequest] = field(default_factory=list)
    cancel: list[autoscale.Provisioning] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    plans: list[GroupPlan] = field(default_factory=list)
    arrived: list[tuple[str, float]] = field(default_factory=list)
    consolidation: Consolidation | None = None
    unschedulable: dict[NodeGroup, int] = field(default_factory=dict)
    uncovered: dict[NodeGroup, int] = field(default_factory=dict)
    forecast: Resources = field(default_factory=Resources)
    lag_estimate: float = 0.0
    provisioning: int = 0
    unservable: int = 0
    gave_up: int = 0
    limited: bool = False
    nodes_cost_per_hour: float = 0.0


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-") or "x"


def _is_daemon(pod: Pod) -> bool:
    return "/DaemonSet/" in pod.request_id


def _describe(r: Resources) -> str:
    return f"cpu={r.cpu_milli}m memory={r.memory_bytes / 2**20:.0f}Mi"


class AutoscalerLoop:
    """The sidecar's state between scans (ledger, lag history, idle clocks, under-utilisation clocks)."""

    def __init__(
        self,
        settings: AutoscalerSettings,
        node_groups: NodeGroupsConfig,
        *,
        name_suffix: Callable[[], str] | None = None,
    ) -> None:
        autoscale.validate_catalogue(settings.flavours)
        self.s = settings
        self.node_groups = node_groups
        self.flavours = list(settings.flavours)
        self.by_name = {f.name: f for f in self.flavours}
        self._suffix = name_suffix or (lambda: secrets.token_hex(3))
        self.ledger = autoscale.ProvisioningLedger()
        self.groups: dict[str, NodeGroup] = {}  # provisioning node -> group
        self.lag_samples: list[float] = []
        self.last_batch_plan = -math.inf
        self.last_batch_pending: float | None = None
        self.empty_since: dict[str, float] = {}
        self.deleting: dict[str, float] = {}
        self.underutil = reschedule.UnderutilState()
        self.attempts: dict[str, int] = {}
        self._said: set[tuple[str, str, str]] = set()
        self._adopted_arrivals: list[tuple[str, float]] = []

    # ------------------------------------------------------------------------------------------ helpers

    def _say(self, d: Decisions, notice: Notice, *, key: str = "") -> None:
        """Queue a notice once per (object, reason, key): the same fact is not repeated every scan."""
        ident = (f"{notice.kind}/{notice.namespace}/{notice.name}/{notice.uid}", notice.reason, key)
        if ident in self._said:
            return
        if len(self._said) > 100_000:  # bounded memory: at worst a fact is said once more
            self._said.clear()
        self._said.add(ident)
        d.notices.append(notice)

    def _pod_notice(
        self, snap: AutoscalerSnapshot, key: str, reason: str, message: str, warning: bool = False
    ) -> Notice:
        namespace, name = key.split("/", 1)
        return Notice("Pod", namespace, name, snap.pending_uid(key), reason, message, warning)

    def _labels(self, group: NodeGroup, flavour: Flavour) -> dict[str, str]:
        selector = self.node_groups.batch_selector if group is NodeGroup.BATCH else self.node_groups.service_selector
        return {
            **selector,
            self.node_groups.flavour_label: flavour.name,
            PROVISIONED_BY_LABEL: PROVISIONED_BY_VALUE,
        }

    def owned(self, node: Node) -> bool:
        return node.labels.get(PROVISIONED_BY_LABEL) == PROVISIONED_BY_VALUE

    def adopt_ledger(
        self,
        ledger: autoscale.ProvisioningLedger,
        groups: Mapping[str, NodeGroup],
        arrived: Iterable[tuple[str, float]] = (),
    ) -> None:
        """Plan against someone else's purchases: with the externalgrpc cloud provider cluster-autoscaler buys the
        nodes and the provider keeps the ledger; this (dry-run) loop takes it before each scan, so its plans count
        the room on nodes CA is booting, and the lags the provider measured feed the forecast."""
        self.ledger = ledger
        self.groups = dict(groups)
        self._adopted_arrivals.extend(arrived)

    def lag_estimate(self) -> float:
        return autoscale.measured_lag(
            self.lag_samples, self.s.lag_default_seconds, window=self.s.lag_window, quantile=self.s.lag_quantile
        )

    # ---------------------------------------------------------------------------------------------- scan

    def step(self, snap: AutoscalerSnapshot, now: float) -> Decisions:
        d = Decisions(now)
        views = snap.node_views()
        present = {v.name: v for v in views}
        self._arrivals(d, present, now)
        self._expire(d, snap, now)
        pending = self._unschedulable(snap, views, now)
        budget = [
            self.s.max_nodes_per_cycle,
            self.s.max_nodes - len(self.ledger.entries) - sum(1 for v in views if self.owned(v)),
        ]
        by_group = {g: [p for p in pending if group_of(p) is g] for g in NodeGroup}
        for group in (NodeGroup.SERVICE, NodeGroup.BATCH):
            d.unschedulable[group] = len(by_group[group])
        # service group: every scan (sim: _htas_scale_up, first half)
        services = self._ledger(NodeGroup.SERVICE).uncovered(self._plannable(d, snap, by_group[NodeGroup.SERVICE]))
        d.uncovered[NodeGroup.SERVICE] = len(services)
        if services:
            plan = autoscale.plan_pods(services, self.flavours, self.s.weights)
            self._buy(d, snap, NodeGroup.SERVICE, plan, len(services), budget)
        # batch group: every cycle, sooner on a burst (sim: _htas_scale_up, second half)
        batch = self._ledger(NodeGroup.BATCH).uncovered(self._plannable(d, snap, by_group[NodeGroup.BATCH]))
        d.uncovered[NodeGroup.BATCH] = len(batch)
        batch_nodes = [v for v in views if v.group is NodeGroup.BATCH]
        d.lag_estimate = self.lag_estimate()
        d.forecast = self._forecast(by_group[NodeGroup.BATCH], batch_nodes, now, d.lag_estimate)
        if batch:
            due = now - self.last_batch_plan >= self.s.batch_cycle_seconds
            biggest = max(self.flavours, key=lambda f: f.capacity.memory_bytes).capacity
            burst = not Resources.total(p.requests for p in batch).fits_in(biggest)
            if due or burst:
                self.last_batch_plan = now
                plan = autoscale.plan_batch(
                    batch, batch_nodes, self.flavours, self.s.weights, now, self.s.batch_cycle_seconds
                )
                self._buy(d, snap, NodeGroup.BATCH, plan, len(batch), budget)
        self._scale_down(d, snap, views, now)
        d.provisioning = len(self.ledger.entries)
        d.nodes_cost_per_hour = math.fsum(
            self.by_name[v.flavour].price_per_hour for v in views if v.flavour in self.by_name
        ) + math.fsum(e.flavour.price_per_hour for e in self.ledger.entries)
        live = {e.pod.uid or k for k, e in snap.pods.items()}
        self.attempts = {k: n for k, n in self.attempts.items() if k in live}
        return d

    def _ledger(self, group: NodeGroup) -> autoscale.ProvisioningLedger:
        """The ledger entries of one node group: a batch pod is never "covered" by room on a service node
        being provisioned (node groups are enforced by the extender's filter), nor the reverse."""
        return autoscale.ProvisioningLedger(
            tuple(e for e in self.ledger.entries if self.groups.get(e.node_name) is group)
        )

    def _arrivals(self, d: Decisions, present: Mapping[str, Node], now: float) -> None:
        for name, lag in self._adopted_arrivals:
            self.lag_samples.append(lag)
            del self.lag_samples[: -max(self.s.lag_window, 1)]
            d.arrived.append((name, lag))
        self._adopted_arrivals.clear()
        for entry in self.ledger.entries:
            node = present.get(entry.node_name)
            if node is None:
                continue
            joined = min(now, node.created_at) if node.created_at is not None else now
            lag = max(0.0, joined - entry.requested_at)
            self.lag_samples.append(lag)
            del self.lag_samples[: -max(self.s.lag_window, 1)]
            self.ledger = self.ledger.arrived(entry.node_name)
            self.groups.pop(entry.node_name, None)
            d.arrived.append((entry.node_name, lag))

    def _expire(self, d: Decisions, snap: AutoscalerSnapshot, now: float) -> None:
        self.ledger, expired = self.ledger.expire(now, self.s.provisioning_timeout_seconds)
        for entry in expired:
            self.groups.pop(entry.node_name, None)
            d.cancel.append(entry)
            message = (
                f"node {entry.node_name} ({entry.flavour.name}) requested at {entry.requested_at:.0f} did not join "
                f"within {self.s.provisioning_timeout_seconds:.0f}s; forgotten, its pods are planned again"
            )
            self._say(d, Notice("Node", "", entry.node_name, "", "ProvisioningTimedOut", message, True))
            for key in entry.pods:
                if key in snap.pods:
                    self._say(
                        d, self._pod_notice(snap, key, "ProvisioningTimedOut", message, True), key=entry.node_name
                    )

    def _unschedulable(self, snap: AutoscalerSnapshot, views: list[Node], now: float) -> list[Pod]:
        """Unschedulable pods of our profile(s) that fit no existing schedulable node of their group now
        (what the simulator's ``_unschedulable`` computes; the scheduler's verdict may be a scan old)."""
        out = []
        for pod in snap.unschedulable_pods(self.s.scheduler_names, now):
            group = group_of(pod)
            if any(snap.accepts(n.name, group) and packing.fits(n, pod) for n in views):
                continue
            out.append(pod)
        return out

    def _attempt_key(self, pod: Pod) -> str:
        return pod.uid or pod.key

    def _plannable(self, d: Decisions, snap: AutoscalerSnapshot, pods: list[Pod]) -> list[Pod]:
        out = []
        for pod in pods:
            if self.attempts.get(self._attempt_key(pod), 0) >= self.s.max_attempts_per_pod:
                d.gave_up += 1
                message = (
                    f"still unschedulable after {self.s.max_attempts_per_pod} nodes were added for it; no more "
                    "nodes are added for this pod (check node affinity, taints, topology constraints)"
                )
                self._say(d, self._pod_notice(snap, pod.key, "ScaleUpGaveUp", message, True))
                continue
            out.append(pod)
        return out

    def _buy(
        self,
        d: Decisions,
        snap: AutoscalerSnapshot,
        group: NodeGroup,
        plan: autoscale.ScalePlan,
        count: int,
        budget: list[int],
    ) -> None:
        d.unservable += len(plan.unservable)
        largest = max(self.flavours, key=lambda f: (f.capacity.cpu_milli, f.capacity.memory_bytes))
        for key in plan.unservable:
            req = snap.pods[key].pod.requests if key in snap.pods else Resources()
            message = (
                f"requests {_describe(req)} fit no flavour of the catalogue (largest {largest.name}: "
                f"{_describe(largest.capacity)}); no node is added for this pod"
            )
            self._say(d, self._pod_notice(snap, key, "NotServableByAnyFlavour", message, True))
        nodes = list(plan.nodes)
        allowed = max(0, min(budget))
        if len(nodes) > allowed:
            d.limited = True
            nodes = nodes[:allowed]
        budget[0] -= len(nodes)
        budget[1] -= len(nodes)
        counts: dict[str, int] = {}
        for flavour, _ in nodes:
            counts[flavour.name] = counts.get(flavour.name, 0) + 1
        cost = math.fsum(f.price_per_hour for f, _ in nodes)
        d.plans.append(GroupPlan(group, count, dict(sorted(counts.items())), cost, plan.unservable))
        if self.s.dry_run:
            return
        summary = ", ".join(f"{n}x{name}" for name, n in sorted(counts.items()))
        for flavour, keys in nodes:
            name = f"{self.s.node_name_prefix}-{group.value}-{_slug(flavour.name)}-{self._suffix()}"
            self.ledger = self.ledger.add(autoscale.Provisioning(name, flavour, d.now, keys))
            self.groups[name] = group
            d.provision.append(ProvisionRequest(name, flavour, group, self._labels(group, flavour), keys))
            for key in keys:
                pod = snap.pods.get(key)
                if pod is not None:
                    k = self._attempt_key(pod.pod)
                    self.attempts[k] = self.attempts.get(k, 0) + 1
                message = (
                    f"node {name} ({flavour.name}, ${flavour.price_per_hour:.4f}/h, {group.value} group) requested "
                    f"for this pod; plan {summary}, ${cost:.4f}/h"
                )
                self._say(d, self._pod_notice(snap, key, "TriggeredScaleUp", message), key=name)

    def _forecast(self, pending: list[Pod], batch_nodes: list[Node], now: float, lag: float) -> Resources:
        """Paper 001 Eq. 2 for the batch group: shortage at now + lag, capacity incl. nodes being provisioned."""
        demand = Resources.total(p.requests for p in pending)
        running = [p for n in batch_nodes for p in n.pods]
        capacity = Resources.total(n.allocatable for n in batch_nodes) + Resources.total(
            e.flavour.capacity for e in self.ledger.entries if self.groups.get(e.node_name) is NodeGroup.BATCH
        )
        unique = list({p.key: p for p in running}.values())
        return autoscale.forecast_shortage(demand, unique, capacity, now, lag)

    def _scale_down(self, d: Decisions, snap: AutoscalerSnapshot, views: list[Node], now: float) -> None:
        names = {v.name for v in views}
        self.deleting = {n: t for n, t in self.deleting.items() if n in names}
        self.empty_since = {n: t for n, t in self.empty_since.items() if n in names}
        for v in views:
            if any(not _is_daemon(p) for p in v.pods):
                self.empty_since.pop(v.name, None)
                continue
            # idle from the first scan that saw it empty: pods leave between scans, so this errs long
            since = self.empty_since.setdefault(v.name, now)
            if v.name in self.deleting or (self.s.scale_down_provisioned_only and not self.owned(v)):
                continue
            if now - since >= self.s.idle_seconds and not self.s.dry_run:
                self.deleting[v.name] = now
                d.delete.append(v.name)
                message = f"no pods for {now - since:.0f}s (idle period {self.s.idle_seconds:.0f}s)"
                self._say(d, Notice("Node", "", v.name, "", "ScaleDownEmpty", message), key=str(now))
        # under-utilised batch nodes -> consolidation hand-off (sim: _htas_scale_down, second half)
        batch = [v for v in views if v.group is NodeGroup.BATCH and v.name not in self.deleting]
        self.underutil = reschedule.update_underutilized(
            self.underutil, [v for v in batch if v.pods], now, self.s.underutil_threshold
        )
        names_ok = frozenset(self.s.scheduler_names)
        batch_pending = any(
            e.pod.kind is WorkloadKind.BATCH
            and e.pod.node_name is None
            and (info := snap.pending.get(k)) is not None
            and info.scheduler_name in names_ok
            for k, e in snap.pods.items()
        )
        if self.last_batch_pending is None:
            self.last_batch_pending = now
        under = tuple(sorted(self.underutil.since.items()))
        if batch_pending:
            self.last_batch_pending = now
            d.consolidation = Consolidation(now, (), (), under)
            return
        if now - self.last_batch_pending < self.s.batch_queue_quiet_seconds:
            d.consolidation = Consolidation(now, (), (), under)
            return
        cands = reschedule.sustained_underutilized(self.underutil, now, self.s.underutil_sustain_seconds)
        plans = reschedule.consolidation_plans(batch, cands, now, self.s.batch_cycle_seconds) if cands else []
        d.consolidation = Consolidation(now, tuple(cands), tuple(plans), under)
        by_name = {v.name: v for v in batch}
        for name in cands:
            started = self.underutil.since[name]
            message = (
                f"utilisation {by_name[name].utilization():.2f} below {self.s.underutil_threshold} since "
                f"{started:.0f}; handed to consolidation (not evicted by the autoscaler)"
            )
            self._say(d, Notice("Node", "", name, "", "UnderutilizedBatchNode", message), key=str(started))
