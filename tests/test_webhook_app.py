"""The HTTP app: every verb over real HTTP (aiohttp test server on 127.0.0.1), bad input, metrics, TLS.

The snapshot is built from the golden bodies (tests/golden/). Bind needs an API server; here a
``ScriptedBinder`` (a stand-in for *our* Binder interface, not for the API server) answers, so the app's
wiring (ledger, metrics, Error field) is checked; the real binder runs in tests/test_webhook_live.py.
"""

from __future__ import annotations

import asyncio
import copy
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from extender.kube.snapshot import Snapshot
from extender.settings.extender import ConfigError, ExtenderConfig, ServerConfig, TlsConfig, parse_config
from extender.webhook import verbs
from extender.webhook.app import make_app, make_ssl_context, start_loopback_server, start_server
from extender.webhook.metrics import Metrics
from tests.golden.replay import FULL_LOG, NODECACHE_LOG, load_log, node_objects

# The golden capture's kube-scheduler sent both profiles' pods to the extender (no managedResources): both names
# are this extender's to bind.
CONFIG = parse_config({"bind": {"scheduler_names": ["qos-scheduler", "default-scheduler"]}})
NOW = load_log(FULL_LOG)[0]["t"]


def golden(path: Path, verb: str, seq: int = 1) -> dict[str, Any]:
    for e in load_log(path):
        if e["verb"] == verb and e["seq"] == seq:
            return copy.deepcopy(e["request"])
    raise AssertionError((verb, seq))


class ScriptedBinder:
    """Implements verbs.Binder with scripted answers (our interface; the API server is not faked)."""

    def __init__(self, fail: str | None = None, delay: float = 0.0) -> None:
        self.calls: list[verbs.BindArgs] = []
        self.fail = fail
        self.delay = delay

    async def bind(self, args: verbs.BindArgs) -> int:
        self.calls.append(args)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail:
            raise verbs.BindError(self.fail, retries=2)
        return 1


def synced_snapshot(config: ExtenderConfig = CONFIG) -> Snapshot:
    snap = Snapshot(config)
    snap.replace_nodes(node_objects(), "1", now=NOW)
    pending = golden(FULL_LOG, "filter", 1)["Pod"]  # pod-a, pending
    snap.replace_pods([pending], "1", now=NOW)
    return snap


@pytest.fixture
async def setup() -> AsyncIterator[tuple[TestClient[Any, Any], Snapshot, ScriptedBinder, Metrics]]:
    snap = synced_snapshot()
    binder = ScriptedBinder()
    metrics = Metrics()
    # kube-scheduler's own listener (the loopback one): the main listener without a client CA refuses /bind
    async with scheduler_app(snap, binder, metrics) as client:
        yield client, snap, binder, metrics


Setup = tuple[TestClient[Any, Any], Snapshot, ScriptedBinder, Metrics]


def scheduler_app(
    snap: Snapshot, binder: ScriptedBinder, metrics: Metrics | None = None, config: ExtenderConfig = CONFIG
) -> TestClient[Any, Any]:
    """The loopback listener's app (server.loopback_verbs_port) over the same snapshot: where kube-scheduler binds
    without a certificate. The main listener without a client CA refuses /bind (fail closed, tested below)."""
    app = make_app(config, snap, binder, metrics=metrics, clock=lambda: NOW, verbs_only=True)
    return TestClient(TestServer(app, host="127.0.0.1"))


