"""How a migrated pod is handed from its source to its destination without its controller noticing a gap or a
surplus (issue 32 part 1): one pure answer per owner kind, used by the consolidation flow (the only caller that
creates destination pods) and checked by the agent (``core.migration.pod_blocker``).

Why not just copy the source's metadata onto the destination: every workload controller counts the pods its
selector matches (and adopts orphans that match). A destination born with the source's labels is counted the
moment it exists, before it runs, so the controller sees one pod too many and deletes the *newest, not ready*
one -- the restore -- and a Job counts that deletion as a failure against ``backoffLimit``. So the destination is
born **held**: its labels are parked in an annotation and it carries only our migration label, no owner; no
selector matches it, no Service sends it traffic, no controller counts it. Once it runs the checkpoint, the
**hand-over** moves ownership in the order that never lets the controller see fewer pods than it wants and never
lets it pick the restore as a surplus to delete:

- **ReplicaSet** (Deployments): the source gets ``controller.kubernetes.io/pod-deletion-cost`` at the minimum,
  then the destination is adopted (labels back, the source's ownerReferences): the ReplicaSet has one pod over,
  and its surplus rank (assigned, running, ready, then the lowest deletion cost) names the source; the flow
  deletes the source itself too. Replicas never drop below the spec: a surge of one, never a gap. With the
  ReplicaSet's ``minReadySeconds`` the destination counts as *available* (what a Deployment's ``maxUnavailable``
  counts) only that long after it became Ready, so the hand-over waits for that too (``available_in``).
- **Job**: the source is released (labels parked, controller reference and the Job's tracking finalizer
  removed: the Job controller never counts a pod it does not see finish, so the deleted source is neither a
  failure nor a completion), then the destination is adopted with the tracking finalizer, so its completion is
  counted once. Between the two patches (milliseconds) the Job sees one active pod fewer; its controller acts on
  pod events after a one-second batch, so it sees both patches at once -- a sync already due in that window could
  still start a replacement, which the flow detects and reports (``job_replacements``), never hides.
- **StatefulSet**: the ordinal's name is its identity and two pods cannot share it, so the source must be gone
  before the destination exists. First a trial restore runs on the destination under another name, held (no
  identity, no Service): it proves that node can run the checkpoint while the source still runs, so a restore
  that would fail is a rollback, not a lost pod. Then the source is released (its name, still taken, makes the
  controller's own re-create fail with AlreadyExists and back off), stopped with its own grace period, and the
  destination is created under the same name, adopted from birth. The workload is down from the source's stop
  to the restored container's start; a pod with a PersistentVolumeClaim is refused (the checkpoint holds memory
  of a volume whose content moves on while the source runs after the checkpoint).
- **other controllers** (DaemonSets stay with their node; CronJob pods are Job pods; anything else, e.g. an
  operator's own pods): refused with the reason, never moved unsafely.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

from extender.core.model import ANNOTATION_PREFIX

__all__ = [
    "DELETION_COST_ANNOTATION",
    "HANDED_OVER_RESOURCES",
    "HELD_LABELS_ANNOTATION",
    "JOB_TRACKING_FINALIZER",
    "MIGRATION_LABEL",
    "MIN_DELETION_COST",
    "OwnerKind",
    "adopt_patch",
    "available_in",
    "controller_ref",
    "held_metadata",
    "owner_blocker",
    "owner_kind",
    "release_patch",
    "replacements",
    "restore_patch",
    "surplus_patch",
]

HELD_LABELS_ANNOTATION = ANNOTATION_PREFIX + "held-labels"
MIGRATION_LABEL = ANNOTATION_PREFIX + "migration"
JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
MIN_DELETION_COST = -2147483648  # the annotation is an int32: the ReplicaSet removes this pod first


class OwnerKind(StrEnum):
    NONE = "none"  # a bare pod: moved as it always was
    REPLICA_SET = "ReplicaSet"
    JOB = "Job"
    STATEFUL_SET = "StatefulSet"
    DAEMON_SET = "DaemonSet"
    OTHER = "other"


_KINDS = {"ReplicaSet": OwnerKind.REPLICA_SET, "Job": OwnerKind.JOB, "StatefulSet": OwnerKind.STATEFUL_SET,
          "DaemonSet": OwnerKind.DAEMON_SET}  # fmt: skip
_API_GROUPS = {OwnerKind.REPLICA_SET: "apps", OwnerKind.JOB: "batch", OwnerKind.STATEFUL_SET: "apps",
               OwnerKind.DAEMON_SET: "apps"}  # fmt: skip
# The owners whose pods are handed over, as (API group, resource). The hand-over gives the destination the
# source's controller reference, which its controller set with ``blockOwnerDeletion: true``; where the
# OwnerReferencesPermissionEnforcement admission plugin is on (OpenShift; any cluster that enables it), setting
# that field needs ``update`` on the owner's ``finalizers`` subresource, so the consolidation role grants it for
# exactly these (config/autoscaler/consolidation/rbac.yaml; tests/test_manifests.py derives the rule from here).
HANDED_OVER_RESOURCES = {
    kind: (_API_GROUPS[kind], plural)
    for kind, plural in ((OwnerKind.REPLICA_SET, "replicasets"), (OwnerKind.JOB, "jobs"),
                         (OwnerKind.STATEFUL_SET, "statefulsets"))
}  # fmt: skip


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, Mapping) else {}


def controller_ref(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod's controller reference (``controller: true``), or None for a pod nobody controls."""
    for ref in _meta(pod).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def owner_kind(pod: Mapping[str, Any]) -> OwnerKind:
    """The kind of the pod's controller, as far as the hand-over is concerned. A kind name of another API
    group (an operator's own "Job") is OTHER: its controller is not the one whose rules we follow."""
    ref = controller_ref(pod)
    if ref is None:
        return OwnerKind.NONE
    kind = _KINDS.get(str(ref.get("kind")), OwnerKind.OTHER)
    if kind is not OwnerKind.OTHER and str(ref.get("apiVersion", "")).split("/")[0] != _API_GROUPS[kind]:
        return OwnerKind.OTHER
    return kind


