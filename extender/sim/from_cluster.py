"""`qos-extender simulate --from-cluster`: a live cluster's recent history as a replayable workload, plus what the
cluster actually did over the same window (its bill, each class's observed availability), so `product` can be
replayed against it.

Pure: the shell (extender/processes/history.py) reads the API server and Prometheus and hands over a
:class:`ClusterHistory` of plain observations (timestamps in unix seconds, requests, class / kind / runtime as the
extender reads them from the pod's annotations). Everything history cannot tell is decided here, once, and
named in :attr:`Replay.assumptions`, which the command prints with its result.

The window is ``[start, end]``: ``end`` is the moment of the reading, ``start`` is ``end - since`` clipped to the
oldest object the reading saw (a cluster younger than the window is replayed from its first node or pod).

Each pod is one request (a Job's or a ReplicaSet's pods are replayed as independent requests). Observed per pod,
clipped to the window: pending p = from its creation (or the window start) to its start; running e = from its
start to its end (its last container's finishedAt; a pod still running at the window's end runs to it). The
replay arrives each pod at its creation (or at 0 when it was created before the window) with its observed run
time in the window (at least 1 s: the API's timestamps have whole seconds) as its duration; a pod that never ran
gets its runtime-seconds annotation, else the rest of the window.

Nodes: the actual bill is each node's life in the window, rounded up to the minute as the simulator bills, times
its price: its flavour label's catalogue flavour, else its price annotation, else the catalogue flavour nearest
to its capacity (an assumption, named per node). The replay starts with the nodes that were there before the
window's first pod arrived (mapped to catalogue flavours the same way); nodes added later were the cluster's
own scaling decisions, which the replay replaces with the product's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from extender.core import qos
from extender.core.model import Flavour, InvalidInputError, NodeGroup, ServiceClass, WorkloadKind
from extender.sim.report import summarize_classes
from extender.sim.workloads import RequestSpec, Workload

__all__ = [
    "ClusterHistory",
    "ObservedNode",
    "ObservedPod",
    "Replay",
    "compare",
    "nearest_flavour",
    "parse_duration",
    "replay_from_history",
]

WORKLOAD_NAME = "from-cluster"
MIN_DURATION_SECONDS = 1.0  # the API's timestamps have whole seconds


@dataclass(frozen=True, slots=True)
class ObservedNode:
    """A node as the API server (``source="api"``) or Prometheus (``"prometheus"``, a deleted node) showed it."""

    name: str
    created: float | None  # None: unknown (taken as before the window)
    deleted: float | None = None  # None: still there at the reading
    cpu_milli: int | None = None  # capacity; None: unknown
    memory_bytes: int | None = None
    flavour_label: str | None = None  # the node's flavour label (node.kubernetes.io/instance-type)
    price_annotation: str | None = None  # qos.kube-qos-extender.io/price-per-hour, raw
    groups: frozenset[NodeGroup] = frozenset()
    source: str = "api"


@dataclass(frozen=True, slots=True)
class ObservedPod:
    """A pod, with class / kind / runtime as the extender reads its annotations (defaults where malformed, each
    problem in ``problems``)."""

    key: str  # namespace/name
    created: float | None
    cpu_milli: int
    memory_bytes: int
    class_name: str
    kind: WorkloadKind
    started: float | None = None
    finished: float | None = None  # the last container's finishedAt (Succeeded / Failed)
    phase: str = "Pending"
    node: str | None = None
    runtime_seconds: float | None = None  # runtime-seconds annotation (or the configured batch default)
    problems: tuple[str, ...] = ()
    source: str = "api"


@dataclass(frozen=True, slots=True)
class ClusterHistory:
    """What the shell read: every node and pod it saw, at ``now`` (unix seconds), and what it could not read
    (``notes``, printed with the assumptions)."""

    now: float
    nodes: tuple[ObservedNode, ...]
    pods: tuple[ObservedPod, ...]
    prometheus: bool = False  # Prometheus was asked (deleted objects come from it when it has them)
    notes: tuple[str, ...] = ()
    excluded_pods: Mapping[str, int] = field(default_factory=dict)  # reason -> count (DaemonSet pods, ...)
    own_cost_usd: float | None = None  # the autoscaler sidecar's gauge integrated over the window, when scraped


@dataclass(frozen=True, slots=True)
class Replay:
    workload: Workload
    actual: dict[str, Any]  # JSON: window, bill, per-node lives, per-class observed SLIs
    assumptions: tuple[str, ...]
    start: float
    end: float


def parse_duration(text: str) -> float:
    """``3h``, ``90m``, ``45s``, ``1d``, ``1h30m`` or plain seconds -> seconds (> 0)."""
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
    raw = text.strip().lower()
    total, num = 0.0, ""
    try:
        if raw and raw[-1].isdigit():
            total = float(raw)
        else:
            for ch in raw:
                if ch.isdigit() or ch == ".":
                    num += ch
                elif ch in units and num:
                    total += float(num) * units[ch]
                    num = ""
                else:
                    raise ValueError(ch)
            if num:
                raise ValueError(num)
    except ValueError:
        total = math.nan
    if not (math.isfinite(total) and total > 0):
        raise InvalidInputError(f"--since: {text!r} is not a duration (e.g. 3h, 90m, 600s)")
    return total


def nearest_flavour(cpu_milli: int, memory_bytes: int, flavours: Sequence[Flavour]) -> Flavour:
    """The catalogue flavour closest in both cpu and memory (sum of the absolute log ratios; ties: cheaper)."""
    if not flavours:
        raise InvalidInputError("no flavour catalogue to price the nodes with")

    def distance(f: Flavour) -> tuple[float, float]:
        c = abs(math.log(max(cpu_milli, 1) / f.capacity.cpu_milli))
        m = abs(math.log(max(memory_bytes, 1) / f.capacity.memory_bytes))
        return (round(c + m, 9), f.price_per_hour)

    return min(flavours, key=distance)


@dataclass(frozen=True, slots=True)
class _Priced:
    node: ObservedNode
    flavour: Flavour  # the catalogue flavour the replay uses for it
    price_per_hour: float
    how: str  # "flavour label" | "price annotation" | "nearest flavour" | "most common flavour"


def _price(node: ObservedNode, catalogue: Mapping[str, Flavour], fallback: Flavour) -> _Priced:
    if node.flavour_label and node.flavour_label in catalogue:
        f = catalogue[node.flavour_label]
        return _Priced(node, f, f.price_per_hour, "flavour label")
    if node.cpu_milli and node.memory_bytes:
        f = nearest_flavour(node.cpu_milli, node.memory_bytes, tuple(catalogue.values()))
        how = "nearest flavour"
    else:
        f, how = fallback, "most common flavour"
    try:
        price = float(node.price_annotation) if node.price_annotation else math.nan
    except ValueError:
        price = math.nan
    if math.isfinite(price) and price >= 0:
        return _Priced(node, f, price, "price annotation")
    return _Priced(node, f, f.price_per_hour, how)


def _billed(seconds: float, price_per_hour: float) -> float:
    """Per-minute billing, each life rounded up, as the simulator bills (engine.Simulator._result)."""
    return math.ceil(seconds / 60.0 - 1e-9) * price_per_hour / 60.0 if seconds > 0 else 0.0


def _pod_times(pod: ObservedPod, start: float, end: float) -> tuple[float, float | None, float]:
    """(arrival, run start or None, run end) in unix seconds, clipped to the window."""
    arrival = min(max(pod.created if pod.created is not None else start, start), end)
    if pod.started is None:
        return arrival, None, end
    s = min(max(pod.started, arrival), end)
    f = pod.finished if pod.finished is not None else end
    return arrival, s, min(max(f, s), end)


def replay_from_history(
    history: ClusterHistory,
    flavours: Sequence[Flavour],
    classes: Mapping[str, ServiceClass],
    since_seconds: float,
) -> Replay:
    """The window's workload (for the engine), the cluster's actual bill and SLIs over it, and the assumptions."""
    if not (math.isfinite(since_seconds) and since_seconds > 0):
        raise InvalidInputError("the window must be a positive number of seconds")
    if not flavours:
        raise InvalidInputError("no flavour catalogue to price the nodes with")
    end = history.now
    seen = [t for t in (*(n.created for n in history.nodes), *(p.created for p in history.pods)) if t is not None]
    start = max(end - since_seconds, min(seen, default=end - since_seconds))
    start = min(start, end)
    assumptions: list[str] = list(history.notes)
    if start > end - since_seconds + 1e-6:
        assumptions.append(
            f"window clipped to what the cluster shows: {end - start:.0f} s of the {since_seconds:.0f} s asked "
            "(nothing older was seen)"
        )

    catalogue = {f.name: f for f in flavours}
    # ---- nodes: the actual bill, the replay's starting nodes
    nodes = [n for n in history.nodes if (n.deleted is None or n.deleted > start) and (n.created or start) < end]
    labelled = [catalogue[n.flavour_label] for n in nodes if n.flavour_label in catalogue]
    fallback = max(labelled, key=lambda f: (labelled.count(f), -f.price_per_hour)) if labelled else flavours[0]
    priced = [_price(n, catalogue, fallback) for n in nodes]
    pods_in = [
        p
        for p in history.pods
        if (p.created is None or p.created <= end) and not (p.finished is not None and p.finished < start)
    ]
    first_arrival = min((_pod_times(p, start, end)[0] for p in pods_in), default=end)
    node_rows: list[dict[str, Any]] = []
    initial: list[tuple[str, NodeGroup]] = []
    cost = node_seconds = 0.0
    for pr in sorted(priced, key=lambda x: x.node.name):
        n = pr.node
        born = max(n.created if n.created is not None else start, start)
        gone = min(n.deleted if n.deleted is not None else end, end)
        alive = max(0.0, gone - born)
        billed = _billed(alive, pr.price_per_hour)
        cost += billed
        node_seconds += alive
        node_rows.append(
            {
                "name": n.name,
                "flavour_label": n.flavour_label,
                "replayed_as": pr.flavour.name,
                "priced_by": pr.how,
                "price_per_hour": pr.price_per_hour,
                "created": born,
                "deleted": n.deleted if n.deleted is not None and n.deleted <= end else None,
                "seconds": alive,
                "cost_usd": billed,
                "source": n.source,
            }
        )
        if pr.how != "flavour label":
            what = f"label {n.flavour_label!r} not in the catalogue" if n.flavour_label else "no flavour label"
            assumptions.append(
                f"node {n.name}: {what}; priced by {pr.how} at ${pr.price_per_hour:.4f}/h, replayed as "
                f"{pr.flavour.name}"
            )
        if born <= first_arrival and (n.deleted is None or n.deleted > first_arrival):
            group = NodeGroup.BATCH if n.groups == frozenset((NodeGroup.BATCH,)) else NodeGroup.SERVICE
            if len(n.groups) != 1:
                assumptions.append(
                    f"node {n.name} accepts {'both node groups' if n.groups else 'no node group'}: replayed as "
                    "a service node"
                )
            initial.append((pr.flavour.name, group))

    # ---- pods: observed SLIs, the replay's requests
    reqs: list[RequestSpec] = []
    observed: list[tuple[str, float, float]] = []
    problems: list[str] = []
    completed = running = never_ran = 0
    unknown_class: dict[str, int] = {}
    for p in sorted(pods_in, key=lambda x: x.key):
        cls = p.class_name
        if cls not in classes:
            unknown_class[cls] = unknown_class.get(cls, 0) + 1
            cls = min(classes.values(), key=lambda c: (-c.importance, c.slo)).name
        if p.problems:
            problems.extend(f"{p.key}: {msg}" for msg in p.problems)
        arrival, s, f = _pod_times(p, start, end)
        if s is None:
            never_ran += 1
            e, pend = 0.0, end - arrival
            duration = p.runtime_seconds if p.runtime_seconds else end - arrival
        else:
            e, pend = f - s, s - arrival
            duration = f - s
            if p.finished is not None and p.finished <= end:
                completed += 1
            else:
                running += 1
        observed.append((cls, qos.availability(e, pend), (e + pend) * p.cpu_milli / 1000))
        reqs.append(
            RequestSpec(
                request_id=p.key,
                arrival=round(arrival - start, 3),
                cpu_milli=p.cpu_milli,
                memory_bytes=p.memory_bytes,
                duration=max(MIN_DURATION_SECONDS, round(duration, 3)),
                class_name=cls,
                kind=p.kind,
            )
        )
    reqs.sort(key=lambda r: (r.arrival, r.request_id))
    stats, penalty = summarize_classes(observed, classes) if observed else ({}, 0.0)

    if problems:
        assumptions.append(
            f"{len(problems)} malformed qos annotation(s) on {sum(1 for p in pods_in if p.problems)} pod(s), "
            "replayed with the documented defaults: "
            + "; ".join(problems[:10])
            + ("; ..." if len(problems) > 10 else "")
        )
    for cls_name, count in sorted(unknown_class.items()):
        assumptions.append(f"{count} pod(s) of class {cls_name!r}, not configured: counted as the least important")
    if running:
        assumptions.append(
            f"{running} pod(s) still running at the window's end: their runtime is unknown, taken to end there"
        )
    if never_ran:
        assumptions.append(
            f"{never_ran} pod(s) never started in the window: replayed with their runtime-seconds annotation, "
            "else the rest of the window"
        )
    for reason, count in sorted(history.excluded_pods.items()):
        assumptions.append(f"{count} pod(s) left out: {reason}")
    assumptions.extend(
        [
            "each pod is its own request (a Job's or a ReplicaSet's pods are replayed independently); work done "
            "before the window is not replayed",
            "usage = requests (the replay packs by requests, as the scheduler does)",
            "the cluster's own scaling (nodes added in the window) is replaced by the product's autoscaler "
            "sidecar; nodes present before the window's first pod are the replay's starting nodes, which the "
            "product may remove when idle; node acquisition lag 60-120 s in the replay",
            "both bills round each node's life in the window up to the minute",
        ]
    )
    if not history.prometheus:
        assumptions.append(
            "no Prometheus (--prometheus): nodes and pods deleted before the reading are invisible (their cost "
            "and SLIs are missing from both sides)"
        )
    total = len(pods_in)
    actual: dict[str, Any] = {
        "policy": "actual",
        "window": {"start": start, "end": end, "seconds": end - start},
        "classes": stats,
        "penalty": penalty,
        "cost_usd": cost,
        "node_seconds": node_seconds,
        "nodes": node_rows,
        "pods": total,
        "requests_completed": completed,
        "requests_running_at_end": running,
        "requests_never_started": never_ran,
        "annotation_problems": len(problems),
        "pods_with_annotation_problems": sum(1 for p in pods_in if p.problems),
        "initial_nodes": [f"{f}/{g.value}" for f, g in initial],
        "own_cost_usd": history.own_cost_usd,
    }
    workload = Workload(
        name=WORKLOAD_NAME,
        requests=tuple(reqs),
        flavours=tuple(flavours),
        initial=tuple(initial),
        horizon=max(end - start, MIN_DURATION_SECONDS),
        classes=dict(classes),
        origin=f"the cluster's last {end - start:.0f} s ({total} pods, {len(nodes)} nodes)",
        bill_to_horizon=True,
    )
    return Replay(workload, actual, tuple(assumptions), start, end)


def compare(actual: Mapping[str, Any], run: Mapping[str, Any]) -> dict[str, Any]:
    """The replayed run against the actual: saving on the bill, and per class whether the replay meets the SLO
    for at least as large a share of requests as the cluster did."""
    cost = actual["cost_usd"]
    per_class = {}
    for name, obs in actual["classes"].items():
        got = run["classes"].get(name)
        per_class[name] = {
            "observed": obs["slo_fulfillment"],
            "replayed": got["slo_fulfillment"] if got else None,
            "at_least_observed": bool(got) and got["slo_fulfillment"] >= obs["slo_fulfillment"] - 1e-9,
        }
    return {
        "actual_cost_usd": cost,
        "replayed_cost_usd": run["cost_usd"],
        "saving": 1.0 - run["cost_usd"] / cost if cost > 0 else None,
        "classes": per_class,
    }


def format_comparison(actual: Mapping[str, Any], vs: Mapping[str, Any], assumptions: Sequence[str]) -> str:
    w = actual["window"]
    lines = [
        f"actual: {actual['pods']} pods ({actual['requests_completed']} completed, "
        f"{actual['requests_running_at_end']} running at the end, {actual['requests_never_started']} never started), "
        f"{len(actual['nodes'])} nodes, {w['seconds']:.0f} s window"
    ]
    for name, s in actual["classes"].items():
        lines.append(
            f"{'actual':<11} {name:<7} {s['requests']:>4} {s['availability_mean']:>7.4f} "
            f"{s['availability_min']:>7.4f} {s['availability_p10']:>7.4f} {s['availability_median']:>7.4f} "
            f"{s['slo_fulfillment']:>7.3f} {s['gini']:>6.4f}"
        )
    lines.append(f"actual cost ${actual['cost_usd']:.4f} ({actual['node_seconds']:.0f} node-seconds)")
    if actual.get("own_cost_usd") is not None:
        lines.append(f"the autoscaler sidecar's own cost gauge over the window: ${actual['own_cost_usd']:.4f}")
    saving = vs["saving"]
    if saving is None:
        lines.append(f"product would have paid ${vs['replayed_cost_usd']:.4f} (the cluster paid nothing we can see)")
    else:
        word = "less" if saving >= 0 else "more"
        lines.append(
            f"under product you would have paid {abs(100 * saving):.1f} % {word}: ${vs['replayed_cost_usd']:.4f} "
            f"instead of ${vs['actual_cost_usd']:.4f}"
        )
    for name, c in vs["classes"].items():
        got = "n/a" if c["replayed"] is None else f"{100 * c['replayed']:.1f} %"
        ok = "yes" if c["at_least_observed"] else "NO"
        lines.append(
            f"  {name}: SLO met for {got} of requests under product vs {100 * c['observed']:.1f} % observed "
            f"-> as often: {ok}"
        )
    lines.append("ASSUMPTIONS (what history cannot tell):")
    lines.extend(f"  - {a}" for a in assumptions)
    return "\n".join(lines)
