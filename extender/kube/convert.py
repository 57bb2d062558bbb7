"""Kubernetes JSON (plain dicts, as the scheduler sends them and as the API returns them) -> core model.

Plain dicts from orjson, never the generated model classes: converting a 5,000-node NodeList through them
costs more than the decision itself. Every function here is pure.

Two kinds of bad input are told apart:
* a body that is not a Pod/Node at all (wrong types where Kubernetes has a schema) raises
  ``InvalidInputError`` -> the webhook answers 400;
* our own annotations (``qos.kube-qos-extender.io/...``) are user input the API server does not validate:
  a malformed value yields the documented default plus a ``Problem``, which the shell turns into an Event on
  the pod. Never a crash, never a silent drop.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from extender.core.model import (
    ANNOTATION_PREFIX,
    InvalidInputError,
    Node,
    NodeGroup,
    Pod,
    Resources,
    ServiceClass,
    WorkloadKind,
    cpu_millicores,
    memory_bytes,
    parse_quantity,
)
from extender.core.taints import Taint, Toleration
from extender.settings.sections import NodeGroupsConfig, PodDefaults

__all__ = [
    "CLASS_KEY",
    "COLOCATE_KEY",
    "KIND_KEY",
    "MIGRATABLE_KEY",
    "RUNTIME_KEY",
    "PodProblems",
    "PodSettings",
    "Problem",
    "node_from_k8s",
    "node_group_of",
    "parse_timestamp",
    "pod_from_k8s",
    "pod_key",
    "pod_requests",
    "pod_settings",
    "taints_of",
    "tolerations_of",
]

CLASS_KEY = ANNOTATION_PREFIX + "class"
KIND_KEY = ANNOTATION_PREFIX + "kind"
RUNTIME_KEY = ANNOTATION_PREFIX + "runtime-seconds"
MIGRATABLE_KEY = ANNOTATION_PREFIX + "migratable"
# "true": the admission webhook moves the pod's cpu/memory requests onto the slack (extender.webhook.colocate)
COLOCATE_KEY = ANNOTATION_PREFIX + "colocate"

_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class Problem:
    """A malformed annotation/label: which key, what was wrong, what default was used instead."""

    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


@dataclass(frozen=True, slots=True)
class PodProblems:
    """The annotation problems of one pod, for an Event on it."""

    namespace: str
    name: str
    uid: str
    problems: tuple[Problem, ...]


@dataclass(frozen=True, slots=True)
class PodSettings:
    """The QoS settings of a pod after defaults: what our annotations say, or what they should have said."""

    class_name: str
    kind: WorkloadKind
    runtime_seconds: float | None
    migratable: bool
    problems: tuple[Problem, ...] = ()


# ------------------------------------------------------------------------------------------ typed access


def _dict(obj: object, what: str) -> dict[str, Any]:
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise InvalidInputError(f"{what} must be an object, got {type(obj).__name__}")
    return obj


def _list(obj: object, what: str) -> list[Any]:
    if obj is None:
        return []
    if not isinstance(obj, list):
        raise InvalidInputError(f"{what} must be a list, got {type(obj).__name__}")
    return obj


def _opt_str(obj: object, what: str) -> str | None:
    if obj is None:
        return None
    if not isinstance(obj, str):
        raise InvalidInputError(f"{what} must be a string, got {type(obj).__name__}")
    return obj


def _str_map(obj: object, what: str) -> dict[str, str]:
    d = _dict(obj, what)
    for k, v in d.items():
        if not isinstance(v, str):
            raise InvalidInputError(f"{what}[{k!r}] must be a string, got {type(v).__name__}")
    return d


def parse_timestamp(value: object) -> float | None:
    """RFC 3339 (``2026-11-21T23:24:27Z``) -> unix seconds; None when absent or unparsable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def pod_key(obj: Mapping[str, Any]) -> str:
    meta = _dict(obj.get("metadata"), "pod metadata")
    name = _opt_str(meta.get("name"), "pod metadata.name")
    if not name:
        raise InvalidInputError("pod metadata.name is missing")
    ns = _opt_str(meta.get("namespace"), "pod metadata.namespace") or "default"
    return f"{ns}/{name}"


# ---------------------------------------------------------------------------------------------- requests


def _amount(name: str, value: object) -> int:
    """One resource quantity in the unit the core uses: millicores for cpu, bytes/units otherwise."""
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise InvalidInputError(f"resource {name}: quantity must be a string or number, got {value!r}")
    if name == "cpu":
        return cpu_millicores(value)
    if name == "memory":
        return memory_bytes(value)
    amount = parse_quantity(value)
    if amount < 0:
        raise InvalidInputError(f"resource {name} must not be negative, got {value!r}")
    return math.ceil(amount)


