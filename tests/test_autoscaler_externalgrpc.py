"""The externalgrpc cloud provider (our flavours as cluster-autoscaler node groups): proto facts, mTLS, CA's calls.

No cluster here (the real cluster-autoscaler 1.35.2 against this server: e2e/test_cluster_autoscaler.py): the server
runs over real mTLS on localhost with a recording backend instead of kwok and a Snapshot fed Kubernetes JSON; the
client is tests/cloud_provider_client.py (CA's RPCs and request fields, to check our answers and status codes).
Bytes from k8s.io/api itself: GO_TEMPLATE / GO_POD are what v0.35.8's ``Node.Marshal()`` / ``Pod.Marshal()`` gave
after ``Unmarshal`` of the bytes our provider / replay client wrote (checked once with a Go program against the
Go module cache; it decoded every field we set, see the README).
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from extender.autoscaler.loop import PROVISIONED_BY_LABEL, AutoscalerLoop, ProvisionRequest
from extender.autoscaler.metrics import AutoscalerMetrics
from extender.autoscaler.nodegroups import NodeGroupError, NodeGroups
from extender.autoscaler.providers.externalgrpc import CloudProviderServer, NodeGroupOptions, node_message
from extender.autoscaler.providers.kwok import node_manifest
from extender.autoscaler.settings import CLOUD_PROVIDER_MAX_MESSAGE_BYTES, parse_autoscaler_config
from extender.autoscaler.stubs import load_externalgrpc
from extender.autoscaler.view import AutoscalerSnapshot
from extender.core import autoscale
from extender.core.model import Flavour, NodeGroup, Resources, parse_quantity
from extender.settings import SettingsError
from extender.settings.extender import ExtenderConfig
from tests.cloud_provider_client import CloudConfig, CloudProviderClient, pod_message

GI = 2**30
SMALL = Flavour("s.small", Resources(2000, 4 * GI, 110), 0.10)
LARGE = Flavour("s.large", Resources(8000, 16 * GI, 110), 0.36)
HIMEM = Flavour("s.himem", Resources(2000, 16 * GI, 110), 0.20)
CATALOGUE = (SMALL, LARGE, HIMEM)
STUBS = load_externalgrpc()
CONFIG = ExtenderConfig()

GO_TEMPLATE = bytes.fromhex(
    "0ac1030a2274656d706c6174652d6e6f64652d666f722d736572766963652d6d312d6c6172676512001a0022002a00320038"
    "0042005a1b0a126b756265726e657465732e696f2f617263681205616d6436345a3c0a166b756265726e657465732e696f2f"
    "686f73746e616d65122274656d706c6174652d6e6f64652d666f722d736572766963652d6d312d6c617267655a190a106b75"
    "6265726e657465732e696f2f6f7312056c696e75785a2c0a206e6f64652e6b756265726e657465732e696f2f696e7374616e"
    "63652d7479706512086d312e6c617267655a2e0a23716f732e6b7562652d716f732d657874656e6465722e696f2f6e6f6465"
    "2d67726f75701207736572766963655a390a27716f732e6b7562652d716f732d657874656e6465722e696f2f70726f766973"
    "696f6e65642d6279120e716f732d6175746f7363616c65725a0c0a047479706512046b776f6b621a0a126b776f6b2e782d6b"
    "38732e696f2f6e6f6465120466616b6562210a1c6e6f64652e616c7068612e6b756265726e657465732e696f2f74746c1201"
    "3062310a27716f732e6b7562652d716f732d657874656e6465722e696f2f70726963652d7065722d686f75721206302e3237"
    "343612080a0012001a0020001ad2010a0a0a0363707512030a01340a100a066d656d6f727912060a04313647690a0d0a0470"
    "6f647312050a03313130120a0a0363707512030a013412100a066d656d6f727912060a0431364769120d0a04706f64731205"
    "0a033131301a0752756e6e696e67222e0a0552656164791204547275651a0022002a0c4b7562656c65745265616479320d74"
    "656d706c617465206e6f646532040a0208003a370a0012001a0022002a00320b6b776f6b2d76302e382e303a0776312e3335"
    "2e38420776312e33352e384a056c696e75785205616d643634"
)
GO_POD = bytes.fromhex(
    "0a2d0a017012001a026e7322002a0275313200380042005a060a01611201626a0e0a034a6f621a016a22002a00300112af01"
    "124d0a016312002a0042340a0f0a066d656d6f727912050a03314769120e0a0363707512070a05313530306d12110a066d65"
    "6d6f727912070a053531324d696a007200800100880100900100a201001a00320042004a0052005800600068008201008a01"
    "009a010d716f732d7363686564756c6572a201310a016912002a00420f120d0a0363707512060a043130306d6a0072008001"
    "00880100900100a20100c20106416c77617973c20100c801051a1a0a0750656e64696e671a0022002a0032004a005a007200"
    "880100"
)


# ----------------------------------------------------------------------------------------------- fixtures


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


@dataclass(frozen=True)
class Pki:
    """A CA, the sidecar's serving certificate (SAN 127.0.0.1), CA's client certificate, and a rogue client."""

    d: Path

    def __getattr__(self, name: str) -> Path:
        return self.d / name.replace("_", ".")


def make_pki(d: Path) -> Pki:
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for ca in ("ca", "rogue"):
        _openssl(
            "req", "-x509", *ec, "-keyout", d / f"{ca}.key", "-out", d / f"{ca}.crt", "-days", "1", "-subj", f"/CN={ca}"
        )
    for leaf, ca, ext in (
        ("server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"),
        ("client", "ca", "extendedKeyUsage=clientAuth\n"),
        ("intruder", "rogue", "extendedKeyUsage=clientAuth\n"),
    ):
        _openssl("req", *ec, "-keyout", d / f"{leaf}.key", "-out", d / f"{leaf}.csr", "-subj", f"/CN={leaf}")
        (d / f"{leaf}.ext").write_text(ext)
        _openssl(
            "x509", "-req", "-in", d / f"{leaf}.csr", "-CA", d / f"{ca}.crt", "-CAkey", d / f"{ca}.key",
            "-CAcreateserial", "-out", d / f"{leaf}.crt", "-days", "1", "-extfile", d / f"{leaf}.ext",
        )  # fmt: skip
    return Pki(d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@dataclass
class RecordingBackend:
    """The provider protocol without a cloud: records what it was asked (kwok is exercised by the live test)."""

    name: str = "recording"
    created: list[ProvisionRequest] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    fail: bool = False
    closed: bool = False

    async def create(self, request: ProvisionRequest) -> None:
        if self.fail:
            raise OSError("cloud API down")
        self.created.append(request)

    async def cancel(self, node_name: str) -> None:
        self.cancelled.append(node_name)

    async def delete(self, node_name: str) -> None:
        self.deleted.append(node_name)

    async def close(self) -> None:
        self.closed = True


STATIC = {  # a node of the cluster that is no node group's: CA must leave it alone
    "metadata": {
        "name": "static-1",
        "labels": {"qos.kube-qos-extender.io/node-group": "service", "node.kubernetes.io/instance-type": "s.small"},
    },
    "spec": {},
    "status": {
        "allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"},
        "capacity": {"cpu": "2", "memory": "4Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True"}],
    },
}


@dataclass
class Harness:
    server: CloudProviderServer
    client: CloudProviderClient
    channel: Any
    snapshot: AutoscalerSnapshot
    backend: RecordingBackend
    now: list[float]
    nodes: dict[str, dict[str, Any]]

    def join(self, request: ProvisionRequest) -> dict[str, Any]:
        """The backend's node registered and is Ready (what kwok makes of node_manifest)."""
        manifest = node_manifest(request)
        manifest["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        self.snapshot.apply_node("ADDED", manifest)
        self.nodes[request.name] = manifest
        return manifest

    def gone(self, name: str) -> None:
        self.snapshot.apply_node("DELETED", self.nodes.pop(name))

    async def code(self, method: str, request: Any) -> grpc.StatusCode:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await getattr(self.client.stub, method)(request, timeout=5.0)
        return info.value.code()


def _suffix() -> Any:
    n = itertools.count()
    return lambda: f"{next(n):04d}"


async def _start(pki: Pki, *, options: NodeGroupOptions | None = None, synced: bool = True, **kw: Any) -> Harness:
    snapshot = AutoscalerSnapshot(CONFIG)
    if synced:
        snapshot.replace_nodes([STATIC], "1")
    backend = RecordingBackend()
    now = [1000.0]
    state = NodeGroups.build(
        CATALOGUE,
        CONFIG.node_groups,
        max_size=kw.pop("max_size", 3),
        min_size=kw.pop("min_size", 0),
        provisioning_timeout_seconds=60.0,
        max_nodes=kw.pop("max_nodes", 5),
        name_suffix=_suffix(),
    )
    server = CloudProviderServer(
        CONFIG,
        state,
        snapshot,
        backend,
        node_manifest,
        listen="127.0.0.1:0",
        credentials=grpc.ssl_server_credentials(
            [(pki.server_key.read_bytes(), pki.server_crt.read_bytes())],
            root_certificates=pki.ca_crt.read_bytes(),
            require_client_auth=True,
        ),
        clients=("client",),
        max_message_bytes=CLOUD_PROVIDER_MAX_MESSAGE_BYTES,
        gpu_label="qos.kube-qos-extender.io/accelerator",
        options=options,
        metrics=AutoscalerMetrics(),
        clock=lambda: now[0],
    )
    port = await server.start()
    config = CloudConfig(f"127.0.0.1:{port}", str(pki.client_crt), str(pki.client_key), str(pki.ca_crt))
    client, channel = CloudProviderClient.dial(config)
    return Harness(server, client, channel, snapshot, backend, now, {"static-1": STATIC})


@pytest.fixture
async def h(pki: Pki) -> AsyncIterator[Harness]:
    harness = await _start(pki)
    try:
        yield harness
    finally:
        await harness.channel.close()
        await harness.server.stop()


def pending(name: str, cpu: str, memory: str, group: str = "service") -> dict[str, Any]:
    """An Unschedulable pod the way CA lists it (Kubernetes JSON); the nodeSelector pins its node group."""
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "annotations": {"qos.kube-qos-extender.io/kind": group},
        },
        "spec": {
            "schedulerName": "qos-scheduler",
            "nodeSelector": {"qos.kube-qos-extender.io/node-group": group},
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
        },
        "status": {"phase": "Pending"},
    }


