"""One scan of the heterogeneous autoscaler (HTAS): nodes, pending pods and the scan's memory in, decisions out.

This is the decision the autoscaler sidecar takes every scan (``extender.autoscaler.loop.AutoscalerLoop.step``
feeds it from the cluster's snapshot) and the one the simulator's ``htas`` policy takes every scan
(``extender.sim.engine.Simulator._htas_scan`` feeds it from the simulator's state): the step exists once,
here, so a figure from the simulator describes the code that runs in the cluster (issue 14). Pure: no I/O,
no clock (``now`` is given), no randomness; its memory between scans is ``ScanState``, which the caller
keeps and passes back.

What one scan decides:

* scale-up, service group, every scan: the pending service pods that fit no node of their group and are not
  covered by a node being provisioned (``ProvisioningLedger.uncovered``, paper 003 Alg. 7) -> ``plan_pods``
  (greedy heterogeneous packing by cost-efficiency, paper 000 / 004);
* scale-up, batch group, every ``batch_cycle_seconds`` or at once on a burst (the uncovered batch demand does
  not fit the largest flavour's memory) or at once when a batch pod would otherwise miss its SLO (it could not
  wait for the next cycle plus the node lag: ``slo_urgent``): ``plan_batch`` (0-bin capacity deducted first,
  paper 000 Alg. 4);
* at most ``budget`` nodes per scan and ``cap`` nodes in all (service group first): the caller's limits. They
  differ in kind: a per-scan limit only delays buying, so the plan's first ``budget`` nodes are bought and the
  mix is the cheapest plan's; a total limit that the cheapest plan would exceed makes the planner re-plan for
  capacity per node (``autoscale.plan_pods(max_nodes=...)``: larger flavours), so the cap holds capacity
  instead of being spent on the smallest, cheapest-per-unit flavours;
* scale-down: nodes with no pods (``counts`` decides which pods count) since the first scan that saw them
  empty, for ``idle_seconds`` (paper 004); batch nodes under ``underutil_threshold`` for
  ``underutil_sustain_seconds``, once no batch pod has been pending for ``batch_queue_quiet_seconds``, with
  the migration plans that empty them (paper 000 §5.3): handed to the consolidation flow, never evicted here;
* retirement for capacity (``retire_for_cap``): when the total cap is spent and demand is still left over, the
  nodes holding a slot with less capacity than the catalogue's largest flavour, whose pods all finish on their
  own soon, are cordoned (``retire``) so they drain by attrition; an empty retiring node is idle at once and its
  slot goes to a larger node at the next scan. Without it a cap filled early by small, cheap-per-unit nodes
  holds a fraction of the capacity the cap allows for good (the Alibaba trace at 200 nodes: 418-448 cores held
  while 1,000+ were asked for, and the run never finished). Demand gone: the retiring nodes are uncordoned
  (``unretire``).

What stays with the callers: the ledger's bookkeeping of what was actually requested (``ScanState.provisioned``
/ ``arrived``), naming, the provider, Events, the sidecar's give-up and unservable notices, its dry run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from extender.core import autoscale, packing, reschedule
from extender.core.model import Flavour, InvalidInputError, Node, NodeGroup, Pod, Resources, WorkloadKind

__all__ = [
    "Purchase",
    "ScanResult",
    "ScanSettings",
    "ScanState",
    "group_of",
    "in_group",
    "retire_for_cap",
    "scan",
    "slo_urgent",
]


def group_of(pod: Pod) -> NodeGroup:
    """The node group a pod belongs to: batch pods to the batch group, everything else to the service group."""
    return NodeGroup.BATCH if pod.kind is WorkloadKind.BATCH else NodeGroup.SERVICE


def in_group(node: Node, group: NodeGroup) -> bool:
    """The default ``accepts``: a node takes the pods of its own group."""
    return node.group is group


def _counts(pod: Pod) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class ScanSettings:
    """The scan's knobs (the sidecar's AutoscalerSettings, the simulator's SimConfig map onto them)."""

    flavours: tuple[Flavour, ...]
    weights: autoscale.ScoreWeights = field(default_factory=autoscale.ScoreWeights)
    batch_cycle_seconds: float = 300.0  # paper 000 Table 6
    idle_seconds: float = 300.0  # paper 004
    underutil_threshold: float = 0.5  # paper 000 Table 6
    underutil_sustain_seconds: float = 300.0
    batch_queue_quiet_seconds: float = 300.0
    # class name -> SLO (the extender config's classes): a batch pod of a class listed here is planned for at
    # once when waiting for the next batch cycle would break its SLO; empty: the cycle and bursts only.
    slo: Mapping[str, float] = field(default_factory=dict)
    # retirement for capacity (``retire_for_cap``): a node is retired only if its pods all finish within this
    # many seconds by their own runtimes; 0: never retire (paper 004's HTAS, which has no node cap)
    retire_drain_seconds: float = 0.0

    def __post_init__(self) -> None:
        autoscale.validate_catalogue(self.flavours)
        for name, value in self.slo.items():
            if not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise InvalidInputError(f"slo of class {name!r} must be in (0, 1], got {value!r}")
        for name in (
            "batch_cycle_seconds",
            "idle_seconds",
            "underutil_sustain_seconds",
            "batch_queue_quiet_seconds",
            "retire_drain_seconds",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
                raise InvalidInputError(f"{name} must be a non-negative number, got {value!r}")


@dataclass(slots=True)
class ScanState:
    """What a scan remembers for the next one. One provisioning ledger per node group: a batch pod is never
    'covered' by room on a service node being provisioned (node groups are enforced by the extender's
    filter), nor the reverse."""

    ledgers: dict[NodeGroup, autoscale.ProvisioningLedger] = field(
        default_factory=lambda: {g: autoscale.ProvisioningLedger() for g in NodeGroup}
    )
    last_batch_plan: float = -math.inf
    last_batch_pending: float | None = None
    empty_since: dict[str, float] = field(default_factory=dict)
    underutil: reschedule.UnderutilState = field(default_factory=reschedule.UnderutilState)
    # nodes cordoned for capacity (``retire_for_cap``) -> since when; the sidecar also labels them, so a restarted
    # sidecar finds them again (``AutoscalerLoop.step``)
    retiring: dict[str, float] = field(default_factory=dict)

    def provisioned(self, group: NodeGroup, entry: autoscale.Provisioning) -> None:
        """The caller requested this node: its pods are covered until it joins (paper 003 Alg. 7)."""
        self.ledgers[group] = self.ledgers[group].add(entry)

    def arrived(self, node_name: str) -> NodeGroup | None:
        """The node joined (or was cancelled): forget it; returns the group whose ledger held it."""
        for group, ledger in self.ledgers.items():
            if any(e.node_name == node_name for e in ledger.entries):
                self.ledgers[group] = ledger.arrived(node_name)
                return group
        return None

    def expire(self, now: float, timeout_seconds: float) -> tuple[autoscale.Provisioning, ...]:
        """Forget the nodes requested more than ``timeout_seconds`` ago (``ProvisioningLedger.expire``)."""
        out: list[autoscale.Provisioning] = []
        for group in NodeGroup:
            self.ledgers[group], expired = self.ledgers[group].expire(now, timeout_seconds)
            out.extend(expired)
        return tuple(out)

    @property
    def provisioning(self) -> tuple[tuple[NodeGroup, autoscale.Provisioning], ...]:
        return tuple((g, e) for g in NodeGroup for e in self.ledgers[g].entries)


@dataclass(frozen=True, slots=True)
class Purchase:
    """One node to request: its group, flavour and the pods it is bought for."""

    group: NodeGroup
    flavour: Flavour
    pods: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GroupScaleUp:
    """The planner's answer for one group before the budget: how many pods it planned for, the full plan."""

    group: NodeGroup
    pods: int
    plan: autoscale.ScalePlan
    bought: int  # nodes of the plan within the budget (the first ones)

    @property
    def reshaped(self) -> bool:
        """The node cap changed the plan's flavour mix (``ScalePlan.reshaped``)."""
        return self.plan.reshaped


@dataclass(frozen=True, slots=True)
class ScanResult:
    now: float
    purchases: tuple[Purchase, ...] = ()
    plans: tuple[GroupScaleUp, ...] = ()
    limited: bool = False
    unschedulable: tuple[tuple[NodeGroup, int], ...] = ()
    uncovered: tuple[tuple[NodeGroup, int], ...] = ()
    idle: tuple[tuple[str, float], ...] = ()  # (node, empty since) empty for idle_seconds, by name
    underutilized: tuple[tuple[str, float], ...] = ()  # every batch node under the threshold, with since
    consolidation_candidates: tuple[str, ...] = ()
    consolidation_plans: tuple[reschedule.MigrationPlan, ...] = ()
    retire: tuple[str, ...] = ()  # nodes to cordon now so they drain for larger ones (``retire_for_cap``)
    unretire: tuple[str, ...] = ()  # retiring nodes to uncordon: the demand they drained for is gone


def slo_urgent(pod: Pod, waited: float, slo: float, horizon: float, now: float) -> bool:
    """Would this pending batch pod miss its SLO if it got a node only ``horizon`` seconds from now?

    A pod that has waited ``waited`` seconds and will run its remaining runtime R ends with availability
    R / (R + waited + horizon) (its first run, as the autoscaler sees it: the controller's account of earlier
    runs lives in another process), which stays >= slo while waited + horizon <= R (1 - slo) / slo. Services
    have no runtime: they are planned every scan anyway."""
    if pod.kind is not WorkloadKind.BATCH or pod.runtime_seconds is None:
        return False
    remaining = pod.remaining_runtime(now)
    return waited + horizon > remaining * (1.0 - slo) / slo


def slack_seconds(pod: Pod, waited: float, slo: float, now: float) -> float:
    """How much longer this pending batch pod may wait before its SLO breaks (``slo_urgent``'s bound)."""
    return pod.remaining_runtime(now) * (1.0 - slo) / slo - waited


def frees_in_time(pod: Pod, nodes: Sequence[Node], now: float, within: float) -> bool:
    """Will one of ``nodes`` have room for ``pod`` within ``within`` seconds, counting the batch pods that finish
    by then (the 0-bin reasoning of paper 000 Alg. 4 applied to one pod's deadline)? Cordoned nodes do not
    count: they are being emptied."""
    if within <= 0:
        return False
    req = pod.requests
    for node in nodes:
        if node.unschedulable:
            continue
        holding = [p for p in node.pods if not autoscale._releases_within(p, now, within)]
        if len(holding) + 1 > node.allocatable.pods:
            continue
        if req.fits_in(node.allocatable - Resources.total(p.requests for p in holding)):
            return True
    return False


def unschedulable(
    pending: Sequence[Pod], nodes: Sequence[Node], accepts: Callable[[Node, NodeGroup], bool] = in_group
) -> list[Pod]:
    """Pending pods that fit no schedulable node of their group now: the demand a scale-up is for.

    With the default ``accepts`` the pods asking cpu and memory only are tested against every node of their
    group at once (``_fits_any``): a full cluster with thousands of pending pods made the per-node loop the
    sidecar scan's dearest step. The loop (``_VECTORISED_UNSCHEDULABLE = False``) is the reference
    (tests/test_sim_fast_paths.py compares them)."""
    if not _VECTORISED_UNSCHEDULABLE or accepts is not in_group:
        return [pod for pod in pending if not any(accepts(n, group_of(pod)) and packing.fits(n, pod) for n in nodes)]
    free: dict[NodeGroup, list[tuple[int, int]]] = {g: [] for g in NodeGroup}
    for n in nodes:
        if n.group is not None and not n.unschedulable and len(n.pods) + 1 <= n.allocatable.pods:
            f = n.free
            free[n.group].append((f.cpu_milli, f.memory_bytes))
    tables = {g: _FreeTable(rows) for g, rows in free.items()}
    batch: dict[NodeGroup, list[int]] = {g: [] for g in NodeGroup}
    flags = [False] * len(pending)
    for i, pod in enumerate(pending):
        group = group_of(pod)
        table = tables[group]
        req = pod.requests
        if req.extended or not table.exact or max(abs(req.cpu_milli), abs(req.memory_bytes)) >= _TABLE_LIMIT:
            flags[i] = not any(in_group(n, group) and packing.fits(n, pod) for n in nodes)
        elif req.cpu_milli > table.max_cpu or req.memory_bytes > table.max_mem:
            flags[i] = True  # more than the roomiest node of the group has of one of them: fits none
        else:
            batch[group].append(i)
    for group, idx in batch.items():
        if idx:
            cpu = np.array([pending[i].requests.cpu_milli for i in idx], dtype=np.int64)
            mem = np.array([pending[i].requests.memory_bytes for i in idx], dtype=np.int64)
            for i, fits in zip(idx, tables[group].fits_any(cpu, mem).tolist(), strict=True):
                flags[i] = not fits
    return [pod for pod, flag in zip(pending, flags, strict=True) if flag]


# Pending pods are tested against their group's nodes as numpy columns (False: the per-node loop).
_VECTORISED_UNSCHEDULABLE = True
# int64 columns stay exact below this; larger quantities (bad input) take the per-node loop.
_TABLE_LIMIT = 2**62


class _FreeTable:
    """The free cpu and memory of the nodes of one group that can take one more pod (schedulable, a slot)."""

    def __init__(self, rows: list[tuple[int, int]]) -> None:
        self.exact = all(abs(c) < _TABLE_LIMIT and abs(m) < _TABLE_LIMIT for c, m in rows)
        self.max_cpu = max((c for c, _ in rows), default=-1)
        self.max_mem = max((m for _, m in rows), default=-1)
        if self.exact:
            arr = np.array(rows, dtype=np.int64).reshape(len(rows), 2)
            self.cpu = arr[:, 0].copy()
            self.mem = arr[:, 1].copy()

    def fits_any(self, cpu: npt.NDArray[np.int64], mem: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Per pod (cpu[i], mem[i]): does some node have at least that much free of both?"""
        out = np.zeros(cpu.size, dtype=bool)
        step = max(1, 2_000_000 // max(1, self.cpu.size))
        for lo in range(0, cpu.size, step):
            c, m = cpu[lo : lo + step, np.newaxis], mem[lo : lo + step, np.newaxis]
            out[lo : lo + step] = ((c <= self.cpu[np.newaxis, :]) & (m <= self.mem[np.newaxis, :])).any(axis=1)
        return out


def retire_for_cap(
    nodes: Sequence[Node],
    short: Mapping[NodeGroup, Resources],
    flavours: Sequence[Flavour],
    weights: autoscale.ScoreWeights,
    now: float,
    *,
    retirable: frozenset[str],
    retiring: Mapping[str, float],
    drain_seconds: float,
    limit: float = math.inf,
    accepts: Callable[[Node, NodeGroup], bool] = in_group,
    counts: Callable[[Pod], bool] = _counts,
) -> tuple[str, ...]:
    """Which nodes to cordon so that, once their own pods finish, their slots under the node cap hold the
    catalogue's largest flavour instead (module docstring: retirement for capacity).

    ``short``: per group, the demand the cap left without a node this scan. Each retired node is expected to come
    back as the largest flavour (``autoscale.capacity_order``'s last, what the cap-aware planner buys once the
    cap binds), so it gains the difference in cpu and memory; nodes already retiring count first. Candidates are
    the ``retirable`` nodes of the group (the caller's: ours, not being deleted or consolidated), schedulable,
    smaller than the largest flavour, whose counted pods are all batch pods with a runtime that end within
    ``drain_seconds`` (a service never ends: cordoning its node would hold the slot for good). They are taken
    soonest-empty first (the slot is lost to new pods only until then), then smallest, then by name; at most
    ``limit`` per scan. Pure and deterministic."""
    if drain_seconds <= 0 or not short:
        return ()
    largest = autoscale.capacity_order(flavours, weights)[-1].capacity

    def gain(n: Node) -> tuple[int, int]:
        return (
            max(0, largest.cpu_milli - n.allocatable.cpu_milli),
            max(0, largest.memory_bytes - n.allocatable.memory_bytes),
        )

    def drain(n: Node) -> float | None:
        """Seconds until the node's counted pods have all finished; None: some pod never finishes."""
        end = 0.0
        for p in n.pods:
            if not counts(p):
                continue
            if p.kind is not WorkloadKind.BATCH or p.runtime_seconds is None:
                return None
            end = max(end, p.remaining_runtime(now))
        return end

    out: list[str] = []
    for group in (NodeGroup.SERVICE, NodeGroup.BATCH):
        need = short.get(group)
        if need is None:
            continue
        cpu, mem = need.cpu_milli, need.memory_bytes
        for n in nodes:
            if n.name in retiring and accepts(n, group):
                g_cpu, g_mem = gain(n)
                cpu, mem = cpu - g_cpu, mem - g_mem
        ranked: list[tuple[float, int, int, str]] = []
        for n in nodes:
            if n.name not in retirable or n.name in retiring or n.unschedulable or not accepts(n, group):
                continue
            g_cpu, g_mem = gain(n)
            if g_cpu <= 0 and g_mem <= 0:
                continue
            ends = drain(n)
            if ends is None or ends > drain_seconds:
                continue
            ranked.append((ends, n.allocatable.cpu_milli, n.allocatable.memory_bytes, n.name))
        by_name = {n.name: n for n in nodes}
        for _ends, _cpu, _mem, name in sorted(ranked):
            if (cpu <= 0 and mem <= 0) or len(out) >= limit:
                break
            if name in out:
                continue
            out.append(name)
            g_cpu, g_mem = gain(by_name[name])
            cpu, mem = cpu - g_cpu, mem - g_mem
    return tuple(out)


def scan(
    state: ScanState,
    settings: ScanSettings,
    nodes: Sequence[Node],
    pending: Sequence[Pod],
    now: float,
    *,
    batch_pending: bool | None = None,
    budget: float = math.inf,
    cap: float = math.inf,
    accepts: Callable[[Node, NodeGroup], bool] = in_group,
    counts: Callable[[Pod], bool] = _counts,
    leaving: frozenset[str] = frozenset(),
    waited: Mapping[str, float] | None = None,
    lag_seconds: float = 0.0,
    plan_without_budget: bool = True,
    retirable: frozenset[str] = frozenset(),
) -> ScanResult:
    """One autoscaling scan (module docstring). Updates ``state``'s clocks; the ledger changes only through
    ``state.provisioned`` / ``state.arrived``, which the caller calls for what it actually requested.

    ``nodes``: every node with its pods (cordoned ones marked unschedulable). ``pending``: the pods waiting for
    a node (the caller's notion of "the scheduler could not place it"); those that fit a node of their group
    are dropped here. ``batch_pending``: whether a batch pod is waiting at all (default: one is in
    ``pending``). ``budget``: nodes this scan may buy (a per-scan limit: it never changes which flavours are
    planned). ``cap``: nodes the total limit still allows (the limit minus the nodes owned and on order): a
    group's plan that would need more is re-planned within it (module docstring). ``accepts``: which nodes
    take which group's pods. ``counts``: which pods keep a node from being idle (DaemonSet pods do not).
    ``leaving``: nodes being deleted, left out of consolidation. ``waited``: pod key -> seconds it has been
    pending, and ``lag_seconds`` the expected node lag: with ``settings.slo``, a batch pod that cannot wait for
    the next cycle plus the lag (``slo_urgent``) makes the batch plan due now. ``plan_without_budget`` False:
    with no budget or cap left a group's plan is not computed (nothing can be bought; the clocks advance as
    they would): ``plans`` lacks it and ``limited`` is set. The simulator, which reads only the purchases,
    passes False; the sidecar reports the
    plans it could not buy. ``retirable``: the nodes this caller may cordon for capacity (``retire_for_cap``;
    empty: none), with ``settings.retire_drain_seconds`` > 0.
    """
    for name, limit in (("budget", budget), ("cap", cap)):
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or math.isnan(limit):
            raise InvalidInputError(f"scan {name} must be a number of nodes (inf: no limit), got {limit!r}")
    flavours = settings.flavours
    waiting = unschedulable(pending, nodes, accepts)
    by_group = {g: [p for p in waiting if group_of(p) is g] for g in NodeGroup}
    purchases: list[Purchase] = []
    plans: list[GroupScaleUp] = []
    uncovered: dict[NodeGroup, int] = {}
    limited = False
    left = budget
    room = cap

    def unplanned() -> bool:
        """No budget left and no plan wanted: the plan is skipped (it could buy nothing)."""
        nonlocal limited
        if min(left, room) > 0 or plan_without_budget:
            return False
        limited = True
        return True

    def within() -> int | None:
        """The cap on the next plan's node count (None: no total limit)."""
        return None if room == math.inf else max(0, int(room))

    def buy(group: NodeGroup, pods: int, plan: autoscale.ScalePlan) -> None:
        nonlocal left, room, limited
        nodes_ = list(plan.nodes)
        allowed = max(0, int(min(left, room, len(nodes_))))
        if allowed < len(nodes_) or plan.deferred:
            limited = True
        left -= allowed
        room -= allowed
        plans.append(GroupScaleUp(group, pods, plan, allowed))
        purchases.extend(Purchase(group, f, keys) for f, keys in nodes_[:allowed])

    services = state.ledgers[NodeGroup.SERVICE].uncovered(by_group[NodeGroup.SERVICE])
    uncovered[NodeGroup.SERVICE] = len(services)
    if services and not unplanned():
        buy(
            NodeGroup.SERVICE,
            len(services),
            autoscale.plan_pods(services, flavours, settings.weights, max_nodes=within()),
        )
    batch = state.ledgers[NodeGroup.BATCH].uncovered(by_group[NodeGroup.BATCH])
    uncovered[NodeGroup.BATCH] = len(batch)
    if batch:
        due = now - state.last_batch_plan >= settings.batch_cycle_seconds
        biggest = max(flavours, key=lambda f: f.capacity.memory_bytes).capacity
        burst = not Resources.total(p.requests for p in batch).fits_in(biggest)
        urgent = False
        if not (due or burst) and waited is not None and settings.slo:
            # a pod that cannot wait for the next cycle plus the lag, and for which no batch node frees room
            # before its slack runs out, makes the plan due now
            horizon = state.last_batch_plan + settings.batch_cycle_seconds - now + lag_seconds
            group_nodes = [n for n in nodes if accepts(n, NodeGroup.BATCH)]
            urgent = any(
                p.class_name in settings.slo
                and p.key in waited
                and slo_urgent(p, waited[p.key], settings.slo[p.class_name], horizon, now)
                and not frees_in_time(
                    p, group_nodes, now, slack_seconds(p, waited[p.key], settings.slo[p.class_name], now)
                )
                for p in batch
            )
        if due or burst or urgent:
            state.last_batch_plan = now
            if not unplanned():
                batch_nodes = [n for n in nodes if n.group is NodeGroup.BATCH]
                plan = autoscale.plan_batch(
                    batch,
                    batch_nodes,
                    flavours,
                    settings.weights,
                    now,
                    settings.batch_cycle_seconds,
                    max_nodes=within(),
                )
                buy(NodeGroup.BATCH, len(batch), plan)

    # retirement for capacity: the cap is spent and demand is left over -> cordon small nodes that drain soon
    names = {n.name for n in nodes}
    state.retiring = {n: t for n, t in state.retiring.items() if n in names}
    short: dict[NodeGroup, Resources] = {}
    if cap != math.inf and room <= 0:
        bought = {k for p in purchases for k in p.pods}
        for group, pods in ((NodeGroup.SERVICE, services), (NodeGroup.BATCH, batch)):
            rest = [
                p.requests
                for p in pods
                if p.key not in bought and any(p.requests.fits_in(f.capacity) for f in flavours)
            ]
            if rest:
                short[group] = Resources.total(rest)
    retire: tuple[str, ...] = ()
    unretire: tuple[str, ...] = ()
    if short:
        retire = retire_for_cap(
            nodes,
            short,
            flavours,
            settings.weights,
            now,
            retirable=retirable - leaving,
            retiring=state.retiring,
            drain_seconds=settings.retire_drain_seconds,
            limit=budget,
            accepts=accepts,
            counts=counts,
        )
        state.retiring.update((name, now) for name in retire)
    elif state.retiring:
        unretire = tuple(sorted(state.retiring))
        state.retiring.clear()
    # scale-down: empty nodes after the idle period (a retiring node at once: it was cordoned to leave)
    state.empty_since = {n: t for n, t in state.empty_since.items() if n in names}
    idle: list[tuple[str, float]] = []
    for n in sorted(nodes, key=lambda n: n.name):
        if any(counts(p) for p in n.pods):
            state.empty_since.pop(n.name, None)
            continue
        since = state.empty_since.setdefault(n.name, now)  # pods leave between scans: this errs long
        if now - since >= settings.idle_seconds or n.name in state.retiring:
            idle.append((n.name, since))
    # under-utilised batch nodes -> consolidation, once the batch queue has been quiet
    # (an idle node goes by deletion, not by migration: left out, as are the nodes being deleted and retiring)
    gone = leaving | {name for name, _ in idle} | set(state.retiring)
    batch_group = [n for n in nodes if n.group is NodeGroup.BATCH and n.name not in gone]
    state.underutil = reschedule.update_underutilized(
        state.underutil, [n for n in batch_group if n.pods], now, settings.underutil_threshold
    )
    if batch_pending is None:
        batch_pending = any(p.kind is WorkloadKind.BATCH for p in pending)
    if state.last_batch_pending is None:
        state.last_batch_pending = now
    under = tuple(sorted(state.underutil.since.items()))
    result = ScanResult(
        now,
        tuple(purchases),
        tuple(plans),
        limited,
        tuple((g, len(by_group[g])) for g in (NodeGroup.SERVICE, NodeGroup.BATCH)),
        tuple((g, uncovered[g]) for g in (NodeGroup.SERVICE, NodeGroup.BATCH)),
        tuple(idle),
        under,
        retire=retire,
        unretire=unretire,
    )
    if batch_pending:
        state.last_batch_pending = now
        return result
    if now - state.last_batch_pending < settings.batch_queue_quiet_seconds:
        return result
    cands = reschedule.sustained_underutilized(state.underutil, now, settings.underutil_sustain_seconds)
    plans_ = reschedule.consolidation_plans(batch_group, cands, now, settings.batch_cycle_seconds) if cands else []
    return ScanResult(
        now,
        result.purchases,
        result.plans,
        limited,
        result.unschedulable,
        result.uncovered,
        result.idle,
        under,
        tuple(cands),
        tuple(plans_),
        retire,
        unretire,
    )
