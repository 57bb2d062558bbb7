"""Admission of batch pods onto the slack of long-running services (issue 16, deliverable 3).

The slack controller publishes each node's predicted reclaimable capacity as the extended resources
``qos.kube-qos-extender.io/batch-cpu`` (millicores) and ``.../batch-memory`` (bytes). A batch pod uses it by
requesting those *instead of* cpu/memory: kube-scheduler and the kubelet then admit it only where the
prediction says there is room, and it does not take from what ordinary pods are admitted against.

A user opts a pod in with the annotation ``qos.kube-qos-extender.io/colocate: "true"``; the mutating
webhook then rewrites every container's cpu/memory requests into the batch resources, when ``slack.colocate``
is enabled, the pod is of kind batch and its class is one of ``slack.colocate.classes``:

* a cpu request of ``c`` becomes ``batch-cpu: <c in millicores>``, a memory request of ``m`` becomes
  ``batch-memory: <m in bytes>`` (a missing request falls back to the limit, as the API server defaults it);
* requests and limits of the batch resources are equal (extended resources cannot be overcommitted);
* the cpu/memory limits go too: kept, the API server would default the requests back from them. The pod is
  then BestEffort for the kubelet, the first to go under node pressure, which is what a tenant of borrowed
  capacity should be; the slack controller evicts it first when the lender's usage grows.

Anything else (``false``, opted in while co-location is off, a class or kind not allowed) leaves the pod as
it is, with a warning in the admission response; a malformed value also gets a Warning Event from the pod
watch (:func:`extender.kube.convert.pod_settings`). Never a denial: the pod still runs, on ordinary requests.

Pure: a pod document in, the rewritten pod and its JSON Patch out.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from extender.colocation.controller import BATCH_CPU, BATCH_MEMORY
from extender.core.model import InvalidInputError, WorkloadKind, cpu_millicores, memory_bytes
from extender.kube.convert import COLOCATE_KEY, pod_settings
from extender.settings.extender import ColocateConfig, ExtenderConfig

__all__ = ["COLOCATE_KEY", "Colocation", "colocate", "colocate_for"]

Op = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Colocation:
    """The pod after the rewrite (the input itself when nothing changed), the JSON Patch ops that make it, and
    the warnings to return to the client."""

    pod: Mapping[str, Any]
    ops: tuple[Op, ...] = ()
    warnings: tuple[str, ...] = ()


def _left(pod: Mapping[str, Any], why: str) -> Colocation:
    """The pod unchanged, with why as the admission warning."""
    return Colocation(pod, warnings=(f"{COLOCATE_KEY}: {why}",))


def _rewrite(resources: Mapping[str, Any]) -> dict[str, Any] | None:
    """One container's resources with cpu/memory moved to the batch resources; None when it has neither."""
    requests = dict(resources.get("requests") or {})
    limits = dict(resources.get("limits") or {})
    batch: dict[str, str] = {}
    for name, target, parse in (("cpu", BATCH_CPU, cpu_millicores), ("memory", BATCH_MEMORY, memory_bytes)):
        value = requests.pop(name, None)
        limit = limits.pop(name, None)
        if value is None:
            value = limit
        if value is not None:
            batch[target] = str(parse(value))
    if not batch:
        return None
    out = dict(resources)
    out["requests"] = {**requests, **batch}
    out["limits"] = {**limits, **batch}
    return out


def colocate(pod: Mapping[str, Any], settings: ColocateConfig, config: ExtenderConfig) -> Colocation:
    """The co-location decision for a new pod (see the module doc); ``config`` gives the classes and pod
    defaults the pod's class and kind are resolved with."""
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    raw = annotations.get(COLOCATE_KEY) if isinstance(annotations, Mapping) else None
    if raw is None:
        return Colocation(pod)
    value = raw.strip().lower() if isinstance(raw, str) else ""
    if value == "false":
        return Colocation(pod)
    if value != "true":
        return Colocation(pod, warnings=(f'{COLOCATE_KEY}: expected "true" or "false", got {raw!r}; not co-located',))
    if not settings.enabled:
        return Colocation(
            pod, warnings=(f"{COLOCATE_KEY}: co-location is off (slack.colocate.enabled); not co-located",)
        )
    try:
        qos = pod_settings(pod, config.pod_defaults, config.policy.classes)
    except InvalidInputError as exc:
        return Colocation(pod, warnings=(f"{COLOCATE_KEY}: {exc}; not co-located",))
    if qos.kind is not WorkloadKind.BATCH:
        return Colocation(pod, warnings=(f"{COLOCATE_KEY}: only batch pods are co-located (kind {qos.kind.value})",))
    if qos.class_name not in settings.classes:
        allowed = ", ".join(settings.classes)
        return Colocation(
            pod,
            warnings=(f"{COLOCATE_KEY}: class {qos.class_name} may not co-locate (slack.colocate.classes: {allowed})",),
        )
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return Colocation(pod)
    out = copy.deepcopy(dict(pod))
    ops: list[Op] = []
    try:
        for part in ("initContainers", "containers"):
            for i, c in enumerate(spec.get(part) or []):
                if not isinstance(c, Mapping) or not isinstance(c.get("resources") or {}, Mapping):
                    continue
                new = _rewrite(c.get("resources") or {})
                if new is None:
                    continue
                out["spec"][part][i]["resources"] = new
                op = "replace" if "resources" in c else "add"
                ops.append({"op": op, "path": f"/spec/{part}/{i}/resources", "value": new})
    except InvalidInputError as exc:
        return _left(pod, f"{exc}; not co-located")
    if not ops:
        return _left(pod, "no cpu or memory request to move onto the slack")
    return Colocation(out, tuple(ops))


def colocate_for(pod: Mapping[str, Any], config: ExtenderConfig) -> Colocation:
    """:func:`colocate` with the config's ``slack.colocate``."""
    return colocate(pod, config.slack.colocate, config)
