"""POST /admission/mutate: the mutating admission webhook that gates qos pods at creation (AdmissionReview v1).

Scheduling gates can only be set when a pod is created, so ordering by Q needs this webhook: every pod with
spec.schedulerName == controller.scheduler_name gets the gate ``controller.gate_name`` (and, when
``scheduling.marker_resource`` is configured, that extended resource in requests and limits of its first
container, so kube-scheduler's global extender only sees qos pods — issue 5). The controller later removes
the gate in increasing Q.

Never denies: a malformed review gets 400 (the API server then applies the failurePolicy), anything else is
allowed, patched or not. With the controller disabled nothing is gated (a gate nobody releases would hold the
pod forever) but the marker is still added: routing to the extender does not depend on the controller. Gated
pods are annotated with ``controller.instance``: that instance alone accounts, releases and evicts them.
failurePolicy is Ignore in config/controller (the trade-off is documented there): an extender outage must not
become a pod-creation outage; pods created meanwhile are scheduled ungated, still accounted.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from aiohttp import web

from extender.controller.patches import admission_patch
from extender.settings.extender import ExtenderConfig
from extender.webhook.colocate import colocate_for
from extender.webhook.limits import BodyRefused, read_bounded

__all__ = ["ADMISSION_PATH", "add_admission_route", "review"]

ADMISSION_PATH = "/admission/mutate"
MARKER_RESOURCE_DEFAULT = "qos.kube-qos-extender.io/managed"

log = logging.getLogger("extender.webhook.admission")


def _marker(config: ExtenderConfig) -> str | None:
    """scheduling.marker_resource when the config has it (issue 5), else the documented literal."""
    marker: object = getattr(config.scheduling, "marker_resource", MARKER_RESOURCE_DEFAULT)
    return marker if isinstance(marker, str) and marker else None


def review(body: Mapping[str, Any], config: ExtenderConfig) -> dict[str, Any]:
    """The AdmissionReview response for ``body``; raises ValueError on a body that is not a review."""
    request = body.get("request") if isinstance(body, Mapping) else None
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        raise ValueError("not an AdmissionReview v1 with a request.uid")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    pod = request.get("object")
    kind = request.get("kind") or {}
    ctl = config.controller
    marker = _marker(config)
    # issue 16: an opted-in batch pod's cpu/memory requests move onto the slack first; the ops below see that pod
    moved = None
    is_pod = isinstance(kind, Mapping) and kind.get("kind") == "Pod"
    if request.get("operation") == "CREATE" and not request.get("subResource") and is_pod and isinstance(pod, Mapping):
        moved = colocate_for(pod, config)
        pod = moved.pod
    if (
        (ctl.enabled or marker is not None)
        and request.get("operation") == "CREATE"
        and isinstance(kind, Mapping)
        and kind.get("kind") == "Pod"
        and not request.get("subResource")
        and isinstance(pod, Mapping)
        and isinstance(pod.get("spec"), Mapping)
        and pod["spec"].get("schedulerName") == ctl.scheduler_name
    ):
        if ctl.enabled:
            ops = admission_patch(pod, ctl.gate_name, marker, ctl.instance)
        else:
            ops = admission_patch(pod, None, marker)
        if ops:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(orjson.dumps(ops)).decode()
    if moved is not None and moved.ops:
        after = orjson.loads(base64.b64decode(response["patch"])) if "patch" in response else []
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps([*moved.ops, *after])).decode()
    if moved is not None and moved.warnings:
        response["warnings"] = list(moved.warnings)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


RefusalSink = Callable[[str], None]
"""Told the reason label of each refused review (qos_extender_requests_refused_total)."""


def add_admission_route(app: web.Application, config: ExtenderConfig, on_refused: RefusalSink | None = None) -> None:
    """POST /admission/mutate. Anonymous by design (the API server presents no client certificate), so its body
    is bounded to what a pod's AdmissionReview can be (server.admission_max_body_bytes) and must arrive within
    server.read_timeout_seconds: 413 / 408, the connection closed, the refusal counted."""
    limit = config.server.admission_max_body_bytes
    timeout = config.server.read_timeout_seconds

    async def mutate(request: web.Request) -> web.Response:
        try:
            raw = await read_bounded(request, limit, timeout)
        except BodyRefused as exc:
            if on_refused is not None:
                on_refused(exc.reason)
            log.warning("admission review refused", extra={"decision": {"reason": exc.reason, "error": str(exc)}})
            response = web.Response(
                body=orjson.dumps({"Error": f"bad AdmissionReview: {exc}"}),
                status=exc.status,
                content_type="application/json",
            )
            response.force_close()
            return response
        try:
            body = orjson.loads(raw)
            answer = review(body, config)
        except (orjson.JSONDecodeError, ValueError) as exc:
            return web.Response(
                body=orjson.dumps({"Error": f"bad AdmissionReview: {exc}"}), status=400, content_type="application/json"
            )
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    app.router.add_post(ADMISSION_PATH, mutate)
