"""Which pod may be migrated at all: one pure answer for the consolidation flow (which picks the pods) and the
node agent (which takes the checkpoint), so the agent refuses exactly what the flow would never ask for.

Why the agent decides too: the agent is root on its node and can dump any container's memory. A caller that
got hold of a controller credential, or a bug in the flow, must still not be able to checkpoint a kube-system
pod or a pod whose owner never opted in. The flow's own checks (``pod_blocker``) stay where they were; the
agent adds the opt-in and namespace rules (``migration_refusal``) that only make sense as a last gate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from extender.core.model import ANNOTATION_PREFIX
from extender.core.owners import HELD_LABELS_ANNOTATION, owner_blocker

__all__ = [
    "AGENT_IDENTITY_PREFIX",
    "DO_NOT_DISRUPT",
    "MIGRATABLE_ANNOTATION",
    "MigrationPolicy",
    "agent_identity",
    "annotations_of",
    "metadata_of",
    "migration_refusal",
    "node_of_agent",
    "object_key",
    "pod_blocker",
]

MIGRATABLE_ANNOTATION = ANNOTATION_PREFIX + "migratable"
# What the tools users already run honour: a pod so annotated blocks the consolidation of its node (a checkpoint
# migration ends the pod like an eviction does: new name, new IP, its controller sees it go).
DO_NOT_DISRUPT = (
    ("cluster-autoscaler.kubernetes.io/safe-to-evict", "false"),  # cluster-autoscaler: no scale-down of its node
    ("karpenter.sh/do-not-disrupt", "true"),  # karpenter: no voluntary disruption of its node
)
# The subject CN of the agent of node X: "qos-agent:X". One identity per node, so a certificate names the only
# node whose agent may present it (extender/agent/identity.py issues them; the agents' routes check them).
AGENT_IDENTITY_PREFIX = "qos-agent:"


def agent_identity(node: str) -> str:
    return AGENT_IDENTITY_PREFIX + node


def node_of_agent(common_name: str) -> str | None:
    """The node an agent certificate's CN names, or None when the CN is not an agent's."""
    if common_name.startswith(AGENT_IDENTITY_PREFIX) and len(common_name) > len(AGENT_IDENTITY_PREFIX):
        return common_name[len(AGENT_IDENTITY_PREFIX) :]
    return None


def metadata_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, Mapping) else {}


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    a = metadata_of(obj).get("annotations")
    return a if isinstance(a, Mapping) else {}


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of a pod's JSON."""
    m = metadata_of(obj)
    return f"{m.get('namespace') or 'default'}/{m.get('name')}"


def pod_blocker(pod: Mapping[str, Any]) -> str | None:
    """Why this pod cannot be moved by the flow, or None. Checked on the live object after the cordon."""
    key = object_key(pod)
    meta = metadata_of(pod)
    if meta.get("deletionTimestamp"):
        return f"pod {key} is being deleted"
    annots = annotations_of(pod)
    if str(annots.get(MIGRATABLE_ANNOTATION, "")).strip().lower() == "false":
        return f"pod {key} is annotated {MIGRATABLE_ANNOTATION}=false"
    for name, blocking in DO_NOT_DISRUPT:
        if str(annots.get(name, "")).strip().lower() == blocking:
            return f"pod {key} is annotated {name}={blocking}: its node is not consolidated"
    if HELD_LABELS_ANNOTATION in annots:
        return f"pod {key} is in a migration's hand-over ({HELD_LABELS_ANNOTATION})"
    owned = owner_blocker(pod)  # a ReplicaSet's, Job's or StatefulSet's pod is handed over (core.owners)
    if owned is not None:
        return owned
    status = pod.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    if phase != "Running":
        return f"pod {key} is {phase or 'in no phase'}, not Running"
    return None


@dataclass(frozen=True)
class MigrationPolicy:
    """Which pods the agent may checkpoint. A pod opts in by its namespace (``namespaces``), by running under
    one of our schedulers (``scheduler_names``: choosing the qos-scheduler is choosing its consolidation), or by
    the annotation ``migratable: "true"``; a namespace of ``denied_namespaces`` is never migrated, opt-in or
    not (kube-system by default: its pods hold cluster credentials in memory)."""

    denied_namespaces: tuple[str, ...] = ("kube-system", "kube-public", "kube-node-lease")
    namespaces: tuple[str, ...] = ()
    scheduler_names: tuple[str, ...] = ("qos-scheduler",)


def migration_refusal(pod: Mapping[str, Any], node: str, policy: MigrationPolicy) -> str | None:
    """Why the agent of ``node`` must not checkpoint ``pod`` (its live object), or None when it may."""
    key = object_key(pod)
    namespace = metadata_of(pod).get("namespace") or "default"
    if namespace in policy.denied_namespaces:
        return f"pod {key}: namespace {namespace} is never migrated (migration.denied_namespaces)"
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    if spec.get("nodeName") != node:
        return f"pod {key} runs on {spec.get('nodeName') or 'no node'}, not on this agent's node {node}"
    opted_in = (
        namespace in policy.namespaces
        or spec.get("schedulerName") in policy.scheduler_names
        or str(annotations_of(pod).get(MIGRATABLE_ANNOTATION, "")).strip().lower() == "true"
    )
    if not opted_in:
        return (
            f"pod {key} has not opted in to migration: its namespace is not in migration.namespaces, its "
            f"scheduler {spec.get('schedulerName') or 'default-scheduler'!r} is not in migration.scheduler_names "
            f"and it is not annotated {MIGRATABLE_ANNOTATION}=true"
        )
    return pod_blocker(pod)
