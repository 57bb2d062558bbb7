"""Discrete-event replay of a workload through the same extender/core decisions the cluster uses.

The engine owns only time and bookkeeping (who runs where, e / p accumulators, billing); every
decision — queue order, feasibility and victims, host choice, scale-up plan, scale-down, migration
plan — is a call into extender.core. That is the point: a policy measured here is the policy deployed.

Time is never kinder than a real cluster: every (re)start costs an allocation overhead alpha (>= 2 s by
default) during which the instance is pending, nodes arrive after an acquisition lag, migrations take
checkpoint + transfer time, and billing rounds each node's lifetime up to the minute.
"""

from __future__ import annotations

import heapq
import math
import random
import time as wallclock
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Protocol, cast

import numpy as np
import numpy.typing as npt

from extender.controller import decide
from extender.controller.accounting import Account, RequestState
from extender.core import autoscale, autoscale_scan, packing, qos, reschedule
from extender.core.model import (
    Flavour,
    InvalidInputError,
    Node,
    NodeGroup,
    Pod,
    Resources,
    WorkloadKind,
)
from extender.sim.product import ProductSettings
from extender.sim.workloads import RequestSpec, Workload

# Events that change what runs where; a run with only ticks, scans and passes for STALL_SECONDS, nothing placed
# and nothing on order has stopped for good (Simulator._stalled).
_PROGRESS = frozenset({"arrive", "started", "complete", "migrated", "node_ready", "hook"})
STALL_SECONDS = 24 * 3600.0
POLICIES = ("qos-driven", "qos-paper", "priority", "htas", "k8s", "product")
PREEMPTIVE = ("qos-driven", "qos-paper", "priority")  # fixed hosts, ordered queue, preemption
# Policies whose pods go through the QoS controller's gate (no PriorityClass: QoS decides alone).
GATED = ("qos-driven", "qos-paper", "product")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Timings and thresholds. Defaults follow the papers (000 Table 6, 002 §4.1.3) and CA's defaults."""

    seed: int = 1
    scheduling_cycle: float = 20.0  # paper 000 Table 6: pending pods retried at least this often
    watchdog: float = 10.0  # paper 002 §4.1.3
    autoscale_cycle: float = 300.0  # paper 000 Table 6 (batch group)
    service_scale_interval: float = 30.0  # htas scan interval (the sidecar's scan_interval_seconds default)
    ca_scan_interval: float = 10.0  # cluster-autoscaler --scan-interval default
    ca_unneeded_seconds: float = 600.0  # --scale-down-unneeded-time
    ca_delay_after_add: float = 600.0  # --scale-down-delay-after-add
    ca_threshold: float = 0.5  # --scale-down-utilization-threshold
    ca_flavour: str = "m1.medium"
    alpha_cold: float = 2.0  # allocation overhead of a first start (s)
    alpha_hot: float = 2.0  # of a restart after preemption / eviction / migration
    lag_min: float = 60.0  # node acquisition lag ~ U(lag_min, lag_max)
    lag_max: float = 120.0
    bandwidth_bytes_per_s: float = 1200e6 / 8  # paper 000 §6.2: 1,200 Mbps per VM
    checkpoint_seconds: float = 1.0  # CRIU dump + restore fixed cost on top of transfer
    idle_seconds: float = 300.0  # empty node removed after (paper 004)
    underutil_threshold: float = 0.5  # paper 000 Table 6
    underutil_sustain: float = 300.0
    batch_queue_quiet: float = 300.0  # batch queue empty this long before consolidation
    provisioning_timeout: float = 900.0
    weights: autoscale.ScoreWeights = field(default_factory=autoscale.ScoreWeights)
    qos_quantum: float = qos.RECOMMENDED_QUANTUM_SECONDS  # anti-thrashing of `qos-driven` (sim/README.md)
    qos_hysteresis: float = qos.RECOMMENDED_HYSTERESIS_SECONDS
    product: ProductSettings = field(default_factory=ProductSettings)  # the `product` policy (sim/product.py)

    def __post_init__(self) -> None:
        for name in ("scheduling_cycle", "watchdog", "autoscale_cycle", "ca_scan_interval"):
            if not getattr(self, name) > 0:
                raise InvalidInputError(f"{name} must be positive")
        if self.alpha_cold < 0 or self.alpha_hot < 0 or self.lag_min < 0 or self.lag_max < self.lag_min:
            raise InvalidInputError("alpha and lag must be non-negative and lag_min <= lag_max")


class State(StrEnum):
    WAITING = "waiting"  # not yet arrived
    PENDING = "pending"
    ALLOCATING = "allocating"  # placed, paying alpha before it runs
    RUNNING = "running"
    MIGRATING = "migrating"
    DONE = "done"


@dataclass(slots=True)
class Req:
    spec: RequestSpec
    state: State = State.WAITING
    since: float = 0.0
    e: float = 0.0  # accumulated running time
    p: float = 0.0  # accumulated pending time (allocation and migration time included)
    work: float = 0.0  # progress towards completion (lost on eviction, kept by preemption/migration)
    node: str | None = None
    version: int = 0  # invalidates stale alloc/complete events
    preemptions: int = 0
    overhead: float = 0.0
    run_started: float = 0.0
    starts: int = 0
    done_at: float | None = None

    def fold(self, now: float) -> None:
        """Move the time since the last transition into e or p (and progress) before a state change."""
        dt = now - self.since
        if dt > 0:
            if self.state is State.RUNNING:
                self.e += dt
                self.work += dt
            elif self.state in (State.PENDING, State.ALLOCATING, State.MIGRATING):
                self.p += dt
        self.since = now

    def ep(self, now: float) -> tuple[float, float]:
        dt = max(0.0, now - self.since)
        if self.state is State.RUNNING:
            return self.e + dt, self.p
        if self.state in (State.PENDING, State.ALLOCATING, State.MIGRATING):
            return self.e, self.p + dt
        return self.e, self.p


def _under_half(cap_cpu: int, cap_mem: int, req_cpu: int, req_mem: int) -> bool:
    return 2 * req_cpu < cap_cpu and 2 * req_mem < cap_mem


