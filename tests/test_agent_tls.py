"""mTLS between agents and from the controller: a throwaway CA (openssl CLI) and certs; no cert, a cert from
another CA, or a server that is not who it claims are all refused."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from extender.agent.backends.simulated import InMemoryProgressStore, SimulatedBackend
from extender.agent.client import AgentClient, PeerError
from extender.agent.server import Agent
from extender.agent.settings import AgentConfig, AgentTlsConfig
from tests.test_agent_support import Pki, make_pki, serve_in_process


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), {"agent-a": "127.0.0.1", "agent-b": "127.0.0.2", "ctl": ""})


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