async def post(client: TestClient[Any, Any], verb: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    resp = await client.post(f"/{verb}", data=data, headers={"Content-Type": "application/json"})
    assert resp.headers["Content-Type"].startswith("application/json")
    return resp.status, orjson.loads(await resp.read())


IN_BAND = ("filter", "bind")  # result types with an Error field: every failure is 200 + Error


def assert_error(verb: str, status: int, body: Any, code: int) -> str:
    """A failure answer: 200 with Error set for filter/bind (what kube-scheduler reads; a non-200 body it never
    reads), ``code`` with {"Error": ...} for prioritize/preempt. Returns the message."""
    if verb in IN_BAND:
        assert status == 200, (status, body)
        if verb == "filter":
            assert body["Nodes"] is None and body["NodeNames"] is None, body
            assert body["FailedNodes"] == {} and body["FailedAndUnresolvableNodes"] == {}, body
    else:
        assert status == code, (status, body)
    assert isinstance(body["Error"], str) and body["Error"], body
    message: str = body["Error"]
    return message


# ----------------------------------------------------------------------------------------------- happy


async def test_all_verbs_answer_in_both_modes(setup: Setup) -> None:
    client, snap, binder, _ = setup
    status, body = await post(client, "filter", golden(FULL_LOG, "filter", 1))
    assert status == 200 and len(body["Nodes"]["items"]) == 3 and body["NodeNames"] is None
    status, body = await post(client, "filter", golden(NODECACHE_LOG, "filter", 1))
    assert status == 200 and body["NodeNames"] == ["node-1", "node-2", "node-3"] and body["Nodes"] is None
    for path in (FULL_LOG, NODECACHE_LOG):
        status, body = await post(client, "prioritize", golden(path, "prioritize", 1))
        assert status == 200 and [h["Host"] for h in body] == ["node-1", "node-2", "node-3"]
    wrong_uid = golden(FULL_LOG, "bind", 1) | {"PodUID": "9b8dc8b7-dae8-4a73-b4a1-bb17b02cf320"}
    async with TestClient(TestServer(make_app(CONFIG, snap, binder), host="127.0.0.1")) as main:
        status, body = await post(main, "bind", wrong_uid)
    assert status == 403 and "binding fails closed" in body["Error"]  # no client CA: nobody binds there
    async with scheduler_app(snap, binder) as sched:
        status, body = await post(sched, "bind", wrong_uid)
        assert status == 200, body
        # Not the UID of the pod-a we know (a recreated pod?): refused before reaching the binder.
        assert body["Error"].startswith("cannot bind default/pod-a: uid")
        assert binder.calls == []
        req = golden(FULL_LOG, "bind", 1) | {"PodName": "pod-a", "PodUID": snap.pods["default/pod-a"].pod.uid}
        status, body = await post(sched, "bind", req)
    assert (status, body) == (200, {"Error": ""})
    assert binder.calls[-1].node == "node-1"
    assert "default/pod-a" in snap.ledger  # our binding now occupies node-1 until the watch shows it


async def test_bind_failure_is_answered_in_error_field() -> None:
    snap = synced_snapshot()
    metrics = Metrics()
    async with scheduler_app(
        snap, ScriptedBinder(fail="pod default/pod-a is already bound to node-2"), metrics
    ) as client:
        uid = snap.pods["default/pod-a"].pod.uid
        req = {"PodName": "pod-a", "PodNamespace": "default", "PodUID": uid, "Node": "node-1"}
        status, body = await post(client, "bind", req)
    assert status == 200 and body == {"Error": "pod default/pod-a is already bound to node-2"}
    assert "default/pod-a" not in snap.ledger
    text = metrics.exposition().decode()
    assert "qos_extender_bind_failures_total 1.0" in text
    assert "qos_extender_bind_retries_total 2.0" in text


# ------------------------------------------------------------------------------------------- bad input


VERBS = ("filter", "prioritize", "preempt", "bind")


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"not json", b"\xff\xfe", b"[]", b'"Pod"', b"42", b"null", b"{}"],
    ids=["empty", "truncated", "text", "binary", "array", "string", "number", "null", "empty-object"],
)
async def test_malformed_bodies_get_400_json(setup: Setup, verb: str, raw: bytes) -> None:
    client, *_ = setup
    status, body = await post(client, verb, raw)
    assert_error(verb, status, body, 400)


def _mutated(verb: str, path: Path, mutate: Any) -> dict[str, Any]:
    body = golden(path, verb)
    mutate(body)
    return body


