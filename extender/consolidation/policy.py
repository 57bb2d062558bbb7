"""Every decision of the consolidation flow, as pure functions (no I/O, no clock: ``now`` is given).

The async shell (``flow.py``) only applies what these decide: which hand-off plan to run, whether the batch
queue has been quiet long enough, whether a node may be cordoned by us, whether the plan still holds once the
node is cordoned (the pods on it, the room on the destinations), what the destination pod looks like, which
agent serves a node, what to do after each migration outcome, and whether the emptied node may be deleted.
Paper 000 §4.4 / Alg. 5: all-or-nothing per node, worst-utilised node first (``core.reschedule`` orders the
plans); only batch pods move.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from extender.autoscaler.handoff import Consolidation
from extender.controller.patches import unpin
from extender.core import reschedule
from extender.core.migration import (
    DO_NOT_DISRUPT,
    annotations_of,
    metadata_of,
    object_key,
    pod_blocker,
)
from extender.core.model import ANNOTATION_PREFIX, Node, WorkloadKind
from extender.core.owners import (
    DELETION_COST_ANNOTATION,
    OwnerKind,
    held_metadata,
)
from extender.core.packing import fits
from extender.core.reschedule import MigrationPlan, stays_with_node

__all__ = [
    "AGENT_URL_ANNOTATION",
    "CONSOLIDATION_ANNOTATION",
    "DO_NOT_DISRUPT",
    "MIGRATED_FROM_ANNOTATION",
    "MIGRATION_ID_ANNOTATION",
    "MoveVerdict",
    "NodeOutcome",
    "after_outcome",
    "agent_url",
    "batch_queue_quiet",
    "check_plan",
    "checkpoint_blocker",
    "confirm_destination",
    "container_failure",
    "container_migration_id",
    "destination_manifest",
    "destination_name",
    "destination_node_gone",
    "may_cordon",
    "migration_id",
    "node_blocker",
    "object_key",
    "plan_id",
    "pod_blocker",
    "removable",
    "select_plan",
]

CONSOLIDATION_ANNOTATION = ANNOTATION_PREFIX + "consolidation"  # on a node we cordoned: the plan id
MIGRATED_FROM_ANNOTATION = ANNOTATION_PREFIX + "migrated-from"  # on a destination pod: namespace/source pod
MIGRATION_ID_ANNOTATION = ANNOTATION_PREFIX + "migration-id"
AGENT_URL_ANNOTATION = ANNOTATION_PREFIX + "agent-url"  # on a node: its agent's base URL (overrides the template)
PROGRESS_ANNOTATION = ANNOTATION_PREFIX + "progress-seconds"  # = agent.backends.simulated.PROGRESS_ANNOTATION
STOPPED_ANNOTATION = ANNOTATION_PREFIX + "simulated-stopped"
_DROP_ANNOTATIONS = (
    PROGRESS_ANNOTATION,
    STOPPED_ANNOTATION,
    MIGRATION_ID_ANNOTATION,
    "kubectl.kubernetes.io/last-applied-configuration",
)
# cluster-autoscaler's node annotation: no scale-down of this node. We honour it (a node so annotated by someone
# else is never consolidated) and set it ourselves while we empty a node (CA then never removes a node mid-move).
SCALE_DOWN_DISABLED_ANNOTATION = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
# cluster-autoscaler's taints on a node it is removing (NoSchedule) or considers unneeded (PreferNoSchedule): such a
# node is CA's to act on, never ours as well
CA_SCALE_DOWN_TAINTS = ("ToBeDeletedByClusterAutoscaler", "DeletionCandidateOfClusterAutoscaler")
_SUFFIX_RE = re.compile(r"-mv-[a-z0-9]{1,12}$")


_meta = metadata_of
_annotations = annotations_of


# ------------------------------------------------------------------------------------------ which plan, when


def batch_queue_quiet(
    pending_batch: bool, last_pending: float | None, now: float, quiet_seconds: float
) -> tuple[bool, float]:
    """Has no batch pod been pending for ``quiet_seconds``? Returns (quiet, the new "last seen pending").

    The clock starts at the first observation (``last_pending`` None): after a restart the flow waits a
    full quiet period again rather than assume the queue was empty while it was not looking."""
    last = now if pending_batch or last_pending is None else last_pending
    return now - last >= quiet_seconds, last


def select_plan(
    consolidation: Consolidation,
    *,
    busy: frozenset[str] = frozenset(),
    left_alone: Mapping[str, float] | None = None,
    owned: frozenset[str] | None = None,
    now: float,
) -> MigrationPlan | None:
    """The first hand-off plan worth starting (``core.reschedule.select_plan``, the rule the simulator's
    ``product`` policy runs too)."""
    return reschedule.select_plan(
        consolidation.plans, consolidation.candidates, busy=busy, left_alone=left_alone, owned=owned, now=now
    )


def may_cordon(node: Mapping[str, Any]) -> str | None:
    """None if we may cordon this node; else why not (someone else cordoned it, it is being deleted, its owner
    said no scale-down, or cluster-autoscaler is removing it: one remover per node)."""
    spec = node.get("spec")
    if _meta(node).get("deletionTimestamp"):
        return "the node is being deleted"
    annotations = _annotations(node)
    ours = CONSOLIDATION_ANNOTATION in annotations
    if isinstance(spec, Mapping) and spec.get("unschedulable") is True and not ours:
        return "the node is already cordoned by someone else (a drain or a repair): not ours to touch"
    if str(annotations.get(SCALE_DOWN_DISABLED_ANNOTATION, "")).strip().lower() == "true" and not ours:
        return f"the node is annotated {SCALE_DOWN_DISABLED_ANNOTATION}=true: its owner wants it kept"
    taints = spec.get("taints") if isinstance(spec, Mapping) else None
    for taint in taints if isinstance(taints, list) else []:
        if isinstance(taint, Mapping) and taint.get("key") in CA_SCALE_DOWN_TAINTS:
            return f"cluster-autoscaler is scaling the node down (taint {taint.get('key')}): not ours as well"
    return None


def cordon_patch(plan_id: str | None) -> dict[str, Any]:
    """The node patch that starts (plan id) or ends (None) our consolidation of it: cordoned, our plan annotation,
    and cluster-autoscaler's scale-down-disabled so CA never removes it while pods move off it."""
    return {
        "metadata": {
            "annotations": {
                CONSOLIDATION_ANNOTATION: plan_id,
                SCALE_DOWN_DISABLED_ANNOTATION: "true" if plan_id is not None else None,
            }
        },
        "spec": {"unschedulable": plan_id is not None},
    }


