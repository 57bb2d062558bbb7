"""What stands in front of the sidecar's two gRPC servers (the expander, the externalgrpc cloud provider): the
receive limit, the caller's identity, the count of every refused or failed call, and certificates that follow their
files.

Why a limit of our own and a count: gRPC refuses a message above its receive limit (4 MiB unless told) before any
handler runs, and cluster-autoscaler (CA) then quietly falls back to its own expander, or its loop fails, with
nothing on our side to show it. Each method is therefore registered as a *stream-unary* handler: on the wire a
unary call and a client stream are the same HTTP/2 request, so CA's unary call reaches it unchanged, but the
handler runs before the message is read. When the transport refused the message as too large, the handler sees a
stream with no message, counts it (reason ``too_large``) and answers RESOURCE_EXHAUSTED (the client sees gRPC's own
"Received message larger than max (N vs. L)"). No unary client sends zero messages, so "no message" means the
limit. The limit itself is ``max_message_bytes`` (measured for a 5,000-node cluster: bench/ca_message_sizes.py).

Why the identity is checked here: mTLS proves only that the client CA signed the certificate; that CA may sign
other identities too. Each call's certificate names (subject CN and SAN) must include one of ``allowed``, else
PERMISSION_DENIED, counted (``permission_denied``). ``allowed`` None: the server asks no client certificate (CA's
gRPC expander client presents none) and the check is skipped.

Why certificates reload here: ``grpc.dynamic_ssl_server_credentials`` asks a fetcher before each handshake; the
fetcher stats the files (cheap) and re-reads them only when a stat changed, validates the pair with OpenSSL and
hands gRPC the new chain (connections already open keep theirs). Every reload and every failed one is counted.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, NoReturn

import grpc

from extender.autoscaler.metrics import AutoscalerMetrics
from extender.tls import CertificateFiles, fingerprint

__all__ = ["GrpcGuard", "ReloadingServerCredentials", "peer_names"]

log = logging.getLogger("extender.autoscaler.grpc")

# gRPC status codes that mean a call failed or was refused (not an answer the protocol expects, such as
# NodeGroupGetOptions' UNIMPLEMENTED or PricingNodePrice's NOT_FOUND, which CA handles by design).
FAILURE_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)


def peer_names(auth: Mapping[str, Iterable[bytes]]) -> tuple[str, ...]:
    """Subject CN(s) and SAN entries (DNS, IP, URI, email) of the verified client certificate, from gRPC's
    ``context.auth_context()``; () without a client certificate."""
    out: list[str] = []
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for value in auth.get(key, ()):
            name = value.decode(errors="replace")
            if name not in out:
                out.append(name)
    return tuple(out)


class _CountingContext:
    """The servicer context a method is handed: its ``abort`` counts the refusal *before* gRPC sends the status.

    Why: grpc.aio's ``abort`` sends the status from inside the call and only then raises, so a count taken
    where the exception is caught can come after the caller has its answer: a scrape (or a test) right after a
    refused call could miss it. Everything else is the context itself."""

    def __init__(self, context: Any, refused: Callable[[str], None]) -> None:
        self._context = context
        self._refused = refused
        self.aborted = False

    async def abort(self, code: grpc.StatusCode, details: str = "", *args: Any, **kwargs: Any) -> NoReturn:
        if not self.aborted and code in FAILURE_CODES:
            self.aborted = True
            self._refused(code.name.lower())
        await self._context.abort(code, details, *args, **kwargs)
        raise AssertionError("unreachable: context.abort raises")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


class GrpcGuard:
    """Registers one server's methods behind the receive limit, the identity check and the refusal count."""

    def __init__(
        self,
        server: str,
        *,
        max_message_bytes: int,
        allowed: tuple[str, ...] | None,
        allowed_option: str,
        metrics: AutoscalerMetrics | None,
    ) -> None:
        self.server = server
        self.max_message_bytes = max_message_bytes
        self.allowed = allowed
        self.allowed_option = allowed_option
        self.metrics = metrics
        self.calls: dict[str, int] = {}  # requests received per method (bench/ca_message_sizes.py, tests)
        self.largest: dict[str, int] = {}  # the largest request per method, in bytes (exact: the histogram buckets)

    def server_options(self) -> list[tuple[str, int]]:
        """gRPC channel arguments of the server: our receive limit (the transport enforces it)."""
        return [("grpc.max_receive_message_length", self.max_message_bytes)]

    def refused(self, method: str, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.refused_calls.labels(self.server, method, reason).inc()

    async def _refuse(self, context: Any, method: str, reason: str, code: grpc.StatusCode, message: str) -> NoReturn:
        self.refused(method, reason)
        log.warning(
            "%s %s refused: %s", self.server, method, message, extra={"decision": {"reason": reason, "code": code.name}}
        )
        await context.abort(code, message)
        raise AssertionError("unreachable: context.abort raises")

    def handler(
        self, method: str, call: Callable[[bytes, Any], Awaitable[Any]]
    ) -> grpc.RpcMethodHandler[AsyncIterator[bytes], Any]:
        """``call(raw_request, context)`` behind the checks, as a stream-unary handler (see the module docstring)."""

        async def handle(requests: AsyncIterator[bytes], context: Any) -> Any:
            if self.allowed is not None:
                names = peer_names(context.auth_context())
                if not any(n in self.allowed for n in names):
                    who = ", ".join(repr(n) for n in names) or "no client certificate"
                    await self._refuse(
                        context,
                        method,
                        "permission_denied",
                        grpc.StatusCode.PERMISSION_DENIED,
                        f"client certificate ({who}) may not call {method}: "
                        f"add its CN or a SAN to {self.allowed_option}",
                    )
            raw: bytes | None = None
            extra = False
            async for message in requests:
                if raw is None:
                    raw = message
                else:
                    extra = True
                    break
            if raw is None:
                await self._refuse(
                    context,
                    method,
                    "too_large",
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"no request message: larger than the receive limit ({self.max_message_bytes} bytes, "
                    "max_message_bytes), refused by the transport",
                )
            if extra:
                await self._refuse(
                    context, method, "invalid_argument", grpc.StatusCode.INVALID_ARGUMENT, "more than one message"
                )
            self.calls[method] = self.calls.get(method, 0) + 1
            self.largest[method] = max(self.largest.get(method, 0), len(raw))
            if self.metrics is not None:
                self.metrics.grpc_message_bytes.labels(self.server, method).observe(len(raw))
            counted = _CountingContext(context, lambda reason: self.refused(method, reason))
            try:
                response = await call(raw, counted)
            except BaseException:
                code = context.code()
                remaining = context.time_remaining()
                if counted.aborted:
                    pass  # counted by the abort itself, before its status went out
                elif code is None and remaining is not None and remaining <= 0:  # cancelled at the client's deadline
                    self.refused(method, "deadline_exceeded")
                elif isinstance(code, grpc.StatusCode) and code in FAILURE_CODES:
                    self.refused(method, code.name.lower())
                elif code is None:  # an exception the method did not turn into a status: gRPC answers UNKNOWN
                    self.refused(method, "unknown")
                raise
            remaining = context.time_remaining()
            if remaining is not None and remaining <= 0:  # the client stopped waiting: it never saw this answer
                self.refused(method, "deadline_exceeded")
                log.warning("%s %s answered after the client's deadline", self.server, method)
            return response

        return grpc.stream_unary_rpc_method_handler(
            handle,
            request_deserializer=None,  # raw bytes: the methods parse them (decode errors -> INVALID_ARGUMENT)
            response_serializer=lambda response: response.SerializeToString(),
        )


class ReloadingServerCredentials:
    """gRPC server credentials whose certificate (and client CA) follow their files (see the module docstring)."""

    def __init__(
        self,
        files: CertificateFiles,
        *,
        client_auth: bool,
        on_reload: Callable[[bool], None] | None = None,
    ) -> None:
        self.files = files
        self.client_auth = client_auth
        self.on_reload = on_reload
        self._stat = self._stat_key()
        self._seen = fingerprint(files.paths())
        self.credentials = grpc.dynamic_ssl_server_credentials(
            self._config(), self._fetch, require_client_authentication=client_auth
        )

    def _stat_key(self) -> tuple[tuple[int, int, int] | None, ...]:
        out: list[tuple[int, int, int] | None] = []
        for p in self.files.paths():
            try:
                st = os.stat(p)  # follows a Secret volume's ..data symlink: a new inode on every update
            except OSError:
                out.append(None)
            else:
                out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(out)

    def _config(self) -> Any:
        # OpenSSL checks the pair and the bundle first: gRPC itself would only fail the next handshakes
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.files.cert, self.files.key)
        ca = None
        if self.files.ca is not None:
            ctx.load_verify_locations(cafile=self.files.ca)
            with open(self.files.ca, "rb") as f:
                ca = f.read()
        with open(self.files.key, "rb") as k, open(self.files.cert, "rb") as c:
            pair = (k.read(), c.read())
        return grpc.ssl_server_certificate_configuration([pair], root_certificates=ca)

    def check(self) -> Any:
        """A new certificate configuration when the files changed (and load), else None: gRPC's fetcher."""
        key = self._stat_key()
        if key == self._stat:
            return None
        now = fingerprint(self.files.paths())
        if now == self._seen:
            self._stat = key
            return None
        self._stat = key  # judged once per change of the files: a broken pair is not counted at every handshake
        try:
            config = self._config()
        except (OSError, ssl.SSLError, ValueError) as exc:
            # a half-written pair: keep serving the old one; the complete write changes the files again
            log.warning("certificate reload failed", extra={"decision": {"cert": self.files.cert, "error": str(exc)}})
            if self.on_reload is not None:
                self.on_reload(False)
            return None
        self._seen = now
        log.info("certificates reloaded", extra={"decision": {"cert": self.files.cert}})
        if self.on_reload is not None:
            self.on_reload(True)
        return config

    def _fetch(self) -> Any:
        try:
            return self.check()
        except Exception:  # never break a handshake over the reload itself
            log.exception("certificate reload check failed")
            return None
