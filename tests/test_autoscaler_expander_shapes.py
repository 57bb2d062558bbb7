"""The gRPC expander reads all three request shapes of cluster-autoscaler, byte for byte.

The requests are golden files (tests/golden/ca_expander/): made by a Go program with the real k8s.io/api v0.35.8
types, whose own ``Marshal()`` encodes the Pods and Nodes, and protobuf-go marshalling CA's request structs of
each generation (before 1.34.3: ``Option.pod = 4`` / ``nodeMap = 2``; 1.34.3-1.34.x: those and ``podBytes = 5`` /
``nodeBytesMap = 3``; 1.35+: the bytes fields only). Nothing in them comes from our minimal .proto messages, so
these tests check our decoding against Kubernetes' own encoder, and that the expander really prices every shape.
They are sent over TLS as raw bytes, exactly as they would arrive from CA.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from extender.autoscaler.metrics import AutoscalerMetrics
from extender.autoscaler.providers.cluster_autoscaler import (
    SHAPE_BOTH,
    SHAPE_BYTES,
    SHAPE_MESSAGES,
    ExpanderServer,
    decode_request,
    node_to_dict,
    pod_to_dict,
)
from extender.autoscaler.settings import EXPANDER_MAX_MESSAGE_BYTES
from extender.autoscaler.stubs import load_expander
from extender.core import autoscale
from extender.core.model import Flavour, Resources
from extender.kube.convert import node_from_k8s, pod_from_k8s
from extender.settings.extender import ExtenderConfig
from tests.test_autoscaler_expander import CATALOGUE, CERT, KEY

GOLDEN = Path(__file__).resolve().parent / "golden" / "ca_expander"
MANIFEST = json.loads((GOLDEN / "manifest.json").read_text())
STUBS = load_expander()
METHOD = "/grpcplugin.Expander/BestOptions"

SHAPES = {
    "ca-1.34.2": ("request-ca-1.34.2.bin", SHAPE_MESSAGES),
    "ca-1.34.3": ("request-ca-1.34.3.bin", SHAPE_BOTH),
    "ca-1.35.0": ("request-ca-1.35.0.bin", SHAPE_BYTES),
}


def golden(version: str) -> bytes:
    return (GOLDEN / SHAPES[version][0]).read_bytes()


# ------------------------------------------------------------ a protobuf wire reader/writer, independent of protoc


def varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            return value, i
        shift += 7


def fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, varint value or length-delimited payload) of one message, in wire order."""
    i = 0
    while i < len(data):
        key, i = varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(data, i)
            yield number, value
        elif wire == 2:
            size, i = varint(data, i)
            yield number, data[i : i + size]
            i += size
        else:
            raise AssertionError(f"unexpected wire type {wire} for field {number}")


def put_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def put(number: int, payload: bytes | str | int) -> bytes:
    if isinstance(payload, int):
        return put_varint(number << 3) + put_varint(payload)
    raw = payload.encode() if isinstance(payload, str) else payload
    return put_varint(number << 3 | 2) + put_varint(len(raw)) + raw


# ------------------------------------------------------------------------------------------------ expectations


def expected_pod(facts: dict[str, Any]) -> tuple[int, int]:
    """(cpu milli, memory bytes) the scheduler counts for the pod, from the Go side's own numbers."""
    assert all(facts["SidecarInit"] or [True]), "the fixture has only sidecar init containers"
    parts = [*facts["Containers"], *(facts["InitContainers"] or []), facts["Overhead"]]
    return sum(p.get("cpu", 0) for p in parts), sum(p.get("memory", 0) for p in parts)


def test_golden_requests_have_each_ca_versions_fields() -> None:
    by_version = {v: [list(fields(o)) for n, o in fields(golden(v)) if n == 1] for v in SHAPES}
    top = {v: sorted({n for n, _ in fields(golden(v))}) for v in SHAPES}
    assert top == {"ca-1.34.2": [1, 2], "ca-1.34.3": [1, 2, 3], "ca-1.35.0": [1, 3]}
    for version, options in by_version.items():
        assert [dict(o)[1] for o in options] == [g["id"].encode() for g in MANIFEST["Groups"]]
        numbers = {n for o in options for n, _ in o}
        assert numbers == {"ca-1.34.2": {1, 2, 3, 4}, "ca-1.34.3": {1, 2, 3, 4, 5}, "ca-1.35.0": {1, 2, 3, 5}}[version]
    # the embedded messages of the old fields are byte-identical to pod.Marshal(): one decoder serves all shapes
    old = [p for n, p in by_version["ca-1.34.2"][0] if n == 4]
    both4 = [p for n, p in by_version["ca-1.34.3"][0] if n == 4]
    both5 = [p for n, p in by_version["ca-1.34.3"][0] if n == 5]
    new = [p for n, p in by_version["ca-1.35.0"][0] if n == 5]
    assert len(new) == 5 and old == both4 == both5 == new
    # and the raw objects carry no "k8s\x00" envelope: they start with ObjectMeta (field 1, length-delimited)
    assert all(isinstance(p, bytes) and p[:1] == b"\x0a" for p in new)


