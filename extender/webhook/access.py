"""Who may call what on the TLS listener: a pure decision over (path, the client certificate's subject CNs).

The TLS handshake (client_ca_file, CERT_OPTIONAL) only proves that a presented certificate was signed by the
CA; the CA may sign several identities (kube-scheduler's, Prometheus'...). A certificate is an identity, not a
permission, so each path names the identities it serves: the verbs (``/bind`` creates Bindings) only the
scheduler's, ``/metrics`` only the scraper's. kubelet probes and the API server's admission calls carry no
certificate (managed control planes cannot give the API server one), so those paths stay anonymous; none of
them changes the cluster.
"""

from __future__ import annotations

from collections.abc import Iterable

from extender.settings.sections import TlsConfig
from extender.tls import subject_common_names

__all__ = ["ANONYMOUS_PATHS", "VERB_PATHS", "denial", "subject_common_names"]

VERB_PATHS = frozenset({"/filter", "/prioritize", "/preempt", "/bind"})
ANONYMOUS_PATHS = frozenset({"/healthz", "/readyz", "/admission/mutate"})


def denial(path: str, has_certificate: bool, names: Iterable[str], tls: TlsConfig) -> str | None:
    """None when the client may call ``path``, else the reason for a 403 (names the option to change)."""
    if path in ANONYMOUS_PATHS:
        return None
    if not has_certificate:
        return f"{path} requires a client certificate signed by server.tls.client_ca_file"
    if path in VERB_PATHS:
        allowed, option = tls.verb_clients, "server.tls.verb_clients"
    elif path == "/metrics":
        allowed, option = tls.metrics_clients, "server.tls.metrics_clients"
    else:
        return None  # any other path is a 404/405 for every authenticated client
    given = tuple(names)
    if any(n in allowed for n in given):
        return None
    who = ", ".join(repr(n) for n in given) or "no CN"
    return f"client certificate ({who}) is not allowed on {path}: add its subject CN to {option}"
