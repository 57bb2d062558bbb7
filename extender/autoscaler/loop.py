"""One scan of the autoscaler sidecar: snapshot in, decisions out. No I/O and no clock reads (``now`` is given).

The decisions are ``extender.core.autoscale_scan.scan``, the step the simulator's ``htas`` policy also runs
(``Simulator._htas_scan``; tests/test_sim_autoscaler_parity.py fails if the two decide differently on the same
cluster). ``AutoscalerLoop`` is the adapter from the live snapshot to that step, plus what only a cluster needs:

* service group, every scan: ``ledger.uncovered`` of the unschedulable service pods -> ``plan_pods``
  (greedy heterogeneous packing of the actual pods into flavours by cost-efficiency, paper 000/004);
* batch group, every ``batch_cycle_seconds`` or at once on a burst (the uncovered batch demand does not fit
  the largest flavour, as in the simulator): ``plan_batch`` (0-bin capacity deducted first, paper 000 Alg. 4);
* provisioning ledger (paper 003 Alg. 7): nodes bought and not joined yet cover their pods and the room left
  on them; a node that joins is ``arrived`` and its acquisition lag recorded; one that does not join within
  ``provisioning_timeout_seconds`` is ``expire``d (cancelled at the provider, Event), its pods planned again
  (the scan reads the ledger; the loop records what it requested, arrivals and timeouts);
* forecast (paper 001): ``forecast_shortage`` of the batch group at now + ``measured_lag`` of our own
  provisioning history -- reported (metric, Events), not used to gate purchases, exactly as the simulator;
* scale-down: nodes without pods (DaemonSet pods do not count) for ``idle_seconds`` are deleted (paper 004),
  only ours unless configured otherwise, never in dry run; batch nodes under ``underutil_threshold`` for
  ``underutil_sustain_seconds``, once the batch queue has been quiet for ``batch_queue_quiet_seconds``, are
  handed to the consolidation flow -- never evicted here.

What the simulator does not need and the cluster does: pods only count when the scheduler marked them
Unschedulable and they fit no existing node of their group; a pod no flavour can hold gets one Event and is
never planned; a pod that was bought for ``max_attempts_per_pod`` times and is still unschedulable (node
affinity, taints: things the planner does not model) gets one Event and is no longer planned; each scan buys
at most ``max_nodes_per_cycle`` nodes and never more than ``max_nodes`` provisioned in total; when the cheapest
plan would exceed ``max_nodes`` the scan re-plans with larger flavours (``GroupPlan.reshaped``, a metric, and the
TriggeredScaleUp Event says so), while ``max_nodes_per_cycle`` only delays the cheapest plan's nodes.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from extender.autoscaler.handoff import Consolidation
from extender.autoscaler.settings import AutoscalerSettings
from extender.autoscaler.view import AutoscalerSnapshot, group_of
from extender.core import autoscale, autoscale_scan
from extender.core.model import Flavour, InvalidInputError, Node, NodeGroup, Pod, Resources, WorkloadKind
from extender.settings.sections import NodeGroupsConfig

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
# on a node the sidecar cordoned for capacity (core.autoscale_scan.retire_for_cap): a restarted sidecar reads
# which nodes are retiring from this label (the cluster is the record, not the sidecar's memory)
RETIRING_LABEL = "qos.kube-qos-extender.io/retiring"
PROVISIONED_BY_VALUE = "qos-autoscaler"


@dataclass(frozen=True, slots=True)
class ProvisionRequest:
    """Ask the provider for one node: its name, flavour, group, labels, and the pods it was bought for."""

    name: str
    flavour: Flavour
    group: NodeGroup
    labels: Mapping[str, str]
    pods: tuple[str, ...]
    requests: Resources = field(
        default_factory=Resources
    )  # what the pods it was bought for ask, together (a ProvisioningRequest's pod)


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
    reshaped: bool = False  # max_nodes made the planner buy larger flavours than the cheapest plan's


@dataclass(slots=True)
class Decisions:
    now: float
    provision: list[ProvisionRequest] = field(default_factory=list)
    cancel: list[autoscale.Provisioning] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    retire: list[str] = field(default_factory=list)  # cordon + RETIRING_LABEL: drain for a larger node
    unretire: list[str] = field(default_factory=list)  # uncordon + drop RETIRING_LABEL: the demand is gone
    notices: list[Notice] = field(default_factory=list)
    plans: list[GroupPlan] = field(default_factory=list)
    arrived: list[tuple[str, float]] = field(default_factory=list)
    # demand handed to cluster-autoscaler (ProvisioningRequests): planned nodes whose pods are all bound or gone
    fulfilled: list[str] = field(default_factory=list)
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
        slo: Mapping[str, float] | None = None,
    ) -> None:
        autoscale.validate_catalogue(settings.flavours)
        self.s = settings
        self.node_groups = node_groups
        self.flavours = list(settings.flavours)
        self.by_name = {f.name: f for f in self.flavours}
        self._suffix = name_suffix or (lambda: secrets.token_hex(3))
        self.scan_settings = autoscale_scan.ScanSettings(
            flavours=tuple(settings.flavours),
            weights=settings.weights,
            batch_cycle_seconds=settings.batch_cycle_seconds,
            idle_seconds=settings.idle_seconds,
            underutil_threshold=settings.underutil_threshold,
            underutil_sustain_seconds=settings.underutil_sustain_seconds,
            batch_queue_quiet_seconds=settings.batch_queue_quiet_seconds,
            slo=dict(slo or {}),  # class -> SLO: the scan's SLO trigger for batch pods held by the QoS gate
            retire_drain_seconds=settings.retire_drain_seconds,
        )
        self.state = autoscale_scan.ScanState()  # ledgers by group, batch cycle, idle and under-utilisation clocks
        self._ungrouped: tuple[autoscale.Provisioning, ...] = ()  # adopted entries of no known group
        self.lag_samples: list[float] = []
        self.deleting: dict[str, float] = {}
        self.attempts: dict[str, int] = {}
        self._said: set[tuple[str, str, str]] = set()
        self._adopted_arrivals: list[tuple[str, float]] = []
        # Under cluster-autoscaler with provisioning requests the loop buys (as requests CA carries out) but never
        # removes nodes (CA's scale-down does): purchases are not dry-run, deletions and retirements are.
        self.hands_demand = settings.provider == "cluster-autoscaler" and settings.expander.provreq is not None
        # ledger names of planned nodes handed to CA (until fulfilled or forgotten) -> their pods' attempt keys
        self._demand: dict[str, tuple[str, ...]] = {}
        # set by the shell once our open requests were listed (a restarted sidecar adopts them first)
        self.demand_ready = True

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
        by_group: dict[NodeGroup, list[autoscale.Provisioning]] = {g: [] for g in NodeGroup}
        ungrouped: list[autoscale.Provisioning] = []
        for own_group, own in self.state.ledgers.items():  # our own requests to CA stay until fulfilled
            by_group[own_group].extend(e for e in own.entries if e.node_name in self._demand)
        self._adopted_arrivals.extend(arrived)
        if self.hands_demand:
            # CA's ledger holds, with no pods, the very nodes it boots for our requests: counting both would see
            # a booting node's room twice (and spend the node cap twice). Our requests are the truth for our pods.
            self.state.ledgers = {g: autoscale.ProvisioningLedger(tuple(e)) for g, e in by_group.items()}
            return
        for entry in ledger.entries:
            group = groups.get(entry.node_name)
            (by_group[group] if group is not None else ungrouped).append(entry)
        self.state.ledgers = {g: autoscale.ProvisioningLedger(tuple(e)) for g, e in by_group.items()}
        self._ungrouped = tuple(ungrouped)

    def adopt_demand(
        self, group: NodeGroup, flavour: str, name: str, requested_at: float, pods: tuple[str, ...]
    ) -> None:
        """A request to CA made before a restart (read back from the cluster): its pods stay covered."""
        f = self.by_name.get(flavour)
        if f is None or name in self._demand:
            return
        try:
            entry = autoscale.Provisioning(name, f, requested_at, pods)
            self.state.provisioned(group, entry)
        except InvalidInputError:  # a pod already covered by another entry: the request is a stale twin
            return
        self._demand[name] = ()

    def forget_demand(self, names: Iterable[str], *, refund: bool = False) -> None:
        """CA gave up on these planned nodes (request Failed, delivered to others, deleted by someone else), or
        they never reached CA (``refund``: the request could not be created, so the purchase does not count
        against a pod's ``max_attempts_per_pod``): plan their pods again."""
        for name in names:
            if name not in self._demand:
                continue
            for key in self._demand.pop(name) if refund else ():
                if self.attempts.get(key, 0) > 0:
                    self.attempts[key] -= 1
            self._demand.pop(name, None)
            self.state.arrived(name)

    @property
    def ledger(self) -> autoscale.ProvisioningLedger:
        """Every node being provisioned, whatever its group."""
        return autoscale.ProvisioningLedger(tuple(e for _, e in self.state.provisioning) + self._ungrouped)

    def lag_estimate(self) -> float:
        return autoscale.measured_lag(
            self.lag_samples, self.s.lag_default_seconds, window=self.s.lag_window, quantile=self.s.lag_quantile
        )

    # ---------------------------------------------------------------------------------------------- scan

    def step(self, snap: AutoscalerSnapshot, now: float) -> Decisions:
        """The shared scan (``core.autoscale_scan.scan``) on the live snapshot, around it what only the cluster
        needs: arrivals and lags, timeouts, the give-up guard, limits, names and labels, Events, dry run."""
        d = Decisions(now)
        views = snap.node_views()
        present = {v.name: v for v in views}
        self._arrivals(d, present, now)
        if self.hands_demand:
            self._fulfilled(d, snap, now)
        self._expire(d, snap, now)
        accepts = self._accepts(snap)
        provreq = self.s.expander.provreq if self.hands_demand else None
        # under CA only gated pods are ours to hand over: an Unschedulable pod is CA's own demand already
        held = (
            snap.unschedulable_pods(self.s.scheduler_names, now, provreq.gated_demand_seconds, gated_only=True)
            if provreq
            else None
        )
        waiting = autoscale_scan.unschedulable(
            held if held is not None else snap.unschedulable_pods(self.s.scheduler_names, now), views, accepts
        )
        by_group = {g: [p for p in waiting if group_of(p) is g] for g in (NodeGroup.SERVICE, NodeGroup.BATCH)}
        d.unschedulable = {g: len(pods) for g, pods in by_group.items()}
        candidates = [p for pods in by_group.values() for p in self._plannable(d, snap, pods)]
        # two limits of different kinds: per scan (delays buying) and in total (the planner re-plans within it)
        cap = self.s.max_nodes - len(self.ledger.entries) - sum(1 for v in views if self.owned(v))
        names_ok = frozenset(self.s.scheduler_names)
        batch_pending = any(
            e.pod.kind is WorkloadKind.BATCH
            and e.pod.node_name is None
            and (info := snap.pending.get(k)) is not None
            and info.scheduler_name in names_ok
            for k, e in snap.pods.items()
        )
        self.deleting = {n: t for n, t in self.deleting.items() if n in present}
        # which nodes are retiring: those labelled so (ours, as the cluster has them), since when we saw it first
        self.state.retiring = {
            v.name: self.state.retiring.get(v.name, now)
            for v in views
            if v.labels.get(RETIRING_LABEL) == "true" and self.owned(v)
        }
        result = autoscale_scan.scan(
            self.state,
            self._scan_settings(views),
            views,
            candidates,
            now,
            batch_pending=batch_pending,
            budget=self.s.max_nodes_per_cycle,
            cap=max(0, cap),
            accepts=accepts,
            counts=lambda p: not _is_daemon(p),
            leaving=frozenset(self.deleting),
            waited={k: now - i.gated_since for k, i in snap.pending.items() if i.gated_since is not None},
            lag_seconds=self.lag_estimate(),
            retirable=frozenset(
                v.name for v in views if self.owned(v) and not v.unschedulable and v.name not in self.deleting
            ),
        )
        d.uncovered = dict(result.uncovered)
        d.limited = result.limited
        for up in result.plans:
            self._buy(d, snap, up, [p for p in result.purchases if p.group is up.group])
        d.lag_estimate = self.lag_estimate()
        batch_nodes = [v for v in views if v.group is NodeGroup.BATCH]
        d.forecast = self._forecast(by_group[NodeGroup.BATCH], batch_nodes, now, d.lag_estimate)
        self._retire(d, result, present)
        self._scale_down(d, result, present, now)
        d.provisioning = len(self.ledger.entries)
        d.nodes_cost_per_hour = math.fsum(
            self.by_name[v.flavour].price_per_hour for v in views if v.flavour in self.by_name
        ) + math.fsum(e.flavour.price_per_hour for e in self.ledger.entries)
        live = {e.pod.uid or k for k, e in snap.pods.items()}
        self.attempts = {k: n for k, n in self.attempts.items() if k in live}
        return d

    def _arrivals(self, d: Decisions, present: Mapping[str, Node], now: float) -> None:
        for name, lag in self._adopted_arrivals:
            self.lag_samples.append(lag)
            del self.lag_samples[: -max(self.s.lag_window, 1)]
            d.arrived.append((name, lag))
        self._adopted_arrivals.clear()
        for entry in self.ledger.entries:
            if entry.node_name in self._demand:
                continue
            node = present.get(entry.node_name)
            if node is None:
                continue
            joined = min(now, node.created_at) if node.created_at is not None else now
            lag = max(0.0, joined - entry.requested_at)
            self.lag_samples.append(lag)
            del self.lag_samples[: -max(self.s.lag_window, 1)]
            self.state.arrived(entry.node_name)
            self._ungrouped = tuple(e for e in self._ungrouped if e.node_name != entry.node_name)
            d.arrived.append((entry.node_name, lag))

    def _scan_settings(self, views: list[Node]) -> autoscale_scan.ScanSettings:
        """A planned node must hold its pods beside the DaemonSet pods it will carry: the catalogue less the most
        any node we see carries (bought by the kwok provider too: on kind a t3.xsmall bought for a 1 GiB pod was
        16 MiB short, the route DaemonSet's, three times over until ScaleUpGaveUp, issue 31). Handing demand to CA,
        also less the configured reserve (CA's node template's system pods)."""
        daemons = [Resources.total(p.requests for p in v.pods if _is_daemon(p)) for v in views]
        reserve = Resources(
            max((r.cpu_milli for r in daemons), default=0), max((r.memory_bytes for r in daemons), default=0), 0
        )
        provreq = self.s.expander.provreq
        if self.hands_demand and provreq is not None:
            reserve = reserve + provreq.node_reserve.resources()
        if reserve == Resources():
            return self.scan_settings
        flavours = autoscale.with_headroom(self.scan_settings.flavours, reserve)
        return dataclasses.replace(self.scan_settings, flavours=flavours)

    def _fulfilled(self, d: Decisions, snap: AutoscalerSnapshot, now: float) -> None:
        """A planned node handed to CA is done when every pod it was bought for is bound or gone: CA's nodes have
        names of its own, so the pods, not a node name, say the capacity came. Its lag is request -> last bound."""
        for entry in self.ledger.entries:
            if entry.node_name not in self._demand:
                continue
            if any((e := snap.pods.get(k)) is not None and e.pod.node_name is None for k in entry.pods):
                continue
            self._demand.pop(entry.node_name, None)
            self.state.arrived(entry.node_name)
            if any(k in snap.pods for k in entry.pods):  # a lag only when capacity came, not when the pods went
                lag = max(0.0, now - entry.requested_at)
                self.lag_samples.append(lag)
                del self.lag_samples[: -max(self.s.lag_window, 1)]
            d.fulfilled.append(entry.node_name)

    def _expire(self, d: Decisions, snap: AutoscalerSnapshot, now: float) -> None:
        expired = self.state.expire(now, self.s.provisioning_timeout_seconds)
        ungrouped, gone = autoscale.ProvisioningLedger(self._ungrouped).expire(now, self.s.provisioning_timeout_seconds)
        self._ungrouped = ungrouped.entries
        for entry in (*expired, *gone):
            self._demand.pop(entry.node_name, None)
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

    @staticmethod
    def _accepts(snap: AutoscalerSnapshot) -> Callable[[Node, NodeGroup], bool]:
        """Which nodes take which group's pods: the node-group labels, as the extender's filter reads them, and
        no node kept from ordinary pods by a taint (``core.taints.withholds``: kind's control plane, unlabelled,
        had its room counted as batch capacity, so nothing was bought for batch pods that kube-scheduler could
        never put there). The plan does not read pods' tolerations: a pod that tolerates such a taint may be
        bought a node it did not need, which goes again after ``idle_seconds`` empty."""
        return lambda node, group: snap.accepts(node.name, group) and not snap.withheld(node.name)

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
        up: autoscale_scan.GroupScaleUp,
        purchases: list[autoscale_scan.Purchase],
    ) -> None:
        group, plan = up.group, up.plan
        d.unservable += len(plan.unservable)
        largest = max(self.flavours, key=lambda f: (f.capacity.cpu_milli, f.capacity.memory_bytes))
        for key in plan.unservable:
            req = snap.pods[key].pod.requests if key in snap.pods else Resources()
            message = (
                f"requests {_describe(req)} fit no flavour of the catalogue (largest {largest.name}: "
                f"{_describe(largest.capacity)}); no node is added for this pod"
            )
            self._say(d, self._pod_notice(snap, key, "NotServableByAnyFlavour", message, True))
        counts: dict[str, int] = {}
        for p in purchases:
            counts[p.flavour.name] = counts.get(p.flavour.name, 0) + 1
        cost = math.fsum(p.flavour.price_per_hour for p in purchases)
        d.plans.append(GroupPlan(group, up.pods, dict(sorted(counts.items())), cost, plan.unservable, up.reshaped))
        if self.s.dry_run and not (self.hands_demand and self.demand_ready):
            return
        summary = ", ".join(f"{n}x{name}" for name, n in sorted(counts.items()))
        if up.reshaped:
            summary += f" (larger flavours than the cheapest plan: autoscaler.limits.max_nodes {self.s.max_nodes})"
        for p in purchases:
            flavour, keys = p.flavour, p.pods
            name = f"{self.s.node_name_prefix}-{group.value}-{_slug(flavour.name)}-{self._suffix()}"
            self.state.provisioned(group, autoscale.Provisioning(name, flavour, d.now, keys))
            requests = Resources.total(snap.pods[k].pod.requests for k in keys if k in snap.pods)
            # the machine is the catalogue's flavour; the plan (and the ledger's room on a booting node) saw it less
            # the DaemonSet headroom (_scan_settings)
            machine = self.by_name.get(flavour.name, flavour)
            d.provision.append(ProvisionRequest(name, machine, group, self._labels(group, machine), keys, requests))
            counted = []
            via = " from cluster-autoscaler (ProvisioningRequest)" if self.hands_demand else ""
            for key in keys:
                pod = snap.pods.get(key)
                if pod is not None:
                    k = self._attempt_key(pod.pod)
                    self.attempts[k] = self.attempts.get(k, 0) + 1
                    counted.append(k)
                message = (
                    f"node {name} ({flavour.name}, ${flavour.price_per_hour:.4f}/h, {group.value} group) "
                    f"requested{via} for this pod; plan {summary}, ${cost:.4f}/h"
                )
                self._say(d, self._pod_notice(snap, key, "TriggeredScaleUp", message), key=name)
            if self.hands_demand:
                self._demand[name] = tuple(counted)

    def _forecast(self, pending: list[Pod], batch_nodes: list[Node], now: float, lag: float) -> Resources:
        """Paper 001 Eq. 2 for the batch group: shortage at now + lag, capacity incl. nodes being provisioned."""
        demand = Resources.total(p.requests for p in pending)
        running = [p for n in batch_nodes for p in n.pods]
        capacity = Resources.total(n.allocatable for n in batch_nodes) + Resources.total(
            e.flavour.capacity for e in self.state.ledgers[NodeGroup.BATCH].entries
        )
        unique = list({p.key: p for p in running}.values())
        return autoscale.forecast_shortage(demand, unique, capacity, now, lag)

    def _retire(self, d: Decisions, result: autoscale_scan.ScanResult, present: Mapping[str, Node]) -> None:
        """Cordon the nodes the scan retires for capacity (and uncordon those it no longer needs), with an Event
        on each; nothing in dry run (the scan's memory forgets them: the label is the record)."""
        if self.s.dry_run:
            return
        largest = autoscale.capacity_order(self.flavours, self.s.weights)[-1]
        for name in result.retire:
            d.retire.append(name)
            node = present[name]
            message = (
                f"autoscaler.limits.max_nodes {self.s.max_nodes} is spent and pods still wait: cordoned so its "
                f"pods (all ending within {self.s.retire_drain_seconds:.0f}s) finish here and its slot holds a "
                f"{largest.name} ({_describe(largest.capacity)}) instead of {node.flavour or 'this node'}"
            )
            self._say(d, Notice("Node", "", name, "", "RetiringForCapacity", message), key=str(d.now))
        for name in result.unretire:
            if name not in present:
                continue
            d.unretire.append(name)
            message = "no pod waits for capacity under autoscaler.limits.max_nodes any more: uncordoned"
            self._say(d, Notice("Node", "", name, "", "RetirementCancelled", message), key=str(d.now))

    def _scale_down(
        self, d: Decisions, result: autoscale_scan.ScanResult, present: Mapping[str, Node], now: float
    ) -> None:
        """Delete the idle nodes the scan found (ours only, unless configured otherwise; never in dry run) and
        hand the under-utilised batch nodes to the consolidation flow."""
        for name, since in result.idle:
            node = present[name]
            if name in self.deleting or (self.s.scale_down_provisioned_only and not self.owned(node)):
                continue
            if not self.s.dry_run:
                self.deleting[name] = now
                d.delete.append(name)
                message = (
                    "retired for capacity and now empty"
                    if name in self.state.retiring
                    else f"no pods for {now - since:.0f}s (idle period {self.s.idle_seconds:.0f}s)"
                )
                self._say(d, Notice("Node", "", name, "", "ScaleDownEmpty", message), key=str(now))
        cands = result.consolidation_candidates
        d.consolidation = Consolidation(now, cands, result.consolidation_plans, result.underutilized)
        under = dict(result.underutilized)
        for name in cands:
            message = (
                f"utilisation {present[name].utilization():.2f} below {self.s.underutil_threshold} since "
                f"{under[name]:.0f}; handed to consolidation (not evicted by the autoscaler)"
            )
            self._say(d, Notice("Node", "", name, "", "UnderutilizedBatchNode", message), key=str(under[name]))
