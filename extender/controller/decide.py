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

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from extender.controller.accounting import Account
from extender.core import packing, qos
from extender.core.model import Node, Pod

__all__ = ["Decision", "Evict", "GatedPod", "Release", "Settings", "World", "decide", "preemption_reason"]


@dataclass(frozen=True, slots=True)
class GatedPod:
    """A pod held by our scheduling gate. ``request`` is its request id (owner, or the pod key when bare)."""

    pod: Pod
    request: str
    gated_since: float
    node_selector: Mapping[str, str] = field(default_factory=dict)
    eligible_nodes: frozenset[str] | None = None  # the nodes of its node group (None: any node)


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
    if acc is None:
        return qos.Instance(pod=pod, running_seconds=0.0, pending_seconds=0.0, admitted=False)
    e, p = acc.ep(now)
    return qos.Instance(
        pod=pod,
        running_seconds=e * c,
        pending_seconds=p * c,
        preemptions=acc.preemptions,
        overhead_seconds=acc.overhead * c,
        current_run_seconds=acc.current_run(now) * c,
        admitted=(e + p) > 0,
    )


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


def decide(world: World, policy: qos.QosPolicy, settings: Settings, rng: random.Random) -> Decision:
    """Paper 002 Algorithm 1, one pass. Time stands still within it; each placement updates the node model so
    later pods in the queue see the space taken and the victims gone."""
    now, c = world.now, settings.compression
    nodes: dict[str, Node] = {n.name: n for n in world.nodes}
    pods_by_key: dict[str, Pod] = {p.key: p for n in world.nodes for p in n.pods}
    running: dict[str, qos.Instance] = {}
    q_of: dict[str, float] = {}
    q_of_request: dict[str, float] = {}
    for key, request in world.running.items():
        pod = pods_by_key.get(key)
        if pod is None:
            continue
        inst = _instance(pod, world.accounts.get(request), now, c)
        running[key] = inst
        q_of[key] = q_of_request[request] = qos.instance_q(inst, policy)

    releases: list[Release] = []
    evictions: list[Evict] = []
    pending: list[qos.Instance] = []
    gated_by_key: dict[str, GatedPod] = {}
    for g in world.gated:
        if g.pod.key in gated_by_key:
            continue  # a duplicate in the input is a shell bug; never release twice
        waited = max(0.0, now - g.gated_since)
        inst = _instance(g.pod, world.accounts.get(g.request), now, c)
        q = qos.instance_q(inst, policy)
        q_of_request.setdefault(g.request, q)
        if waited > settings.max_gate_seconds:
            releases.append(Release(g.pod.key, g.pod.uid, g.request, None, q, waited, timeout=True))
            continue
        gated_by_key[g.pod.key] = g
        pending.append(inst)
        q_of[g.pod.key] = q

    order = qos.queue_order(pending, policy)
    top_priority = max((r.pod.priority for r in running.values()), default=0)
    # kube-scheduler's preemption only evicts strictly lower priorities: below this nobody can be handed over
    # (a cheap exact guard; the priority check per node is the pass's dearest step on large clusters)
    lowest_priority = min((p.priority for n in world.nodes for p in n.pods), default=None)
    for inst in order:
        g = gated_by_key[inst.pod.key]
        # QoS preemption is among equals and below: a pod of higher priority is never a QoS victim.
        if inst.pod.priority < top_priority:
            eligible = {k: r for k, r in running.items() if r.pod.priority <= inst.pod.priority}
        else:
            eligible = running
        selected = [
            n
            for n in nodes.values()
            if _selects(n, g.node_selector) and (g.eligible_nodes is None or n.name in g.eligible_nodes)
        ]
        options = [qos.feasibility(inst, n, eligible, policy, rng, q_of) for n in selected]
        feasible = [o for o in options if o.feasible]
        if not feasible:
            # Priority beats Q: where kube-scheduler could make room by preempting strictly lower-priority pods
            # (which it does, with the preempt verb narrowing its victims), hand the pod over unpinned.
            if (
                lowest_priority is not None
                and lowest_priority < inst.pod.priority
                and any(qos.priority_feasibility(inst.pod, n, policy).feasible for n in selected)
            ):
                releases.append(
                    Release(
                        inst.pod.key,
                        inst.pod.uid,
                        g.request,
                        None,
                        q_of[inst.pod.key],
                        max(0.0, now - g.gated_since),
                        priority=True,
                    )
                )
            continue
        scores: dict[str, float]
        if settings.host_score == "profile":
            ranked = packing.score_nodes(
                settings.profile, [nodes[o.node] for o in feasible], inst.pod, now, settings.cycle_seconds
            )
            scores = {name: float(v) for name, v in ranked.items()}
        else:
            scores = {o.node: packing.k8s_default_score(nodes[o.node], inst.pod) for o in feasible}
        best = qos.rank_hosts(feasible, scores)
        if best is None:
            continue
        q_p = q_of[inst.pod.key]
        for key in best.victims:
            victim = running.pop(key)
            q_v = q_of.pop(key)
            evictions.append(
                Evict(
                    key,
                    victim.pod.uid,
                    world.running[key],
                    inst.pod.key,
                    best.node,
                    q_v,
                    q_p,
                    preemption_reason(victim, q_v, inst, policy),
                )
            )
        placed = replace(inst.pod, started_at=None, node_name=best.node)
        nodes[best.node] = nodes[best.node].without_pods(best.victims).with_pod(placed)
        if lowest_priority is None or placed.priority < lowest_priority:
            lowest_priority = placed.priority
        releases.append(
            Release(
                inst.pod.key,
                inst.pod.uid,
                g.request,
                best.node if settings.pin else None,
                q_p,
                max(0.0, now - g.gated_since),
                tuple(best.victims),
            )
        )
    return Decision(tuple(evictions), tuple(releases), q_of_request, tuple(i.pod.key for i in order))
