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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from extender.config import ExtenderConfig
from extender.core import packing, qos
from extender.core.model import InvalidInputError, NodeGroup, Pod, Resources, WorkloadKind
from extender.kube.binding import BindArgs, Binder, BindError
from extender.kube.convert import PodProblems, parse_timestamp, pod_from_k8s
from extender.kube.snapshot import Snapshot

__all__ = [
    "BindArgs",
    "BindError",
    "Binder",
    "PodProblems",
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


def _pod(body: Mapping[str, Any], config: ExtenderConfig) -> tuple[Pod, float | None, PodProblems | None]:
    raw = body.get("Pod")
    if raw is None:
        raise InvalidInputError("missing Pod")
    if not isinstance(raw, dict):
        raise InvalidInputError(f"Pod must be a JSON object, got {_json_type(raw)}")
    pod, problems = pod_from_k8s(raw, config.pod_defaults, config.policy.classes, config.scheduling.managed_resources)
    meta = raw.get("metadata") or {}
    created = parse_timestamp(meta.get("creationTimestamp"))
    reported = PodProblems(pod.namespace, pod.name, pod.uid, problems) if problems else None
    return pod, created, reported


def _unique(names: Sequence[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InvalidInputError(f"duplicate node name {name!r} in {what}")
        seen.add(name)


def _candidates(body: Mapping[str, Any]) -> tuple[list[str], list[dict[str, Any]] | None]:
    """(node names, node objects or None): NodeNames in nodeCacheCapable mode, Nodes.items otherwise."""
    names_raw = body.get("NodeNames")
    nodes_raw = body.get("Nodes")
    if names_raw is not None and nodes_raw is not None:
        raise InvalidInputError("both Nodes and NodeNames are set; kube-scheduler sends exactly one of them")
    if names_raw is not None:
        if not isinstance(names_raw, list):
            raise InvalidInputError(f"NodeNames must be an array of strings, got {_json_type(names_raw)}")
        for n in names_raw:
            if not isinstance(n, str) or not n:
                raise InvalidInputError(f"NodeNames must hold non-empty strings, got {n!r}")
        _unique(names_raw, "NodeNames")
        return list(names_raw), None
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
        return names, items
    raise InvalidInputError("neither Nodes nor NodeNames is set")


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


def _tolerates_unschedulable(pod_obj: Mapping[str, Any]) -> bool:
    spec = pod_obj.get("spec")
    tolerations = spec.get("tolerations") if isinstance(spec, dict) else None
    if not isinstance(tolerations, list):
        return False
    for t in tolerations:
        if not isinstance(t, dict) or t.get("effect") not in (None, "", "NoSchedule"):
            continue
        key, op = t.get("key") or "", t.get("operator") or "Equal"
        if (key == "" and op == "Exists") or (key == "node.kubernetes.io/unschedulable" and op == "Exists"):
            return True
    return False


def _group_needed(pod: Pod) -> NodeGroup:
    return NodeGroup.BATCH if pod.kind is WorkloadKind.BATCH else NodeGroup.SERVICE


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


def filter_nodes(body: object, snapshot: Snapshot, config: ExtenderConfig, now: float) -> VerbResult:
    """ExtenderArgs -> ExtenderFilterResult. Input order of passing nodes is kept."""
    args = _object(body, "ExtenderArgs")
    pod, _, problems = _pod(args, config)
    names, node_objs = _candidates(args)
    _ensure_ready(snapshot)
    snapshot.ledger.expire(now)
    result = VerbResult(body=None, problems=problems)
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    passed: list[int] = []
    req = pod.requests
    marker = config.scheduling.marker_resource
    if marker is not None and req.ext(marker):
        # Routing marker only (managedResources, ignoredByScheduler): nodes never have it.
        req = dataclasses.replace(req, extended=tuple(e for e in req.extended if e[0] != marker))
    group = _group_needed(pod)
    enforce = config.node_groups.enforce
    tolerates = None
    key = pod.key
    for i, name in enumerate(names):
        entry = snapshot.nodes.get(name)
        if entry is None:
            failed[name] = "node is not in the extender's snapshot yet (watch lagging); retry"
            result.filtered_out["unknown_node"] += 1
            continue
        node = entry.node
        if enforce and group not in entry.accepts:
            groups = "/".join(sorted(g.value for g in entry.accepts)) or "no"
            unresolvable[name] = f"node group mismatch: {pod.kind.value} pod, node accepts {groups} pods"
            result.filtered_out["node_group"] += 1
            continue
        if node.unschedulable:
            if tolerates is None:
                raw_pod = args["Pod"]
                tolerates = _tolerates_unschedulable(raw_pod)
            if not tolerates:
                unresolvable[name] = "node is cordoned (spec.unschedulable)"
                result.filtered_out["unschedulable"] += 1
                continue
        alloc = node.allocatable
        too_large = _too_large(req, alloc)
        if too_large is not None:
            unresolvable[name] = too_large
            result.filtered_out["too_large"] += 1
            continue
        requested, count = snapshot.requested_on(name, exclude=key)
        short = _shortfall(req, requested, count, alloc)
        if short is not None:
            failed[name] = short[1]
            result.filtered_out[short[0]] += 1
            continue
        passed.append(i)
    out: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": "",
    }
    if node_objs is None:
        out["NodeNames"] = [names[i] for i in passed]
    else:
        out["Nodes"] = {"metadata": {}, "items": [node_objs[i] for i in passed]}
    result.body = out
    result.decisions["filter"] += 1
    log.debug(
        "filter",
        extra={
            "pod": pod.key,
            "decision": {"passed": len(passed), "failed": len(failed), "unresolvable": len(unresolvable)},
        },
    )
    return result


# -------------------------------------------------------------------------------------------- prioritize


def _policy_label(pod: Pod, profile: str) -> str:
    if pod.kind is WorkloadKind.BATCH:
        return "time-bin-bfd"
    return "least-allocated" if profile == "spread" else "bfd"


def prioritize(body: object, snapshot: Snapshot, config: ExtenderConfig, now: float) -> VerbResult:
    """ExtenderArgs -> HostPriorityList, Score 0..10 per input node (0: unknown / wrong group / no fit).

    Scores come from packing.score_nodes (rank-based, so the core's order survives the 0..10 range).
    """
    args = _object(body, "ExtenderArgs")
    pod, _, problems = _pod(args, config)
    names, _ = _candidates(args)
    _ensure_ready(snapshot)
    snapshot.ledger.expire(now)
    group = _group_needed(pod)
    enforce = config.node_groups.enforce
    views = []
    for name in names:
        entry = snapshot.nodes.get(name)
        if entry is None or (enforce and group not in entry.accepts):
            continue
        view = snapshot.node_view(name, exclude=pod.key)
        if view is not None:
            views.append(view)
    scores = packing.score_nodes(config.scheduling.profile, views, pod, now, config.scheduling.scaling_cycle_seconds)
    result = VerbResult(body=[{"Host": name, "Score": int(scores.get(name, 0))} for name in names], problems=problems)
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
    if start is None:
        return qos.Instance(pod, 0.0, max(0.0, now - created), admitted=True)
    e = max(0.0, now - start)
    return qos.Instance(pod, e, max(0.0, start - created), current_run_seconds=e)


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


def preempt(body: object, snapshot: Snapshot, config: ExtenderConfig, now: float) -> VerbResult:
    """ExtenderPreemptionArgs -> ExtenderPreemptionResult: keep only the victims the QoS rules allow.

    kube-scheduler proposed the victims by priority; qos.narrow_victims keeps the eligible ones (paper 002
    §3.3.1), largest Q first, until the pod fits. A node is dropped when the allowed victims do not free
    enough, and also when our snapshot says no victim is needed at all: kube-scheduler rejects an empty
    victim list ("expected at least one victim pod on node") and the disagreement means one cache is stale,
    so the safe answer is not to preempt there. Every returned UID is one the request contained, in the
    request's order (kube-scheduler reads Pods[0] as the highest-priority victim).
    """
    args = _object(body, "ExtenderPreemptionArgs")
    pod, created, problems = _pod(args, config)
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
    result = VerbResult(body=None, problems=problems)
    out: dict[str, Any] = {}
    for node, (uids, pdb) in parsed.items():
        view = snapshot.node_view(node, exclude=pod.key)
        if view is None:
            result.victims_dropped += len(uids)
            log.info("preempt: unknown node dropped", extra={"pod": pod.key, "node": node})
            continue
        key_to_uid: dict[str, str] = {}
        running: dict[str, qos.Instance] = {}
        for uid in uids:
            key = snapshot.key_for_uid(uid)
            entry = snapshot.pods.get(key) if key is not None else None
            if key is None or entry is None or entry.pod.node_name != node:
                continue
            key_to_uid[key] = uid
            running[key] = _instance(entry.pod, entry.created_at, now)
        try:
            chosen = qos.narrow_victims(pending, view, list(key_to_uid), running, policy)
        except InvalidInputError as exc:
            # An unknown class in the snapshot cannot happen (conversion defaults it); treat defensively.
            log.warning("preempt: node skipped", extra={"pod": pod.key, "node": node, "decision": str(exc)})
            chosen = None
        if not chosen:
            result.victims_dropped += len(uids)
            log.info(
                "preempt: node dropped",
                extra={
                    "pod": pod.key,
                    "node": node,
                    "decision": "fits-without-victims" if chosen == () else "no-qos-victims",
                },
            )
            continue
        keep = {key_to_uid[k] for k in chosen}
        kept = [u for u in uids if u in keep]
        result.victims_kept += len(kept)
        result.victims_dropped += len(uids) - len(kept)
        out[node] = {"Pods": [{"UID": u} for u in kept], "NumPDBViolations": min(pdb, len(kept))}
        log.info("preempt", extra={"pod": pod.key, "node": node, "decision": {"victims": sorted(chosen)}})
    result.body = {"NodeNameToMetaVictims": out}
    result.decisions["qos-preemption"] += 1
    return result


# -------------------------------------------------------------------------------------------------- bind


def parse_bind_args(body: object) -> BindArgs:
    args = _object(body, "ExtenderBindingArgs")
    values: dict[str, str] = {}
    for field_name in ("PodName", "PodNamespace", "PodUID", "Node"):
        v = args.get(field_name)
        if not isinstance(v, str) or (not v and field_name != "PodUID"):
            raise InvalidInputError(f"{field_name} must be a non-empty string, got {v!r}")
        values[field_name] = v
    return BindArgs(values["PodNamespace"], values["PodName"], values["PodUID"], values["Node"])


async def bind(args: BindArgs, snapshot: Snapshot, binder: Binder, now: float) -> tuple[dict[str, str], int]:
    """ExtenderBindingArgs -> ExtenderBindingResult; returns (body, retries). Records the allocation."""
    _ensure_ready(snapshot)
    if args.node not in snapshot.nodes:
        return {"Error": f"cannot bind {args.key}: node {args.node!r} is not in the extender's snapshot"}, 0
    entry = snapshot.pods.get(args.key)
    if entry is not None and args.uid and entry.pod.uid and entry.pod.uid != args.uid:
        return {"Error": f"cannot bind {args.key}: uid {args.uid} is not the current pod ({entry.pod.uid})"}, 0
    try:
        retries = await binder.bind(args)
    except BindError as exc:
        log.warning("bind failed", extra={"pod": args.key, "node": args.node, "decision": str(exc)})
        raise
    if entry is not None:
        snapshot.record_bind(entry.pod, args.node, now)
    else:
        log.warning("bind: pod not in snapshot, not assumed", extra={"pod": args.key, "node": args.node})
    log.info("bind", extra={"pod": args.key, "node": args.node, "decision": {"retries": retries}})
    return {"Error": ""}, retries