WRONG_TYPES = [
    ("filter", FULL_LOG, lambda b: b.update(Pod="pod-a"), "Pod must be a JSON object"),
    ("filter", FULL_LOG, lambda b: b.pop("Pod"), "missing Pod"),
    ("filter", FULL_LOG, lambda b: b.update(Pod=None), "missing Pod"),
    ("filter", FULL_LOG, lambda b: b.update(Nodes=None), "neither Nodes nor NodeNames"),
    ("filter", FULL_LOG, lambda b: b.update(Nodes=[]), "Nodes must be a NodeList object"),
    ("filter", FULL_LOG, lambda b: b["Nodes"].update(items={}), "Nodes.items must be an array"),
    ("filter", FULL_LOG, lambda b: b["Nodes"]["items"][0].pop("metadata"), "has no metadata.name"),
    ("filter", NODECACHE_LOG, lambda b: b.update(NodeNames="node-1"), "NodeNames must be an array"),
    ("filter", NODECACHE_LOG, lambda b: b.update(NodeNames=["node-1", 7]), "non-empty strings"),
    ("filter", NODECACHE_LOG, lambda b: b.update(Nodes={"items": []}), "both Nodes and NodeNames"),
    ("filter", NODECACHE_LOG, lambda b: b["Pod"].update(spec={"containers": {}}), "spec.containers must be a list"),
    ("filter", NODECACHE_LOG, lambda b: b["Pod"]["spec"].update(priority="high"), "priority must be an integer"),
    ("filter", NODECACHE_LOG, lambda b: b["Pod"]["metadata"].pop("name"), "metadata.name is missing"),
    ("filter", NODECACHE_LOG, lambda b: b["Pod"]["metadata"].update(annotations=[]), "annotations must be an object"),
    (
        "filter",
        NODECACHE_LOG,
        lambda b: b["Pod"]["spec"]["containers"][0]["resources"]["requests"].update(memory=-1),
        "memory must not be negative",
    ),
    ("prioritize", FULL_LOG, lambda b: b.update(Pod=[]), "Pod must be a JSON object"),
    ("prioritize", NODECACHE_LOG, lambda b: b.update(NodeNames=None), "neither Nodes nor NodeNames"),
    ("preempt", FULL_LOG, lambda b: b.update(NodeNameToVictims=None), "neither NodeNameToVictims"),
    ("preempt", FULL_LOG, lambda b: b.update(NodeNameToVictims=[]), "must be a JSON object"),
    ("preempt", FULL_LOG, lambda b: b["NodeNameToVictims"].update({"node-1": 3}), "must be a JSON object"),
    ("preempt", FULL_LOG, lambda b: b["NodeNameToVictims"]["node-1"]["Pods"][0].pop("metadata"), "has no UID"),
    ("preempt", NODECACHE_LOG, lambda b: b["NodeNameToMetaVictims"]["node-1"].update(Pods={}), "must be an array"),
    (
        "preempt",
        NODECACHE_LOG,
        lambda b: b["NodeNameToMetaVictims"]["node-1"].update(NumPDBViolations=-1),
        "NumPDBViolations",
    ),
    ("preempt", NODECACHE_LOG, lambda b: b.update(NodeNameToVictims={}), "both NodeNameToVictims"),
    ("bind", FULL_LOG, lambda b: b.pop("Node"), "Node must be a non-empty string"),
    ("bind", FULL_LOG, lambda b: b.update(PodName=3), "PodName must be a non-empty string"),
    ("bind", FULL_LOG, lambda b: b.update(PodNamespace=""), "PodNamespace must be a non-empty string"),
    ("bind", FULL_LOG, lambda b: b.update(PodUID=None), "PodUID must be a non-empty string"),
]


@pytest.mark.parametrize(("verb", "path", "mutate", "message"), WRONG_TYPES)
async def test_wrong_types_get_400_with_reason(setup: Setup, verb: str, path: Path, mutate: Any, message: str) -> None:
    client, *_ = setup
    status, body = await post(client, verb, _mutated(verb, path, mutate))
    assert message in assert_error(verb, status, body, 400), body


@pytest.mark.parametrize("path", [FULL_LOG, NODECACHE_LOG])
async def test_duplicate_node_names_get_400(setup: Setup, path: Path) -> None:
    client, *_ = setup
    for verb in ("filter", "prioritize"):
        body = golden(path, verb)
        if body.get("NodeNames") is not None:
            body["NodeNames"] = ["node-1", "node-2", "node-1"]
        else:
            body["Nodes"]["items"].append(copy.deepcopy(body["Nodes"]["items"][0]))
        status, answer = await post(client, verb, body)
        assert "duplicate node name 'node-1'" in assert_error(verb, status, answer, 400)


