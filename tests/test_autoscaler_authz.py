"""Adversarial tests of the autoscaler sidecar's servers: each identity we issue, and some we do not, on each route.

Servers (real, on 127.0.0.1, real TLS with certificates made here by openssl; no mocks):
* the gRPC expander (``ExpanderServer``): server-side TLS only, because cluster-autoscaler's grpcplugin presents no
  client certificate: every caller is answered, and the receive limit is what protects it;
* the externalgrpc cloud provider (``CloudProviderServer``): mTLS, and only the identities of ``clients``;
* the metrics listener (``serve_metrics``, the sidecar's own /metrics, /healthz, /readyz): HTTPS, /metrics only
  for the scraper identities, the probes anonymous.

Identities: cluster-autoscaler's client certificate (CN cluster-autoscaler), Prometheus' scrape certificate
(CN prometheus-extender-client), a certificate of another CA that copies CA's CN, and none. Each refusal is
checked twice: the status the caller sees and the metric that counts it.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from extender.autoscaler.metrics import AutoscalerMetrics
from extender.autoscaler.nodegroups import NodeGroups
from extender.autoscaler.protos import expander_pb2, externalgrpc_pb2
from extender.autoscaler.protos import k8s_core_v1_minimal_pb2 as core
from extender.autoscaler.providers.cluster_autoscaler import ExpanderServer
from extender.autoscaler.providers.externalgrpc import CloudProviderServer
from extender.autoscaler.providers.grpc_guard import ReloadingServerCredentials
from extender.autoscaler.providers.kwok import node_manifest
from extender.autoscaler.settings import MetricsSettings
from extender.autoscaler.view import AutoscalerSnapshot
from extender.core import autoscale
from extender.processes.sidecar import _metrics_app, serve_metrics
from extender.tls import CertificateFiles
from tests.test_autoscaler_externalgrpc import CATALOGUE, CONFIG, STATIC, RecordingBackend

EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
CA_CN = "cluster-autoscaler"
PROMETHEUS_CN = "prometheus-extender-client"
LIMIT = 64 * 1024  # the smallest receive limit the settings allow: oversized requests stay small in tests
EXPANDER = expander_pb2.DESCRIPTOR.services_by_name["Expander"]
CLOUD = externalgrpc_pb2.DESCRIPTOR.services_by_name["CloudProvider"]
CLOUD_METHODS = tuple(m.name for m in CLOUD.methods)


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


@dataclass(frozen=True)
class Pki:
    d: Path

    def cert(self, name: str) -> tuple[Path, Path]:
        return self.d / f"{name}.crt", self.d / f"{name}.key"


def _leaf(d: Path, name: str, cn: str, ca: str, ext: str) -> None:
    _openssl("req", *EC, "-keyout", d / f"{name}.key", "-out", d / f"{name}.csr", "-subj", f"/CN={cn}")
    (d / f"{name}.ext").write_text(ext)
    _openssl(
        "x509", "-req", "-in", d / f"{name}.csr", "-CA", d / f"{ca}.crt", "-CAkey", d / f"{ca}.key",
        "-CAcreateserial", "-out", d / f"{name}.crt", "-days", "1", "-extfile", d / f"{name}.ext",
    )  # fmt: skip


def make_pki(d: Path) -> Pki:
    for ca in ("ca", "rogue"):
        _openssl("req", "-x509", *EC, "-keyout", d / f"{ca}.key", "-out", d / f"{ca}.crt", "-days", "1",
                 "-subj", f"/CN={ca}")  # fmt: skip
    server = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    client = "extendedKeyUsage=clientAuth\n"
    _leaf(d, "server", "qos-autoscaler", "ca", server)
    _leaf(d, "server2", "qos-autoscaler-renewed", "ca", server)  # the renewal the reload tests roll in
    _leaf(d, "ca-client", CA_CN, "ca", client)
    _leaf(d, "prometheus", PROMETHEUS_CN, "ca", client)
    _leaf(d, "rogue-client", CA_CN, "rogue", client)  # CA's name, another CA's signature
    return Pki(d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("authz-pki"))


IDENTITIES = ("cluster-autoscaler", "prometheus", "other-ca", "none")
_CERT_OF = {"cluster-autoscaler": "ca-client", "prometheus": "prometheus", "other-ca": "rogue-client"}


def _channel(pki: Pki, port: int, identity: str) -> grpc.aio.Channel:
    root = (pki.d / "ca.crt").read_bytes()
    if identity == "none":
        creds = grpc.ssl_channel_credentials(root_certificates=root)
    else:
        crt, key = pki.cert(_CERT_OF[identity])
        creds = grpc.ssl_channel_credentials(root, key.read_bytes(), crt.read_bytes())
    return grpc.aio.secure_channel(f"127.0.0.1:{port}", creds)


async def _call(channel: grpc.aio.Channel, service: str, method: str, body: bytes) -> grpc.StatusCode:
    call = channel.unary_unary(f"/{service}/{method}", request_serializer=None, response_deserializer=None)
    try:
        await call(body, timeout=60.0)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _refused(metrics: AutoscalerMetrics, server: str, method: str, reason: str) -> float:
    labels = {"server": server, "method": method, "reason": reason}
    return metrics.registry.get_sample_value("qos_extender_autoscaler_refused_calls_total", labels) or 0.0


def _reloads(metrics: AutoscalerMetrics, listener: str, result: str) -> float:
    labels = {"listener": listener, "result": result}
    return metrics.registry.get_sample_value("qos_extender_certificate_reloads_total", labels) or 0.0


# ------------------------------------------------------------------------------------------------- servers


@dataclass
class Servers:
    expander: ExpanderServer
    cloud: CloudProviderServer
    metrics: AutoscalerMetrics
    files: dict[str, CertificateFiles]


@pytest.fixture
async def servers(pki: Pki, tmp_path: Path) -> AsyncIterator[Servers]:
    # live copies of the serving pair: the reload tests replace them in place, as a Secret update does
    for name in ("server.crt", "server.key", "ca.crt"):
        (tmp_path / name).write_bytes((pki.d / name).read_bytes())
    exp_files = CertificateFiles(str(tmp_path / "server.crt"), str(tmp_path / "server.key"))
    cloud_files = CertificateFiles(str(tmp_path / "server.crt"), str(tmp_path / "server.key"), str(tmp_path / "ca.crt"))
    metrics = AutoscalerMetrics()
    expander = ExpanderServer(
        CONFIG,
        CATALOGUE,
        autoscale.ScoreWeights(),
        listen="127.0.0.1:0",
        credentials=ReloadingServerCredentials(
            exp_files, client_auth=False, on_reload=metrics.reloaded("expander")
        ).credentials,
        max_message_bytes=LIMIT,
        metrics=metrics,
    )
    snapshot = AutoscalerSnapshot(CONFIG)
    snapshot.replace_nodes([STATIC], "1")
    state = NodeGroups.build(CATALOGUE, CONFIG.node_groups, max_size=3, min_size=0, provisioning_timeout_seconds=60.0,
                             max_nodes=5)  # fmt: skip
    cloud = CloudProviderServer(
        CONFIG,
        state,
        snapshot,
        RecordingBackend(),
        node_manifest,
        listen="127.0.0.1:0",
        credentials=ReloadingServerCredentials(
            cloud_files, client_auth=True, on_reload=metrics.reloaded("cloudprovider")
        ).credentials,
        clients=(CA_CN,),
        max_message_bytes=LIMIT,
        gpu_label="qos.kube-qos-extender.io/accelerator",
        metrics=metrics,
    )
    await expander.start()
    await cloud.start()
    try:
        yield Servers(expander, cloud, metrics, {"expander": exp_files, "cloudprovider": cloud_files})
    finally:
        await expander.stop()
        await cloud.stop()


def _best_options(pad: int = 0) -> bytes:
    """A BestOptions request of CA 1.35's shape: one option and its template node as bytes (``pad`` more bytes of
    debug text make it as large as a test needs)."""
    node = core.Node()
    node.metadata.name = "template-service-small"
    for key, value in (("cpu", "2"), ("memory", "4Gi"), ("pods", "110")):
        node.status.allocatable[key].string = value
    req = expander_pb2.BestOptionsRequest()
    option = req.options.add()
    option.nodeGroupId = "service-small"
    option.nodeCount = 1
    option.debug = "x" * pad
    req.nodeBytesMap["service-small"] = node.SerializeToString()
    return req.SerializeToString()


# ------------------------------------------------------------------------------------- cloud provider (mTLS)


@pytest.mark.parametrize("method", CLOUD_METHODS)
async def test_authz_cloud_provider_answers_cluster_autoscaler_only(servers: Servers, pki: Pki, method: str) -> None:
    """Every CloudProvider method: CA's certificate is served (whatever the method answers to an empty request:
    never PERMISSION_DENIED), Prometheus' certificate of the same CA gets PERMISSION_DENIED, counted; a certificate
    of another CA and no certificate fail the TLS handshake (UNAVAILABLE: no call reaches the server, nothing is
    counted there)."""
    service = CLOUD.full_name
    codes: dict[str, grpc.StatusCode] = {}
    for identity in IDENTITIES:
        channel = _channel(pki, servers.cloud.port, identity)
        try:
            codes[identity] = await _call(channel, service, method, b"")
        finally:
            await channel.close()
    assert codes["cluster-autoscaler"] not in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAVAILABLE)
    assert codes["prometheus"] == grpc.StatusCode.PERMISSION_DENIED
    assert codes["other-ca"] == grpc.StatusCode.UNAVAILABLE
    assert codes["none"] == grpc.StatusCode.UNAVAILABLE
    assert _refused(servers.metrics, "cloudprovider", method, "permission_denied") == 1
    assert servers.cloud.guard.calls.get(method) == 1  # only CA's call was read


async def test_authz_cloud_provider_refuses_an_oversized_request_counted(servers: Servers, pki: Pki) -> None:
    """A request above max_message_bytes: RESOURCE_EXHAUSTED for CA (counted too_large, CA is not served silently
    less); the same bytes from Prometheus' certificate are refused for who it is first."""
    node = externalgrpc_pb2.NodeGroupForNodeRequest()
    node.node.name = "n"
    node.node.annotations["big"] = "x" * (LIMIT + 1)
    body = node.SerializeToString()
    small = externalgrpc_pb2.NodeGroupForNodeRequest()
    small.node.name = "static-1"
    for identity, want, reason in (
        ("cluster-autoscaler", grpc.StatusCode.RESOURCE_EXHAUSTED, "too_large"),
        ("prometheus", grpc.StatusCode.PERMISSION_DENIED, "permission_denied"),
    ):
        channel = _channel(pki, servers.cloud.port, identity)
        try:
            assert await _call(channel, CLOUD.full_name, "NodeGroupForNode", body) == want
            # the connection stays usable: the next (small) call of CA is answered
            if identity == "cluster-autoscaler":
                ok = await _call(channel, CLOUD.full_name, "NodeGroupForNode", small.SerializeToString())
                assert ok == grpc.StatusCode.OK
        finally:
            await channel.close()
        assert _refused(servers.metrics, "cloudprovider", "NodeGroupForNode", reason) == 1
    assert servers.cloud.guard.largest["NodeGroupForNode"] == len(small.SerializeToString())


