"""Adversarial suite of the extender's webhook server (issue 29): every identity we issue tried on every route of
the real server (aiohttp on 127.0.0.1, real TLS with certificates made here by openssl), oversized and slow
admission bodies, /bind of an already-bound pod, of another scheduler's pod and of a pod nobody knows, /bind on a
listener where no scheduler identity is configured, and certificates reloaded when their files change.

Each refusal must be visible: its status (403 / 413 / 408, or /bind's Error field, the one kube-scheduler reads)
and qos_extender_requests_refused_total{server,route,reason}, read back through /metrics with the scraper's
certificate as Prometheus would. The Binder is ours (``RecordingBinder``: what reached the API server side); the
real binder against a real API server runs in tests/test_webhook_live.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from extender.kube.snapshot import Snapshot
from extender.settings.extender import ExtenderConfig, parse_config
from extender.webhook import verbs
from extender.webhook.app import (
    make_app,
    make_reloader,
    make_ssl_context,
    start_loopback_server,
    start_server,
)
from extender.webhook.metrics import Metrics

NOW = 1_800_000_000.0
SCHEDULER_CN = "kube-scheduler-extender-client"
SCRAPER_CN = "prometheus-extender-client"


# --------------------------------------------------------------------------------------------------- PKI


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _issue(d: Path, ca: str, name: str, subject: str, ext: str) -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
             cwd=d)  # fmt: skip
    (d / f"{name}.ext").write_text(ext + "\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d)  # fmt: skip


# identity -> what it is: the ones we issue (scheduler, scraper), another certificate our CA signed, none at all,
# and a certificate of another CA that claims the scheduler's CN
IDENTITIES = ("scheduler", "scraper", "other", "none", "foreign")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("authz-pki")
    for ca in ("ca", "foreign-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
                 "-days", "2", "-subj", f"/CN={ca}", cwd=d)  # fmt: skip
    _issue(d, "ca", "server", "/CN=kube-qos-extender", "subjectAltName=IP:127.0.0.1")
    _issue(d, "ca", "server2", "/CN=kube-qos-extender-renewed", "subjectAltName=IP:127.0.0.1")
    _issue(d, "ca", "scheduler", f"/O=kube-qos-extender-clients/CN={SCHEDULER_CN}", "extendedKeyUsage=clientAuth")
    _issue(d, "ca", "scraper", f"/O=kube-qos-extender-clients/CN={SCRAPER_CN}", "extendedKeyUsage=clientAuth")
    _issue(d, "ca", "other", "/O=kube-qos-extender-clients/CN=some-workload", "extendedKeyUsage=clientAuth")
    _issue(d, "foreign-ca", "foreign", f"/CN={SCHEDULER_CN}", "extendedKeyUsage=clientAuth")
    return d


def client_ctx(pki: Path, identity: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if identity != "none":
        ctx.load_cert_chain(str(pki / f"{identity}.crt"), str(pki / f"{identity}.key"))
    return ctx


# --------------------------------------------------------------------------------------------- the cluster


def _node(name: str) -> dict[str, Any]:
    alloc = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {"allocatable": alloc, "capacity": alloc, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _pod(name: str, scheduler: str, node: str | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {
            "schedulerName": scheduler,
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}],
        },
        "status": {"phase": "Running" if node else "Pending"},
    }


PODS = {
    "ours": _pod("ours", "qos-scheduler"),  # unbound, of our profile: the one pod /bind may bind
    "bound": _pod("bound", "qos-scheduler", "node-2"),
    "theirs": _pod("theirs", "default-scheduler"),
}


def snapshot(config: ExtenderConfig) -> Snapshot:
    snap = Snapshot(config)
    snap.replace_nodes([_node("node-1"), _node("node-2")], "1", now=NOW)
    snap.replace_pods(list(PODS.values()), "1", now=NOW)
    return snap


@dataclass
class RecordingBinder:
    """Our Binder interface: records what reached the API server side and succeeds."""

    calls: list[verbs.BindArgs] = field(default_factory=list)

    async def bind(self, args: verbs.BindArgs) -> int:
        self.calls.append(args)
        return 0


def bind_body(pod: str, node: str = "node-1") -> bytes:
    return orjson.dumps({"PodName": pod, "PodNamespace": "default", "PodUID": f"uid-{pod}", "Node": node})


FILTER = orjson.dumps({"Pod": PODS["ours"], "Nodes": None, "NodeNames": ["node-1", "node-2"]})
PREEMPT = orjson.dumps({"Pod": PODS["ours"], "NodeNameToVictims": None, "NodeNameToMetaVictims": {}})
REVIEW = orjson.dumps(
    {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "r1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "object": PODS["ours"],
        },
    }
)

# route -> (method, body)
ROUTES: dict[str, tuple[str, bytes | None]] = {
    "/filter": ("POST", FILTER),
    "/prioritize": ("POST", FILTER),
    "/preempt": ("POST", PREEMPT),
    "/bind": ("POST", bind_body("ours")),
    "/metrics": ("GET", None),
    "/healthz": ("GET", None),
    "/readyz": ("GET", None),
    "/admission/mutate": ("POST", REVIEW),
}

# The answer each identity gets on each route of the TLS listener (config/base's settings: client CA, default
# verb_clients / metrics_clients). "handshake": the TLS handshake itself fails, no route is reached.
EXPECTED: dict[str, dict[str, int | str]] = {
    "scheduler": {"/filter": 200, "/prioritize": 200, "/preempt": 200, "/bind": 200, "/metrics": 403,
                  "/healthz": 200, "/readyz": 200, "/admission/mutate": 200},
    "scraper": {"/filter": 403, "/prioritize": 403, "/preempt": 403, "/bind": 403, "/metrics": 200,
                "/healthz": 200, "/readyz": 200, "/admission/mutate": 200},
    "other": {"/filter": 403, "/prioritize": 403, "/preempt": 403, "/bind": 403, "/metrics": 403,
              "/healthz": 200, "/readyz": 200, "/admission/mutate": 200},
    "none": {"/filter": 403, "/prioritize": 403, "/preempt": 403, "/bind": 403, "/metrics": 403,
             "/healthz": 200, "/readyz": 200, "/admission/mutate": 200},
    "foreign": dict.fromkeys(ROUTES, "handshake"),
}  # fmt: skip


def tls_config(pki: Path, **server: Any) -> ExtenderConfig:
    tls = {
        "cert_file": str(pki / "server.crt"),
        "key_file": str(pki / "server.key"),
        "client_ca_file": str(pki / "ca.crt"),
    }
    return parse_config({"server": {"port": 0, "tls": tls, **server}})


@dataclass
class Server:
    url: str
    binder: RecordingBinder
    metrics: Metrics
    runner: web.AppRunner
    context: ssl.SSLContext | None


@contextlib.asynccontextmanager
async def serving(config: ExtenderConfig, verbs_only: bool = False) -> AsyncIterator[Server]:
    binder = RecordingBinder()
    metrics = Metrics()
    app = make_app(config, snapshot(config), binder, metrics=metrics, clock=lambda: NOW, verbs_only=verbs_only)
    if verbs_only:
        runner, port = await start_loopback_server(app, 0)
        ctx = None
    else:
        ctx = make_ssl_context(config.server.tls)
        runner, port = await start_server(app, config, ctx)
    scheme = "https" if ctx is not None else "http"
    try:
        yield Server(f"{scheme}://127.0.0.1:{port}", binder, metrics, runner, ctx)
    finally:
        await runner.cleanup()


async def call(
    session: aiohttp.ClientSession,
    server: Server,
    route: str,
    ssl_ctx: ssl.SSLContext | bool,
    body: bytes | None = None,
) -> tuple[int, Any]:
    method, default = ROUTES[route]
    data = body if body is not None else default
    async with session.request(method, server.url + route, data=data, ssl=ssl_ctx) as resp:
        raw = await resp.read()
        return resp.status, orjson.loads(raw) if resp.content_type == "application/json" else raw


def refused(metrics: Metrics) -> dict[tuple[str, str, str], float]:
    """qos_extender_requests_refused_total by (server, route, reason), non-zero only."""
    out = {}
    for family in metrics.registry.collect():
        if family.name == "qos_extender_requests_refused":
            for s in family.samples:
                if s.name.endswith("_total") and s.value:
                    out[(s.labels["server"], s.labels["route"], s.labels["reason"])] = s.value
    return out


# --------------------------------------------------------------------------------------- identity x route


@pytest.mark.parametrize("identity", IDENTITIES)
async def test_authz_each_identity_on_each_route(pki: Path, identity: str) -> None:
    config = tls_config(pki)
    async with serving(config) as server, aiohttp.ClientSession() as session:
        got: dict[str, int | str] = {}
        for route in ROUTES:
            try:
                status, answer = await call(session, server, route, client_ctx(pki, identity))
            except aiohttp.ClientError:
                got[route] = "handshake"
                continue
            got[route] = status
            if status == 403:
                assert answer["Error"], (identity, route)  # a reason, naming the option to change
            if route == "/bind" and status == 200:
                assert answer == {"Error": ""}
        assert got == EXPECTED[identity]
        # nothing but the scheduler's own bind reached the API server side
        bound = [(c.name, c.node) for c in server.binder.calls]
        assert bound == ([("ours", "node-1")] if identity == "scheduler" else [])
        # every 403 counted, under its reason
        denied = [r for r, s in got.items() if s == 403]
        reason = {"none": "no_certificate"}.get(identity, "identity_not_allowed")
        assert refused(server.metrics) == {("extender", r, reason): 1.0 for r in denied}
        # and visible to Prometheus through /metrics (the scraper's identity, as it scrapes)
        status, text = await call(session, server, "/metrics", client_ctx(pki, "scraper"))
        assert status == 200
        for r in denied:
            line = f'qos_extender_requests_refused_total{{reason="{reason}",route="{r}",server="extender"}} 1.0'
            assert line in text.decode()


async def test_authz_loopback_listener_serves_the_verbs_only(pki: Path) -> None:
    """server.loopback_verbs_port: the pod's own kube-scheduler (the only caller that reaches 127.0.0.1 in its
    network namespace) binds without a certificate; nothing else is routed there."""
    config = tls_config(pki)
    async with serving(config, verbs_only=True) as server, aiohttp.ClientSession() as session:
        got = {route: (await call(session, server, route, False))[0] for route in ROUTES}
        assert got == {"/filter": 200, "/prioritize": 200, "/preempt": 200, "/bind": 200, "/metrics": 404,
                       "/healthz": 404, "/readyz": 404, "/admission/mutate": 404}  # fmt: skip
        assert [(c.name, c.node) for c in server.binder.calls] == [("ours", "node-1")]


@pytest.mark.parametrize("listener", ["tls-without-client-ca", "plain-http", "tls-empty-verb-clients"])
async def test_authz_bind_fails_closed_without_a_scheduler_identity(pki: Path, listener: str) -> None:
    """No client CA (or nobody in verb_clients): nobody may bind on that listener, rather than everybody."""
    tls: dict[str, Any] = {"cert_file": str(pki / "server.crt"), "key_file": str(pki / "server.key")}
    if listener == "plain-http":
        tls = {}
    elif listener == "tls-empty-verb-clients":
        tls |= {"client_ca_file": str(pki / "ca.crt"), "verb_clients": []}
    config = parse_config({"server": {"port": 0, "tls": tls}})
    async with serving(config) as server, aiohttp.ClientSession() as session:
        for identity in ("none", "scheduler"):
            if listener != "tls-empty-verb-clients" and identity == "scheduler":
                continue  # without a client CA a client certificate cannot even be verified
            ctx: ssl.SSLContext | bool = client_ctx(pki, identity) if listener != "plain-http" else False
            status, answer = await call(session, server, "/bind", ctx)
            assert status == 403 and "binding fails closed" in answer["Error"], (identity, answer)
        assert server.binder.calls == []
        assert set(refused(server.metrics)) == {("extender", "/bind", "no_identity_configured")}


# ------------------------------------------------------------------------------------------------- /bind


@pytest.mark.parametrize(
    ("pod", "node", "reason", "message"),
    [
        ("bound", "node-1", "pod_already_bound", "already bound to node 'node-2'"),
        ("theirs", "node-1", "pod_not_ours", "schedulerName 'default-scheduler' is not one this extender serves"),
        ("stranger", "node-1", "pod_unknown", "not in the extender's snapshot"),
    ],
)
async def test_authz_bind_refuses_a_pod_that_is_not_ours_to_bind(
    pki: Path, pod: str, node: str, reason: str, message: str
) -> None:
    """The scheduler's own identity still cannot bind a pod already bound elsewhere, another scheduler's pod
    (a Binding from us would bypass that scheduler's checks) or one nobody can vouch for: answered in the Error
    field (what kube-scheduler reads), counted, and nothing reaches the API server side."""
    config = tls_config(pki)
    async with serving(config) as server, aiohttp.ClientSession() as session:
        status, answer = await call(session, server, "/bind", client_ctx(pki, "scheduler"), bind_body(pod, node))
        assert status == 200 and message in answer["Error"], answer
        assert server.binder.calls == []
        assert refused(server.metrics) == {("extender", "/bind", reason): 1.0}
        # a retried bind of a pod the watch already shows on that very node is done, not refused nor re-POSTed
        status, answer = await call(
            session, server, "/bind", client_ctx(pki, "scheduler"), bind_body("bound", "node-2")
        )
        assert (status, answer) == (200, {"Error": ""}) and server.binder.calls == []


# --------------------------------------------------------------------------------------- admission bodies


async def test_authz_admission_body_larger_than_a_pod_review_is_refused(pki: Path) -> None:
    """/admission/mutate is anonymous, so its body is bounded (server.admission_max_body_bytes): a declared
    length over it is refused before it is read, and a chunked stream (no length) is cut at the limit."""
    config = tls_config(pki, admission_max_body_bytes=64 * 1024)
    big = b'{"pad": "' + b"x" * (256 * 1024) + b'"}'

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(big), 16 * 1024):
            yield big[i : i + 16 * 1024]

    async with serving(config) as server, aiohttp.ClientSession() as session:
        status, answer = await call(session, server, "/admission/mutate", client_ctx(pki, "none"), big)
        assert status == 413 and "over the limit of 65536" in answer["Error"]
        async with session.post(server.url + "/admission/mutate", data=chunks(), ssl=client_ctx(pki, "none")) as resp:
            assert resp.status == 413 and "over the limit" in (await resp.json())["Error"]
        # a real review of a pod is far below the bound and answered
        status, answer = await call(session, server, "/admission/mutate", client_ctx(pki, "none"))
        assert status == 200 and answer["response"]["uid"] == "r1"
        assert refused(server.metrics) == {("extender", "/admission/mutate", "body_too_large"): 2.0}


async def _slow_send(url_port: int, ctx: ssl.SSLContext, head: bytes, trickle: bytes, gap: float) -> tuple[bytes, int]:
    """Send ``head`` at once, then ``trickle`` a byte every ``gap`` seconds; returns (what the server answered,
    how many trickle bytes were still unsent when it answered or closed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", url_port, ssl=ctx, server_hostname="127.0.0.1")
    writer.write(head)
    await writer.drain()
    answer = b""
    left = len(trickle)
    read = asyncio.ensure_future(reader.read())
    try:
        for i in range(len(trickle)):
            done, _ = await asyncio.wait({read}, timeout=gap)
            if done:
                break
            writer.write(trickle[i : i + 1])
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await writer.drain()
            left -= 1
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            answer = await asyncio.wait_for(read, 30)
    finally:
        read.cancel()
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return answer, left


async def test_authz_slow_admission_body_is_cut_off(pki: Path) -> None:
    """A client that sends its body a byte at a time gets 408 once server.read_timeout_seconds has passed,
    long before it finished (slow-loris), and the refusal is counted."""
    config = tls_config(pki, read_timeout_seconds=1.0)
    body = REVIEW
    async with serving(config) as server:
        port = int(server.url.rsplit(":", 1)[1])
        head = (
            b"POST /admission/mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        answer, left = await _slow_send(port, client_ctx(pki, "none"), head, body, gap=0.25)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"not received within 1 s" in answer
        assert left > len(body) // 2  # cut off with most of the body unsent
        assert refused(server.metrics) == {("extender", "/admission/mutate", "read_timeout"): 1.0}


async def test_authz_slow_headers_close_the_connection(pki: Path) -> None:
    """Headers sent a byte at a time never reach a handler: aiohttp's keep-alive timer (server.read_timeout_seconds,
    started when the connection opens) closes the connection with most of them unsent."""
    config = tls_config(pki, read_timeout_seconds=1.0)
    headers = b"Host: 127.0.0.1\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
    async with serving(config) as server:
        port = int(server.url.rsplit(":", 1)[1])
        answer, left = await _slow_send(port, client_ctx(pki, "none"), b"GET /healthz HTTP/1.1\r\n", headers, gap=0.1)
        assert answer == b""  # closed without an answer
        assert left > len(headers) // 2


# ------------------------------------------------------------------------------------ certificate reload


def _served_certificate(port: int, pki: Path) -> str:
    """The subject CN of the certificate the server presents on a new connection."""
    ctx = client_ctx(pki, "scheduler")
    import socket

    with socket.create_connection(("127.0.0.1", port)) as raw, ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        cert = s.getpeercert()
    return dict(x[0] for x in cert["subject"])["commonName"]


@pytest.fixture
def live_files(pki: Path, tmp_path: Path) -> Iterator[Path]:
    for name in ("server.crt", "server.key", "ca.crt"):
        (tmp_path / name).write_bytes((pki / name).read_bytes())
    yield tmp_path


async def test_certificates_are_reloaded_when_their_files_change(pki: Path, live_files: Path) -> None:
    """A renewed certificate is served on the next handshake without a restart; a half-written one is refused,
    the previous chain stays in use; both counted in qos_extender_certificate_reloads_total{listener,result}."""
    tls = {
        "cert_file": str(live_files / "server.crt"),
        "key_file": str(live_files / "server.key"),
        "client_ca_file": str(live_files / "ca.crt"),
    }
    config = parse_config({"server": {"port": 0, "tls": tls}})
    async with serving(config) as server:
        assert server.context is not None
        reloader = make_reloader(config.server.tls, server.context, server.metrics)
        assert reloader is not None
        port = int(server.url.rsplit(":", 1)[1])
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, _served_certificate, port, pki) == "kube-qos-extender"
        assert reloader.check() is False  # unchanged files: nothing to do
        (live_files / "server.key").write_bytes((pki / "server2.key").read_bytes())
        (live_files / "server.crt").write_bytes((pki / "server2.crt").read_bytes())
        assert reloader.check() is True
        assert await loop.run_in_executor(None, _served_certificate, port, pki) == "kube-qos-extender-renewed"
        (live_files / "server.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\nhalf")
        assert reloader.check() is False
        assert await loop.run_in_executor(None, _served_certificate, port, pki) == "kube-qos-extender-renewed"
        text = server.metrics.exposition().decode()
        assert 'qos_extender_certificate_reloads_total{listener="extender",result="ok"} 1.0' in text
        assert 'qos_extender_certificate_reloads_total{listener="extender",result="failed"} 1.0' in text
