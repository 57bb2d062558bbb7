"""JSON Patches the controller and the admission webhook send (pure, unit-tested without a cluster).

Both are RFC 6902 patches with a ``test`` guard where an index is involved, so a concurrent change to the pod
makes the PATCH fail (422) instead of removing someone else's gate.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from extender.core.owners import controller_ref

__all__ = [
    "BOOKING_ANNOTATIONS",
    "INSTANCE_ANNOTATION",
    "admission_patch",
    "escape",
    "owner_instance",
    "pin_term",
    "release_patch",
    "requeue_action",
    "requeue_copy",
    "unpin",
]

# The controller instance that gated a pod and owns its ordering (controller.instance); also the namespace label
# that routes a namespace to an instance. Pods without the annotation: see owner_instance.
INSTANCE_ANNOTATION = "qos.kube-qos-extender.io/controller"
DEFAULT_INSTANCE = "default"

Op = dict[str, Any]


def owner_instance(annotated: str | None, namespace: str, namespace_instances: Mapping[str, str]) -> str:
    """The controller instance that manages a pod: the one its admission annotation names; for a pod created
    while no webhook answered (no annotation), the instance its namespace is labelled for
    (qos.kube-qos-extender.io/controller), else "default" — the same rule the webhook configurations'
    namespaceSelectors apply, so the pod is accounted by the instance that would have gated it."""
    if annotated:
        return annotated
    return namespace_instances.get(namespace) or DEFAULT_INSTANCE


def route_known(annotated: str | None, created: float | None, listed_at: float | None) -> bool:
    """Whether ``owner_instance`` can be trusted for this pod yet. A pod the webhook annotated names its
    instance. One without the annotation is routed by its namespace's label, which the controller reads by
    listing namespaces every few seconds, while the API server applies a webhook's namespaceSelector at once:
    a pod created in a namespace labelled for another instance just before it was listed would be taken for
    this instance's (accounted, its account written) for up to one refresh. So such a pod waits until a list
    started after its creation (creationTimestamp has whole seconds: one second of margin). A gated pod is not
    held back: it carries our gate, so some webhook of ours admitted it and it waits for a release anyway."""
    if annotated:
        return True
    if listed_at is None:
        return False
    return created is None or created + 1.0 < listed_at


def escape(segment: str) -> str:
    """RFC 6901 escaping of one path segment: resource and gate names contain '/'."""
    return segment.replace("~", "~0").replace("/", "~1")


def pin_term(node: str) -> dict[str, Any]:
    """The node selector requirement that pins a pod to ``node``: matchFields on metadata.name, which (unlike
    the kubernetes.io/hostname label) always equals the Node's name."""
    return {"key": "metadata.name", "operator": "In", "values": [node]}


