"""Where a pod should go: kube-scheduler's own resource scores, BFD and time-bin BFD, and extender scores.

Two families of placement live here, and the extender serves both from one snapshot:

* the *spreading* scores kube-scheduler's default profile uses (NodeResourcesFit/LeastAllocated and
  NodeResourcesBalancedAllocation), reproduced to the integer so that the simulator's "default Kubernetes"
  baseline and the webhook's "spread" profile behave like the real scheduler, not like a paraphrase of it;
* the *packing* policies of paper 000 (HTAS): Best Fit Decreasing with memory ranked before CPU (§5.1,
  Alg. 1) for long-running services, and time-bin BFD (§5.1, Alg. 2) for batch pods, which co-locates
  batch pods that finish around the same time so whole nodes drain together and can be removed.

Everything is pure: time is the ``now`` argument, nodes are immutable snapshots and placements are
simulated with ``Node.with_pod``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from extender.core.model import InvalidInputError, Node, Pod, Resources, WorkloadKind

__all__ = [
    "DEFAULT_MEMORY_REQUEST",
    "DEFAULT_MILLI_CPU_REQUEST",
    "MAX_EXTENDER_SCORE",
    "MAX_NODE_SCORE",
    "PROFILES",
    "STRATEGIES",
    "balanced_allocation_score",
    "bfd_choose",
    "bfd_rank_scores",
    "bfd_sort",
    "fits",
    "k8s_default_score",
    "k8s_default_scores",
    "least_allocated_score",
    "least_allocated_scores",
    "most_allocated_score",
    "pack",
    "score_nodes",
    "time_bin",
    "time_bin_bfd_choose",
    "time_bin_order",
    "to_extender_scores",
]

# framework.MaxNodeScore: the range every in-tree score plugin reports in.
MAX_NODE_SCORE = 100
# extenderv1.MaxExtenderPriority: the range a scheduler extender's prioritize verb reports in.
MAX_EXTENDER_SCORE = 10
# schedutil.DefaultMilliCPURequest / DefaultMemoryRequest: what LeastAllocated / MostAllocated assume for a
# pod that requests nothing, so that best-effort pods do not all pile onto one node ("non-zero requests").
DEFAULT_MILLI_CPU_REQUEST = 100
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024

PROFILES = frozenset({"cost", "spread"})
STRATEGIES = frozenset({"bfd", "time-bin-bfd", "least-allocated", "k8s-default"})


# --------------------------------------------------------------------------------------------------------
# input checks
# --------------------------------------------------------------------------------------------------------


def _check_now(now: float) -> None:
    if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
        raise InvalidInputError(f"now must be a finite number of seconds, got {now!r}")


def _check_cycle(cycle_seconds: float) -> None:
    if (
        isinstance(cycle_seconds, bool)
        or not isinstance(cycle_seconds, (int, float))
        or not math.isfinite(cycle_seconds)
        or cycle_seconds <= 0
    ):
        raise InvalidInputError(f"scaling cycle must be a finite number of seconds > 0, got {cycle_seconds!r}")


def _check_unique_names(nodes: Sequence[Node]) -> None:
    seen: set[str] = set()
    for node in nodes:
        if node.name in seen:
            raise InvalidInputError(f"duplicate node name {node.name!r} in the snapshot")
        seen.add(node.name)


# --------------------------------------------------------------------------------------------------------
# kube-scheduler scores (pkg/scheduler/framework/plugins/noderesources)
# --------------------------------------------------------------------------------------------------------


def _non_zero(requests: Resources) -> tuple[int, int]:
    """(cpu, memory) with kube-scheduler's non-zero defaults for a missing request.

    Kubernetes applies the default per *container* whose request is missing; the core model only knows the
    pod total, so a pod total of 0 is taken as "missing". That is exact for single-container pods (the
    papers' assumption, seed 000 §3.1.1 (3)) and for the usual multi-container pod that sets all or none.
    """
    cpu = requests.cpu_milli if requests.cpu_milli != 0 else DEFAULT_MILLI_CPU_REQUEST
    mem = requests.memory_bytes if requests.memory_bytes != 0 else DEFAULT_MEMORY_REQUEST
    return cpu, mem


def _non_zero_requested(node: Node, pod: Pod) -> tuple[int, int]:
    """NodeInfo.NonZeroRequested of the node plus the incoming pod's non-zero request."""
    cpu, mem = _non_zero(pod.requests)
    for existing in node.pods:
        c, m = _non_zero(existing.requests)
        cpu += c
        mem += m
    return cpu, mem


def _weighted_mean(per_resource: Callable[[int, int], int], requested: Sequence[int], alloc: Sequence[int]) -> int:
    # Resources with zero allocatable are skipped, weights are all 1 (default ScoringStrategy.Resources),
    # and the mean is Go integer division of non-negative int64s, i.e. floor.
    total = weight_sum = 0
    for req, cap in zip(requested, alloc, strict=True):
        if cap == 0:
            continue
        total += per_resource(req, cap)
        weight_sum += 1
    return total // weight_sum if weight_sum else 0


def _least_requested(requested: int, capacity: int) -> int:
    if capacity == 0 or requested > capacity:
        return 0
    return (capacity - requested) * MAX_NODE_SCORE // capacity


def _most_requested(requested: int, capacity: int) -> int:
    if capacity == 0:
        return 0
    # Non-zero defaults can push requested past capacity; upstream clamps rather than scoring > 100.
    return min(requested, capacity) * MAX_NODE_SCORE // capacity


def least_allocated_score(node: Node, pod: Pod) -> int:
    """NodeResourcesFit with the LeastAllocated strategy (kube-scheduler's default), 0..100.

    Per resource ``(allocatable - requested) * 100 // allocatable`` (0 when over-requested), then the
    weighted mean over cpu and memory with weight 1 each; ``requested`` is the node's non-zero requests
    plus the incoming pod's. This is the "least requested priority" seed 004 Alg. 1 and seed 000 §2.1
    describe as the Kubernetes default.
    """
    cpu, mem = _non_zero_requested(node, pod)
    alloc = node.allocatable
    return _weighted_mean(_least_requested, (cpu, mem), (alloc.cpu_milli, alloc.memory_bytes))


def most_allocated_score(node: Node, pod: Pod) -> int:
    """NodeResourcesFit with the MostAllocated strategy, 0..100: the in-tree bin-packing score.

    Useful to compare HTAS' BFD (which ranks memory strictly before CPU) with Kubernetes' own packing,
    which averages the two.
    """
    cpu, mem = _non_zero_requested(node, pod)
    alloc = node.allocatable
    return _weighted_mean(_most_requested, (cpu, mem), (alloc.cpu_milli, alloc.memory_bytes))


def balanced_allocation_score(node: Node, pod: Pod) -> int:
    """NodeResourcesBalancedAllocation, 0..100: ``int((1 - std) * 100)`` over the cpu and memory fractions.

    Upstream differs from LeastAllocated in two ways that matter and are reproduced here:
    * it uses the *actual* requests (``useRequested: true``), not the non-zero defaults;
    * a best-effort pod (no cpu and no memory request) makes PreScore return Skip, so the plugin adds
      nothing for any node — modelled as 0, which leaves the sum of scores' ranking unchanged.
    Each fraction is ``requested / allocatable`` in float64, capped at 1; a resource with zero allocatable
    is left out; with two fractions std is ``|f1 - f2| / 2``, with one it is 0.
    """
    if pod.requests.cpu_milli == 0 and pod.requests.memory_bytes == 0:
        return 0
    req = node.requested + pod.requests
    fractions: list[float] = []
    for used, cap in (
        (req.cpu_milli, node.allocatable.cpu_milli),
        (req.memory_bytes, node.allocatable.memory_bytes),
    ):
        if cap == 0:
            continue
        # float(a) / float(b) mirrors Go's float64(a) / float64(b) (Python's int / int rounds differently
        # only above 2**53, but staying literal costs nothing).
        fractions.append(min(1.0, float(used) / float(cap)))
    std = 0.0
    if len(fractions) == 2:
        std = abs((fractions[0] - fractions[1]) / 2)
    # int() truncates toward zero exactly like Go's int64(float64) conversion.
    return int((1 - std) * float(MAX_NODE_SCORE))


def k8s_default_score(node: Node, pod: Pod) -> float:
    """What the default kube-scheduler profile adds up for resources: LeastAllocated + BalancedAllocation.

    Both plugins have weight 1 in the default profile, so their sum (0..200) orders nodes the way the real
    scheduler's resource plugins do. Used as the faithful "default Kubernetes" baseline (seed 000 §6).
    """
    return float(least_allocated_score(node, pod) + balanced_allocation_score(node, pod))


def k8s_default_scores(
    alloc: npt.NDArray[np.int64],
    non_zero_requested: npt.NDArray[np.int64],
    requested: npt.NDArray[np.int64],
    pod: Pod,
) -> npt.NDArray[np.int64]:
    """``k8s_default_score`` for many nodes at once (the simulator's k8s baseline scores every pending pod on
    hundreds of nodes). Columns are nodes; rows 0 and 1 are cpu (milli) and memory (bytes): ``alloc`` their
    allocatable, ``non_zero_requested`` the sum of their pods' ``_non_zero`` requests, ``requested`` their
    actual requests (without the pod). Same integer floor divisions, the same float64 fractions and the same
    truncation as the scalar functions, so every score is equal (tests/test_sim_fast_paths.py compares them).
    """
    least = least_allocated_scores(alloc, non_zero_requested, pod)
    if pod.requests.cpu_milli == 0 and pod.requests.memory_bytes == 0:
        return least
    valid = alloc != 0
    safe = np.where(valid, alloc, 1)
    own = np.array([pod.requests.cpu_milli, pod.requests.memory_bytes], dtype=np.int64)[:, np.newaxis]
    fractions = np.minimum(1.0, (requested + own).astype(np.float64) / safe.astype(np.float64))
    std = np.where(valid.all(axis=0), np.abs((fractions[0] - fractions[1]) / 2), 0.0)
    balanced = ((1 - std) * float(MAX_NODE_SCORE)).astype(np.int64)
    return np.asarray(least + balanced, dtype=np.int64)


def least_allocated_scores(
    alloc: npt.NDArray[np.int64], non_zero_requested: npt.NDArray[np.int64], pod: Pod
) -> npt.NDArray[np.int64]:
    """``least_allocated_score`` for many nodes at once (the controller ranks thousands of free hosts per gated
    pod under the ``spread`` profile). Columns as in ``k8s_default_scores``; the same integer floor divisions,
    so every score is equal to the scalar one (tests/test_decide_fast_hosts.py compares them)."""
    pod_nz = np.array(_non_zero(pod.requests), dtype=np.int64)[:, np.newaxis]
    nz = non_zero_requested + pod_nz
    valid = alloc != 0
    safe = np.where(valid, alloc, 1)
    per = np.where(valid & (nz <= alloc), (alloc - nz) * MAX_NODE_SCORE // safe, 0)
    weights = valid.sum(axis=0)
    return np.asarray(np.where(weights > 0, per.sum(axis=0) // np.maximum(weights, 1), 0), dtype=np.int64)


# --------------------------------------------------------------------------------------------------------
# feasibility and BFD (seed 000 §5.1, Alg. 1)
# --------------------------------------------------------------------------------------------------------


def fits(node: Node, pod: Pod) -> bool:
    """Exact request fit, as NodeResourcesFit's Filter: cpu, memory, extended resources and one pod slot.

    A pod always takes exactly one slot whatever ``requests.pods`` says, and the slots in use are counted
    from the bound pods, because that is how kubelet/kube-scheduler count (NodeInfo.Pods vs allocatable
    "pods"); a Resources built without ``pods=1`` must not let a full node accept more. Cordoned
    (unschedulable) nodes never fit: the extender must not undo a drain.
    """
    if node.unschedulable:
        return False
    if len(node.pods) + 1 > node.allocatable.pods:
        return False
    req = pod.requests
    free = node.free
    if req.cpu_milli > free.cpu_milli or req.memory_bytes > free.memory_bytes:
        return False
    return all(amount <= free.ext(name) for name, amount in req.extended)


def bfd_sort(pods: Iterable[Pod]) -> list[Pod]:
    """Best Fit *Decreasing*: biggest first, memory before CPU (seed 000 §5.1: CPU is compressible, so
    memory is the constraining dimension), then by pod key so the same input always packs the same way."""
    return sorted(pods, key=lambda p: (-p.requests.memory_bytes, -p.requests.cpu_milli, p.key))


def _bfd_key(node: Node, pod: Pod) -> tuple[int, int]:
    # Seed 000 Alg. 1 line 1: min(availableRAM, availableCPU) after the pod would be placed, RAM first.
    free = node.free
    return (free.memory_bytes - pod.requests.memory_bytes, free.cpu_milli - pod.requests.cpu_milli)


def bfd_choose(nodes: Sequence[Node], pod: Pod) -> Node | None:
    """Seed 000 Alg. 1: among nodes the pod fits on, the one left with the least memory (then least CPU,
    then smallest name). The best *fit* leaves the fewest fragments, so fewer nodes are needed overall.

    Alg. 1 lines 4-6 (raise the node's runtime to the pod's) need no code: a node's runtime is derived
    from its pods (``Node.remaining_runtime``), so ``node.with_pod(pod)`` updates it.
    """
    best: Node | None = None
    best_key: tuple[int, int, str] | None = None
    for node in nodes:
        if not fits(node, pod):
            continue
        key = (*_bfd_key(node, pod), node.name)
        if best_key is None or key < best_key:
            best, best_key = node, key
    return best


# --------------------------------------------------------------------------------------------------------
# time bins (seed 000 §5.1, Alg. 2)
# --------------------------------------------------------------------------------------------------------


def time_bin(remaining_seconds: float, cycle_seconds: float) -> int:
    """bin = rt // sc (seed 000 §5.1): bin i holds remaining runtimes in [i*sc, (i+1)*sc).

    Bin 0 is what will be free within the next scaling cycle — the autoscaler deducts it (Alg. 4), and
    time-bin BFD uses bins to keep pods that end together on the same node.
    """
    _check_cycle(cycle_seconds)
    if (
        isinstance(remaining_seconds, bool)
        or not isinstance(remaining_seconds, (int, float))
        or not math.isfinite(remaining_seconds)
        or remaining_seconds < 0
    ):
        raise InvalidInputError(f"remaining runtime must be a finite number >= 0, got {remaining_seconds!r}")
    return int(remaining_seconds // cycle_seconds)


def time_bin_order(nodes: Sequence[Node], pod: Pod, now: float, cycle_seconds: float) -> list[list[Node]]:
    """The order seed 000 Alg. 2 searches bins in: the pod's own bin, then greater bins ascending (lines
    2-7), then lesser bins descending (lines 8-13). Only non-empty bins are listed; nodes within a bin are
    ordered by name. A node's bin comes from its longest remaining batch pod (an empty node is in bin 0).

    Greater bins come before lesser ones because a pod placed on a node that outlives it does not extend
    that node's life, whereas a pod on a node that would have drained sooner keeps the node up longer.
    """
    _check_now(now)
    _check_cycle(cycle_seconds)
    own = time_bin(pod.remaining_runtime(now), cycle_seconds)
    bins: dict[int, list[Node]] = {}
    for node in nodes:
        bins.setdefault(time_bin(node.remaining_runtime(now), cycle_seconds), []).append(node)
    order = [own] if own in bins else []
    order += sorted(b for b in bins if b > own)
    order += sorted((b for b in bins if b < own), reverse=True)
    return [sorted(bins[b], key=lambda n: n.name) for b in order]


def time_bin_bfd_choose(nodes: Sequence[Node], pod: Pod, now: float, cycle_seconds: float) -> Node | None:
    """Seed 000 Alg. 2: the first bin (in ``time_bin_order``) with a feasible node, BFD (Alg. 1) inside it.
    None means "no node": the caller scales out (Alg. 4) rather than spreading the pod.

    Bins are computed for feasible nodes only: a bin without a feasible node is skipped by Alg. 2 anyway,
    and the bin of a node is the costly part (a scan of its pods) on a large cluster.
    """
    _check_now(now)
    _check_cycle(cycle_seconds)
    feasible = [n for n in nodes if fits(n, pod)]
    for group in time_bin_order(feasible, pod, now, cycle_seconds):
        chosen = bfd_choose(group, pod)
        if chosen is not None:
            return chosen
    return None


# --------------------------------------------------------------------------------------------------------
# extender scores
# --------------------------------------------------------------------------------------------------------


def to_extender_scores(raw: Mapping[str, float], higher_is_better: bool = True) -> dict[str, int]:
    """Map raw node preferences to the extender range 0..10, *rank-based* (dense ranking).

    The best distinct raw value gets 10, the next 9, ... and everything from the 11th distinct value on
    gets 0. Equal raw values share a score, and raw[a] > raw[b] implies score[a] >= score[b] (reversed
    when ``higher_is_better`` is False).

    Why ranks and not a linear rescale: BFD and time-bin BFD are arg-min policies (seed 000 Alg. 1-2) whose
    raw keys (bytes left over, bin distance) carry no utility magnitude. A linear rescale lets one outlier
    node squash the best few candidates into the same integer, and kube-scheduler then breaks that tie
    with its own spreading plugins — undoing the packing. Ranks keep the chosen node strictly on top
    whenever it is strictly better, at the price of ignoring how much better it is.
    """
    for name, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise InvalidInputError(f"raw score of node {name!r} must be a number, got {value!r}")
    distinct = sorted(set(raw.values()), reverse=higher_is_better)
    rank = {value: i for i, value in enumerate(distinct)}
    return {name: max(0, MAX_EXTENDER_SCORE - rank[value]) for name, value in raw.items()}


def bfd_rank_scores(
    memory_left: npt.NDArray[np.int64], cpu_left: npt.NDArray[np.int64], feasible: npt.NDArray[np.bool_]
) -> npt.NDArray[np.int64]:
    """``score_nodes`` for a service pod under ``cost`` (plain BFD), vectorised over node columns.

    ``memory_left`` / ``cpu_left``: each node's free memory / cpu minus the pod's request (the BFD key of
    ``_bfd_key``); ``feasible``: ``fits``. The same dense rank as ``to_extender_scores`` over the key
    (memory left, cpu left), lower is better: the best distinct key gets 10, the next 9, ..., infeasible 0.
    The prioritize verb calls it with columns kept incrementally (kube.snapshot.NodeTable), so a call costs
    a sort of the feasible nodes instead of building and scanning a Node per candidate.
    """
    scores = np.zeros(len(feasible), np.int64)
    idx = np.flatnonzero(feasible)
    if idx.size == 0:
        return scores
    m, c = memory_left[idx], cpu_left[idx]
    # Only the MAX_EXTENDER_SCORE + 1 best distinct keys score above 0: keep the nodes whose memory left is
    # among the smallest that many distinct values before sorting (a sort of 5,000 keys cost 0.5 ms, most
    # of the verb). Nodes share memory-left values (same flavour, same pods), so the k smallest entries may
    # hold fewer than k distinct values: widen the partition until they do or it covers every node.
    k = MAX_EXTENDER_SCORE + 1
    if idx.size > 8 * k:
        t = k
        while True:
            t = min(t, m.size)
            distinct_m = np.unique(np.partition(m, t - 1)[:t] if t < m.size else m)
            if distinct_m.size >= k:
                keep = m <= distinct_m[k - 1]
                idx, m, c = idx[keep], m[keep], c[keep]
                break
            if t == m.size:
                break  # fewer than k distinct values in all: every feasible node scores
            t *= 4
    order = np.lexsort((c, m))
    ms, cs = m[order], c[order]
    new = np.ones(order.size, np.bool_)
    new[1:] = (ms[1:] != ms[:-1]) | (cs[1:] != cs[:-1])
    rank = np.cumsum(new) - 1
    scores[idx[order]] = np.maximum(0, MAX_EXTENDER_SCORE - rank)
    return scores


def _cost_rank_keys(
    nodes: Sequence[Node], pod: Pod, now: float, cycle_seconds: float
) -> dict[str, tuple[int, int, int]]:
    """Total order behind BFD / time-bin BFD for feasible nodes: (bin search position, memory left, cpu left).

    Lower is better; the first element is 0 for every node when the pod is a service (plain BFD).
    """
    batch = pod.kind is WorkloadKind.BATCH
    groups = time_bin_order(nodes, pod, now, cycle_seconds) if batch else [list(nodes)]
    keys: dict[str, tuple[int, int, int]] = {}
    for position, group in enumerate(groups):
        for node in group:
            if fits(node, pod):
                keys[node.name] = (position, *_bfd_key(node, pod))
    return keys


def score_nodes(profile: str, nodes: Sequence[Node], pod: Pod, now: float, cycle_seconds: float) -> dict[str, int]:
    """The prioritize verb: an extender score 0..10 for every node (0 for nodes the pod does not fit on).

    * ``cost``: services by BFD (seed 000 Alg. 1), batch pods by time-bin BFD (Alg. 2);
    * ``spread``: services by kube-scheduler's LeastAllocated (seed 004 Alg. 1, LRP); batch pods still by
      time-bin BFD, because batch nodes must drain together to be removable whatever the service profile.
    Under BFD / time-bin BFD the node ``bfd_choose`` / ``time_bin_bfd_choose`` would pick always gets 10.
    Node-group matching is the filter verb's job: pass the nodes of the pod's group.
    """
    if profile not in PROFILES:
        raise InvalidInputError(f"unknown profile {profile!r} (expected one of {sorted(PROFILES)})")
    _check_now(now)
    _check_cycle(cycle_seconds)
    _check_unique_names(nodes)
    scores = {node.name: 0 for node in nodes}
    if profile == "spread" and pod.kind is not WorkloadKind.BATCH:
        raw: dict[str, float] = {n.name: float(least_allocated_score(n, pod)) for n in nodes if fits(n, pod)}
        scores.update(to_extender_scores(raw, higher_is_better=True))
        return scores
    keys = _cost_rank_keys(nodes, pod, now, cycle_seconds)
    # Dense rank of the key tuple (ties only when position, memory and cpu left are all equal).
    order = {key: i for i, key in enumerate(sorted(set(keys.values())))}
    scores.update(to_extender_scores({name: float(order[k]) for name, k in keys.items()}, higher_is_better=False))
    return scores


# --------------------------------------------------------------------------------------------------------
# offline packing (simulator, autoscaler what-ifs)
# --------------------------------------------------------------------------------------------------------


def _time_bin_pod_order(pods: Iterable[Pod], now: float) -> list[Pod]:
    # Seed 000 §4.3 (1) "batch jobs are sorted by their runtime in descending order" and §5.1 "scheduled
    # starting from the longest task"; BFD's decreasing size order breaks runtime ties (stable sort).
    return sorted(bfd_sort(pods), key=lambda p: -p.remaining_runtime(now))


def pack(
    pods: Sequence[Pod], nodes: Sequence[Node], now: float, cycle_seconds: float, strategy: str
) -> tuple[dict[str, str], list[Pod]]:
    """Place ``pods`` one after another onto ``nodes``, each placement seeing the previous ones.

    Strategies:
    * ``bfd``: pods in ``bfd_sort`` order, each on ``bfd_choose`` (seed 000 Alg. 1);
    * ``time-bin-bfd``: longest remaining runtime first (ties in ``bfd_sort`` order); batch pods on
      ``time_bin_bfd_choose`` (Alg. 2), services on ``bfd_choose``;
    * ``least-allocated``: pods in the given (queue) order, each on the feasible node with the highest
      LeastAllocated score (seed 004 Alg. 1), ties by name;
    * ``k8s-default``: like ``least-allocated`` with LeastAllocated + BalancedAllocation.
    Returns (pod key -> node name, pods that fit nowhere, in placement order). Never over-commits a node:
    every placement goes through ``fits`` against the updated node.
    """
    if strategy not in STRATEGIES:
        raise InvalidInputError(f"unknown packing strategy {strategy!r} (expected one of {sorted(STRATEGIES)})")
    _check_now(now)
    _check_cycle(cycle_seconds)
    _check_unique_names(nodes)
    keys = [p.key for p in pods]
    if len(set(keys)) != len(keys):
        raise InvalidInputError("duplicate pod keys in the batch to pack")

    working: dict[str, Node] = {n.name: n for n in nodes}
    if strategy == "bfd":
        ordered = bfd_sort(pods)
    elif strategy == "time-bin-bfd":
        ordered = _time_bin_pod_order(pods, now)
    else:
        ordered = list(pods)

    placed: dict[str, str] = {}
    unplaced: list[Pod] = []
    for pod in ordered:
        current = list(working.values())
        chosen: Node | None
        if strategy == "bfd":
            chosen = bfd_choose(current, pod)
        elif strategy == "time-bin-bfd":
            if pod.kind is WorkloadKind.BATCH:
                chosen = time_bin_bfd_choose(current, pod, now, cycle_seconds)
            else:
                chosen = bfd_choose(current, pod)
        else:
            score = least_allocated_score if strategy == "least-allocated" else k8s_default_score
            feasible = [n for n in current if fits(n, pod)]
            chosen = min(feasible, key=lambda n: (-score(n, pod), n.name)) if feasible else None
        if chosen is None:
            unplaced.append(pod)
            continue
        working[chosen.name] = chosen.with_pod(pod)
        placed[pod.key] = chosen.name
    return placed, unplaced