def owner_blocker(pod: Mapping[str, Any]) -> str | None:
    """Why the pod's owner makes a move unsafe, or None. Checked by the flow and, on the live pod, by the
    agent before any checkpoint."""
    kind = owner_kind(pod)
    ref = controller_ref(pod) or {}
    m = _meta(pod)
    key = f"{m.get('namespace') or 'default'}/{m.get('name')}"
    if kind is OwnerKind.DAEMON_SET:
        return f"pod {key} belongs to DaemonSet/{ref.get('name')}: it runs on every node and stays with its node"
    if kind is OwnerKind.OTHER:
        return (
            f"pod {key} is controlled by {ref.get('apiVersion')} {ref.get('kind')}/{ref.get('name')}: only pods of "
            "ReplicaSets (Deployments), Jobs and StatefulSets are handed over (another controller would replace or "
            "adopt the moved pod by rules we do not know)"
        )
    if kind is OwnerKind.STATEFUL_SET:
        spec = pod.get("spec")
        for v in (spec.get("volumes") if isinstance(spec, Mapping) else None) or []:
            if isinstance(v, Mapping) and "persistentVolumeClaim" in v:
                return (
                    f"pod {key} of StatefulSet/{ref.get('name')} mounts PersistentVolumeClaim "
                    f"{v['persistentVolumeClaim'].get('claimName')}: the checkpoint holds memory that matches the "
                    "volume as it was, and the source writes on after the checkpoint: not moved"
                )
    if kind is OwnerKind.JOB and JOB_TRACKING_FINALIZER not in (m.get("finalizers") or []):
        return (
            f"pod {key} of Job/{ref.get('name')} has no {JOB_TRACKING_FINALIZER} finalizer: the Job controller "
            "counts it some other way (it is finished, or a legacy Job), so a hand-over could count it twice"
        )
    return None


def held_metadata(source: Mapping[str, Any], migration: str) -> dict[str, Any]:
    """The destination's labels and annotations while it is held: the source's labels parked in an annotation,
    only our migration label on the pod, so no selector (controller, Service, PodDisruptionBudget) matches it."""
    labels = dict(_meta(source).get("labels") or {})
    return {
        "labels": {MIGRATION_LABEL: migration},
        "annotations": {HELD_LABELS_ANNOTATION: json.dumps(labels, sort_keys=True, separators=(",", ":"))},
    }


def _parked(pod: Mapping[str, Any]) -> dict[str, str]:
    raw = (_meta(pod).get("annotations") or {}).get(HELD_LABELS_ANNOTATION)
    if not raw:
        raise ValueError(f"pod {_meta(pod).get('name')} holds no {HELD_LABELS_ANNOTATION} annotation")
    labels = json.loads(raw)
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise ValueError(f"{HELD_LABELS_ANNOTATION} is not a map of strings: {raw[:200]}")
    return labels


