"""Batch on the slack of long-running services: available resources (paper 004 Eq. 2 and 4), the LRP score
and choice (Alg. 1, weights cpu 0.38 / memory 0.62), and the reclaimable capacity a node publishes.

Why a module of its own: the same three numbers must drive the filter verb, the score verb and what the
controller publishes as extended resources, or a batch pod would be admitted on a prediction the score never
saw. The per-service prediction ``I_i`` (Eq. 3) comes from :mod:`extender.core.characterise`; here it is only
summed.

Amounts are signed integers (millicores, bytes): Eq. 3 may predict a negative idle amount (a service using
more than it requested) and Eq. 2 is negative on an over-committed node; both are information, so nothing is
clamped until something must be published to the API server (extended resources cannot be negative).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from extender.core.characterise import (
    RESOURCES,
    OwnLevel,
    ServiceProfile,
    WorkloadModel,
    idle_resources,
    own_offset,
    own_spread,
)
from extender.core.model import InvalidInputError, Node, NodeGroup, Resources, WorkloadKind
from extender.core.packing import to_extender_scores
from extender.core.qos import time_to_violate

__all__ = [
    "BATCH_CPU",
    "BATCH_MEMORY",
    "BATCH_RESOURCES",
    "LRP_WEIGHTS",
    "MAX_LRP_SCORE",
    "Amount",
    "BatchTenant",
    "available",
    "available_for_batch",
    "batch_capacity",
    "choose_evictions",
    "colocated_scores",
    "colocation_shortfall",
    "eviction_order",
    "fits",
    "lendable",
    "lendable_after_miss",
    "lrp_choose",
    "lrp_score",
    "measured_idle",
    "node_available",
    "node_available_for_batch",
    "node_groups_for",
    "pooled_margin",
    "prediction_misses",
    "real_slack",
    "reclaimable",
    "service_idle",
    "service_spread",
    "slack_demand",
    "usage_stale",
    "with_batch_resources",
]

# Paper 004 §V: "the weights of CPU and memory are configured as 0.38 and 0.62 respectively during the
# evaluation process of scheduling and autoscaling" (from the Alibaba trace's average cluster utilisation).
LRP_WEIGHTS = (0.38, 0.62)
# The extended resources a node's predicted reclaimable capacity is published as (colocation.controller writes them
# into the node's status, webhook.colocate moves an opted-in batch pod's cpu/memory requests onto them):
# millicores and bytes, so one unit of batch-cpu is one millicore.
BATCH_CPU = "qos.kube-qos-extender.io/batch-cpu"
BATCH_MEMORY = "qos.kube-qos-extender.io/batch-memory"
BATCH_RESOURCES = (BATCH_CPU, BATCH_MEMORY)
# kube-scheduler's framework.MaxNodeScore: the score is on the same 0..100 scale as packing.py's scores.
MAX_LRP_SCORE = 100


@dataclass(frozen=True, slots=True)
class Amount:
    """A signed (cpu millicores, memory bytes) pair: an availability or an idle prediction."""

    cpu_milli: int = 0
    memory_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("cpu_milli", "memory_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidInputError(f"{name} must be an integer, got {v!r}")

    def __add__(self, other: Amount) -> Amount:
        return Amount(self.cpu_milli + other.cpu_milli, self.memory_bytes + other.memory_bytes)

    @staticmethod
    def total(items: Iterable[Amount]) -> Amount:
        cpu = mem = 0
        for a in items:
            cpu += a.cpu_milli
            mem += a.memory_bytes
        return Amount(cpu, mem)


def available(capacity: Resources, requests: Iterable[Resources]) -> Amount:
    """Eq. 2 of paper 004: ``A_v = C_v - sum_{ak_i in S_v} R_i``, what a node has left by requests.

    ``C_v`` is the node's allocatable (what the kubelet admits against), ``R_i`` every active pod's request.
    Long-running services are filtered on this (§IV-A 1).
    """
    used = Resources.total(requests)
    return Amount(capacity.cpu_milli - used.cpu_milli, capacity.memory_bytes - used.memory_bytes)


def available_for_batch(capacity: Resources, requests: Iterable[Resources], idle: Iterable[Amount]) -> Amount:
    """Eq. 4 of paper 004: ``A'_v = A_v + sum_{L_i in L_v} I_i``: a batch pod may also use the idle
    resources predicted (Eq. 3) for the long-running services ``L_v`` on the node.

    ``idle`` holds one prediction per service that has one; a service not yet given a class contributes
    nothing (no prediction, no lending).
    """
    return available(capacity, requests) + Amount.total(idle)


def reclaimable(idle: Iterable[Amount]) -> Amount:
    """What a node publishes as batch capacity: ``sum I_i`` (the slack term of Eq. 4), floored at 0.

    Why not ``A'_v``: batch pods that request the published extended resources do not request cpu/memory, so
    the ``A_v`` part stays with ordinary pods; publishing it again would hand the same millicores out twice.
    The floor: an extended resource cannot be negative, and a negative sum means there is nothing to lend.
    """
    total = Amount.total(idle)
    return Amount(max(0, total.cpu_milli), max(0, total.memory_bytes))


def node_available(node: Node) -> Amount:
    """Eq. 2 for a core ``Node`` (allocatable minus the requests of the pods on it)."""
    return available(node.allocatable, (p.requests for p in node.pods))


def node_available_for_batch(node: Node, idle_by_pod: Mapping[str, Amount]) -> Amount:
    """Eq. 4 for a core ``Node``: the idle predictions of its *service* pods (by pod key) added to Eq. 2.

    A prediction for a pod that is not a service on this node is ignored: batch pods lend nothing (the paper
    limits characterisation to long-running services) and predictions for pods elsewhere are not this node's.
    """
    idle = (idle_by_pod[p.key] for p in node.pods if p.kind is WorkloadKind.SERVICE and p.key in idle_by_pod)
    return available_for_batch(node.allocatable, (p.requests for p in node.pods), idle)


def fits(avail: Amount, demand: Resources) -> bool:
    """The filter of §IV-A 1: a pod fits where at least its demand ``D_i`` is available, per resource."""
    return demand.cpu_milli <= avail.cpu_milli and demand.memory_bytes <= avail.memory_bytes


def _check_weights(weights: tuple[float, float]) -> None:
    if len(weights) != 2 or any(
        isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0 for w in weights
    ):
        raise InvalidInputError(f"weights must be two finite numbers >= 0, got {weights!r}")
    if sum(weights) <= 0:
        raise InvalidInputError(f"weights must not all be 0, got {weights!r}")


def lrp_score(capacity: Resources, avail: Amount, demand: Resources, weights: tuple[float, float] = LRP_WEIGHTS) -> int:
    """Least Requested Priority on the predicted availability (paper 004 Alg. 1), 0..100, higher = emptier.

    Alg. 1 selects the node with the lowest utilisation; utilisation here is what would be left after the
    pod is placed, as a fraction of the node's capacity, per resource clamped to [0, 1], weighted cpu 0.38 /
    memory 0.62 and normalised by the weights' sum:
    ``floor(100 * (w_cpu * left_cpu / C_cpu + w_mem * left_mem / C_mem) / (w_cpu + w_mem))``.
    A resource with zero capacity is left out (as kube-scheduler does). Filter with :func:`fits` first: a
    node the pod does not fit scores 0 on the resource it lacks, not a refusal.
    """
    _check_weights(weights)
    total = weight_sum = 0.0
    for w, left, cap in (
        (weights[0], avail.cpu_milli - demand.cpu_milli, capacity.cpu_milli),
        (weights[1], avail.memory_bytes - demand.memory_bytes, capacity.memory_bytes),
    ):
        if cap <= 0:
            continue
        total += w * min(1.0, max(0.0, left / cap))
        weight_sum += w
    if weight_sum == 0:
        return 0
    return math.floor(MAX_LRP_SCORE * total / weight_sum)


def lrp_choose(
    candidates: Sequence[tuple[str, Resources, Amount]],
    demand: Resources,
    weights: tuple[float, float] = LRP_WEIGHTS,
) -> str | None:
    """Alg. 1 of paper 004: among ``(node name, capacity, available)`` where the pod fits, the node with the
    highest :func:`lrp_score` (lowest utilisation); a tie keeps the earlier candidate; None when none fits
    (which is when the paper hands the pod to autoscaling)."""
    best: tuple[int, str] | None = None
    for name, capacity, avail in candidates:
        if not fits(avail, demand):
            continue
        score = lrp_score(capacity, avail, demand, weights)
        if best is None or score > best[0]:
            best = (score, name)
    return None if best is None else best[1]


def service_idle(
    model: WorkloadModel,
    classes: Mapping[str, int],
    request: Resources,
    at: float,
    horizon_seconds: float,
    profile: ServiceProfile | None = None,
    own: OwnLevel | None = None,
) -> Amount:
    """Eq. 3 for one service pod of a fitted model: ``I_i`` per resource from the classes it was given
    (``{"cpu": i, "memory": j}``, :func:`extender.core.characterise.assign_class`), for ``[at, at + horizon)``.

    With ``own`` and the service's ``profile`` (issue 33) the class peak is corrected per resource by the
    service's own recent residuals against its centre (:func:`extender.core.characterise.own_offset`): the
    class gives the shape of the day, the service its level and its margin. Without either, Eq. 3 as the
    paper has it.
    """
    for r in RESOURCES:
        if r not in classes:
            raise InvalidInputError(f"no {r} class given (got {dict(classes)})")
        n = model.centres(r).shape[0]
        if not 0 <= classes[r] < n:
            raise InvalidInputError(f"{r} class {classes[r]} does not exist (the model has {n})")
    out: list[int] = []
    for r, amount in (("cpu", request.cpu_milli), ("memory", request.memory_bytes)):
        centre = model.centres(r)[classes[r]]
        offset = None
        if own is not None and profile is not None:
            offset = own_offset(centre, profile.of(r), at, own, model.interval_seconds)
        out.append(idle_resources(amount, centre, at, horizon_seconds, model.interval_seconds, offset or 0.0))
    return Amount(out[0], out[1])


def service_spread(
    model: WorkloadModel,
    classes: Mapping[str, int],
    request: Resources,
    at: float,
    profile: ServiceProfile | None,
    own: OwnLevel,
) -> Amount:
    """How far one service's usage strays from its predicted level, in its request's units: the standard
    deviation of its recent residuals against its class centre (:func:`extender.core.characterise.own_spread`)
    times its request, rounded up; 0 for a resource without two observed intervals in the window (or no
    profile: nothing to estimate from)."""
    out: list[int] = []
    for r, amount in (("cpu", request.cpu_milli), ("memory", request.memory_bytes)):
        sd = None
        if profile is not None:
            sd = own_spread(model.centres(r)[classes[r]], profile.of(r), at, own, model.interval_seconds)
        out.append(math.ceil(amount * sd) if sd is not None else 0)
    return Amount(out[0], out[1])


def pooled_margin(spreads: Iterable[Amount], sigmas: float) -> Amount:
    """What a node holds back of its services' predicted idle: ``sigmas`` standard deviations of their summed
    usage, taking their deviations as independent: ``sigmas * sqrt(sum sd_i^2)`` per resource, rounded up.

    Why pooled: batch pods are evicted when the node's real slack (the *sum* over its services) falls short,
    and independent deviations partly cancel in a sum (n alike services: sqrt(n) sd, not n sd), so the same
    risk needs less held back on the sum than on each service."""
    if isinstance(sigmas, bool) or not isinstance(sigmas, (int, float)) or not math.isfinite(sigmas) or sigmas < 0:
        raise InvalidInputError(f"sigmas must be a finite number >= 0, got {sigmas!r}")
    cpu = mem = 0
    for a in spreads:
        if a.cpu_milli < 0 or a.memory_bytes < 0:
            raise InvalidInputError(f"a spread cannot be negative, got {a}")
        cpu += a.cpu_milli**2
        mem += a.memory_bytes**2
    return Amount(math.ceil(sigmas * math.sqrt(cpu)), math.ceil(sigmas * math.sqrt(mem)))


def batch_capacity(
    nodes: Sequence[Node],
    idle_by_pod: Mapping[str, Amount],
    spread_by_pod: Mapping[str, Amount] | None = None,
    sigmas: float = 0.0,
) -> dict[str, Amount]:
    """Per node, what it publishes as batch capacity: :func:`reclaimable` over its *service* pods' predictions
    (by pod key), less the :func:`pooled_margin` of their spreads (``spread_by_pod``, for the pods with a
    prediction) when given, floored at 0. A node without a predicted service publishes 0: batch pods then fit
    nowhere on its slack."""
    out: dict[str, Amount] = {}
    spreads = spread_by_pod or {}
    for node in nodes:
        lent = [p.key for p in node.pods if p.kind is WorkloadKind.SERVICE and p.key in idle_by_pod]
        total = Amount.total(idle_by_pod[k] for k in lent)
        if spreads:
            m = pooled_margin((spreads[k] for k in lent if k in spreads), sigmas)
            total = Amount(total.cpu_milli - m.cpu_milli, total.memory_bytes - m.memory_bytes)
        out[node.name] = reclaimable((total,))
    return out


# --------------------------------------------------------------------------------------------------------
# safety: when a prediction was wrong (issue 16, deliverable 3)
# --------------------------------------------------------------------------------------------------------


def measured_idle(request: Resources, usage_cpu_milli: float, usage_memory_bytes: float) -> Amount:
    """What a service really leaves idle now: its request minus its measured usage, per resource (signed:
    a service above its request leaves a negative amount). Rounded down: a fraction of a millicore or byte
    of idle is not something to lend."""
    for name, v in (("usage_cpu_milli", usage_cpu_milli), ("usage_memory_bytes", usage_memory_bytes)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise InvalidInputError(f"{name} must be a finite number >= 0, got {v!r}")
    return Amount(
        math.floor(request.cpu_milli - usage_cpu_milli), math.floor(request.memory_bytes - usage_memory_bytes)
    )


def real_slack(predicted: Mapping[str, Amount], measured: Mapping[str, Amount]) -> Amount:
    """A node's slack as it really is now: the measured idle of its services (by pod key), summed.

    ``predicted`` names the services whose slack was lent (those with a class); a lent service without a
    measurement now (a missed scrape) counts as its prediction: no evidence of a miss is no reason to evict.
    A service without a prediction lent nothing and is left out, whatever it uses.
    """
    return Amount.total(measured.get(key, idle) for key, idle in predicted.items())


def prediction_misses(
    predicted: Mapping[str, Amount],
    measured: Mapping[str, Amount],
    requests: Mapping[str, Resources],
    tolerance: float = 0.05,
) -> tuple[str, ...]:
    """The services (sorted pod keys) that leave less idle than predicted by more than ``tolerance`` of their
    request on some resource: the prediction's errors, counted (metrics) whether or not a batch pod had to
    go. The tolerance keeps the jitter of a rate over a scrape window from counting as a miss."""
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
        raise InvalidInputError(f"tolerance must be a number in [0, 1), got {tolerance!r}")
    out: list[str] = []
    for key in sorted(predicted.keys() & measured.keys()):
        want, got = predicted[key], measured[key]
        req = requests.get(key, Resources())
        if (
            got.cpu_milli < want.cpu_milli - tolerance * req.cpu_milli
            or got.memory_bytes < want.memory_bytes - tolerance * req.memory_bytes
        ):
            out.append(key)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class BatchTenant:
    """A batch pod running on a node's lent slack: what it requested of the batch resources (``demand``),
    its class (``importance``: 1 = most important; ``slo``) and how long it has run (``running_seconds``)."""

    key: str
    demand: Amount
    importance: int
    slo: float
    running_seconds: float

    def __post_init__(self) -> None:
        if self.demand.cpu_milli < 0 or self.demand.memory_bytes < 0:
            raise InvalidInputError(f"batch pod {self.key}: negative demand {self.demand}")
        if not math.isfinite(self.running_seconds) or self.running_seconds < 0:
            raise InvalidInputError(f"batch pod {self.key}: running_seconds must be finite and >= 0")


def eviction_order(tenants: Iterable[BatchTenant]) -> list[BatchTenant]:
    """QoS order of who goes first (paper 002's rules, :mod:`extender.core.qos`): the least important class
    first; within a class, the one with the most time to violate its SLO (Eq. 3 ``V``, with the run so far as
    ``e``: the slack controller keeps no pending time, so p = 0), which an eviction harms least; then the key,
    so the order does not depend on the input's. Duplicate keys are refused (a pod counted twice)."""
    items = list(tenants)
    if len({t.key for t in items}) != len(items):
        raise InvalidInputError("a batch pod appears twice")
    return sorted(items, key=lambda t: (-t.importance, -time_to_violate(t.running_seconds, 0.0, t.slo), t.key))


def choose_evictions(slack: Amount, tenants: Sequence[BatchTenant]) -> tuple[str, ...]:
    """The batch pods (keys, in eviction order) to evict so that the rest fit in the node's real ``slack``
    (:func:`real_slack`); () when they all fit.

    As kube-scheduler's preemption does: take pods in :func:`eviction_order` until the rest fit, then reprieve
    from the most important victim down every one whose return still fits, so a small pod is not evicted for
    nothing after a large one made room. When even evicting all does not fit (negative slack), all go.
    """

    def fits_in(total: Amount) -> bool:
        return total.cpu_milli <= slack.cpu_milli and total.memory_bytes <= slack.memory_bytes

    left = Amount.total(t.demand for t in tenants)
    if fits_in(left):
        return ()
    victims: list[BatchTenant] = []
    for t in eviction_order(tenants):
        if fits_in(left):
            break
        victims.append(t)
        left = Amount(left.cpu_milli - t.demand.cpu_milli, left.memory_bytes - t.demand.memory_bytes)
    for t in reversed(list(victims)):
        back = left + t.demand
        if fits_in(back):
            victims.remove(t)
            left = back
    return tuple(t.key for t in victims)


def lendable_after_miss(predicted: Amount, real: Amount) -> Amount:
    """What a node publishes in the interval after its prediction was missed: no more than it really has
    idle now (floored at 0). Without this the scheduler would place the evicted pod's replacement on the
    same slack the next moment and it would be evicted again."""
    return Amount(
        max(0, min(predicted.cpu_milli, real.cpu_milli)), max(0, min(predicted.memory_bytes, real.memory_bytes))
    )


# --------------------------------------------------------------------------------------------------------
# the filter and score verbs on the published prediction (deliverable 3's last sentence)
# --------------------------------------------------------------------------------------------------------


def usage_stale(last_read_at: float, now: float, stale_seconds: float) -> bool:
    """Whether the usage was last read longer than ``stale_seconds`` ago: then the node must lend nothing.

    Why withdraw rather than keep the last published numbers: the safety check (evict what a wrong prediction
    left without room) needs current usage, so while Prometheus cannot be read a service can grow unnoticed
    under batch pods admitted on the old prediction. A short outage keeps the published slack (a refresh or two
    failing is no reason to stop lending); past the staleness nothing new is admitted onto the slack. Batch
    pods already running stay (the kubelet does not evict for a smaller extended resource).
    """
    for name, v in (("last_read_at", last_read_at), ("now", now), ("stale_seconds", stale_seconds)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise InvalidInputError(f"{name} must be a finite number, got {v!r}")
    if stale_seconds <= 0:
        raise InvalidInputError(f"stale_seconds must be > 0, got {stale_seconds!r}")
    return now - last_read_at > stale_seconds


def with_batch_resources(managed: Sequence[str]) -> tuple[str, ...]:
    """``managed`` plus the two batch resources: the extended resources the extender counts on nodes and pods.

    Why always: the batch resources are what the slack controller publishes, so they are the one place the
    verbs can read the prediction from (the same numbers kube-scheduler and the kubelet admit against). With
    slack off no node has them and no admitted pod requests them, so counting them changes nothing.
    """
    return (*managed, *(r for r in BATCH_RESOURCES if r not in managed))


def slack_demand(requests: Resources) -> Resources | None:
    """A co-located pod's demand on the slack as (cpu millicores, memory bytes): its batch-cpu and batch-memory
    requests; None for a pod that requests neither (an ordinary pod, filtered and scored by requests)."""
    cpu, mem = requests.ext(BATCH_CPU), requests.ext(BATCH_MEMORY)
    if cpu == 0 and mem == 0:
        return None
    return Resources(cpu, mem, requests.pods)


def node_groups_for(kind: WorkloadKind, requests: Resources) -> frozenset[NodeGroup]:
    """The node groups a pod may run in under ``node_groups.enforce``.

    Batch pods on batch nodes and services on service nodes, except a co-located batch pod (one requesting
    the batch resources): it runs on what services leave idle, so on service nodes by design, and on batch
    nodes if something publishes slack there. The batch resources restrict it to nodes with a prediction
    already; rejecting service nodes would make co-location impossible through the extender.
    """
    if kind is WorkloadKind.BATCH:
        if slack_demand(requests) is not None:
            return frozenset((NodeGroup.BATCH, NodeGroup.SERVICE))
        return frozenset((NodeGroup.BATCH,))
    return frozenset((NodeGroup.SERVICE,))


def lendable(allocatable: Resources, requested: Resources) -> Amount:
    """What is left of a node's published slack: its batch-cpu/batch-memory allocatable (the prediction
    ``sum I_i`` the controller wrote) minus what the co-located pods on it request of them."""
    return Amount(
        allocatable.ext(BATCH_CPU) - requested.ext(BATCH_CPU),
        allocatable.ext(BATCH_MEMORY) - requested.ext(BATCH_MEMORY),
    )


def colocation_shortfall(allocatable: Resources, requested: Resources, demand: Resources) -> str | None:
    """The filter verb for a co-located pod: None when ``demand`` fits in the slack left on the node
    (:func:`lendable`), else why not (human, names the resource and the numbers). Same rule as kube-scheduler's
    NodeResourcesFit on the extended resources, phrased in the prediction's terms."""
    left = lendable(allocatable, requested)
    short: list[str] = []
    if demand.cpu_milli > left.cpu_milli:
        short.append(
            f"predicted slack cpu {max(0, left.cpu_milli)}m left of {allocatable.ext(BATCH_CPU)}m, "
            f"pod needs {demand.cpu_milli}m"
        )
    if demand.memory_bytes > left.memory_bytes:
        short.append(
            f"predicted slack memory {max(0, left.memory_bytes)} B left of {allocatable.ext(BATCH_MEMORY)} B, "
            f"pod needs {demand.memory_bytes} B"
        )
    return "; ".join(short) if short else None


def colocated_scores(
    candidates: Iterable[tuple[str, Resources, Resources]],
    demand: Resources,
    weights: tuple[float, float] = LRP_WEIGHTS,
) -> dict[str, int]:
    """The score verb for a co-located pod: extender scores 0..10 by LRP (Alg. 1) over the predicted
    availability, for ``(node name, allocatable, requested)`` candidates.

    The availability is Eq. 4 with the published prediction: ``A'_v = A_v + lendable`` (free by requests
    plus the slack left), against the node's cpu/memory allocatable ``C_v``, so the node with the lowest
    *predicted* utilisation after placement scores highest. Only nodes the pod fits on (:func:`lendable`
    covers its demand) score; the rest get 0. LRP values become ranks (``packing.to_extender_scores``): the
    node :func:`lrp_choose` picks always gets 10, whatever the spread of the others.
    """
    raw: dict[str, float] = {}
    names: list[str] = []
    for name, alloc, requested in candidates:
        names.append(name)
        if colocation_shortfall(alloc, requested, demand) is not None:
            continue
        capacity = Resources(alloc.cpu_milli, alloc.memory_bytes, alloc.pods)
        free = Amount(alloc.cpu_milli - requested.cpu_milli, alloc.memory_bytes - requested.memory_bytes)
        raw[name] = float(lrp_score(capacity, free + lendable(alloc, requested), demand, weights))
    scores = dict.fromkeys(names, 0)
    scores.update(to_extender_scores(raw))
    return scores
