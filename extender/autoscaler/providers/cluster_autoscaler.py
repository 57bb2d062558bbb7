"""cluster-autoscaler provider: a gRPC expander server (CA flag ``--expander=grpc``).

CA simulates its node groups, keeps the options that help some pending pods, and asks us
``BestOptions(options, nodeMap)``: each option is one node group (``nodeGroupId``) + a node count + the pods
it would help; ``nodeMap[nodeGroupId]`` is the group's template Node. We answer with the option(s) our
planner prefers, and CA scales that group. CA can only pick among its own options (one group + count per
loop), so the heterogeneous mix of ``plan_pods`` comes from successive CA loops.

Choice: every option is mapped to a flavour (its template's instance-type label in our catalogue, else a
flavour built from the template's allocatable and the ``qos.kube-qos-extender.io/price-per-hour``
annotation); ``core.autoscale.plan_pods`` plans the union of the options' pods over those flavours, and the
flavour of the plan's first node (the greedy's best cost-efficiency buy) wins. Among options of that flavour
the one helping most pods wins (then fewer nodes, then the id). Options we cannot price are never preferred;
if none can be priced, or anything fails, all options are returned unchanged, which is what CA itself does
on an error. TLS is mandatory (CA refuses an insecure expander); answers take milliseconds, far below
CA's 5 s call timeout (measured in tests/test_autoscaler_expander.py).

Generated stubs: ``extender.autoscaler.protogen`` (from the vendored upstream .proto files). In this CA
version options carry real ``k8s.io.api.core.v1.Pod`` / ``Node`` messages, converted here to the Kubernetes
JSON shape and then through ``extender.kube.convert`` like every other pod and node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from extender.autoscaler.metrics import AutoscalerMetrics
from extender.autoscaler.protogen import load_expander
from extender.config import ExtenderConfig
from extender.core import autoscale
from extender.core.model import Flavour, InvalidInputError, Node, Pod
from extender.kube.convert import node_from_k8s, pod_from_k8s

__all__ = ["ExpanderChoice", "ExpanderServer", "OptionView", "choose", "node_to_dict", "pod_to_dict"]

log = logging.getLogger("extender.autoscaler.expander")

PRICE_KEY = "qos.kube-qos-extender.io/price-per-hour"


@dataclass(frozen=True, slots=True)
class OptionView:
    node_group_id: str
    node_count: int
    pods: tuple[Pod, ...]
    template: Node | None
    price_per_hour: float | None = None


@dataclass(frozen=True, slots=True)
class ExpanderChoice:
    chosen: tuple[str, ...]  # node group ids, in CA's order
    flavour: str | None
    reason: str


# ----------------------------------------------------------------------------------- protobuf -> JSON


def _quantities(m: Mapping[str, Any]) -> dict[str, str]:
    return {k: v.string for k, v in m.items() if v.string}


def _container(c: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": c.name,
        "resources": {"requests": _quantities(c.resources.requests), "limits": _quantities(c.resources.limits)},
    }
    if c.HasField("restartPolicy"):
        out["restartPolicy"] = c.restartPolicy
    return out


def pod_to_dict(p: Any) -> dict[str, Any]:
    """A k8s.io.api.core.v1.Pod message -> the Kubernetes JSON fields extender.kube.convert reads."""
    meta = p.metadata
    spec: dict[str, Any] = {
        "containers": [_container(c) for c in p.spec.containers],
        "initContainers": [_container(c) for c in p.spec.initContainers],
        "overhead": _quantities(p.spec.overhead),
        "schedulerName": p.spec.schedulerName,
    }
    if p.spec.HasField("priority"):
        spec["priority"] = p.spec.priority
    if p.spec.HasField("resources"):
        spec["resources"] = {
            "requests": _quantities(p.spec.resources.requests),
            "limits": _quantities(p.spec.resources.limits),
        }
    if p.spec.nodeName:
        spec["nodeName"] = p.spec.nodeName
    return {
        "metadata": {
            "name": meta.name,
            "namespace": meta.namespace or "default",
            "uid": meta.uid,
            "labels": dict(meta.labels),
            "annotations": dict(meta.annotations),
            "ownerReferences": [
                {"kind": r.kind, "name": r.name, "controller": bool(r.controller)} for r in meta.ownerReferences
            ],
        },
        "spec": spec,
        "status": {"phase": p.status.phase or "Pending"},
    }


def node_to_dict(n: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": n.metadata.name,
            "labels": dict(n.metadata.labels),
            "annotations": dict(n.metadata.annotations),
        },
        "spec": {"unschedulable": bool(n.spec.unschedulable)},
        "status": {"allocatable": _quantities(n.status.allocatable), "capacity": _quantities(n.status.capacity)},
    }


# --------------------------------------------------------------------------------------------- choice


def _flavour_of(option: OptionView, catalogue: Mapping[str, Flavour]) -> Flavour | None:
    template = option.template
    if template is None:
        return None
    if template.flavour is not None and template.flavour in catalogue:
        return catalogue[template.flavour]
    if option.price_per_hour is None:
        return None
    try:
        return Flavour(f"{template.flavour or option.node_group_id}", template.allocatable, option.price_per_hour)
    except InvalidInputError:
        return None


def choose(
    options: Sequence[OptionView], catalogue: Sequence[Flavour], weights: autoscale.ScoreWeights
) -> ExpanderChoice:
    """The option(s) our planner prefers among CA's (pure; see the module docstring)."""
    all_ids = tuple(o.node_group_id for o in options)
    by_name = {f.name: f for f in catalogue}
    priced: list[tuple[OptionView, Flavour]] = []
    for option in options:
        flavour = _flavour_of(option, by_name)
        if flavour is not None:
            priced.append((option, flavour))
    if not priced:
        return ExpanderChoice(all_ids, None, "no option could be priced: keeping all")
    flavours: dict[str, Flavour] = {}
    for _, flavour in priced:
        flavours.setdefault(flavour.name, flavour)
    pods: dict[str, Pod] = {}
    for option, _ in priced:
        for pod in option.pods:
            pods.setdefault(pod.key, pod)
    if not pods:  # nothing to pack: the cheapest node of the cheapest option
        option, flavour = min(priced, key=lambda of: (of[1].price_per_hour * of[0].node_count, of[0].node_group_id))
        return ExpanderChoice((option.node_group_id,), flavour.name, "no pods: cheapest option")
    plan = autoscale.plan_pods(list(pods.values()), list(flavours.values()), weights)
    if not plan.nodes:
        return ExpanderChoice(all_ids, None, "no option can hold any of the pods: keeping all")
    preferred = plan.nodes[0][0].name
    candidates = [(o, f) for o, f in priced if f.name == preferred]
    best, _ = min(candidates, key=lambda of: (-len(of[0].pods), of[0].node_count, of[0].node_group_id))
    counts = ", ".join(f"{n}x{name}" for name, n in plan.flavour_counts.items())
    return ExpanderChoice(
        (best.node_group_id,), preferred, f"plan {counts} (${plan.cost_per_hour:.4f}/h) starts with {preferred}"
    )