async def test_authz_cloud_provider_counts_an_undecodable_request(servers: Servers, pki: Pki) -> None:
    """Counted by the time the caller has its answer, every time: grpc.aio's abort sends the status before it
    raises, so a count taken where the exception is caught raced the caller (seen once in a loaded unit run)."""
    channel = _channel(pki, servers.cloud.port, "cluster-autoscaler")
    try:
        for i in range(1, 31):
            code = await _call(channel, CLOUD.full_name, "NodeGroupForNode", b"\xff\xff\xff")
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert _refused(servers.metrics, "cloudprovider", "NodeGroupForNode", "invalid_argument") == i
    finally:
        await channel.close()


# ---------------------------------------------------------------------------------- expander (server TLS only)


async def test_authz_expander_answers_every_identity_by_design(servers: Servers, pki: Pki) -> None:
    """CA's grpcplugin dials with server-side TLS only and presents no certificate, so the expander asks for none:
    every identity is answered alike (it only ranks the options it is given); what bounds a caller is the receive
    limit (next test)."""
    for identity in IDENTITIES:
        if identity == "other-ca":
            continue  # a client certificate is never asked for: the same handshake as "none"
        channel = _channel(pki, servers.expander.port, identity)
        try:
            assert await _call(channel, EXPANDER.full_name, "BestOptions", _best_options()) == grpc.StatusCode.OK
        finally:
            await channel.close()
    assert servers.expander.guard.calls["BestOptions"] == 3
    assert not [s for s in _samples(servers.metrics, "qos_extender_autoscaler_refused_calls_total") if s.value]


