"""An ApiClient for the configured cluster, and raw JSON requests that skip the generated model classes."""

from __future__ import annotations

import copy
import os
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
import orjson
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

from extender.settings.sections import KubernetesConfig

__all__ = [
    "ApiError",
    "RawCore",
    "binder_client",
    "environment_proxy",
    "kubeconfig_path",
    "new_api_client",
    "read_json",
]


class ApiError(Exception):
    """A non-2xx answer from the API server, with its Status reason/message when it sent one."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message


def kubeconfig_path(kcfg: KubernetesConfig) -> str | None:
    """config.kubeconfig, else the first file in $KUBECONFIG, else ~/.kube/config; None: use in-cluster."""
    if kcfg.kubeconfig:
        return kcfg.kubeconfig
    env = os.environ.get("KUBECONFIG", "")
    for part in env.split(os.pathsep):
        if part and Path(part).is_file():
            return part
    default = Path.home() / ".kube" / "config"
    return str(default) if default.is_file() else None


async def new_api_client(kcfg: KubernetesConfig) -> Any:
    """A kubernetes_asyncio ApiClient (close it with ``await client.close()``)."""
    configuration = k8s.Configuration()
    path = kubeconfig_path(kcfg)
    if path is not None:
        await k8s_config.load_kube_config(config_file=path, context=kcfg.context, client_configuration=configuration)
    else:
        incluster: Any = k8s_config.load_incluster_config  # untyped in kubernetes_asyncio
        incluster(client_configuration=configuration)
    # aiohttp's per-session connection limit; the controller alone may have controller.release_concurrency
    # (48) PATCHes, 8 account writes and Events in flight next to the two watches' long-lived connections.
    configuration.connection_pool_maxsize = 128
    if not configuration.proxy:
        configuration.proxy = environment_proxy(str(configuration.host))
    return _client(configuration)


def sibling_client(api: Any, *, connection_limit: int | None = None) -> Any:
    """Another ApiClient on ``api``'s credentials with a connection pool of its own (the binder's): the
    kubeconfig or service-account token is read once, so both clients always talk to the same server as the
    same identity, and a second read cannot fail after the first succeeded.

    ``connection_limit``: the pool's cap on connections (None: ``api``'s; 0: none). aiohttp speaks HTTP/1.1,
    one request per connection, so a cap is a FIFO queue in front of the API server once that many requests
    are in flight."""
    configuration = api.configuration
    if connection_limit is not None:
        # a copy: the other client keeps its own cap (Configuration's deepcopy shares the loggers; an
        # in-cluster token refresh hook is called with the configuration it refreshes, so it runs on the copy)
        configuration = copy.deepcopy(configuration)
        configuration.connection_pool_maxsize = connection_limit
    return _client(configuration)


def binder_client(api: Any) -> Any:
    """The binder's ApiClient (``sibling_client``): ``api``'s credentials, a pool of its own, no connection cap.

    Each connection serves one Binding POST, and the binder holds at most ``bind.max_in_flight`` of them at
    once (kube.binder.KubeBinder): that, not the pool, is the one cap. A pool cap (it was 128) queued binds
    inside aiohttp, where a wait for a connection cannot be told from a POST on the wire: in a 2,000-pod burst
    1,681 of 2,000 binds waited for a connection, p50 1.4 s of the verb's 2.1 s (issue 34;
    bench/results/e2e-throughput-investigation-2026-11-26.md)."""
    return sibling_client(api, connection_limit=0)


def _client(configuration: Any) -> Any:
    api = k8s.ApiClient(configuration=configuration)
    # kubernetes_asyncio's session trusts the environment, so aiohttp looks up the proxy variables and reads
    # ~/.netrc on every request (in a thread: a thread hop and GIL handover per Binding POST and release PATCH,
    # ~11 % of the event loop at 2,000 pods), and would send a netrc password to the API server. The proxy is
    # resolved once above instead, as client-go does (http.ProxyFromEnvironment); netrc is never read.
    api.rest_client.pool_manager._trust_env = False
    return api


def environment_proxy(server: str) -> str | None:
    """The proxy the environment (HTTPS_PROXY / HTTP_PROXY / NO_PROXY) names for ``server``, or None."""
    url = urlsplit(server)
    proxy = urllib.request.getproxies_environment().get(url.scheme or "https")
    if not proxy or urllib.request.proxy_bypass_environment(url.hostname or ""):  # type: ignore[attr-defined]
        return None
    return proxy


async def read_json(response: Any) -> Any:
    """Body of a raw (``_preload_content=False``) response as JSON; raises ApiError on a non-2xx status."""
    try:
        raw = await response.read()
    finally:
        response.release()
    status = int(response.status)
    if 200 <= status < 300:
        return orjson.loads(raw) if raw else None
    reason, message = str(response.reason or ""), ""
    try:
        body = orjson.loads(raw)
        if isinstance(body, dict):
            reason = str(body.get("reason") or reason)
            message = str(body.get("message") or "")
    except orjson.JSONDecodeError:
        message = raw[:200].decode("utf-8", "replace")
    raise ApiError(status, reason, message)


class RawCore:
    """The CoreV1Api calls made once per pod of a burst, the Binding POST and the gate's release PATCH, sent
    as they are on the wire: the body serialised once with orjson and handed to the ApiClient's own aiohttp
    session, with its credentials (``update_params_for_auth``: a rotating service-account token is re-read as
    for every generated call), proxy and TLS server name. The generated path validated every keyword, walked the
    body through ``sanitize_for_serialization``, then ``json.dumps`` and wrapped the answer: 32 of the Binding
    POST's 87 py-spy samples, against 8 of 49 this way (issue 34). The method names and arguments are
    CoreV1Api's, so the RBAC checks of tests/test_manifests.py read these calls like the generated ones. Answers:
    the decoded JSON, ApiError on a non-2xx status; aiohttp's and asyncio's errors pass through unchanged, as from
    the generated client. The binder's read of a pod after a 409 goes the same way, so the binder needs no
    generated client at all."""

    def __init__(self, api: Any) -> None:
        self._api = api

    async def _send(self, method: str, path: str, body: bytes | None, content_type: str, timeout: float) -> Any:
        api = self._api
        headers = {**api.default_headers, "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        await api.update_params_for_auth(headers, [], ["BearerToken"])
        rest = api.rest_client
        extra: dict[str, Any] = {}
        if rest.proxy:
            extra["proxy"] = rest.proxy
            if rest.proxy_headers:
                extra["proxy_headers"] = rest.proxy_headers
        if rest.server_hostname:
            extra["server_hostname"] = rest.server_hostname
        response = await rest.pool_manager.request(
            method,
            api.configuration.host + path,
            data=body,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout),
            **extra,
        )
        return await read_json(response)

    async def create_namespaced_pod_binding(
        self, name: str, namespace: str, body: Mapping[str, Any], *, timeout: float
    ) -> Any:
        return await self._send(
            "POST", _pod_path(namespace, name) + "/binding", orjson.dumps(body), "application/json", timeout
        )

    async def read_namespaced_pod(self, name: str, namespace: str, *, timeout: float) -> Any:
        return await self._send("GET", _pod_path(namespace, name), None, "", timeout)

    async def patch_namespaced_pod(
        self, name: str, namespace: str, ops: Sequence[Mapping[str, Any]], *, timeout: float
    ) -> Any:
        """A JSON patch (RFC 6902) of the pod."""
        return await self._send(
            "PATCH", _pod_path(namespace, name), orjson.dumps(ops), "application/json-patch+json", timeout
        )


def _pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"