def _resource_list(obj: object, what: str, wanted: frozenset[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, value in _dict(obj, what).items():
        if name in wanted:
            try:
                out[name] = _amount(name, value)
            except InvalidInputError as exc:
                raise InvalidInputError(f"{what}.{name}: {exc}") from None
    return out


def _add(acc: dict[str, int], more: Mapping[str, int]) -> None:
    for k, v in more.items():
        acc[k] = acc.get(k, 0) + v


def _max_into(acc: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        if v > acc.get(k, 0):
            acc[k] = v


def _wanted(managed: Iterable[str]) -> frozenset[str]:
    return frozenset(("cpu", "memory", *managed))


def pod_requests(obj: Mapping[str, Any], managed: Sequence[str] = ()) -> Resources:
    """What kube-scheduler's NodeResourcesFit charges a pod (component-helpers resource.PodRequests):

    sum of containers; each init container needs its own request plus the restartable (sidecar) init
    containers declared before it, and the pod needs the max of that and the steady state (where sidecars
    add to the containers' sum); pod-level ``spec.resources.requests`` (cpu, memory) replace the aggregate;
    ``spec.overhead`` is added. Extended resources are counted only when ``managed`` lists them.
    Not modelled: in-place resize (status resources), which kube-scheduler uses for running pods being resized.
    """
    spec = _dict(obj.get("spec"), "pod spec")
    wanted = _wanted(managed)
    reqs: dict[str, int] = {}
    for i, c in enumerate(_list(spec.get("containers"), "spec.containers")):
        c = _dict(c, f"spec.containers[{i}]")
        res = _dict(c.get("resources"), f"spec.containers[{i}].resources")
        _add(reqs, _resource_list(res.get("requests"), f"spec.containers[{i}].resources.requests", wanted))
    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for i, c in enumerate(_list(spec.get("initContainers"), "spec.initContainers")):
        c = _dict(c, f"spec.initContainers[{i}]")
        res = _dict(c.get("resources"), f"spec.initContainers[{i}].resources")
        own = _resource_list(res.get("requests"), f"spec.initContainers[{i}].resources.requests", wanted)
        if c.get("restartPolicy") == "Always":
            _add(reqs, own)
            _add(sidecars, own)
            _max_into(init_max, sidecars)
        else:
            during = dict(own)
            _add(during, sidecars)
            _max_into(init_max, during)
    _max_into(reqs, init_max)
    pod_level = _dict(_dict(spec.get("resources"), "spec.resources").get("requests"), "spec.resources.requests")
    reqs.update(_resource_list(pod_level, "spec.resources.requests", frozenset(("cpu", "memory"))))
    _add(reqs, _resource_list(spec.get("overhead"), "spec.overhead", wanted))
    extended = {k: v for k, v in reqs.items() if k not in ("cpu", "memory") and v}
    return Resources.request(reqs.get("cpu", 0), reqs.get("memory", 0), 1, extended)


# ------------------------------------------------------------------------------------------- annotations


def _lookup(meta: Mapping[str, Any], key: str) -> tuple[str | None, str]:
    """Annotation first, then label (labels are selectable, annotations hold anything); returns (value, where)."""
    annotations = meta.get("annotations")
    if isinstance(annotations, dict) and key in annotations:
        value = annotations[key]
        return (value if isinstance(value, str) else repr(value)), "annotation"
    labels = meta.get("labels")
    if isinstance(labels, dict) and key in labels:
        value = labels[key]
        return (value if isinstance(value, str) else repr(value)), "label"
    return None, ""


def _class_by_priority(priority: int, classes: Mapping[str, ServiceClass]) -> str | None:
    best: ServiceClass | None = None
    for cls in classes.values():
        if cls.priority <= priority and (
            best is None or (cls.priority, -cls.importance) > (best.priority, -best.importance)
        ):
            best = cls
    return best.name if best is not None else None


def pod_settings(obj: Mapping[str, Any], defaults: PodDefaults, classes: Mapping[str, ServiceClass]) -> PodSettings:
    """Class, kind, runtime and migratability from ``qos.kube-qos-extender.io/*`` (annotation, else label).

    Defaults (``pod_defaults``: docs/settings/extender.yaml): class from the pod's priority when
    ``class_from_priority`` (greatest class priority <= spec.priority), else ``pod_defaults.class``; kind
    ``pod_defaults.kind``; runtime ``pod_defaults.batch_runtime_seconds`` for batch pods; migratable = the pod
    is batch. A malformed value gets the default and a Problem.
    """
    meta = _dict(obj.get("metadata"), "pod metadata")
    spec = _dict(obj.get("spec"), "pod spec")
    problems: list[Problem] = []

    priority = spec.get("priority")
    if isinstance(priority, bool) or not isinstance(priority, int):
        priority = 0
    default_class = defaults.class_name
    if defaults.class_from_priority:
        default_class = _class_by_priority(priority, classes) or defaults.class_name

    raw, where = _lookup(meta, CLASS_KEY)
    class_name = default_class
    if raw is not None:
        if raw in classes:
            class_name = raw
        else:
            known = ", ".join(sorted(classes))
            problems.append(
                Problem(CLASS_KEY, f"unknown class {raw!r} in {where} (known: {known}); using {default_class!r}")
            )

    raw, where = _lookup(meta, KIND_KEY)
    kind = defaults.kind
    if raw is not None:
        try:
            kind = WorkloadKind(raw.strip().lower())
        except ValueError:
            problems.append(
                Problem(KIND_KEY, f"unknown kind {raw!r} in {where} (expected batch or service); using {kind.value!r}")
            )

    runtime: float | None = defaults.batch_runtime_seconds if kind is WorkloadKind.BATCH else None
    raw, where = _lookup(meta, RUNTIME_KEY)
    if raw is not None:
        try:
            value = float(raw.strip())
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            runtime = value
        else:
            problems.append(
                Problem(
                    RUNTIME_KEY,
                    f"malformed runtime {raw!r} in {where} (expected seconds, a finite number >= 0); "
                    f"using {'unknown' if runtime is None else runtime}",
                )
            )

    migratable = kind is WorkloadKind.BATCH
    raw, where = _lookup(meta, MIGRATABLE_KEY)
    if raw is not None:
        text = raw.strip().lower()
        if text in ("true", "false"):
            migratable = text == "true"
        else:
            problems.append(
                Problem(
                    MIGRATABLE_KEY,
                    f"malformed value {raw!r} in {where} (expected true or false); using {str(migratable).lower()}",
                )
            )
    raw, where = _lookup(meta, COLOCATE_KEY)
    if raw is not None and raw.strip().lower() not in ("true", "false"):
        problems.append(
            Problem(COLOCATE_KEY, f"malformed value {raw!r} in {where} (expected true or false); not co-located")
        )
    return PodSettings(class_name, kind, runtime, migratable, tuple(problems))


# --------------------------------------------------------------------------------------------------- pods


def _owner(meta: Mapping[str, Any], namespace: str) -> str:
    refs = meta.get("ownerReferences")
    if isinstance(refs, list):
        for ref in refs:
            if isinstance(ref, dict) and ref.get("controller") is True:
                kind, name = ref.get("kind"), ref.get("name")
                if isinstance(kind, str) and isinstance(name, str):
                    return f"{namespace}/{kind}/{name}"
    return ""


def is_terminal(obj: Mapping[str, Any]) -> bool:
    """Succeeded/Failed pods hold no resources (kube-scheduler's informer drops them too)."""
    status = obj.get("status")
    phase = status.get("phase") if isinstance(status, dict) else None
    return isinstance(phase, str) and phase in _TERMINAL_PHASES


def pod_started_at(obj: Mapping[str, Any]) -> float | None:
    """When the pod's current run began: status.startTime, else PodScheduled's transition, else None."""
    status = obj.get("status")
    if not isinstance(status, dict):
        return None
    started = parse_timestamp(status.get("startTime"))
    if started is not None:
        return started
    conditions = status.get("conditions")
    if isinstance(conditions, list):
        for cond in conditions:
            if isinstance(cond, dict) and cond.get("type") == "PodScheduled" and cond.get("status") == "True":
                return parse_timestamp(cond.get("lastTransitionTime"))
    return None


def pod_from_k8s(
    obj: Mapping[str, Any],
    defaults: PodDefaults,
    classes: Mapping[str, ServiceClass],
    managed: Sequence[str] = (),
    started_at: float | None = None,
) -> tuple[Pod, tuple[Problem, ...]]:
    """A Kubernetes Pod dict -> (core Pod, annotation problems). Raises InvalidInputError on a non-Pod.

    ``started_at`` is the fallback start time (e.g. when we bound it) for a pod whose status has none yet.
    """
    if not isinstance(obj, dict):
        raise InvalidInputError(f"pod must be an object, got {type(obj).__name__}")
    meta = _dict(obj.get("metadata"), "pod metadata")
    spec = _dict(obj.get("spec"), "pod spec")
    name = _opt_str(meta.get("name"), "pod metadata.name")
    if not name:
        raise InvalidInputError("pod metadata.name is missing")
    namespace = _opt_str(meta.get("namespace"), "pod metadata.namespace") or "default"
    uid = _opt_str(meta.get("uid"), "pod metadata.uid") or ""
    _str_map(meta.get("annotations"), "pod metadata.annotations")
    _str_map(meta.get("labels"), "pod metadata.labels")
    priority = spec.get("priority", 0)
    if priority is None:
        priority = 0
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidInputError(f"pod spec.priority must be an integer, got {priority!r}")
    node_name = _opt_str(spec.get("nodeName"), "pod spec.nodeName") or None
    settings = pod_settings(obj, defaults, classes)
    started = pod_started_at(obj) if node_name else None
    if started is None and node_name:
        started = started_at
    pod = Pod(
        name=name,
        requests=pod_requests(obj, managed),
        request_id=_owner(meta, namespace),
        namespace=namespace,
        uid=uid,
        priority=priority,
        class_name=settings.class_name,
        kind=settings.kind,
        runtime_seconds=settings.runtime_seconds,
        started_at=started,
        node_name=node_name,
        migratable=settings.migratable,
    )
    return pod, settings.problems


# -------------------------------------------------------------------------------------------------- nodes


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def node_group_of(labels: Mapping[str, str], groups: NodeGroupsConfig) -> frozenset[NodeGroup]:
    """The node groups a node accepts pods of (empty: none). Matching both selectors accepts both kinds."""
    accepted: set[NodeGroup] = set()
    if _matches(labels, groups.batch_selector):
        accepted.add(NodeGroup.BATCH)
    if _matches(labels, groups.service_selector):
        accepted.add(NodeGroup.SERVICE)
    if accepted:
        return frozenset(accepted)
    if groups.unlabelled == "any":
        return frozenset((NodeGroup.BATCH, NodeGroup.SERVICE))
    if groups.unlabelled == "batch":
        return frozenset((NodeGroup.BATCH,))
    if groups.unlabelled == "service":
        return frozenset((NodeGroup.SERVICE,))
    return frozenset()


def _node_resources(obj: object, what: str, managed: Sequence[str]) -> Resources:
    d = _dict(obj, what)
    amounts = _resource_list(d, what, frozenset(("cpu", "memory", "pods", *managed)))
    extended = {k: v for k, v in amounts.items() if k not in ("cpu", "memory", "pods") and v}
    return Resources(
        amounts.get("cpu", 0), amounts.get("memory", 0), amounts.get("pods", 0), tuple(sorted(extended.items()))
    )


def node_from_k8s(obj: Mapping[str, Any], groups: NodeGroupsConfig, managed: Sequence[str] = ()) -> Node:
    """A Kubernetes Node dict -> core Node without pods (the snapshot adds them).

    ``group`` is set only when the node accepts exactly one kind (see ``node_group_of`` for the full set).
    """
    if not isinstance(obj, dict):
        raise InvalidInputError(f"node must be an object, got {type(obj).__name__}")
    meta = _dict(obj.get("metadata"), "node metadata")
    name = _opt_str(meta.get("name"), "node metadata.name")
    if not name:
        raise InvalidInputError("node metadata.name is missing")
    labels = _str_map(meta.get("labels"), f"node {name} metadata.labels")
    spec = _dict(obj.get("spec"), f"node {name} spec")
    status = _dict(obj.get("status"), f"node {name} status")
    allocatable = _node_resources(status.get("allocatable"), f"node {name} status.allocatable", managed)
    capacity_raw = status.get("capacity")
    capacity = _node_resources(capacity_raw, f"node {name} status.capacity", managed) if capacity_raw else None
    accepted = node_group_of(labels, groups)
    group = next(iter(accepted)) if len(accepted) == 1 else None
    unschedulable = spec.get("unschedulable") is True
    return Node(
        name=name,
        allocatable=allocatable,
        capacity=capacity,
        labels=labels,
        group=group,
        flavour=labels.get(groups.flavour_label),
        unschedulable=unschedulable,
        created_at=parse_timestamp(meta.get("creationTimestamp")),
    )


def _fields(items: object, names: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The string fields ``names`` of each object in a list (absent or not a string: ""); anything that is not a
    list of objects gives nothing (the API server validated these fields: only a broken test fixture lacks
    them)."""
    if not isinstance(items, list):
        return []
    out = []
    for item in items:
        if isinstance(item, dict):
            out.append(tuple(v if isinstance(v := item.get(n), str) else "" for n in names))
    return out


def taints_of(node: Mapping[str, Any]) -> tuple[Taint, ...]:
    """A Node dict's ``spec.taints``."""
    spec = node.get("spec")
    raw = spec.get("taints") if isinstance(spec, dict) else None
    return tuple(Taint(k, v, e) for k, v, e in _fields(raw, ("key", "value", "effect")))


def tolerations_of(pod: Mapping[str, Any]) -> tuple[Toleration, ...]:
    """A Pod dict's ``spec.tolerations`` (tolerationSeconds does not matter to placement)."""
    spec = pod.get("spec")
    raw = spec.get("tolerations") if isinstance(spec, dict) else None
    return tuple(Toleration(k, o, v, e) for k, o, v, e in _fields(raw, ("key", "operator", "value", "effect")))
