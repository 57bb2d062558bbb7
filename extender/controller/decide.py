"""One pass of the QoS controller as a pure function: (world, accounts, now) -> effects.

This is paper 002 Algorithm 1 with kube-scheduler doing the binding: recompute Q for every request, walk the
gated pods in increasing Q (``qos.queue_order``), and for each one find the hosts where it fits, possibly after
preemption (``qos.feasibility``), pick one (``qos.rank_hosts`` with ``packing.k8s_default_score`` as the
allocation score), and emit "evict these victims, then release this pod pinned to that host". The
simulator's QoS policies call this very function (``extender.sim.engine.Simulator._schedule_qos``), so the
policy measured there is the policy run here.

No I/O, no clock: the async shell (``extender.controller.loop``) builds the World from the snapshot and the
accounts and applies the effects with the Kubernetes API.

Time compression: measured durations are multiplied by ``compression`` when Instances are built, so a replay
sped up by c takes the decisions the real-time replay would take with the policy's (workload-second) alpha,
margins, quantum and hysteresis. Q values in effects are therefore in workload seconds.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from extender.controller.accounting import Account
from extender.core import packing, qos, slack
from extender.core.model import InvalidInputError, Node, Pod, Resources, WorkloadKind

__all__ = [
    "Decision",
    "Evict",
    "GatedPod",
    "PinnedWait",
    "Release",
    "Settings",
    "World",
    "decide",
    "preemption_reason",
    "stuck_pins",
]


@dataclass(frozen=True, slots=True)
class GatedPod:
    """A pod held by our scheduling gate. ``request`` is its request id (owner, or the pod key when bare)."""

    pod: Pod
    request: str
    gated_since: float
    node_selector: Mapping[str, str] = field(default_factory=dict)
    # the nodes it may be pinned to: its node group's, less those with a taint it does not tolerate (None: any node)
    eligible_nodes: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class World:
    """What one pass sees.

    nodes: every node with the pods occupying it — bound pods, plus released pods not bound yet on the node
        they are pinned to, minus victims already being evicted (their space is promised).
    running: pod key -> request id of the QoS-managed pods bound on ``nodes`` (the preemption candidates;
        any other pod on a node is never a victim: we know nothing of its SLO).
    gated: the pods waiting behind our gate.
    accounts: request id -> Account (every request in ``running`` and ``gated`` should have one).
    """

    nodes: Sequence[Node]
    running: Mapping[str, str]
    gated: Sequence[GatedPod]
    accounts: Mapping[str, Account]
    now: float


@dataclass(frozen=True, slots=True)
class Settings:
    """host_score "least-allocated": kube-scheduler's default resource scores (paper 002's prototype, the
    simulator); "profile": ``packing.score_nodes(profile, ...)``, the prioritize verb's own score, so a pod
    the controller pins lands where the extender would have placed it."""

    compression: float = 1.0
    max_gate_seconds: float = 3600.0  # real seconds (already divided by the compression)
    pin: bool = True
    host_score: str = "least-allocated"
    profile: str = "cost"
    cycle_seconds: float = 300.0


@dataclass(frozen=True, slots=True)
class Evict:
    """Evict ``victim`` to make room for ``for_pod`` on ``node``; the Q values justify it in Events."""

    victim: str
    victim_uid: str
    victim_request: str
    for_pod: str
    node: str
    q_victim: float
    q_pending: float
    reason: str  # qos (base rule) | importance (relaxation i) | peer (relaxation ii)


@dataclass(frozen=True, slots=True)
class Release:
    """Remove the gate of ``pod``; pin it to ``node`` (None: no pin, kube-scheduler chooses)."""

    pod: str
    uid: str
    request: str
    node: str | None
    q: float
    waited: float  # real seconds behind the gate
    victims: tuple[str, ...] = ()
    timeout: bool = False
    priority: bool = False  # handed to kube-scheduler's priority preemption (no QoS room, but a lower priority)


@dataclass(frozen=True, slots=True)
class Decision:
    """The effects of one pass: evictions first, then releases (a release whose victims could not all be
    evicted must be held back by the shell); plus the Q of every request, for metrics."""

    evictions: tuple[Evict, ...]
    releases: tuple[Release, ...]
    q_of_request: Mapping[str, float]
    order: tuple[str, ...]  # gated pod keys in the order they were considered (increasing Q)


def _instance(pod: Pod, acc: Account | None, now: float, c: float) -> qos.Instance:
    remaining = pod.remaining_runtime(now) * c
    if acc is None:
        return qos.Instance(
            pod=pod, running_seconds=0.0, pending_seconds=0.0, admitted=False, remaining_seconds=remaining
        )
    e, p = acc.ep(now)
    return qos.Instance(
        pod=pod,
        running_seconds=e * c,
        pending_seconds=p * c,
        preemptions=acc.preemptions,
        overhead_seconds=acc.overhead * c,
        current_run_seconds=acc.current_run(now) * c,
        admitted=(e + p) > 0,
        remaining_seconds=remaining,
    )


def _facts(pod: Pod, acc: Account | None, now: float, c: float, policy: qos.QosPolicy) -> _Facts | None:
    """(Q, current run, over the overhead cap) of the Instance ``_instance`` would build, by the same arithmetic
    (``qos.instance_q``, ``qos._over_cap``) without building it: one per request per pass was a third of a
    pass on a crowded cluster. None when a value would fail the Instance's checks or take ``qos.q_metric``'s
    path: the caller builds the Instance, which raises the same clear error or computes the same Q."""
    cls = policy.cls(pod.class_name)
    rem = pod.remaining_runtime(now) * c
    if not (type(rem) is float and 0.0 <= rem < math.inf):
        return None
    ahead = rem * (1.0 / cls.slo - 1.0)  # the run still ahead of a batch pod (qos.q_metric's ``remaining``)
    if acc is None:
        return ahead, 0.0, cls.overhead_cap * (1.0 + 1e-9) + 1e-12 < 0.0
    e, p = acc.ep(now)
    run = acc.current_run(now) * c
    es, ps, ov = e * c, p * c, acc.overhead * c
    n = acc.preemptions
    if not (
        type(es) is float
        and type(ps) is float
        and type(ov) is float
        and type(run) is float
        and 0.0 <= es < math.inf
        and 0.0 <= ps < math.inf
        and 0.0 <= ov < math.inf
        and 0.0 <= run < math.inf
        and type(n) is int
        and n >= 0
    ):
        return None
    q = ahead if not (e + p) > 0 or es + ps == 0 else es / cls.slo - (es + ps) - policy.alpha_seconds + ahead
    if n == 0 or ov == 0:
        return q, run, False  # no overhead: under any cap (a class's cap 1 - slo is >= 0)
    overhead = math.inf if es == 0 else ov / es
    return q, run, overhead > cls.overhead_cap * (1.0 + 1e-9) + 1e-12


_Facts = tuple[float, float, bool]


class _Running(Mapping[str, qos.Instance]):
    """The preemption candidates (pod key -> Instance), each Instance built on first use: the pass needs
    every candidate's Q, current run and overhead cap (``facts``, computed without an Instance), but the
    Instance itself only for the nodes ``qos.feasibility`` walks and for the victims."""

    def __init__(self, now: float, c: float) -> None:
        self.now, self.c = now, c
        self._src: dict[str, tuple[Pod, Account | None]] = {}
        self._built: dict[str, qos.Instance] = {}
        self.facts: dict[str, _Facts] = {}

    def add(self, key: str, pod: Pod, acc: Account | None, policy: qos.QosPolicy) -> float:
        """Record a candidate; returns its Q."""
        self._src[key] = (pod, acc)
        facts = _facts(pod, acc, self.now, self.c, policy) if _LAZY_INSTANCES else None
        if facts is None:
            inst = self._built[key] = _instance(pod, acc, self.now, self.c)
            facts = (
                qos.instance_q(inst, policy),
                inst.current_run_seconds,
                qos._over_cap(inst, policy.cls(pod.class_name)),
            )
        self.facts[key] = facts
        return facts[0]

    def __getitem__(self, key: str) -> qos.Instance:
        inst = self._built.get(key)
        if inst is None:
            pod, acc = self._src[key]
            inst = self._built[key] = _instance(pod, acc, self.now, self.c)
        return inst

    def __contains__(self, key: object) -> bool:
        return key in self._src

    def __iter__(self) -> Iterator[str]:
        return iter(self._src)

    def __len__(self) -> int:
        return len(self._src)

    def pods(self) -> Iterator[Pod]:
        return (pod for pod, _ in self._src.values())

    def pod(self, key: str) -> Pod:
        return self._src[key][0]

    def pop(self, key: str) -> qos.Instance:
        inst = self[key]
        del self._src[key]
        self._built.pop(key, None)
        self.facts.pop(key, None)
        return inst


class _AtOrBelow(Mapping[str, qos.Instance]):
    """The candidates of ``running`` whose pod priority is at most ``priority``: what the pass used to copy
    into a dict per gated pod (building every candidate's Instance, a sixth of a pass at 5,000 nodes), as a
    view whose key set is built at the first look-up (most pods take a free host and never look)."""

    def __init__(self, running: _Running, priority: int) -> None:
        self.running, self.priority = running, priority
        self._keys: set[str] | None = None

    def keys_set(self) -> set[str]:
        if self._keys is None:
            self._keys = {k for k in self.running if self.running.pod(k).priority <= self.priority}
        return self._keys

    def __getitem__(self, key: str) -> qos.Instance:
        if key not in self.keys_set():
            raise KeyError(key)
        return self.running[key]

    def __contains__(self, key: object) -> bool:
        return key in self.keys_set()

    def __iter__(self) -> Iterator[str]:
        return (k for k in self.running if k in self.keys_set())

    def __len__(self) -> int:
        return len(self.keys_set())


def preemption_reason(victim: qos.Instance, q_v: float, pending: qos.Instance, policy: qos.QosPolicy) -> str:
    """Which rule of §3.3.1 allowed the preemption (for the metric and the Event): the base rule when the
    victim is at or above its safety margin, else relaxation (i) or (ii)."""
    v_cls = policy.cls(victim.pod.class_name)
    p_cls = policy.cls(pending.pod.class_name)
    if q_v >= v_cls.safety_margin_seconds:
        return "qos"
    return "importance" if p_cls.importance < v_cls.importance else "peer"


def _selects(node: Node, selector: Mapping[str, str]) -> bool:
    return all(node.labels.get(k) == v for k, v in selector.items())


# The pass tests hosts with the numpy table below; False makes it call qos.feasibility on every selected node
# (the reference the table must agree with: tests/test_decide_vectorised.py compares the two).
_VECTORISED = True
# The table's int64 columns, sums and differences stay exact below this; a world with a larger quantity (a node
# or pod declaring exabytes: bad input, not a real cluster) is decided by the exact per-node path instead.
_TABLE_LIMIT = 2**62
# A pod asking at least as much as one proved to fit nowhere in the same pass (same class, no placement since,
# Q at least as high) is refused without testing the nodes; False tests every pod (the reference).
_DOMINANCE = True
# With the prioritize verb's own score (host_score "profile"), a pod that fits some node without preemption is
# scored on the free hosts only (their scores are the same with or without the others); False computes every
# preemption option first (the reference).
_LAZY_PROFILE = True
# The pass computes each request's Q, current run and overhead cap from its Account, building its Instance
# only when the hosts are tested for it or it is a victim; False builds every Instance first (the reference).
_LAZY_INSTANCES = True
# When a gated pod fits some node without preemption, the pass picks the host from node columns (the scores of
# ``k8s_default_scores`` / ``least_allocated_scores`` / the BFD key, best then smallest name, as ``rank_hosts``
# does) instead of building one Feasibility and one per-node score per free host (5,000 of each per gated pod
# at 5,000 nodes); False scores every free host (the reference: tests/test_decide_fast_hosts.py).
_FAST_HOSTS = True
# Node quantities below this keep the vectorised scores exact (x 100 in int64, float64 fractions).
_SCORE_LIMIT = 2**52
# Time bins at or above this (a runtime of 2**40 cycles: bad input) are ranked per node.
_BIN_LIMIT = 2**40


_SKIP_CHUNK = 2048


def _skip_draws(rng: random.Random, n: int) -> None:
    """Advance ``rng`` exactly as ``n`` calls of ``rng.random()`` would: each draw consumes two 32-bit words
    of the Mersenne Twister, and ``getrandbits(64 n)`` consumes 2n words (for a plain ``random.Random``; any
    other generator draws one by one)."""
    if n <= 0:
        return
    if type(rng) is random.Random:
        # in chunks: one getrandbits of millions of bits builds an integer that outgrows the CPU cache (a
        # third slower per draw than chunks of _SKIP_CHUNK draws, which consume the very same words)
        while n > _SKIP_CHUNK:
            rng.getrandbits(64 * _SKIP_CHUNK)
            n -= _SKIP_CHUNK
        rng.getrandbits(64 * n)
    else:
        for _ in range(n):
            rng.random()


class _Hosts:
    """The nodes of one pass as numpy arrays, so testing a pending pod against every node is a few array
    operations instead of one ``qos.feasibility`` call per node.

    Per node: free cpu, memory and pod slots and schedulability. Per preemption candidate (a pod on a node with
    an entry in ``running``, one per key and node as ``qos.feasibility`` counts them): its node, priority,
    requests and what ``qos._may_preempt`` reads (Q, class, current run, overhead cap). A placement updates the
    free space of its node and retires its victims; placed pods are never candidates.

    For one pending pod, ``qos._may_preempt`` is evaluated for every candidate at once, and per node:
      * the pod fits the free space: feasible, no victims, no draw;
      * unschedulable: infeasible, no draw;
      * it does not fit even after freeing every eligible candidate: infeasible, and ``qos.feasibility`` would
        have drawn one random number per candidate (eligible or not), so the rng is advanced by that many;
      * otherwise the greedy victim walk succeeds: ``qos.feasibility`` itself is called for the victims, in
        node order, so the random tie-break sequence is the one the per-node loop consumed. When ``lazy`` and
        some node fits without preemption, the victims are never used (rank_hosts prefers free hosts), so only
        the draws are made.
    """

    def __init__(
        self,
        nodes: Mapping[str, Node],
        running: _Running,
        q_of: Mapping[str, float],
        policy: qos.QosPolicy,
    ) -> None:
        self.names = list(nodes)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.policy = policy
        self.exact = True  # False: some quantity does not fit the int64 table; callers use qos.feasibility
        n = len(self.names)
        self.free = np.zeros((3, n), dtype=np.int64)
        self.unschedulable = np.array([nodes[name].unschedulable for name in self.names], dtype=bool)
        class_names = list(policy.classes)
        self.class_id = {name: i for i, name in enumerate(class_names)}
        self.cls_importance = np.array([policy.classes[c].importance for c in class_names], dtype=np.int64)
        self.cls_margin = np.array([policy.classes[c].safety_margin_seconds for c in class_names], dtype=np.float64)
        node_of: list[int] = []
        keys: list[str] = []
        reqs: list[Resources] = []
        free_rows: list[tuple[int, int, int]] = []
        for i, name in enumerate(self.names):
            node = nodes[name]
            f = node.free
            free_rows.append((f.cpu_milli, f.memory_bytes, f.pods))
            on_node = {p.key: p for p in node.pods if p.key in running}
            node_of.extend([i] * len(on_node))
            keys.extend(on_node)
            reqs.extend(p.requests for p in on_node.values())
        for i, values in enumerate(free_rows):
            if max(map(abs, values)) >= _TABLE_LIMIT:
                self.exact = False
            else:
                self.free[:, i] = values
        # the columns the free-host scores read (kept per node, updated by placed())
        self.scorable = True  # False: some quantity is too large for the vectorised scores; callers score per node
        self.alloc = np.zeros((2, n), dtype=np.int64)
        self.requested = np.zeros((2, n), dtype=np.int64)
        self.non_zero = np.zeros((2, n), dtype=np.int64)
        self.n_pods = np.zeros(n, dtype=np.int64)
        self.alloc_pods = np.zeros(n, dtype=np.int64)
        for i, name in enumerate(self.names):
            self._set_score_columns(i, nodes[name])
        self._nodes = nodes
        # per node: its time bin (packing.time_bin of its remaining runtime) at (now, cycle), -1 where time_bin
        # refuses the value; built at the first batch pod ranked under "cost"
        self._bins: npt.NDArray[np.int64] | None = None
        self._bin_args: tuple[float, float] = (0.0, 1.0)
        self._name_rank: npt.NDArray[np.int64] | None = None
        facts = [running.facts[k] for k in keys]
        inst_pods = [running.pod(k) for k in keys]
        class_of = {name: self.class_id[policy.cls(name).name] for name in {p.class_name for p in inst_pods}}
        space = [[r.cpu_milli for r in reqs], [r.memory_bytes for r in reqs], [r.pods for r in reqs]]
        if any(sum(map(abs, column)) >= _TABLE_LIMIT for column in space):
            self.exact = False
            space = [[0] * len(reqs)] * 3  # the table is not used: keep it constructible
        self.node_of = np.array(node_of, dtype=np.intp)
        self.keys = keys
        self._rows_of_key: dict[str, list[int]] | None = None  # built at the first eviction
        self.priority = np.array([p.priority for p in inst_pods], dtype=np.int64)
        self.space = np.array(space, dtype=np.int64).reshape(3, len(keys))
        self.q = np.array([q_of[k] for k in keys], dtype=np.float64)
        self.cls = np.array([class_of[p.class_name] for p in inst_pods], dtype=np.intp)
        self.current_run = np.array([f[1] for f in facts], dtype=np.float64)
        self.over_cap = np.array([f[2] for f in facts], dtype=bool)
        self.alive = np.ones(len(keys), dtype=bool)
        # candidate rows are grouped by node, in node order: per-node sums are differences of cumulative sums
        self.bounds = np.searchsorted(self.node_of, np.arange(n + 1), side="left")
        self.version = 0  # bumped by every placement: what options() proved holds until then
        self.proof: int | None = None  # set by options(): the draws of a pod it proved fits nowhere, else None

    def rows_of_key(self) -> dict[str, list[int]]:
        """Candidate rows per pod key (a key on two nodes has two rows)."""
        if self._rows_of_key is None:
            self._rows_of_key = {}
            for j, key in enumerate(self.keys):
                self._rows_of_key.setdefault(key, []).append(j)
        return self._rows_of_key

    def _set_score_columns(self, i: int, node: Node) -> None:
        alloc, req = node.allocatable, node.requested
        nz_cpu = nz_mem = 0
        for p in node.pods:
            c, m = packing._non_zero(p.requests)
            nz_cpu += c
            nz_mem += m
        values = (alloc.cpu_milli, alloc.memory_bytes, req.cpu_milli, req.memory_bytes, nz_cpu, nz_mem, alloc.pods)
        if max(abs(v) for v in values) >= _SCORE_LIMIT:
            self.scorable = False
            return
        self.alloc[:, i] = values[0:2]
        self.requested[:, i] = values[2:4]
        self.non_zero[:, i] = values[4:6]
        self.n_pods[i] = len(node.pods)
        self.alloc_pods[i] = alloc.pods

    def _bin(self, node: Node) -> int:
        now, cycle = self._bin_args
        try:
            b = packing.time_bin(node.remaining_runtime(now), cycle)
        except InvalidInputError:
            return -1
        return b if b < _BIN_LIMIT else -1

    def bins(self, now: float, cycle: float) -> npt.NDArray[np.int64]:
        if self._bins is None or self._bin_args != (now, cycle):
            self._bin_args = (now, cycle)
            self._bins = np.array([self._bin(self._nodes[name]) for name in self.names], dtype=np.int64)
        return self._bins

    def _set_free(self, i: int, node: Node) -> None:
        free = node.free
        values = (free.cpu_milli, free.memory_bytes, free.pods)
        if max(abs(v) for v in values) >= _TABLE_LIMIT:
            self.exact = False
            return
        self.free[:, i] = values

    def placed(self, name: str, node: Node, victims: Sequence[str]) -> None:
        """``node`` (called ``name``) now holds the placed pod and no longer ``victims``."""
        self._set_free(self.index[name], node)
        self._set_score_columns(self.index[name], node)
        if self._bins is not None:
            self._bins[self.index[name]] = self._bin(node)
        self.version += 1
        for key in victims:
            for j in self.rows_of_key().get(key, ()):
                self.alive[j] = False

    def _per_node(self, mask: npt.NDArray[np.bool_], values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Sum of ``values`` (k x rows) over the rows in ``mask``, per node: k x n."""
        cs = np.zeros((values.shape[0], values.shape[1] + 1), dtype=np.int64)
        np.cumsum(np.where(mask, values, 0), axis=1, out=cs[:, 1:])
        return cs[:, self.bounds[1:]] - cs[:, self.bounds[:-1]]

    def eligible(self, pending: qos.Instance, q_p: float, threshold: int | None) -> npt.NDArray[np.bool_]:
        """``qos._may_preempt(candidate, ..., pending, q_p, policy)`` for every candidate row."""
        policy = self.policy
        p_cls = policy.cls(pending.pod.class_name)
        p_id = self.class_id[p_cls.name]
        v_imp = self.cls_importance[self.cls]
        v_margin = self.cls_margin[self.cls]
        same = self.cls == p_id
        ok = self.alive.copy()
        if threshold is not None:
            ok &= self.priority <= threshold
        peer_rule = policy.peer_rescue_only and qos.judged_at_completion(pending.pod)  # qos._may_preempt's
        rescue = peer_rule and q_p < p_cls.safety_margin_seconds
        if policy.min_run_quantum_seconds > 0:
            waived = (p_cls.importance < v_imp) & (p_cls.slo >= 1.0 or q_p + policy.alpha_seconds < 0)
            if rescue:
                waived = waived | same
            ok &= ~((self.current_run < policy.min_run_quantum_seconds) & ~waived)
        if policy.overhead_cap:
            ok &= ~(same & self.over_cap)
        if peer_rule and not rescue:
            ok &= ~same
        wait = policy.peer_victim_wait_seconds
        if wait > 0 and not qos.judged_at_completion(pending.pod):
            ok &= ~(same & (self.q - wait < v_margin))
        q_beats = self.q > q_p + np.where(same, policy.q_hysteresis_seconds, 0.0)
        base = self.q >= v_margin
        if not policy.relax_by_importance or q_p >= p_cls.safety_margin_seconds:
            relaxed = np.zeros_like(base)
        else:
            relaxed = (p_cls.importance < v_imp) | ((p_cls.importance == v_imp) & q_beats)
        result: npt.NDArray[np.bool_] = ok & np.where(base, q_beats, relaxed)
        return result

    def free_hosts(
        self, req: Resources, selected: npt.NDArray[np.intp], threshold: int | None, rng: random.Random
    ) -> npt.NDArray[np.intp] | None:
        """The nodes of ``selected`` the pod fits without preemption (in node order), consuming the draws
        ``options`` would with ``lazy``; None when there is none, and then nothing is drawn (call ``options``)."""
        need = np.array([[req.cpu_milli], [req.memory_bytes], [req.pods]], dtype=np.int64)
        free = self.free[:, selected]
        fits: npt.NDArray[np.bool_] = np.asarray((need <= free).all(axis=0))
        schedulable = ~self.unschedulable[selected]
        ok = schedulable & fits
        if not bool(ok.any()):
            return None
        candidate = self.alive if threshold is None else self.alive & (self.priority <= threshold)
        count = self._per_node(candidate[np.newaxis, :], np.ones((1, len(self.keys)), dtype=np.int64))[0]
        self.proof = None
        _skip_draws(rng, int(np.where(schedulable & ~fits, count[selected], 0).sum()))
        return selected[ok]

    def choose_free(self, idx: npt.NDArray[np.intp], pod: Pod, settings: Settings, now: float) -> str | None:
        """The node ``rank_hosts`` picks among the free hosts ``idx`` (each a Feasibility without victims) with
        the pass's allocation score: the best score, then the smallest name. The score is computed on the node
        columns; only its argmax matters. None where this does not model the score exactly (batch pods under
        ``cost``, co-located pods, a bad profile or clock, huge quantities): the caller scores per node."""
        if not self.scorable or idx.size == 0:
            return None
        req = pod.requests
        best: npt.NDArray[np.bool_]
        if settings.host_score != "profile":
            scores = packing.k8s_default_scores(self.alloc[:, idx], self.non_zero[:, idx], self.requested[:, idx], pod)
            best = scores == scores.max()
        else:
            cycle = settings.cycle_seconds
            if (
                settings.profile not in packing.PROFILES
                or slack.slack_demand(req) is not None
                or isinstance(now, bool)
                or not isinstance(now, (int, float))
                or not math.isfinite(now)
                or isinstance(cycle, bool)
                or not isinstance(cycle, (int, float))
                or not math.isfinite(cycle)
                or cycle <= 0
            ):
                return None
            spread = settings.profile == "spread" and pod.kind is not WorkloadKind.BATCH
            position: npt.NDArray[np.int64] | None = None
            if not spread and pod.kind is WorkloadKind.BATCH:
                # time-bin BFD: the pod's own bin first, then greater bins ascending, then lesser descending
                # (packing.time_bin_order); only the order of the positions matters for the best host
                try:
                    own = packing.time_bin(pod.remaining_runtime(now), cycle)
                except InvalidInputError:
                    return None
                bins = self.bins(float(now), float(cycle))[idx]
                if own >= _BIN_LIMIT or bool((bins < 0).any()):
                    return None  # per node: the same bins, or the same error
                position = np.where(bins == own, 0, np.where(bins > own, bins - own, 2 * _BIN_LIMIT + own - bins))
            # packing.fits on these (schedulable, fitting) hosts: the slot count of the bound pods too
            ok = self.n_pods[idx] + 1 <= self.alloc_pods[idx]
            if not bool(ok.any()):
                best = np.ones(idx.size, dtype=bool)  # every host scores 0
            elif spread:
                least = packing.least_allocated_scores(self.alloc[:, idx], self.non_zero[:, idx], pod)
                top = least[ok].max()
                best = ok & (least == top)
            else:
                mem = self.free[1, idx] - req.memory_bytes
                cpu = self.free[0, idx] - req.cpu_milli
                if position is not None:
                    ok &= position == position[ok].min()
                m_top = mem[ok].min()
                best = ok & (mem == m_top)
                c_top = cpu[best].min()
                best &= cpu == c_top
        winners = idx[best]
        if self._name_rank is None:  # rank_hosts breaks ties by the smallest name (str order)
            self._name_rank = np.empty(len(self.names), dtype=np.int64)
            self._name_rank[sorted(range(len(self.names)), key=self.names.__getitem__)] = np.arange(len(self.names))
        return self.names[int(winners[np.argmin(self._name_rank[winners])])]

    def options(
        self,
        inst: qos.Instance,
        q_p: float,
        selected: npt.NDArray[np.intp],
        threshold: int | None,
        nodes: Mapping[str, Node],
        eligible: Mapping[str, qos.Instance],
        rng: random.Random,
        q_of: Mapping[str, float],
        lazy: bool,
    ) -> list[qos.Feasibility]:
        """The feasible options among ``selected`` (node indices, in node order), as the per-node loop of
        ``qos.feasibility`` finds them, consuming the same random draws (with ``lazy``, the preemption options
        are left out when a node fits without preemption)."""
        req = inst.pod.requests
        need = np.array([[req.cpu_milli], [req.memory_bytes], [req.pods]], dtype=np.int64)
        free = self.free[:, selected]
        fits: npt.NDArray[np.bool_] = np.asarray((need <= free).all(axis=0))
        schedulable = ~self.unschedulable[selected]
        candidate = self.alive if threshold is None else self.alive & (self.priority <= threshold)
        count = self._per_node(candidate[np.newaxis, :], np.ones((1, len(self.keys)), dtype=np.int64))[0]
        draws = np.where(schedulable & ~fits, count[selected], 0)
        out: list[qos.Feasibility] = []
        self.proof = None
        if lazy and bool((schedulable & fits).any()):
            _skip_draws(rng, int(draws.sum()))
            return [qos.Feasibility(self.names[i], True, (), (), "") for i in selected[schedulable & fits].tolist()]
        room = self._per_node(self.eligible(inst, q_p, threshold)[np.newaxis, :], self.space)
        maybe = schedulable & ~fits & np.asarray((need <= free + room[:, selected]).all(axis=0))
        todo = np.flatnonzero((schedulable & fits) | maybe)
        if todo.size == 0:
            # fits no node even after freeing every eligible candidate: qos.feasibility would refuse each one
            self.proof = int(draws.sum())
        pending_draws = 0
        done = 0
        for j in todo.tolist():
            pending_draws += int(draws[done:j].sum())
            done = j + 1
            name = self.names[int(selected[j])]
            if fits[j]:
                out.append(qos.Feasibility(name, True, (), (), ""))
                continue
            _skip_draws(rng, pending_draws)
            pending_draws = 0
            opt = qos.feasibility(inst, nodes[name], eligible, self.policy, rng, q_of)
            if opt.feasible:
                out.append(opt)
        _skip_draws(rng, pending_draws + int(draws[done:].sum()))
        return out


def decide(world: World, policy: qos.QosPolicy, settings: Settings, rng: random.Random) -> Decision:
    """Paper 002 Algorithm 1, one pass. Time stands still within it; each placement updates the node model so
    later pods in the queue see the space taken and the victims gone."""
    now, c = world.now, settings.compression
    nodes: dict[str, Node] = {n.name: n for n in world.nodes}
    pods_by_key: dict[str, Pod] = {p.key: p for n in world.nodes for p in n.pods}
    running = _Running(now, c)
    q_of: dict[str, float] = {}
    q_of_request: dict[str, float] = {}
    for key, request in world.running.items():
        pod = pods_by_key.get(key)
        if pod is None:
            continue
        q_of[key] = q_of_request[request] = running.add(key, pod, world.accounts.get(request), policy)

    releases: list[Release] = []
    evictions: list[Evict] = []
    # (Q, importance, key): qos.queue_order's key, with Q computed once; the Instance is built when the pod's
    # hosts are tested (a pod refused by dominance never needs one)
    pending: list[tuple[float, int, str, GatedPod, Account | None]] = []
    gated_by_key: dict[str, GatedPod] = {}
    for g in world.gated:
        if g.pod.key in gated_by_key:
            continue  # a duplicate in the input is a shell bug; never release twice
        waited = max(0.0, now - g.gated_since)
        acc = world.accounts.get(g.request)
        known = _facts(g.pod, acc, now, c, policy) if _LAZY_INSTANCES else None
        q = qos.instance_q(_instance(g.pod, acc, now, c), policy) if known is None else known[0]
        q_of_request.setdefault(g.request, q)
        if waited > settings.max_gate_seconds:
            releases.append(Release(g.pod.key, g.pod.uid, g.request, None, q, waited, timeout=True))
            continue
        gated_by_key[g.pod.key] = g
        pending.append((q, policy.cls(g.pod.class_name).importance, g.pod.key, g, acc))
        q_of[g.pod.key] = q

    order = sorted(pending, key=lambda t: t[:3])
    top_priority = max((pod.priority for pod in running.pods()), default=0)
    # kube-scheduler's preemption only evicts strictly lower priorities: below this nobody can be handed over
    # (a cheap exact guard; the priority check per node is the pass's dearest step on large clusters)
    lowest_priority = min((p.priority for n in world.nodes for p in n.pods), default=None)
    hosts = _Hosts(nodes, running, q_of, policy)
    # Pods proved to fit nowhere since the last placement, per (selector, class, priority threshold): (cpu,
    # memory, pod slots, Q, draws). A later pod of the same class asking at least as much of each, at a Q at
    # least as high, fits nowhere either (the candidates it may preempt are a subset: _Hosts.eligible is
    # monotone in Q), and qos.feasibility draws the same numbers for it; tests/test_decide_vectorised.py.
    refused: dict[tuple[object, ...], list[tuple[int, int, int, float, int]]] = {}
    refused_version = hosts.version
    selected_of: dict[tuple[tuple[tuple[str, str], ...], frozenset[str] | None], npt.NDArray[np.intp]] = {}
    for _q, _importance, _key, g, acc in order:
        pod = g.pod
        inst = _instance(pod, acc, now, c) if not _LAZY_INSTANCES else None
        # QoS preemption is among equals and below: a pod of higher priority is never a QoS victim.
        eligible: Mapping[str, qos.Instance]
        if pod.priority < top_priority:
            eligible = (
                _AtOrBelow(running, pod.priority)
                if _FAST_HOSTS
                else {k: r for k, r in running.items() if r.pod.priority <= pod.priority}
            )
        else:
            eligible = running
        selector = (tuple(sorted(g.node_selector.items())), g.eligible_nodes)
        picked = selected_of.get(selector)
        if picked is None:
            picked = selected_of[selector] = np.array(
                [
                    i
                    for i, n in enumerate(nodes.values())
                    if _selects(n, g.node_selector) and (g.eligible_nodes is None or n.name in g.eligible_nodes)
                ],
                dtype=np.intp,
            )
        feasible: list[qos.Feasibility]
        fast_best: qos.Feasibility | None = None
        req = pod.requests
        if (
            not _VECTORISED
            or not hosts.exact
            or req.extended
            or pod.key in running
            or max(req.cpu_milli, req.memory_bytes, req.pods) >= _TABLE_LIMIT
        ):
            # the table tracks cpu, memory and pod slots only, and assumes the pending pod is no candidate
            inst = inst or _instance(pod, acc, now, c)
            options = [qos.feasibility(inst, nodes[hosts.names[i]], eligible, policy, rng, q_of) for i in picked]
            feasible = [o for o in options if o.feasible]
        else:
            threshold = pod.priority if pod.priority < top_priority else None
            # rank_hosts takes a free host whenever there is one, so the preemption options are only needed when
            # none is free. The prioritize verb's score of a free host does not depend on the non-fitting nodes
            # scored beside it (score_nodes ranks the fitting nodes only, by keys whose order no other node
            # changes); the co-located ranking is left exact (tests/test_decide_vectorised.py compares both).
            lazy = settings.host_score != "profile" or (_LAZY_PROFILE and slack.slack_demand(req) is None)
            q_p = q_of[pod.key]
            if refused_version != hosts.version:
                refused.clear()
                refused_version = hosts.version
            proofs = refused.setdefault((selector, pod.class_name, threshold), [])
            dominated = next(
                (
                    draws
                    for cpu, mem, slots, q_r, draws in proofs
                    if cpu <= req.cpu_milli and mem <= req.memory_bytes and slots <= req.pods and q_r <= q_p
                ),
                None,
            )
            if dominated is not None and _DOMINANCE:
                _skip_draws(rng, dominated)
                feasible = []
            else:
                inst = inst or _instance(pod, acc, now, c)
                free_idx = hosts.free_hosts(req, picked, threshold, rng) if _FAST_HOSTS and lazy else None
                chosen = hosts.choose_free(free_idx, pod, settings, now) if free_idx is not None else None
                if chosen is not None:
                    fast_best = qos.Feasibility(chosen, True, (), (), "")
                    feasible = [fast_best]
                elif free_idx is not None:
                    feasible = [qos.Feasibility(hosts.names[i], True, (), (), "") for i in free_idx.tolist()]
                else:
                    feasible = hosts.options(inst, q_p, picked, threshold, nodes, eligible, rng, q_of, lazy)
                if hosts.proof is not None:
                    proofs.append((req.cpu_milli, req.memory_bytes, req.pods, q_p, hosts.proof))
        if not feasible:
            # Priority beats Q: where kube-scheduler could make room by preempting strictly lower-priority pods
            # (which it does, with the preempt verb narrowing its victims), hand the pod over unpinned.
            if (
                lowest_priority is not None
                and lowest_priority < pod.priority
                and any(qos.priority_feasibility(pod, nodes[hosts.names[i]], policy).feasible for i in picked.tolist())
            ):
                releases.append(
                    Release(
                        pod.key,
                        pod.uid,
                        g.request,
                        None,
                        q_of[pod.key],
                        max(0.0, now - g.gated_since),
                        priority=True,
                    )
                )
            continue
        scores: dict[str, float]
        demand = slack.slack_demand(pod.requests)
        if fast_best is not None:
            scores = {}  # the host is chosen already (the only option)
        elif settings.host_score == "profile" and demand is not None:
            # a co-located pod: pinned where the prioritize verb puts it, LRP on the published prediction
            ranked = slack.colocated_scores(
                [(o.node, nodes[o.node].allocatable, nodes[o.node].requested) for o in feasible], demand
            )
            scores = {name: float(v) for name, v in ranked.items()}
        elif settings.host_score == "profile":
            ranked = packing.score_nodes(
                settings.profile, [nodes[o.node] for o in feasible], pod, now, settings.cycle_seconds
            )
            scores = {name: float(v) for name, v in ranked.items()}
        else:
            scores = {o.node: packing.k8s_default_score(nodes[o.node], pod) for o in feasible}
        best = qos.rank_hosts(feasible, scores)
        if best is None:
            continue
        assert inst is not None  # feasible options come from testing the hosts, which built it
        q_p = q_of[pod.key]
        for key in best.victims:
            victim = running.pop(key)
            q_v = q_of.pop(key)
            evictions.append(
                Evict(
                    key,
                    victim.pod.uid,
                    world.running[key],
                    pod.key,
                    best.node,
                    q_v,
                    q_p,
                    preemption_reason(victim, q_v, inst, policy),
                )
            )
        placed = replace(pod, started_at=None, node_name=best.node)
        nodes[best.node] = nodes[best.node].without_pods(best.victims).with_pod(placed)
        hosts.placed(best.node, nodes[best.node], best.victims)
        if lowest_priority is None or placed.priority < lowest_priority:
            lowest_priority = placed.priority
        releases.append(
            Release(
                pod.key,
                pod.uid,
                g.request,
                best.node if settings.pin else None,
                q_p,
                max(0.0, now - g.gated_since),
                tuple(best.victims),
            )
        )
    return Decision(tuple(evictions), tuple(releases), q_of_request, tuple(t[2] for t in order))


# ------------------------------------------------------------------------------------------------------------
# pinned pods whose host lost its room
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PinnedWait:
    """A released pod pinned to ``node`` that kube-scheduler has found Unschedulable for ``waited`` seconds."""

    pod: Pod
    node: str
    waited: float


def stuck_pins(waiting: Sequence[PinnedWait], nodes: Mapping[str, Node], after_seconds: float) -> list[str]:
    """The pinned pods to put back in the queue: Unschedulable for at least ``after_seconds`` while their host is
    gone or no longer fits them counting only the pods bound there.

    The controller pins a released pod to the host it chose (required node affinity on metadata.name), and that
    affinity is immutable once the gate is off. Pods of other schedulers are invisible to its choice until
    bound: the default profile can fill the chosen host first (a pending default-scheduler pod and our release
    landing on the node cluster-autoscaler just bought), or the node can go. Such a pod never binds, and under
    cluster-autoscaler it is never bought for either (it consumes a ProvisioningRequest). ``after_seconds`` is
    the patience for the ordinary reasons a pinned pod waits (victims still terminating are counted gone by
    the caller's node views, so they do not make a host look full); a host that still fits the pod keeps it
    (kube-scheduler will bind it: its own back-off, not lost room)."""
    out: list[str] = []
    for w in waiting:
        if w.waited < after_seconds:
            continue
        node = nodes.get(w.node)
        if node is None or not packing.fits(node, w.pod):
            out.append(w.pod.key)
    return out