async def test_empty_and_null_node_lists(setup: Setup) -> None:
    client, *_ = setup
    body = golden(NODECACHE_LOG, "filter") | {"NodeNames": []}
    status, answer = await post(client, "filter", body)
    assert status == 200 and answer["NodeNames"] == [] and answer["FailedNodes"] == {}
    status, answer = await post(client, "prioritize", body)
    assert (status, answer) == (200, [])
    for items in ([], None):
        body = golden(FULL_LOG, "filter")
        body["Nodes"]["items"] = items
        status, answer = await post(client, "filter", body)
        assert status == 200 and answer["Nodes"] == {"metadata": {}, "items": []}
    body = golden(NODECACHE_LOG, "preempt") | {"NodeNameToMetaVictims": {}}
    status, answer = await post(client, "preempt", body)
    assert (status, answer) == (200, {"NodeNameToMetaVictims": {}})


async def test_unknown_node_names(setup: Setup) -> None:
    """A node the watch has not delivered yet is rejected *per node*, not by failing the whole call (one
    lagging node must not make every other node unschedulable for this pod), and as unresolvable: as a
    FailedNode it would be a preemption candidate with no victims, which fails the whole attempt upstream."""
    client, snap, binder, _ = setup
    body = golden(NODECACHE_LOG, "filter") | {"NodeNames": ["node-1", "node-9"]}
    status, answer = await post(client, "filter", body)
    assert status == 200 and answer["NodeNames"] == ["node-1"]
    assert "not in the extender's snapshot" in answer["FailedAndUnresolvableNodes"]["node-9"]
    assert answer["FailedNodes"] == {}
    status, answer = await post(client, "prioritize", body)
    assert status == 200 and "node-9" not in {h["Host"] for h in answer}  # absent: scores 0 upstream
    pre = golden(NODECACHE_LOG, "preempt")
    pre["NodeNameToMetaVictims"] = {"node-9": pre["NodeNameToMetaVictims"]["node-1"]}
    status, answer = await post(client, "preempt", pre)
    assert (status, answer) == (200, {"NodeNameToMetaVictims": {}})
    async with scheduler_app(snap, binder) as sched:
        status, answer = await post(sched, "bind", golden(FULL_LOG, "bind") | {"Node": "node-9"})
    assert status == 200 and "node 'node-9' is not in the extender's snapshot" in answer["Error"]
    assert binder.calls == []


async def test_oversized_body_gets_413_json() -> None:
    config = CONFIG.model_copy(update=dict(server=ServerConfig(max_body_bytes=4096)))
    app = make_app(config, synced_snapshot(), ScriptedBinder())
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        status, body = await post(client, "filter", golden(FULL_LOG, "filter"))
        assert "4096" in assert_error("filter", status, body, 413)
        status, body = await post(client, "prioritize", golden(FULL_LOG, "prioritize"))
        assert "4096" in assert_error("prioritize", status, body, 413)


async def test_unknown_verbs_and_methods(setup: Setup) -> None:
    client, *_ = setup
    for path in ("/fliter", "/", "/filter/extra", "/api/v1/filter"):
        resp = await client.post(path, data=b"{}")
        assert resp.status == 404
        assert "no such endpoint" in orjson.loads(await resp.read())["Error"]
    resp = await client.get("/filter")
    assert resp.status == 405 and "method GET not allowed" in orjson.loads(await resp.read())["Error"]
    async with TestClient(TestServer(make_app(CONFIG, synced_snapshot(), ScriptedBinder()), host="127.0.0.1")) as main:
        resp = await main.post("/metrics", data=b"{}")
        assert resp.status == 405


async def test_not_ready_before_first_sync() -> None:
    snap = Snapshot(CONFIG)
    app = make_app(CONFIG, snap, ScriptedBinder())
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.get("/readyz")
        assert resp.status == 503
        for verb, path in (
            ("filter", FULL_LOG),
            ("prioritize", NODECACHE_LOG),
            ("preempt", FULL_LOG),
        ):
            status, body = await post(client, verb, golden(path, verb))
            assert "not synced" in assert_error(verb, status, body, 503)
        async with scheduler_app(snap, ScriptedBinder()) as sched:
            status, body = await post(sched, "bind", golden(FULL_LOG, "bind"))
            assert "not synced" in assert_error("bind", status, body, 503)
        assert (await client.get("/healthz")).status == 200
        snap.replace_nodes(node_objects(), "1")
        snap.replace_pods([], "1")
        assert (await client.get("/readyz")).status == 200


