"""cluster-autoscaler's externalgrpc cloud provider, served by the autoscaler sidecar: our flavours as its node groups.

With ``--cloud-provider=externalgrpc`` cluster-autoscaler (CA) asks this server which node groups exist
(``NodeGroups``: one per workload group x flavour of the catalogue, nodegroups.py), what a new node of each looks like
(``NodeGroupTemplateNodeInfo``: the Node the backend would create, as ``node.Marshal()`` bytes), what nodes cost
(``PricingNodePrice`` / ``PricingPodPrice`` from the flavour prices, so CA's own ``price`` expander ranks by the same
money as ours), and it grows and shrinks them (``NodeGroupIncreaseSize`` / ``NodeGroupDeleteNodes`` /
``NodeGroupDecreaseTargetSize``) through the sidecar's providers: here the kwok provider, the local STAND-IN FOR A
CLOUD API (providers/kwok.py). mTLS only: CA presents its client certificate (cloud-config ``cert``/``key``) and
verifies ours against its ``cacert``; a client without a certificate signed by ``client_ca_file`` is refused in the
TLS handshake, and one whose certificate names none of ``clients`` (CN or SAN) gets PERMISSION_DENIED on every
method (grpc_guard.py: also the receive limit and the count of refused calls).

Requests are parsed here (raw bytes in, not by the gRPC runtime), so an undecodable message is INVALID_ARGUMENT with
the reason; a refused call answers the status ``nodegroups.NodeGroupError`` names; anything unexpected is logged and
answered INTERNAL: the server never crashes on CA's input. Optional methods: ``NodeGroupGetOptions`` answers
UNIMPLEMENTED unless ``node_group_options`` is on (CA then keeps its own flags; see the README for why that is the
default on CA 1.35), ``PricingNodePrice`` for a node we cannot price answers NOT_FOUND (CA's price expander skips
that option).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError

from extender.autoscaler.loop import ProvisionRequest
from extender.autoscaler.metrics import AutoscalerMetrics
from extender.autoscaler.nodegroups import CREATING, DELETING, RUNNING, NodeGroupError, NodeGroups, hours_between
from extender.autoscaler.protos import externalgrpc_pb2 as pb2
from extender.autoscaler.protos import k8s_core_v1_minimal_pb2 as core
from extender.autoscaler.providers.base import Provider
from extender.autoscaler.providers.cluster_autoscaler import pod_to_dict
from extender.autoscaler.providers.grpc_guard import GrpcGuard
from extender.core.model import InvalidInputError
from extender.kube.convert import pod_from_k8s
from extender.kube.snapshot import Snapshot
from extender.settings.extender import ExtenderConfig

__all__ = ["CloudProviderServer", "NodeGroupOptions", "node_message"]

log = logging.getLogger("extender.autoscaler.externalgrpc")

_STATES = {
    RUNNING: pb2.InstanceStatus.instanceRunning,
    CREATING: pb2.InstanceStatus.instanceCreating,
    DELETING: pb2.InstanceStatus.instanceDeleting,
}


@dataclass(frozen=True, slots=True)
class NodeGroupOptions:
    """What NodeGroupGetOptions answers when enabled: CA's defaults with our idle period and provisioning timeout."""

    scale_down_unneeded_seconds: float
    max_node_provision_seconds: float


def _quantities(target: Any, values: Mapping[str, Any]) -> None:
    for k, v in values.items():
        target[k].string = str(v)