def release_patch(source: Mapping[str, Any], migration: str) -> dict[str, Any]:
    """Merge patch that takes the source out of its controller's count: labels parked, controller reference and
    the Job tracking finalizer removed. Guarded by the source's resourceVersion: a pod changed since it was
    read (its controller acted on it) is not released on a stale view."""
    m = _meta(source)
    labels = dict(m.get("labels") or {})
    ref = controller_ref(source)
    return {
        "metadata": {
            "resourceVersion": m.get("resourceVersion"),
            "labels": {k: None for k in labels} | {MIGRATION_LABEL: migration},
            "annotations": {HELD_LABELS_ANNOTATION: json.dumps(labels, sort_keys=True, separators=(",", ":"))},
            "ownerReferences": [r for r in m.get("ownerReferences") or [] if r != ref],
            "finalizers": [f for f in m.get("finalizers") or [] if f != JOB_TRACKING_FINALIZER],
        }
    }


def adopt_patch(destination: Mapping[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    """Merge patch that gives the held destination the source's identity in its controller's eyes: the parked
    labels back, the source's ownerReferences, and (Job) the tracking finalizer, so its end is counted once.
    ``source`` is the pod as read before any release (its references and finalizers)."""
    labels = _parked(destination)
    sm = _meta(source)
    finalizers = list(_meta(destination).get("finalizers") or [])
    if JOB_TRACKING_FINALIZER in (sm.get("finalizers") or []) and JOB_TRACKING_FINALIZER not in finalizers:
        finalizers.append(JOB_TRACKING_FINALIZER)
    return {
        "metadata": {
            "resourceVersion": _meta(destination).get("resourceVersion"),
            "labels": {MIGRATION_LABEL: None} | labels,
            "annotations": {HELD_LABELS_ANNOTATION: None},
            "ownerReferences": [dict(r) for r in sm.get("ownerReferences") or []],
            "finalizers": finalizers,
        }
    }


def restore_patch(original: Mapping[str, Any]) -> dict[str, Any]:
    """Undo ``release_patch`` on a source whose hand-over failed: its labels, references and finalizers as they
    were, so its controller counts it again (a rollback)."""
    om = _meta(original)
    return {
        "metadata": {
            "labels": {MIGRATION_LABEL: None} | dict(om.get("labels") or {}),
            "annotations": {HELD_LABELS_ANNOTATION: None},
            "ownerReferences": [dict(r) for r in om.get("ownerReferences") or []],
            "finalizers": list(om.get("finalizers") or []),
        }
    }


def surplus_patch() -> dict[str, Any]:
    """Merge patch on a ReplicaSet's source before the destination is adopted: the lowest deletion cost, so the
    one pod over is the source whatever else the ReplicaSet's rank compares."""
    return {"metadata": {"annotations": {DELETION_COST_ANNOTATION: str(MIN_DELETION_COST)}}}


def replacements(pods: Sequence[Mapping[str, Any]], owner_uid: str, known: set[str]) -> list[str]:
    """Pods the owner controls that are not among ``known`` (the UIDs of its pods before the release, and the
    destination's): a Job that started a replacement from scratch in the hand-over window."""
    out = []
    for p in pods:
        ref = controller_ref(p)
        if ref is not None and ref.get("uid") == owner_uid and _meta(p).get("uid") not in known:
            out.append(str(_meta(p).get("name")))
    return sorted(out)


def available_in(pod: Mapping[str, Any], min_ready_seconds: int, now: datetime) -> float | None:
    """Seconds until a ReplicaSet counts ``pod`` as available (0.0: it does), or None while it is not Ready.

    The ReplicaSet's own rule (``podutil.IsPodAvailable``): Ready, and its Ready condition's lastTransitionTime +
    ``minReadySeconds`` is before now. ``now`` must be timezone-aware (the API's times are UTC)."""
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if not isinstance(cond, Mapping) or cond.get("type") != "Ready":
            continue
        if cond.get("status") != "True":
            return None
        if min_ready_seconds <= 0:
            return 0.0
        stamp = cond.get("lastTransitionTime")
        try:
            since = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
        except ValueError:
            return float(min_ready_seconds)  # no usable time: never known to be available (the flow's deadline ends it)
        return max(since.timestamp() + min_ready_seconds - now.timestamp(), 0.0)
    return None