# -------------------------------------------------------------------------------------------- proto facts

# Upstream's field list (cluster-autoscaler cloudprovider/externalgrpc/protos/externalgrpc.proto): the 1.35 fields,
# the pre-1.35 Kubernetes-typed fields (numbers from the version before PR #8660) and the two newer option fields.
FACTS = [
    ("NodeGroup", "id", 1, "string"),
    ("NodeGroup", "minSize", 2, "int32"),
    ("NodeGroup", "maxSize", 3, "int32"),
    ("NodeGroup", "debug", 4, "string"),
    ("ExternalGrpcNode", "providerID", 1, "string"),
    ("ExternalGrpcNode", "name", 2, "string"),
    ("ExternalGrpcNode", "labels", 3, "map"),
    ("ExternalGrpcNode", "annotations", 4, "map"),
    ("NodeGroupsResponse", "nodeGroups", 1, "NodeGroup"),
    ("NodeGroupForNodeRequest", "node", 1, "ExternalGrpcNode"),
    ("NodeGroupForNodeResponse", "nodeGroup", 1, "NodeGroup"),
    ("PricingNodePriceRequest", "node", 1, "ExternalGrpcNode"),
    ("PricingNodePriceRequest", "startTime", 2, "kubeqos.corev1.Time"),
    ("PricingNodePriceRequest", "endTime", 3, "kubeqos.corev1.Time"),
    ("PricingNodePriceRequest", "startTimestamp", 4, "google.protobuf.Timestamp"),
    ("PricingNodePriceRequest", "endTimestamp", 5, "google.protobuf.Timestamp"),
    ("PricingNodePriceResponse", "price", 1, "double"),
    ("PricingPodPriceRequest", "pod", 1, "kubeqos.corev1.Pod"),
    ("PricingPodPriceRequest", "startTime", 2, "kubeqos.corev1.Time"),
    ("PricingPodPriceRequest", "endTime", 3, "kubeqos.corev1.Time"),
    ("PricingPodPriceRequest", "pod_bytes", 4, "bytes"),
    ("PricingPodPriceRequest", "startTimestamp", 5, "google.protobuf.Timestamp"),
    ("PricingPodPriceRequest", "endTimestamp", 6, "google.protobuf.Timestamp"),
    ("PricingPodPriceResponse", "price", 1, "double"),
    ("GPULabelResponse", "label", 1, "string"),
    ("GetAvailableGPUTypesResponse", "gpuTypes", 1, "map"),
    ("NodeGroupTargetSizeRequest", "id", 1, "string"),
    ("NodeGroupTargetSizeResponse", "targetSize", 1, "int32"),
    ("NodeGroupIncreaseSizeRequest", "delta", 1, "int32"),
    ("NodeGroupIncreaseSizeRequest", "id", 2, "string"),
    ("NodeGroupDeleteNodesRequest", "nodes", 1, "ExternalGrpcNode"),
    ("NodeGroupDeleteNodesRequest", "id", 2, "string"),
    ("NodeGroupDecreaseTargetSizeRequest", "delta", 1, "int32"),
    ("NodeGroupDecreaseTargetSizeRequest", "id", 2, "string"),
    ("NodeGroupNodesRequest", "id", 1, "string"),
    ("NodeGroupNodesResponse", "instances", 1, "Instance"),
    ("Instance", "id", 1, "string"),
    ("Instance", "status", 2, "InstanceStatus"),
    ("InstanceStatus", "instanceState", 1, "enum"),
    ("InstanceStatus", "errorInfo", 2, "InstanceErrorInfo"),
    ("InstanceErrorInfo", "errorCode", 1, "string"),
    ("InstanceErrorInfo", "errorMessage", 2, "string"),
    ("InstanceErrorInfo", "instanceErrorClass", 3, "int32"),
    ("NodeGroupTemplateNodeInfoRequest", "id", 1, "string"),
    ("NodeGroupTemplateNodeInfoResponse", "nodeInfo", 1, "kubeqos.corev1.Node"),
    ("NodeGroupTemplateNodeInfoResponse", "nodeBytes", 2, "bytes"),
    ("NodeGroupTemplateNodeInfoResponse", "resourceSliceBytes", 3, "bytes"),
    ("NodeGroupAutoscalingOptions", "scaleDownUtilizationThreshold", 1, "double"),
    ("NodeGroupAutoscalingOptions", "scaleDownGpuUtilizationThreshold", 2, "double"),
    ("NodeGroupAutoscalingOptions", "scaleDownUnneededTime", 3, "kubeqos.corev1.Duration"),
    ("NodeGroupAutoscalingOptions", "scaleDownUnreadyTime", 4, "kubeqos.corev1.Duration"),
    ("NodeGroupAutoscalingOptions", "MaxNodeProvisionTime", 5, "kubeqos.corev1.Duration"),
    ("NodeGroupAutoscalingOptions", "zeroOrMaxNodeScaling", 6, "bool"),
    ("NodeGroupAutoscalingOptions", "ignoreDaemonSetsUtilization", 7, "bool"),
    ("NodeGroupAutoscalingOptions", "scaleDownUnneededDuration", 8, "google.protobuf.Duration"),
    ("NodeGroupAutoscalingOptions", "scaleDownUnreadyDuration", 9, "google.protobuf.Duration"),
    ("NodeGroupAutoscalingOptions", "MaxNodeProvisionDuration", 10, "google.protobuf.Duration"),
    ("NodeGroupAutoscalingOptions", "maxNodeStartupDuration", 11, "google.protobuf.Duration"),
    ("NodeGroupAutoscalingOptions", "allowNonAtomicScaleUpToMax", 12, "bool"),
    ("NodeGroupAutoscalingOptionsRequest", "id", 1, "string"),
    ("NodeGroupAutoscalingOptionsRequest", "defaults", 2, "NodeGroupAutoscalingOptions"),
    ("NodeGroupAutoscalingOptionsResponse", "nodeGroupAutoscalingOptions", 1, "NodeGroupAutoscalingOptions"),
]
SCALARS = {1: "double", 5: "int32", 8: "bool", 9: "string", 12: "bytes", 14: "enum"}
PACKAGE = "clusterautoscaler.cloudprovider.v1.externalgrpc"


