"""The four extender verbs as plain functions over parsed JSON bodies and a Snapshot: no HTTP here.

Wire types: k8s.io/kube-scheduler/extender/v1 (PascalCase, every pointer field present). ``filter``,
``prioritize`` and ``preempt`` are synchronous and pure given (body, snapshot, config, now), so
bench/verbs.py times them without a server; ``bind`` is a coroutine because it talks to the API server
through a ``Binder``.

Bad input raises ``InvalidInputError`` (the app answers 400 with a JSON error). Decisions the protocol has a
place for are answered in it: a node the pod does not fit goes to FailedNodes with a human reason, a node no
preemption could make fit (wrong node group, cordoned, pod bigger than the node) to
FailedAndUnresolvableNodes, a failed bind to ExtenderBindingResult.Error.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from typing import Any

import numpy as np

from extender.core import packing, qos, slack
from extender.core.model import InvalidInputError, Node, NodeGroup, Pod, Resources, WorkloadKind
from extender.kube.binding import BindArgs, Binder, BindError
from extender.kube.convert import PodProblems, Problem, parse_timestamp, pod_from_k8s
from extender.kube.snapshot import GROUP_BITS, NodeTable, RowIndex, Snapshot, saturate
from extender.settings.sections import PlacementSettings

__all__ = [
    "BindArgs",
    "BindError",
    "BindRefused",
    "Binder",
    "PodProblems",
    "PodReader",
    "VerbResult",
    "bind",
    "filter_nodes",
    "parse_bind_args",
    "preempt",
    "prioritize",
]

log = logging.getLogger("extender.webhook.verbs")


@dataclass(slots=True)
class VerbResult:
    """The response body plus what the shell reports about it (metrics, Events, logs)."""

    body: Any
    filtered_out: Counter[str] = field(default_factory=Counter)  # reason label -> nodes
    decisions: Counter[str] = field(default_factory=Counter)  # policy label -> decisions
    victims_dropped: int = 0
    victims_kept: int = 0
    problems: PodProblems | None = None


# ------------------------------------------------------------------------------------------------ input


def _object(body: object, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise InvalidInputError(f"{what} must be a JSON object, got {_json_type(body)}")
    return body


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), type(value).__name__
    )


ParsedPod = tuple[Pod, "float | None", "PodProblems | None"]


def _pod(body: Mapping[str, Any], config: PlacementSettings, snapshot: Snapshot | None = None) -> ParsedPod:
    """The request's Pod in the core model; parsed once per UID and resourceVersion (kube-scheduler sends the
    same Pod to filter, prioritize and preempt), the result kept in ``snapshot.request_pods``."""
    raw = body.get("Pod")
    if raw is None:
        raise InvalidInputError("missing Pod")
    if not isinstance(raw, dict):
        raise InvalidInputError(f"Pod must be a JSON object, got {_json_type(raw)}")
    meta = raw.get("metadata")
    uid = meta.get("uid") if isinstance(meta, dict) else None
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    cacheable = snapshot is not None and isinstance(uid, str) and uid and isinstance(rv, str) and rv
    if cacheable:
        assert snapshot is not None and isinstance(uid, str) and isinstance(rv, str) and isinstance(meta, dict)
        hit: ParsedPod | None = snapshot.request_pods.get(uid, rv)
        if hit is not None:
            return hit
        hit = _watched(meta, uid, rv, config, snapshot)
        if hit is not None:
            snapshot.request_pods.put(uid, rv, hit)
            return hit
    managed = slack.with_batch_resources(config.scheduling.managed_resources)  # as the snapshot counts them
    pod, problems = pod_from_k8s(raw, config.pod_defaults, config.policy.classes, managed)
    parsed = _parsed(pod, parse_timestamp((meta or {}).get("creationTimestamp")), problems)
    if cacheable:
        assert snapshot is not None and isinstance(uid, str) and isinstance(rv, str)
        snapshot.request_pods.put(uid, rv, parsed)
    return parsed


def _watched(
    meta: Mapping[str, Any], uid: str, rv: str, config: PlacementSettings, snapshot: Snapshot
) -> ParsedPod | None:
    """The watch's parse of this very object, when the snapshot holds it: same UID and resourceVersion (the API
    server's identity of one version of the object), still unbound, parsed under the same settings.

    Why: a released pod reaches the filter in the version whose MODIFIED event the watch has usually already
    parsed, and parsing kube-scheduler's copy again was about two thirds of the filter's own work for a pinned
    pod (bench/filter_watched_parse.py: 36 -> 14.5 us per call). A watch that lags (an older version, or none
    yet) misses here and the request's copy is parsed as before."""
    if (
        snapshot.config.pod_defaults is not config.pod_defaults
        or snapshot.config.policy is not config.policy
        or snapshot.config.scheduling is not config.scheduling
    ):
        return None  # parsed under other settings (a test's, or a reload's): not the same answer
    entry = snapshot.pods.get(f"{meta.get('namespace')}/{meta.get('name')}")
    if entry is None or entry.resource_version != rv or entry.pod.uid != uid or entry.pod.node_name is not None:
        return None
    return _parsed(entry.pod, entry.created_at, entry.problems)


