"""TLS for every server and client we run: contexts built from PEM files, reloaded when the files change, and
the identity a verified peer certificate carries.

Why reload: certificates are short-lived where users run us (cert-manager renews at 2/3 of their life, our own
agent identities live a day), and a kubelet updates a mounted Secret in place. A process that read its files
once keeps serving an expired certificate until someone restarts it. OpenSSL lets a live ``SSLContext`` take a
new chain (``load_cert_chain`` again): the next handshake uses it, connections already open keep theirs.

Why identities are read here: a certificate of a CA proves only that the CA signed it; the CA signs several
identities (the scheduler's, Prometheus', each agent's). Each server decides per route which identities may
call it (``extender.webhook.access``, ``extender.agent.authz``); this module only says who the peer is.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CertificateFiles",
    "CertificateReloader",
    "client_context",
    "fingerprint",
    "server_context",
    "subject_common_names",
]

log = logging.getLogger("extender.tls")


@dataclass(frozen=True)
class CertificateFiles:
    """Where a process's certificate, key and trusted CA live (PEM). ``ca`` is None for a server that asks no
    client certificate."""

    cert: str
    key: str
    ca: str | None = None

    def paths(self) -> tuple[str, ...]:
        return tuple(p for p in (self.cert, self.key, self.ca) if p)


def fingerprint(paths: Iterable[str]) -> str:
    """A digest of the files' contents ("" for a missing file): what changed, not when (mtimes of a Secret
    volume's symlinked files say little)."""
    h = hashlib.sha256()
    for p in paths:
        try:
            h.update(Path(p).read_bytes())
        except OSError:
            h.update(b"\0missing\0")
        h.update(b"\0")
    return h.hexdigest()


def server_context(files: CertificateFiles, *, client_certificate: str = "required") -> ssl.SSLContext:
    """A TLS 1.2+ server context. ``client_certificate``: "required" (mTLS), "optional" (a certificate, when
    presented, must verify; routes then decide who needs one) or "none"."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(files.cert, files.key)
    if client_certificate != "none":
        if files.ca is None:
            raise ValueError("a client certificate is asked for but no CA file verifies it")
        ctx.load_verify_locations(cafile=files.ca)
        ctx.verify_mode = ssl.CERT_REQUIRED if client_certificate == "required" else ssl.CERT_OPTIONAL
    return ctx


def client_context(files: CertificateFiles) -> ssl.SSLContext:
    """A client context that verifies the server against ``files.ca`` (host name checked) and presents our
    certificate."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=files.ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(files.cert, files.key)
    return ctx


@dataclass
class CertificateReloader:
    """Reloads the certificate chain (and adds the CA) of live contexts when their files' contents change.

    A CA added is trusted from then on; a CA removed from the file stays trusted until the process restarts
    (OpenSSL's store only grows): rotate a CA by adding the new one beside the old, then restart."""

    files: CertificateFiles
    contexts: list[ssl.SSLContext] = field(default_factory=list)
    on_reload: Callable[[bool], None] | None = None
    """Called with True after a reload, False after a failed one (the old chain stays in use)."""
    _seen: str = ""

    def __post_init__(self) -> None:
        self._seen = fingerprint(self.files.paths())

    def check(self) -> bool:
        """Reload if the files changed since the last load; True when a reload happened."""
        now = fingerprint(self.files.paths())
        if now == self._seen:
            return False
        try:
            for ctx in self.contexts:
                ctx.load_cert_chain(self.files.cert, self.files.key)
                if self.files.ca and ctx.verify_mode != ssl.CERT_NONE:
                    ctx.load_verify_locations(cafile=self.files.ca)
        except (OSError, ssl.SSLError) as exc:
            # Half-written files (a Secret update is atomic, a hand copy is not): keep the old chain, try later.
            log.warning("certificate reload failed", extra={"decision": "kept", "error": str(exc)})
            if self.on_reload is not None:
                self.on_reload(False)
            return False
        self._seen = now
        log.info("certificates reloaded", extra={"decision": {"cert": self.files.cert}})
        if self.on_reload is not None:
            self.on_reload(True)
        return True

    async def run(self, interval_seconds: float = 30.0) -> None:
        while True:
            await asyncio.sleep(interval_seconds)
            self.check()


def subject_common_names(peercert: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The CN values of a verified peer certificate as ``ssl.SSLSocket.getpeercert()`` returns it."""
    if not peercert:
        return ()
    out: list[str] = []
    for rdn in peercert.get("subject", ()):
        for attr in rdn:
            if len(attr) == 2 and attr[0] == "commonName" and isinstance(attr[1], str):
                out.append(attr[1])
    return tuple(out)