def _type(f: Any) -> str:
    if f.message_type is None:
        return SCALARS[f.type]
    if f.message_type.GetOptions().map_entry:
        return "map"
    name = f.message_type.full_name
    return name.removeprefix(PACKAGE + ".")


def test_our_proto_has_upstreams_names_numbers_and_types() -> None:
    d = STUBS.pb2.DESCRIPTOR
    assert d.package == PACKAGE
    for message, name, number, kind in FACTS:
        f = d.message_types_by_name[message].fields_by_name[name]
        assert (f.number, _type(f)) == (number, kind), (message, name)
    service = d.services_by_name["CloudProvider"]
    assert service.full_name == f"{PACKAGE}.CloudProvider"
    assert [m.name for m in service.methods] == [
        "NodeGroups", "NodeGroupForNode", "PricingNodePrice", "PricingPodPrice", "GPULabel", "GetAvailableGPUTypes",
        "Cleanup", "Refresh", "NodeGroupTargetSize", "NodeGroupIncreaseSize", "NodeGroupDeleteNodes",
        "NodeGroupDecreaseTargetSize", "NodeGroupNodes", "NodeGroupTemplateNodeInfo", "NodeGroupGetOptions",
    ]  # fmt: skip
    state = d.message_types_by_name["InstanceStatus"].enum_types_by_name["InstanceState"]
    assert {v.name: v.number for v in state.values} == {
        "unspecified": 0,
        "instanceRunning": 1,
        "instanceCreating": 2,
        "instanceDeleting": 3,
    }
    # the core/v1 fields the template Node adds (k8s.io/api v0.35.8 generated.proto numbers)
    core = STUBS.core.DESCRIPTOR.message_types_by_name
    assert core["NodeSpec"].fields_by_name["providerID"].number == 3
    assert core["NodeSpec"].fields_by_name["taints"].number == 5
    assert [core["NodeStatus"].fields_by_name[f].number for f in ("phase", "conditions", "nodeInfo")] == [3, 4, 7]
    assert [core["NodeSystemInfo"].fields_by_name[f].number for f in ("kubeletVersion", "architecture")] == [7, 10]