@pytest.mark.parametrize("version", sorted(SHAPES))
def test_decoding_matches_what_k8s_api_encoded(version: str) -> None:
    request = STUBS.pb2.BestOptionsRequest.FromString(golden(version))
    decoded = decode_request(request)
    assert decoded.shape == SHAPES[version][1]
    assert decoded.problems == ()
    assert [(o.node_group_id, o.node_count) for o in decoded.options] == [
        (g["id"], g["count"]) for g in MANIFEST["Groups"]
    ]
    cfg = ExtenderConfig()
    for option in decoded.options:
        assert len(option.pods) == len(MANIFEST["Pods"])
        for msg, facts in zip(option.pods, MANIFEST["Pods"], strict=True):
            assert (msg.metadata.namespace, msg.metadata.name, msg.metadata.uid) == (
                facts["Namespace"],
                facts["Name"],
                facts["UID"],
            )
            assert dict(msg.metadata.labels) == facts["Labels"]
            assert dict(msg.metadata.annotations) == facts["Annotations"]
            assert (msg.spec.schedulerName, msg.spec.priority, msg.status.phase) == (
                facts["SchedulerName"],
                facts["Priority"],
                facts["Phase"],
            )
            pod, problems = pod_from_k8s(pod_to_dict(msg), cfg.pod_defaults, cfg.policy.classes)
            assert problems == ()
            cpu, memory = expected_pod(facts)
            assert pod.requests == Resources.request(cpu, memory)
            assert pod.request_id == f"{facts['Namespace']}/{facts['ControllerKind']}/{facts['ControllerName']}"
            assert (pod.priority, pod.class_name, pod.kind.value) == (facts["Priority"], "silver", "service")
    assert sorted(decoded.templates) == sorted(MANIFEST["Nodes"])
    for group_id, msg in decoded.templates.items():
        facts = MANIFEST["Nodes"][group_id]
        assert (msg.metadata.name, dict(msg.metadata.labels)) == (facts["Name"], facts["Labels"])
        assert dict(msg.metadata.annotations) == facts["Annotations"]
        node = node_from_k8s(node_to_dict(msg), cfg.node_groups)
        alloc = facts["Allocatable"]
        assert node.allocatable == Resources(alloc["cpu"], alloc["memory"], alloc["pods"])
        assert node.flavour == facts["Labels"]["node.kubernetes.io/instance-type"]


# ------------------------------------------------------------------------------------------------------ over TLS


@pytest.fixture
async def raw_expander() -> AsyncIterator[tuple[ExpanderServer, Any]]:
    """The server, and a BestOptions call that sends bytes as they are (CA's request, already serialized)."""
    server = ExpanderServer(
        ExtenderConfig(),
        CATALOGUE,
        autoscale.ScoreWeights(),
        listen="127.0.0.1:0",
        credentials=grpc.ssl_server_credentials([(KEY, CERT)]),
        max_message_bytes=EXPANDER_MAX_MESSAGE_BYTES,
        metrics=AutoscalerMetrics(),
    )
    port = await server.start()
    channel = grpc.aio.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(root_certificates=CERT))
    call = channel.unary_unary(
        METHOD, request_serializer=lambda b: b, response_deserializer=STUBS.pb2.BestOptionsResponse.FromString
    )
    try:
        yield server, call
    finally:
        await channel.close()
        await server.stop()


def planner_choice(container: dict[str, int] | None = None) -> str:
    """The flavour our planner buys first for the golden pods, from the Go side's numbers (not our decoding).

    ``container``: the requests of every pod's app container, if they are changed from the golden ones.
    """
    from extender.core.model import Pod

    facts = [{**p, "Containers": [container]} if container else p for p in MANIFEST["Pods"]]
    pods = [Pod(p["Name"], Resources.request(*expected_pod(p)), namespace=p["Namespace"]) for p in facts]
    other = MANIFEST["Nodes"]["ng-other"]
    flavours = [
        *CATALOGUE,
        Flavour(
            "x.unknown",
            Resources(other["Allocatable"]["cpu"], other["Allocatable"]["memory"], other["Allocatable"]["pods"]),
            float(other["Annotations"]["qos.kube-qos-extender.io/price-per-hour"]),
        ),
    ]
    return autoscale.plan_pods(pods, flavours, autoscale.ScoreWeights()).nodes[0][0].name