async def test_request_timeout_answers_503() -> None:
    config = CONFIG.model_copy(update=dict(server=ServerConfig(request_timeout_seconds=0.2)))
    snap = synced_snapshot(config)
    async with scheduler_app(snap, ScriptedBinder(delay=2.0), config=config) as client:
        uid = snap.pods["default/pod-a"].pod.uid
        req = {"PodName": "pod-a", "PodNamespace": "default", "PodUID": uid, "Node": "node-1"}
        status, body = await post(client, "bind", req)
    assert "did not finish within 0.2 s" in assert_error("bind", status, body, 503)


async def test_metrics_follow_prometheus_conventions(setup: Setup) -> None:
    client, snap, _, metrics = setup
    pod_a = golden(FULL_LOG, "filter", 1)["Pod"]
    pod_a["spec"]["nodeName"] = "node-1"
    snap.apply_pod("MODIFIED", pod_a, now=NOW)
    body = golden(NODECACHE_LOG, "filter")
    body["Pod"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "3600m"
    body["Pod"]["metadata"]["annotations"] = {"qos.kube-qos-extender.io/class": "platinum"}
    body["Pod"]["metadata"]["resourceVersion"] += "-edited"  # a changed pod has a new resourceVersion
    await post(client, "filter", body)
    await post(client, "filter", b"nope")
    await post(client, "prioritize", golden(NODECACHE_LOG, "prioritize"))
    async with TestClient(
        TestServer(make_app(CONFIG, snap, ScriptedBinder(), metrics=metrics, clock=lambda: NOW), host="127.0.0.1")
    ) as main:
        resp = await main.get("/metrics")
        assert resp.status == 200
        text = (await resp.read()).decode()
    for line in (
        'qos_extender_requests_total{outcome="ok",verb="filter"} 1.0',
        'qos_extender_requests_total{outcome="bad_request",verb="filter"} 1.0',
        'qos_extender_request_duration_seconds_count{verb="filter"} 2.0',
        'qos_extender_filtered_nodes_total{reason="insufficient_cpu"} 1.0',
        'qos_extender_decisions_total{policy="bfd"} 1.0',
        "qos_extender_annotation_problems_total 1.0",
        'qos_extender_snapshot_objects{kind="nodes"} 3.0',
        "qos_extender_snapshot_ready 1.0",
        "qos_extender_snapshot_age_seconds 0.0",
    ):
        assert line in text, line
    for name in [ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE")]:
        assert name.startswith("qos_extender_")


class EventRecorder:
    def __init__(self) -> None:
        self.seen: list[verbs.PodProblems] = []

    def report(self, problems: verbs.PodProblems) -> None:
        self.seen.append(problems)


async def test_malformed_annotations_are_reported_not_fatal() -> None:
    recorder = EventRecorder()
    app = make_app(CONFIG, synced_snapshot(), ScriptedBinder(), events=recorder, clock=lambda: NOW)
    body = golden(NODECACHE_LOG, "filter")
    body["Pod"]["metadata"]["annotations"] = {
        "qos.kube-qos-extender.io/class": "platinum",
        "qos.kube-qos-extender.io/kind": "batch",
        "qos.kube-qos-extender.io/runtime-seconds": "soon",
        "qos.kube-qos-extender.io/migratable": "yes",
    }
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        status, answer = await post(client, "filter", body)
    assert status == 200 and answer["NodeNames"] == ["node-1", "node-2", "node-3"]
    (report,) = recorder.seen
    assert report.name == "nc-low-1"
    assert sorted(p.key.rsplit("/", 1)[1] for p in report.problems) == ["class", "migratable", "runtime-seconds"]


# ----------------------------------------------------------------------------------------------- TLS


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


# name -> subject CN: the scheduler's and the scraper's identities (config defaults), another CA-signed one
CLIENTS = {
    "scheduler": "kube-scheduler-extender-client",
    "scraper": "prometheus-extender-client",
    "client": "client",
}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=test-ca", cwd=d)  # fmt: skip
    certs = [("server", "/CN=server", "subjectAltName=IP:127.0.0.1")]
    certs += [(name, f"/O=test/CN={cn}", "extendedKeyUsage=clientAuth") for name, cn in CLIENTS.items()]
    for name, subject, ext in certs:
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subject, cwd=d)  # fmt: skip
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d)  # fmt: skip
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "rogue.key", "-out", "rogue.crt",
             "-days", "2", "-subj", "/CN=kube-scheduler-extender-client", cwd=d)  # fmt: skip
    return d