def _node_view(n: Any) -> dict[str, Any]:
    return {
        "name": n.metadata.name,
        "labels": dict(n.metadata.labels),
        "annotations": dict(n.metadata.annotations),
        "providerID": n.spec.providerID,
        "taints": [(t.key, t.value, t.effect) for t in n.spec.taints],
        # by value: k8s.io/api writes quantities back in canonical form ("4000m" -> "4", "16384Mi" -> "16Gi")
        "capacity": {k: parse_quantity(v.string) for k, v in n.status.capacity.items()},
        "allocatable": {k: parse_quantity(v.string) for k, v in n.status.allocatable.items()},
        "phase": n.status.phase,
        "conditions": [(c.type, c.status, c.reason, c.message) for c in n.status.conditions],
        "info": (n.status.nodeInfo.kubeletVersion, n.status.nodeInfo.operatingSystem, n.status.nodeInfo.architecture),
    }


async def test_template_is_the_node_the_backend_creates_and_k8s_api_reads_it(h: Harness) -> None:
    req = STUBS.pb2.NodeGroupTemplateNodeInfoRequest(id="service-s.himem")
    res = await h.client.stub.NodeGroupTemplateNodeInfo(req, timeout=5.0)
    node = STUBS.core.Node.FromString(res.nodeBytes)
    assert _node_view(res.nodeInfo) == _node_view(node)  # the field CA < 1.34.3 reads holds the same Node
    view = _node_view(node)
    assert view["labels"][PROVISIONED_BY_LABEL] == "qos-autoscaler"
    assert view["labels"]["qos.kube-qos-extender.io/node-group"] == "service"
    assert view["labels"]["node.kubernetes.io/instance-type"] == "s.himem"
    assert view["capacity"] == view["allocatable"] == {"cpu": 2, "memory": 16 * GI, "pods": 110}
    assert view["providerID"] == "" and view["taints"] == []
    assert view["conditions"] == [("Ready", "True", "KubeletReady", "template node")]
    assert view["annotations"]["qos.kube-qos-extender.io/price-per-hour"] == "0.2"
    # what kwok will create, except name, providerID and the conditions kwok sets
    request = ProvisionRequest("x", HIMEM, NodeGroup.SERVICE, dict(h.server.state.specs["service-s.himem"].labels), ())
    made = _node_view(node_message(node_manifest(request)))
    for key in ("capacity", "allocatable", "info", "phase", "annotations"):
        assert made[key] == view[key], key
    assert {k: v for k, v in made["labels"].items() if k != "kubernetes.io/hostname"} == {
        k: v for k, v in view["labels"].items() if k != "kubernetes.io/hostname"
    }
    # k8s.io/api v0.35.8 read our bytes for m1.large and marshalled them back (GO_TEMPLATE): we read that the same
    m1 = Flavour("m1.large", Resources(4000, 16 * GI, 110), 0.2746)
    state = NodeGroups.build([m1], CONFIG.node_groups)
    manifest = node_manifest(state.template_request("service-m1.large"))
    manifest["spec"].pop("providerID")
    manifest["status"]["conditions"] = [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "template node"}
    ]
    ours = node_message(manifest)
    assert _node_view(STUBS.core.Node.FromString(GO_TEMPLATE)) == _node_view(ours)
    assert _node_view(ours)["capacity"] == {"cpu": 4, "memory": 16 * GI, "pods": 110}
    assert ours.status.capacity["cpu"].string == "4000m"  # ours as node_manifest writes it, Go's canonical above


def test_pod_bytes_round_trip_through_k8s_api() -> None:
    from extender.autoscaler.providers.cluster_autoscaler import pod_to_dict

    pod = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "labels": {"a": "b"},
            "ownerReferences": [{"kind": "Job", "name": "j", "controller": True}],
        },
        "spec": {
            "schedulerName": "qos-scheduler",
            "priority": 5,
            "containers": [
                {
                    "name": "c",
                    "resources": {"requests": {"cpu": "1500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
                }
            ],
            "initContainers": [{"name": "i", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}}],
        },
        "status": {"phase": "Pending"},
    }
    ours = pod_message(STUBS, pod)
    assert pod_to_dict(STUBS.core.Pod.FromString(GO_POD)) == pod_to_dict(ours)


# ------------------------------------------------------------------------------------------------- mTLS


async def test_only_clients_with_a_certificate_from_the_ca_get_in(h: Harness, pki: Pki) -> None:
    addr = f"127.0.0.1:{h.server.port}"
    request = STUBS.pb2.NodeGroupsRequest()
    attempts = {
        "no client certificate": grpc.ssl_channel_credentials(root_certificates=pki.ca_crt.read_bytes()),
        "certificate of another CA": grpc.ssl_channel_credentials(
            pki.ca_crt.read_bytes(), pki.intruder_key.read_bytes(), pki.intruder_crt.read_bytes()
        ),
    }
    for what, creds in attempts.items():
        async with grpc.aio.secure_channel(addr, creds) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await STUBS.grpc.CloudProviderStub(channel).NodeGroups(request, timeout=3.0)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE, what
    async with grpc.aio.insecure_channel(addr) as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await STUBS.grpc.CloudProviderStub(channel).NodeGroups(request, timeout=3.0)
    assert len(await h.client.node_groups()) == 6  # CA's own certificate: in


