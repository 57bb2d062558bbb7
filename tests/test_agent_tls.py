"""mTLS between agents and from the controller: a throwaway CA (openssl CLI) and certs; no cert, a cert from
another CA, or a server that is not who it claims are all refused; and, past the handshake, each identity of
the agents' CA on each route (authorization by identity, issue #29)."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client import generate_latest

from extender.agent.backends.simulated import InMemoryProgressStore, SimulatedBackend
from extender.agent.client import AgentClient, PeerError
from extender.agent.server import Agent
from extender.agent.settings import AgentConfig, AgentTlsConfig, MigrationPolicyConfig
from tests.test_agent_support import Pki, make_pki, serve_in_process


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(
        tmp_path_factory.mktemp("pki"),
        {"agent-a": "127.0.0.1", "agent-b": "127.0.0.2", "ctl": "", "prom": ""},
        {"agent-a": "qos-agent:tls-a", "agent-b": "qos-agent:tls-b", "prom": "qos-agent-metrics"},
    )


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("other"), {"ctl": "", "agent-a": "127.0.0.1"})


@pytest.fixture
async def agent_url(pki: Pki, tmp_path: Path) -> AsyncIterator[str]:
    cfg = AgentConfig(node_name="tls-a", host="127.0.0.1", tls=pki.tls("agent-a"), state_dir=str(tmp_path),
                      backend="simulated")  # fmt: skip
    agent = Agent(cfg, SimulatedBackend(InMemoryProgressStore()))
    runner, url = await serve_in_process(agent, "127.0.0.1")
    yield url
    await runner.cleanup()
    await agent.client.close()


async def test_controller_with_a_cert_from_the_ca_is_served(agent_url: str, pki: Pki) -> None:
    c = AgentClient(pki.tls("ctl"))
    try:
        info = await c.request("GET", f"{agent_url}/v1/info")
        assert info["node"] == "tls-a" and info["test_fault_injection"] is False
        with pytest.raises(PeerError, match="404"):  # the test-only endpoint does not exist unless enabled
            await c.request("PUT", f"{agent_url}/v1/test/faults", {"faults": {"source.transfer.cut": 1}})
    finally:
        await c.close()


async def test_client_without_a_certificate_is_refused(agent_url: str, pki: Pki) -> None:
    ctx = ssl.create_default_context(cafile=str(pki.ca))  # trusts the server, presents no certificate
    async with aiohttp.ClientSession() as s:
        with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
            async with s.get(f"{agent_url}/v1/info", ssl=ctx) as r:
                await r.read()
        # the very same context with the controller's certificate gets through: it was the missing cert
        tls = pki.tls("ctl")
        assert tls.cert_file and tls.key_file
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
        async with s.get(f"{agent_url}/v1/info", ssl=ctx) as r:
            assert r.status == 200


async def test_client_with_a_cert_from_another_ca_is_refused(agent_url: str, pki: Pki, other_pki: Pki) -> None:
    tls = other_pki.tls("ctl")
    c = AgentClient(AgentTlsConfig(cert_file=tls.cert_file, key_file=tls.key_file, ca_file=str(pki.ca)))
    try:
        with pytest.raises(PeerError) as err:
            await c.request("GET", f"{agent_url}/v1/info")
        assert err.value.kind.value == "transient"  # a handshake failure looks like a connection failure
    finally:
        await c.close()


async def test_a_server_not_signed_by_our_ca_is_not_trusted(agent_url: str, pki: Pki, other_pki: Pki) -> None:
    tls = pki.tls("ctl")
    c = AgentClient(AgentTlsConfig(cert_file=tls.cert_file, key_file=tls.key_file, ca_file=str(other_pki.ca)))
    try:
        with pytest.raises(PeerError, match=r"[Cc]ertificate"):
            await c.request("GET", f"{agent_url}/v1/info")
    finally:
        await c.close()


async def test_server_name_must_match_the_certificate(pki: Pki, tmp_path: Path) -> None:
    # agent-b's certificate is for 127.0.0.2: served on 127.0.0.3 it must be rejected by the client
    cfg = AgentConfig(node_name="tls-b", tls=pki.tls("agent-b"), state_dir=str(tmp_path), backend="simulated")
    agent = Agent(cfg, SimulatedBackend(InMemoryProgressStore()))
    runner, url = await serve_in_process(agent, "127.0.0.3")
    c = AgentClient(pki.tls("ctl"))
    try:
        with pytest.raises(PeerError, match=r"[Cc]ertificate|match|IP address"):
            await c.request("GET", f"{url}/v1/info")
    finally:
        await c.close()
        await runner.cleanup()
        await agent.client.close()


# ------------------------------------------------------------------ authorization by identity (issue #29)
# Every identity the agents' CA issues, tried on every route of a real agent: the answer each gets. The routes'
# path parameters are filled with a valid migration id; a 403 is the refusal, anything else means "served"
# (the handler ran: 200, or its own 4xx for an unknown migration).
ROUTE_CALLS = [
    ("POST", "/v1/migrations", {"workload": {"pid": 4_000_000}, "destination": {"url": "https://127.0.0.2:1"}}),
    ("GET", "/v1/migrations/m-1", None),
    ("PUT", "/v1/migrations/m-1/archive/final", None),
    ("POST", "/v1/migrations/m-1/prepare", {"meta": {}}),
    ("POST", "/v1/migrations/m-1/restore", {"meta": {}}),
    ("POST", "/v1/migrations/m-1/commit", {}),
    ("POST", "/v1/migrations/m-1/abort", {}),
    ("POST", "/v1/migrations/m-1/discard", {}),
    ("GET", "/v1/info", None),
    ("GET", "/healthz", None),
    ("GET", "/metrics", None),
    ("PUT", "/v1/test/faults", {"faults": {}}),
    ("GET", "/v1/test/faults", None),
]
# who is served where (everything else: 403): a peer agent gets the destination side and the record; the agent
# of the served node also its own /healthz (the readiness probe)
PEER = {
    "/v1/migrations/m-1",
    "/v1/migrations/m-1/archive/final",
    "/v1/migrations/m-1/prepare",
    "/v1/migrations/m-1/restore",
    "/v1/migrations/m-1/commit",
    "/v1/migrations/m-1/abort",
    "/v1/info",
}
SERVED = {
    "ctl": {
        "/v1/migrations",
        "/v1/migrations/m-1",
        "/v1/migrations/m-1/discard",
        "/v1/info",
        "/healthz",
        "/v1/test/faults",
    },
    "agent-b": PEER,
    "agent-a": PEER | {"/healthz"},
    "prom": {"/metrics"},
    "stranger": set(),
}


@pytest.fixture(scope="module")
def authz_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(
        tmp_path_factory.mktemp("authz"),
        {"agent-a": "127.0.0.1", "agent-b": "127.0.0.2", "ctl": "", "prom": "", "stranger": ""},
        {"agent-a": "qos-agent:authz-a", "agent-b": "qos-agent:authz-b", "stranger": "kube-scheduler"},
    )


async def _call(pki: Pki, who: str, method: str, url: str, body: Any) -> tuple[int, str]:
    tls = pki.tls(who)
    assert tls.cert_file and tls.key_file
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    headers = {"X-Qos-Archive-Size": "10", "X-Qos-Archive-Sha256": "0" * 64} if "archive" in url else {}
    async with aiohttp.ClientSession() as s:
        data = b"x" * 10 if "archive" in url else (orjson.dumps(body) if body is not None else None)
        async with s.request(method, url, data=data, headers=headers, ssl=ctx) as r:
            return r.status, await r.text()


@pytest.mark.parametrize("who", sorted(SERVED))
async def test_authz_each_identity_on_each_agent_route(who: str, authz_pki: Pki, tmp_path: Path) -> None:
    cfg = AgentConfig(node_name="authz-a", host="127.0.0.1", tls=authz_pki.tls("agent-a"), state_dir=str(tmp_path),
                      backend="simulated", test_fault_injection=True)  # fmt: skip
    agent = Agent(cfg, SimulatedBackend(InMemoryProgressStore()))
    runner, url = await serve_in_process(agent, "127.0.0.1")
    try:
        for method, path, body in ROUTE_CALLS:
            status, text = await _call(authz_pki, who, method, url + path, body)
            if path in SERVED[who]:
                assert status != 403, (who, method, path, status, text)
            else:
                assert status == 403, (who, method, path, status, text)
                assert "may not call" in text or "not this node's agent" in text, text
        metrics = generate_latest(agent.metrics.registry).decode()
        refused = sum(1 for _, path, _ in ROUTE_CALLS if path not in SERVED[who])
        total = sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("qos_extender_agent_requests_refused_total{") and 'reason="identity"' in line
        )
        assert total == refused, metrics
    finally:
        await runner.cleanup()
        await agent.client.close()


async def test_authz_a_migration_belongs_to_the_agent_that_started_it(authz_pki: Pki, tmp_path: Path) -> None:
    """agent-b uploads the first archive of m-2: agent-a (another node's agent) can neither restore nor abort it,
    nor add archives; agent-b still can."""
    cfg = AgentConfig(node_name="authz-x", host="127.0.0.1", tls=authz_pki.tls("agent-a"), state_dir=str(tmp_path),
                      backend="simulated")  # fmt: skip
    agent = Agent(cfg, SimulatedBackend(InMemoryProgressStore()))
    runner, url = await serve_in_process(agent, "127.0.0.1")
    try:
        status, text = await _call(authz_pki, "agent-b", "PUT", f"{url}/v1/migrations/m-2/archive/final", None)
        assert status == 422, text  # served (a checksum mismatch: the sha256 header is zeros), and now owned by b
        for method, path, body in ROUTE_CALLS[2:7]:
            status, text = await _call(authz_pki, "agent-a", method, url + path.replace("m-1", "m-2"), body)
            assert status == 403 and "belongs to 'qos-agent:authz-b'" in text, (path, status, text)
        status, text = await _call(authz_pki, "agent-b", "POST", f"{url}/v1/migrations/m-2/abort", {})
        assert status == 200 and "aborted" in text, text
    finally:
        await runner.cleanup()
        await agent.client.close()


async def test_authz_a_destination_must_be_https_and_the_named_nodes_agent(authz_pki: Pki, tmp_path: Path) -> None:
    """Before any checkpoint: http, a destination without a node, this node, and an agent that is not the
    one named are refused (403, counted as destination); nothing is journaled."""
    src_cfg = AgentConfig(node_name="authz-a", host="127.0.0.1", tls=authz_pki.tls("agent-a"),
                          state_dir=str(tmp_path / "a"), backend="simulated")  # fmt: skip
    dst_cfg = AgentConfig(node_name="authz-b", host="127.0.0.2", tls=authz_pki.tls("agent-b"),
                          state_dir=str(tmp_path / "b"), backend="simulated")  # fmt: skip
    store = InMemoryProgressStore()
    src, dst = Agent(src_cfg, SimulatedBackend(store)), Agent(dst_cfg, SimulatedBackend(store))
    r1, u1 = await serve_in_process(src, "127.0.0.1")
    r2, u2 = await serve_in_process(dst, "127.0.0.2")
    await store.put("batch", "job", 1.0, stopped=False)
    wl = {"namespace": "batch", "pod": "job"}
    src_cfg_nopods = src_cfg.model_copy(update={"migration": MigrationPolicyConfig(check_pods=False)})
    src.config = src_cfg_nopods
    try:
        cases = [
            ({"url": u2.replace("https", "http"), "node": "authz-b"}, "is not https"),
            ({"url": u2}, "destination.node is required"),
            ({"url": u2, "node": "authz-a"}, "is this node"),
            ({"url": u2, "node": "authz-c"}, "not the agent of node authz-c"),
            ({"url": u1, "node": "authz-b"}, "not the agent of node authz-b"),
        ]
        for i, (dest, why) in enumerate(cases):
            body = {"id": f"dest-{i}", "workload": wl, "destination": dest}
            status, text = await _call(authz_pki, "ctl", "POST", f"{u1}/v1/migrations", body)
            assert status == 403 and why in text, (dest, status, text)
            assert src.journal.get("source", f"dest-{i}") is None, "refused before anything was journaled"
        metrics = generate_latest(src.metrics.registry).decode()
        assert (
            f'qos_extender_agent_requests_refused_total{{reason="destination",route="/v1/migrations"}} {len(cases)}.0'
            in metrics
        ), metrics
        # the named node's agent: served, and the migration happens
        body = {"id": "dest-ok", "workload": wl, "destination": {"url": u2, "node": "authz-b"}}
        status, text = await _call(authz_pki, "ctl", "POST", f"{u1}/v1/migrations", body)
        assert status == 200 and '"outcome":"succeeded"' in text, text
    finally:
        for r in (r1, r2):
            await r.cleanup()
        for a in (src, dst):
            await a.client.close()


async def test_authz_kube_system_and_pods_not_opted_in_are_refused_before_a_checkpoint(
    authz_pki: Pki, tmp_path: Path
) -> None:
    cfg = AgentConfig(node_name="authz-a", host="127.0.0.1", tls=authz_pki.tls("agent-a"), state_dir=str(tmp_path),
                      backend="simulated")  # fmt: skip
    store = InMemoryProgressStore()
    agent = Agent(cfg, SimulatedBackend(store))
    runner, url = await serve_in_process(agent, "127.0.0.1")
    await store.put("kube-system", "coredns-x", 1.0, stopped=False)
    try:
        body = {"workload": {"namespace": "kube-system", "pod": "coredns-x"},
                "destination": {"url": "https://127.0.0.2:1", "node": "authz-b"}}  # fmt: skip
        status, text = await _call(authz_pki, "ctl", "POST", f"{url}/v1/migrations", body)
        assert status == 403 and "namespace kube-system is never migrated" in text, text
        # no API access configured: a pod cannot be checked, so it is not moved
        body = {"workload": {"namespace": "batch", "pod": "job"},
                "destination": {"url": "https://127.0.0.2:1", "node": "authz-b"}}  # fmt: skip
        status, text = await _call(authz_pki, "ctl", "POST", f"{url}/v1/migrations", body)
        assert status == 403 and "no API access to read the pod" in text, text
        assert agent.journal.all("source") == [] and await store.get("kube-system", "coredns-x") == (1.0, False)
    finally:
        await runner.cleanup()
        await agent.client.close()


@pytest.mark.parametrize(
    ("limits", "why"),
    [
        ({"max_migration_bytes": 9}, "more than migration.max_migration_bytes (9)"),
        ({"max_staging_bytes": 9}, "staging is full: 0 bytes in use and 10 more asked"),
    ],
)
async def test_staging_is_bounded_per_migration_and_in_total(
    limits: dict[str, int], why: str, authz_pki: Pki, tmp_path: Path
) -> None:
    """An archive that would pass a bound is refused (507) before a byte is written, and counted."""
    cfg = AgentConfig(node_name="authz-a", host="127.0.0.1", tls=authz_pki.tls("agent-a"), state_dir=str(tmp_path),
                      backend="simulated", migration=MigrationPolicyConfig(**limits))  # fmt: skip
    agent = Agent(cfg, SimulatedBackend(InMemoryProgressStore()))
    runner, url = await serve_in_process(agent, "127.0.0.1")
    try:
        status, text = await _call(authz_pki, "agent-b", "PUT", f"{url}/v1/migrations/big/archive/final", None)
        assert status == 507 and why in text, (status, text)
        assert not any(p.is_file() for p in tmp_path.rglob("*.part")), "nothing was written"
        metrics = generate_latest(agent.metrics.registry).decode()
        assert 'qos_extender_agent_requests_refused_total{reason="staging"' in metrics
    finally:
        await runner.cleanup()
        await agent.client.close()