@pytest.mark.parametrize("version", sorted(SHAPES))
async def test_expander_prices_every_shape(raw_expander: tuple[ExpanderServer, Any], version: str) -> None:
    server, call = raw_expander
    # 5 pods of 3 GiB: one s.himem ($0.20) holds them all; 5 s.small ($0.50) or 1 s.large ($0.36) cost more,
    # and ng-himem is neither first nor last in CA's order: returning the options unchanged cannot pass
    assert planner_choice() == "s.himem"
    reply = await call(golden(version), timeout=5.0)
    assert [o.nodeGroupId for o in reply.options] == ["ng-himem"]
    assert reply.options[0].nodeCount == 1
    assert reply.options[0].debug.startswith("ng-himem: 1 node(s) help 5 pod(s) | qos-extender: plan 1xs.himem")
    assert server.last_choice is not None and server.last_choice.flavour == "s.himem"
    text = server.metrics.exposition().decode() if server.metrics else ""
    assert 'qos_extender_autoscaler_expander_requests_total{outcome="ok"} 1.0' in text


async def test_both_fields_prefer_the_bytes(raw_expander: tuple[ExpanderServer, Any]) -> None:
    _, call = raw_expander
    request = STUBS.pb2.BestOptionsRequest.FromString(golden("ca-1.34.3"))
    for option in request.options:  # make the embedded pods CPU-heavy: were they read, s.large would win
        for pod in option.pod:
            pod.spec.containers[0].resources.requests["cpu"].string = "1900m"
            pod.spec.containers[0].resources.requests["memory"].string = "512Mi"
    assert planner_choice({"cpu": 1900, "memory": 512 * 2**20}) == "s.large"
    reply = await call(request.SerializeToString(), timeout=5.0)
    assert [o.nodeGroupId for o in reply.options] == ["ng-himem"]
    # bytes that are not a Pod (e.g. a string, as an unmerged upstream PR once put in field 5): the pod field is used
    for option in request.options:
        option.podBytes[:] = [b"my-similar-asg.t2.micro"] * len(option.podBytes)
    reply = await call(request.SerializeToString(), timeout=5.0)
    assert [o.nodeGroupId for o in reply.options] == ["ng-large"]
    assert "podBytes do not decode as a Pod, used its pod field" in reply.options[0].debug


def error_of(exc: pytest.ExceptionInfo[grpc.aio.AioRpcError]) -> tuple[grpc.StatusCode, str]:
    return exc.value.code(), exc.value.details() or ""


async def test_unusable_requests_get_invalid_argument(raw_expander: tuple[ExpanderServer, Any]) -> None:
    server, call = raw_expander
    option = put(1, put(1, "ng-a") + put(2, 1) + put(6, b"\x0a\x03\x0a\x01p"))  # pods in a field we do not know
    cases = {
        "garbage": (b"\xff\xff\xff\xff", "cannot decode BestOptionsRequest (4 bytes)"),
        "empty": (b"", "BestOptionsRequest has no options"),
        "unknown shape": (option + put(4, put(1, "ng-a")), "unknown cluster-autoscaler message shape"),
        "garbage entries": (
            put(1, put(1, "ng-a") + put(5, b"\x00\x01garbage")) + put(3, put(1, "ng-a") + put(2, b"\x07\x07")),
            "none of the 1 pod and 1 node entries decodes",
        ),
        "k8s envelope": (
            put(1, put(1, "ng-a") + put(5, b"k8s\x00" + put(1, put(1, "v1") + put(2, "Pod"))))
            + put(3, put(1, "ng-a") + put(2, b"k8s\x00\x0a\x00")),
            "none of the 1 pod and 1 node entries decodes",
        ),
    }
    for name, (data, message) in cases.items():
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await call(data, timeout=5.0)
        code, details = error_of(exc)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, name
        assert message in details, (name, details)
    text = server.metrics.exposition().decode() if server.metrics else ""
    assert f'qos_extender_autoscaler_expander_requests_total{{outcome="invalid"}} {float(len(cases))}' in text
    reply = await call(golden("ca-1.35.0"), timeout=5.0)  # and the server still answers
    assert [o.nodeGroupId for o in reply.options] == ["ng-himem"]


async def test_unpriceable_options_come_back_unchanged_with_the_reason_logged(
    raw_expander: tuple[ExpanderServer, Any], caplog: pytest.LogCaptureFixture
) -> None:
    server, call = raw_expander
    request = STUBS.pb2.BestOptionsRequest.FromString(golden("ca-1.35.0"))
    del request.nodeBytesMap["ng-himem"]  # the template of ng-himem is missing: the others are priced without it
    reply = await call(request.SerializeToString(), timeout=5.0)
    assert [o.nodeGroupId for o in reply.options] == ["ng-large"]
    request.nodeBytesMap.clear()  # pods but no template nodes: nothing can be priced
    with caplog.at_level(logging.WARNING, logger="extender.autoscaler.expander"):
        reply = await call(request.SerializeToString(), timeout=5.0)
    assert [o.nodeGroupId for o in reply.options] == [g["id"] for g in MANIFEST["Groups"]]
    assert any("kept all options: no option could be priced" in r.getMessage() for r in caplog.records)
    text = server.metrics.exposition().decode() if server.metrics else ""
    assert 'qos_extender_autoscaler_expander_requests_total{outcome="kept_all"} 1.0' in text
