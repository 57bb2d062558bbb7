"""A gRPC client of the sidecar's externalgrpc CloudProvider service, for unit tests of our server's answers
(status codes, bad input, mTLS): the RPCs and request fields of cluster-autoscaler 1.35's client, dialled as CA
dials (cloud-config ``address``, ``cert``/``key``, ``cacert``, the address' host as TLS server name).

A test helper, not a stand-in for CA: every test of the CA integration runs the real cluster-autoscaler
(e2e/test_cluster_autoscaler.py, binaries from hack/build-ca.sh).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml

from extender.autoscaler.stubs import ExpanderStubs, ExternalGrpcStubs, load_externalgrpc

__all__ = ["CloudConfig", "CloudProviderClient", "NotImplementedByProvider", "external_node", "pod_message"]

DEFAULT_TIMEOUT = 5.0  # CA: defaultGRPCTimeout


class NotImplementedByProvider(Exception):
    """CA's cloudprovider.ErrNotImplemented: the provider answered UNIMPLEMENTED to an optional method."""


@dataclass(frozen=True, slots=True)
class CloudConfig:
    """CA's externalgrpc cloud-config file (sigs.k8s.io/yaml: the json tags address/key/cert/cacert/grpc_timeout)."""

    address: str
    cert: str = ""
    key: str = ""
    cacert: str = ""
    grpc_timeout: float = DEFAULT_TIMEOUT

    @classmethod
    def load(cls, path: str | Path) -> CloudConfig:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        timeout = raw.get("grpc_timeout")
        return cls(
            str(raw["address"]),
            str(raw.get("cert", "")),
            str(raw.get("key", "")),
            str(raw.get("cacert", "")),
            _duration(timeout) if timeout else DEFAULT_TIMEOUT,
        )


