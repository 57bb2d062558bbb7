"""cluster-autoscaler's side of the externalgrpc cloud provider and the gRPC expander, replayed in Python.

cluster-autoscaler (CA) cannot be built here (README), so what it would do to the sidecar is reproduced from its
1.35 source: ``CloudProviderClient`` is CA's client (cloudprovider/externalgrpc/externalgrpc_cloud_provider.go,
externalgrpc_node_group.go: the same RPCs and request fields, the 5 s default deadline, the caches CA keeps --
NodeGroups and NodeGroupForNode until the next Refresh, a node group's template for the life of its NodeGroup
object, GPULabel and GPU types forever -- and the mapping of UNIMPLEMENTED to "not implemented" for the optional
methods), dialled like CA dials (cloud-config ``address``, ``cert``/``key`` as client certificate, ``cacert`` as
the only trust root, the address' host as the TLS server name). ``ReplayedAutoscaler`` makes the calls of CA's
main loop in its order (core/static_autoscaler.go RunOnce):

    scale-up loop    Refresh -> NodeGroups -> NodeGroupForNode(each ready node) -> TemplateNodeInfo(each node group
                     without a ready node) -> TargetSize + NodeGroupNodes(each node group) -> [pending pods]
                     NodeGroupGetOptions(each group) -> options (binpacking on the templates) -> expander:
                     price (PricingPodPrice of the stabilisation pod, PricingNodePrice + PricingPodPrice per option,
                     GPULabel) and/or grpc (Expander.BestOptions, CA 1.35 shape) -> NodeGroupIncreaseSize
    scale-down       NodeGroupForNode(node) -> NodeGroupGetOptions -> TargetSize (>= min) -> NodeGroupDeleteNodes
    shutdown         Cleanup

Also a probe: ``python -m extender.autoscaler.ca_replay --cloud-config FILE`` prints what CA would see (node
groups, target sizes, instances, template capacity) through the same mTLS channel -- a quick check of a deployed
sidecar and its certificates before CA is pointed at it.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from extender.autoscaler.protogen import ExpanderStubs, ExternalGrpcStubs, load_expander, load_externalgrpc
from extender.core.model import Resources, cpu_millicores, memory_bytes

__all__ = [
    "CloudConfig",
    "CloudProviderClient",
    "NotImplementedByProvider",
    "Option",
    "ReplayedAutoscaler",
    "external_node",
    "pod_message",
    "price_expander_choice",
]

DEFAULT_TIMEOUT = 5.0  # CA: defaultGRPCTimeout
STABILIZATION_POD = ("stabilize", "500m", str(500 * 2**20))  # CA price expander: priceStabilizationPod


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


@dataclass(frozen=True, slots=True)
class Option:
    """An expansion option: node group, node count (binpacking estimate), the pods it helps, its template."""

    node_group: str
    node_count: int
    pods: tuple[Mapping[str, Any], ...]
    template: Any


def _pod_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    cpu = mem = 0
    for c in pod.get("spec", {}).get("containers", []):
        req = c.get("resources", {}).get("requests", {})
        cpu += cpu_millicores(req["cpu"]) if "cpu" in req else 0
        mem += memory_bytes(req["memory"]) if "memory" in req else 0
    return cpu, mem


def _template_room(template: Any) -> Resources:
    alloc = template.status.allocatable
    return Resources(
        cpu_millicores(alloc["cpu"].string) if "cpu" in alloc else 0,
        memory_bytes(alloc["memory"].string) if "memory" in alloc else 0,
        int(alloc["pods"].string) if "pods" in alloc else 110,
    )


def _selector_ok(pod: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    selector = pod.get("spec", {}).get("nodeSelector", {})
    return all(labels.get(k) == v for k, v in selector.items())


def _share(pod: Mapping[str, Any], room: Resources) -> float:
    cpu, mem = _pod_requests(pod)
    return max(cpu / max(room.cpu_milli, 1), mem / max(room.memory_bytes, 1))


def estimate(
    pods: Sequence[Mapping[str, Any]], template: Any, upcoming: int = 0
) -> tuple[int, tuple[Mapping[str, Any], ...], tuple[Mapping[str, Any], ...]]:
    """CA's binpacking estimator, simplified to first-fit decreasing on cpu/memory/pods of the template, for the
    pods whose nodeSelector the template's labels satisfy (the scheduler predicates these pods use). The first
    ``upcoming`` bins already exist: CA puts a copy of the template into its snapshot for every upcoming node
    (target size - registered) before it looks for options, so pods that fit there need no new node.
    Returns (new nodes, pods on new nodes, pods on upcoming nodes)."""
    room = _template_room(template)
    labels = dict(template.metadata.labels)
    fitting = [p for p in pods if _selector_ok(p, labels)]
    fitting = [p for p in fitting if _pod_requests(p)[0] <= room.cpu_milli and _pod_requests(p)[1] <= room.memory_bytes]
    bins: list[list[int]] = [[room.cpu_milli, room.memory_bytes, room.pods] for _ in range(upcoming)]
    placed: dict[int, list[Mapping[str, Any]]] = {}
    for pod in sorted(fitting, key=lambda p: (-_share(p, room), p["metadata"]["name"])):
        cpu, mem = _pod_requests(pod)
        for i, b in enumerate(bins):
            if b[0] >= cpu and b[1] >= mem and b[2] >= 1:
                b[0], b[1], b[2] = b[0] - cpu, b[1] - mem, b[2] - 1
                placed.setdefault(i, []).append(pod)
                break
        else:
            bins.append([room.cpu_milli - cpu, room.memory_bytes - mem, room.pods - 1])
            placed.setdefault(len(bins) - 1, []).append(pod)
    on_new = tuple(p for i, ps in placed.items() if i >= upcoming for p in ps)
    on_upcoming = tuple(p for i, ps in placed.items() if i < upcoming for p in ps)
    return len(bins) - upcoming, on_new, on_upcoming


async def price_expander_choice(
    client: CloudProviderClient, options: Sequence[Option], cluster_nodes: int, now: float
) -> tuple[Option | None, dict[str, float]]:
    """CA's ``price`` expander (expander/price/price.go) on our Pricing RPCs: score = unfitness x
    (node price x count + stabilisation) / (pods price + stabilisation), lowest wins; unfitness from the preferred
    node for the cluster size (preferred.go: 1 cpu up to 2 nodes, 2 up to 6, 4 up to 20, ...)."""
    stub = client.stubs
    end = now + 3600.0
    stabilization = stub.core.Pod()
    stabilization.metadata.name, stabilization.metadata.namespace = STABILIZATION_POD[0], "default"
    c = stabilization.spec.containers.add()
    c.resources.requests["cpu"].string = STABILIZATION_POD[1]
    c.resources.requests["memory"].string = STABILIZATION_POD[2]
    try:
        stab = await client.pod_price(stabilization.SerializeToString(), now, end)
    except (NotImplementedByProvider, grpc.aio.AioRpcError):
        stab = 0.0
    preferred_cpu = next(
        (cpu for limit, cpu in ((2, 1000), (6, 2000), (20, 4000), (60, 8000), (200, 16000)) if cluster_nodes <= limit),
        32000,
    )
    scores: dict[str, float] = {}
    best: Option | None = None
    for option in options:
        node = stub.pb2.ExternalGrpcNode(name=option.template.metadata.name)
        node.labels.update(option.template.metadata.labels)
        node.annotations.update(option.template.metadata.annotations)
        try:
            node_price = await client.node_price(node, now, end) * option.node_count
            pods_price = 0.0
            for pod in option.pods:
                pods_price += await client.pod_price(pod_message(stub, pod).SerializeToString(), now, end)
        except (NotImplementedByProvider, grpc.aio.AioRpcError):
            continue  # CA: "Failed to calculate ... price", the option is skipped
        cpu = _template_room(option.template).cpu_milli or 1
        unfitness = max(preferred_cpu / cpu, cpu / preferred_cpu)
        suppressed = (unfitness - 1.0) * (1.0 - math.tanh((option.node_count - 1) / 15.0)) + 1.0
        if await client.gpu_label() in option.template.metadata.labels:
            suppressed = 1000.0
        score = suppressed * (node_price + stab) / (pods_price + stab)
        scores[option.node_group] = score
        if best is None or score < scores[best.node_group]:
            best = option
    return best, scores


@dataclass
class ReplayedAutoscaler:
    """CA's RunOnce against the cloud provider (and the grpc expander when given), in CA's call order."""

    client: CloudProviderClient
    expander: Any = None  # an Expander stub (grpc expander), or None for --expander=price
    defaults: Mapping[str, float] = field(default_factory=dict)
    upcoming_riders: int = 0  # pending pods of the last loop that fit on upcoming (booting) nodes

    async def run_once(self, nodes: Sequence[Mapping[str, Any]], pending: Sequence[Mapping[str, Any]]) -> Any:
        """One loop; returns (chosen Option or None, all options, price expander scores)."""
        c = self.client
        await c.refresh()
        groups = await c.node_groups()
        ready = [n for n in nodes if _ready(n)]
        with_ready: set[str] = set()
        for node in ready:  # TemplateNodeInfoProvider: node groups that have a ready node take it as the template
            g = await c.node_group_for_node(node)
            if g is not None:
                with_ready.add(g.id)
        templates = {g.id: await c.template_node(g.id) for g in groups if g.id not in with_ready}
        registered: dict[str, int] = {}
        for g in groups:  # clusterstate.UpdateNodes: target sizes and the provider's instances
            await c.target_size(g.id)
            await c.nodes(g.id)
        for node in nodes:
            found = await c.node_group_for_node(node)
            if found is not None and _ready(node):
                registered[found.id] = registered.get(found.id, 0) + 1
        if not pending:
            return None, [], {}
        targets = {g.id: await c.target_size(g.id) for g in groups}
        left = list(pending)
        for g in groups:  # upcoming nodes (target - registered) go into the snapshot first: no new node for them
            template = templates.get(g.id) or await c.template_node(g.id)
            upcoming = max(0, targets[g.id] - registered.get(g.id, 0))
            if upcoming and template is not None:
                _, _, riding = estimate(left, template, upcoming)
                names = {p["metadata"]["name"] for p in riding}
                left = [p for p in left if p["metadata"]["name"] not in names]
        self.upcoming_riders = len(pending) - len(left)
        if not left:
            return None, [], {}
        options: list[Option] = []
        for g in groups:  # scale-up orchestrator: per node group size, options and estimate
            target = await c.target_size(g.id)
            await c.get_options(g.id, self.defaults)
            template = templates.get(g.id) or await c.template_node(g.id)
            if template is None or target >= g.max_size:
                continue
            count, pods, _ = estimate(left, template)
            if count:
                options.append(Option(g.id, min(count, g.max_size - target), pods, template))
        if not options:
            return None, [], {}
        best, scores = await price_expander_choice(c, options, len(nodes), time.time())
        if self.expander is not None:
            best = await self._grpc_expander(options) or best
        if best is not None:
            await c.increase_size(best.node_group, best.node_count)
        return best, options, scores

    async def _grpc_expander(self, options: Sequence[Option]) -> Option | None:
        stubs = load_expander()
        req = stubs.pb2.BestOptionsRequest()
        for option in options:
            o = req.options.add()
            o.nodeGroupId, o.nodeCount, o.debug = option.node_group, option.node_count, f"replay {option.node_group}"
            o.podBytes.extend(pod_message(stubs, p).SerializeToString() for p in option.pods)
            req.nodeBytesMap[option.node_group] = option.template.SerializeToString()
        self.client.calls.append("BestOptions")
        res = await self.expander.BestOptions(req, timeout=DEFAULT_TIMEOUT)
        chosen = {o.nodeGroupId for o in res.options}
        return next((o for o in options if o.node_group in chosen), None)

    async def scale_down(self, node: Mapping[str, Any]) -> str | None:
        """Remove one unneeded node: its node group, options, size check, DeleteNodes. Returns the group id."""
        c = self.client
        g = await c.node_group_for_node(node)
        if g is None:
            return None
        await c.get_options(g.id, self.defaults)
        if await c.target_size(g.id) <= g.min_size:
            return None
        await c.delete_nodes(g.id, [node])
        return g.id


def _ready(node: Mapping[str, Any]) -> bool:
    for cond in node.get("status", {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


# ------------------------------------------------------------------------------------------------ probe


async def _probe(config: CloudConfig) -> int:
    client, channel = CloudProviderClient.dial(config)
    try:
        await client.refresh()
        for g in await client.node_groups():
            template = await client.template_node(g.id)
            instances = await client.nodes(g.id)
            if template is not None:
                room = _template_room(template)
                shape = f"cpu {room.cpu_milli}m, memory {room.memory_bytes // 2**20}Mi, pods {room.pods}"
            else:
                shape = "none"
            print(
                f"{g.id}: size {await client.target_size(g.id)} [{g.min_size}..{g.max_size}], "
                f"{len(instances)} instances, template {shape}"
            )
        print(f"GPU label {await client.gpu_label()!r}")
    except grpc.aio.AioRpcError as exc:
        print(f"{exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    finally:
        await channel.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0] if __doc__ else None)
    parser.add_argument("--cloud-config", required=True, help="CA's externalgrpc cloud-config file")
    args = parser.parse_args(argv)
    return asyncio.run(_probe(CloudConfig.load(args.cloud_config)))


if __name__ == "__main__":
    raise SystemExit(main())
