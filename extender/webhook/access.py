"""Who may call what on the extender's listeners: a pure decision over (listener, path, the client certificate's
subject CNs), and the table that names, for every route, who its callers are.

The TLS handshake (client_ca_file, CERT_OPTIONAL) only proves that a presented certificate was signed by the
CA; the CA may sign several identities (kube-scheduler's, Prometheus'...). A certificate is an identity, not a
permission, so each path names the identities it serves: the verbs (``/bind`` creates Bindings) only the
scheduler's, ``/metrics`` only the scraper's. kubelet probes and the API server's admission calls carry no
certificate (managed control planes cannot give the API server one), so those paths stay anonymous; none of
them changes the cluster (admission only answers a patch the API server applies to the pod being created).

``/bind`` fails closed: on the main listener it needs a configured scheduler identity (a client CA and a
``verb_clients`` CN); without one nobody may bind there, rather than everybody. The loopback listener
(``server.loopback_verbs_port``) is reachable only from the pod's own network namespace: configuring it is what
names its caller (the kube-scheduler container beside us), so its verbs need no certificate.

Every refusal has a reason code (a label of qos_extender_requests_refused_total) and a message that names the
option to change, so an operator sees both that something was refused and why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from extender.settings.sections import TlsConfig
from extender.tls import subject_common_names

__all__ = [
    "ANONYMOUS_PATHS",
    "ROUTES",
    "VERB_PATHS",
    "Listener",
    "Refusal",
    "denial",
    "route_label",
    "subject_common_names",
]

Listener = Literal["main", "loopback"]

VERB_PATHS = frozenset({"/filter", "/prioritize", "/preempt", "/bind"})
ANONYMOUS_PATHS = frozenset({"/healthz", "/readyz", "/admission/mutate"})

ROUTES: Mapping[str, str] = {
    "/filter": "kube-scheduler: a client certificate whose CN is in server.tls.verb_clients, or the loopback listener",
    "/prioritize": "kube-scheduler (as /filter)",
    "/preempt": "kube-scheduler (as /filter)",
    "/bind": "kube-scheduler (as /filter); refused to everyone on a listener where no scheduler identity is "
    "configured (no client_ca_file or empty verb_clients)",
    "/metrics": "Prometheus: a client certificate whose CN is in server.tls.metrics_clients",
    "/admission/mutate": "the API server (anonymous: it presents no client certificate; a NetworkPolicy admits "
    "only the control plane where the cluster enforces them); body bounded by server.admission_max_body_bytes",
    "/healthz": "anyone (kubelet probes; no data)",
    "/readyz": "anyone (kubelet probes; no data)",
}
"""Who may call each route (documentation and the metric's route label: anything else is ``other``)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: ``reason`` is a short label for the metric, ``message`` the 403's text."""

    reason: str
    message: str


def route_label(path: str) -> str:
    """The metric's route label: a known route, else ``other`` (a scanner's paths must not grow the series)."""
    return path if path in ROUTES else "other"


def denial(
    path: str, has_certificate: bool, names: Iterable[str], tls: TlsConfig, listener: Listener = "main"
) -> Refusal | None:
    """None when the client may call ``path`` on ``listener``, else why not (403)."""
    if listener == "loopback":
        return None  # verbs only (the rest is not routed there); its caller is the pod's own kube-scheduler
    if path in ANONYMOUS_PATHS:
        return None
    identity_configured = tls.client_ca_file is not None and bool(tls.verb_clients)
    if path == "/bind" and not identity_configured:
        return Refusal(
            "no_identity_configured",
            "/bind is refused to every caller on this listener: no scheduler identity is configured (set "
            "server.tls.client_ca_file and server.tls.verb_clients, or use server.loopback_verbs_port in the "
            "scheduler's pod); binding fails closed",
        )
    if tls.client_ca_file is None:
        # No client CA: the read-only verbs and /metrics answer whoever reaches server.host:port (127.0.0.1
        # unless exposed deliberately); nothing there changes the cluster.
        return None
    if not has_certificate:
        return Refusal("no_certificate", f"{path} requires a client certificate signed by server.tls.client_ca_file")
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
    return Refusal(
        "identity_not_allowed",
        f"client certificate ({who}) is not allowed on {path}: add its subject CN to {option}",
    )