# ------------------------------------------------------------------------------------- CA's calls, in order


async def test_node_groups_are_workload_groups_times_flavours(h: Harness) -> None:
    groups = await h.client.node_groups()
    assert [g.id for g in groups] == [f"{g}-{f.name}" for g in ("service", "batch") for f in CATALOGUE]
    assert all((g.min_size, g.max_size) == (0, 3) for g in groups)
    assert "s.himem" in groups[2].debug and "$0.2/h" in groups[2].debug
    assert await h.client.node_group_for_node(STATIC) is None  # not ours: CA leaves it alone
    assert await h.client.gpu_label() == "qos.kube-qos-extender.io/accelerator"
    assert await h.client.gpu_types() == set()


async def test_instances_that_never_registered_are_found_and_cancelled(h: Harness) -> None:
    await h.client.refresh()
    await h.client.increase_size("batch-s.large", 2)
    names = [r.name for r in h.backend.created]
    # CA removes long-unregistered instances with a stand-in Node named after the instance id
    fake = {"metadata": {"name": f"kwok://{names[0]}"}, "spec": {"providerID": f"kwok://{names[0]}"}}
    found = await h.client.node_group_for_node(fake)
    assert found is not None and found.id == "batch-s.large"
    await h.client.delete_nodes("batch-s.large", [fake])
    assert h.backend.cancelled == [names[0]] and await h.client.target_size("batch-s.large") == 1
    # fixNodeGroupSize: DecreaseTargetSize withdraws requests that did not register, newest first
    await h.client.decrease_target_size("batch-s.large", -1)
    assert h.backend.cancelled == [names[0], names[1]] and await h.client.target_size("batch-s.large") == 0


async def test_requests_that_time_out_are_cancelled_and_leave_the_target(h: Harness) -> None:
    await h.client.increase_size("service-s.small", 1)
    assert await h.client.target_size("service-s.small") == 1
    h.now[0] += 61.0  # provisioning timeout 60 s
    assert await h.client.target_size("service-s.small") == 0
    assert h.backend.cancelled == [h.backend.created[0].name]


async def test_a_failing_backend_leaves_nothing_in_the_ledger(h: Harness) -> None:
    h.backend.fail = True
    code = await h.code("NodeGroupIncreaseSize", STUBS.pb2.NodeGroupIncreaseSizeRequest(id="service-s.small", delta=2))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert await h.client.target_size("service-s.small") == 0 and h.server.state.ledger.entries == ()


# ---------------------------------------------------------------------------------------- prices


def _period(req: Any, start: float, end: float, *, old: bool = False) -> Any:
    a, b = (req.startTime, req.endTime) if old else (req.startTimestamp, req.endTimestamp)
    a.seconds, b.seconds = int(start), int(end)
    return req


async def test_prices_come_from_the_flavours_for_every_ca_generation(h: Harness) -> None:
    pb2 = STUBS.pb2
    stub = h.client.stub
    node = pb2.ExternalGrpcNode(name="n")
    node.labels["node.kubernetes.io/instance-type"] = "s.large"
    res = await stub.PricingNodePrice(_period(pb2.PricingNodePriceRequest(node=node), 0, 7200), timeout=5.0)
    assert res.price == pytest.approx(0.72)  # 2 h of s.large
    old = await stub.PricingNodePrice(_period(pb2.PricingNodePriceRequest(node=node), 0, 7200, old=True), timeout=5.0)
    assert old.price == res.price  # CA < 1.35: meta/v1 Time at 2 / 3
    priced = pb2.ExternalGrpcNode(name="other")
    priced.annotations["qos.kube-qos-extender.io/price-per-hour"] = "0.5"
    res = await stub.PricingNodePrice(_period(pb2.PricingNodePriceRequest(node=priced), 0, 3600), timeout=5.0)
    assert res.price == pytest.approx(0.5)
    # a pod's price: the cheapest fractional mix of flavours covering its requests (fluid lower bound)
    pod = pod_message(STUBS, pending("p", "1", "8Gi"))
    expected = autoscale.fluid_lower_bound_per_hour(Resources(1000, 8 * GI), list(CATALOGUE))
    res = await stub.PricingPodPrice(_period(pb2.PricingPodPriceRequest(pod_bytes=pod.SerializeToString()), 0, 3600))
    assert res.price == pytest.approx(expected) and expected == pytest.approx(0.10)  # half an s.himem
    req = _period(pb2.PricingPodPriceRequest(), 0, 3600, old=True)
    req.pod.CopyFrom(pod)  # CA < 1.35: the Pod embedded at field 1
    assert (await stub.PricingPodPrice(req, timeout=5.0)).price == res.price


def autoscale_pod(obj: dict[str, Any]) -> Any:
    from extender.kube.convert import pod_from_k8s

    pod, _ = pod_from_k8s(obj, CONFIG.pod_defaults, CONFIG.policy.classes)
    return pod


# ------------------------------------------------------------------------------------------ bad input


