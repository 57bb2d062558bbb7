"""The controller's view of QoS pods, fed by the extender's own list+watch (one watch, one snapshot).

``TrackingSnapshot`` is the extender's Snapshot plus, for pods of the controller's scheduler, what the core
model leaves out and the controller needs: our scheduling gate, phase and Running-since, the owner (the
request), the node a released pod is pinned to, and the raw spec fields a release patch must respect.
It also wakes the controller on every pod or node event. Pure state, no I/O, like the Snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from extender.controller.patches import INSTANCE_ANNOTATION
from extender.core.gates import BYPASS_ANNOTATION
from extender.core.taints import Toleration
from extender.kube.convert import Problem, is_terminal, parse_timestamp, pod_key, tolerations_of
from extender.kube.snapshot import Snapshot
from extender.settings.extender import ExtenderConfig

__all__ = ["PodInfo", "TrackingSnapshot", "pod_info"]


@dataclass(frozen=True, slots=True)
class PodInfo:
    key: str
    uid: str
    request: str  # namespace/Kind/name of the controlling owner, else the pod key
    owner_kind: str | None
    owner_name: str | None
    gated: bool  # our gate is present
    phase: str
    running: bool  # phase Running and not being deleted
    deleting: bool
    node_name: str | None
    created: float | None
    running_since: float | None  # Ready transition, else startTime
    pinned_node: str | None
    spec: Mapping[str, Any]  # schedulingGates, affinity (for the release patch)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    account_text: str | None = None  # our annotation on a bare pod (its own request)
    instance: str | None = None  # the controller instance whose webhook gated it (annotation), None: not gated
    unschedulable: bool = False  # PodScheduled False, reason Unschedulable: kube-scheduler tried and found no node
    bypass_marked: bool = False  # counted as having bypassed admission (core.gates.BYPASS_ANNOTATION) already
    tolerations: tuple[Toleration, ...] = ()  # spec.tolerations: the tainted nodes it may still be pinned to


def _pinned(spec: Mapping[str, Any]) -> str | None:
    """The node a pod is pinned to by a matchFields metadata.name In [one] requirement (ours), else None."""
    try:
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    except (KeyError, TypeError):
        return None
    for term in terms if isinstance(terms, list) else []:
        for req in (term.get("matchFields") or []) if isinstance(term, dict) else []:
            if (
                isinstance(req, dict)
                and req.get("key") == "metadata.name"
                and req.get("operator") == "In"
                and isinstance(req.get("values"), list)
                and len(req["values"]) == 1
            ):
                return str(req["values"][0])
    return None


def pod_info(obj: Mapping[str, Any], gate: str, account_annotation: str) -> PodInfo:
    """Extract the controller's fields from a Pod dict (raises the convert errors on a non-Pod)."""
    key = pod_key(obj)
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    namespace = key.split("/", 1)[0]
    owner_kind = owner_name = None
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller") is True:
            owner_kind, owner_name = ref.get("kind"), ref.get("name")
            break
    request = f"{namespace}/{owner_kind}/{owner_name}" if owner_kind and owner_name else key
    gates = spec.get("schedulingGates") or []
    gated = any(isinstance(g, dict) and g.get("name") == gate for g in gates)
    phase = str(status.get("phase") or "Pending")
    deleting = meta.get("deletionTimestamp") is not None
    running_since = None
    unschedulable = False
    for cond in status.get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Ready" and cond.get("status") == "True":
            running_since = parse_timestamp(cond.get("lastTransitionTime"))
        if isinstance(cond, dict) and cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            unschedulable = cond.get("reason") == "Unschedulable"
    if running_since is None:
        running_since = parse_timestamp(status.get("startTime"))
    selector = spec.get("nodeSelector")
    annotations = meta.get("annotations") or {}
    return PodInfo(
        key=key,
        uid=str(meta.get("uid") or ""),
        request=request,
        owner_kind=owner_kind,
        owner_name=owner_name,
        gated=gated,
        phase=phase,
        running=phase == "Running" and not deleting,
        deleting=deleting,
        node_name=spec.get("nodeName") or None,
        created=parse_timestamp(meta.get("creationTimestamp")),
        running_since=running_since,
        pinned_node=_pinned(spec),
        spec={"schedulingGates": gates, "affinity": spec.get("affinity")},
        node_selector=dict(selector) if isinstance(selector, dict) else {},
        account_text=annotations.get(account_annotation) if isinstance(annotations, dict) else None,
        instance=_instance(annotations),
        unschedulable=unschedulable,
        bypass_marked=isinstance(annotations, dict) and BYPASS_ANNOTATION in annotations,
        tolerations=tolerations_of(obj),
    )


def _instance(annotations: object) -> str | None:
    value = annotations.get(INSTANCE_ANNOTATION) if isinstance(annotations, dict) else None
    return value if isinstance(value, str) and value else None


class TrackingSnapshot(Snapshot):
    """A Snapshot that also keeps ``PodInfo`` for the pods of ``scheduler_name`` (every controller instance's:
    which instance owns one is decided per pass, ``patches.owner_instance``, because it may depend on namespace
    labels that change), and calls ``on_change``."""

    def __init__(self, config: ExtenderConfig, account_annotation: str) -> None:
        super().__init__(config)
        self.qos_pods: dict[str, PodInfo] = {}
        self.on_change: Callable[[], None] | None = None
        self.on_gated: Callable[[], None] | None = None  # a pod carrying our gate was added or updated
        self._scheduler = config.controller.scheduler_name
        self._gate = config.controller.gate_name
        self._annotation = account_annotation

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def apply_node(self, event_type: str, obj: Mapping[str, Any], now: float | None = None) -> None:
        super().apply_node(event_type, obj, now)
        self._changed()

    def apply_pod(self, event_type: str, obj: Mapping[str, Any], now: float | None = None) -> tuple[Problem, ...]:
        problems = super().apply_pod(event_type, obj, now)
        try:
            key = pod_key(obj)
        except Exception:  # the base class counted the conversion error already
            return problems
        spec = obj.get("spec")
        if (
            event_type == "DELETED"
            or is_terminal(obj)
            or not isinstance(spec, dict)
            or spec.get("schedulerName") != self._scheduler
        ):
            if self.qos_pods.pop(key, None) is not None:
                self._changed()
            return problems
        try:
            info = self.qos_pods[key] = pod_info(obj, self._gate, self._annotation)
        except Exception:  # malformed beyond what the base class tolerated: not ours to manage
            self.qos_pods.pop(key, None)
        else:
            if info.gated and self.on_gated is not None:
                self.on_gated()
        self._changed()
        return problems

    def replace_pods(
        self, items: Iterable[Mapping[str, Any]], resource_version: str | None, now: float | None = None
    ) -> list[tuple[str, tuple[Problem, ...]]]:
        self.qos_pods.clear()
        return super().replace_pods(items, resource_version, now)