def handed_to_cluster_autoscaler_patch() -> dict[str, Any]:
    """An emptied node left to cluster-autoscaler's scale-down (which removes empty nodes): scale-down allowed
    again, still cordoned under our plan annotation so nothing lands on it meanwhile."""
    return {"metadata": {"annotations": {SCALE_DOWN_DISABLED_ANNOTATION: None}}}


def node_blocker(pods_on_node: Sequence[Mapping[str, Any]]) -> str | None:
    """Before the cordon: the first reason one of the node's pods gives not to touch the node at all (a
    do-not-disrupt annotation, migratable=false, ...), else None. DaemonSet and finished pods do not count:
    they are not moved (DaemonSet pods go with the node, finished pods hold nothing)."""
    for p in sorted(pods_on_node, key=object_key):
        status = p.get("status")
        if _is_daemon(p) or (isinstance(status, Mapping) and status.get("phase") in ("Succeeded", "Failed")):
            continue
        reason = pod_blocker(p)
        if reason is not None:
            return reason
    return None


def check_plan(
    plan: MigrationPlan, nodes: Sequence[Node], live_pods: Sequence[Mapping[str, Any]] | None = None
) -> str | None:
    """Does the plan still hold? None if so, else the reason. ``nodes`` is the current view (the source may be
    cordoned by us already); ``live_pods`` the source node's pods read from the API after the cordon.

    Holds when: the source exists; its pods are exactly the planned ones, all batch and migratable; every
    destination exists, is schedulable, is in the source's group, and takes its pods *cumulatively*
    (``packing.fits`` including the moves before it) — the same guarantees ``core.reschedule`` planned with.
    """
    by_name = {n.name: n for n in nodes}
    source = by_name.get(plan.source)
    if source is None:
        return f"node {plan.source} is gone"
    on_node = {p.key: p for p in source.pods if not stays_with_node(p)}  # DaemonSet pods go with the node
    planned = [k for k, _ in plan.moves]
    if live_pods is not None:
        live = {object_key(p) for p in live_pods}
        extra = sorted(live - set(planned))
        if extra:
            return f"pods not in the plan are on the node: {', '.join(extra)}"
        for p in live_pods:
            reason = pod_blocker(p)
            if reason:
                return reason
    extra = sorted(set(on_node) - set(planned))
    if extra:
        return f"pods not in the plan are on the node: {', '.join(extra)}"
    for key, dest in plan.moves:
        pod = on_node.get(key)
        if pod is None:
            return f"pod {key} is no longer on {plan.source}"
        if pod.kind is not WorkloadKind.BATCH:
            return f"pod {key} is a {pod.kind.value} pod: only batch pods are migrated"
        if not pod.migratable:
            return f"pod {key} is not migratable"
        target = by_name.get(dest)
        if target is None:
            return f"destination {dest} is gone"
        if target.unschedulable:
            return f"destination {dest} is cordoned"
        if target.group != source.group:
            return f"destination {dest} is not in the {source.group} group"
        if not fits(target, pod):
            return f"pod {key} no longer fits on {dest} (with the moves planned before it)"
        by_name[dest] = target.with_pod(pod)
    return None


