"""Cost-aware scale-up planning: which flavours to buy, for which pods, and when not to buy at all.

Everything here is a pure function of a snapshot: the sidecar and the simulator feed the same inputs and
must get the same plan, so there is no clock (``now`` is a parameter), no I/O and no randomness; every
tie is broken by price and then by name.

Sources (the seed papers under /work/shared/seeds):

* paper 000 (HTAS) §3.1.2 (3): the cost-efficiency score ``Score = nc / p`` with
  ``nc = w1 * cu + w2 * mu`` and w1 = w2 = 0.5; §5.2 Alg. 3 (GA, greedy autoscaling over the aggregate
  request volume) and Alg. 4 (batch group: deduct the 0-bin capacity first); Table 7 (flavours, prices).
* paper 004 (CTCL) Eq. 6 (the same nc with n weighted dimensions; cpu 0.38 / memory 0.62) and Alg. 3 (GA
  that binds the actual pending tasks, in descending order of demand, to each flavour it buys).
* paper 001 (HTA) Eq. 2 / Alg. 1: the shortage that matters is the one at the moment the new capacity
  arrives (now + acquisition lag), after the running jobs that finish before then have released theirs.
* paper 003 Alg. 5-7: the (binding) autoscaler remembers which pods a still-provisioning node was bought
  for and does not buy again for them; Alg. 7 also fits new pods into the room left on such nodes.

Reading of nc (paper 000 §3.1.2 (3); the paper is terse, so the choice is spelled out here and in
``cost_efficiency``): cu and mu are the *used* amounts of the flavour "within the constraining scope",
i.e. ``min(demand, capacity)`` per dimension (a node cannot use more than it has, nor more than is asked
for), normalised by the *demand* in that dimension. The denominator is the same for every flavour, so
``nc / p`` ranks flavours by weighted resource actually absorbed per dollar, which is what the paper says
the figure is for: "the instance with the lowest cost per resource used". Normalising by the flavour's own
capacity (a per-node utilisation) instead would give nc = 1 to every flavour smaller than the demand, and
the score would collapse to 1 / p: always the cheapest, smallest flavour, whatever it offers.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from extender.core.model import Flavour, InvalidInputError, Node, NodeGroup, Pod, Resources, WorkloadKind

__all__ = [
    "MAX_PLAN_NODES",
    "FluidBound",
    "Provisioning",
    "ProvisioningLedger",
    "ScalePlan",
    "ScoreWeights",
    "capacity_order",
    "cost_efficiency",
    "fluid_lower_bound_per_hour",
    "forecast_shortage",
    "measured_lag",
    "plan_aggregate",
    "plan_batch",
    "plan_pods",
    "validate_catalogue",
    "with_headroom",
    "zero_bin_capacity",
]

# A plan longer than this is a unit mistake upstream (bytes given as GiB, ...), not a real scale-up; the
# loops below would otherwise run for as many iterations as nodes and stall the sidecar's cycle.
MAX_PLAN_NODES = 10_000


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_finite(name: str, value: float, *, nonnegative: bool = False, positive: bool = False) -> None:
    if not _is_real(value) or not math.isfinite(value):
        raise InvalidInputError(f"{name} must be a finite number, got {value!r}")
    if nonnegative and value < 0:
        raise InvalidInputError(f"{name} must not be negative, got {value!r}")
    if positive and value <= 0:
        raise InvalidInputError(f"{name} must be positive, got {value!r}")


def _check_resources(name: str, value: object) -> Resources:
    if not isinstance(value, Resources):
        raise InvalidInputError(f"{name} must be Resources, got {type(value).__name__}")
    if not value.is_nonnegative():
        raise InvalidInputError(f"{name} must not be negative, got {value}")
    return value


def _check_pods(pods: Sequence[Pod], what: str) -> None:
    """Plans name pods by key, so a key seen twice would be planned twice (or vanish from the invariant)."""
    seen: set[str] = set()
    for pod in pods:
        if not isinstance(pod, Pod):
            raise InvalidInputError(f"{what} must contain Pod objects, got {type(pod).__name__}")
        if pod.key in seen:
            raise InvalidInputError(f"{what}: pod {pod.key} appears more than once")
        seen.add(pod.key)


# --------------------------------------------------------------------------------------------- score


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    """w1 / w2 of nc (paper 000 §3.1.2 (3): 0.5 / 0.5 "evaluated equally"; paper 004 Table III: 0.38 / 0.62,
    the cluster's average cpu / memory utilisation). Only the ratio matters: nc is divided by the sum."""

    cpu: float = 0.5
    memory: float = 0.5

    def __post_init__(self) -> None:
        _check_finite("score weight cpu", self.cpu, nonnegative=True)
        _check_finite("score weight memory", self.memory, nonnegative=True)
        if self.cpu + self.memory <= 0:
            raise InvalidInputError("score weights must not both be zero")


def _nc(used_cpu: int, used_mem: int, demand: Resources, weights: ScoreWeights) -> float:
    """nc of paper 000 §3.1.2 (3) / paper 004 Eq. 6 for ``used`` amounts, normalised by the demand.

    A dimension nobody asks for contributes 0: capacity in it is not "used", however much there is.
    """
    cu = used_cpu / demand.cpu_milli if demand.cpu_milli > 0 else 0.0
    mu = used_mem / demand.memory_bytes if demand.memory_bytes > 0 else 0.0
    return (weights.cpu * cu + weights.memory * mu) / (weights.cpu + weights.memory)


def cost_efficiency(flavour: Flavour, demand: Resources, weights: ScoreWeights) -> float:
    """Paper 000 §3.1.2 (3): ``Score = nc / p`` of one node of ``flavour`` against ``demand``.

    nc = (w_cpu * cu + w_mem * mu) / (w_cpu + w_mem), where cu = min(demand_cpu, flavour_cpu) / demand_cpu
    (likewise mu): the share of the outstanding demand one node of this flavour would absorb. See the
    module docstring for why the normalisation is by the demand and not by the flavour's capacity. Pod
    slots and extended resources are not scored (the paper scores cpu and memory only); plan_pods counts
    them by packing the actual pods instead.
    """
    if not isinstance(flavour, Flavour):
        raise InvalidInputError(f"flavour must be a Flavour, got {type(flavour).__name__}")
    _check_resources("demand", demand)
    if not isinstance(weights, ScoreWeights):
        raise InvalidInputError(f"weights must be ScoreWeights, got {type(weights).__name__}")
    cap = flavour.capacity
    nc = _nc(min(demand.cpu_milli, cap.cpu_milli), min(demand.memory_bytes, cap.memory_bytes), demand, weights)
    return nc / flavour.price_per_hour


def with_headroom(flavours: Sequence[Flavour], reserve: Resources) -> tuple[Flavour, ...]:
    """The catalogue as pods see a new node once ``reserve`` is taken (DaemonSet pods, the system pods a
    cluster-autoscaler node template carries): a plan packed to the flavour's full capacity would not fit CA's
    template, and CA refuses an all-or-nothing request it cannot place. Never below one unit of anything."""
    if reserve == Resources():
        return tuple(flavours)
    out = []
    for f in flavours:
        c = f.capacity
        room = Resources(
            max(1, c.cpu_milli - reserve.cpu_milli),
            max(1, c.memory_bytes - reserve.memory_bytes),
            max(1, c.pods - reserve.pods),
            c.extended,
        )
        out.append(Flavour(f.name, room, f.price_per_hour))
    return tuple(out)


def validate_catalogue(flavours: Sequence[Flavour]) -> None:
    """Refuse a catalogue no plan can come from: empty, non-Flavour items, or two flavours with one name.

    Duplicate names would make ``flavour_counts`` (what the provider is asked to create, by name) merge two
    different machines. Zero or negative prices are refused earlier, by the Flavour constructor.
    """
    if isinstance(flavours, (str, bytes)) or not isinstance(flavours, Sequence):
        raise InvalidInputError("flavour catalogue must be a sequence of Flavour")
    if not flavours:
        raise InvalidInputError("flavour catalogue is empty: there is nothing to scale up with")
    seen: set[str] = set()
    for flavour in flavours:
        if not isinstance(flavour, Flavour):
            raise InvalidInputError(f"flavour catalogue must contain Flavour, got {type(flavour).__name__}")
        if flavour.name in seen:
            raise InvalidInputError(f"flavour catalogue has duplicate name {flavour.name!r}")
        seen.add(flavour.name)


# ---------------------------------------------------------------------------------------------- plans


@dataclass(frozen=True, slots=True)
class ScalePlan:
    """New nodes to request, each with the pod keys it was bought for, plus the pods no flavour can host.

    ``unservable`` pods are reported instead of planned so that a pod larger than every flavour never
    causes a node to be bought for it, again and again, every cycle. ``deferred`` pods are servable but left
    out by a node cap (``plan_pods(max_nodes=...)``): the next scans plan them again, once nodes leave.
    """

    nodes: tuple[tuple[Flavour, tuple[str, ...]], ...] = ()
    unservable: tuple[str, ...] = ()
    # servable pods the plan leaves for a later scan because the node cap (``max_nodes``) allowed no more nodes
    deferred: tuple[str, ...] = ()
    # the cap changed the flavour mix: the nodes are not the cheapest plan's first ``max_nodes`` (``plan_pods``)
    reshaped: bool = False

    @property
    def cost_per_hour(self) -> float:
        return math.fsum(flavour.price_per_hour for flavour, _ in self.nodes)

    @property
    def flavour_counts(self) -> dict[str, int]:
        counts = Counter(flavour.name for flavour, _ in self.nodes)
        return dict(sorted(counts.items()))


def _check_plan_inputs(flavours: Sequence[Flavour], weights: ScoreWeights) -> None:
    validate_catalogue(flavours)
    if not isinstance(weights, ScoreWeights):
        raise InvalidInputError(f"weights must be ScoreWeights, got {type(weights).__name__}")


def _best_by_score(
    candidates: Iterable[tuple[Flavour, float]],
) -> Flavour:
    """Highest score; ties to the cheaper flavour, then the name, so equal inputs give equal plans."""
    return min(candidates, key=lambda fs: (-fs[1], fs[0].price_per_hour, fs[0].name))[0]


def plan_aggregate(demand: Resources, flavours: Sequence[Flavour], weights: ScoreWeights) -> ScalePlan:
    """Paper 000 Alg. 3 (GA), as published: cover the *total* cpu and memory volume, not the pods.

    Lines 1-2 take the summed request; lines 3-8 repeatedly buy the flavour with the highest score for what
    is still uncovered and subtract its capacity. It ignores fragmentation and pod slots (a set of nodes
    whose sums cover the volume may still not hold the pods), which is why plan_pods exists; it is kept as
    the paper's baseline for the simulator. Nodes carry no pod keys and nothing is unservable.
    """
    _check_resources("demand", demand)
    _check_plan_inputs(flavours, weights)
    tcpu, tram = demand.cpu_milli, demand.memory_bytes  # Alg. 3 lines 1-2
    bought: list[tuple[Flavour, tuple[str, ...]]] = []
    while tcpu > 0 or tram > 0:  # Alg. 3 line 3
        if len(bought) >= MAX_PLAN_NODES:
            raise InvalidInputError(f"demand {demand} needs more than {MAX_PLAN_NODES} nodes; check its units")
        rest = Resources(max(tcpu, 0), max(tram, 0))
        best = _best_by_score((f, cost_efficiency(f, rest, weights)) for f in flavours)  # line 4
        tcpu -= best.capacity.cpu_milli  # line 5
        tram -= best.capacity.memory_bytes  # line 6
        bought.append((best, ()))  # line 7
    return ScalePlan(tuple(bought), ())


def _dominant_share(pod: Pod, largest: Resources) -> float:
    r = pod.requests
    return max(r.cpu_milli / largest.cpu_milli, r.memory_bytes / largest.memory_bytes, r.pods / largest.pods)


def _ffd_order(pods: Iterable[Pod], flavours: Sequence[Flavour]) -> list[Pod]:
    """Decreasing dominant share of the largest catalogue capacity (the usual vector-FFD order; paper 004
    Alg. 3 takes the pending tasks "in descending order of resource demands"); ties by key."""
    largest = Resources(
        max(f.capacity.cpu_milli for f in flavours),
        max(f.capacity.memory_bytes for f in flavours),
        max(f.capacity.pods for f in flavours),
    )
    return sorted(pods, key=lambda p: (-_dominant_share(p, largest), p.key))


class _Room:
    """Free space of one bin during a packing simulation (mutable, private: plain ints for speed)."""

    __slots__ = ("cpu", "ext", "mem", "pods")

    def __init__(self, free: Resources) -> None:
        self.cpu = free.cpu_milli
        self.mem = free.memory_bytes
        self.pods = free.pods
        self.ext = dict(free.extended)

    def take(self, request: Resources) -> bool:
        """Reserve ``request`` if every dimension fits (no over-commit), else leave the room unchanged."""
        if request.cpu_milli > self.cpu or request.memory_bytes > self.mem or request.pods > self.pods:
            return False
        if any(amount > self.ext.get(name, 0) for name, amount in request.extended):
            return False
        self.cpu -= request.cpu_milli
        self.mem -= request.memory_bytes
        self.pods -= request.pods
        for name, amount in request.extended:
            self.ext[name] = self.ext.get(name, 0) - amount
        return True


class _Groups:
    """Pending pods in FFD order, grouped by identical request (replicas of one owner usually are).

    Packing works on groups, so a node takes a whole run of replicas in one step (taking them one by one
    stops at the same count: the room only shrinks) and a cycle with thousands of replicas costs
    O(shapes) per trial node instead of O(pods). Exhausted groups leave ``active``, and a trial fill stops
    once the room is below the smallest remaining request in some dimension (nothing else can fit).
    Within a group pods are taken in key order, so plans are deterministic.
    """

    __slots__ = ("active", "count", "cpu_left", "keys", "left", "mem_left", "mins", "shapes")

    def __init__(self, pods: Sequence[Pod], flavours: Sequence[Flavour]) -> None:
        by_request: dict[Resources, list[str]] = {}
        for pod in _ffd_order(pods, flavours):
            by_request.setdefault(pod.requests, []).append(pod.key)
        # dicts keep insertion order: groups are in the FFD order of their first pod
        self.shapes = [
            (r.cpu_milli, r.memory_bytes, r.pods, tuple((n, a) for n, a in r.extended if a > 0)) for r in by_request
        ]
        self.keys = list(by_request.values())
        self.left = [len(keys) for keys in self.keys]
        self.count = sum(self.left)
        self.cpu_left = sum(shape[0] * n for shape, n in zip(self.shapes, self.left, strict=True))
        self.mem_left = sum(shape[1] * n for shape, n in zip(self.shapes, self.left, strict=True))
        self.active = list(range(len(self.keys)))
        self.mins = (0, 0, 0)
        self._refresh()

    def _refresh(self) -> None:
        self.active = [i for i in self.active if self.left[i] > 0]
        if self.active:
            self.mins = (
                min(self.shapes[i][0] for i in self.active),
                min(self.shapes[i][1] for i in self.active),
                min(self.shapes[i][2] for i in self.active),
            )

    def fill(self, capacity: Resources) -> dict[int, int]:
        """Trial-fill one new node first-fit in FFD order: group index -> how many it takes. Filling bins
        one at a time gives exactly FFD's assignment (an item skips bin k only if it did not fit then)."""
        cpu, mem, slots = capacity.cpu_milli, capacity.memory_bytes, capacity.pods
        ext = dict(capacity.extended)
        min_cpu, min_mem, min_slots = self.mins
        taken: dict[int, int] = {}
        for i in self.active:
            need_cpu, need_mem, need_slots, need_ext = self.shapes[i]
            n = self.left[i]
            if need_cpu:
                n = min(n, cpu // need_cpu)
            if need_mem:
                n = min(n, mem // need_mem)
            if need_slots:
                n = min(n, slots // need_slots)
            for name, amount in need_ext:
                n = min(n, ext.get(name, 0) // amount)
            if n <= 0:
                continue
            taken[i] = n
            cpu -= need_cpu * n
            mem -= need_mem * n
            slots -= need_slots * n
            for name, amount in need_ext:
                ext[name] -= amount * n
            if cpu < min_cpu or mem < min_mem or slots < min_slots:
                break
        return taken

    def demand(self) -> tuple[int, int]:
        """The cpu and memory the remaining pods ask (kept up to date by ``pop``)."""
        return self.cpu_left, self.mem_left

    def used(self, taken: dict[int, int]) -> tuple[int, int]:
        cpu = sum(self.shapes[i][0] * n for i, n in taken.items())
        mem = sum(self.shapes[i][1] * n for i, n in taken.items())
        return cpu, mem

    def remaining(self) -> int:
        return self.count

    def pop(self, taken: dict[int, int]) -> tuple[str, ...]:
        """Remove what a bought node takes; its pod keys. The active set and its minimums change only when a
        group runs out, so they are recomputed only then (a plan of thousands of nodes over hundreds of
        shapes spent most of its time recomputing the same minimums)."""
        keys: list[str] = []
        exhausted = False
        for i, n in sorted(taken.items()):
            start = len(self.keys[i]) - self.left[i]
            keys.extend(self.keys[i][start : start + n])
            self.left[i] -= n
            self.count -= n
            self.cpu_left -= self.shapes[i][0] * n
            self.mem_left -= self.shapes[i][1] * n
            exhausted = exhausted or self.left[i] == 0
        if exhausted:
            self._refresh()
        return tuple(keys)

    def rest(self) -> tuple[str, ...]:
        return tuple(k for i in self.active for k in self.keys[i][len(self.keys[i]) - self.left[i] :])


def _split_servable(pods: Sequence[Pod], flavours: Sequence[Flavour]) -> tuple[list[Pod], tuple[str, ...]]:
    servable: list[Pod] = []
    unservable: list[str] = []
    for pod in pods:
        if any(pod.requests.fits_in(f.capacity) for f in flavours):
            servable.append(pod)
        else:
            unservable.append(pod.key)
    return servable, tuple(sorted(unservable))


def _plan_cost(nodes: Sequence[tuple[Flavour, tuple[str, ...]]]) -> tuple[float, int]:
    return math.fsum(f.price_per_hour for f, _ in nodes), len(nodes)


def _too_many(nodes: Sequence[object]) -> None:
    if len(nodes) >= MAX_PLAN_NODES:
        raise InvalidInputError(f"pending pods need more than {MAX_PLAN_NODES} nodes; check their units")


def _greedy_pack(
    servable: Sequence[Pod], flavours: Sequence[Flavour], weights: ScoreWeights
) -> list[tuple[Flavour, tuple[str, ...]]]:
    """Paper 004 Alg. 3 with the score of paper 000, made fragmentation-aware.

    Each time a node is opened, every flavour is trial-filled (FFD) with the remaining pods and scored by
    what it would *actually* hold: nc of the packed requests against the remaining demand, over price.
    The small-tail rule: whenever some flavour can hold the whole remainder, "the nodes so far + the
    cheapest such flavour" is recorded as a complete candidate plan, and the cheapest candidate is
    returned. The score alone would keep buying efficient big nodes where one small node suffices, while
    always closing with the first flavour that holds everything would buy one huge, mostly empty node.
    """
    groups = _Groups(servable, flavours)
    nodes: list[tuple[Flavour, tuple[str, ...]]] = []
    best: list[tuple[Flavour, tuple[str, ...]]] | None = None
    while (count := groups.remaining()) > 0:
        _too_many(nodes)
        cpu, mem = groups.demand()
        demand = Resources(cpu, mem)
        trials = [(f, groups.fill(f.capacity)) for f in flavours]
        whole = [f for f, taken in trials if sum(taken.values()) == count]
        if whole:
            tail = min(whole, key=lambda f: (f.price_per_hour, f.name))
            closed = [*nodes, (tail, groups.rest())]
            if best is None or _plan_cost(closed) < _plan_cost(best):
                best = closed
        scored = []
        for f, taken in trials:
            n = sum(taken.values())
            if n == 0:
                continue
            used_cpu, used_mem = groups.used(taken)
            score = _nc(used_cpu, used_mem, demand, weights) / f.price_per_hour
            # Zero-cpu/zero-memory pods score 0 everywhere: then pods per dollar decides.
            scored.append((f, taken, score, n / f.price_per_hour))
        # Every remaining pod fits some empty flavour, so at least the first one is packed by that flavour.
        flavour, taken, _, _ = min(scored, key=lambda s: (-s[2], -s[3], s[0].price_per_hour, s[0].name))
        nodes.append((flavour, groups.pop(taken)))
    if best is None or _plan_cost(nodes) < _plan_cost(best):
        best = nodes
    return best


def _homogeneous_pack(
    servable: Sequence[Pod], flavours: Sequence[Flavour], flavour: Flavour
) -> list[tuple[Flavour, tuple[str, ...]]]:
    """Plain FFD into copies of one flavour (callers ensure every pod fits it)."""
    groups = _Groups(servable, flavours)
    nodes: list[tuple[Flavour, tuple[str, ...]]] = []
    while groups.remaining() > 0:
        _too_many(nodes)
        nodes.append((flavour, groups.pop(groups.fill(flavour.capacity))))
    return nodes


_Packs = dict[tuple[str, int, int, int, int], list[tuple[Flavour, tuple[str, ...]]]]


def _cheapest(
    servable: Sequence[Pod], flavours: Sequence[Flavour], weights: ScoreWeights, packs: _Packs | None = None
) -> list[tuple[Flavour, tuple[str, ...]]]:
    """The cheapest of the heterogeneous greedy plan and FFD into each single flavour that hosts every pod.

    ``packs`` (``_within_cap``'s nested catalogues and pod sets) remembers the single-flavour packs: one depends
    only on the flavour, the pods (nested sets there: their number names them) and the FFD order's largest
    capacity, which are its key."""
    best = _greedy_pack(servable, flavours, weights)
    largest = (
        max(f.capacity.cpu_milli for f in flavours),
        max(f.capacity.memory_bytes for f in flavours),
        max(f.capacity.pods for f in flavours),
    )
    for flavour in flavours:
        if all(p.requests.fits_in(flavour.capacity) for p in servable):
            key = (flavour.name, len(servable), *largest)
            candidate = packs.get(key) if packs is not None else None
            if candidate is None:
                candidate = _homogeneous_pack(servable, flavours, flavour)
                if packs is not None:
                    packs[key] = candidate
            if _plan_cost(candidate) < _plan_cost(best):
                best = candidate
    return best


def plan_pods(
    pending: Sequence[Pod], flavours: Sequence[Flavour], weights: ScoreWeights, *, max_nodes: int | None = None
) -> ScalePlan:
    """Plan new nodes for the actual pending pods: the pod-level version of paper 000 Alg. 3.

    Pods are packed first-fit-decreasing into new nodes (cpu, memory, pod slots and extended resources all
    respected, so every node in the plan really holds its pods); the flavour of each new node is chosen by
    the fragmentation-aware score of ``_greedy_pack``. The result is then compared with plain FFD into
    each single flavour that can host every pod and the cheapest plan wins (ties: fewer nodes, then the
    heterogeneous plan). Guarantees, used by the tests:

    * every pending key is in exactly one node, in ``unservable`` or in ``deferred``; no node is over-committed;
    * a pod that fits no flavour is unservable, never a node;
    * without a cap (or when the cheapest plan fits under it): nothing is deferred, cost <= FFD into any single
      flavour that hosts every pod (it is one of the candidates), and cost >= fluid_lower_bound_per_hour of the
      servable pods' total (any covering plan is LP-feasible);
    * with ``max_nodes`` (the nodes a total node limit still allows): at most that many nodes, covering at least
      as much demand as the cheapest plan's first ``max_nodes`` nodes (``_within_cap``).
    """
    _check_plan_inputs(flavours, weights)
    _check_pods(pending, "pending")
    if max_nodes is not None and (isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 0):
        raise InvalidInputError(f"max_nodes must be a non-negative integer or None, got {max_nodes!r}")
    servable, unservable = _split_servable(pending, flavours)
    if max_nodes == 0:  # nothing can be bought: no plan worth computing
        return ScalePlan((), unservable, tuple(p.key for p in servable))
    packs: _Packs = {}
    best = _cheapest(servable, flavours, weights, packs)
    if max_nodes is None or len(best) <= max_nodes:
        return ScalePlan(tuple(best), unservable)
    return _within_cap(servable, flavours, weights, best, max_nodes, unservable, packs)


def capacity_order(flavours: Sequence[Flavour], weights: ScoreWeights) -> list[Flavour]:
    """The catalogue from the smallest flavour to the largest, by the share of the catalogue's largest cpu and
    largest memory one node holds, weighted as nc weighs them (the planner's own measure of how much demand a
    node absorbs); ties to the cheaper flavour, then the name."""
    max_cpu = max(f.capacity.cpu_milli for f in flavours)
    max_mem = max(f.capacity.memory_bytes for f in flavours)
    wc, wm = Fraction(weights.cpu), Fraction(weights.memory)

    def size(f: Flavour) -> Fraction:
        return wc * Fraction(f.capacity.cpu_milli, max_cpu) + wm * Fraction(f.capacity.memory_bytes, max_mem)

    return sorted(flavours, key=lambda f: (size(f), f.price_per_hour, f.name))


def _within_cap(
    servable: Sequence[Pod],
    flavours: Sequence[Flavour],
    weights: ScoreWeights,
    cheapest: list[tuple[Flavour, tuple[str, ...]]],
    max_nodes: int,
    unservable: tuple[str, ...],
    packs: _Packs,
) -> ScalePlan:
    """The cheapest plan needs more nodes than the cap allows: re-plan for capacity per node.

    Why: the planner buys the flavour cheapest per unit of demand, which on small pods is the smallest flavour;
    under a node-count limit that fills the cap with little capacity (the Alibaba trace at the shipped 200
    nodes: 229 cores held while 1,000+ were asked for, and the queue never drained). A platform engineer who
    sets ``max_nodes`` expects capacity to be bought within it, not node count spent.

    How: the catalogue is ordered by capacity (``capacity_order``) and the smallest flavours are dropped one at
    a time; each catalogue left is planned by the uncapped planner (so among the flavours kept, the cheapest per
    unit still wins), and of each plan the ``max_nodes`` nodes holding the most demand are kept. The candidate
    covering the most pending demand (nc's weighted share of the pending cpu and memory, exact in rationals;
    then the most pods) wins, the cheapest among equals (then fewer nodes, then the larger catalogue). The
    full catalogue is a candidate, so the result covers at least what the cheapest plan's first ``max_nodes``
    nodes cover. A node-count-constrained best fit would be an integer program (bin packing with a cardinality
    bound); this costs at most one uncapped plan per flavour, and only in the scans where the cap binds.
    """
    requests = {p.key: p.requests for p in servable}
    demand = Resources.total(requests.values())
    wc = Fraction(weights.cpu) if demand.cpu_milli > 0 else Fraction(0)
    wm = Fraction(weights.memory) if demand.memory_bytes > 0 else Fraction(0)
    dc, dm = max(demand.cpu_milli, 1), max(demand.memory_bytes, 1)

    def covered(keys: tuple[str, ...]) -> Fraction:
        cpu = sum(requests[k].cpu_milli for k in keys)
        mem = sum(requests[k].memory_bytes for k in keys)
        return wc * Fraction(cpu, dc) + wm * Fraction(mem, dm)

    best_key: tuple[Fraction, int, float, int, int] | None = None
    chosen: list[tuple[Flavour, tuple[str, ...]]] = []
    order = capacity_order(flavours, weights)
    for k in range(len(order)):
        catalogue = order[k:]
        if k == 0:
            plan = cheapest
        else:
            hosted = [p for p in servable if any(p.requests.fits_in(f.capacity) for f in catalogue)]
            if not hosted:
                break  # smaller catalogues host still fewer pods
            plan = _cheapest(hosted, catalogue, weights, packs)
        worth = [covered(keys) for _, keys in plan]
        ranked = sorted(range(len(plan)), key=lambda i: (-worth[i], -len(plan[i][1]), i))[:max_nodes]
        nodes = [plan[i] for i in ranked]
        key = (
            -sum((worth[i] for i in ranked), Fraction(0)),
            -sum(len(keys) for _, keys in nodes),
            _plan_cost(nodes)[0],
            len(nodes),
            k,
        )
        if best_key is None or key < best_key:
            best_key, chosen = key, nodes
    planned = {key for _, keys in chosen for key in keys}
    deferred = tuple(p.key for p in servable if p.key not in planned)
    reshaped = Counter(f.name for f, _ in chosen) != Counter(f.name for f, _ in cheapest[:max_nodes])
    return ScalePlan(tuple(chosen), unservable, deferred, reshaped)


# ----------------------------------------------------------------------------------------- 0-bin (Alg 4)


def _releases_within(pod: Pod, now: float, horizon: float) -> bool:
    """Will the pod's requests be free again within ``horizon`` seconds of ``now``?

    Only batch pods with a runtime estimate ever finish; a service, or a batch pod without an estimate
    (Pod.remaining_runtime reports 0 for both), is assumed to hold its resources indefinitely.
    """
    if pod.kind is not WorkloadKind.BATCH or pod.runtime_seconds is None:
        return False
    return pod.remaining_runtime(now) < horizon


def _zero_bin_room(node: Node, now: float, cycle_seconds: float) -> Resources | None:
    """The capacity a 0-bin node offers by the end of the cycle, or None if it is not in bin 0.

    Paper 000 §5.1 puts a node in bin floor(rt / sc), rt = remaining runtime of its longest batch job, and
    §5.2 / Alg. 4 lines 3-6 deduct the whole capacity of bin-0 nodes (rt < sc): they empty before any new
    instance could arrive. We read "bin 0" per batch pod (every known-runtime batch pod finishes within the
    cycle) and deduct allocatable minus whatever does *not* release (services, unknown-runtime pods), which
    equals the paper's full capacity on a pure batch node and does not count a service's space as free on
    a mixed one. Cordoned nodes are being drained or removed, so they are not in any bin.
    """
    if node.unschedulable:
        return None
    holding: list[Resources] = []
    for pod in node.pods:
        if _releases_within(pod, now, cycle_seconds):
            continue
        if pod.kind is WorkloadKind.BATCH and pod.runtime_seconds is not None:
            return None  # a known-runtime batch pod outlives the cycle: bin >= 1
        holding.append(pod.requests)
    room = node.allocatable - Resources.total(holding)
    return Resources(
        max(room.cpu_milli, 0),
        max(room.memory_bytes, 0),
        max(room.pods, 0),
        tuple((name, amount) for name, amount in room.extended if amount > 0),
    )


def _check_batch_nodes(batch_nodes: Sequence[Node], now: float, cycle_seconds: float) -> None:
    _check_finite("now", now)
    _check_finite("cycle_seconds", cycle_seconds, positive=True)
    seen: set[str] = set()
    for node in batch_nodes:
        if not isinstance(node, Node):
            raise InvalidInputError(f"batch_nodes must contain Node objects, got {type(node).__name__}")
        if node.group is NodeGroup.SERVICE:
            raise InvalidInputError(f"node {node.name} is in the service group, not the batch group")
        if node.name in seen:
            raise InvalidInputError(f"batch_nodes: node {node.name} appears more than once")
        seen.add(node.name)


def zero_bin_capacity(batch_nodes: Sequence[Node], now: float, cycle_seconds: float) -> Resources:
    """Paper 000 Alg. 4 lines 3-6: the capacity of the batch nodes in bin 0 (see ``_zero_bin_room``).

    It is free now or released before the next scaling cycle, so before any instance bought now could
    join; it therefore counts against the pending demand before anything is bought.
    """
    _check_batch_nodes(batch_nodes, now, cycle_seconds)
    rooms = (_zero_bin_room(node, now, cycle_seconds) for node in batch_nodes)
    return Resources.total(room for room in rooms if room is not None)


def plan_batch(
    pending: Sequence[Pod],
    batch_nodes: Sequence[Node],
    flavours: Sequence[Flavour],
    weights: ScoreWeights,
    now: float,
    cycle_seconds: float,
    *,
    max_nodes: int | None = None,
) -> ScalePlan:
    """Paper 000 Alg. 4 for the batch group, with the 0-bin deduction done per node, not in aggregate.

    The paper subtracts the summed 0-bin capacity from the summed request (lines 3-6) and returns no plan
    if that covers everything (lines 7-9). Summed capacity can "cover" pods that fit on no single node, so
    instead the pending pods are placed FFD into each 0-bin node's room (nodes by name); those that fit
    are left to wait for the release and appear nowhere in the plan. The rest are planned with plan_pods
    (the pod-level stand-in for lines 10-15), under ``max_nodes`` if given (the nodes a total limit allows).
    """
    _check_plan_inputs(flavours, weights)
    _check_pods(pending, "pending")
    _check_batch_nodes(batch_nodes, now, cycle_seconds)
    rooms = [
        _Room(room)
        for node in sorted(batch_nodes, key=lambda n: n.name)
        if (room := _zero_bin_room(node, now, cycle_seconds)) is not None
    ]
    rest = [pod for pod in _ffd_order(pending, flavours) if not any(r.take(pod.requests) for r in rooms)]
    return plan_pods(rest, flavours, weights, max_nodes=max_nodes)


# ----------------------------------------------------------------------------- provisioning (paper 003)


@dataclass(frozen=True, slots=True)
class Provisioning:
    """A node requested from the provider and not joined yet, with the pods it was bought for."""

    node_name: str
    flavour: Flavour
    requested_at: float
    pods: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.node_name, str) or not self.node_name:
            raise InvalidInputError("provisioning node name must be a non-empty string")
        if not isinstance(self.flavour, Flavour):
            raise InvalidInputError(f"provisioning {self.node_name}: flavour must be a Flavour")
        _check_finite(f"provisioning {self.node_name}: requested_at", self.requested_at)
        if len(set(self.pods)) != len(self.pods):
            raise InvalidInputError(f"provisioning {self.node_name}: a pod key is listed twice")


@dataclass(frozen=True, slots=True)
class ProvisioningLedger:
    """Paper 003 Alg. 7 (binding autoscaler): nodes being provisioned and the pods bound to them.

    Without it every cycle of acquisition lag (minutes) re-plans the same pending pods and buys their nodes
    again (paper 003 §6, the non-binding autoscaler's over-provisioning). Immutable: each method returns
    a new ledger, so the shell can persist it or discard it without aliasing surprises.
    """

    entries: tuple[Provisioning, ...] = ()

    def __post_init__(self) -> None:
        names: set[str] = set()
        owners: dict[str, str] = {}
        for entry in self.entries:
            if not isinstance(entry, Provisioning):
                raise InvalidInputError(f"ledger entries must be Provisioning, got {type(entry).__name__}")
            if entry.node_name in names:
                raise InvalidInputError(f"ledger already tracks a node named {entry.node_name}")
            names.add(entry.node_name)
            for key in entry.pods:
                if key in owners:
                    raise InvalidInputError(
                        f"pod {key} is bound to both {owners[key]} and {entry.node_name} in the ledger"
                    )
                owners[key] = entry.node_name

    def add(self, p: Provisioning) -> ProvisioningLedger:
        """Record a requested node ("launch a new node and assign the pod to the node", Alg. 7)."""
        return ProvisioningLedger((*self.entries, p))

    def arrived(self, node_name: str) -> ProvisioningLedger:
        """The node joined: forget it and unbind its pods; the scheduler places them from now on (Alg. 7).

        An unknown name is not an error: nodes join that this sidecar never requested (static or manual
        ones), and an arrival may be reported twice.
        """
        return ProvisioningLedger(tuple(e for e in self.entries if e.node_name != node_name))

    def expire(self, now: float, timeout_seconds: float) -> tuple[ProvisioningLedger, tuple[Provisioning, ...]]:
        """Drop entries requested more than ``timeout_seconds`` before ``now`` (strictly) and return them.

        A node that never joins must not keep its pods "covered" forever; the returned entries let the
        shell emit an Event and re-plan those pods on the next cycle.
        """
        _check_finite("now", now)
        _check_finite("timeout_seconds", timeout_seconds, positive=True)
        expired = tuple(e for e in self.entries if now - e.requested_at > timeout_seconds)
        kept = tuple(e for e in self.entries if not now - e.requested_at > timeout_seconds)
        return ProvisioningLedger(kept), expired

    def uncovered(self, pending: Sequence[Pod]) -> list[Pod]:
        """Pending pods that still need a new node, in their original order (paper 003 Alg. 7).

        A pod is covered (1) by key, when a provisioning node was bought for it, or (2) by room: when it
        fits FFD into the space still unclaimed on a provisioning node ("if pod can fit in one of the nodes
        being provisioned"). The unclaimed space is the flavour's capacity minus the requests of the node's
        bound pods that are *still pending*; a bound pod that is no longer pending went elsewhere (or was
        deleted), so its space is free again. Room claims are not recorded in the ledger: the ledger keeps
        only what was bought, and the same snapshot yields the same answer next cycle.
        """
        _check_pods(pending, "pending")
        by_key = {pod.key: pod for pod in pending}
        bound = {key for entry in self.entries for key in entry.pods}
        rooms: list[_Room] = []
        for entry in self.entries:
            claimed = Resources.total(by_key[key].requests for key in entry.pods if key in by_key)
            rooms.append(_Room(entry.flavour.capacity - claimed))
        loose = [pod for pod in pending if pod.key not in bound]
        covered: set[str] = set()
        if rooms:  # FFD: largest first, by dominant share of the biggest provisioning flavour
            caps = [e.flavour.capacity for e in self.entries]
            largest = Resources(
                max(c.cpu_milli for c in caps), max(c.memory_bytes for c in caps), max(c.pods for c in caps)
            )
            ordered = sorted(loose, key=lambda p: (-_dominant_share(p, largest), p.key))
            covered = {pod.key for pod in ordered if any(room.take(pod.requests) for room in rooms)}
        return [pod for pod in pending if pod.key not in bound and pod.key not in covered]


# ----------------------------------------------------------------------------- lag-aware forecast (001)


def measured_lag(samples: Sequence[float], default: float, *, window: int = 20, quantile: float = 0.9) -> float:
    """Acquisition lag estimate: the ``quantile`` (nearest rank) of the last ``window`` measured lags.

    Paper 001 §III-B uses "the latest resource initialization time" and shows it varies little (GKE: mean
    157.4 s, sd 4.2 s); a window keeps that recency while one odd sample cannot swing the estimate. Why a
    high quantile rather than the mean: in forecast_shortage a longer lag lets more running batch pods
    count as released, so an over-estimate delays a batch pod by at most the difference, while an
    under-estimate buys a node the releases would have made unnecessary (paper 000's objective is cost,
    and batch pods tolerate delay); as a provisioning timeout base, longer is also the safe side.
    ``default`` (e.g. the configured lag) is returned until a sample exists. Samples are oldest first.
    """
    _check_finite("default lag", default, nonnegative=True)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise InvalidInputError(f"lag window must be an integer >= 1, got {window!r}")
    _check_finite("lag quantile", quantile)
    if not 0.0 < quantile <= 1.0:
        raise InvalidInputError(f"lag quantile must be in (0, 1], got {quantile!r}")
    for sample in samples:
        _check_finite("lag sample", sample, nonnegative=True)
    recent = sorted(float(s) for s in samples[-window:])
    if not recent:
        return float(default)
    rank = max(1, math.ceil(quantile * len(recent)))  # nearest-rank percentile
    return recent[rank - 1]


def forecast_shortage(
    demand: Resources, running_batch: Sequence[Pod], capacity: Resources, now: float, lag_seconds: float
) -> Resources:
    """Paper 001 Eq. 2 / Alg. 1 lines 3-18: the shortage at now + lag, when bought capacity would arrive.

    shortage = demand + (requests of running pods still running at now + lag) - capacity, per dimension,
    clamped at 0. ``demand`` is the pending pods' total; ``capacity`` is the total capacity the pending and
    running pods share (running pods' requests included in it). A batch pod releases its requests when
    its remaining runtime is < lag (Eq. 2's Delta RIU); services and pods without a runtime estimate never
    do. Pending pods that would start and finish within the lag are not credited (Alg. 1 simulates them;
    here they are unknown start times), and arrivals during the lag (Delta RSH) are the caller's to add to
    ``demand``: both omissions err towards buying, never towards a missed shortage of known work.
    """
    _check_resources("demand", demand)
    _check_resources("capacity", capacity)
    _check_finite("now", now)
    _check_finite("lag_seconds", lag_seconds, nonnegative=True)
    _check_pods(running_batch, "running_batch")
    still = Resources.total(p.requests for p in running_batch if not _releases_within(p, now, lag_seconds))
    gap = demand + still - capacity
    return Resources(
        max(gap.cpu_milli, 0),
        max(gap.memory_bytes, 0),
        max(gap.pods, 0),
        tuple((name, amount) for name, amount in gap.extended if amount > 0),
    )


# ------------------------------------------------------------------------------------- fluid bound


def _exact_rows(flavours: Sequence[Flavour]) -> list[tuple[Fraction, Fraction, Fraction]]:
    """Each flavour's (cpu, memory, price) as exact rationals: the fluid bound's primal and dual are solved in
    Fractions so that both give the same correctly rounded float."""
    return [
        (Fraction(f.capacity.cpu_milli), Fraction(f.capacity.memory_bytes), Fraction(f.price_per_hour))
        for f in flavours
    ]


def fluid_lower_bound_per_hour(demand: Resources, flavours: Sequence[Flavour]) -> float:
    """The cheapest *fractional* mix of flavours covering the demand's cpu and memory, in $/hour.

    LP: min sum_f x_f p_f  s.t.  sum_f x_f cpu_f >= C,  sum_f x_f mem_f >= M,  x >= 0. Every flavour has
    positive cpu and memory, so the LP is feasible and bounded; with two constraints an optimal basic
    solution has at most two positive x. Its vertices are therefore (a) one flavour, x = max(C/cpu, M/mem),
    and (b) two flavours with both constraints tight (a 2x2 solve, kept when both x >= 0); the minimum
    over all of them is the optimum, computed exactly in rationals (O(F^2), no scipy in core). Any plan of
    whole nodes covering the demand is LP-feasible, hence costs at least this: the simulator's yardstick.
    Pod slots and extended resources are left out, which only makes the bound weaker, never wrong.
    """
    _check_resources("demand", demand)
    validate_catalogue(flavours)
    need_c, need_m = Fraction(demand.cpu_milli), Fraction(demand.memory_bytes)
    if need_c == 0 and need_m == 0:
        return 0.0
    rows = _exact_rows(flavours)
    best = min(p * max(need_c / c, need_m / m) for c, m, p in rows)  # vertices (a)
    for i, (c1, m1, p1) in enumerate(rows):  # vertices (b): Cramer's rule on the tight 2x2 system
        for c2, m2, p2 in rows[i + 1 :]:
            det = c1 * m2 - c2 * m1
            if det == 0:
                continue
            x1 = (need_c * m2 - c2 * need_m) / det
            x2 = (c1 * need_m - need_c * m1) / det
            if x1 >= 0 and x2 >= 0:
                best = min(best, x1 * p1 + x2 * p2)
    return float(best)


class FluidBound:
    """``fluid_lower_bound_per_hour`` for one catalogue, answered from the LP's dual vertices (the simulator asks
    it once per distinct demand, hundreds of thousands of times on the Alibaba trace).

    The dual, max C y1 + M y2 s.t. cpu_f y1 + mem_f y2 <= price_f, y >= 0, has a feasible region that does not
    depend on the demand; its vertices are computed once (exact rationals, on a common denominator each), and
    the optimum for any demand (C, M) >= 0 is the largest C y1 + M y2 over them, equal to the primal optimum
    by strong duality (the primal is feasible and bounded: every flavour has positive cpu, memory and price).
    Integers throughout, one correctly rounded division at the end: the same float as the primal in Fractions
    (tests/test_sim_fast_paths.py compares them).
    """

    def __init__(self, flavours: Sequence[Flavour]) -> None:
        validate_catalogue(flavours)
        rows = _exact_rows(flavours)
        # every constraint line a y1 + b y2 = c, the axes included
        lines = [*rows, (Fraction(1), Fraction(0), Fraction(0)), (Fraction(0), Fraction(1), Fraction(0))]
        vertices: set[tuple[Fraction, Fraction]] = set()
        for i, (a1, b1, c1) in enumerate(lines):
            for a2, b2, c2 in lines[i + 1 :]:
                det = a1 * b2 - a2 * b1
                if det == 0:
                    continue
                y1 = (c1 * b2 - c2 * b1) / det
                y2 = (a1 * c2 - a2 * c1) / det
                if y1 >= 0 and y2 >= 0 and all(c * y1 + m * y2 <= p for c, m, p in rows):
                    vertices.add((y1, y2))
        self._vertices: list[tuple[int, int, int]] = []  # (n1, n2, d): y = (n1 / d, n2 / d)
        for y1, y2 in sorted(vertices):
            d = math.lcm(y1.denominator, y2.denominator)
            self._vertices.append((y1.numerator * (d // y1.denominator), y2.numerator * (d // y2.denominator), d))

    def per_hour(self, demand: Resources) -> float:
        _check_resources("demand", demand)
        need_c, need_m = demand.cpu_milli, demand.memory_bytes
        if need_c == 0 and need_m == 0:
            return 0.0
        best_n, best_d = 0, 1
        for n1, n2, d in self._vertices:
            n = need_c * n1 + need_m * n2
            if n * best_d > best_n * d:
                best_n, best_d = n, d
        return best_n / best_d