# ------------------------------------------------------------------------------------------------ server


def _price(annotations: Mapping[str, str], labels: Mapping[str, str]) -> float | None:
    raw = annotations.get(PRICE_KEY) or labels.get(PRICE_KEY)
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


class ExpanderServer:
    """grpc.aio server for the Expander service; TLS only."""

    def __init__(
        self,
        config: ExtenderConfig,
        catalogue: Sequence[Flavour],
        weights: autoscale.ScoreWeights,
        *,
        listen: str,
        cert_pem: bytes,
        key_pem: bytes,
        metrics: AutoscalerMetrics | None = None,
    ) -> None:
        self.config = config
        self.catalogue = list(catalogue)
        self.weights = weights
        self.listen = listen
        self._creds = grpc.ssl_server_credentials([(key_pem, cert_pem)])
        self.metrics = metrics
        self.stubs = load_expander()
        self._server: Any = None
        self.port = 0
        self.last_choice: ExpanderChoice | None = None

    def _views(self, request: Any) -> list[OptionView]:
        cfg = self.config
        templates: dict[str, tuple[Node, float | None]] = {}
        for group_id, msg in request.nodeMap.items():
            raw = node_to_dict(msg)
            try:
                node = node_from_k8s(raw, cfg.node_groups, cfg.scheduling.managed_resources)
            except InvalidInputError:
                continue
            templates[group_id] = (node, _price(raw["metadata"]["annotations"], raw["metadata"]["labels"]))
        views = []
        # CA repeats the same pending pods in every option: convert each pod once per request
        converted: dict[tuple[str, str, str], Pod | None] = {}
        for option in request.options:
            pods: list[Pod] = []
            for msg in option.pod:
                ident = (msg.metadata.namespace, msg.metadata.name, msg.metadata.uid)
                if ident not in converted or not msg.metadata.name:
                    try:
                        converted[ident], _ = pod_from_k8s(
                            pod_to_dict(msg), cfg.pod_defaults, cfg.policy.classes, cfg.scheduling.managed_resources
                        )
                    except InvalidInputError:
                        converted[ident] = None
                pod = converted[ident]
                if pod is not None:
                    pods.append(pod)
            template = templates.get(option.nodeGroupId)
            views.append(
                OptionView(
                    option.nodeGroupId,
                    option.nodeCount,
                    tuple(pods),
                    template[0] if template is not None else None,
                    template[1] if template is not None else None,
                )
            )
        return views

    async def BestOptions(self, request: Any, context: Any) -> Any:
        started = time.perf_counter()
        outcome = "ok"
        try:
            choice = choose(self._views(request), self.catalogue, self.weights)
        except Exception as exc:  # never fail CA's loop: keeping all options is CA's own fallback
            outcome = "error"
            log.exception("BestOptions failed; keeping all options")
            choice = ExpanderChoice(tuple(o.nodeGroupId for o in request.options), None, f"error: {exc!r}")
        self.last_choice = choice
        chosen = set(choice.chosen)
        response = self.stubs.pb2.BestOptionsResponse()
        for option in request.options:
            if option.nodeGroupId in chosen:
                kept = response.options.add()
                kept.nodeGroupId = option.nodeGroupId
                kept.nodeCount = option.nodeCount
                kept.debug = f"{option.debug} | qos-extender: {choice.reason}"[:1024]
        if self.metrics is not None:
            self.metrics.expander_requests.labels(outcome).inc()
            self.metrics.expander_duration.observe(time.perf_counter() - started)
            if choice.flavour is not None:
                self.metrics.expander_choice.labels(choice.flavour).inc()
        log.info(
            "BestOptions",
            extra={"decision": {"options": len(request.options), "chosen": list(choice.chosen), "why": choice.reason}},
        )
        return response

    async def start(self) -> int:
        server = grpc.aio.server()
        servicer = type("Servicer", (self.stubs.grpc.ExpanderServicer,), {"BestOptions": self.BestOptions})()
        self.stubs.grpc.add_ExpanderServicer_to_server(servicer, server)
        self.port = server.add_secure_port(self.listen, self._creds)
        if self.port == 0:
            raise OSError(f"cannot listen on {self.listen}")
        await server.start()
        self._server = server
        return int(self.port)

    async def stop(self, grace: float = 1.0) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
