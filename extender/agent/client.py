"""HTTP client of the agent API (mTLS): used by a source agent towards a destination, and by controllers.

Every failure becomes a ``PeerError`` whose ``kind`` the protocol understands: TRANSIENT (connection
error, timeout, 5xx, 422 checksum mismatch — worth retrying) or REFUSED (any other 4xx: deliberate).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from yarl import URL

from extender.agent.archive import CHUNK, ArchiveInfo
from extender.agent.faults import FaultInjection, FaultPoint
from extender.agent.protocol import ARCHIVE_SHA256_HEADER, ARCHIVE_SIZE_HEADER, FailureKind, Stage
from extender.agent.settings import AgentTlsConfig
from extender.tls import subject_common_names

__all__ = ["AgentClient", "PeerError", "client_ssl_context"]


class PeerError(Exception):
    def __init__(self, kind: FailureKind, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        self.status = status


def client_ssl_context(tls: AgentTlsConfig) -> ssl.SSLContext | None:
    """Verify the peer against the agents' CA and present this agent's certificate."""
    if not tls.enabled:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls.ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    assert tls.cert_file is not None and tls.key_file is not None
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    return ctx


def _kind_of(status: int) -> FailureKind:
    if status >= 500 or status in (408, 422, 429):
        return FailureKind.TRANSIENT
    return FailureKind.REFUSED


class AgentClient:
    def __init__(
        self,
        tls: AgentTlsConfig,
        timeout_seconds: float = 60.0,
        faults: FaultInjection | None = None,
    ) -> None:
        self._ssl = client_ssl_context(tls)
        self.ssl_context = self._ssl
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds, sock_connect=5)
        self._faults = faults or FaultInjection()
        self._session: aiohttp.ClientSession | None = None
        self._pins: dict[str, str] = {}

    def pin(self, base_url: str, identity: str) -> None:
        """From now on, every call under ``base_url`` must be answered by a certificate whose CN is ``identity``
        (an agent's ``qos-agent:<node>``): the CA's signature proves "one of our identities", the CN which one.
        Without TLS (tests only) there is nothing to check."""
        self._pins[base_url.rstrip("/")] = identity

    def _pinned(self, url: str) -> str | None:
        for base, identity in self._pins.items():
            if url == base or url.startswith(base + "/"):
                return identity
        return None

    def _s(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # force_close: a peer that restarted must not be reached through a dead pooled connection
            connector = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else False, force_close=True)
            self._session = aiohttp.ClientSession(timeout=self._timeout, connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        url: str,
        body: Any = None,
        *,
        data: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
        stream: bool = False,
    ) -> dict[str, Any]:
        hdrs = dict(headers or {})
        payload = data
        if body is not None:
            payload = orjson.dumps(body)
            hdrs["Content-Type"] = "application/json"
        kwargs: dict[str, Any] = {}
        if stream:  # an archive of any size: no total deadline, but a stalled peer still times out
            idle = timeout if timeout is not None else self._timeout.total
            kwargs["timeout"] = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=idle)
        elif timeout is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout, sock_connect=5)
        try:
            expected = self._pinned(url) if self._ssl is not None else None
            if expected is not None:
                names = await self.peer_identity(url)
                if expected not in names:
                    raise PeerError(
                        FailureKind.REFUSED, f"{url} answered as {', '.join(names) or 'no identity'}, not as {expected}"
                    )
            # No redirects: a peer must answer itself; a 3xx could point the archive anywhere.
            async with self._s().request(
                method, url, data=payload, headers=hdrs, allow_redirects=False, **kwargs
            ) as resp:
                raw = await resp.read()
                try:
                    parsed = orjson.loads(raw) if raw else {}
                except orjson.JSONDecodeError:
                    parsed = {"error": raw[:300].decode(errors="replace")}
                if resp.status >= 300:  # a redirect is not an answer
                    reason = parsed.get("error", resp.reason) if isinstance(parsed, dict) else resp.reason
                    raise PeerError(_kind_of(resp.status), f"{resp.status}: {reason}", resp.status)
                return parsed if isinstance(parsed, dict) else {"value": parsed}
        except PeerError:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError, _CutError) as exc:
            raise PeerError(FailureKind.TRANSIENT, f"{type(exc).__name__}: {exc or 'connection failed'}") from None

    async def peer_identity(self, url: str) -> tuple[str, ...]:
        """The subject CNs of the certificate ``url``'s server presents, after the same verification as every
        call (our CA, the host name/IP in its SANs). A handshake of its own: aiohttp does not show the peer's
        certificate of a pooled connection. The IP binding the SANs make is what keeps later calls to the
        same URL on the same agent; this names which agent that is."""
        assert self._ssl is not None
        parsed = URL(url)
        host, port = parsed.host or "", parsed.port or 443
        async with asyncio.timeout(10):
            _, writer = await asyncio.open_connection(host, port, ssl=self._ssl, server_hostname=host)
        try:
            return subject_common_names(writer.get_extra_info("peercert"))
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _chunks(self, path: Path) -> AsyncIterator[bytes]:
        cut = self._faults.fires(FaultPoint.SOURCE_CUT_TRANSFER)
        corrupt = self._faults.fires(FaultPoint.SOURCE_CORRUPT_TRANSFER)
        sent = 0
        with path.open("rb") as f:
            while True:
                chunk = await asyncio.to_thread(f.read, CHUNK // 4 if cut else CHUNK)
                if not chunk:
                    return
                if corrupt:
                    corrupt = False
                    mid = len(chunk) // 2
                    chunk = chunk[:mid] + bytes([chunk[mid] ^ 0xFF]) + chunk[mid + 1 :]
                if cut and sent + len(chunk) > self._faults.cut_after_bytes:
                    yield chunk[: max(0, self._faults.cut_after_bytes - sent)]
                    raise _CutError("TEST FAULT: connection cut mid-transfer")
                sent += len(chunk)
                yield chunk

    async def upload(self, base: str, mid: str, stage: Stage, archive: ArchiveInfo) -> dict[str, Any]:
        headers = {
            ARCHIVE_SIZE_HEADER: str(archive.size),
            ARCHIVE_SHA256_HEADER: archive.sha256,
            "Content-Type": "application/x-tar",
        }
        return await self.request(
            "PUT",
            f"{base}/v1/migrations/{mid}/archive/{stage.value}",
            data=self._chunks(archive.path),
            headers=headers,
            stream=True,
        )


class _CutError(ConnectionError):
    pass