async def test_authz_expander_refuses_an_oversized_request_counted(servers: Servers, pki: Pki) -> None:
    """Above max_message_bytes: the caller sees RESOURCE_EXHAUSTED (CA would fall back to its own choice) and the
    refusal is counted; below it, the size is in the histogram."""
    channel = _channel(pki, servers.expander.port, "none")
    try:
        assert await _call(channel, EXPANDER.full_name, "BestOptions", _best_options(pad=LIMIT)) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED
        )
        small = _best_options(pad=1000)
        assert await _call(channel, EXPANDER.full_name, "BestOptions", small) == grpc.StatusCode.OK
        assert await _call(channel, EXPANDER.full_name, "BestOptions", b"") == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await channel.close()
    assert _refused(servers.metrics, "expander", "BestOptions", "too_large") == 1
    assert _refused(servers.metrics, "expander", "BestOptions", "invalid_argument") == 1
    labels = {"server": "expander", "method": "BestOptions"}
    assert servers.metrics.registry.get_sample_value("qos_extender_autoscaler_grpc_message_bytes_count", labels) == 2
    assert servers.expander.guard.largest["BestOptions"] == len(small)


def _samples(metrics: AutoscalerMetrics, name: str) -> list[Any]:
    return [s for family in metrics.registry.collect() for s in family.samples if s.name == name]


