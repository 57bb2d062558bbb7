"""The API client the binder, the controller and the watches share: what it sends, from a real HTTP server's
view (asyncio streams standing in for the API server)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from kubernetes_asyncio import client as k8s

from extender.kube.client import environment_proxy, new_api_client, read_json
from extender.settings.extender import KubernetesConfig


async def _namespace_server(heads: list[str]) -> asyncio.Server:
    """An API server stand-in on 127.0.0.1 that records each request's head and answers an empty NamespaceList."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append((await reader.readuntil(b"\r\n\r\n")).decode())
        body = b'{"kind": "NamespaceList", "items": [], "metadata": {}}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        writer.write(body)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


def _kubeconfig(tmp_path: Path, port: int, user: str) -> Path:
    """A kubeconfig for the stand-in server on 127.0.0.1:``port`` over plain HTTP, ``user`` as its YAML."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        f"users: [{{name: u, user: {user}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: u}}}}]\n"
    )
    return path


async def test_requests_never_carry_netrc_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp with trust_env reads ~/.netrc on every request (in a thread) and sends its password as Basic
    auth: the API server must never get it, and the file is not read per request."""
    heads: list[str] = []
    server = await _namespace_server(heads)
    port = server.sockets[0].getsockname()[1]
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    kubeconfig = _kubeconfig(tmp_path, port, "{}")
    api = await new_api_client(KubernetesConfig(kubeconfig=str(kubeconfig)))
    try:
        await read_json(await k8s.CoreV1Api(api).list_namespace(_preload_content=False))
    finally:
        await api.close()
        server.close()
    assert len(heads) == 1 and heads[0].startswith("GET /api/v1/namespaces")
    assert "authorization" not in heads[0].lower()


def test_the_environment_proxy_is_resolved_once_like_client_go(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    assert environment_proxy("https://10.0.0.1:6443") is None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert environment_proxy("https://10.0.0.1:6443") == "http://proxy.invalid:3128"
    assert environment_proxy("http://10.0.0.1:8080") is None  # only HTTPS_PROXY set
    monkeypatch.setenv("NO_PROXY", "10.0.0.1,.cluster.local")
    assert environment_proxy("https://10.0.0.1:6443") is None
    assert environment_proxy("https://api.cluster.local:6443") is None
    assert environment_proxy("https://10.0.0.2:6443") == "http://proxy.invalid:3128"


async def test_the_binders_client_shares_credentials_not_connections(tmp_path: Path) -> None:
    """The Binding POSTs' client (sibling_client) talks as the same identity to the same server without
    reading the kubeconfig again (deleted here before it is made), over a connection pool of its own."""
    from extender.kube.client import sibling_client

    heads: list[str] = []
    server = await _namespace_server(heads)
    port = server.sockets[0].getsockname()[1]
    kubeconfig = _kubeconfig(tmp_path, port, "{token: t0k3n}")
    api = await new_api_client(KubernetesConfig(kubeconfig=str(kubeconfig)))
    kubeconfig.unlink()
    binder = sibling_client(api)
    try:
        assert binder.rest_client.pool_manager is not api.rest_client.pool_manager
        for client in (api, binder):
            await read_json(await k8s.CoreV1Api(client).list_namespace(_preload_content=False))
    finally:
        await binder.close()
        await api.close()
        server.close()
    assert len(heads) == 2
    for head in heads:
        assert "authorization: bearer t0k3n" in head.lower(), head


async def test_the_binders_pool_has_no_cap_and_leaves_the_main_one_alone(tmp_path: Path) -> None:
    """binder_client (issue 34): no cap on the binder's connections (a cap queued binds in front of the API
    server; tests/test_binder_live.py bursts past it), same identity, and the main client keeps its own cap."""
    from extender.kube.client import binder_client

    heads: list[str] = []
    server = await _namespace_server(heads)
    port = server.sockets[0].getsockname()[1]
    kubeconfig = _kubeconfig(tmp_path, port, "{token: t0k3n}")
    api = await new_api_client(KubernetesConfig(kubeconfig=str(kubeconfig)))
    binder = binder_client(api)
    try:
        assert binder.rest_client.pool_manager.connector.limit == 0
        assert api.rest_client.pool_manager.connector.limit == api.configuration.connection_pool_maxsize > 0
        await read_json(await k8s.CoreV1Api(binder).list_namespace(_preload_content=False))
    finally:
        await binder.close()
        await api.close()
        server.close()
    assert len(heads) == 1 and "authorization: bearer t0k3n" in heads[0].lower()
