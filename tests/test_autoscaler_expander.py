"""The cluster-autoscaler gRPC expander over real TLS, called the way CA's grpcplugin client calls it.

cluster-autoscaler itself cannot be built here (hack/README.md, extender/autoscaler/README.md), so the client
is CA's call reproduced with our generated stubs: ``NewClientTLSFromFile(cert)`` trust, a 5 s deadline, and
CA 1.35's ``BestOptionsRequest{options[].podBytes, nodeBytesMap}`` (serialized Pods / Nodes). These tests build
the Pods and Nodes with our minimal messages; tests/test_autoscaler_expander_shapes.py checks every request shape
of CA against bytes from k8s.io/api itself.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from extender.autoscaler.metrics import AutoscalerMetrics
from extender.autoscaler.providers.cluster_autoscaler import ExpanderServer, choose
from extender.autoscaler.settings import EXPANDER_MAX_MESSAGE_BYTES
from extender.autoscaler.stubs import load_expander
from extender.core import autoscale
from extender.core.model import Flavour, Pod, Resources
from extender.settings.extender import ExtenderConfig

GI = 2**30
SMALL = Flavour("s.small", Resources(2000, 4 * GI, 110), 0.10)
LARGE = Flavour("s.large", Resources(8000, 16 * GI, 110), 0.36)
HIMEM = Flavour("s.himem", Resources(2000, 16 * GI, 110), 0.20)
CATALOGUE = [SMALL, LARGE, HIMEM]
STUBS = load_expander()


def self_signed() -> tuple[bytes, bytes]:
    """A throwaway serving certificate for 127.0.0.1 (openssl, as hack/local-up.sh makes its certificates)."""
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = Path(tmp) / "c.pem", Path(tmp) / "k.pem"
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                str(key),
                "-out",
                str(cert),
                "-days",
                "1",
                "-subj",
                "/CN=qos-expander",
                "-addext",
                "subjectAltName=IP:127.0.0.1,DNS:localhost",
            ],
            check=True,
            capture_output=True,
        )
        return cert.read_bytes(), key.read_bytes()


CERT, KEY = self_signed()


def pod_msg(name: str, cpu: str, memory: str) -> Any:
    p = STUBS.core.Pod()
    p.metadata.name = name
    p.metadata.namespace = "default"
    p.metadata.uid = f"uid-{name}"
    c = p.spec.containers.add()
    c.name = "c"
    c.resources.requests["cpu"].string = cpu
    c.resources.requests["memory"].string = memory
    p.spec.schedulerName = "qos-scheduler"
    p.status.phase = "Pending"
    return p


def template(flavour: Flavour | None, cpu: str, memory: str, price: str | None = None) -> Any:
    n = STUBS.core.Node()
    n.metadata.name = f"template-{flavour.name if flavour else 'x'}"
    if flavour is not None:
        n.metadata.labels["node.kubernetes.io/instance-type"] = flavour.name
    if price is not None:
        n.metadata.annotations["qos.kube-qos-extender.io/price-per-hour"] = price
    for field in (n.status.allocatable, n.status.capacity):
        field["cpu"].string = cpu
        field["memory"].string = memory
        field["pods"].string = "110"
    return n


def request(groups: dict[str, tuple[Any, int]], pods: list[Any]) -> Any:
    req = STUBS.pb2.BestOptionsRequest()
    for group_id, (node, count) in groups.items():
        option = req.options.add()
        option.nodeGroupId = group_id
        option.nodeCount = count
        option.debug = f"CA option {group_id}"
        option.podBytes.extend(p.SerializeToString() for p in pods)
        req.nodeBytesMap[group_id] = node.SerializeToString()
    return req


@pytest.fixture
async def expander() -> AsyncIterator[tuple[ExpanderServer, Any]]:
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
    # CA: credentials.NewClientTLSFromFile(expanderCert, "") -> the cert is the trust root
    channel = grpc.aio.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(root_certificates=CERT))
    try:
        yield server, STUBS.grpc.ExpanderStub(channel)
    finally:
        await channel.close()
        await server.stop()


async def test_expander_picks_the_planners_flavour_over_tls(expander: tuple[ExpanderServer, Any]) -> None:
    server, stub = expander
    # memory-heavy pods: the himem flavour absorbs the most demand per dollar
    pods = [pod_msg(f"p{i}", "250m", "3Gi") for i in range(5)]
    groups = {
        "ng-small": (template(SMALL, "2", "4Gi"), 5),
        "ng-large": (template(LARGE, "8", "16Gi"), 1),
        "ng-himem": (template(HIMEM, "2", "16Gi"), 1),
    }
    started = time.perf_counter()
    reply = await stub.BestOptions(request(groups, pods), timeout=5.0)
    elapsed = time.perf_counter() - started
    core_pods = [Pod(f"p{i}", Resources.request(250, 3 * GI), uid=f"uid-p{i}") for i in range(5)]
    expected = autoscale.plan_pods(core_pods, CATALOGUE, autoscale.ScoreWeights()).nodes[0][0].name
    assert expected == "s.himem"
    assert [o.nodeGroupId for o in reply.options] == ["ng-himem"]
    assert reply.options[0].nodeCount == 1 and "qos-extender" in reply.options[0].debug
    assert elapsed < 1.0
    assert server.last_choice is not None and server.last_choice.flavour == "s.himem"
    text = server.metrics.exposition().decode() if server.metrics else ""
    assert 'qos_extender_autoscaler_expander_choices_total{flavour="s.himem"} 1.0' in text


async def test_cpu_heavy_pods_prefer_another_flavour(expander: tuple[ExpanderServer, Any]) -> None:
    _, stub = expander
    pods = [pod_msg(f"c{i}", "1900m", "512Mi") for i in range(8)]
    groups = {"ng-small": (template(SMALL, "2", "4Gi"), 8), "ng-himem": (template(HIMEM, "2", "16Gi"), 8)}
    reply = await stub.BestOptions(request(groups, pods), timeout=5.0)
    assert [o.nodeGroupId for o in reply.options] == ["ng-small"]


async def test_unknown_groups_use_template_price_or_are_kept(expander: tuple[ExpanderServer, Any]) -> None:
    _, stub = expander
    pods = [pod_msg("m", "500m", "1Gi")]
    # not in our catalogue, but priced by annotation -> comparable; the cheap one wins
    groups = {"ng-a": (template(None, "2", "4Gi", price="0.50"), 1), "ng-b": (template(None, "2", "4Gi", "0.05"), 1)}
    reply = await stub.BestOptions(request(groups, pods), timeout=5.0)
    assert [o.nodeGroupId for o in reply.options] == ["ng-b"]
    # nothing priceable: every option is kept (CA's own behaviour on an error)
    groups = {"ng-a": (template(None, "2", "4Gi"), 1), "ng-b": (template(None, "2", "4Gi"), 1)}
    reply = await stub.BestOptions(request(groups, pods), timeout=5.0)
    assert sorted(o.nodeGroupId for o in reply.options) == ["ng-a", "ng-b"]


async def test_plaintext_clients_are_refused(expander: tuple[ExpanderServer, Any]) -> None:
    server, _ = expander
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError):
            await STUBS.grpc.ExpanderStub(channel).BestOptions(STUBS.pb2.BestOptionsRequest(), timeout=2.0)


async def test_large_request_answers_well_under_cas_5s(expander: tuple[ExpanderServer, Any]) -> None:
    _, stub = expander
    pods = [pod_msg(f"p{i}", f"{100 + (i % 7) * 150}m", f"{256 + (i % 5) * 512}Mi") for i in range(300)]
    groups = {
        f"ng-{i}": (template(CATALOGUE[i % 3], *(("2", "4Gi"), ("8", "16Gi"), ("2", "16Gi"))[i % 3]), 3)
        for i in range(30)
    }
    started = time.perf_counter()
    reply = await stub.BestOptions(request(groups, pods), timeout=5.0)
    elapsed = time.perf_counter() - started
    assert len(reply.options) == 1
    assert elapsed < 1.5, f"BestOptions took {elapsed:.2f}s for 30 options x 300 pods"


def test_choose_is_pure_and_deterministic() -> None:
    from extender.autoscaler.providers.cluster_autoscaler import OptionView
    from extender.core.model import Node

    pods = tuple(Pod(f"p{i}", Resources.request(250, 3 * GI)) for i in range(4))
    views = [
        OptionView("b", 1, pods, Node("t", HIMEM.capacity, flavour="s.himem")),
        OptionView("a", 1, pods, Node("t", HIMEM.capacity, flavour="s.himem")),
        OptionView("c", 2, pods, Node("t", SMALL.capacity, flavour="s.small")),
    ]
    first = choose(views, CATALOGUE, autoscale.ScoreWeights())
    assert first == choose(list(reversed(views)), CATALOGUE, autoscale.ScoreWeights())
    assert first.chosen == ("a",)  # same flavour and pods: fewer nodes, then the id
