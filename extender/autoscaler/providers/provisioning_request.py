"""Demand handed to the cluster-autoscaler users already run, as ProvisioningRequests (``autoscaling.x-k8s.io/v1``).

Why this route (issue 27; the alternatives are in extender/autoscaler/README.md "Demand cluster-autoscaler can
see"): pods held by the QoS controller's scheduling gate are invisible to CA (``SchedulingGatedPods`` are neither
unschedulable nor unprocessed to it), and releasing them to make kube-scheduler mark them Unschedulable would give
up Q ordering and let CA's own expander re-shape our plan one node group per loop. A ProvisioningRequest of class
``best-effort-atomic-scale-up.autoscaling.x-k8s.io`` is CA's own API for "buy capacity for these pods": CA runs its
normal scale-up for the request's pods, all or nothing, while the real pods stay gated and keep their Q order.

What we send, per scan: one request per (node group, flavour) of the plan -- CA provisions one node group per request
("giving up due to all-or-nothing" for pod sets no single group can hold) -- with one pod set per planned node,
whose single pod asks for the *sum* of the pods our planner put on that node and is pinned by nodeSelector to that
group and flavour. So CA buys exactly the nodes of our plan (its own bin-packing cannot re-pack them into fewer or
other nodes: the planner's first-fit never leaves room on one node for a later node's whole content), through any
node group backend (a cloud's, or ours over externalgrpc). The template carries no routing marker (the extended
resource no node offers), so CA's scheduling simulation is never blocked by it, and tolerates every taint: the
nodeSelector already restricts it to the group our pods were planned for.

The real pods get the annotation ``autoscaling.x-k8s.io/consume-provisioning-request``: CA's pod-list processor
drops such pods from its own scale-up, so a pod the controller later releases unpinned (gate timeout, priority
preemption) is never bought for twice. Once every pod of a request is bound (or gone) the request and its
templates are deleted, which ends CA's booking of the capacity (10 min otherwise) so its scale-down may act.
A request CA marks ``Failed`` is withdrawn and its pods are planned again at the next scan.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from kubernetes_asyncio import client as k8s

from extender.autoscaler.loop import PROVISIONED_BY_LABEL, Notice, ProvisionRequest
from extender.core.model import NodeGroup
from extender.kube.client import ApiError, read_json

__all__ = [
    "CONSUME_ANNOTATION",
    "GROUP",
    "MANAGED_BY_LABEL",
    "PLAN_ANNOTATION",
    "ProvisioningRequestProvider",
    "TrackedRequest",
    "chunk_requests",
    "pod_template",
    "provisioning_request",
]

log = logging.getLogger("extender.autoscaler.provisioning_request")

GROUP, VERSION, PLURAL = "autoscaling.x-k8s.io", "v1", "provisioningrequests"
BEST_EFFORT_ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
LIST_FAILED_LOG_SECONDS = 600.0  # a LIST failing for the same reason is logged again after this long
MANAGED_BY = "qos-autoscaler"
# JSON on each request: what it was bought for, so a restarted sidecar adopts it instead of buying again
PLAN_ANNOTATION = "qos.kube-qos-extender.io/plan"
MAX_POD_SETS = 32  # the CRD's limit on spec.podSets
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"  # never run: CA only simulates the template's pods


def chunk_requests(
    requests: Sequence[ProvisionRequest], max_pod_sets: int = MAX_POD_SETS
) -> list[list[ProvisionRequest]]:
    """One list per ProvisioningRequest: nodes of one (group, flavour), at most ``max_pod_sets`` each, in the
    plan's order (CA picks the oldest request first, so the plan's first flavours are bought first)."""
    by_key: dict[tuple[NodeGroup, str], list[ProvisionRequest]] = {}
    for r in requests:
        by_key.setdefault((r.group, r.flavour.name), []).append(r)
    out: list[list[ProvisionRequest]] = []
    for nodes in by_key.values():
        out.extend(nodes[i : i + max_pod_sets] for i in range(0, len(nodes), max_pod_sets))
    return out


def _node_selector(request: ProvisionRequest) -> dict[str, str]:
    # provisioned-by is our record on nodes *we* made; CA's nodes (a cloud's node group) do not carry it
    return {k: v for k, v in request.labels.items() if k != PROVISIONED_BY_LABEL}


def pod_template(name: str, namespace: str, request: ProvisionRequest) -> dict[str, Any]:
    """The PodTemplate of one planned node: one pod asking what our planner packed onto it."""
    req = request.requests
    resources = {"cpu": f"{max(req.cpu_milli, 1)}m", "memory": str(max(req.memory_bytes, 1))}
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "template": {
            "metadata": {"labels": {MANAGED_BY_LABEL: MANAGED_BY}},
            "spec": {
                "nodeSelector": _node_selector(request),
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "planned-node", "image": PAUSE_IMAGE, "resources": {"requests": resources}}],
            },
        },
    }


def provisioning_request(
    name: str, namespace: str, nodes: Sequence[ProvisionRequest], templates: Sequence[str], now: float, class_name: str
) -> dict[str, Any]:
    first = nodes[0]
    plan = {
        "group": first.group.value,
        "flavour": first.flavour.name,
        "price_per_hour": first.flavour.price_per_hour,
        "requested_at": now,
        "nodes": [{"name": n.name, "pods": list(n.pods)} for n in nodes],
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ProvisioningRequest",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY, "qos.kube-qos-extender.io/flavour": first.flavour.name},
            "annotations": {PLAN_ANNOTATION: orjson.dumps(plan).decode()},
        },
        "spec": {
            "provisioningClassName": class_name,
            "podSets": [{"podTemplateRef": {"name": t}, "count": 1} for t in templates],
        },
    }


@dataclass(slots=True)
class TrackedRequest:
    """One ProvisioningRequest we made: its planned nodes (ledger names) and what CA said of it so far."""

    name: str
    group: NodeGroup
    flavour: str
    price_per_hour: float
    created_at: float
    nodes: dict[str, tuple[str, ...]]  # ledger name -> pod keys
    templates: tuple[str, ...] = ()
    provisioned_at: float | None = None
    done: set[str] = field(default_factory=set)  # ledger names whose pods all bound (or went)
    outcome: str | None = None  # how it ended: fulfilled, failed, delivered, timed_out, deleted (None: open)


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    status = obj.get("status")
    conds = status.get("conditions") if isinstance(status, dict) else None
    for c in conds if isinstance(conds, list) else []:
        if isinstance(c, dict) and c.get("type") == kind:
            return c
    return None


class ProvisioningRequestProvider:
    """The sidecar's provider under cluster-autoscaler: plans become ProvisioningRequests CA carries out."""

    name = "provisioning-request"

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        *,
        class_name: str = BEST_EFFORT_ATOMIC,
        delivered_grace_seconds: float = 300.0,
        request_timeout: float = 30.0,
        metrics: Any = None,
        events: Any = None,
        clock: Any = None,
    ) -> None:
        self._core = k8s.CoreV1Api(api_client)
        self._custom = k8s.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.class_name = class_name
        self.grace = delivered_grace_seconds
        self._timeout = request_timeout
        self._metrics = metrics
        self._events = events
        self._clock = clock or time.time
        self.requests: dict[str, TrackedRequest] = {}
        self._by_node: dict[str, str] = {}  # ledger name -> request name
        self.history: list[TrackedRequest] = []  # every request made by this process, for reports and tests
        # ledger names to plan again (CA failed the request, delivered to others, deleted by someone): forgotten
        self.failed: list[str] = []
        self.not_created: list[str] = []  # ledger names whose request never reached CA: planned again, not counted
        self.listed = False  # our open requests were listed once (a restarted sidecar adopts them before buying)
        self._withdrawn: set[str] = set()  # requests we gave up whose delete failed: retried, never adopted
        self._list_error: str | None = None  # why the last LIST failed (None: it did not), and when it was logged
        self._list_logged_at = -math.inf

    # ------------------------------------------------------------------------------------------ writes

    async def create_all(self, requests: Sequence[ProvisionRequest]) -> None:
        now = self._clock()
        for nodes in chunk_requests(requests):
            first = nodes[0]
            name = f"qos-{first.group.value}-{_slug(first.flavour.name)}-{secrets.token_hex(4)}"
            templates = [f"{name}-{i}" for i in range(len(nodes))]
            try:
                for t, node in zip(templates, nodes, strict=True):
                    await self._create_template(pod_template(t, self.namespace, node))
                body = provisioning_request(name, self.namespace, nodes, templates, now, self.class_name)
                await read_json(
                    await self._custom.create_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, PLURAL, body, _preload_content=False,
                        _request_timeout=self._timeout,
                    )
                )  # fmt: skip
            except Exception as exc:  # nothing is left behind; the next scan plans the pods again
                why = _create_error(exc)
                log.error("provisioning request not created", extra={"error": why, "decision": {"request": name}})
                self._count(first, "create_failed", len(nodes))
                await self._delete_templates(templates)
                self.not_created.extend(n.name for n in nodes)
                self._warn(
                    [k for n in nodes for k in n.pods],
                    "ProvisioningRequestNotCreated",
                    f"capacity for this pod ({first.flavour.name}) could not be requested from cluster-autoscaler: "
                    f"{why}; tried again at the next scan",
                )
                continue
            tracked = TrackedRequest(
                name, first.group, first.flavour.name, first.flavour.price_per_hour, now,
                {n.name: n.pods for n in nodes}, tuple(templates),
            )  # fmt: skip
            self._track(tracked)
            self.history.append(tracked)
            self._count(first, "created", len(nodes))
            log.info(
                "demand handed to cluster-autoscaler",
                extra={
                    "decision": {
                        "request": f"{self.namespace}/{name}",
                        "group": first.group.value,
                        "flavour": first.flavour.name,
                        "nodes": len(nodes),
                        "pods": [p for n in nodes for p in n.pods],
                    }
                },
            )
            for node in nodes:
                for key in node.pods:
                    await self._annotate(key, name)

    async def create(self, request: ProvisionRequest) -> None:
        await self.create_all([request])

    def _count(self, first: ProvisionRequest, outcome: str, nodes: int) -> None:
        if self._metrics is not None:
            self._metrics.provreq_outcome(first.group.value, first.flavour.name, outcome, nodes)
            self._metrics.provreq_pending.set(len(self.requests))

    def _track(self, tracked: TrackedRequest) -> None:
        self.requests[tracked.name] = tracked
        for node in tracked.nodes:
            self._by_node[node] = tracked.name

    async def _create_template(self, body: Any) -> None:
        try:
            await read_json(
                await self._core.create_namespaced_pod_template(
                    self.namespace, body, _preload_content=False, _request_timeout=self._timeout
                )
            )
        except ApiError as exc:
            if exc.status != 409:
                raise

    async def _annotate(self, key: str, request: str) -> None:
        """Tell CA this pod's capacity is requested (its pod-list processor then never scales up for it)."""
        namespace, pod = key.split("/", 1)
        body = {"metadata": {"annotations": {CONSUME_ANNOTATION: request}}}
        try:
            await read_json(
                await self._core.patch_namespaced_pod(
                    pod, namespace, body, _preload_content=False, _request_timeout=self._timeout
                )
            )
        except ApiError as exc:
            if exc.status != 404:  # a pod deleted meanwhile needs nothing
                log.warning("consume annotation not written", extra={"error": str(exc), "pod": key})
        except Exception as exc:
            log.warning("consume annotation not written", extra={"error": str(exc), "pod": key})

    async def _delete_templates(self, names: Iterable[str]) -> None:
        for t in names:
            try:
                await read_json(
                    await self._core.delete_namespaced_pod_template(
                        t, self.namespace, _preload_content=False, _request_timeout=self._timeout
                    )
                )
            except ApiError as exc:
                if exc.status != 404:
                    log.warning("pod template not deleted", extra={"error": str(exc), "decision": {"template": t}})
            except Exception as exc:
                log.warning("pod template not deleted", extra={"error": str(exc), "decision": {"template": t}})

    async def _delete_request(self, name: str) -> bool:
        """Delete one of our requests; True once it is gone (also when it already was)."""
        try:
            await read_json(
                await self._custom.delete_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, name, _preload_content=False,
                    _request_timeout=self._timeout,
                )
            )  # fmt: skip
        except ApiError as exc:
            if exc.status == 404:
                return True
            log.warning("provisioning request not deleted", extra={"error": str(exc), "decision": {"request": name}})
            return False
        except Exception as exc:
            log.warning("provisioning request not deleted", extra={"error": str(exc), "decision": {"request": name}})
            return False
        return True

    async def _withdraw(self, name: str, outcome: str) -> None:
        tracked = self.requests.pop(name, None)
        if not await self._delete_request(name):
            self._withdrawn.add(name)  # retried at the next sync, never adopted meanwhile
        if tracked is None:
            return
        tracked.outcome = outcome
        for node in tracked.nodes:
            self._by_node.pop(node, None)
        await self._delete_templates(tracked.templates)
        if self._metrics is not None:
            self._metrics.provreq_outcome(tracked.group.value, tracked.flavour, outcome, len(tracked.nodes))
            self._metrics.provreq_pending.set(len(self.requests))
        log.info(
            "provisioning request withdrawn" if outcome != "fulfilled" else "provisioning request fulfilled",
            extra={"decision": {"request": f"{self.namespace}/{name}", "outcome": outcome, "flavour": tracked.flavour}},
        )

    async def cancel(self, node_name: str) -> None:
        """A planned node did not come within the provisioning timeout: withdraw its whole request (CA may hold
        it in back-off for 10 min; the loop plans the pods again)."""
        name = self._by_node.get(node_name)
        if name is not None:
            await self._withdraw(name, "timed_out")

    async def fulfilled(self, node_names: Iterable[str]) -> None:
        """These planned nodes' pods are all bound (or gone): once a request has no planned node left waiting, it
        is deleted, which ends CA's booking of its capacity."""
        now = self._clock()
        for node in node_names:
            name = self._by_node.get(node)
            tracked = self.requests.get(name) if name is not None else None
            if tracked is None:
                continue
            tracked.done.add(node)
            if tracked.done >= set(tracked.nodes):
                if self._metrics is not None:
                    self._metrics.provreq_seconds("fulfilled", now - tracked.created_at)
                await self._withdraw(tracked.name, "fulfilled")

    async def delete(self, node_name: str) -> None:
        """Nodes are CA's to remove (its scale-down); the sidecar never deletes one in this mode."""
        log.warning(
            "node delete asked of the provisioning-request provider: CA removes nodes", extra={"node": node_name}
        )

    async def set_retiring(self, node_name: str, retiring: bool) -> None:
        """Never asked: retirement for capacity is the sidecar's own purchase rule, off under CA."""

    # ------------------------------------------------------------------------------------------ reads

    async def sync(self) -> list[tuple[NodeGroup, str, str, float, tuple[str, ...]]]:
        """Read CA's verdict on our requests (one LIST per scan). Provisioned -> its age is observed; Failed ->
        withdrawn and its nodes reported in ``failed`` (planned again). Returns requests found in the cluster that
        this process did not make (a restart): (group, flavour, ledger name, requested_at, pods) to adopt."""
        try:
            listed = await read_json(
                await self._custom.list_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}",
                    _preload_content=False, _request_timeout=self._timeout,
                )
            )  # fmt: skip
        except Exception as exc:
            self._list_failed(exc)
            return []
        now = self._clock()
        if self._list_error is not None:
            log.info("provisioning requests listed again", extra={"decision": {"after": self._list_error}})
            self._list_error = None
        self.listed = True
        for gone in list(self._withdrawn):
            if await self._delete_request(gone):
                self._withdrawn.discard(gone)
        adopt: list[tuple[NodeGroup, str, str, float, tuple[str, ...]]] = []
        seen: set[str] = set()
        for obj in listed.get("items", []) if isinstance(listed, dict) else []:
            meta = obj.get("metadata") or {}
            name = meta.get("name")
            if not isinstance(name, str):
                continue
            seen.add(name)
            if name in self._withdrawn:  # given up, its delete failed: never adopted again
                continue
            tracked = self.requests.get(name)
            if tracked is None:
                tracked = _adopted(
                    name,
                    meta,
                    [t.get("podTemplateRef", {}).get("name", "") for t in (obj.get("spec") or {}).get("podSets") or []],
                )
                if tracked is None:
                    continue
                self._track(tracked)
                adopt.extend(
                    (tracked.group, tracked.flavour, n, tracked.created_at, p) for n, p in tracked.nodes.items()
                )
            failed = _condition(obj, "Failed")
            if failed is not None and failed.get("status") == "True":
                self.failed.extend(tracked.nodes)
                self._event_failed(tracked, str(failed.get("message") or failed.get("reason") or ""))
                await self._withdraw(name, "failed")
                continue
            provisioned = _condition(obj, "Provisioned")
            if tracked.provisioned_at is None and provisioned is not None and provisioned.get("status") == "True":
                tracked.provisioned_at = now
                if self._metrics is not None:
                    self._metrics.provreq_seconds("provisioned", now - tracked.created_at)
                    self._metrics.provreq_outcome(
                        tracked.group.value, tracked.flavour, "provisioned", len(tracked.nodes)
                    )
                log.info(
                    "cluster-autoscaler provisioned",
                    extra={"decision": {"request": f"{self.namespace}/{name}", "flavour": tracked.flavour,
                                        "seconds": round(now - tracked.created_at, 3)}},
                )  # fmt: skip
            elif tracked.provisioned_at is not None and now - tracked.provisioned_at > self.grace:
                # CA bought it and the nodes had time to join, yet some pods still wait: others (released earlier
                # in Q order) took that room. Their capacity is gone; they are planned again.
                self.failed.extend(n for n in tracked.nodes if n not in tracked.done)
                await self._withdraw(name, "delivered")
        for name in [n for n in self.requests if n not in seen and now - self.requests[n].created_at > 30]:
            # deleted by someone else: its nodes are forgotten like a failure (planned again if still needed)
            tracked = self.requests.pop(name)
            tracked.outcome = "deleted"
            for node in tracked.nodes:
                self._by_node.pop(node, None)
            self.failed.extend(tracked.nodes)
            await self._delete_templates(tracked.templates)
            if self._metrics is not None:
                self._metrics.provreq_pending.set(len(self.requests))
        return adopt

    def drain_failed(self) -> list[str]:
        out, self.failed = self.failed, []
        return out

    def drain_not_created(self) -> list[str]:
        out, self.not_created = self.not_created, []
        return out

    def _event_failed(self, tracked: TrackedRequest, message: str) -> None:
        self._warn(
            [k for pods in tracked.nodes.values() for k in pods],
            "ProvisioningRequestFailed",
            f"cluster-autoscaler failed ProvisioningRequest {self.namespace}/{tracked.name} ({tracked.flavour}): "
            f"{message}; planned again",
        )

    def _warn(self, keys: Sequence[str], reason: str, message: str) -> None:
        if self._events is None:
            return
        for key in keys:
            namespace, pod = key.split("/", 1)
            self._events.emit(Notice("Pod", namespace, pod, "", reason, message, True))

    def _list_failed(self, exc: Exception) -> None:
        """Until our requests are listed once, nothing is requested (a restart must not buy twice): say why, with
        the fix when the API does not serve ProvisioningRequests (no cluster-autoscaler, or one without the CRD: the
        default install on a bare cluster). Logged when the reason changes and every LIST_FAILED_LOG_SECONDS while
        it lasts, not at every scan."""
        why = _list_error(exc)
        now = self._clock()
        if why == self._list_error and now - self._list_logged_at < LIST_FAILED_LOG_SECONDS:
            return
        self._list_error, self._list_logged_at = why, now
        log.warning(
            "provisioning requests not listed: no capacity is requested from cluster-autoscaler until they are",
            extra={"error": why},
        )

    def cost_per_hour(self) -> float:
        return math.fsum(t.price_per_hour * len(t.nodes) for t in self.requests.values())

    async def close(self) -> None:
        """Requests stay: CA keeps buying for them, a restarted sidecar adopts them (PLAN_ANNOTATION)."""