# ------------------------------------------------------------------------------------------ one move


def plan_id(source: str, token: str) -> str:
    """The id of one consolidation of ``source`` (node annotation, prefix of its migration ids)."""
    base = re.sub(r"[^a-z0-9-]", "-", source.lower()).strip("-") or "node"
    return f"{base[: 50 - len(token)].rstrip('-')}-{token}"


def migration_id(plan_id: str, index: int) -> str:
    """An agent migration id (lowercase DNS-label-like, <= 63 chars), unique per plan and move."""
    tail = f"-{index}"
    base = re.sub(r"[^a-z0-9-]", "-", plan_id.lower()).strip("-") or "c"
    return (base[: 63 - len(tail)].rstrip("-") or "c") + tail


def destination_name(source: str, token: str) -> str:
    """``<base>-mv-<token>``: a fresh pod name; a pod moved again keeps its base, not a chain of suffixes."""
    base = _SUFFIX_RE.sub("", source)
    suffix = f"-mv-{token}"
    return base[: 253 - len(suffix)].rstrip("-.") + suffix


# Volumes a checkpoint restore on another node can take: recreated from the API for the new pod. Anything else
# (emptyDir: its content is not in the checkpoint; hostPath/local: another node's disk; PVCs and other network
# volumes: the source pod still holds them while the destination starts) is refused.
CHECKPOINT_VOLUMES = frozenset({"configMap", "secret", "downwardAPI", "projected"})
# Waiting reasons of the destination container that will not fix themselves within the ready timeout.
CONTAINER_FAILURES = frozenset(
    {"CreateContainerError", "CreateContainerConfigError", "ErrImageNeverPull", "InvalidImageName",
     "RunContainerError", "CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff"}
)  # fmt: skip