# ------------------------------------------------------------------------------------------ certificate reload


def _served_certificate(port: int) -> bytes:
    """The certificate a new TLS handshake with 127.0.0.1:port is served (DER), as any client sees it."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=60) as raw, ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def _der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


async def test_grpc_servers_reload_their_certificates_when_the_files_change(servers: Servers, pki: Pki) -> None:
    for port in (servers.expander.port, servers.cloud.port):
        assert await asyncio.to_thread(_served_certificate, port) == _der(pki.d / "server.crt")
    files = servers.files["cloudprovider"]
    Path(files.key).write_bytes((pki.d / "server2.key").read_bytes())
    Path(files.cert).write_bytes((pki.d / "server2.crt").read_bytes())
    for port in (servers.expander.port, servers.cloud.port):
        served = await asyncio.to_thread(_served_certificate, port)
        assert served == _der(pki.d / "server2.crt")
    assert _reloads(servers.metrics, "expander", "ok") == 1
    assert _reloads(servers.metrics, "cloudprovider", "ok") == 1
    # CA's calls go on over the renewed certificate
    channel = _channel(pki, servers.cloud.port, "cluster-autoscaler")
    try:
        assert await _call(channel, CLOUD.full_name, "NodeGroups", b"") == grpc.StatusCode.OK
    finally:
        await channel.close()
    # a half-written pair (the key of another certificate) is refused and counted; the renewed one stays served
    Path(files.key).write_bytes((pki.d / "server.key").read_bytes())
    assert await asyncio.to_thread(_served_certificate, servers.cloud.port) == _der(pki.d / "server2.crt")
    assert _reloads(servers.metrics, "cloudprovider", "failed") >= 1


# ----------------------------------------------------------------------------------------- metrics over HTTPS


@dataclass
class MetricsServer:
    port: int
    metrics: AutoscalerMetrics
    reloader: Any
    cert: Path
    key: Path


@pytest.fixture
async def metrics_server(pki: Pki, tmp_path: Path) -> AsyncIterator[MetricsServer]:
    for name in ("server.crt", "server.key"):
        (tmp_path / name).write_bytes((pki.d / name).read_bytes())
    mset = MetricsSettings(
        port=0,
        cert_file=str(tmp_path / "server.crt"),
        key_file=str(tmp_path / "server.key"),
        client_ca_file=str(pki.d / "ca.crt"),
    )
    metrics = AutoscalerMetrics()
    app = _metrics_app(lambda: None, AutoscalerSnapshot(CONFIG), metrics, mset)
    runner, port, reloader = await serve_metrics(app, mset, metrics)
    try:
        yield MetricsServer(port, metrics, reloader, tmp_path / "server.crt", tmp_path / "server.key")
    finally:
        await runner.cleanup()


def _client_ssl(pki: Pki, identity: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.d / "ca.crt"))
    if identity != "none":
        crt, key = pki.cert(_CERT_OF[identity])
        ctx.load_cert_chain(str(crt), str(key))
    return ctx


async def _get(pki: Pki, port: int, path: str, identity: str) -> int | str:
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"https://127.0.0.1:{port}{path}", ssl=_client_ssl(pki, identity)) as response,
        ):
            await response.read()
            return response.status
    except aiohttp.ClientError as exc:
        return f"tls: {type(exc).__name__}"


@pytest.mark.parametrize("path", ["/metrics", "/healthz", "/readyz"])
async def test_authz_metrics_listener(metrics_server: MetricsServer, pki: Pki, path: str) -> None:
    """/metrics: Prometheus' certificate only (200); CA's certificate of the same CA 403 (permission_denied), no
    certificate 403 (no_certificate), both counted. The probes answer without a certificate (200; /readyz 503 until
    the first scan). A certificate of another CA fails the handshake on every path."""
    got = {identity: await _get(pki, metrics_server.port, path, identity) for identity in IDENTITIES}
    assert isinstance(got["other-ca"], str) and got["other-ca"].startswith("tls")
    if path == "/metrics":
        assert (got["prometheus"], got["cluster-autoscaler"], got["none"]) == (200, 403, 403)
        assert _refused(metrics_server.metrics, "metrics", path, "permission_denied") == 1
        assert _refused(metrics_server.metrics, "metrics", path, "no_certificate") == 1
    else:
        want = 200 if path == "/healthz" else 503
        assert (got["prometheus"], got["cluster-autoscaler"], got["none"]) == (want, want, want)
        assert not [
            s for s in _samples(metrics_server.metrics, "qos_extender_autoscaler_refused_calls_total") if s.value
        ]


async def test_metrics_listener_reloads_its_certificate(metrics_server: MetricsServer, pki: Pki) -> None:
    assert await asyncio.to_thread(_served_certificate, metrics_server.port) == _der(pki.d / "server.crt")
    assert metrics_server.reloader.check() is False  # unchanged files: nothing re-read
    metrics_server.key.write_bytes((pki.d / "server2.key").read_bytes())
    metrics_server.cert.write_bytes((pki.d / "server2.crt").read_bytes())
    assert metrics_server.reloader.check() is True
    served = await asyncio.to_thread(_served_certificate, metrics_server.port)
    assert served == _der(pki.d / "server2.crt")
    assert _reloads(metrics_server.metrics, "metrics", "ok") == 1
    assert await _get(pki, metrics_server.port, "/metrics", "prometheus") == 200


def test_metrics_settings_refuse_plain_http_off_loopback() -> None:
    with pytest.raises(ValueError, match="plain HTTP only on a loopback host"):
        MetricsSettings(host="0.0.0.0")
    assert MetricsSettings(host="127.0.0.1").cert_file is None