async def test_bad_input_gets_the_status_ca_expects_and_the_server_keeps_serving(h: Harness) -> None:
    pb2 = STUBS.pb2
    await h.client.increase_size("service-s.small", 3)  # max size 3
    other = node_manifest(h.backend.created[0])
    h.join(h.backend.created[0])
    batch_node = pb2.ExternalGrpcNode(name=other["metadata"]["name"])
    batch_node.labels.update(other["metadata"]["labels"])
    static = pb2.ExternalGrpcNode(name="static-1")
    static.labels.update(STATIC["metadata"]["labels"])
    nf, bad, pre = grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
    no_price, unimplemented = pb2.ExternalGrpcNode(name="x"), grpc.StatusCode.UNIMPLEMENTED
    cases = [
        ("NodeGroupTargetSize", pb2.NodeGroupTargetSizeRequest(id="nope"), nf),
        ("NodeGroupIncreaseSize", pb2.NodeGroupIncreaseSizeRequest(id="nope", delta=1), nf),
        ("NodeGroupNodes", pb2.NodeGroupNodesRequest(id="nope"), nf),
        ("NodeGroupTemplateNodeInfo", pb2.NodeGroupTemplateNodeInfoRequest(id="nope"), nf),
        ("NodeGroupGetOptions", pb2.NodeGroupAutoscalingOptionsRequest(id="nope"), nf),
        ("NodeGroupIncreaseSize", pb2.NodeGroupIncreaseSizeRequest(id="batch-s.small", delta=0), bad),
        ("NodeGroupIncreaseSize", pb2.NodeGroupIncreaseSizeRequest(id="batch-s.small", delta=-2), bad),
        ("NodeGroupIncreaseSize", pb2.NodeGroupIncreaseSizeRequest(id="service-s.small", delta=1), pre),
        ("NodeGroupIncreaseSize", pb2.NodeGroupIncreaseSizeRequest(id="batch-s.small", delta=3), pre),
        ("NodeGroupDeleteNodes", pb2.NodeGroupDeleteNodesRequest(id="batch-s.small", nodes=[batch_node]), bad),
        ("NodeGroupDeleteNodes", pb2.NodeGroupDeleteNodesRequest(id="service-s.small", nodes=[static]), bad),
        ("NodeGroupDeleteNodes", pb2.NodeGroupDeleteNodesRequest(id="service-s.small"), bad),
        ("NodeGroupDecreaseTargetSize", pb2.NodeGroupDecreaseTargetSizeRequest(id="service-s.small", delta=1), bad),
        ("NodeGroupDecreaseTargetSize", pb2.NodeGroupDecreaseTargetSizeRequest(id="service-s.small", delta=-3), pre),
        ("NodeGroupForNode", pb2.NodeGroupForNodeRequest(), bad),
        ("PricingNodePrice", pb2.PricingNodePriceRequest(node=static), bad),
        ("PricingNodePrice", _period(pb2.PricingNodePriceRequest(node=no_price), 0, 60), nf),
        ("PricingNodePrice", _period(pb2.PricingNodePriceRequest(node=static), 60, 0), bad),
        ("PricingPodPrice", _period(pb2.PricingPodPriceRequest(pod_bytes=b"\xff\xff\xff"), 0, 60), bad),
        ("PricingPodPrice", _period(pb2.PricingPodPriceRequest(), 0, 60), bad),
        ("NodeGroupGetOptions", pb2.NodeGroupAutoscalingOptionsRequest(id="batch-s.small"), unimplemented),
    ]  # fmt: skip
    for method, request, expected in cases:
        assert await h.code(method, request) == expected, (method, request)
    # not a message of the method at all: INVALID_ARGUMENT with the reason, not a crash
    raw = h.channel.unary_unary(f"/{PACKAGE}.CloudProvider/NodeGroupTargetSize")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await raw(b"\x0a\xff\xff", timeout=5.0)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "cannot decode" in (info.value.details() or "")
    # below min size
    await h.client.refresh()
    assert await h.client.target_size("service-s.small") == 3
    assert len(await h.client.node_groups()) == 6  # still serving


async def test_min_size_and_the_total_node_limit(pki: Pki) -> None:
    h = await _start(pki, min_size=1, max_nodes=2)
    try:
        await h.client.increase_size("service-s.small", 2)
        request = h.backend.created[0]
        h.join(request)
        code = await h.code(
            "NodeGroupIncreaseSize", STUBS.pb2.NodeGroupIncreaseSizeRequest(id="batch-s.small", delta=1)
        )
        assert code == grpc.StatusCode.FAILED_PRECONDITION  # 2 of max_nodes 2 already
        node = STUBS.pb2.ExternalGrpcNode(name=request.name, providerID=f"kwok://{request.name}")
        node.labels.update(h.nodes[request.name]["metadata"]["labels"])
        await h.client.delete_nodes("service-s.small", [h.nodes[request.name]])  # 2 -> 1 = min: allowed
        code = await h.code(
            "NodeGroupDeleteNodes",
            STUBS.pb2.NodeGroupDeleteNodesRequest(
                id="service-s.small",
                nodes=[STUBS.pb2.ExternalGrpcNode(providerID=f"kwok://{h.backend.created[1].name}")],
            ),
        )
        assert code == grpc.StatusCode.FAILED_PRECONDITION  # 1 -> 0 < min size 1
    finally:
        await h.channel.close()
        await h.server.stop()


async def test_sizes_wait_for_the_node_list(pki: Pki) -> None:
    h = await _start(pki, synced=False)
    try:
        req = STUBS.pb2.NodeGroupTargetSizeRequest(id="service-s.small")
        assert await h.code("NodeGroupTargetSize", req) == grpc.StatusCode.UNAVAILABLE
        assert len(await h.client.node_groups()) == 6  # what needs no node list is served
    finally:
        await h.channel.close()
        await h.server.stop()