def node_message(manifest: Mapping[str, Any]) -> Any:
    """A Kubernetes Node (JSON shape, as the backend creates it) -> our minimal core/v1 Node message: metadata name,
    labels, annotations; spec providerID, unschedulable, taints; status capacity, allocatable, phase, conditions,
    nodeInfo. Serialized, it is what ``node.Marshal()`` of k8s.io/api gives for those fields."""
    n = core.Node()
    meta, spec, status = manifest.get("metadata", {}), manifest.get("spec", {}), manifest.get("status", {})
    n.metadata.name = meta["name"]
    n.metadata.labels.update(meta.get("labels", {}))
    n.metadata.annotations.update(meta.get("annotations", {}))
    if spec.get("providerID"):
        n.spec.providerID = spec["providerID"]
    if spec.get("unschedulable"):
        n.spec.unschedulable = True
    for t in spec.get("taints", []):
        taint = n.spec.taints.add()
        taint.key = t["key"]
        if t.get("value"):
            taint.value = t["value"]
        taint.effect = t["effect"]
    _quantities(n.status.capacity, status.get("capacity", {}))
    _quantities(n.status.allocatable, status.get("allocatable", {}))
    if status.get("phase"):
        n.status.phase = status["phase"]
    for c in status.get("conditions", []):
        cond = n.status.conditions.add()
        cond.type = c["type"]
        cond.status = c["status"]
        for key in ("reason", "message"):
            if c.get(key):
                setattr(cond, key, c[key])
    info = status.get("nodeInfo", {})
    for key in ("containerRuntimeVersion", "kubeletVersion", "kubeProxyVersion", "operatingSystem", "architecture"):
        if info.get(key):
            setattr(n.status.nodeInfo, key, info[key])
    return n


def _seconds(ts: Any) -> float:
    return float(ts.seconds) + float(ts.nanos) / 1e9


