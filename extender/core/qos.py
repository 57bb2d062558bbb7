"""QoS-driven scheduling decisions (paper 002, da Silva et al. 2020): availability, Q, preemption, ranking.

Everything here is a pure function of plain frozen dataclasses: time enters only as the accumulated running
time ``e`` and pending time ``p`` of an instance (Eq. 1), never as a clock read, so the webhook, the QoS
controller and the simulator reach the same decision from the same state. The Kubernetes priority-based
scheduler the paper compares against (§4.1.2) lives here too, so the simulator's baseline uses exactly the same
fit arithmetic as our policy and a comparison measures the policies, not two implementations of "fits".

Notation (paper 002 §3): sigma = class availability SLO, e = accumulated running time, p = accumulated pending
time, alpha = expected allocation time, phi = class safety margin, Q = QoS metric (§3.2).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from extender.core.model import DEFAULT_CLASSES, InvalidInputError, Node, Pod, Resources, ServiceClass, WorkloadKind

__all__ = [
    "Feasibility",
    "Instance",
    "QosPolicy",
    "availability",
    "feasibility",
    "gini",
    "instance_q",
    "judged_at_completion",
    "may_preempt",
    "narrow_victims",
    "penalty_fraction",
    "preemption_cost",
    "preemption_overhead",
    "priority_feasibility",
    "priority_queue_order",
    "q_metric",
    "queue_order",
    "rank_hosts",
    "recoverability",
    "request_penalty",
    "time_to_violate",
]


# --------------------------------------------------------------------------------------------- validation


def _finite_nonneg(name: str, value: float) -> float:
    """Reject NaN, infinities, negatives and non-numbers: a NaN compares false with everything, so it would
    silently make an instance look neither preemptible nor protected instead of failing loudly."""
    if type(value) is float and 0.0 <= value < math.inf:
        return value  # the common case in one comparison (NaN and inf fail it and get their message below)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise InvalidInputError(f"{name} must be finite, got {value!r}")
    if value < 0:
        raise InvalidInputError(f"{name} must not be negative, got {value!r}")
    return float(value)


def _check_slo(slo: float) -> float:
    if type(slo) is float and 0.0 < slo <= 1.0:
        return slo  # the common case (NaN fails the comparison and gets its message below)
    if isinstance(slo, bool) or not isinstance(slo, (int, float)) or not math.isfinite(slo):
        raise InvalidInputError(f"slo must be a finite number, got {slo!r}")
    if not 0.0 < slo <= 1.0:
        raise InvalidInputError(f"slo must be in (0, 1], got {slo!r}")
    return float(slo)


def _check_availability(value: float) -> float:
    value = _finite_nonneg("availability", value)
    if value > 1.0:
        raise InvalidInputError(f"availability must be in [0, 1], got {value!r}")
    return value


# ------------------------------------------------------------------------------------------------ policy

# Production anti-thrashing defaults (QosPolicy itself defaults to the paper's 0 / 0). Chosen by measurement in
# the simulator on paper 002's validation 1 (extender/sim/README.md has the sweep): 2,706 preemptions/hour
# instead of 16,265 and bronze min availability 0.4936 instead of 0.4138, silver min 0.8976, gold min 0.9994.
RECOMMENDED_QUANTUM_SECONDS = 120.0
RECOMMENDED_HYSTERESIS_SECONDS = 90.0
# The shipped product autoscales: a preempted service waits for a node the autoscaler buys, one expected lag
# (autoscaler.lag.default_seconds, 120 s) plus one scan period (autoscaler.scan_interval_seconds, 30 s) per node;
# twice that, because the first node bought for a victim goes to a more urgent (lower-Q) newer arrival when one is
# waiting (measured: victims waited 210-227 s with 150 s; issue 33 part 2, sim/README.md).
RECOMMENDED_PEER_VICTIM_WAIT_SECONDS = 2 * (120.0 + 30.0)


def _default_classes() -> Mapping[str, ServiceClass]:
    return DEFAULT_CLASSES


@dataclass(frozen=True, slots=True)
class QosPolicy:
    """The knobs of the QoS-driven scheduler (paper 002 §3.3, §4.1.3).

    The two anti-thrashing knobs default to 0, i.e. exactly the paper's behaviour; production values are
    chosen by measurement in the simulator and live in config, not here.

    classes: the service classes by name (keys must equal ``ServiceClass.name``).
    alpha_seconds: expected allocation time alpha, subtracted in Eqs. 4 and 7.
    min_run_quantum_seconds: a running instance whose current run is younger than this is not preemptible,
        except by a more important class that is violating its SLO or promises 100 % (not in the paper;
        bounds how often one instance can be bounced; see may_preempt for the measurements).
    q_hysteresis_seconds: a Q comparison between a victim and a pending instance of the same class requires
        Q_victim > Q_pending + this (not in the paper; stops two peers with nearly equal Q swapping on every
        scheduler pass).
    overhead_cap: enforce the preemption-overhead limit 1 - sigma on same-class preemption (Eq. 8, §4.1.3).
    relax_by_importance: apply the two importance relaxations of §3.3.1 below the safety margins.
    peer_rescue_only: a pending batch pod with a declared runtime preempts a peer of its own class only when
        its own Q (the margin at completion, ``q_metric``) is below its class's safety margin, i.e. when it is
        about to miss its SLO (not in the paper; False gives its rule). The paper lets any peer with a lower Q
        take the room, which evens Q out across the class: on Alibaba 2017 (one class) that bounced hour-long
        tasks a dozen times each for peers that could still wait, and each restart took the room of the next
        short task (sim/README.md, issue 33). The safety margin is already the paper's "about to violate" line
        for victims; this applies it to the instance asking. Services keep the paper's rule: their availability
        is measured as they go, and evening Q out among peers is what holds each one at sigma (validation 1
        with services held to it too: bronze min 0.4855 instead of 0.4935). Preemption across classes is
        unchanged. A rescue is not held back by ``min_run_quantum_seconds`` (as a violating more important
        class is not): a task of a few seconds cannot wait two minutes for a peer's run to age, and the
        hysteresis still asks the victim for ``q_hysteresis_seconds`` more margin than the rescued pod has
        (first 5,000 Alibaba tasks: bronze SLO met 95.6 -> 97.6 %, preemptions 1,930 -> 2,182).
    peer_victim_wait_seconds: how long a preempted pod expects to wait for room again (in an autoscaled
        cluster: the autoscaler's node lag plus its scan period, twice when newer arrivals queue ahead of the
        victim; 0: the paper's rule). A pending pod measured
        as it goes (a service: not ``judged_at_completion``) preempts a peer of its own class only if the
        victim keeps Q_victim - this >= its safety margin, i.e. the victim can wait for the next node without
        falling below its margin (not in the paper). The paper's Q of a service is its margin so far, so a
        service that has waited a minute for a node and never ran looks as urgent as one about to miss, and
        took the room of a peer that then waited as long for a node itself and ended under its SLO (HTAS seeds,
        issue 33, sim/README.md). On a fixed cluster the victim gets room back only by the QoS rules
        themselves, and paper 002's validation 1 needs the peers to even out: leave it 0 there.
    """

    classes: Mapping[str, ServiceClass] = field(default_factory=_default_classes)
    alpha_seconds: float = 2.0
    min_run_quantum_seconds: float = 0.0
    q_hysteresis_seconds: float = 0.0
    overhead_cap: bool = True
    relax_by_importance: bool = True
    peer_rescue_only: bool = False
    peer_victim_wait_seconds: float = 0.0
    _levels: tuple[int, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        _finite_nonneg("alpha_seconds", self.alpha_seconds)
        _finite_nonneg("min_run_quantum_seconds", self.min_run_quantum_seconds)
        _finite_nonneg("q_hysteresis_seconds", self.q_hysteresis_seconds)
        _finite_nonneg("peer_victim_wait_seconds", self.peer_victim_wait_seconds)
        if not self.classes:
            raise InvalidInputError("a QoS policy needs at least one service class")
        for key, cls in self.classes.items():
            if not isinstance(cls, ServiceClass):
                raise InvalidInputError(f"class {key!r} must be a ServiceClass, got {type(cls).__name__}")
            if key != cls.name:
                raise InvalidInputError(f"class registered as {key!r} is named {cls.name!r}")
        # A read-only private copy: a caller mutating its dict later must not change decisions retroactively.
        object.__setattr__(self, "classes", MappingProxyType(dict(self.classes)))
        # asked for every preemption option of every pass: computed once (the classes are frozen above)
        object.__setattr__(self, "_levels", tuple(sorted({c.importance for c in self.classes.values()})))

    def cls(self, name: str) -> ServiceClass:
        """The class called ``name``; an unknown class is an input error, never a silent default, because
        guessing a class would hand out (or take away) an SLO nobody promised."""
        try:
            return self.classes[name]
        except KeyError:
            known = ", ".join(sorted(self.classes))
            raise InvalidInputError(f"unknown service class {name!r} (known: {known})") from None

    def importance_levels(self) -> tuple[int, ...]:
        """Distinct importance values, most important (smallest number) first: the s^1..s^m slots of Eq. 9."""
        return self._levels


# ---------------------------------------------------------------------------------------------- instance


@dataclass(frozen=True, slots=True)
class Instance:
    """The QoS state of one request's instance at decision time (paper 002 §3.1).

    e and p are accumulated since the request's admission and survive the pod being preempted and
    recreated (the SLO is promised to the request, not to the pod). Validation happens here, at the edge,
    so every function below can trust its numbers.

    pod: pod.key identifies it, pod.class_name its class, pod.requests its size, pod.node_name where it runs.
    running_seconds: e, accumulated running time since admission.
    pending_seconds: p, accumulated pending time since admission.
    preemptions: n in Eq. 8.
    overhead_seconds: sum of the measured allocation times alpha^m, m = 1..n (Eq. 8).
    current_run_seconds: length of the current run (for the anti-thrashing quantum); 0 when pending.
    admitted: False for a request not yet admitted; such a request (like a brand-new one) has Q = 0 (§3.4).
    remaining_seconds: run time still ahead of a batch pod that declares its runtime
        (``Pod.remaining_runtime``); 0 for services and unknown runtimes. Q counts it as running time the
        request will accrue (``q_metric``): without it a 5-second task and a 5-hour task that waited equally
        long are equally urgent, and the short one misses its SLO first (issue 33).
    """

    pod: Pod
    running_seconds: float
    pending_seconds: float
    preemptions: int = 0
    overhead_seconds: float = 0.0
    current_run_seconds: float = 0.0
    admitted: bool = True
    remaining_seconds: float = 0.0

    def __post_init__(self) -> None:
        if (
            type(self.running_seconds) is float
            and type(self.pending_seconds) is float
            and type(self.overhead_seconds) is float
            and type(self.current_run_seconds) is float
            and type(self.remaining_seconds) is float
            and 0.0 <= self.running_seconds < math.inf
            and 0.0 <= self.pending_seconds < math.inf
            and 0.0 <= self.overhead_seconds < math.inf
            and 0.0 <= self.current_run_seconds < math.inf
            and 0.0 <= self.remaining_seconds < math.inf
            and type(self.preemptions) is int
            and self.preemptions >= 0
        ):
            return  # the common case, checked in one go (the controller builds one per request per pass)
        who = f"instance {self.pod.key}"
        _finite_nonneg(f"{who}: running_seconds (e)", self.running_seconds)
        _finite_nonneg(f"{who}: pending_seconds (p)", self.pending_seconds)
        _finite_nonneg(f"{who}: overhead_seconds", self.overhead_seconds)
        _finite_nonneg(f"{who}: current_run_seconds", self.current_run_seconds)
        _finite_nonneg(f"{who}: remaining_seconds", self.remaining_seconds)
        if isinstance(self.preemptions, bool) or not isinstance(self.preemptions, int) or self.preemptions < 0:
            raise InvalidInputError(f"{who}: preemptions must be a non-negative integer, got {self.preemptions!r}")

    @property
    def key(self) -> str:
        return self.pod.key


# ------------------------------------------------------------------------------------------- QoS metrics


def availability(e: float, p: float) -> float:
    """Eq. 1: A = e / (e + p).

    A request with e + p == 0 has not yet been denied anything, so it is at 100 % (and Eq. 3 then gives
    V = 0, consistent with §3.4 setting Q = 0 at admission).
    """
    e = _finite_nonneg("e", e)
    p = _finite_nonneg("p", p)
    total = e + p
    return 1.0 if total == 0 else e / total


def _margin(e: float, p: float, slo: float) -> float:
    """The common right-hand side of Eqs. 3 and 6: e / sigma - (e + p), the time margin to the SLO (positive:
    time to violate; negative: recoverability). Not "slack": in this code base slack is a service's idle
    capacity (paper 004, core/slack.py)."""
    e = _finite_nonneg("e", e)
    p = _finite_nonneg("p", p)
    return e / _check_slo(slo) - (e + p)


def time_to_violate(e: float, p: float, slo: float) -> float:
    """Eq. 3: V = e / sigma - (e + p), how long the instance could still wait before A drops to sigma.

    Eq. 3 is only defined for A >= sigma, where it is >= 0; the paper states V "will never assume a negative
    value". For an instance already below its SLO we return 0 (it has no time left) rather than raising, so
    callers can ask without first computing A. time_to_violate + recoverability == the Eq. 3/6 formula.
    """
    return max(0.0, _margin(e, p, slo))


def recoverability(e: float, p: float, slo: float) -> float:
    """Eq. 6: R = e / sigma - (e + p), minus the time spent pending since the SLO was violated.

    Same formula as Eq. 3 but defined for A < sigma, where it is negative (the paper: R "will always assume
    negative values"). For an instance at or above its SLO nothing has been pending since a violation, so we
    return 0 there: the two functions partition the formula's range.
    """
    return min(0.0, _margin(e, p, slo))


def judged_at_completion(pod: Pod) -> bool:
    """A batch pod that declares its runtime: its availability counts when it completes, so its Q includes the
    run still ahead (``q_metric``'s ``remaining``) and ``QosPolicy.peer_rescue_only`` applies to it. A service
    (or a batch pod without an estimate) is measured as it goes: the paper's Q and rules."""
    return pod.kind is WorkloadKind.BATCH and pod.runtime_seconds is not None


def q_metric(e: float, p: float, slo: float, alpha: float, remaining: float = 0.0) -> float:
    """The QoS metric Q (§3.2): V* = V - alpha (Eq. 4) when A >= sigma, else R* = R - alpha (Eq. 7).

    Both branches reduce to e / sigma - (e + p) - alpha, so no branch is needed. A brand-new request
    (e + p == 0) gets Q = 0 as Algorithm 1 line 3 prescribes, not -alpha: the paper puts new arrivals at
    neutral urgency rather than ahead of every instance that has some margin left.

    ``remaining`` (ours, issue 33): the run time still ahead of a batch pod with a declared runtime. The paper's
    Q is the margin of the availability so far, as if the request were measured now; a batch request is measured
    when it completes, after running ``remaining`` more seconds, and each of those seconds buys 1 / sigma - 1
    seconds of waiting it may still afford. So Q is the margin at completion: (e + remaining) / sigma -
    (e + remaining + p) - alpha = the paper's Q + remaining * (1 / sigma - 1). Services (remaining 0) keep the
    paper's Q exactly. Measured on Alibaba 2017 (all bronze batch, sim/README.md): with the paper's Q every
    pending task that has waited as long is as urgent whatever its length, so the 2-10 s tasks waited behind
    hour-long ones for room, and bronze met its SLO for fewer requests than under default Kubernetes.
    """
    alpha = _finite_nonneg("alpha", alpha)
    remaining = _finite_nonneg("remaining", remaining)
    ahead = remaining * (1.0 / _check_slo(slo) - 1.0)
    margin = _margin(e, p, slo)
    if e + p == 0:
        return ahead
    return margin - alpha + ahead


def instance_q(inst: Instance, policy: QosPolicy) -> float:
    """Q of an instance under ``policy``; an unknown class raises, a not-yet-admitted request has the Q of a
    brand-new one (``q_metric`` with e = p = 0: 0, plus the run ahead of a batch pod with a runtime)."""
    cls = policy.cls(inst.pod.class_name)
    # q_metric's arithmetic without its checks: an Instance's times, a class's slo and a policy's alpha were
    # validated when they were built (one call per request per controller pass)
    ahead = inst.remaining_seconds * (1.0 / cls.slo - 1.0)
    if not inst.admitted:
        return ahead
    e, p = inst.running_seconds, inst.pending_seconds
    if type(e) is float and type(p) is float:
        if e + p == 0:
            return ahead
        return e / cls.slo - (e + p) - policy.alpha_seconds + ahead
    return q_metric(e, p, cls.slo, policy.alpha_seconds, inst.remaining_seconds)


def preemption_overhead(inst: Instance) -> float:
    """Eq. 8: O = (sum_{m=1..n} alpha^m) / e, allocation time spent per second of useful run.

    The sum runs over the n preemptions (the first allocation is the cost of running at all, not of being
    preempted), so n == 0 gives 0 whatever ``overhead_seconds`` says. For e == 0 with overhead paid we return
    +inf: the limit of Eq. 8 as e -> 0+, and the instance has indeed paid overhead for no useful work, so the
    cap protects it from same-class preemption until it has run long enough to amortise it. With nothing paid
    and e == 0 the overhead is 0.
    """
    if inst.preemptions == 0 or inst.overhead_seconds == 0:
        return 0.0
    if inst.running_seconds == 0:
        return math.inf
    return inst.overhead_seconds / inst.running_seconds


def _order_key(inst: Instance, policy: QosPolicy) -> tuple[float, int, str]:
    return (instance_q(inst, policy), policy.cls(inst.pod.class_name).importance, inst.pod.key)


def queue_order(pending: Iterable[Instance], policy: QosPolicy) -> list[Instance]:
    """Sort the pending queue by increasing Q (§3.3, Algorithm 1 line 20): most urgent first.

    The paper leaves ties open; we break them by class importance (more important first, in the spirit of
    §3.3.1) and then by pod key, which makes this a total order: the result does not depend on input order.
    Two instances with the same key would make that impossible (and mean the caller double-counted a pod),
    so they raise.
    """
    items = list(pending)
    seen: set[str] = set()
    for inst in items:
        if inst.pod.key in seen:
            raise InvalidInputError(f"pod {inst.pod.key} appears twice in the pending queue")
        seen.add(inst.pod.key)
    return sorted(items, key=lambda inst: _order_key(inst, policy))


def _over_cap(inst: Instance, cls: ServiceClass) -> bool:
    """Eq. 8 overhead "surpassing" the 1 - sigma limit (§4.1.3). 1 - 0.9 is 0.09999999999999998 in binary
    floating point, so a relative tolerance keeps an overhead of exactly 10 % from counting as surpassing."""
    return preemption_overhead(inst) > cls.overhead_cap * (1.0 + 1e-9) + 1e-12


def may_preempt(victim: Instance, pending: Instance, policy: QosPolicy) -> bool:
    """May running ``victim`` be preempted for ``pending``? (§3.3.1, Eq. 8 cap, our anti-thrashing knobs.)

    Checked in this order, each a veto or a grant:
      1. quantum (ours): a victim whose current run is younger than ``min_run_quantum_seconds`` is not
         preemptible; otherwise Q alone could bounce an instance every pass. Exception: a more important
         pending class that promises 100 % or is already violating its SLO (Q_p + alpha < 0, i.e.
         A < sigma) passes. Measured on validation 1 (sim/README.md): a quantum blocking everyone cut gold's
         minimum to 0.967; one waived for any more important class let silver over-achieve (mean 0.907)
         at bronze's expense; waiving it only for violating classes kept silver at its SLO.
      2. overhead cap (§3.5.2, §4.1.3): same class and O_victim (Eq. 8) > 1 - sigma -> no. "Surpassing" the
         limit blocks, reaching it does not, so a gold instance (cap 0) can be preempted by gold only
         while it has never been preempted.
         Rescue only (ours, ``peer_rescue_only``): same class, Q_pending >= phi_pending and the pending pod
         is judged at completion (a batch pod with a runtime) -> no; below phi_pending (a rescue) the
         quantum of step 1 is waived.
         Victim's wait (ours, ``peer_victim_wait_seconds`` = w > 0): same class and the pending pod is
         measured as it goes (not judged at completion) -> no unless Q_victim - w >= phi_victim.
      3. base rule (§3.3.1): Q_victim > Q_pending and Q_victim >= phi_victim (the safety margin).
      4. relaxations (§3.3.1), only when both are below their margins (Q_k < phi_k and Q_j < phi_j):
         (i) pending's class is more important than victim's, or (ii) equally important and
         Q_pending < Q_victim.
    Hysteresis (ours) tightens the Q comparisons (3 and 4-ii) to Q_victim > Q_pending + h between
    instances of the SAME class only: peers swapping places is pure churn, whereas a preemption across
    classes moves capacity to the class the Q metric says needs it (measured: applying h across classes
    pushed silver's minimum below its SLO). Relaxation (i) compares importance, not Q.
    """
    return _may_preempt(victim, instance_q(victim, policy), pending, instance_q(pending, policy), policy)


def _may_preempt(victim: Instance, q_v: float, pending: Instance, q_p: float, policy: QosPolicy) -> bool:
    """may_preempt with both Q values already computed: the feasibility loop asks this for every running
    instance of every host for every pending instance, and Q is the expensive part."""
    if victim.pod.key == pending.pod.key:
        return False
    v_cls = policy.cls(victim.pod.class_name)
    p_cls = policy.cls(pending.pod.class_name)
    # peer_rescue_only: between peers, a batch pod judged at completion preempts only as a rescue (below its
    # safety margin), and a rescue is not held back by the quantum
    peer_rule = policy.peer_rescue_only and v_cls.name == p_cls.name and judged_at_completion(pending.pod)
    rescue = peer_rule and q_p < p_cls.safety_margin_seconds
    if (
        policy.min_run_quantum_seconds > 0
        and victim.current_run_seconds < policy.min_run_quantum_seconds
        and not (p_cls.importance < v_cls.importance and (p_cls.slo >= 1.0 or q_p + policy.alpha_seconds < 0))
        and not rescue
    ):
        return False  # the quantum damps churn; a more important class that is violating skips it
    if policy.overhead_cap and v_cls.name == p_cls.name and _over_cap(victim, v_cls):
        return False
    if peer_rule and not rescue:
        return False  # a peer that can still wait has no claim on its peer's room
    if (
        policy.peer_victim_wait_seconds > 0
        and v_cls.name == p_cls.name
        and not judged_at_completion(pending.pod)
        and q_v - policy.peer_victim_wait_seconds < v_cls.safety_margin_seconds
    ):
        return False  # the victim could not wait for room again without falling below its margin
    q_beats = q_v > q_p + (policy.q_hysteresis_seconds if v_cls.name == p_cls.name else 0.0)
    if q_v >= v_cls.safety_margin_seconds:
        return q_beats  # base rule; the relaxations only concern victims below their margin
    if not policy.relax_by_importance or q_p >= p_cls.safety_margin_seconds:
        return False
    if p_cls.importance < v_cls.importance:
        return True  # relaxation (i)
    return p_cls.importance == v_cls.importance and q_beats  # relaxation (ii)


# -------------------------------------------------------------------------------------------- feasibility


@dataclass(frozen=True, slots=True)
class Feasibility:
    """The outcome of the feasibility check of one host for one pending instance (§3.3.1).

    victims are pod keys in the order chosen; cost is the Eq. 9 tuple (or the priority-based tuple of
    §4.1.2), () when no preemption is needed; reason explains an infeasible host (FailedNodes, Events).
    """

    node: str
    feasible: bool
    victims: tuple[str, ...] = ()
    cost: tuple[float, ...] = ()
    reason: str = ""

    @property
    def needs_preemption(self) -> bool:
        return bool(self.victims)


def _infeasible(node: Node, reason: str) -> Feasibility:
    return Feasibility(node.name, False, (), (), reason)


def _shortfall_reason(request: Resources, free: Resources, what: str) -> str:
    return f"insufficient {', '.join(request.shortfall(free))} {what}"


def feasibility(
    pending: Instance,
    node: Node,
    running: Mapping[str, Instance],
    policy: QosPolicy,
    rng: random.Random,
    q_of: Mapping[str, float] | None = None,
) -> Feasibility:
    """Can ``pending`` run on ``node``, and whom must it preempt? (§3.3.1.)

    ``q_of`` (pod key -> Q) lets a caller that checks many hosts in one pass compute each Q once; it must
    hold instance_q of the same Instances (missing keys are computed here).

    Placement constraints are the caller's filter; here we check only that the node is schedulable and the
    resources. If the pod fits the free space, no victims. Otherwise the running instances on the node are
    visited in decreasing Q (ties broken at random with ``rng``, as the paper says) and each one
    ``may_preempt`` allows is added to the victims until the pending pod fits.

    Ambiguity: the paper's first sentence starts from "the instance with the largest Q" which "can only be
    preempted if Q_k > Q_j", but the procedure "keeps looking for instances that are eligible for preemption,
    until either the required resources are freed, or no more eligible instances are found". We SKIP an
    ineligible instance and keep looking, rather than stopping at it: with the importance relaxations, the
    overhead cap and the quantum, eligibility is not monotone in Q (a gold instance at Q = -2 is never
    eligible for a bronze pending instance, while bronze instances at Q = -30 below it may be), so stopping
    would declare a host infeasible because of one protected instance. Largest-Q-first still decides which
    of the eligible instances go.

    A pod on the node without an entry in ``running`` is not preemptible (we know nothing of its SLO).
    No "reprieve" pass is made: the victim set is the paper's greedy prefix.
    """
    policy.cls(pending.pod.class_name)  # validate early: an unknown class is an error even if it fits
    if node.unschedulable:
        return _infeasible(node, "node is unschedulable")
    request = pending.pod.requests
    free = node.free
    if request.fits_in(free):
        return Feasibility(node.name, True, (), (), "")
    # Sort by key first and draw one random number per candidate in that order, so the tie-break depends on
    # the rng state only, not on the order of node.pods.
    # The space a victim frees is what the node accounts for it (node.pods), whatever its Instance says.
    on_node = {p.key: p for p in node.pods if p.key in running and p.key != pending.pod.key}
    candidates = [running[key] for key in sorted(on_node)]

    def q(inst: Instance) -> float:
        if q_of is not None and inst.pod.key in q_of:
            return q_of[inst.pod.key]
        return instance_q(inst, policy)

    # (-Q, draw, position): sorting these tuples is the stable sort by (-Q, draw) (the position breaks the
    # remaining ties as the input order did), without a key function
    draw = rng.random
    keyed = [(-q(inst), draw(), i) for i, inst in enumerate(candidates)]
    keyed.sort()
    q_pending = q(pending)
    victims: list[Instance] = []
    victim_q: list[float] = []
    for neg_q, _, i in keyed:
        inst = candidates[i]
        if not _may_preempt(inst, -neg_q, pending, q_pending, policy):
            continue
        victims.append(inst)
        victim_q.append(-neg_q)
        free = free + on_node[inst.pod.key].requests
        if request.fits_in(free):
            cost = _preemption_cost(victims, victim_q, policy)
            return Feasibility(node.name, True, tuple(v.pod.key for v in victims), cost, "")
    if not victims:
        return _infeasible(node, _shortfall_reason(request, free, "and no instance eligible for preemption"))
    return _infeasible(node, _shortfall_reason(request, free, "even after preempting every eligible instance"))


def preemption_cost(victims: Sequence[Instance], policy: QosPolicy) -> tuple[float, ...]:
    """Eq. 9 cost tuple S = <s^1, ..., s^m, s+> of preempting ``victims`` (§4.1.3); smaller is cheaper.

    P+ = victims with Q_k - phi_k >= 0, s+ = 1 / sum_{P+}(Q_k - phi_k); P^i- = victims of class i with
    Q_k - phi_k < 0, s^i = 1 / sum_{P^i-}(Q_k - phi_k). The paper leaves empty sets undefined; we pick the
    values that keep its stated intent ("no preemption of class i" is cheaper than any):
      * empty P^i- -> -inf. Every non-empty s^i is negative, and it tends to -inf as the victims approach
        their margin, so -inf is the limit; 0 would rank "preempt a gold instance slightly below its margin"
        (s^1 = -1000) cheaper than preempting no gold instance at all.
      * empty P+ -> 0, below every non-empty s+ (which is > 0, or +inf when the sum is exactly 0).
    The m slots are the distinct importance levels of the policy's classes, most important first; classes of
    equal importance share a slot, because the paper ranks classes only by importance.
    An empty victim list gives () (no preemption needed).
    """
    return _preemption_cost(victims, [instance_q(inst, policy) for inst in victims], policy)


def _preemption_cost(victims: Sequence[Instance], q: Sequence[float], policy: QosPolicy) -> tuple[float, ...]:
    """``preemption_cost`` with each victim's Q already computed (``feasibility`` has it from its walk)."""
    if not victims:
        return ()
    levels = policy.importance_levels()
    minus = [0.0] * len(levels)
    has_minus = [False] * len(levels)
    plus = 0.0
    has_plus = False
    for inst, q_v in zip(victims, q, strict=True):
        cls = policy.cls(inst.pod.class_name)
        d = q_v - cls.safety_margin_seconds
        if d >= 0:
            plus += d
            has_plus = True
        else:
            i = levels.index(cls.importance)
            minus[i] += d
            has_minus[i] = True
    s_minus = tuple((1.0 / m) if has else -math.inf for m, has in zip(minus, has_minus, strict=True))
    s_plus = 0.0 if not has_plus else (math.inf if plus == 0 else 1.0 / plus)
    return (*s_minus, s_plus)


def rank_hosts(options: Sequence[Feasibility], allocation_score: Mapping[str, float]) -> Feasibility | None:
    """Pick the host (§3.3.2, §4.1.3): feasible hosts without preemption first, by largest allocation score;
    if every feasible host needs preemption, the smallest cost tuple (Eq. 9, lexicographic), then the largest
    allocation score. The paper breaks remaining ties at random; we break them by node name so that the
    webhook, controller and simulator agree. A node missing from ``allocation_score`` scores -inf (never
    preferred over a scored node). Infeasible options are ignored; None when nothing is feasible.
    """
    names: set[str] = set()
    for opt in options:
        if opt.node in names:
            raise InvalidInputError(f"node {opt.node} appears twice among the host options")
        names.add(opt.node)
    for name, value in allocation_score.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise InvalidInputError(f"allocation score of node {name} must be a number, got {value!r}")

    def score(opt: Feasibility) -> float:
        return float(allocation_score.get(opt.node, -math.inf))

    feasible = [o for o in options if o.feasible]
    free_hosts = [o for o in feasible if not o.victims]
    if free_hosts:
        return min(free_hosts, key=lambda o: (-score(o), o.node))
    if feasible:
        return min(feasible, key=lambda o: (o.cost, -score(o), o.node))
    return None


def narrow_victims(
    pending: Instance,
    node: Node,
    proposed: Sequence[str],
    running: Mapping[str, Instance],
    policy: QosPolicy,
) -> tuple[str, ...] | None:
    """For the extender's preempt verb: the subset of kube-scheduler's proposed victims the QoS rules allow.

    kube-scheduler's DefaultPreemption proposes victims by priority; we may only shrink that set. Proposed
    keys that are not on the node, have no Instance in ``running`` or are not eligible (``may_preempt``) are
    dropped; the eligible ones are taken in decreasing Q (ties by key, deterministic) until the pending pod
    fits, so no more are evicted than needed. Returns () when the pod already fits, None when even all
    eligible proposed victims do not free enough (the node must be dropped from the preempt answer).
    """
    policy.cls(pending.pod.class_name)
    if node.unschedulable:
        return None
    request = pending.pod.requests
    free = node.free
    if request.fits_in(free):
        return ()
    on_node = {p.key: p for p in node.pods}
    eligible: list[Instance] = []
    for key in dict.fromkeys(proposed):  # de-duplicate, keep order
        inst = running.get(key)
        if key in on_node and inst is not None and may_preempt(inst, pending, policy):
            eligible.append(inst)
    eligible.sort(key=lambda inst: (-instance_q(inst, policy), inst.pod.key))
    chosen: list[str] = []
    for inst in eligible:
        chosen.append(inst.pod.key)
        free = free + on_node[inst.pod.key].requests
        if request.fits_in(free):
            return tuple(chosen)
    return None


# -------------------------------------------------------------------------- priority-based reference


def _priority_levels(policy: QosPolicy) -> tuple[int, ...]:
    return tuple(sorted({c.priority for c in policy.classes.values()}, reverse=True))


def _priority_bucket(priority: int, levels: tuple[int, ...]) -> int:
    """Index of the greatest class priority level <= ``priority`` (clamped to the lowest level)."""
    for i, level in enumerate(levels):
        if priority >= level:
            return i
    return len(levels) - 1


def _started(pod: Pod) -> float:
    return pod.started_at if pod.started_at is not None else math.inf


def priority_feasibility(pending: Pod, node: Node, policy: QosPolicy) -> Feasibility:
    """Kubernetes' DefaultPreemption on one node, the paper's reference scheduler (§4.1.2).

    Priorities are ``Pod.priority`` (pod.spec.priority, resolved from the PriorityClass; shells and the
    simulator set it from the class's ``priority``). Only pods of strictly lower priority are candidates.
    As kube-scheduler's selectVictimsOnNode does: remove every candidate; if the pod still does not fit the
    node is infeasible; otherwise "reprieve" candidates from the most important down (higher priority, then
    earlier start) and keep every one whose return still leaves room. This realises the paper's "lowest
    priorities first, most recently admitted first among equals" without evicting more than needed.
    Victims are reported lowest priority first (most recent start first among equals).

    Cost (§4.1.2): the number of victims per priority level, highest level first, so the smallest tuple is
    the host with the fewest preemptions of the most demanding instances. The levels are the policy's class
    priorities; a victim counts in the greatest level <= its priority (clamped to the lowest level).
    """
    if node.unschedulable:
        return _infeasible(node, "node is unschedulable")
    request = pending.requests
    free = node.free
    if request.fits_in(free):
        return Feasibility(node.name, True, (), (), "")
    candidates = [p for p in node.pods if p.priority < pending.priority and p.key != pending.key]
    all_free = free + Resources.total(p.requests for p in candidates)
    if not request.fits_in(all_free):
        what = "even after preempting every lower-priority pod" if candidates else "and no lower-priority pod"
        return _infeasible(node, _shortfall_reason(request, all_free, what))
    # MoreImportantPod order: higher priority first, then earlier start, then key for determinism.
    candidates.sort(key=lambda p: (-p.priority, _started(p), p.key))
    victims: list[Pod] = []
    room = all_free
    for pod in candidates:
        if request.fits_in(room - pod.requests):
            room = room - pod.requests  # reprieved: it keeps running
        else:
            victims.append(pod)
    victims.sort(key=lambda p: (p.priority, -_started(p), p.key))
    levels = _priority_levels(policy)
    counts = [0.0] * len(levels)
    for pod in victims:
        counts[_priority_bucket(pod.priority, levels)] += 1.0
    return Feasibility(node.name, True, tuple(p.key for p in victims), tuple(counts), "")


def priority_queue_order(pending: Iterable[Pod], admitted_at: Mapping[str, float] | None = None) -> list[Pod]:
    """Kubernetes' active queue order (§4.1.2): decreasing priority, then increasing admission time.

    Pod carries no admission time, so by default the input order is taken as admission order (a stable
    sort: FIFO among equal priorities). Pass ``admitted_at`` (pod key -> admission time) to make the result
    independent of input order; ties in time then fall back to pod key.
    """
    items = list(pending)
    if admitted_at is None:
        return sorted(items, key=lambda p: -p.priority)
    for p in items:
        if p.key not in admitted_at:
            raise InvalidInputError(f"no admission time for pending pod {p.key}")
        if not math.isfinite(admitted_at[p.key]):
            raise InvalidInputError(f"admission time of pod {p.key} must be finite")
    return sorted(items, key=lambda p: (-p.priority, admitted_at[p.key], p.key))


# ------------------------------------------------------------------------------------------ SLI reports


def gini(values: Sequence[float]) -> float:
    """Gini coefficient (paper 002 §4.3.1, ref. 34): mean absolute difference / (2 * mean), in [0, 1).

    Computed from the sorted values as sum_i (2i - n - 1) x_(i) / (n * sum x), the O(n log n) form of
    sum_i sum_j |x_i - x_j| / (2 n^2 mean). Values must be finite and non-negative (availabilities); an empty
    sample or an all-zero one is perfectly equal (0).
    """
    xs = sorted(_finite_nonneg("gini value", v) for v in values)
    n = len(xs)
    total = math.fsum(xs)
    if n == 0 or total == 0:
        return 0.0
    weighted = math.fsum((2 * i - n - 1) * x for i, x in enumerate(xs, start=1))
    return min(1.0, max(0.0, weighted / (n * total)))


# Table 2 thresholds for gold are AWS's (99.99 % promised, 10 % credit down to 99 %, 30 % down to 95 %).
# The paper sets the other classes' limits "proportionally ... taking into account the SLO": relative to the
# top of the bracket, 99/99.99 and 95/99.99. That reproduces silver 89.11 % and bronze 49.50 % / 47.50 %;
# Table 2 prints 85.56 % for silver's 30 % bracket, which no proportional rule gives (95/99.99 * 90 = 85.51,
# 0.95 * 90 = 85.50): we take it as a typo.
_AWS_TOP = 0.9999
_RATIO_10 = 0.99 / _AWS_TOP
_RATIO_30 = 0.95 / _AWS_TOP


def penalty_fraction(availability: float, cls: ServiceClass) -> float:
    """Table 2 bonus credit b for a request of ``cls`` that ended with ``availability``: 0, 0.1, 0.3 or 1.

    The top of the bracket is the SLO, except for a 100 % SLO where it is AWS's 99.99 % (Table 2, gold): a
    100 % promise has no measurable "slightly below" band. Bracket bounds are inclusive below, like Table 2
    (e.g. silver: 90 % > A >= 89.11 % -> 10 %).
    """
    a = _check_availability(availability)
    top = min(cls.slo, _AWS_TOP)
    if a >= top:
        return 0.0
    if a >= top * _RATIO_10:
        return 0.1
    if a >= top * _RATIO_30:
        return 0.3
    return 1.0


def request_penalty(availability: float, cls: ServiceClass, charge: float) -> float:
    """Eqs. 10-11: P = C * (1 + b) with C = D * d * c and D = sigma - A (0 when the SLO was met).

    ``charge`` is d * c, the request's duration times its CPU request (CPU-hours if d is in hours); the
    result is in the same unit. A gold request between 99.99 % and 100 % pays its deficit with no bonus.
    """
    a = _check_availability(availability)
    charge = _finite_nonneg("charge", charge)
    deficit = max(0.0, cls.slo - a)
    if deficit == 0:
        return 0.0
    return deficit * charge * (1.0 + penalty_fraction(a, cls))