async def test_node_group_options_when_enabled(pki: Pki) -> None:
    h = await _start(pki, options=NodeGroupOptions(scale_down_unneeded_seconds=300, max_node_provision_seconds=900))
    try:
        opts = await h.client.get_options(
            "batch-s.large",
            {
                "scale_down_utilization_threshold": 0.4,
                "scale_down_unneeded_seconds": 600,
                "scale_down_unready_seconds": 1200,
            },
        )
        assert opts is not None and opts.scaleDownUtilizationThreshold == pytest.approx(0.4)
        assert opts.scaleDownUnneededDuration.ToSeconds() == 300 and opts.scaleDownUnneededTime.duration == 300 * 10**9
        assert opts.MaxNodeProvisionDuration.ToSeconds() == 900 and opts.MaxNodeProvisionTime.duration == 900 * 10**9
        assert opts.scaleDownUnreadyDuration.ToSeconds() == 1200 and opts.scaleDownUnreadyTime.duration == 1200 * 10**9
        # CA < 1.34.3 sends only the meta/v1 Durations
        req = STUBS.pb2.NodeGroupAutoscalingOptionsRequest(id="batch-s.large")
        req.defaults.scaleDownUnreadyTime.duration = 60 * 10**9
        res = await h.client.stub.NodeGroupGetOptions(req, timeout=5.0)
        got = res.nodeGroupAutoscalingOptions
        assert got.scaleDownUnreadyDuration.ToSeconds() == 60 and got.scaleDownUnneededTime.duration == 300 * 10**9
        assert await h.code(
            "NodeGroupGetOptions", STUBS.pb2.NodeGroupAutoscalingOptionsRequest(id="batch-s.large")
        ) == (grpc.StatusCode.INVALID_ARGUMENT)
    finally:
        await h.channel.close()
        await h.server.stop()


# ------------------------------------------------------------------------------- the loop reads the ledger


def test_the_dry_run_loop_plans_against_cas_booting_nodes() -> None:
    from tests.test_autoscaler_loop import counter, pod, settings, snap

    s = snap([], [pod("a", "500m", "2Gi"), pod("b", "500m", "2Gi")])
    lone = AutoscalerLoop(settings(dry_run=True), CONFIG.node_groups, name_suffix=counter())
    assert sum(p.pods for p in lone.step(s, 10.0).plans) == 2  # nothing booting: both pods need a node
    state = NodeGroups.build(CATALOGUE, CONFIG.node_groups, name_suffix=_suffix())
    state.increase("service-s.himem", 1, {}, 0.0)  # CA bought one s.himem (16Gi): room for both
    adopted = AutoscalerLoop(settings(dry_run=True), CONFIG.node_groups, name_suffix=counter())
    adopted.adopt_ledger(state.ledger, state.groups_of_ledger(), [("qos-ca-x", 12.0)])
    d = adopted.step(s, 10.0)
    assert d.uncovered[NodeGroup.SERVICE] == 0 and not any(p.pods for p in d.plans)
    assert d.arrived == [("qos-ca-x", 12.0)] and adopted.lag_samples == [12.0]


def test_node_group_rules_are_pure() -> None:
    state = NodeGroups.build(CATALOGUE, CONFIG.node_groups, [NodeGroup.BATCH], max_size=2, name_suffix=_suffix())
    assert list(state.specs) == ["batch-s.small", "batch-s.large", "batch-s.himem"]
    (r,) = state.increase("batch-s.small", 1, {}, 5.0)
    assert r.name == "qos-ca-batch-s-small-0000" and state.target_size("batch-s.small", {}) == 1
    members = {r.name: dict(r.labels)}
    assert state.sync(members, 9.0).arrived == ((r.name, 4.0),)
    with pytest.raises(NodeGroupError) as info:
        state.increase("batch-s.small", 2, members, 9.0)
    assert info.value.code == "FAILED_PRECONDITION" and "max size 2" in info.value.message
    assert state.pod_price_per_hour(Resources(0, 0)) == 0.0


# ---------------------------------------------------------------------------------------------- config


def _cfg(cloud: dict[str, Any] | None, provider: str = "cluster-autoscaler", **expander: Any) -> Any:
    ca: dict[str, Any] = {"cert_file": expander.pop("cert"), "key_file": expander.pop("key"), **expander}
    if cloud is not None:
        ca["cloud_provider"] = cloud
    return parse_autoscaler_config(
        {"autoscaler": {"provider": provider, "cluster_autoscaler": ca}, "flavours": [
            {"name": "f", "cpu": "2", "memory": "4Gi", "price_per_hour": 0.1}]},
        CONFIG,
    )  # fmt: skip


def test_cloud_provider_config(pki: Pki, tmp_path: Path) -> None:
    tls = {"cert_file": str(pki.server_crt), "key_file": str(pki.server_key), "client_ca_file": str(pki.ca_crt)}
    pem = {"cert": str(pki.server_crt), "key": str(pki.server_key)}
    assert _cfg(None, **pem).expander.cloud_provider is None  # absent: not served
    cp = _cfg(tls, **pem).expander.cloud_provider
    assert cp is not None and (cp.listen, cp.backend, cp.min_size, cp.max_size) == ("127.0.0.1:8086", "kwok", 0, 10)
    assert cp.groups == (NodeGroup.SERVICE, NodeGroup.BATCH) and cp.node_group_options is False
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    bad = {
        "cert_file": ({k: v for k, v in tls.items() if k != "cert_file"}, "cloud_provider.cert_file: Field required"),
        "key_file": ({k: v for k, v in tls.items() if k != "key_file"}, "cloud_provider.key_file: Field required"),
        "client_ca_file": (
            {**tls, "client_ca_file": None},
            "cloud_provider.client_ca_file: Input should be a valid string",
        ),
        "missing file": ({**tls, "cert_file": str(tmp_path / "nope.crt")}, "cloud_provider.cert_file: file"),
        "wrong key": (
            {**tls, "key_file": str(pki.client_key)},
            "cloud_provider.cert_file: with key_file, not a matching PEM",
        ),
        "bad bundle": ({**tls, "client_ca_file": str(garbage)}, "cloud_provider.client_ca_file: not a PEM"),
        "groups": ({**tls, "groups": ["gpu"]}, "cloud_provider.groups"),
        "sizes": ({**tls, "min_size": 3, "max_size": 2}, "cloud_provider.max_size"),
        "unknown": ({**tls, "region": "x"}, "cloud_provider.region: unknown option"),
        "same port": ({**tls, "listen": "127.0.0.1:7000"}, "cloud_provider.listen: must differ"),
    }
    for what, (cloud, message) in bad.items():
        with pytest.raises(SettingsError) as info:
            _cfg(cloud, **pem)
        assert message in str(info.value), (what, str(info.value))
    with pytest.raises(SettingsError) as info:
        _cfg(tls, provider="kwok", **pem)
    assert "cloud_provider: only with provider cluster-autoscaler" in str(info.value)