def checkpoint_blocker(pod: Mapping[str, Any]) -> str | None:
    """Why the kubelet backend (container checkpoints restored into a new pod on another node) cannot move this
    pod, or None. On top of ``pod_blocker``: only volumes the new pod gets from the API (an emptyDir's content is
    in no container checkpoint, and is not carried), init containers all finished (they are not run again: the
    new pod has none) and none of them a native sidecar (``restartPolicy: Always``: a running container this
    move does not checkpoint). Every regular container is checkpointed, one after the other."""
    key = object_key(pod)
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    if not spec.get("containers"):
        return f"pod {key} has no containers"
    inits = [c for c in spec.get("initContainers") or [] if isinstance(c, Mapping)]
    sidecars = [str(c.get("name")) for c in inits if c.get("restartPolicy") == "Always"]
    if sidecars:
        return f"pod {key} has sidecar container(s) {', '.join(sidecars)} (restartPolicy Always): not checkpointed"
    status = pod.get("status")
    done = {
        str(c.get("name"))
        for c in (status.get("initContainerStatuses") if isinstance(status, Mapping) else None) or []
        if isinstance(c, Mapping) and ((c.get("state") or {}).get("terminated") or {}).get("exitCode") == 0
    }
    unfinished = [str(c.get("name")) for c in inits if c.get("name") not in done]
    if unfinished:
        return (
            f"pod {key}: init container(s) {', '.join(unfinished)} not finished: the restored pod would lack their work"
        )
    for v in spec.get("volumes") or []:
        kinds = sorted(k for k in v if k != "name") if isinstance(v, Mapping) else ["?"]
        if not set(kinds) <= CHECKPOINT_VOLUMES:
            return (
                f"pod {key} has volume {v.get('name') if isinstance(v, Mapping) else v!r} ({', '.join(kinds)}): "
                "its content does not move with a checkpoint"
            )
    return None


def container_migration_id(migration: str, index: int) -> str:
    """The agents' migration id of the pod's ``index``-th container: the move's own id for the first (a
    single-container move is what it always was), ``<id>-<index>`` for the others."""
    return migration if index == 0 else f"{migration}-{index}"


def destination_node_gone(node: Mapping[str, Any] | None, name: str) -> str | None:
    """Before the source pod is deleted: is the destination node still there? None if so, else why not.

    A node deleted during the restore keeps its kubelet running the restored pod for a while, so the pod can
    look Running; but the pod garbage collector deletes pods bound to a missing node, and committing then
    would leave no copy at all. The source (a checkpoint never stops it) is the copy to keep."""
    if node is None:
        return f"the destination node {name} is gone"
    if _meta(node).get("deletionTimestamp"):
        return f"the destination node {name} is being deleted"
    return None


def container_failure(pod: Mapping[str, Any] | None) -> str | None:
    """A destination container stuck in a state it will not leave by waiting (the runtime refused the restore,
    the image is not on the node, ...): its reason and message, else None."""
    status = (pod or {}).get("status")
    for c in (status.get("containerStatuses") if isinstance(status, Mapping) else None) or []:
        waiting = ((c.get("state") or {}).get("waiting") or {}) if isinstance(c, Mapping) else {}
        if waiting.get("reason") in CONTAINER_FAILURES:
            return f"container {c.get('name')}: {waiting['reason']}: {str(waiting.get('message', ''))[:300]}"
        terminated = ((c.get("state") or {}).get("terminated") or {}) if isinstance(c, Mapping) else {}
        if terminated:
            return (
                f"container {c.get('name')} terminated: {terminated.get('reason')} (exit {terminated.get('exitCode')})"
            )
    return None


