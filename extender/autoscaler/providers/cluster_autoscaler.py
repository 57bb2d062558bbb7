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
on an error. TLS is mandatory (CA refuses an insecure expander; CA presents no client certificate, so anyone who
reaches the port may ask: the answer only ranks the options it was given); answers take milliseconds, far below
CA's 5 s call timeout (measured in tests/test_autoscaler_expander.py). The receive limit, the size histogram and
the count of refused calls are grpc_guard.py's.

Wire format (``protos/expander.proto``, our own; stubs generated at build time, ``extender.autoscaler.stubs``):
CA before 1.34.3 embeds each pod / template node as a message (``Option.pod = 4``, ``nodeMap = 2``), 1.34.3-1.34.x
sends those and their raw protobuf bytes (``podBytes = 5``, ``nodeBytesMap = 3``; the bytes are preferred), 1.35+
only the bytes.
``decode_request`` reads all three with our minimal core/v1 messages (``protos/k8s_core_v1_minimal.proto``:
only the fields we use, Kubernetes' field numbers) into the Kubernetes JSON shape, then ``extender.kube.convert``
like every other pod and node. The request is parsed by us, not by the gRPC runtime: an undecodable or empty
request, or one with neither pods nor template nodes in any field we know (an unknown CA message shape),
gets ``INVALID_ARGUMENT`` with the reason (CA then keeps all options); undecodable single entries are skipped
and named in the log and in the answer's ``debug``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError

from extender.autoscaler.metrics import AutoscalerMetrics
from extender.autoscaler.protos import expander_pb2 as pb2
from extender.autoscaler.protos import k8s_core_v1_minimal_pb2 as core
from extender.autoscaler.providers.grpc_guard import GrpcGuard
from extender.autoscaler.providers.provisioning_request import CONSUME_ANNOTATION
from extender.core import autoscale
from extender.core.model import Flavour, InvalidInputError, Node, Pod
from extender.kube.convert import node_from_k8s, pod_from_k8s
from extender.settings.extender import ExtenderConfig

__all__ = [
    "DecodedOption",
    "DecodedRequest",
    "ExpanderChoice",
    "ExpanderServer",
    "OptionView",
    "RequestError",
    "choose",
    "decode_request",
    "node_to_dict",
    "pod_to_dict",
]

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
    """A (minimal) core/v1 Pod message -> the Kubernetes JSON fields extender.kube.convert reads."""
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


# --------------------------------------------------------------------------------------- request shapes

SHAPE_MESSAGES = "cluster-autoscaler < 1.34.3 (pod=4, nodeMap=2)"
SHAPE_BOTH = "cluster-autoscaler 1.34.3-1.34.x (pod=4 + podBytes=5, nodeMap=2 + nodeBytesMap=3)"
SHAPE_BYTES = "cluster-autoscaler >= 1.35 (podBytes=5, nodeBytesMap=3)"


class RequestError(ValueError):
    """The request cannot be used at all; answered with INVALID_ARGUMENT and this message."""


@dataclass(frozen=True, slots=True)
class DecodedOption:
    node_group_id: str
    node_count: int
    pods: tuple[Any, ...]  # minimal core/v1 Pod messages


@dataclass(frozen=True, slots=True)
class DecodedRequest:
    shape: str
    options: tuple[DecodedOption, ...]
    templates: Mapping[str, Any]  # node group id -> minimal core/v1 Node message
    problems: tuple[str, ...]  # entries skipped or taken from the older field, for the log and the reply


def _decode_bytes(cls: Any, raw: bytes) -> Any | None:
    """pod.Marshal() / node.Marshal() bytes -> our minimal message; None if not a (named) object."""
    try:
        msg = cls.FromString(raw)
    except DecodeError:
        return None
    # an object CA sends always has a name; an empty or foreign payload can parse to a nameless message
    return msg if msg.metadata.name else None


def _option_pods(option: Any, cache: dict[bytes, Any | None]) -> tuple[list[Any], str | None]:
    """One option's pods: podBytes when they all decode, else its embedded pods when it has them."""
    named = [p for p in option.pod if p.metadata.name]
    if not option.podBytes:
        unnamed = len(option.pod) - len(named)
        return named, f"option {option.nodeGroupId}: {unnamed} of {len(option.pod)} pods unnamed" if unnamed else None
    pods = []
    for raw in option.podBytes:
        if raw not in cache:
            cache[raw] = _decode_bytes(core.Pod, raw)
        if cache[raw] is not None:
            pods.append(cache[raw])
    bad = len(option.podBytes) - len(pods)
    if not bad:
        return pods, None
    what = f"option {option.nodeGroupId}: {bad} of {len(option.podBytes)} podBytes do not decode as a Pod"
    return (named, f"{what}, used its pod field") if named else (pods, what)


def decode_request(request: Any) -> DecodedRequest:
    """Pods and template nodes of a parsed BestOptionsRequest, whichever of CA's three shapes it has.

    Bytes fields are preferred (CA 1.34.3+ fills both with the same objects); an entry whose bytes do not decode
    falls back to the embedded messages when the option has them. Raises ``RequestError`` when nothing usable is
    left: no options, no pods and no nodes in any known field, or none of the entries decodable.
    """
    options = list(request.options)
    if not options:
        raise RequestError("BestOptionsRequest has no options")
    has_old = bool(request.nodeMap) or any(len(o.pod) for o in options)
    has_new = bool(request.nodeBytesMap) or any(len(o.podBytes) for o in options)
    if not has_old and not has_new:
        raise RequestError(
            f"BestOptionsRequest has {len(options)} options but no pods and no template nodes in any field this "
            "expander knows (Option.pod=4 / podBytes=5, nodeMap=2 / nodeBytesMap=3): unknown cluster-autoscaler "
            "message shape"
        )
    shape = SHAPE_BOTH if has_old and has_new else SHAPE_BYTES if has_new else SHAPE_MESSAGES
    problems: list[str] = []
    templates: dict[str, Any] = {}
    for group_id in sorted(set(request.nodeBytesMap) | set(request.nodeMap)):
        node = None
        if group_id in request.nodeBytesMap:
            node = _decode_bytes(core.Node, request.nodeBytesMap[group_id])
            if node is None:
                problems.append(f"nodeBytesMap[{group_id}] does not decode as a Node")
        if node is None and group_id in request.nodeMap:
            node = request.nodeMap[group_id]
            if not node.metadata.name:
                problems.append(f"nodeMap[{group_id}] is an unnamed Node")
                node = None
            elif group_id in request.nodeBytesMap:
                problems.append(f"nodeMap[{group_id}] used instead")
        if node is not None:
            templates[group_id] = node
    decoded: list[DecodedOption] = []
    cache: dict[bytes, Any | None] = {}  # CA repeats the same pending pods in every option: decode each once
    for option in options:
        pods, problem = _option_pods(option, cache)
        if problem:
            problems.append(problem)
        decoded.append(DecodedOption(option.nodeGroupId, option.nodeCount, tuple(pods)))
    pod_entries = sum(max(len(o.podBytes), len(o.pod)) for o in options)
    usable_pods = sum(len(o.pods) for o in decoded)
    node_entries = len(set(request.nodeBytesMap) | set(request.nodeMap))
    if not templates and not usable_pods:
        raise RequestError(
            f"{shape}: none of the {pod_entries} pod and {node_entries} node entries decodes as a core/v1 Pod or "
            f"Node: {'; '.join(problems[:5])}"
        )
    return DecodedRequest(shape, tuple(decoded), templates, tuple(problems))


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
        credentials: grpc.ServerCredentials,
        max_message_bytes: int,
        metrics: AutoscalerMetrics | None = None,
    ) -> None:
        self.config = config
        self.catalogue = list(catalogue)
        self.weights = weights
        self.listen = listen
        self._creds = credentials  # server-side TLS: CA's grpcplugin presents no client certificate
        self.metrics = metrics
        self.guard = GrpcGuard(
            "expander",
            max_message_bytes=max_message_bytes,
            allowed=None,
            allowed_option="",
            metrics=metrics,
        )
        self._server: Any = None
        self.port = 0
        self.last_choice: ExpanderChoice | None = None

    def _views(self, decoded: DecodedRequest) -> list[OptionView]:
        cfg = self.config
        templates: dict[str, tuple[Node, float | None]] = {}
        for group_id, msg in decoded.templates.items():
            raw = node_to_dict(msg)
            try:
                node = node_from_k8s(raw, cfg.node_groups, cfg.scheduling.managed_resources)
            except InvalidInputError:
                continue
            templates[group_id] = (node, _price(raw["metadata"]["annotations"], raw["metadata"]["labels"]))
        views = []
        # CA repeats the same pending pods in every option: convert each pod once per request
        converted: dict[tuple[str, str, str], Pod | None] = {}
        for option in decoded.options:
            pods: list[Pod] = []
            for msg in option.pods:
                ident = (msg.metadata.namespace, msg.metadata.name, msg.metadata.uid)
                if ident not in converted:
                    try:
                        converted[ident], _ = pod_from_k8s(
                            pod_to_dict(msg), cfg.pod_defaults, cfg.policy.classes, cfg.scheduling.managed_resources
                        )
                    except InvalidInputError:
                        converted[ident] = None
                pod = converted[ident]
                if pod is not None:
                    pods.append(pod)
            template = templates.get(option.node_group_id)
            views.append(
                OptionView(
                    option.node_group_id,
                    option.node_count,
                    tuple(pods),
                    template[0] if template is not None else None,
                    template[1] if template is not None else None,
                )
            )
        return views

    def _answer(self, request: Any) -> tuple[ExpanderChoice, str, str]:
        """(choice, outcome, shape) for a parsed request; raises RequestError for an unusable one."""
        decoded = decode_request(request)
        choice = choose(self._views(decoded), self.catalogue, self.weights)
        self._count_nodes(decoded, choice)
        if decoded.problems:
            skipped = "; ".join(decoded.problems[:5]) + (" ..." if len(decoded.problems) > 5 else "")
            choice = ExpanderChoice(choice.chosen, choice.flavour, f"{choice.reason} (skipped: {skipped})")
        return choice, ("ok" if choice.flavour is not None else "kept_all"), decoded.shape

    async def BestOptions(self, raw: bytes, context: Any) -> Any:
        """The Expander.BestOptions method; ``raw`` is the serialized request (we parse it ourselves)."""
        started = time.perf_counter()
        try:
            request = pb2.BestOptionsRequest.FromString(raw)
        except DecodeError as exc:
            await self._invalid(context, started, f"cannot decode BestOptionsRequest ({len(raw)} bytes): {exc}")
        shape = "?"
        try:
            choice, outcome, shape = self._answer(request)
        except RequestError as exc:
            await self._invalid(context, started, str(exc))
        except Exception as exc:  # never fail CA's loop: keeping all options is CA's own fallback
            outcome = "error"
            self.guard.refused("BestOptions", "error")  # CA gets an answer, but not ours
            log.exception("BestOptions failed; keeping all options")
            choice = ExpanderChoice(tuple(o.nodeGroupId for o in request.options), None, f"error: {exc!r}")
        self.last_choice = choice
        chosen = set(choice.chosen)
        response = pb2.BestOptionsResponse()
        for option in request.options:
            if option.nodeGroupId in chosen:
                kept = response.options.add()
                kept.nodeGroupId = option.nodeGroupId
                kept.nodeCount = option.nodeCount
                kept.debug = f"{option.debug} | qos-extender: {choice.reason}"[:1024]
        self._observe(outcome, started, choice.flavour)
        decision = {"options": len(request.options), "shape": shape, "chosen": list(choice.chosen)}
        if outcome == "ok":
            log.info("BestOptions", extra={"decision": {**decision, "why": choice.reason}})
        else:  # CA gets all its options back: say why, it means we did not price anything
            log.warning("BestOptions kept all options: %s", choice.reason, extra={"decision": decision})
        return response

    async def _invalid(self, context: Any, started: float, message: str) -> NoReturn:
        self._observe("invalid", started, None)
        log.warning("BestOptions: invalid request, answering INVALID_ARGUMENT: %s", message)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
        raise AssertionError("unreachable: context.abort raises")

    def _count_nodes(self, decoded: DecodedRequest, choice: ExpanderChoice) -> None:
        """Nodes CA buys on our answer, by whose demand: our ProvisioningRequests' pods (they carry CA's consume
        annotation) or ordinary pending pods. What CA bought against what we chose, in the e2e test and in use."""
        if self.metrics is None or choice.flavour is None or len(choice.chosen) != 1:
            return
        for option in decoded.options:
            if option.node_group_id == choice.chosen[0]:
                ours = bool(option.pods) and all(
                    CONSUME_ANNOTATION in dict(msg.metadata.annotations) for msg in option.pods
                )
                demand = "provisioning-request" if ours else "pods"
                self.metrics.expander_nodes.labels(choice.flavour, demand).inc(option.node_count)
                return

    def _observe(self, outcome: str, started: float, flavour: str | None) -> None:
        if self.metrics is None:
            return
        self.metrics.expander_requests.labels(outcome).inc()
        self.metrics.expander_duration.observe(time.perf_counter() - started)
        if flavour is not None:
            self.metrics.expander_choice.labels(flavour).inc()

    async def start(self) -> int:
        server = grpc.aio.server(options=self.guard.server_options())
        service = pb2.DESCRIPTOR.services_by_name["Expander"].full_name  # grpcplugin.Expander
        # raw bytes in: decode errors become INVALID_ARGUMENT with the reason; size and refusals counted (grpc_guard)
        method = self.guard.handler("BestOptions", self.BestOptions)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {"BestOptions": method}),))
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