def test_cli_names_the_missing_certificate(pki: Pki, tmp_path: Path) -> None:
    import yaml

    cloud = {"cert_file": str(pki.server_crt), "key_file": str(pki.server_key)}
    doc = {
        "autoscaler": {
            "provider": "cluster-autoscaler",
            "cluster_autoscaler": {
                "cert_file": str(pki.server_crt),
                "key_file": str(pki.server_key),
                "cloud_provider": cloud,
            },
        }
    }
    path = tmp_path / "autoscaler.yaml"
    path.write_text(yaml.safe_dump(doc))
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [str(root / ".venv/bin/qos-extender"), "autoscaler",
         "--autoscaler-config", str(path), "--check-config"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "autoscaler.cluster_autoscaler.cloud_provider.client_ca_file: Field required" in proc.stderr
    cloud["client_ca_file"] = str(pki.ca_crt)
    path.write_text(yaml.safe_dump(doc))
    proc = subprocess.run(
        [str(root / ".venv/bin/qos-extender"), "autoscaler",
         "--autoscaler-config", str(path), "--check-config"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "externalgrpc cloud provider on 127.0.0.1:8086 (mTLS): 12 node groups" in proc.stdout


# ------------------------------------------------------------------------------- config/cluster-autoscaler

CA_DIR = Path(__file__).resolve().parent.parent / "config" / "cluster-autoscaler"


def _docs(path: Path) -> list[dict[str, Any]]:
    import yaml

    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _duration_seconds(text: str) -> float:
    return float(text[:-1]) * {"s": 1, "m": 60, "h": 3600}[text[-1]]


def test_the_cluster_autoscaler_manifests_agree_with_the_sidecar(pki: Pki) -> None:
    """Source-level: the files of config/cluster-autoscaler against each other and the sidecar's loader (the
    rendering and the API server's dry run are e2e/test_manifests.py's job)."""
    import yaml

    from extender.settings.extender import load_config

    extender = load_config(CA_DIR.parent / "autoscaler" / "extender.yaml")
    ours = yaml.safe_load((CA_DIR / "cloud-provider" / "autoscaler.yaml").read_text())
    base = yaml.safe_load((CA_DIR.parent / "autoscaler" / "autoscaler.yaml").read_text())
    cloud = ours["autoscaler"]["cluster_autoscaler"].pop("cloud_provider")
    assert ours == base  # only cloud_provider added to config/autoscaler's (production) file
    ours["autoscaler"]["cluster_autoscaler"]["cloud_provider"] = cloud
    mounts = {"cert_file": pki.server_crt, "key_file": pki.server_key, "client_ca_file": pki.ca_crt}
    stand_in = {**cloud, **{k: str(v) for k, v in mounts.items()}}
    ca_section = {**ours["autoscaler"]["cluster_autoscaler"], "cert_file": str(pki.server_crt)}
    ca_section.update(key_file=str(pki.server_key), cloud_provider=stand_in)
    metrics_tls = {
        **ours["autoscaler"]["metrics"],
        **{k: str(v) for k, v in mounts.items()},
    }  # the deployment's Secret mount, stood in for
    assert Path(ours["autoscaler"]["metrics"]["cert_file"]).parent == Path("/etc/qos-autoscaler/metrics-tls")
    settings = parse_autoscaler_config(
        {**ours, "autoscaler": {**ours["autoscaler"], "cluster_autoscaler": ca_section, "metrics": metrics_tls}},
        extender,
    )
    cp = settings.expander.cloud_provider
    assert cp is not None and cp.listen == "0.0.0.0:8086" and settings.provider == "cluster-autoscaler"

    (service, role, binding) = _docs(CA_DIR / "cloud-provider" / "cloud-provider.yaml")
    (port,) = service["spec"]["ports"]
    assert port["port"] == 8086 and port["targetPort"] == "grpc-cloud"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["create", "delete"]}]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "qos-autoscaler", "namespace": "kube-qos-system"}]
    comp = yaml.safe_load((CA_DIR / "cloud-provider" / "kustomization.yaml").read_text())
    ops = yaml.safe_load(comp["patches"][0]["patch"])
    assert {"name": "grpc-cloud", "containerPort": 8086} in [o["value"] for o in ops]
    (mount,) = [o["value"] for o in ops if o["path"].endswith("volumeMounts/-")]
    assert all(str(Path(cloud[k]).parent) == mount["mountPath"] for k in mounts)

    cloud_config = CloudConfig.load(CA_DIR / "cloud-config.yaml")  # CA's keys, parsed as CA reads them
    svc = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert cloud_config.address == f"{svc}:8086"
    docs = {d["kind"]: d for d in _docs(CA_DIR / "cluster-autoscaler.yaml")}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    args = dict(a.removeprefix("--").split("=", 1) for a in c["args"])
    assert c["image"] == "registry.k8s.io/autoscaling/cluster-autoscaler:v1.35.2"
    assert args["cloud-provider"] == "externalgrpc" and args["expander"] == "grpc"
    mounted = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert args["cloud-config"] == f"{mounted['cloud-config']}/cloud-config.yaml"
    for f in (cloud_config.cert, cloud_config.key, cloud_config.cacert):
        assert str(Path(f).parent) == mounted["externalgrpc-client"]
    assert args["grpc-expander-url"] == "qos-autoscaler-expander.kube-qos-system.svc:7000"
    assert args["grpc-expander-cert"] == f"{mounted['expander-ca']}/ca.crt"
    assert _duration_seconds(args["scale-down-unneeded-time"]) == settings.idle_seconds
    assert _duration_seconds(args["max-node-provision-time"]) == settings.provisioning_timeout_seconds
    assert args["namespace"] == docs["Role"]["metadata"]["namespace"] == "kube-qos-system"
    assert pod["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"] == "cluster-autoscaler"