def _client_ctx(pki: Path, cert: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        ctx.load_cert_chain(str(pki / f"{cert}.crt"), str(pki / f"{cert}.key"))
    return ctx


async def test_tls_requires_a_ca_signed_client_certificate_except_for_admission_and_health(pki: Path) -> None:
    tls = TlsConfig(
        cert_file=str(pki / "server.crt"), key_file=str(pki / "server.key"), client_ca_file=str(pki / "ca.crt")
    )
    config = CONFIG.model_copy(update=dict(server=ServerConfig(port=0, tls=tls)))
    assert make_ssl_context(tls) is not None
    runner, port = await start_server(make_app(config, synced_snapshot(), ScriptedBinder()), config)
    url = f"https://127.0.0.1:{port}/filter"
    body = orjson.dumps(golden(NODECACHE_LOG, "filter"))
    try:

        def client_ctx(cert: str | None) -> ssl.SSLContext:
            return _client_ctx(pki, cert)

        async with aiohttp.ClientSession() as session:
            async with session.post(url, data=body, ssl=client_ctx("scheduler")) as resp:
                assert resp.status == 200
                assert (await resp.json())["NodeNames"] == ["node-1", "node-2", "node-3"]
            # no certificate: the verbs and /metrics refuse (403, JSON); health and admission answer
            async with session.post(url, data=body, ssl=client_ctx(None)) as resp:
                assert resp.status == 403
                assert "requires a client certificate" in (await resp.json())["Error"]
            async with session.get(f"https://127.0.0.1:{port}/metrics", ssl=client_ctx(None)) as resp:
                assert resp.status == 403
            async with session.get(f"https://127.0.0.1:{port}/readyz", ssl=client_ctx(None)) as resp:
                assert resp.status == 200
            review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u"}}
            async with session.post(
                f"https://127.0.0.1:{port}/admission/mutate", data=orjson.dumps(review), ssl=client_ctx(None)
            ) as resp:
                assert resp.status == 200 and (await resp.json())["response"] == {"uid": "u", "allowed": True}
            # a certificate the CA did not sign fails the handshake on every path, whatever its subject says
            for path in ("filter", "admission/mutate", "healthz"):
                with pytest.raises(aiohttp.ClientError):
                    async with session.post(
                        f"https://127.0.0.1:{port}/{path}", data=body, ssl=client_ctx("rogue")
                    ) as resp:
                        await resp.read()
            with pytest.raises(aiohttp.ClientError):  # plain HTTP to a TLS port
                async with session.post(f"http://127.0.0.1:{port}/filter", data=body) as resp:
                    await resp.read()
    finally:
        await runner.cleanup()


async def test_verbs_only_for_the_scheduler_and_metrics_only_for_the_scraper(pki: Path) -> None:
    """A CA-signed certificate is an identity, not a permission: a metrics credential must not create
    Bindings, nor any other certificate the CA signed call the verbs (server.tls.verb_clients /
    metrics_clients, subject CNs)."""
    tls = TlsConfig(
        cert_file=str(pki / "server.crt"), key_file=str(pki / "server.key"), client_ca_file=str(pki / "ca.crt")
    )
    config = CONFIG.model_copy(update=dict(server=ServerConfig(port=0, tls=tls)))
    snap = synced_snapshot()
    binder = ScriptedBinder()
    runner, port = await start_server(make_app(config, snap, binder), config)
    base = f"https://127.0.0.1:{port}"
    uid = snap.pods["default/pod-a"].pod.uid
    bind = orjson.dumps({"PodName": "pod-a", "PodNamespace": "default", "PodUID": uid, "Node": "node-1"})
    filter_body = orjson.dumps(golden(NODECACHE_LOG, "filter"))
    try:
        async with aiohttp.ClientSession() as session:

            async def call(cert: str, method: str, path: str, data: bytes | None = None) -> tuple[int, Any]:
                async with session.request(method, f"{base}{path}", data=data, ssl=_client_ctx(pki, cert)) as resp:
                    raw = await resp.read()
                    return resp.status, (orjson.loads(raw) if resp.content_type == "application/json" else raw)

            for cert in ("scraper", "client"):
                for path, data in (("/bind", bind), ("/filter", filter_body), ("/prioritize", filter_body)):
                    status, answer = await call(cert, "POST", path, data)
                    assert status == 403, (cert, path, status, answer)
                    assert "server.tls.verb_clients" in answer["Error"] and CLIENTS[cert] in answer["Error"]
            assert binder.calls == []  # nothing reached the API server side
            for cert in ("scheduler", "client"):
                status, answer = await call(cert, "GET", "/metrics")
                assert status == 403 and "server.tls.metrics_clients" in answer["Error"], (cert, answer)
            status, _ = await call("scraper", "GET", "/metrics")
            assert status == 200
            status, answer = await call("scheduler", "POST", "/bind", bind)
            assert (status, answer) == (200, {"Error": ""})
            assert [c.node for c in binder.calls] == ["node-1"]
        # The lists are configuration: the scraper's name allowed on the verbs too, and it may call them.
        both = tls.model_copy(update=dict(verb_clients=(CLIENTS["scheduler"], CLIENTS["scraper"])))
        config2 = CONFIG.model_copy(update=dict(server=ServerConfig(port=0, tls=both)))
        runner2, port2 = await start_server(make_app(config2, synced_snapshot(), ScriptedBinder()), config2)
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    f"https://127.0.0.1:{port2}/filter", data=filter_body, ssl=_client_ctx(pki, "scraper")
                ) as resp,
            ):
                assert resp.status == 200
        finally:
            await runner2.cleanup()
    finally:
        await runner.cleanup()