def _parsed(pod: Pod, created: float | None, problems: tuple[Problem, ...]) -> ParsedPod:
    """A request Pod as the verbs keep it: its annotation problems, if any, as one report for an Event."""
    reported = PodProblems(pod.namespace, pod.name, pod.uid, problems) if problems else None
    return (pod, created, reported)


def _unique(names: Sequence[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InvalidInputError(f"duplicate node name {name!r} in {what}")
        seen.add(name)


def _candidates(body: Mapping[str, Any], unique: bool = True) -> tuple[list[str], list[dict[str, Any]] | None]:
    """(node names, node objects or None): NodeNames in nodeCacheCapable mode, Nodes.items otherwise.

    ``unique=False``: the caller checks NodeNames for duplicates itself (``_rows``, on integers)."""
    names, objs, _ = _candidates_keyed(body, unique)
    return names, objs


def _candidates_keyed(
    body: Mapping[str, Any], unique: bool = True
) -> tuple[list[str], list[dict[str, Any]] | None, str | None]:
    """``_candidates`` plus the NodeNames list's key for the node table's row-index cache: the names joined
    by NUL, which identifies the list exactly when no name contains a NUL (checked; None otherwise, and for
    Nodes.items). The join is also the C-speed check that every name is a string."""
    names_raw = body.get("NodeNames")
    nodes_raw = body.get("Nodes")
    if names_raw is not None and nodes_raw is not None:
        raise InvalidInputError("both Nodes and NodeNames are set; kube-scheduler sends exactly one of them")
    if names_raw is not None:
        if not isinstance(names_raw, list):
            raise InvalidInputError(f"NodeNames must be an array of strings, got {_json_type(names_raw)}")
        # C-speed checks first (a 5,000-name list is the common case); the loops only name the culprit.
        key: str | None
        try:
            key = "\0".join(names_raw)  # TypeError on the first non-string
        except TypeError:
            key = None
        if key is None or "" in names_raw:
            for n in names_raw:
                if not isinstance(n, str) or not n:
                    raise InvalidInputError(f"NodeNames must hold non-empty strings, got {n!r}")
        assert key is not None
        if key.count("\0") != max(0, len(names_raw) - 1):
            key = None  # a name holding a NUL: the join would not tell ["a\0b"] from ["a", "b"]
        if unique and len(set(names_raw)) != len(names_raw):
            _unique(names_raw, "NodeNames")
        return names_raw, None, key
    if nodes_raw is not None:
        if not isinstance(nodes_raw, dict):
            raise InvalidInputError(f"Nodes must be a NodeList object, got {_json_type(nodes_raw)}")
        items = nodes_raw.get("items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise InvalidInputError(f"Nodes.items must be an array, got {_json_type(items)}")
        names: list[str] = []
        for i, item in enumerate(items):
            meta = item.get("metadata") if isinstance(item, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            if not isinstance(name, str) or not name:
                raise InvalidInputError(f"Nodes.items[{i}] has no metadata.name")
            names.append(name)
        _unique(names, "Nodes.items")
        return names, items, None
    raise InvalidInputError("neither Nodes nor NodeNames is set")


def _rows(names: list[str], snapshot: Snapshot, key: str | None = None) -> tuple[NodeTable, RowIndex]:
    """The node table and each name's row (-1: unknown to the snapshot); raises on duplicate names.

    ``key`` (from ``_candidates_keyed``): the list's identity; the table keeps the last list's index, so a
    repeated list (kube-scheduler sends all nodes to every call) costs one string comparison instead of a
    hash and a dict lookup per name. Only a list that passed the duplicate checks is remembered."""
    table = snapshot.fresh_table()
    if key is not None:
        hit = table.cached_index(key)
        if hit is not None:
            return table, hit
    rows = np.fromiter(map(table.row.get, names, repeat(-1)), dtype=np.int64, count=len(names))
    known = rows[rows >= 0]
    marks = np.zeros(len(table.alloc_cpu), np.bool_)
    marks[known] = True
    if np.count_nonzero(marks) != known.size:
        _unique(names, "NodeNames")
    if known.size != rows.size:
        _unique(list(compress(names, (rows < 0).tolist())), "NodeNames")
    index = RowIndex.of(rows)
    if key is not None:
        table.remember_index(key, index)
    return table, index


def _ensure_ready(snapshot: Snapshot) -> None:
    if not snapshot.ready:
        raise NotReadyError("the extender's snapshot is not synced with the API server yet")


class NotReadyError(RuntimeError):
    """The snapshot has not completed its first list: the app answers 503."""


# ------------------------------------------------------------------------------------------------ filter


def _milli(v: int) -> str:
    return f"{v}m"


def _mib(v: int) -> str:
    return f"{v / 2**20:.0f}Mi" if v % 2**20 == 0 else f"{v}B"


UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def tolerates_unschedulable(pod_obj: Mapping[str, Any]) -> bool:
    """Whether the pod tolerates the taint {key: node.kubernetes.io/unschedulable, value: "", effect:
    NoSchedule} that NodeUnschedulable checks for a cordoned node, with the matching rules of upstream's
    Toleration.ToleratesTaint: an empty effect or key matches any; operator Exists matches any value;
    Equal (or empty) matches the taint's empty value only when the toleration's value is empty too;
    Lt/Gt compare integers, and the empty taint value is none; any other operator matches nothing."""
    spec = pod_obj.get("spec")
    tolerations = spec.get("tolerations") if isinstance(spec, dict) else None
    if not isinstance(tolerations, list):
        return False
    for t in tolerations:
        if not isinstance(t, dict) or (t.get("effect") or "") not in ("", "NoSchedule"):
            continue
        if (t.get("key") or "") not in ("", UNSCHEDULABLE_TAINT):
            continue
        op = t.get("operator") or ""
        if op == "Exists" or (op in ("", "Equal") and (t.get("value") or "") == ""):
            return True
    return False


def _group_needed(pod: Pod) -> frozenset[NodeGroup]:
    """The node groups the pod may use under node_groups.enforce (a co-located batch pod: service nodes too)."""
    return slack.node_groups_for(pod.kind, pod.requests)


def _group_bits(groups: frozenset[NodeGroup]) -> int:
    return sum(GROUP_BITS[g] for g in groups)


def _shortfall(req: Resources, requested: Resources, count: int, alloc: Resources) -> tuple[str, str] | None:
    """(reason label, human reason) when ``req`` does not fit next to ``requested``; None when it fits.

    Mirrors packing.fits (tests check the equivalence): one pod slot, cpu, memory, extended resources.
    """
    parts: list[str] = []
    labels: list[str] = []
    if count + 1 > alloc.pods:
        parts.append(f"too many pods ({count} of {alloc.pods} slots used)")
        labels.append("pods")
    if req.cpu_milli > alloc.cpu_milli - requested.cpu_milli:
        parts.append(
            f"insufficient cpu (requests {_milli(req.cpu_milli)}, "
            f"free {_milli(alloc.cpu_milli - requested.cpu_milli)} of {_milli(alloc.cpu_milli)})"
        )
        labels.append("cpu")
    if req.memory_bytes > alloc.memory_bytes - requested.memory_bytes:
        parts.append(
            f"insufficient memory (requests {_mib(req.memory_bytes)}, "
            f"free {_mib(alloc.memory_bytes - requested.memory_bytes)} of {_mib(alloc.memory_bytes)})"
        )
        labels.append("memory")
    for name, amount in req.extended:
        free = alloc.ext(name) - requested.ext(name)
        if amount > free:
            parts.append(f"insufficient {name} (requests {amount}, free {free} of {alloc.ext(name)})")
            labels.append("extended")
    if not parts:
        return None
    return ("insufficient_" + "_".join(dict.fromkeys(labels)), "; ".join(parts))


def _too_large(req: Resources, alloc: Resources) -> str | None:
    over: list[str] = []
    if req.cpu_milli > alloc.cpu_milli:
        over.append(f"cpu {_milli(req.cpu_milli)} > allocatable {_milli(alloc.cpu_milli)}")
    if req.memory_bytes > alloc.memory_bytes:
        over.append(f"memory {_mib(req.memory_bytes)} > allocatable {_mib(alloc.memory_bytes)}")
    if alloc.pods < 1:
        over.append("node allows no pods")
    for name, amount in req.extended:
        if amount > alloc.ext(name):
            over.append(f"{name} {amount} > allocatable {alloc.ext(name)}")
    return "pod requests more than the node has even when empty: " + ", ".join(over) if over else None


@dataclass(frozen=True, slots=True)
class _FilterInput:
    req: Resources
    groups: frozenset[NodeGroup]
    enforce: bool
    tolerates: bool
    key: str
    kind: WorkloadKind


def _judge(name: str, snapshot: Snapshot, f: _FilterInput) -> tuple[bool, str, str] | None:
    """One node: None if the pod passes, else (resolvable by preemption?, reason label, human reason).

    A node the snapshot does not know is unresolvable: preemption cannot make room on a node we cannot
    see, and as a FailedNode it would become a preemption candidate with no victims (upstream then reports
    an error for the whole attempt); kube-scheduler asks again once the watch has delivered it.
    """
    entry = snapshot.nodes.get(name)
    if entry is None:
        return False, "unknown_node", "node is not in the extender's snapshot yet (watch lagging); retry later"
    node = entry.node
    if f.enforce and not (f.groups & entry.accepts):
        groups = "/".join(sorted(g.value for g in entry.accepts)) or "no"
        return False, "node_group", f"node group mismatch: {f.kind.value} pod, node accepts {groups} pods"
    if node.unschedulable and not f.tolerates:
        return False, "unschedulable", "node is cordoned (spec.unschedulable)"
    alloc = node.allocatable
    too_large = _too_large(f.req, alloc)
    if too_large is not None:
        return False, "too_large", too_large
    requested, count = snapshot.requested_on(name, exclude=f.key)
    demand = slack.slack_demand(f.req)
    if demand is not None:
        # a co-located pod: judged on the node's published prediction minus what other tenants hold of it
        why = slack.colocation_shortfall(alloc, requested, demand)
        if why is not None:
            return True, "insufficient_slack", why
    short = _shortfall(f.req, requested, count, alloc)
    if short is not None:
        return True, short[0], short[1]
    return None


# Below this many candidates the per-node path is as fast as the vectorised one.
_VECTOR_MIN_NODES = 32


def _passing_mask(
    names: list[str], snapshot: Snapshot, f: _FilterInput, key: str | None = None
) -> tuple[list[bool], list[int]]:
    """Which candidates pass, from the node table's columns: the list's row index (cached, see ``_rows``)
    plus vector operations. Exact for cpu, memory and pod slots; a node holding the pod itself (observed or
    assumed) is marked failing here so that ``_judge`` decides it with the pod excluded."""
    table, index = _rows(names, snapshot, key)
    rows, known, r = index.rows, index.known, index.safe
    acpu, amem, apods = table.alloc_cpu[r], table.alloc_mem[r], table.alloc_pods[r]
    ok = known & (apods >= table.used_pods[r] + 1)
    ok &= acpu - table.used_cpu[r] >= f.req.cpu_milli
    ok &= amem - table.used_mem[r] >= f.req.memory_bytes
    if f.enforce:
        ok &= (table.groups[r] & _group_bits(f.groups)) != 0
    if not f.tolerates:
        ok &= ~table.unschedulable[r]
    observed, assumed = snapshot.pods.get(f.key), snapshot.ledger.get(f.key)
    for node in (observed.pod.node_name if observed else None, assumed.node if assumed else None):
        if node is not None and node in table.row:
            ok &= rows != table.row[node]
    return ok.tolist(), np.flatnonzero(~ok).tolist()


def filter_nodes(body: object, snapshot: Snapshot, config: PlacementSettings, now: float) -> VerbResult:
    """ExtenderArgs -> ExtenderFilterResult. Input order of passing nodes is kept."""
    args = _object(body, "ExtenderArgs")
    pod, _, problems = _pod(args, config, snapshot)
    names, node_objs, key = _candidates_keyed(args, unique=False)
    _ensure_ready(snapshot)
    snapshot.ledger.expire(now)
    result = VerbResult(body=None, problems=problems)
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    req = pod.requests
    marker = config.scheduling.marker_resource
    if marker is not None and req.ext(marker):
        # Routing marker only (managedResources, ignoredByScheduler): nodes never have it.
        req = dataclasses.replace(req, extended=tuple(e for e in req.extended if e[0] != marker))
    f = _FilterInput(
        req, _group_needed(pod), config.node_groups.enforce, tolerates_unschedulable(args["Pod"]), pod.key, pod.kind
    )
    if req.extended or len(names) < _VECTOR_MIN_NODES:
        if node_objs is None:
            _unique(names, "NodeNames")
        mask, undecided = [False] * len(names), list(range(len(names)))
    else:
        mask, undecided = _passing_mask(names, snapshot, f, key)
    for i in undecided:
        name = names[i]
        verdict = _judge(name, snapshot, f)
        if verdict is None:
            mask[i] = True
            continue
        resolvable, label, reason = verdict
        (failed if resolvable else unresolvable)[name] = reason
        result.filtered_out[label] += 1
    out: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": "",
    }
    if node_objs is None:
        out["NodeNames"] = list(compress(names, mask))
    else:
        out["Nodes"] = {"metadata": {}, "items": list(compress(node_objs, mask))}
    result.body = out
    result.decisions["filter"] += 1
    if log.isEnabledFor(logging.DEBUG):
        passed = len(names) - len(failed) - len(unresolvable)
        log.debug(
            "filter",
            extra={
                "pod": pod.key,
                "decision": {"passed": passed, "failed": len(failed), "unresolvable": len(unresolvable)},
            },
        )
    return result


# -------------------------------------------------------------------------------------------- prioritize


def _held(snapshot: Snapshot, key: str) -> bool:
    """Whether the pod already occupies a node in our view (observed bound or assumed by a bind)."""
    entry = snapshot.pods.get(key)
    return key in snapshot.ledger or (entry is not None and entry.pod.node_name is not None)


def _policy_label(pod: Pod, profile: str) -> str:
    if pod.kind is WorkloadKind.BATCH:
        return "lrp-slack" if slack.slack_demand(pod.requests) is not None else "time-bin-bfd"
    return "least-allocated" if profile == "spread" else "bfd"


def prioritize(body: object, snapshot: Snapshot, config: PlacementSettings, now: float) -> VerbResult:
    """ExtenderArgs -> HostPriorityList, Score 1..10 for the input nodes that score, in input order.

    Scores come from packing.score_nodes (rank-based, so the core's order survives the 0..10 range). Nodes
    scoring 0 (unknown, wrong group, no fit, below the 10 best ranks: most of a large cluster) are left out:
    kube-scheduler adds each listed host's Score x weight to a map that starts at 0 for every node
    (prioritizeNodes' combinedScores), so an absent host and a 0 are the same, and 5,000 objects fewer to
    build, send and decode. The common case (cost profile, service pod) runs vectorised over the node table
    (packing.bfd_rank_scores), other profiles and kinds over node views.
    """
    args = _object(body, "ExtenderArgs")
    pod, _, problems = _pod(args, config, snapshot)
    names, node_objs, key = _candidates_keyed(args, unique=False)
    _ensure_ready(snapshot)
    snapshot.ledger.expire(now)
    groups = _group_needed(pod)
    enforce = config.node_groups.enforce
    tolerates = tolerates_unschedulable(args["Pod"])  # the filter's rule: a cordoned node it passed can score
    vector = (
        config.scheduling.profile == "cost"
        and pod.kind is not WorkloadKind.BATCH
        and not pod.requests.extended
        and len(names) >= _VECTOR_MIN_NODES
        and not _held(snapshot, pod.key)
    )
    if vector:
        table, index = _rows(names, snapshot, key)
        r = index.safe
        req = pod.requests
        mem_left = table.alloc_mem[r] - table.used_mem[r] - saturate(req.memory_bytes)
        cpu_left = table.alloc_cpu[r] - table.used_cpu[r] - saturate(req.cpu_milli)
        feasible = index.known & (mem_left >= 0) & (cpu_left >= 0)
        if not tolerates:
            feasible &= ~table.unschedulable[r]
        feasible &= table.alloc_pods[r] >= table.used_pods[r] + 1
        if enforce:
            feasible &= (table.groups[r] & _group_bits(groups)) != 0
        ranked = packing.bfd_rank_scores(mem_left, cpu_left, feasible)
        top = np.flatnonzero(ranked).tolist()
        values = ranked[top].tolist()
        scores = {names[i]: v for i, v in zip(top, values, strict=True)}
        result = VerbResult(body=[{"Host": names[i], "Score": v} for i, v in zip(top, values, strict=True)])
    elif (demand := slack.slack_demand(pod.requests)) is not None:
        # A co-located pod: LRP over the predicted availability, read from the prediction the slack controller
        # published on the nodes (the same numbers the filter verb and the kubelet admit against).
        if node_objs is None:
            _unique(names, "NodeNames")
        candidates = []
        for name in names:
            entry = snapshot.nodes.get(name)
            if entry is None or (enforce and not (groups & entry.accepts)):
                continue
            candidates.append((name, entry.node.allocatable, snapshot.requested_on(name, exclude=pod.key)[0]))
        scores = slack.colocated_scores(candidates, demand)
        result = VerbResult(body=[{"Host": n, "Score": scores[n]} for n in names if scores.get(n, 0) > 0])
    else:
        if node_objs is None:
            _unique(names, "NodeNames")
        views = []
        for name in names:
            entry = snapshot.nodes.get(name)
            if entry is None or (enforce and not (groups & entry.accepts)):
                continue
            view = snapshot.node_view(name, exclude=pod.key)
            if view is not None and tolerates and view.unschedulable:
                view = dataclasses.replace(view, unschedulable=False)
            if view is not None:
                views.append(view)
        scores = packing.score_nodes(
            config.scheduling.profile, views, pod, now, config.scheduling.scaling_cycle_seconds
        )
        result = VerbResult(body=[{"Host": n, "Score": int(scores[n])} for n in names if scores.get(n, 0) > 0])
    result.problems = problems
    policy = _policy_label(pod, config.scheduling.profile)
    result.decisions[policy] += 1
    if log.isEnabledFor(logging.DEBUG):
        best = max(scores.items(), key=lambda kv: (kv[1], kv[0]), default=(None, 0))
        log.debug(
            "prioritize", extra={"pod": pod.key, "node": best[0], "decision": {"policy": policy, "score": best[1]}}
        )
    return result


# ----------------------------------------------------------------------------------------------- preempt


def _instance(pod: Pod, created: float | None, now: float) -> qos.Instance:
    """QoS state of a pod from its own timestamps: e = time running since it started, p = time it waited
    before that (or until now while pending). The controller's SLI accounting (per request, across
    preemptions) will replace this approximation when it lands."""
    start = pod.started_at if pod.node_name is not None else None
    created = created if created is not None else (start if start is not None else now)
    remaining = float(pod.remaining_runtime(now))  # a batch pod's run ahead counts in its Q (qos.q_metric)
    if start is None:
        return qos.Instance(pod, 0.0, max(0.0, now - created), admitted=True, remaining_seconds=remaining)
    e = max(0.0, now - start)
    return qos.Instance(pod, e, max(0.0, start - created), current_run_seconds=e, remaining_seconds=remaining)


def _victim_uids(node: str, raw: object, meta: bool) -> tuple[list[str], int]:
    what = f"{'NodeNameToMetaVictims' if meta else 'NodeNameToVictims'}[{node!r}]"
    victims = _object(raw, what)
    pods = victims.get("Pods")
    if pods is None:
        pods = []
    if not isinstance(pods, list):
        raise InvalidInputError(f"{what}.Pods must be an array, got {_json_type(pods)}")
    pdb = victims.get("NumPDBViolations", 0)
    if pdb is None:
        pdb = 0
    if isinstance(pdb, bool) or not isinstance(pdb, int) or pdb < 0:
        raise InvalidInputError(f"{what}.NumPDBViolations must be a non-negative integer, got {pdb!r}")
    uids: list[str] = []
    for i, p in enumerate(pods):
        if meta:
            uid = p.get("UID") if isinstance(p, dict) else None
        else:
            m = p.get("metadata") if isinstance(p, dict) else None
            uid = m.get("uid") if isinstance(m, dict) else None
        if not isinstance(uid, str) or not uid:
            raise InvalidInputError(f"{what}.Pods[{i}] has no UID")
        uids.append(uid)
    return uids, pdb


def whole_set_verdict(
    pending: qos.Instance,
    node: Node,
    proposed: Sequence[str],
    running: Mapping[str, qos.Instance],
    policy: qos.QosPolicy,
) -> str | None:
    """None when kube-scheduler's whole proposed victim set on ``node`` may go, else why the node is dropped.

    Upstream's set is already minimal (it reprieves victims greedily, counting nominated pods our snapshot
    does not see), so a strict subset of it would be too few evictions when views agree, and repeated
    preemption rounds when they do not. We therefore never narrow: every proposed victim must be a pod we
    know on that node and QoS-eligible (``qos.may_preempt``, paper 002 §3.3.1), and the pending pod must fit
    once all of them are gone; otherwise the node is dropped. A node where our snapshot says the pod fits
    without any victim is dropped too: evicting there is useless if we are right, and if kube-scheduler is
    (a nominated pod we cannot see holds the space) the divergence ends when that pod binds.
    """
    if node.unschedulable:
        return "node-cordoned"
    free = node.free
    if pending.pod.requests.fits_in(free):
        return "fits-without-victims"
    on_node = {p.key: p for p in node.pods}
    for key in proposed:
        inst = running.get(key)
        if key not in on_node or inst is None:
            return "victim-unknown"
        if not qos.may_preempt(inst, pending, policy):
            return "victim-not-eligible"
        free = free + on_node[key].requests
    if not pending.pod.requests.fits_in(free):
        return "does-not-fit"
    return None


def _fits_without_victims(names: list[str], snapshot: Snapshot, pod: Pod, tolerates: bool) -> set[str]:
    """The candidate nodes where our snapshot says the pod fits as they are (whole_set_verdict drops them),
    from the node table in one pass; empty when the pod needs the per-node path (extended resources, or it
    already occupies a node and must be excluded from it)."""
    req = pod.requests
    if req.extended or len(names) < _VECTOR_MIN_NODES or _held(snapshot, pod.key):
        return set()
    table = snapshot.fresh_table()
    rows = np.fromiter(map(table.row.get, names, repeat(-1)), dtype=np.int64, count=len(names))
    r = np.where(rows >= 0, rows, 0)
    fits = rows >= 0
    if not tolerates:
        fits &= ~table.unschedulable[r]
    fits &= table.alloc_cpu[r] - table.used_cpu[r] >= req.cpu_milli
    fits &= table.alloc_mem[r] - table.used_mem[r] >= req.memory_bytes
    fits &= table.alloc_pods[r] - table.used_pods[r] >= req.pods
    return set(compress(names, fits.tolist()))


def preempt(body: object, snapshot: Snapshot, config: PlacementSettings, now: float) -> VerbResult:
    """ExtenderPreemptionArgs -> ExtenderPreemptionResult: each node's whole proposed victim set, or no node.

    See ``whole_set_verdict``. A node our snapshot does not know is dropped. Every returned UID is one the
    request contained, in the request's order (kube-scheduler reads Pods[0] as the highest-priority victim),
    and NumPDBViolations is passed through (the set is unchanged, so is its count).
    """
    args = _object(body, "ExtenderPreemptionArgs")
    pod, created, problems = _pod(args, config, snapshot)
    meta_raw = args.get("NodeNameToMetaVictims")
    full_raw = args.get("NodeNameToVictims")
    if meta_raw is not None and full_raw is not None:
        raise InvalidInputError("both NodeNameToVictims and NodeNameToMetaVictims are set")
    if meta_raw is None and full_raw is None:
        raise InvalidInputError("neither NodeNameToVictims nor NodeNameToMetaVictims is set")
    meta = meta_raw is not None
    proposal = _object(meta_raw if meta else full_raw, "NodeNameToMetaVictims" if meta else "NodeNameToVictims")
    parsed = {node: _victim_uids(node, raw, meta) for node, raw in proposal.items()}
    _ensure_ready(snapshot)
    snapshot.ledger.expire(now)
    pending = _instance(pod, created, now)
    policy = config.policy
    policy.cls(pod.class_name)  # an unknown class cannot happen (conversion defaults it): fail loudly if so
    result = VerbResult(body=None, problems=problems)
    out: dict[str, Any] = {}
    tolerates = tolerates_unschedulable(args["Pod"])  # as the filter: a cordoned node is no reason to drop
    roomy = _fits_without_victims(list(parsed), snapshot, pod, tolerates)
    groups = _group_needed(pod) if config.node_groups.enforce else None
    for node, (uids, pdb) in parsed.items():
        verdict: str | None
        known = snapshot.nodes.get(node)
        if groups is not None and known is not None and not (groups & known.accepts):
            # The filter refuses this node for good (node_group, unresolvable), but kube-scheduler offers as
            # candidates the nodes its own plugins failed (Insufficient cpu), which never reached our filter:
            # evicting there frees room the pod may not take, and kube-scheduler then preempts elsewhere again.
            result.victims_dropped += len(uids)
            log.info("preempt: node dropped", extra={"pod": pod.key, "node": node, "decision": "node-group"})
            continue
        if node in roomy:
            verdict = "fits-without-victims"
            result.victims_dropped += len(uids)
            continue
        view = snapshot.node_view(node, exclude=pod.key)
        if view is not None and tolerates and view.unschedulable:
            view = dataclasses.replace(view, unschedulable=False)
        if view is None:
            verdict = "unknown-node"
        elif not uids:
            verdict = "no-victims"  # kube-scheduler rejects an empty list ("expected at least one victim pod")
        elif pod.requests.fits_in(view.free) and not view.unschedulable:
            verdict = "fits-without-victims"  # see whole_set_verdict; decided before reading the victims
        else:
            keys: list[str] = []
            running: dict[str, qos.Instance] = {}
            for uid in uids:
                key = snapshot.key_for_uid(uid)
                entry = snapshot.pods.get(key) if key is not None else None
                if key is None or entry is None or entry.pod.node_name != node:
                    keys.append(f"uid:{uid}")  # unknown to us: whole_set_verdict drops the node
                    continue
                keys.append(key)
                running[key] = _instance(entry.pod, entry.created_at, now)
            verdict = whole_set_verdict(pending, view, keys, running, policy)
        if verdict is not None:
            result.victims_dropped += len(uids)
            log.info("preempt: node dropped", extra={"pod": pod.key, "node": node, "decision": verdict})
            continue
        result.victims_kept += len(uids)
        out[node] = {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": pdb}
        log.info("preempt", extra={"pod": pod.key, "node": node, "decision": {"victims": len(uids)}})
    result.body = {"NodeNameToMetaVictims": out}
    result.decisions["qos-preemption"] += 1
    return result


# -------------------------------------------------------------------------------------------------- bind


# BindArgs without its generated __new__ (a Python function around this very call): half the construction time
_new_bind_args: Callable[[type[BindArgs], tuple[str, str, str, str]], BindArgs] = tuple.__new__


def parse_bind_args(body: object) -> BindArgs:
    args = body if type(body) is dict else _object(body, "ExtenderBindingArgs")
    name, namespace, uid, node = args.get("PodName"), args.get("PodNamespace"), args.get("PodUID"), args.get("Node")
    # one test for the common case (the bind verb's whole decision is a few microseconds); the loop below
    # names the first bad field
    if (
        type(name) is str
        and type(namespace) is str
        and type(uid) is str
        and type(node) is str
        and name
        and namespace
        and node
    ):
        return _new_bind_args(BindArgs, (namespace, name, uid, node))
    for field_name in ("PodName", "PodNamespace", "PodUID", "Node"):
        v = args.get(field_name)
        if not isinstance(v, str) or (not v and field_name != "PodUID"):
            raise InvalidInputError(f"{field_name} must be a non-empty string, got {v!r}")
    # str subclasses, checked above: passed on as they are
    return BindArgs(args["PodNamespace"], args["PodName"], args["PodUID"], args["Node"])


PodReader = Callable[[str, str], Awaitable[Mapping[str, Any] | None]]
"""Reads a pod from the API server by (namespace, name); None when it does not exist. The bind verb asks it only
for a pod its snapshot does not hold yet (the watch lags the scheduler's), so the checks below never rest on the
caller's word."""


class BindRefused(Exception):
    """The bind verb refused before any Binding: ``reason`` is the metric label, the message the Error field."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _ownership(key: str, node: str, scheduler: str, bound_to: str | None, served: Sequence[str]) -> bool:
    """True when the pod is already bound to ``node`` (nothing to do); raises BindRefused when the pod is not ours
    to bind (another scheduler's, or bound elsewhere); False when a Binding may be created."""
    if scheduler not in served:
        raise BindRefused(
            "pod_not_ours",
            f"cannot bind {key}: its schedulerName {scheduler!r} is not one this extender serves "
            f"(bind.scheduler_names: {', '.join(served)})",
        )
    if bound_to:
        if bound_to == node:
            return True
        raise BindRefused("pod_already_bound", f"cannot bind {key} to {node}: it is already bound to node {bound_to!r}")
    return False


async def _read_owner(
    key: str, namespace: str, name: str, uid: str, read_pod: PodReader | None
) -> tuple[str, str | None]:
    """(schedulerName, spec.nodeName) of a pod the snapshot does not hold, from the API server."""
    if read_pod is None:
        raise BindRefused("pod_unknown", f"cannot bind {key}: the pod is not in the extender's snapshot yet")
    try:
        obj = await read_pod(namespace, name)
    except Exception as exc:  # a timeout or an API error: refuse (kube-scheduler retries the pod), never guess
        raise BindRefused("pod_unknown", f"cannot bind {key}: reading the pod failed: {exc}") from exc
    if obj is None:
        raise BindRefused("pod_unknown", f"cannot bind {key}: pod not found (deleted?)")
    raw_meta, raw_spec = obj.get("metadata"), obj.get("spec")
    meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
    spec: Mapping[str, Any] = raw_spec if isinstance(raw_spec, Mapping) else {}
    if uid and meta.get("uid") != uid:
        raise BindRefused("pod_unknown", f"cannot bind {key}: uid {uid} is not the current pod ({meta.get('uid')})")
    scheduler = spec.get("schedulerName")
    node = spec.get("nodeName")
    return (
        scheduler if isinstance(scheduler, str) and scheduler else "default-scheduler",
        node if isinstance(node, str) and node else None,
    )


async def bind(
    args: BindArgs, snapshot: Snapshot, binder: Binder, now: float, read_pod: PodReader | None = None
) -> tuple[dict[str, str], int]:
    """ExtenderBindingArgs -> ExtenderBindingResult; returns (body, retries).

    Only our pods, only unbound ones: the pod's spec.schedulerName must be one of bind.scheduler_names and its
    spec.nodeName empty (or already the requested node: an earlier call's Binding, answered as success), read
    from the snapshot or, for a pod the watch has not delivered yet, from the API server (``read_pod``; without
    it such a pod is refused). A refusal raises ``BindRefused`` before anything is assumed or POSTed.

    The pod is assumed on the node *before* the Binding POST, as kube-scheduler's assume() does: a filter
    answered while the POST is in flight must already count it. A refused bind drops the assumption; one
    cancelled or timed out may have been applied (``BindError.in_doubt``), so it stays assumed until the watch
    or the ledger's TTL ends it. A pod deleted during the call loses it through the watch (Snapshot.apply_pod),
    and nothing re-adds it after the POST returns. A pod the watch has not delivered yet is assumed from the
    Pod of its filter request.
    """
    _ensure_ready(snapshot)
    namespace, name, uid, node = args
    key = f"{namespace}/{name}"  # BindArgs.key, unpacked: a twentieth of the decision less than the property
    if node not in snapshot.nodes:
        return {"Error": f"cannot bind {key}: node {node!r} is not in the extender's snapshot"}, 0
    entry = snapshot.pods.get(key)
    pod: Pod | None = None
    served = snapshot.config.bind.scheduler_names
    if entry is not None:
        pod = entry.pod
        if uid and pod.uid and pod.uid != uid:
            return {"Error": f"cannot bind {key}: uid {uid} is not the current pod ({pod.uid})"}, 0
        if _ownership(key, node, entry.scheduler_name, pod.node_name, served):
            return {"Error": ""}, 0  # kube-scheduler retrying a bind whose Binding the watch already shows
    else:
        scheduler, bound_to = await _read_owner(key, namespace, name, uid, read_pod)
        if _ownership(key, node, scheduler, bound_to, served):
            return {"Error": ""}, 0
        if uid:
            seen: ParsedPod | None = snapshot.request_pods.latest(uid)
            if seen is not None and seen[0].key == key:
                pod = seen[0]
    assumed = snapshot.assume_bind(pod, node, now) if pod is not None else None
    if assumed is None:
        log.warning("bind: pod unknown (not watched, no filter request seen), not assumed", extra={"pod": key})
    try:
        retries = await binder.bind(args)
    except BaseException as exc:
        # Only a definite refusal frees the space. Cancelled (the scheduler gave up on the call), timed out or
        # any other break after the POST may have been sent: the Binding may exist, so the pod stays assumed
        # until the watch shows it bound or gone, or the ledger's TTL drops it (as kube-scheduler's assume
        # cache expires a bind that never finished).
        definite = isinstance(exc, BindError) and not exc.in_doubt
        if assumed is not None and definite:
            snapshot.cancel_bind(assumed)
        if isinstance(exc, BindError):
            log.warning(
                "bind failed",
                extra={"pod": key, "node": node, "decision": {"error": str(exc), "in_doubt": not definite}},
            )
        raise
    if log.isEnabledFor(logging.INFO):  # the extra dict alone is a tenth of the decision when nobody logs it
        log.info("bind", extra={"pod": key, "node": node, "decision": {"retries": retries}})
    return {"Error": ""}, retries