def _duration(text: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for suffix in ("ms", "s", "m", "h"):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * units[suffix]
    raise ValueError(f"not a duration: {text!r}")


def _quantities(target: Any, values: Mapping[str, Any]) -> None:
    for k, v in values.items():
        target[k].string = str(v)


def pod_message(stubs: ExternalGrpcStubs | ExpanderStubs, pod: Mapping[str, Any]) -> Any:
    """A Pod (Kubernetes JSON) -> our minimal core/v1 Pod: serialized, the fields of ``pod.Marshal()`` we declare."""
    p = stubs.core.Pod()
    meta, spec = pod.get("metadata", {}), pod.get("spec", {})
    p.metadata.name = meta["name"]
    p.metadata.namespace = meta.get("namespace", "default")
    if meta.get("uid"):
        p.metadata.uid = meta["uid"]
    p.metadata.labels.update(meta.get("labels", {}))
    p.metadata.annotations.update(meta.get("annotations", {}))
    for ref in meta.get("ownerReferences", []):
        r = p.metadata.ownerReferences.add()
        r.kind, r.name = ref["kind"], ref["name"]
        if ref.get("controller"):
            r.controller = True
    for key, field_name in (("containers", "containers"), ("initContainers", "initContainers")):
        for c in spec.get(key, []):
            msg = getattr(p.spec, field_name).add()
            msg.name = c.get("name", "")
            _quantities(msg.resources.requests, c.get("resources", {}).get("requests", {}))
            _quantities(msg.resources.limits, c.get("resources", {}).get("limits", {}))
            if c.get("restartPolicy"):
                msg.restartPolicy = c["restartPolicy"]
    p.spec.schedulerName = spec.get("schedulerName", "default-scheduler")
    if spec.get("nodeName"):
        p.spec.nodeName = spec["nodeName"]
    if spec.get("priority") is not None:
        p.spec.priority = int(spec["priority"])
    p.status.phase = pod.get("status", {}).get("phase", "Pending")
    return p


def external_node(stubs: ExternalGrpcStubs, node: Mapping[str, Any]) -> Any:
    """CA's externalGrpcNode(): providerID, name, labels, annotations of a v1.Node (Kubernetes JSON)."""
    meta = node.get("metadata", {})
    n = stubs.pb2.ExternalGrpcNode(providerID=node.get("spec", {}).get("providerID", ""), name=meta.get("name", ""))
    n.labels.update(meta.get("labels", {}))
    n.annotations.update(meta.get("annotations", {}))
    return n


def _timestamp(msg: Any, seconds: float) -> None:
    msg.seconds = int(seconds)
    msg.nanos = round((seconds - int(seconds)) * 1e9)


@dataclass(frozen=True, slots=True)
class NodeGroupInfo:
    id: str
    min_size: int
    max_size: int
    debug: str


class CloudProviderClient:
    """CA's externalgrpc cloud provider client: its RPCs, requests, deadline, caches and error mapping."""

    def __init__(self, channel: grpc.aio.Channel, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.stubs = load_externalgrpc()
        self.stub = self.stubs.grpc.CloudProviderStub(channel)
        self.timeout = timeout
        self.calls: list[str] = []
        self._groups: list[NodeGroupInfo] | None = None
        self._for_node: dict[str, NodeGroupInfo] = {}
        self._templates: dict[str, Any] = {}
        self._gpu_label: str | None = None
        self._gpu_types: set[str] | None = None

    @classmethod
    def dial(cls, config: CloudConfig) -> tuple[CloudProviderClient, grpc.aio.Channel]:
        """grpc.Dial(address, TLS{ServerName: host of address, Certificates: [cert/key], RootCAs: cacert})."""
        host = config.address.rsplit(":", 1)[0].strip("[]")
        creds = grpc.ssl_channel_credentials(
            root_certificates=Path(config.cacert).read_bytes(),
            private_key=Path(config.key).read_bytes(),
            certificate_chain=Path(config.cert).read_bytes(),
        )
        channel = grpc.aio.secure_channel(config.address, creds, options=[("grpc.ssl_target_name_override", host)])
        return cls(channel, config.grpc_timeout), channel

    async def _call(self, method: str, request: Any) -> Any:
        self.calls.append(method)
        return await getattr(self.stub, method)(request, timeout=self.timeout)

    async def _optional(self, method: str, request: Any) -> Any:
        try:
            return await self._call(method, request)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise NotImplementedByProvider(method) from exc
            raise

    # ------------------------------------------------------------------------------ CloudProvider methods

    async def refresh(self) -> None:
        self._for_node.clear()
        self._groups = None
        self._templates.clear()  # CA's NodeGroup objects (and their template caches) are rebuilt after Refresh
        await self._call("Refresh", self.stubs.pb2.RefreshRequest())

    async def node_groups(self) -> list[NodeGroupInfo]:
        if self._groups is None:
            res = await self._call("NodeGroups", self.stubs.pb2.NodeGroupsRequest())
            self._groups = [NodeGroupInfo(g.id, g.minSize, g.maxSize, g.debug) for g in res.nodeGroups]
        return self._groups

    async def node_group_for_node(self, node: Mapping[str, Any]) -> NodeGroupInfo | None:
        msg = external_node(self.stubs, node)
        key = msg.name + msg.providerID
        if key in self._for_node:
            return self._for_node[key]
        res = await self._call("NodeGroupForNode", self.stubs.pb2.NodeGroupForNodeRequest(node=msg))
        g = res.nodeGroup
        if not g.id:  # not processed by CA; not cached
            return None
        info = NodeGroupInfo(g.id, g.minSize, g.maxSize, g.debug)
        self._for_node[key] = info
        return info

    async def node_price(self, node: Any, start: float, end: float) -> float:
        req = self.stubs.pb2.PricingNodePriceRequest()
        req.node.CopyFrom(node)
        _timestamp(req.startTimestamp, start)
        _timestamp(req.endTimestamp, end)
        return float((await self._optional("PricingNodePrice", req)).price)

    async def pod_price(self, pod_bytes: bytes, start: float, end: float) -> float:
        req = self.stubs.pb2.PricingPodPriceRequest(pod_bytes=pod_bytes)
        _timestamp(req.startTimestamp, start)
        _timestamp(req.endTimestamp, end)
        return float((await self._optional("PricingPodPrice", req)).price)

    async def gpu_label(self) -> str:
        if self._gpu_label is None:
            self._gpu_label = (await self._call("GPULabel", self.stubs.pb2.GPULabelRequest())).label
        return self._gpu_label

    async def gpu_types(self) -> set[str]:
        if self._gpu_types is None:
            res = await self._call("GetAvailableGPUTypes", self.stubs.pb2.GetAvailableGPUTypesRequest())
            self._gpu_types = set(res.gpuTypes)
        return self._gpu_types

    async def cleanup(self) -> None:
        await self._call("Cleanup", self.stubs.pb2.CleanupRequest())

    # --------------------------------------------------------------------------------- NodeGroup methods

    async def target_size(self, group_id: str) -> int:
        res = await self._call("NodeGroupTargetSize", self.stubs.pb2.NodeGroupTargetSizeRequest(id=group_id))
        return int(res.targetSize)

    async def increase_size(self, group_id: str, delta: int) -> None:
        req = self.stubs.pb2.NodeGroupIncreaseSizeRequest(id=group_id, delta=delta)
        await self._call("NodeGroupIncreaseSize", req)

    async def delete_nodes(self, group_id: str, nodes: Sequence[Mapping[str, Any]]) -> None:
        req = self.stubs.pb2.NodeGroupDeleteNodesRequest(id=group_id)
        req.nodes.extend(external_node(self.stubs, n) for n in nodes)
        await self._call("NodeGroupDeleteNodes", req)

    async def decrease_target_size(self, group_id: str, delta: int) -> None:
        req = self.stubs.pb2.NodeGroupDecreaseTargetSizeRequest(id=group_id, delta=delta)
        await self._call("NodeGroupDecreaseTargetSize", req)

    async def nodes(self, group_id: str) -> list[tuple[str, int]]:
        res = await self._call("NodeGroupNodes", self.stubs.pb2.NodeGroupNodesRequest(id=group_id))
        return [(i.id, i.status.instanceState) for i in res.instances]

    async def template_node(self, group_id: str) -> Any:
        """The template v1.Node (decoded from nodeBytes as CA's Node.Unmarshal would); None if the group has none."""
        if group_id not in self._templates:
            req = self.stubs.pb2.NodeGroupTemplateNodeInfoRequest(id=group_id)
            res = await self._optional("NodeGroupTemplateNodeInfo", req)
            if res.nodeBytes:
                node = self.stubs.core.Node.FromString(res.nodeBytes)
            else:
                node = res.nodeInfo if res.HasField("nodeInfo") else None
            self._templates[group_id] = node
        return self._templates[group_id]

    async def get_options(self, group_id: str, defaults: Mapping[str, float]) -> Any:
        """CA 1.35 sends its defaults in the google.protobuf.Duration fields; None = use the defaults."""
        req = self.stubs.pb2.NodeGroupAutoscalingOptionsRequest(id=group_id)
        d = req.defaults
        d.scaleDownUtilizationThreshold = defaults.get("scale_down_utilization_threshold", 0.5)
        d.scaleDownGpuUtilizationThreshold = defaults.get("scale_down_gpu_utilization_threshold", 0.5)
        d.scaleDownUnneededDuration.FromSeconds(int(defaults.get("scale_down_unneeded_seconds", 600)))
        d.scaleDownUnreadyDuration.FromSeconds(int(defaults.get("scale_down_unready_seconds", 1200)))
        d.MaxNodeProvisionDuration.FromSeconds(int(defaults.get("max_node_provision_seconds", 900)))
        try:
            res = await self._optional("NodeGroupGetOptions", req)
        except NotImplementedByProvider:
            return None
        return res.nodeGroupAutoscalingOptions if res.HasField("nodeGroupAutoscalingOptions") else None


# ------------------------------------------------------------------------------------------ the main loop