@dataclass(slots=True)
class CostTerms:
    """Integrals (USD) that split the bill against the fluid lower bound (issue 33, part 3): at every instant a
    billed node is booting, empty or occupied, and the occupied nodes' price splits into the fluid bound of
    their capacity (the cheapest fractional mix of flavours with that much cpu and memory) and what the chosen
    flavours cost above it. The bound of the demand then splits the same way (see :meth:`breakdown`)."""

    booting: float = 0.0  # ordered, not yet Ready: billed from the order (lags)
    empty_nodes: float = 0.0  # Ready with no pod: idle tails before scale-down, and nodes waiting for pods
    occupied_nodes: float = 0.0  # Ready with at least one pod
    fluid_capacity: float = 0.0  # fluid bound of the occupied nodes' capacity
    fluid_requested: float = 0.0  # fluid bound of what the pods on them request
    # where the packing term sits: the occupied nodes' capacity and requests (core-hours, GiB-hours), and the
    # price of the occupied nodes whose pods request under half of both resources (drain tails, thin packing)
    capacity_core_hours: float = 0.0
    capacity_gib_hours: float = 0.0
    requested_core_hours: float = 0.0
    requested_gib_hours: float = 0.0
    under_half_nodes: float = 0.0

    def breakdown(self, cost_usd: float, fluid_usd: float) -> dict[str, float]:
        """The bill as the bound plus one term per cause, in USD; the terms add up to ``cost_usd`` exactly
        (``billing`` is the per-minute rounding, and ``waiting`` is negative: demand that has arrived but sits on
        no node counts in the bound while nothing is paid for it)."""
        return {
            "fluid_bound": fluid_usd,
            "waiting": self.fluid_requested - fluid_usd,
            "packing": self.fluid_capacity - self.fluid_requested,
            "flavour_mix": self.occupied_nodes - self.fluid_capacity,
            "empty_nodes": self.empty_nodes,
            "booting": self.booting,
            "billing": cost_usd - (self.occupied_nodes + self.empty_nodes + self.booting),
        }


@dataclass(slots=True)
class SimNode:
    name: str
    allocatable: Resources
    group: NodeGroup
    flavour: str | None
    price_per_hour: float
    requested_at: float
    ready_at: float
    pods: dict[str, str] = field(default_factory=dict)  # pod key -> request id
    cordoned: bool = False
    deleted_at: float | None = None
    owned: bool = False  # provisioned by the autoscaler (label provisioned-by=qos-autoscaler)

    @property
    def ready(self) -> bool:
        return self.deleted_at is None


@dataclass
class Counters:
    preemptions: int = 0
    evictions: int = 0
    migrations: int = 0
    lost_work: float = 0.0
    events: int = 0
    scale_ups: int = 0
    nodes_added: int = 0
    nodes_removed: int = 0


class SimHook(Protocol):
    """A layer riding on a run (extender/sim/colocation.py): called before each scheduling pass, whenever an
    instance leaves its node, and on its own ``hook`` events (``Simulator.push(t, "hook", payload)``)."""

    def before_schedule(self, sim: Simulator) -> None: ...

    def on_unplace(self, sim: Simulator, r: Req) -> None: ...

    def on_event(self, sim: Simulator, payload: object) -> None: ...