def _list_error(exc: Exception) -> str:
    """Why listing our requests failed, with the likely fix when the API does not serve them."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, ApiError) and exc.status == 404:
        return (
            f"{text} (the API serves no {PLURAL}.{GROUP}/{VERSION}: cluster-autoscaler >= 1.35 and its "
            'ProvisioningRequest CRD are not installed, README.md "cluster-autoscaler"; without a cluster-autoscaler '
            "set the chart's autoscaler.mode=off)"
        )
    if isinstance(exc, ApiError) and exc.status == 403:
        return f"{text} (RBAC: Role qos-autoscaler-demand in the sidecar's namespace grants list)"
    return text


def _create_error(exc: Exception) -> str:
    """What went wrong creating a request, with the likely fix when the API does not know the resource."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, ApiError) and exc.status == 404 and "namespaces" not in text.lower():
        return (
            f'{text} (is the ProvisioningRequest CRD of cluster-autoscaler installed? README.md "cluster-autoscaler")'
        )
    if isinstance(exc, ApiError) and exc.status == 403:
        return f"{text} (RBAC: Role qos-autoscaler-demand in the sidecar's namespace grants these writes)"
    return text


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-") or "x"


def _adopted(name: str, meta: Mapping[str, Any], templates: list[str]) -> TrackedRequest | None:
    """A request of ours from before a restart, read back from its plan annotation; None when unreadable."""
    try:
        plan = orjson.loads((meta.get("annotations") or {}).get(PLAN_ANNOTATION, ""))
        nodes = {str(n["name"]): tuple(str(p) for p in n["pods"]) for n in plan["nodes"]}
        return TrackedRequest(
            name, NodeGroup(plan["group"]), str(plan["flavour"]), float(plan["price_per_hour"]),
            float(plan["requested_at"]), nodes, tuple(t for t in templates if t),
        )  # fmt: skip
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        log.warning(
            "provisioning request without a readable plan: left to its maker", extra={"decision": {"request": name}}
        )
        return None