async def test_loopback_listener_serves_only_the_verbs_without_tls(pki: Path) -> None:
    """server.loopback_verbs_port: plain HTTP on 127.0.0.1 for the sidecar's kube-scheduler, the four verbs
    and nothing else (admission, metrics, health stay on the TLS listener)."""
    snap = synced_snapshot()
    app = make_app(CONFIG, snap, ScriptedBinder(), verbs_only=True)
    runner, port = await start_loopback_server(app, 0)
    try:
        assert all(addr[0] == "127.0.0.1" for addr in runner.addresses)
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"http://127.0.0.1:{port}/filter", data=orjson.dumps(golden(NODECACHE_LOG, "filter"))
            ) as resp:
                assert resp.status == 200
                assert (await resp.json())["NodeNames"] == ["node-1", "node-2", "node-3"]
            for method, path in (("GET", "/metrics"), ("GET", "/readyz"), ("POST", "/admission/mutate")):
                async with session.request(method, f"http://127.0.0.1:{port}{path}", data=b"{}") as resp:
                    assert resp.status == 404, (path, resp.status)
    finally:
        await runner.cleanup()


async def test_server_binds_loopback_by_default() -> None:
    config = CONFIG.model_copy(update=dict(server=ServerConfig(port=0)))
    assert config.server.host == "127.0.0.1"
    runner, port = await start_server(make_app(config, synced_snapshot(), ScriptedBinder()), config)
    try:
        assert port > 0
        assert all(addr[0] == "127.0.0.1" for addr in runner.addresses)
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/readyz") as resp:
            assert resp.status == 200
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"tls": {"verb_clients": "kube-scheduler"}}, "server.tls.verb_clients: Input should be a valid array"),
        (
            {"tls": {"metrics_clients": [""]}},
            r"server.tls.metrics_clients\[0\]: String should have at least 1 character",
        ),
        ({"loopback_verbs_port": 0}, "server.loopback_verbs_port: Input should be greater than or equal to 1"),
        ({"loopback_verbs_port": "8081"}, "server.loopback_verbs_port: Input should be a valid integer"),
    ],
)
def test_access_and_listener_options_are_validated(server: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"server": server})


def test_access_defaults_match_the_shipped_certificates() -> None:
    """hack/ and config/ issue these CNs; the defaults let those certificates in and nothing else."""
    cfg = parse_config({"server": {"loopback_verbs_port": 18081}})
    assert cfg.server.tls.verb_clients == ("kube-scheduler-extender-client",)
    assert cfg.server.tls.metrics_clients == ("prometheus-extender-client",)
    assert cfg.server.loopback_verbs_port == 18081
    assert parse_config({}).server.loopback_verbs_port is None