def release_patch(spec: Mapping[str, Any], gate: str, node: str | None) -> list[Op]:
    """Remove ``gate`` from spec.schedulingGates and, with ``node``, pin the pod there.

    While a pod is gated its node affinity may only be tightened (mutable scheduling directives, KEP-3838):
    absent affinity may be set; existing required terms may only gain requirements. So the pin is ADDED to
    every existing term (a term is an OR branch: each must now also match the node), never replacing one.
    Returns [] when the gate is not there (already released: nothing to do).
    """
    gates = spec.get("schedulingGates") or []
    index = next((i for i, g in enumerate(gates) if isinstance(g, dict) and g.get("name") == gate), None)
    if index is None:
        return []
    ops: list[Op] = [
        {"op": "test", "path": f"/spec/schedulingGates/{index}/name", "value": gate},
        {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
    ]
    if node is None:
        return ops
    req = pin_term(node)
    required = {"nodeSelectorTerms": [{"matchFields": [req]}]}
    affinity = spec.get("affinity")
    if not isinstance(affinity, dict):
        ops.append({"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {_REQ: required}}})
        return ops
    node_aff = affinity.get("nodeAffinity")
    if not isinstance(node_aff, dict):
        ops.append({"op": "add", "path": "/spec/affinity/nodeAffinity", "value": {_REQ: required}})
        return ops
    existing = node_aff.get(_REQ)
    terms = existing.get("nodeSelectorTerms") if isinstance(existing, dict) else None
    if not isinstance(terms, list) or not terms:
        ops.append({"op": "add", "path": f"/spec/affinity/nodeAffinity/{_REQ}", "value": required})
        return ops
    for i, term in enumerate(terms):
        base = f"/spec/affinity/nodeAffinity/{_REQ}/nodeSelectorTerms/{i}/matchFields"
        if isinstance(term, dict) and isinstance(term.get("matchFields"), list):
            ops.append({"op": "add", "path": f"{base}/-", "value": req})
        else:
            ops.append({"op": "add", "path": base, "value": [req]})
    return ops


_REQ = "requiredDuringSchedulingIgnoredDuringExecution"


def admission_patch(
    pod: Mapping[str, Any], gate: str | None, marker: str | None, instance: str | None = None
) -> list[Op]:
    """What the mutating webhook adds to a new qos pod: our scheduling gate (if absent; None: the controller
    is off, nothing is gated), the annotation naming the controller ``instance`` that owns the pod (so two
    controllers on one cluster never act on each other's pods) and, when a marker resource is configured,
    ``marker: "1"`` in requests and limits of the first container (extended resources need requests ==
    limits) so kube-scheduler's global extender only sees qos pods (issue 5)."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return []
    ops: list[Op] = []
    gates = spec.get("schedulingGates")
    if gate is None:
        pass
    elif not isinstance(gates, list) or not gates:
        ops.append({"op": "add", "path": "/spec/schedulingGates", "value": [{"name": gate}]})
    elif not any(isinstance(g, dict) and g.get("name") == gate for g in gates):
        ops.append({"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": gate}})
    if instance is not None:
        meta = pod.get("metadata")
        annotations = meta.get("annotations") if isinstance(meta, dict) else None
        if not isinstance(meta, dict):
            ops.append({"op": "add", "path": "/metadata", "value": {"annotations": {INSTANCE_ANNOTATION: instance}}})
        elif not isinstance(annotations, dict):
            ops.append({"op": "add", "path": "/metadata/annotations", "value": {INSTANCE_ANNOTATION: instance}})
        elif annotations.get(INSTANCE_ANNOTATION) != instance:
            ops.append({"op": "add", "path": f"/metadata/annotations/{escape(INSTANCE_ANNOTATION)}", "value": instance})
    containers = spec.get("containers")
    if marker is None or not isinstance(containers, Sequence) or not containers:
        return ops
    first = containers[0]
    if not isinstance(first, dict):
        return ops
    resources = first.get("resources")
    base = "/spec/containers/0/resources"
    if not isinstance(resources, dict):
        ops.append({"op": "add", "path": base, "value": {"requests": {marker: "1"}, "limits": {marker: "1"}}})
        return ops
    for part in ("requests", "limits"):
        current = resources.get(part)
        if not isinstance(current, dict):
            ops.append({"op": "add", "path": f"{base}/{part}", "value": {marker: "1"}})
        elif marker not in current:
            ops.append({"op": "add", "path": f"{base}/{part}/{escape(marker)}", "value": "1"})
    return ops


# Annotations that tied a pod to capacity booked for it by its former attempt: cluster-autoscaler's
# ProvisioningRequest consumer marker (both of its names). A re-queued pod is planned afresh, so they go.
BOOKING_ANNOTATIONS = (
    "autoscaling.x-k8s.io/consume-provisioning-request",
    "cluster-autoscaler.kubernetes.io/consume-provisioning-request",
)
# Owners that re-create a deleted pod of theirs (a pod of any other owner is never deleted to re-queue it).
RECREATING_OWNERS = frozenset({"ReplicaSet", "StatefulSet", "Job", "ReplicationController"})
_SERVER_SET = ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
               "generation", "managedFields", "selfLink")  # fmt: skip


def requeue_action(pod: Mapping[str, Any]) -> str:
    """How a released pod stuck on a pinned host goes back to the queue: "delete" (an owner that re-creates
    it will, and the admission webhook gates the new pod), "recreate" (a bare pod: the controller re-creates
    it itself), or "keep" (already bound or going, held by someone's finalizer, or owned by a controller we
    cannot count on to re-create it: deleting it would lose it)."""
    meta = pod.get("metadata")
    spec = pod.get("spec")
    if (
        not isinstance(meta, dict)
        or not isinstance(spec, dict)
        or spec.get("nodeName")
        or meta.get("deletionTimestamp")
    ):
        return "keep"
    owner = controller_ref(pod)
    if owner is not None:
        return "delete" if owner.get("kind") in RECREATING_OWNERS else "keep"
    return "keep" if meta.get("finalizers") else "recreate"


def requeue_copy(pod: Mapping[str, Any], gate: str, node: str) -> dict[str, Any]:
    """The bare pod to create in place of ``pod`` (same name, labels, annotations and spec): gated again by
    ``gate``, with the pin to ``node`` that ``release_patch`` added taken out of every term (a term left empty
    was ours alone and goes), without what the API server set or a former booking. The user's own affinity
    stays as written."""
    meta = {k: copy.deepcopy(v) for k, v in (pod.get("metadata") or {}).items() if k not in _SERVER_SET}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in BOOKING_ANNOTATIONS}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    spec = copy.deepcopy(dict(pod.get("spec") or {}))
    spec.pop("nodeName", None)
    gates = [g for g in spec.get("schedulingGates") or [] if isinstance(g, dict)]
    if not any(g.get("name") == gate for g in gates):
        gates.append({"name": gate})
    spec["schedulingGates"] = gates
    unpin(spec, node)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def unpin(spec: dict[str, Any], node: str) -> None:
    """Take the pin to ``node`` that ``release_patch`` added out of ``spec``'s required node affinity, in place (a
    term left empty was ours alone and goes; the user's own requirements stay as written). Used when the pod is
    made again elsewhere: re-queued, or its migration's destination pod (which the kubelet of another node would
    reject by NodeAffinity while the pin to its source stays)."""
    pin = pin_term(node)
    affinity = spec.get("affinity")
    node_aff = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    required = node_aff.get(_REQ) if isinstance(node_aff, dict) else None
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    if not isinstance(terms, list):
        return
    kept = []
    for term in terms:
        if not isinstance(term, dict):
            kept.append(term)
            continue
        fields = [f for f in term.get("matchFields") or [] if f != pin]
        if fields:
            term["matchFields"] = fields
        else:
            term.pop("matchFields", None)
        if term:
            kept.append(term)
    assert isinstance(required, dict) and isinstance(node_aff, dict) and isinstance(affinity, dict)
    if kept:
        required["nodeSelectorTerms"] = kept
        return
    del node_aff[_REQ]
    if not node_aff:
        del affinity["nodeAffinity"]
    if not affinity:
        del spec["affinity"]