def destination_manifest(
    source: Mapping[str, Any],
    name: str,
    *,
    scheduler_name: str,
    migration: str,
    checkpoint_image: str | Mapping[str, str] | None = None,
    owner: OwnerKind = OwnerKind.NONE,
    held: bool | None = None,
) -> dict[str, Any]:
    """The destination pod: the source's spec and metadata under a new name, not bound (our binder binds it),
    ``schedulerName`` = one no scheduler serves (so no scheduler races our Binding), without what the API
    server or its admission set (uid, nodeName, service-account token volume, computed priority) or the QoS
    controller's pin to the source node, and without the source's progress (the agent's restore writes the
    checkpointed one). ``checkpoint_image`` (kubelet backend): every container's image, pulled never (the
    destination agent imported it). ``held`` (default: for a ReplicaSet's or a Job's pod): born held, its labels
    parked and no owner, so no controller counts it and no selector matches it until the hand-over adopts it;
    a StatefulSet's pod is otherwise born adopted (its name is its identity), its trial restore held."""
    meta = _meta(source)
    spec = copy.deepcopy(dict(source.get("spec") or {}))
    source_node = spec.get("nodeName")
    if isinstance(source_node, str) and source_node:
        # the QoS controller pinned the source to its node (required affinity on metadata.name): kept, the
        # destination's kubelet rejects the pod (NodeAffinity) and every move of a pod it released rolled back
        unpin(spec, source_node)
    for field in ("nodeName", "schedulingGates"):
        spec.pop(field, None)
    if spec.get("priorityClassName"):
        spec.pop("priority", None)
        spec.pop("preemptionPolicy", None)
    token_volumes = {
        v.get("name") for v in spec.get("volumes") or [] if str(v.get("name", "")).startswith("kube-api-access-")
    }
    if token_volumes:
        spec["volumes"] = [v for v in spec["volumes"] if v.get("name") not in token_volumes]
        if not spec["volumes"]:
            del spec["volumes"]
        for group in ("containers", "initContainers"):
            for c in spec.get(group) or []:
                mounts = [m for m in c.get("volumeMounts") or [] if m.get("name") not in token_volumes]
                if mounts:
                    c["volumeMounts"] = mounts
                else:
                    c.pop("volumeMounts", None)
    spec["schedulerName"] = scheduler_name
    if checkpoint_image is not None:  # kubelet backend: the runtime restores each container from its image
        for c in spec.get("containers") or []:
            c["image"] = checkpoint_image if isinstance(checkpoint_image, str) else checkpoint_image[c["name"]]
            c["imagePullPolicy"] = "Never"  # imported into the destination node's runtime; no registry has it
        spec.pop("initContainers", None)  # they ran on the source; the restored containers carry what they did
    annotations = {k: v for k, v in _annotations(source).items() if k not in _DROP_ANNOTATIONS}
    annotations[MIGRATED_FROM_ANNOTATION] = object_key(source)
    annotations[MIGRATION_ID_ANNOTATION] = migration
    labels = dict(meta.get("labels") or {})
    metadata: dict[str, Any] = {"name": name, "namespace": meta.get("namespace") or "default"}
    if held is None:
        held = owner in (OwnerKind.REPLICA_SET, OwnerKind.JOB)
    if held:
        parked = held_metadata(source, migration)
        labels = parked["labels"]
        annotations |= parked["annotations"]
    elif owner is OwnerKind.STATEFUL_SET:
        metadata["ownerReferences"] = [dict(r) for r in meta.get("ownerReferences") or []]
    annotations.pop(DELETION_COST_ANNOTATION, None)
    metadata |= {"labels": labels, "annotations": annotations}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def agent_url(node: Mapping[str, Any], *, port: int, scheme: str = "https") -> str | None:
    """The node's agent: the node's ``agent-url`` annotation, else ``scheme://<InternalIP>:port`` (the agent
    DaemonSet listens on the host network). None if neither is known."""
    url = _annotations(node).get(AGENT_URL_ANNOTATION)
    if url:
        return url.rstrip("/")
    status = node.get("status")
    for addr in (status.get("addresses") if isinstance(status, Mapping) else None) or []:
        if isinstance(addr, Mapping) and addr.get("type") == "InternalIP" and addr.get("address"):
            host = str(addr["address"])
            return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
    return None


class MoveVerdict(StrEnum):
    COMMIT = "commit"  # the destination confirmed: delete the source pod, next move
    ROLL_BACK = "roll_back"  # the source runs (or never stopped): delete the destination pod, stop the plan
    KEEP_BOTH = "keep_both"  # nobody knows where the workload runs: keep both pods for an operator, stop


def after_outcome(outcome: str | None) -> MoveVerdict:
    """What the flow does after the source agent's answer. ``refused`` = the agent refused to start (4xx:
    not running, busy, bad request) or the destination pod could not be made — nothing moved; None = no
    answer at all (the migration may or may not have happened)."""
    if outcome == "succeeded":
        return MoveVerdict.COMMIT
    if outcome in ("rolled_back", "refused"):
        return MoveVerdict.ROLL_BACK
    return MoveVerdict.KEEP_BOTH  # in_doubt, failed, unknown: never delete a possible only copy