class CloudProviderServer:
    """grpc.aio server for ``clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider``; mTLS only."""

    def __init__(
        self,
        config: ExtenderConfig,
        state: NodeGroups,
        snapshot: Snapshot,
        backend: Provider,
        template: Callable[[ProvisionRequest], dict[str, Any]],
        *,
        listen: str,
        credentials: grpc.ServerCredentials,
        clients: tuple[str, ...],
        max_message_bytes: int,
        gpu_label: str,
        options: NodeGroupOptions | None = None,
        metrics: AutoscalerMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.state = state
        self.snapshot = snapshot
        self.backend = backend
        self.template = template
        self.listen = listen
        self._creds = credentials  # mTLS: require_client_auth (ReloadingServerCredentials(client_auth=True))
        self.guard = GrpcGuard(
            "cloudprovider",
            max_message_bytes=max_message_bytes,
            allowed=clients,
            allowed_option="autoscaler.cluster_autoscaler.cloud_provider.clients",
            metrics=metrics,
        )
        self.gpu_label = gpu_label
        self.options = options
        self.metrics = metrics
        self.clock = clock
        self._templates: dict[str, tuple[bytes, Any]] = {}
        self._server: Any = None
        self.port = 0
        self.calls: list[str] = []  # method names in arrival order (tests, debugging); bounded

    # ---------------------------------------------------------------------------------------------- state

    def members(self) -> dict[str, Mapping[str, str]]:
        return {name: entry.node.labels for name, entry in self.snapshot.nodes.items()}

    async def refresh(self, now: float | None = None) -> dict[str, Mapping[str, str]]:
        """Sync the ledger with the registered nodes; cancel at the backend what expired. Returns the members.

        Until the node list is synced every size is unknown: UNAVAILABLE (CA retries next loop), never a guess."""
        if not self.snapshot.nodes_synced:
            raise NodeGroupError("UNAVAILABLE", "the sidecar has not listed the cluster's nodes yet")
        members = self.members()
        synced = self.state.sync(members, self.clock() if now is None else now)
        for entry, gid in synced.expired:
            log.warning(
                "requested node did not register within the provisioning timeout; cancelled",
                extra={"decision": {"node": entry.node_name, "node_group": gid}},
            )
            self._count(gid, "expired")
            await self.backend.cancel(entry.node_name)
        for name, lag in synced.arrived:
            log.info("node registered", extra={"decision": {"node": name, "lag_seconds": round(lag, 3)}})
        return members

    def _count(self, node_group: str, action: str, n: int = 1) -> None:
        if self.metrics is not None and n:
            self.metrics.cloudprovider_nodes.labels(node_group, action).inc(n)

    # -------------------------------------------------------------------------------------------- methods

    async def NodeGroups(self, req: Any) -> Any:
        out = pb2.NodeGroupsResponse()
        for spec in self.state.specs.values():
            ng = out.nodeGroups.add()
            ng.id, ng.minSize, ng.maxSize, ng.debug = spec.id, spec.min_size, spec.max_size, spec.debug
        return out

    async def NodeGroupForNode(self, req: Any) -> Any:
        if not req.HasField("node"):
            raise NodeGroupError("INVALID_ARGUMENT", "NodeGroupForNodeRequest.node is missing")
        node = req.node
        spec = self.state.group_of_node(node.name, node.providerID, node.labels)
        out = pb2.NodeGroupForNodeResponse()
        out.nodeGroup.SetInParent()  # id "": not a node of ours, CA leaves it alone
        if spec is not None:
            g = out.nodeGroup
            g.id, g.minSize, g.maxSize, g.debug = spec.id, spec.min_size, spec.max_size, spec.debug
        return out

    def _period(self, req: Any, new: tuple[str, str], old: tuple[str, str]) -> float:
        for start_field, end_field in (new, old):
            if req.HasField(start_field) and req.HasField(end_field):
                return hours_between(_seconds(getattr(req, start_field)), _seconds(getattr(req, end_field)))
        raise NodeGroupError("INVALID_ARGUMENT", "the pricing period (startTimestamp / endTimestamp) is missing")

    async def PricingNodePrice(self, req: Any) -> Any:
        if not req.HasField("node"):
            raise NodeGroupError("INVALID_ARGUMENT", "PricingNodePriceRequest.node is missing")
        hours = self._period(req, ("startTimestamp", "endTimestamp"), ("startTime", "endTime"))
        per_hour = self.state.node_price_per_hour(req.node.labels, req.node.annotations)
        return pb2.PricingNodePriceResponse(price=per_hour * hours)

    def _pod(self, req: Any) -> Any:
        if req.pod_bytes:
            try:
                pod = core.Pod.FromString(req.pod_bytes)
            except DecodeError as exc:
                raise NodeGroupError("INVALID_ARGUMENT", f"pod_bytes is not a core/v1 Pod: {exc}") from exc
        elif req.HasField("pod"):
            pod = req.pod
        else:
            raise NodeGroupError("INVALID_ARGUMENT", "PricingPodPriceRequest has no pod (pod_bytes = 4 or pod = 1)")
        if not pod.metadata.name:
            raise NodeGroupError("INVALID_ARGUMENT", "the pod has no metadata.name: not a Pod")
        return pod

    async def PricingPodPrice(self, req: Any) -> Any:
        hours = self._period(req, ("startTimestamp", "endTimestamp"), ("startTime", "endTime"))
        msg = self._pod(req)
        cfg = self.config
        try:
            pod, _ = pod_from_k8s(
                pod_to_dict(msg), cfg.pod_defaults, cfg.policy.classes, cfg.scheduling.managed_resources
            )
        except InvalidInputError as exc:
            raise NodeGroupError("INVALID_ARGUMENT", f"pod {msg.metadata.name}: {exc}") from exc
        price = self.state.pod_price_per_hour(pod.requests) * hours
        return pb2.PricingPodPriceResponse(price=price)

    async def GPULabel(self, req: Any) -> Any:
        return pb2.GPULabelResponse(label=self.gpu_label)

    async def GetAvailableGPUTypes(self, req: Any) -> Any:
        return pb2.GetAvailableGPUTypesResponse()  # no flavour of ours has a GPU

    async def Cleanup(self, req: Any) -> Any:
        return pb2.CleanupResponse()  # CA is going away; the sidecar keeps serving

    async def Refresh(self, req: Any) -> Any:
        await self.refresh()
        return pb2.RefreshResponse()

    async def NodeGroupTargetSize(self, req: Any) -> Any:
        members = await self.refresh()
        return pb2.NodeGroupTargetSizeResponse(targetSize=self.state.target_size(req.id, members))

    async def NodeGroupIncreaseSize(self, req: Any) -> Any:
        members = await self.refresh()
        requests = self.state.increase(req.id, req.delta, members, self.clock())
        created: list[str] = []
        try:
            for request in requests:
                await self.backend.create(request)
                created.append(request.name)
        except Exception as exc:
            self.state.withdraw(r.name for r in requests if r.name not in created)  # never asked of the backend
            self._count(req.id, "requested", len(created))
            raise NodeGroupError("UNAVAILABLE", f"backend {self.backend.name} failed: {exc!r}") from exc
        self._count(req.id, "requested", len(created))
        log.info(
            "cluster-autoscaler scale-up",
            extra={"decision": {"node_group": req.id, "delta": req.delta, "nodes": created}},
        )
        return pb2.NodeGroupIncreaseSizeResponse()

    async def NodeGroupDeleteNodes(self, req: Any) -> Any:
        members = await self.refresh()
        nodes = [(n.name, n.providerID, dict(n.labels)) for n in req.nodes]
        registered, pending = self.state.delete(req.id, nodes, members)
        for name in registered:
            await self.backend.delete(name)
        for name in pending:
            await self.backend.cancel(name)
        self._count(req.id, "deleted", len(registered))
        self._count(req.id, "cancelled", len(pending))
        log.info(
            "cluster-autoscaler scale-down",
            extra={"decision": {"node_group": req.id, "deleted": registered, "cancelled": pending}},
        )
        return pb2.NodeGroupDeleteNodesResponse()

    async def NodeGroupDecreaseTargetSize(self, req: Any) -> Any:
        await self.refresh()
        withdrawn = self.state.decrease_target(req.id, req.delta)
        for name in withdrawn:
            await self.backend.cancel(name)
        self._count(req.id, "cancelled", len(withdrawn))
        decision = {"node_group": req.id, "nodes": withdrawn}
        log.info("cluster-autoscaler decreased a target size", extra={"decision": decision})
        return pb2.NodeGroupDecreaseTargetSizeResponse()

    async def NodeGroupNodes(self, req: Any) -> Any:
        members = await self.refresh()
        out = pb2.NodeGroupNodesResponse()
        for view in self.state.instances(req.id, members):
            inst = out.instances.add()
            inst.id = view.id
            inst.status.instanceState = _STATES[view.state]
            inst.status.errorInfo.SetInParent()  # errorCode "": no error
        return out

    async def NodeGroupTemplateNodeInfo(self, req: Any) -> Any:
        spec = self.state.spec(req.id)
        if spec.id not in self._templates:
            manifest = self.template(self.state.template_request(spec.id))
            manifest.setdefault("spec", {}).pop("providerID", None)  # a template is no instance
            status = manifest.setdefault("status", {})
            status["conditions"] = [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "template node"}
            ]
            msg = node_message(manifest)
            self._templates[spec.id] = (msg.SerializeToString(deterministic=True), msg)
        raw, msg = self._templates[spec.id]
        out = pb2.NodeGroupTemplateNodeInfoResponse(nodeBytes=raw)
        out.nodeInfo.CopyFrom(msg)  # the field CA < 1.34.3 reads; 1.35 skips it as unknown
        return out

    async def NodeGroupGetOptions(self, req: Any) -> Any:
        self.state.spec(req.id)
        if self.options is None:
            raise NodeGroupError(
                "UNIMPLEMENTED",
                "node group options are cluster-autoscaler's own flags here "
                "(autoscaler.cluster_autoscaler.cloud_provider.node_group_options: false)",
            )
        if not req.HasField("defaults"):
            raise NodeGroupError("INVALID_ARGUMENT", "NodeGroupAutoscalingOptionsRequest.defaults is missing")
        out = pb2.NodeGroupAutoscalingOptionsResponse()
        opts = out.nodeGroupAutoscalingOptions
        opts.CopyFrom(req.defaults)  # everything CA sent, old and new fields, comes back unchanged ...
        for seconds, new, old in (  # ... except what the sidecar decides: idle period and provisioning timeout
            (self.options.scale_down_unneeded_seconds, "scaleDownUnneededDuration", "scaleDownUnneededTime"),
            (self.options.max_node_provision_seconds, "MaxNodeProvisionDuration", "MaxNodeProvisionTime"),
        ):
            getattr(opts, new).FromNanoseconds(int(seconds * 1e9))
            getattr(opts, old).duration = int(seconds * 1e9)
        if not req.defaults.HasField("scaleDownUnreadyDuration") and req.defaults.HasField("scaleDownUnreadyTime"):
            opts.scaleDownUnreadyDuration.FromNanoseconds(req.defaults.scaleDownUnreadyTime.duration)
        elif req.defaults.HasField("scaleDownUnreadyDuration") and not req.defaults.HasField("scaleDownUnreadyTime"):
            opts.scaleDownUnreadyTime.duration = req.defaults.scaleDownUnreadyDuration.ToNanoseconds()
        return out

    # ------------------------------------------------------------------------------------------- plumbing

    def _handler(self, name: str, request_cls: Any) -> Callable[[bytes, Any], Awaitable[Any]]:
        method: Callable[[Any], Awaitable[Any]] = getattr(self, name)

        async def handle(raw: bytes, context: Any) -> Any:
            started = time.perf_counter()
            self.calls.append(name)
            del self.calls[:-10_000]
            code = "OK"
            try:
                try:
                    req = request_cls.FromString(raw)
                except DecodeError as exc:
                    raise NodeGroupError("INVALID_ARGUMENT", f"cannot decode {request_cls.__name__}: {exc}") from exc
                return await method(req)
            except NodeGroupError as exc:
                code = exc.code
                if code != "UNIMPLEMENTED":
                    log.warning("%s refused: %s %s", name, code, exc.message)
                await self._abort(context, code, exc.message)
            except Exception as exc:  # never crash on CA's input: log it and answer INTERNAL
                code = "INTERNAL"
                log.exception("%s failed", name)
                await self._abort(context, code, f"{name} failed: {exc!r}")
            finally:
                if self.metrics is not None:
                    self.metrics.cloudprovider_requests.labels(name, code).inc()
                    self.metrics.cloudprovider_duration.labels(name).observe(time.perf_counter() - started)

        return handle

    async def _abort(self, context: Any, code: str, message: str) -> NoReturn:
        await context.abort(getattr(grpc.StatusCode, code), message)
        raise AssertionError("unreachable: context.abort raises")

    async def start(self) -> int:
        server = grpc.aio.server(options=self.guard.server_options())
        service = pb2.DESCRIPTOR.services_by_name["CloudProvider"]
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        for m in service.methods:
            request_cls = getattr(pb2, m.input_type.name)
            # raw bytes in (decode errors -> INVALID_ARGUMENT with the reason), identity and size checked first
            handlers[m.name] = self.guard.handler(m.name, self._handler(m.name, request_cls))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
        self.port = server.add_secure_port(self.listen, self._creds)
        if self.port == 0:
            raise OSError(f"cannot listen on {self.listen}")
        await server.start()
        self._server = server
        log.info(
            "externalgrpc cloud provider listening",
            extra={"decision": {"listen": self.listen, "port": self.port, "node_groups": list(self.state.specs)}},
        )
        return int(self.port)

    async def stop(self, grace: float = 1.0) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        await self.backend.close()