class Simulator:
    """One run of one policy over one workload."""

    def __init__(self, workload: Workload, policy: str, config: SimConfig | None = None) -> None:
        if policy not in POLICIES:
            raise InvalidInputError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
        self.w = workload
        self.policy = policy
        self.cfg = config or SimConfig()
        self.rng = random.Random(f"{self.cfg.seed}-{policy}-{workload.name}")
        self.now = 0.0
        self.heap: list[tuple[float, int, str, object]] = []
        self.seq = 0
        self.reqs: dict[str, Req] = {r.request_id: Req(r) for r in workload.requests}
        self.nodes: dict[str, SimNode] = {}
        self.retired: list[SimNode] = []
        self.provisioning: dict[str, SimNode] = {}
        # htas: the autoscaler sidecar's own scan (core.autoscale_scan), its memory between scans; k8s: CA's
        # upcoming nodes (one homogeneous group).
        self.scan_state = autoscale_scan.ScanState()
        self.ca_ledger = autoscale.ProvisioningLedger()
        self.c = Counters()
        self.autoscaled = not workload.hosts
        self.prod = self.cfg.product
        if policy == "product":
            unknown = sorted({r.class_name for r in workload.requests} - set(self.prod.classes))
            if unknown:
                raise InvalidInputError(f"workload {workload.name}: classes {unknown} are not configured")
            self.qpol = self.prod.qos_policy()
            if not self.autoscaled:
                # fixed hosts: no autoscaler, no node to wait for; the setting's doc says 0 there (validation 1)
                self.qpol = replace(self.qpol, peer_victim_wait_seconds=0.0)
            # The controller as config/controller ships it: pinned releases on the prioritize verb's own score.
            self._decide_settings = decide.Settings(
                max_gate_seconds=self.prod.max_gate_seconds,
                pin=self.prod.pin_node,
                host_score=self.prod.host_score,
                profile=self.prod.profile,
                cycle_seconds=self.prod.scaling_cycle_seconds,
            )
        else:
            self.qpol = qos.QosPolicy(
                classes=workload.classes,
                alpha_seconds=self.cfg.alpha_hot,
                min_run_quantum_seconds=self.cfg.qos_quantum if policy == "qos-driven" else 0.0,
                q_hysteresis_seconds=self.cfg.qos_hysteresis if policy == "qos-driven" else 0.0,
            )
            # The controller's own pass at c = 1, paper 002's host score (kube-scheduler's default resource scores).
            self._decide_settings = decide.Settings(max_gate_seconds=math.inf, host_score="least-allocated")
        if self.autoscaled and workload.flavours:
            if policy == "product":
                self._scan_settings = autoscale_scan.ScanSettings(
                    flavours=tuple(workload.flavours),
                    weights=self.prod.weights,
                    batch_cycle_seconds=self.prod.batch_cycle_seconds,
                    idle_seconds=self.prod.idle_seconds,
                    underutil_threshold=self.prod.underutil_threshold,
                    underutil_sustain_seconds=self.prod.underutil_sustain_seconds,
                    batch_queue_quiet_seconds=self.prod.batch_queue_quiet_seconds,
                    slo={name: c.slo for name, c in self.prod.classes.items()},
                    retire_drain_seconds=self.prod.retire_drain_seconds,
                )
            else:
                self._scan_settings = autoscale_scan.ScanSettings(
                    flavours=tuple(workload.flavours),
                    weights=self.cfg.weights,
                    batch_cycle_seconds=self.cfg.autoscale_cycle,
                    idle_seconds=self.cfg.idle_seconds,
                    underutil_threshold=self.cfg.underutil_threshold,
                    underutil_sustain_seconds=self.cfg.underutil_sustain,
                    batch_queue_quiet_seconds=self.cfg.batch_queue_quiet,
                )
        # product: the consolidation flow's memory (one node at a time; failed nodes left alone for a while)
        self.flow_source: str | None = None
        self.flow_moves: list[tuple[str, str]] = []
        self.flow_waiting: str | None = None  # request id whose migration the flow waits for
        self.left_alone: dict[str, float] = {}
        self.lag_samples: list[float] = []  # product: measured node lags, as the sidecar keeps them
        self.ca_unneeded: dict[str, float] = {}
        self.last_scale_up = -math.inf
        self.sched_pending = False
        self.node_seq = 0
        self.timeline: list[tuple[float, dict[str, int], float]] = []  # (t, nodes by flavour, cost rate)
        self.fluid_usd = 0.0
        self._fluid_cache: dict[tuple[int, int], float] = {}
        self._fluid = autoscale.FluidBound(workload.flavours) if workload.flavours else None
        self._util_dirty: set[str] = set()
        self._util_rows: dict[str, tuple[int, int, int, int]] = {}
        self._util_sums_cpu: dict[int, int] = {}
        self._util_sums_mem: dict[int, int] = {}
        self._util_rate = (0.0, 0.0)
        # what keeps the bill above the fluid bound (issue 33, part 3): per node, its price and (while it holds
        # pods) its capacity and what they request; counted per price so the rates are sums without drift
        self._cost_rows: dict[str, tuple[float, bool]] = {}  # node -> (price, occupied); sizes: _util_rows
        self._occupied_by_price: dict[float, int] = {}
        self._under_half_by_price: dict[float, int] = {}
        self._empty_by_price: dict[float, int] = {}
        self._occupied_capacity = [0, 0]
        self._occupied_requested = [0, 0]
        self._provisioning_changed = True
        self._cost_rates = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)  # booting, empty, occupied, fluid(cap), fluid(req), thin
        self.cost_terms = CostTerms()
        self.util_cpu = 0.0  # integral of requested / allocatable over node-time
        self.util_mem = 0.0
        self.node_seconds_live = 0.0
        self._last_integrate = 0.0
        self._active_demand = Resources()
        self._node_cache: dict[str, Node] = {}
        self._pod_cache: dict[str, tuple[tuple[int, State], Pod]] = {}
        # a request's Account changes only when it is folded (a transition: version, state, since) or counted
        self._account_cache: dict[str, tuple[tuple[int, State, float, int, int], Account]] = {}
        self._pending_ids: dict[str, None] = {}  # insertion-ordered set: the pending queue without a scan
        self._done = 0
        self._requests = {r.request_id: r.requests for r in workload.requests}
        self.hook: SimHook | None = None  # e.g. co-location on the slack (sim/colocation.py)

    # ---- event plumbing ------------------------------------------------------------------------------

    def push(self, t: float, kind: str, payload: object = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, payload))

    def request_schedule(self) -> None:
        if not self.sched_pending:
            self.sched_pending = True
            self.push(self.now, "schedule")

    def run(self) -> SimResult:
        started = wallclock.perf_counter()
        for spec in self.w.requests:
            self.push(spec.arrival, "arrive", spec.request_id)
        for host in self.w.hosts:
            self._add_node(host.name, host.capacity, host.group, host.flavour, 0.0, 0.0, 0.0)
        for flavour_name, group in self.w.initial:
            f = self.w.flavour(flavour_name)
            node = self._add_node(self._new_name(f.name), f.capacity, group, f.name, f.price_per_hour, 0.0, 0.0)
            # The workload's first nodes are the autoscaled groups' initial nodes (paper 000 §6.2: HTAS manages
            # its two workers; cluster-autoscaler's group holds them too), so the product may remove them.
            node.owned = True
        self.push(0.0, "tick")
        if self.autoscaled:
            self.push(0.0, "autoscale")
        horizon = self.w.horizon
        last_progress = 0.0
        while self.heap:
            t, _, kind, payload = heapq.heappop(self.heap)
            if horizon is not None and t > horizon:
                break
            if not self.autoscaled and horizon is None and self._all_done():
                break
            self._integrate(t)
            self.now = t
            self.c.events += 1
            getattr(self, f"_on_{kind}")(payload)
            if self.autoscaled and self._all_done() and not (horizon is not None and self.w.bill_to_horizon):
                break
            if kind in _PROGRESS:
                last_progress = t
            elif self.autoscaled and self._stalled(t - last_progress):
                break
        end = horizon if horizon is not None else self.now
        self._integrate(end)
        self.now = end
        for r in self.reqs.values():
            if r.state is not State.DONE and r.state is not State.WAITING:
                r.fold(end)
        return self._result(end, wallclock.perf_counter() - started)

    def _all_done(self) -> bool:
        return self._done == len(self.reqs)

    def _stalled(self, quiet: float) -> bool:
        """An autoscaled run that can no longer change: every request arrived, none placed, no node on order,
        and nothing but the periodic ticks for ``STALL_SECONDS``. Pods no flavour of the policy can host (k8s's
        one m1.medium against the Alibaba trace's largest tasks) would otherwise keep the replay ticking for
        ever; they are reported as ``requests_incomplete``."""
        if quiet < STALL_SECONDS or self.provisioning or self._arrivals_left():
            return False
        return all(not n.pods for n in self.nodes.values())

    def _arrivals_left(self) -> bool:
        return any(r.state is State.WAITING for r in self.reqs.values())

    # ---- integrals: utilisation, fluid lower bound ---------------------------------------------------

    def _integrate(self, t: float) -> None:
        dt = t - self._last_integrate
        if dt <= 0:
            return
        if self._util_dirty:
            self._refresh_util()
        self.util_cpu += dt * self._util_rate[0]
        self.util_mem += dt * self._util_rate[1]
        self.node_seconds_live += dt * len(self.nodes)
        if self._fluid is not None:
            if self._provisioning_changed:
                self._provisioning_changed = False
                booting = sum(n.price_per_hour for n in self.provisioning.values())
                self._cost_rates = (booting, *self._cost_rates[1:])
            booting, empty, occupied, f_cap, f_req, thin = self._cost_rates
            h = dt / 3600.0
            ct = self.cost_terms
            ct.under_half_nodes += thin * h
            ct.capacity_core_hours += self._occupied_capacity[0] / 1000.0 * h
            ct.capacity_gib_hours += self._occupied_capacity[1] / 2**30 * h
            ct.requested_core_hours += self._occupied_requested[0] / 1000.0 * h
            ct.requested_gib_hours += self._occupied_requested[1] / 2**30 * h
            ct.booting += booting * h
            ct.empty_nodes += empty * h
            ct.occupied_nodes += occupied * h
            ct.fluid_capacity += f_cap * h
            ct.fluid_requested += f_req * h
        if self._fluid is not None:
            self.fluid_usd += (
                self._fluid_rate(self._active_demand.cpu_milli, self._active_demand.memory_bytes) * dt / 3600.0
            )
        self._last_integrate = t

    def _touch(self, name: str) -> None:
        """Node ``name`` changed (pods, cordon, arrival or removal): drop its cached core view and count it
        again in the utilisation integral."""
        self._node_cache.pop(name, None)
        self._util_dirty.add(name)

    def _refresh_util(self) -> None:
        """Sum of requested / allocatable over the live nodes, kept as exact integer sums per allocatable value
        (a few flavours) and updated for the changed nodes only: per event it costs O(changed), not O(nodes),
        which on the whole Alibaba trace (1,000+ nodes, a million events) was most of k8s's time."""
        costs = self._fluid is not None
        for name in self._util_dirty:
            old = self._util_rows.pop(name, None)
            if old is not None:
                ac, am, rc, rm = old
                self._util_sums_cpu[ac] -= rc
                self._util_sums_mem[am] -= rm
                if costs:
                    self._cost_row_out(name, old)
            node = self.nodes.get(name)
            if node is not None:
                req = self._requested(node)
                ac, am = node.allocatable.cpu_milli, node.allocatable.memory_bytes
                row = self._util_rows[name] = (ac, am, req.cpu_milli, req.memory_bytes)
                self._util_sums_cpu[ac] = self._util_sums_cpu.get(ac, 0) + req.cpu_milli
                self._util_sums_mem[am] = self._util_sums_mem.get(am, 0) + req.memory_bytes
                if costs:
                    self._cost_row_in(node, row)
        if costs:
            self._refresh_cost_rates()
        self._util_dirty.clear()
        self._util_rate = (
            sum(s / a for a, s in sorted(self._util_sums_cpu.items())),
            sum(s / a for a, s in sorted(self._util_sums_mem.items())),
        )

    def _cost_row_out(self, name: str, sizes: tuple[int, int, int, int]) -> None:
        """Take a node's last state (``sizes``: its ``_util_rows`` entry) out of the cost terms' sums."""
        price, occupied = self._cost_rows.pop(name)
        self._count_cost_row(price, occupied, sizes, -1)

    def _cost_row_in(self, node: SimNode, sizes: tuple[int, int, int, int]) -> None:
        """Count a node in the cost terms' sums: empty, or occupied with its capacity and requests."""
        price, occupied = node.price_per_hour, bool(node.pods)
        self._cost_rows[node.name] = (price, occupied)
        self._count_cost_row(price, occupied, sizes, 1)

    def _count_cost_row(self, price: float, occupied: bool, sizes: tuple[int, int, int, int], sign: int) -> None:
        """Add (``sign`` 1) or remove (-1) one node's state in the per-price counts and the occupied sums."""
        if not occupied:
            self._empty_by_price[price] = self._empty_by_price.get(price, 0) + sign
            return
        self._occupied_by_price[price] = self._occupied_by_price.get(price, 0) + sign
        if _under_half(*sizes):
            self._under_half_by_price[price] = self._under_half_by_price.get(price, 0) + sign
        cap, req = self._occupied_capacity, self._occupied_requested
        cap[0] += sign * sizes[0]
        cap[1] += sign * sizes[1]
        req[0] += sign * sizes[2]
        req[1] += sign * sizes[3]

    def _refresh_cost_rates(self) -> None:
        """The cost terms' rates from the sums: each node is booting (in ``provisioning``, not here), empty, or
        occupied; the fluid bound is taken of the occupied nodes' capacity and of what their pods request."""
        cap, req = self._occupied_capacity, self._occupied_requested
        self._cost_rates = (
            self._cost_rates[0],
            sum(p * k for p, k in sorted(self._empty_by_price.items())),
            sum(p * k for p, k in sorted(self._occupied_by_price.items())),
            self._fluid_rate(cap[0], cap[1]),
            self._fluid_rate(req[0], req[1]),
            sum(p * k for p, k in sorted(self._under_half_by_price.items())),
        )

    def _fluid_rate(self, cpu_milli: int, memory_bytes: int) -> float:
        if self._fluid is None or (cpu_milli == 0 and memory_bytes == 0):
            return 0.0
        key = (cpu_milli, memory_bytes)
        rate = self._fluid_cache.get(key)
        if rate is None:
            rate = self._fluid.per_hour(Resources(cpu_milli, memory_bytes))
            self._fluid_cache[key] = rate
        return rate

    def _snapshot_timeline(self) -> None:
        counts: dict[str, int] = {}
        rate = 0.0
        for n in [*self.nodes.values(), *self.provisioning.values()]:
            counts[n.flavour or "host"] = counts.get(n.flavour or "host", 0) + 1
            rate += n.price_per_hour
        self.timeline.append((self.now, counts, rate))

    # ---- nodes ---------------------------------------------------------------------------------------

    def _new_name(self, flavour: str) -> str:
        self.node_seq += 1
        return f"{flavour}-{self.node_seq}"

    def _add_node(
        self,
        name: str,
        cap: Resources,
        group: NodeGroup,
        flavour: str | None,
        price: float,
        requested_at: float,
        ready_at: float,
    ) -> SimNode:
        node = SimNode(name, cap, group, flavour, price, requested_at, ready_at)
        self.nodes[name] = node
        self._touch(name)
        self._snapshot_timeline()
        return node

    def _remove_node(self, node: SimNode) -> None:
        assert not node.pods, f"removing non-empty node {node.name}"
        node.deleted_at = self.now
        del self.nodes[node.name]
        self._touch(node.name)
        self.retired.append(node)
        self.c.nodes_removed += 1
        self._snapshot_timeline()

    def _requested(self, node: SimNode) -> Resources:
        return self._core_node(node).requested

    def _core_node(self, node: SimNode) -> Node:
        cached = self._node_cache.get(node.name)
        if cached is None:
            cached = Node(
                node.name,
                node.allocatable,
                group=node.group,
                flavour=node.flavour,
                pods=tuple(self._pod(self.reqs[rid]) for rid in node.pods.values()),
                unschedulable=node.cordoned,
            )
            self._node_cache[node.name] = cached
        return cached

    def _priority(self, s: RequestSpec) -> int:
        """The pod's priority as deployed: the class's PriorityClass under `priority` (paper 002's reference);
        none under the QoS policies (bench/qos_validation.py creates their pods without a PriorityClass, so the
        controller's priority rule never binds: QoS decides alone); the workload's own value otherwise."""
        if self.policy == "priority":
            return self.w.classes[s.class_name].priority
        return 0 if self.policy in GATED else s.priority

    def _pod(self, r: Req) -> Pod:
        """The core view of a request's instance, cached until its next transition (version, state)."""
        key = (r.version, r.state)
        cached = self._pod_cache.get(r.spec.request_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        s = r.spec
        pod = Pod(
            name=s.request_id,
            requests=self._requests[s.request_id],
            request_id=s.request_id,
            uid=s.request_id,
            priority=self._priority(s),
            class_name=s.class_name,
            kind=s.kind,
            runtime_seconds=s.duration if s.kind is WorkloadKind.BATCH else None,
            started_at=r.run_started if r.state is State.RUNNING else None,
            progress_seconds=r.work,
            node_name=r.node,
        )
        self._pod_cache[s.request_id] = (key, pod)
        return pod

    # ---- request transitions -------------------------------------------------------------------------

    def _place(self, r: Req, node: SimNode) -> None:
        r.fold(self.now)
        alpha = self.cfg.alpha_cold if r.starts == 0 else self.cfg.alpha_hot
        r.starts += 1
        r.overhead += alpha if r.starts > 1 else 0.0
        r.state = State.ALLOCATING
        self._pending_ids.pop(r.spec.request_id, None)
        r.node = node.name
        r.version += 1
        node.pods[f"default/{r.spec.request_id}"] = r.spec.request_id
        self._touch(node.name)
        self.push(self.now + alpha, "started", (r.spec.request_id, r.version))

    def _unplace(self, r: Req, lose_work: bool) -> SimNode:
        r.fold(self.now)
        assert r.node is not None
        node = self.nodes[r.node]
        del node.pods[f"default/{r.spec.request_id}"]
        self._touch(node.name)
        if lose_work:
            self.c.lost_work += r.work
            r.work = 0.0
        r.node = None
        r.state = State.PENDING
        self._pending_ids[r.spec.request_id] = None
        r.version += 1
        if self.hook is not None:
            self.hook.on_unplace(self, r)
        return node

    def _on_hook(self, payload: object) -> None:
        if self.hook is not None:
            self.hook.on_event(self, payload)

    def _on_arrive(self, rid: object) -> None:
        r = self.reqs[str(rid)]
        r.state = State.PENDING
        self._pending_ids[r.spec.request_id] = None
        r.since = self.now
        self._active_demand = self._active_demand + r.spec.requests
        self.request_schedule()

    def _on_started(self, payload: object) -> None:
        self._run(payload, State.ALLOCATING)

    def _run(self, payload: object, expected: State) -> None:
        """An allocation or a migration finished: the instance runs from now and completes when its
        remaining work is done (its node's cached view changes: the pod now has a start time)."""
        rid, version = cast(tuple[str, int], payload)
        r = self.reqs[rid]
        if r.version != version or r.state is not expected:
            return
        r.fold(self.now)
        r.state = State.RUNNING
        r.run_started = self.now
        self._touch(r.node or "")
        self.push(self.now + max(0.0, r.spec.duration - r.work), "complete", (rid, r.version))

    def _on_complete(self, payload: object) -> None:
        rid, version = cast(tuple[str, int], payload)
        r = self.reqs[rid]
        if r.version != version or r.state is not State.RUNNING:
            return
        self._unplace(r, lose_work=False)
        r.state = State.DONE
        self._pending_ids.pop(rid, None)
        self._done += 1
        r.done_at = self.now
        self._active_demand = self._active_demand - r.spec.requests
        self.request_schedule()

    def _on_tick(self, _: object) -> None:
        # Preemptive policies rerun on the watchdog, the others on the scheduling cycle; scale-down checks ride
        # on the same tick, so it is never slower than cluster-autoscaler's scan.
        if self.policy == "product":
            period = self.prod.watchdog_seconds
        else:
            period = self.cfg.watchdog if self.policy in PREEMPTIVE else self.cfg.scheduling_cycle
        self.request_schedule()
        if self.autoscaled and self.policy == "k8s":
            self._ca_scale_down()
        if self.autoscaled and self.policy == "htas":
            self._consolidation_flow()
        self.push(self.now + min(period, self.cfg.ca_scan_interval), "tick")

    # ---- scheduling ----------------------------------------------------------------------------------

    def _pending(self) -> list[Req]:
        return [self.reqs[rid] for rid in self._pending_ids]

    def _on_schedule(self, _: object) -> None:
        self.sched_pending = False
        pending = self._pending()
        if pending and self.hook is not None:
            self.hook.before_schedule(self)
            pending = self._pending()
        if not pending:
            return
        if self.policy == "priority":
            self._schedule_priority(pending)
        elif self.policy in GATED:
            self._schedule_qos(pending)
        else:
            self._schedule_plain(pending)

    def _ready_nodes(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if not n.cordoned]

    def _account(self, r: Req) -> Account:
        """The controller's account of a request, from the simulator's bookkeeping (same e, p, restarts,
        overheads and current run; allocating and migrating count as pending, as they do in the cluster)."""
        key = (r.version, r.state, r.since, r.preemptions, r.starts)
        cached = self._account_cache.get(r.spec.request_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        account = self._new_account(r)
        self._account_cache[r.spec.request_id] = (key, account)
        return account

    @staticmethod
    def _new_account(r: Req) -> Account:
        running = r.state is State.RUNNING
        return Account(
            e=r.e,
            p=r.p,
            state=RequestState.RUNNING if running else RequestState.PENDING,
            since=r.since,
            admitted=r.spec.arrival,
            class_name=r.spec.class_name,
            preemptions=r.preemptions,
            overhead=r.overhead,
            starts=r.starts,
            run_started=r.run_started if running else None,
        )

    def _schedule_qos(self, pending: list[Req]) -> None:
        """Paper 002 Algorithm 1, one pass: the live QoS controller's own pure pass (``controller.decide``),
        fed the world the controller would see, its effects applied as the cluster would apply them.

        Every pending request is gated (the admission webhook gates every qos-scheduler pod); the placed
        ones, allocating included, are the preemption candidates. Victims are evicted first, then each
        release is bound to its pinned host; a pod released for priority preemption goes to kube-scheduler's
        priority preemption (``_priority_place``). No gate timeout: the simulator never loses a decision.
        """
        ready = self._ready_nodes()
        nodes = [self._core_node(n) for n in ready]
        running = {key: rid for n in ready for key, rid in n.pods.items()}
        accounts = {rid: self._account(self.reqs[rid]) for rid in running.values()}
        gated = []
        groups: dict[NodeGroup, frozenset[str]] | None = None
        if self.policy == "product" and self.prod.enforce_node_groups:
            # the extender's filter (node groups enforced): the controller only considers the pod's group
            groups = {g: frozenset(n.name for n in ready if n.group is g) for g in NodeGroup}
        for r in pending:
            rid = r.spec.request_id
            accounts[rid] = self._account(r)
            pod = self._pod(r)
            eligible = groups[autoscale_scan.group_of(pod)] if groups is not None else None
            gated.append(decide.GatedPod(pod, rid, gated_since=r.since, eligible_nodes=eligible))
        world = decide.World(nodes, running, gated, accounts, self.now)
        decision = decide.decide(world, self.qpol, self._decide_settings, self.rng)
        for ev in decision.evictions:
            victim = self.reqs[ev.victim_request]
            self._unplace(victim, lose_work=False)
            victim.preemptions += 1
            self.c.preemptions += 1
        for rel in decision.releases:
            r = self.reqs[rel.request]
            if rel.node is not None:
                self._place(r, self.nodes[rel.node])
            elif rel.priority:
                self._priority_place(r)
            elif rel.timeout or not self._decide_settings.pin:
                self._extender_place(r)

    def _extender_place(self, r: Req) -> None:
        """An unpinned release: kube-scheduler's qos-scheduler profile, whose only scores are the extender's
        (filter: the pod's node group and room; prioritize: ``packing.score_nodes``), ties at random."""
        pod = self._pod(r)
        group = autoscale_scan.group_of(pod)
        cands = [
            self._core_node(n) for n in self._ready_nodes() if not self.prod.enforce_node_groups or n.group is group
        ]
        cands = [n for n in cands if packing.fits(n, pod)]
        if not cands:
            return
        scores = packing.score_nodes(self.prod.profile, cands, pod, self.now, self.prod.scaling_cycle_seconds)
        top = max(scores.values())
        self._place(r, self.nodes[self.rng.choice(sorted(n for n, v in scores.items() if v == top))])

    def _schedule_priority(self, pending: list[Req]) -> None:
        """Kubernetes' priority preemption (paper 002 §4.1.2), one pass: priority order, each pod placed where
        it fits after preempting strictly lower priorities."""
        for p in qos.priority_queue_order(self._pod(r) for r in pending):
            self._priority_place(self.reqs[p.request_id])

    def _priority_place(self, r: Req) -> bool:
        """kube-scheduler with PriorityClasses: the feasible hosts after preempting strictly lower-priority pods,
        ranked by its default scores; the victims restart later without losing progress."""
        pod = self._pod(r)
        options = [qos.priority_feasibility(pod, self._core_node(n), self.qpol) for n in self._ready_nodes()]
        feasible = [o for o in options if o.feasible]
        if not feasible:
            return False
        scores = {o.node: packing.k8s_default_score(self._core_node(self.nodes[o.node]), pod) for o in feasible}
        best = qos.rank_hosts(feasible, scores)
        if best is None:
            return False
        for key in best.victims:
            victim = self.reqs[self.nodes[best.node].pods[key]]
            self._unplace(victim, lose_work=False)
            victim.preemptions += 1
            self.c.preemptions += 1
        self._place(r, self.nodes[best.node])
        return True

    @staticmethod
    def _room(nodes: Iterable[Node]) -> tuple[int, int]:
        """The largest free cpu and the largest free memory over ``nodes`` (not necessarily on one node): a pod
        asking for more of either fits none of them. Placements only shrink free space, so the bound stays
        valid for a whole pass; it spares the per-node checks of the pods a full cluster cannot take."""
        cpu = mem = -1
        for n in nodes:
            free = n.free
            if free.pods > 0:
                cpu = max(cpu, free.cpu_milli)
                mem = max(mem, free.memory_bytes)
        return cpu, mem

    def _schedule_plain(self, pending: list[Req]) -> None:
        """No preemption (all pods share one priority): k8s scores, or HTAS's BFD / time-bin BFD."""
        if self.policy == "htas":
            pods = packing.bfd_sort(self._pod(r) for r in pending)
        else:
            pods = sorted((self._pod(r) for r in pending), key=lambda p: (self.reqs[p.request_id].spec.arrival, p.key))
        room = {
            g: self._room(self._core_node(n) for n in self._ready_nodes() if self.policy != "htas" or n.group is g)
            for g in NodeGroup
        }
        table: _K8sTable | None = None
        for pod in pods:
            cpu, mem = room[autoscale_scan.group_of(pod)]
            if pod.requests.cpu_milli > cpu or pod.requests.memory_bytes > mem:
                continue  # fits no node (exact: the check every node would fail)
            r = self.reqs[pod.request_id]
            if self.policy == "htas":
                group = NodeGroup.BATCH if pod.kind is WorkloadKind.BATCH else NodeGroup.SERVICE
                cands = [self._core_node(n) for n in self._ready_nodes() if n.group is group]
                if pod.kind is WorkloadKind.BATCH:
                    chosen = packing.time_bin_bfd_choose(cands, pod, self.now, self.cfg.autoscale_cycle)
                else:
                    chosen = packing.bfd_choose(cands, pod)
                target = chosen.name if chosen is not None else None
            elif pod.requests.extended or not _VECTORISED_K8S:
                feasible = [self._core_node(n) for n in self._ready_nodes()]
                feasible = [n for n in feasible if packing.fits(n, pod)]
                if not feasible:
                    continue
                scored = [(packing.k8s_default_score(n, pod), n.name) for n in feasible]
                top = max(s for s, _ in scored)
                target = self.rng.choice(sorted(name for s, name in scored if s == top))
                table = None  # the placement changes a node: rebuilt from the nodes when next needed
            else:
                if table is None:
                    table = _K8sTable([self._core_node(n) for n in self._ready_nodes()])
                target = table.choose(pod, self.rng)
            if target is not None:
                self._place(r, self.nodes[target])
                if table is not None:
                    table.placed(target, pod)

    # ---- autoscaling ---------------------------------------------------------------------------------

    def _lag(self) -> float:
        return self.rng.uniform(self.cfg.lag_min, self.cfg.lag_max)

    def _provision(self, flavour: Flavour, group: NodeGroup, pods: Iterable[str]) -> None:
        name = self._new_name(flavour.name)
        ready = self.now + self._lag()
        node = SimNode(name, flavour.capacity, group, flavour.name, flavour.price_per_hour, self.now, ready)
        node.owned = True
        self.provisioning[name] = node
        self._provisioning_changed = True
        entry = autoscale.Provisioning(name, flavour, self.now, tuple(pods))
        if self.policy in ("htas", "product"):
            self.scan_state.provisioned(group, entry)
        else:
            self.ca_ledger = self.ca_ledger.add(entry)
        self.c.nodes_added += 1
        self.last_scale_up = self.now
        self.push(ready, "node_ready", name)
        self._snapshot_timeline()

    def _on_node_ready(self, name: object) -> None:
        node = self.provisioning.pop(str(name))
        self._provisioning_changed = True
        self.nodes[node.name] = node
        self._touch(node.name)
        self.lag_samples = [*self.lag_samples, self.now - node.requested_at][-self.prod.lag_window :]
        self.scan_state.arrived(node.name)
        self.ca_ledger = self.ca_ledger.arrived(node.name)
        self.request_schedule()

    def _unschedulable(self) -> list[Pod]:
        """Pending pods no ready node can take now: what a real autoscaler sees as unschedulable."""
        nodes = [self._core_node(n) for n in self._ready_nodes()]
        cpu, mem = self._room(nodes)
        pods = [self._pod(r) for r in self._pending()]
        out: list[Pod] = []
        table: _K8sTable | None = None
        for pod in pods:
            if pod.requests.cpu_milli > cpu or pod.requests.memory_bytes > mem:
                out.append(pod)
            elif pod.requests.extended or not _VECTORISED_K8S:
                if not any(packing.fits(n, pod) for n in nodes):
                    out.append(pod)
            else:
                table = table or _K8sTable(nodes)
                if not table.fits(pod).any():
                    out.append(pod)
        return out

    def _on_autoscale(self, _: object) -> None:
        if self.policy == "k8s":
            self._ca_scale_up()
            self.push(self.now + self.cfg.ca_scan_interval, "autoscale")
        elif self.policy == "htas":
            self._htas_scan()
            self.push(self.now + self.cfg.service_scale_interval, "autoscale")
        elif self.policy == "product":
            self._product_scan()
            self.push(self.now + self.prod.scan_interval_seconds, "autoscale")

    def _ca_scale_up(self) -> None:
        """cluster-autoscaler: one homogeneous group; binpacking estimator adds all needed nodes at once;
        pods that fit on upcoming nodes are not counted again (CA simulates upcoming nodes)."""
        flavour = self.w.flavour(self.cfg.ca_flavour)
        pods = self.ca_ledger.uncovered(self._unschedulable())
        if not pods:
            return
        plan = autoscale.plan_pods(pods, [flavour], self.cfg.weights)
        for f, keys in plan.nodes:
            self._provision(f, NodeGroup.SERVICE, keys)

    def _htas_scan(self) -> None:
        """HTAS: the autoscaler sidecar's scan (``core.autoscale_scan.scan``, the step ``AutoscalerLoop.step``
        runs in the cluster) on the simulator's state, at the sidecar's scan interval; its purchases are
        provisioned, its idle nodes removed, and its consolidation plans executed by migration (what the
        consolidation flow does with the sidecar's hand-off: checkpoint, transfer, restore; no progress lost)."""
        nodes = [self._core_node(n) for n in self.nodes.values()]
        pending = [self._pod(r) for r in self._pending()]
        result = autoscale_scan.scan(self.scan_state, self._scan_settings, nodes, pending, self.now)
        for p in result.purchases:
            self._provision(p.flavour, p.group, p.pods)
        for name, _since in result.idle:
            self._remove_node(self.nodes[name])
        for plan in result.consolidation_plans:
            self._migrate(plan)

    def _ca_scale_down(self) -> None:
        """cluster-autoscaler scale-down: utilisation < threshold for the unneeded time, not within the
        delay after a scale-up, and every pod fits elsewhere; pods are evicted (batch progress is lost)."""
        if self.now - self.last_scale_up < self.cfg.ca_delay_after_add:
            self.ca_unneeded.clear()
            return
        for node in list(self.nodes.values()):
            if self._core_node(node).utilization() < self.cfg.ca_threshold:
                self.ca_unneeded.setdefault(node.name, self.now)
            else:
                self.ca_unneeded.pop(node.name, None)
        removed_nonempty = False
        for name, since in sorted(self.ca_unneeded.items(), key=lambda kv: kv[1]):
            candidate = self.nodes.get(name)
            if candidate is None or self.now - since < self.cfg.ca_unneeded_seconds:
                continue
            if candidate.pods:
                if removed_nonempty:
                    continue  # CA drains one non-empty node per loop
                others = [self._core_node(n) for n in self._ready_nodes() if n.name != name]
                pods = [self._pod(self.reqs[rid]) for rid in candidate.pods.values()]
                _placed, unplaced = packing.pack(pods, others, self.now, self.cfg.autoscale_cycle, "least-allocated")
                if unplaced:
                    continue
                for rid in list(candidate.pods.values()):
                    self._unplace(self.reqs[rid], lose_work=True)
                    self.c.evictions += 1
                removed_nonempty = True
            self.ca_unneeded.pop(name, None)
            self._remove_node(candidate)
        self.request_schedule()

    def _consolidation_flow(self) -> None:
        """The consolidation flow's completion check: a cordoned node whose pods all moved is deleted; one whose
        plan could not complete is uncordoned and left alone."""
        for node in list(self.nodes.values()):
            if node.cordoned and not node.pods:
                self._remove_node(node)
            elif node.cordoned:
                node.cordoned = False
                self._touch(node.name)

    def _migrate(self, plan: reschedule.MigrationPlan) -> None:
        source = self.nodes[plan.source]
        source.cordoned = True
        self._touch(source.name)
        for key, dest in plan.moves:
            r = self.reqs[source.pods[key]]
            if r.state is not State.RUNNING:
                continue
            self._migrate_one(r, source, dest)

    def _migrate_one(self, r: Req, source: SimNode, dest: str) -> None:
        """Checkpoint, transfer and restore one running pod: not running for checkpoint + image / bandwidth, its
        progress kept; the destination holds the space during the transfer."""
        key = f"default/{r.spec.request_id}"
        assert source.pods.get(key) == r.spec.request_id
        seconds = self.cfg.checkpoint_seconds + r.spec.image_bytes / self.cfg.bandwidth_bytes_per_s
        self._unplace(r, lose_work=False)
        r.state = State.MIGRATING
        self._pending_ids.pop(r.spec.request_id, None)
        r.version += 1
        target = self.nodes[dest]
        target.pods[key] = r.spec.request_id
        r.node = dest
        self._touch(dest)
        self.c.migrations += 1
        self.push(self.now + seconds, "migrated", (r.spec.request_id, r.version))

    def _on_migrated(self, payload: object) -> None:
        self._run(payload, State.MIGRATING)
        rid, _version = cast(tuple[str, int], payload)
        if self.flow_waiting == rid:
            self.flow_waiting = None
            self._flow_next()

    # ---- product: the autoscaler sidecar and the consolidation flow as config/ ships them -----------------

    def _product_scan(self) -> None:
        """The sidecar's step (``AutoscalerLoop.step`` around ``core.autoscale_scan.scan``) with the shipped
        settings: a gated pod is demand once held ``gated_demand_seconds``; the limits are the scan's budget
        (``max_nodes_per_cycle``) and its cap (``max_nodes`` minus ours and those being provisioned); only nodes we
        provisioned are deleted when idle (``scale_down_provisioned_only``); the hand-off goes to the
        consolidation flow (``_flow_start``), which empties one node at a time."""
        p = self.prod
        for entry in self.scan_state.expire(self.now, p.provisioning_timeout_seconds):
            self.provisioning.pop(entry.node_name, None)  # never happens with lag_max < the timeout
            self._provisioning_changed = True
        nodes = [self._core_node(n) for n in self.nodes.values()]
        waiting = self._pending()
        demand = [self._pod(r) for r in waiting if self.now - r.since >= p.gated_demand_seconds]
        batch_pending = any(r.spec.kind is WorkloadKind.BATCH for r in waiting)
        owned = sum(1 for n in self.nodes.values() if n.owned)
        cap = p.max_nodes - len(self.scan_state.provisioning) - owned  # the sidecar's two limits, as it passes them
        leaving = frozenset({self.flow_source} if self.flow_source else ())
        result = autoscale_scan.scan(
            self.scan_state,
            self._scan_settings,
            nodes,
            demand,
            self.now,
            batch_pending=batch_pending,
            budget=p.max_nodes_per_cycle,
            cap=max(0, cap),
            leaving=leaving,
            waited={self._pod(r).key: self.now - r.since for r in waiting},
            lag_seconds=autoscale.measured_lag(
                self.lag_samples, p.lag_default_seconds, window=p.lag_window, quantile=p.lag_quantile
            ),
            plan_without_budget=not _SKIP_UNBUYABLE_PLANS,
            retirable=frozenset(n.name for n in self.nodes.values() if n.owned) - leaving,
        )
        for purchase in result.purchases:
            self._provision(purchase.flavour, purchase.group, purchase.pods)
        for name in result.retire:  # cordoned to drain by attrition: the slot goes to a larger node
            self.nodes[name].cordoned = True
            self._touch(name)
        for name in result.unretire:
            if name in self.nodes:
                self.nodes[name].cordoned = False
                self._touch(name)
                self.request_schedule()
        for name, _since in result.idle:
            node = self.nodes[name]
            if name in leaving or (p.scale_down_provisioned_only and not node.owned):
                continue
            self._remove_node(node)
        if not p.consolidation or self.flow_source is not None:
            return
        owned_names = (
            frozenset(n.name for n in self.nodes.values() if n.owned) if p.consolidation_provisioned_only else None
        )
        plan = reschedule.select_plan(
            result.consolidation_plans,
            result.consolidation_candidates,
            left_alone=self.left_alone,
            owned=owned_names,
            now=self.now,
        )
        if plan is not None:
            self._flow_start(plan)

    def _flow_start(self, plan: reschedule.MigrationPlan) -> None:
        """The consolidation flow on one node: cordon it, then move its pods one after another (each move is
        checkpoint + transfer + restore; the next starts when it has ended), delete the emptied node."""
        source = self.nodes[plan.source]
        source.cordoned = True
        self._touch(source.name)
        self.flow_source = source.name
        self.flow_moves = list(plan.moves)
        self._flow_next()

    def _flow_abort(self) -> None:
        """A move that cannot go ahead: uncordon, leave the node alone for ``left_alone_seconds``."""
        assert self.flow_source is not None
        node = self.nodes[self.flow_source]
        node.cordoned = False
        self._touch(node.name)
        self.left_alone[node.name] = self.now + self.prod.left_alone_seconds
        self.flow_source, self.flow_moves = None, []
        self.request_schedule()

    def _flow_next(self) -> None:
        assert self.flow_source is not None
        source = self.nodes[self.flow_source]
        while self.flow_moves:
            key, dest = self.flow_moves.pop(0)
            rid = source.pods.get(key)
            if rid is None:
                continue  # finished meanwhile: nothing to move
            r = self.reqs[rid]
            target = self.nodes.get(dest)
            if (
                r.state is not State.RUNNING
                or target is None
                or target.cordoned
                or not packing.fits(self._core_node(target), self._pod(r))
            ):
                self._flow_abort()
                return
            self._migrate_one(r, source, dest)
            self.flow_waiting = rid
            return
        if source.pods:
            self._flow_abort()
            return
        self.flow_source = None
        self._remove_node(source)

    # ---- results -------------------------------------------------------------------------------------

    def _result(self, end: float, wall: float) -> SimResult:
        nodes = [*self.retired, *self.nodes.values()]
        cost = 0.0
        node_seconds = 0.0
        for n in nodes:
            alive = (n.deleted_at if n.deleted_at is not None else end) - n.requested_at
            node_seconds += alive
            cost += math.ceil(alive / 60.0 - 1e-9) * n.price_per_hour / 60.0  # per-minute billing, rounded up
        for n in self.provisioning.values():  # ordered but never arrived: still billed
            alive = end - n.requested_at
            node_seconds += alive
            cost += math.ceil(alive / 60.0 - 1e-9) * n.price_per_hour / 60.0
        live = self.node_seconds_live or 1.0
        return SimResult(
            policy=self.policy,
            end=end,
            reqs=list(self.reqs.values()),
            classes=self.w.classes,
            cost_usd=cost,
            fluid_usd=self.fluid_usd,
            cost_terms=self.cost_terms,
            node_seconds=node_seconds,
            counters=self.c,
            util_cpu=self.util_cpu / live,
            util_mem=self.util_mem / live,
            wall_seconds=wall,
            timeline=self.timeline,
        )


@dataclass
class SimResult:
    policy: str
    end: float
    reqs: list[Req]
    classes: object
    cost_usd: float
    fluid_usd: float
    cost_terms: CostTerms
    node_seconds: float
    counters: Counters
    util_cpu: float
    util_mem: float
    wall_seconds: float
    timeline: list[tuple[float, dict[str, int], float]]


# k8s scores every pending pod on every node with ``packing.k8s_default_scores`` over a table of the pass's
# nodes; False scores node by node with ``packing.k8s_default_score`` (the reference that
# tests/test_sim_fast_paths.py compares it with).
_VECTORISED_K8S = True
# product: at max_nodes the sidecar's scan skips the plans nothing can be bought for (the run reads only the
# purchases); False computes them (the reference: tests/test_sim_fast_paths.py).
_SKIP_UNBUYABLE_PLANS = True


def _non_zero_pair(requests: Resources) -> tuple[int, int]:
    """kube-scheduler's non-zero request defaults (as ``packing.k8s_default_score`` applies them)."""
    cpu = requests.cpu_milli if requests.cpu_milli != 0 else packing.DEFAULT_MILLI_CPU_REQUEST
    mem = requests.memory_bytes if requests.memory_bytes != 0 else packing.DEFAULT_MEMORY_REQUEST
    return cpu, mem


class _K8sTable:
    """The nodes of one k8s pass as numpy columns (allocatable, requested, non-zero requested, pod count), so a
    pending pod is fitted and scored on all of them at once; a placement updates its node's column exactly as
    rebuilding the node would. Ties are broken as the per-node loop breaks them (``rng.choice`` over the
    sorted names of the top score)."""

    def __init__(self, nodes: list[Node]) -> None:
        self.names = [n.name for n in nodes]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.alloc = np.array([[n.allocatable.cpu_milli for n in nodes], [n.allocatable.memory_bytes for n in nodes]])
        self.alloc = self.alloc.reshape(2, len(nodes)).astype(np.int64)
        self.requested = np.array([[n.requested.cpu_milli for n in nodes], [n.requested.memory_bytes for n in nodes]])
        self.requested = self.requested.reshape(2, len(nodes)).astype(np.int64)
        nz = [[0, 0] for _ in nodes]
        for row, n in zip(nz, nodes, strict=True):
            for p in n.pods:
                c, m = _non_zero_pair(p.requests)
                row[0] += c
                row[1] += m
        self.non_zero = np.array(nz, dtype=np.int64).reshape(len(nodes), 2).T.copy()
        self.slots = np.array([n.allocatable.pods - len(n.pods) for n in nodes], dtype=np.int64)
        self.schedulable = np.array([not n.unschedulable for n in nodes], dtype=bool)

    def fits(self, pod: Pod) -> npt.NDArray[np.bool_]:
        """``packing.fits`` on every node (cpu, memory, a pod slot, schedulable; no extended resources)."""
        req = pod.requests
        free = self.alloc - self.requested
        fits: npt.NDArray[np.bool_] = (
            self.schedulable & (self.slots >= 1) & (req.cpu_milli <= free[0]) & (req.memory_bytes <= free[1])
        )
        return fits

    def choose(self, pod: Pod, rng: random.Random) -> str | None:
        idx = np.flatnonzero(self.fits(pod))
        if idx.size == 0:
            return None
        scores = packing.k8s_default_scores(self.alloc[:, idx], self.non_zero[:, idx], self.requested[:, idx], pod)
        top = scores.max()
        best: list[str] = sorted(self.names[i] for i in idx[scores == top].tolist())
        return rng.choice(best)

    def placed(self, name: str, pod: Pod) -> None:
        i = self.index[name]
        self.requested[0, i] += pod.requests.cpu_milli
        self.requested[1, i] += pod.requests.memory_bytes
        c, m = _non_zero_pair(pod.requests)
        self.non_zero[0, i] += c
        self.non_zero[1, i] += m
        self.slots[i] -= 1


def simulate(workload: Workload, policy: str, config: SimConfig | None = None) -> SimResult:
    return Simulator(workload, policy, config).run()


ProgressHook = Callable[[str], None]