def after_unconfirmed(source_still_runs: bool) -> MoveVerdict:
    """The agents said ``succeeded`` but ``confirm_destination`` did not confirm the destination. A kubelet
    checkpoint never stops the source, so the source is the one copy known to run: roll back (keeping both
    would run the workload twice). A CRIU move stopped the source: the destination may hold the only copy, so
    both are kept for an operator."""
    return MoveVerdict.ROLL_BACK if source_still_runs else MoveVerdict.KEEP_BOTH


def confirm_destination(
    pod: Mapping[str, Any] | None,
    node: str,
    record: Mapping[str, Any],
    *,
    images: Mapping[str, str] | None = None,
) -> str | None:
    """After a ``succeeded`` record: is the workload really at the destination? None if so, else why not.
    The pod must exist, be bound to the planned node and not be deleted; for the kubelet backend run each
    container's checkpoint image (``images``, else the record's one image for every container); for the
    simulated backend it must carry the checkpointed progress and not be stopped."""
    if pod is None:
        return "the destination pod is gone"
    if _meta(pod).get("deletionTimestamp"):
        return "the destination pod is being deleted"
    spec = pod.get("spec")
    bound = spec.get("nodeName") if isinstance(spec, Mapping) else None
    if bound != node:
        return f"the destination pod is on {bound!r}, not {node!r}"
    meta = record.get("meta")
    restored = record.get("restored_workload")
    if isinstance(meta, Mapping) and meta.get("kubelet_archive"):
        image = restored.get("image") if isinstance(restored, Mapping) else None
        containers = (spec.get("containers") if isinstance(spec, Mapping) else None) or []
        expected: dict[str, str] = (
            dict(images) if images else {str(c.get("name")): str(image or "") for c in containers}
        )
        if not containers or any(not expected.get(str(c.get("name"))) or c.get("image") != expected[str(c.get("name"))]
                                 for c in containers):  # fmt: skip
            return f"the destination pod does not run the checkpoint image(s) {sorted(set(expected.values()))!r}"
        status = pod.get("status")
        states = [c.get("state") or {} for c in (status.get("containerStatuses") if isinstance(status, Mapping)
                                                 else None) or []]  # fmt: skip
        if not states or not all("running" in st for st in states):
            return "the destination container is not running"
    if isinstance(meta, Mapping) and meta.get("simulated"):
        ann = _annotations(pod)
        if ann.get(STOPPED_ANNOTATION) == "true":
            return "the destination pod is marked stopped"
        try:
            got = float(ann.get(PROGRESS_ANNOTATION, "nan"))
        except ValueError:
            return f"the destination pod's progress {ann.get(PROGRESS_ANNOTATION)!r} is not a number"
        want = float(record.get("work_seconds") or 0.0)
        if not abs(got - want) <= 1e-6:
            return f"the destination pod's progress is {got}, the checkpoint had {want}"
    return None


def _is_daemon(pod: Mapping[str, Any]) -> bool:
    return any(isinstance(r, Mapping) and r.get("kind") == "DaemonSet" for r in _meta(pod).get("ownerReferences") or [])


def removable(pods_on_node: Sequence[Mapping[str, Any]]) -> str | None:
    """May the emptied node be deleted? Only if no pod but DaemonSet pods and finished pods is left on it."""
    left = []
    for p in pods_on_node:
        status = p.get("status")
        phase = status.get("phase") if isinstance(status, Mapping) else None
        if phase in ("Succeeded", "Failed") or _is_daemon(p):
            continue
        left.append(object_key(p))
    if left:
        return f"pods still on the node: {', '.join(sorted(left))}"
    return None


@dataclass(frozen=True, slots=True)
class NodeOutcome:
    """How one node's consolidation ended (for logs, Events, metrics and the tests)."""

    node: str
    plan_id: str
    removed: bool
    reason: str
    moves: tuple[Mapping[str, Any], ...] = ()
