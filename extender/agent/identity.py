"""Per-node agent identities: each agent holds certificates naming its own node, issued and rotated through the
CertificateSigningRequest API, so a compromised agent on node X cannot act as the agent of node Y.

Why CSRs, and why they prove the node. The agent's ServiceAccount token is a bound token (projected into the
pod): the API server records, in the CSR's ``spec.extra``, the node and pod the token was issued for
(``authentication.kubernetes.io/node-name``, ``pod-name``, ``pod-uid``). Nothing the agent sends can change
those. The issuer (``qos-extender agent-issuer``, a Deployment of its own) approves a CSR only when what it
asks for names exactly that node: CN ``qos-agent:<node>``, for the agents' mTLS an IP SAN among that node's
InternalIPs and nothing else. Two credentials per node:

- the agents' mTLS certificate (signer ``kube-qos-extender.io/agent``): signed by the issuer with the agents'
  CA, which only the issuer holds. Peers check the CN against the node they want (``AgentClient.pin``) and the
  IP against the URL they dialled; the agents' routes check the CN (``authz``).
- the kubelet client certificate (signer ``kubernetes.io/kube-apiserver-client``): approved by the issuer,
  signed by kube-controller-manager with the cluster CA, user ``qos-agent:<node>``. The issuer keeps a
  ClusterRole per node granting ``create nodes/checkpoint`` on that node only (``resourceNames``): the kubelet
  of node Y asks the API server, which answers no for ``qos-agent:X``.

Certificates live a day (``expiration_seconds``) and are renewed at half their life; the files are replaced
atomically and the agent's TLS contexts reload them (``extender.tls.CertificateReloader``). The private keys
never leave the node's memory-backed volume.

The pure parts (``csr_verdict``, ``sign``, ``node_role``) are what the tests drive; ``Requester`` and the
issuer loop (``extender/agent/issuer.py``) only carry them out against the API.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ipaddress
import logging
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from extender.core.migration import agent_identity
from extender.kube.client import read_json
from extender.pki import key_usage

__all__ = [
    "AGENT_SIGNER",
    "KUBELET_SIGNER",
    "NODE_LABEL",
    "CsrRequest",
    "Requester",
    "csr_verdict",
    "make_csr",
    "node_role",
    "sign",
]

log = logging.getLogger("extender.agent.identity")

AGENT_SIGNER = "kube-qos-extender.io/agent"
KUBELET_SIGNER = "kubernetes.io/kube-apiserver-client"
NODE_LABEL = "qos.kube-qos-extender.io/agent-node"  # on the per-node ClusterRole/Binding: the node it serves
_EXTRA = "authentication.kubernetes.io/"
# usages a CSR may ask for (KeyUsage + ExtKeyUsage names of the CSR API), and those it must
_ALLOWED_USAGES = {
    AGENT_SIGNER: (
        {"digital signature", "key encipherment", "server auth", "client auth"},
        {"server auth", "client auth"},
    ),
    KUBELET_SIGNER: ({"digital signature", "key encipherment", "client auth"}, {"client auth"}),
}


@dataclass(frozen=True)
class CsrRequest:
    """What the issuer needs of one CertificateSigningRequest object, parsed."""

    name: str
    signer: str
    username: str
    extra: Mapping[str, Sequence[str]]
    usages: frozenset[str]
    expiration_seconds: int | None
    pem: bytes

    @staticmethod
    def from_object(obj: Mapping[str, Any]) -> CsrRequest:
        spec = obj.get("spec") or {}
        return CsrRequest(
            name=str((obj.get("metadata") or {}).get("name", "")),
            signer=str(spec.get("signerName", "")),
            username=str(spec.get("username", "")),
            extra={str(k): tuple(v or ()) for k, v in (spec.get("extra") or {}).items()},
            usages=frozenset(spec.get("usages") or ()),
            expiration_seconds=spec.get("expirationSeconds"),
            pem=base64.b64decode(spec.get("request", "")),
        )


def _one(extra: Mapping[str, Sequence[str]], key: str) -> str | None:
    values = extra.get(_EXTRA + key) or ()
    return values[0] if len(values) == 1 and values[0] else None


def _internal_ips(node: Mapping[str, Any]) -> set[str]:
    addresses = ((node.get("status") or {}).get("addresses")) or []
    return {str(a.get("address")) for a in addresses if a.get("type") == "InternalIP" and a.get("address")}


def csr_verdict(
    csr: CsrRequest,
    *,
    agent_user: str,
    agent_pod_labels: Mapping[str, str],
    pod: Mapping[str, Any] | None,
    node: Mapping[str, Any] | None,
    max_expiration_seconds: int,
    allowed_dns: frozenset[str] = frozenset(),
) -> tuple[bool, str]:
    """(approve?, why). ``pod`` and ``node``: the live objects the CSR's bound token names (None if gone)."""
    if csr.signer not in _ALLOWED_USAGES:
        return False, f"signer {csr.signer} is not one the agents use"
    if csr.username != agent_user:
        return False, f"requested by {csr.username}, not by the agents' ServiceAccount {agent_user}"
    node_name, pod_name, pod_uid = _one(csr.extra, "node-name"), _one(csr.extra, "pod-name"), _one(csr.extra, "pod-uid")
    if node_name is None or pod_name is None or pod_uid is None:
        return False, "the requester's token is not bound to a pod on a node (no node-name/pod-name/pod-uid extra)"
    if pod is None:
        return False, f"pod {pod_name} of the requester's token does not exist"
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    if meta.get("uid") != pod_uid or meta.get("name") != pod_name:
        return False, f"pod {pod_name} is not the pod the token was issued for (uid changed)"
    if spec.get("nodeName") != node_name:
        return False, f"pod {pod_name} runs on {spec.get('nodeName')}, not on {node_name}"
    labels = meta.get("labels") or {}
    if any(labels.get(k) != v for k, v in agent_pod_labels.items()):
        return False, f"pod {pod_name} is not an agent pod (labels {dict(agent_pod_labels)})"
    if node is None:
        return False, f"node {node_name} does not exist"
    allowed, required = _ALLOWED_USAGES[csr.signer]
    if not csr.usages <= allowed or not required <= csr.usages:
        return False, f"usages {sorted(csr.usages)}: must include {sorted(required)} and stay within {sorted(allowed)}"
    if csr.expiration_seconds is None or not 600 <= csr.expiration_seconds <= max_expiration_seconds:
        return False, f"expirationSeconds must be set, between 600 and {max_expiration_seconds}"
    try:
        req = x509.load_pem_x509_csr(csr.pem)
    except ValueError as exc:
        return False, f"request is not a PEM CSR: {exc}"
    if not req.is_signature_valid:
        return False, "the CSR's signature does not verify"
    want = agent_identity(node_name)
    attrs = [(a.oid, a.value) for a in req.subject]
    if attrs != [(NameOID.COMMON_NAME, want)]:
        # an O would become a group for the API server (system:masters...): only the CN, exactly
        return False, f"subject must be exactly CN={want}, got {req.subject.rfc4514_string()}"
    try:
        san = req.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        san = None
    dns = {str(n.value) for n in (san or []) if isinstance(n, x509.DNSName)}
    other = [n for n in (san or []) if not isinstance(n, (x509.IPAddress, x509.DNSName))]
    ips = {str(n.value) for n in (san or []) if isinstance(n, x509.IPAddress)}
    for ext in req.extensions:
        if not isinstance(ext.value, x509.SubjectAlternativeName):
            return False, f"the CSR asks for extension {ext.oid.dotted_string}: only subjectAltName may be asked"
    if csr.signer == KUBELET_SIGNER:
        if san is not None:
            return False, "a kubelet client certificate carries no subjectAltName"
        return True, f"kubelet client certificate of {want}"
    if other:
        return False, f"only IP and DNS SANs may be asked, got {other}"
    if not dns <= allowed_dns:
        # a DNS name every agent shares (the Service Prometheus verifies) names no node: the CN and IP do
        return False, f"DNS SANs {sorted(dns - allowed_dns)} are not among the agents' names {sorted(allowed_dns)}"
    node_ips = _internal_ips(node)
    if not ips or not ips <= node_ips:
        return False, f"IP SANs {sorted(ips)} must be among node {node_name}'s InternalIPs {sorted(node_ips)}"
    return True, f"agent certificate of {want} for {sorted(ips)}"


def sign(pem: bytes, ca_cert: x509.Certificate, ca_key: Any, *, seconds: int, now: dt.datetime) -> bytes:
    """The agents' certificate for an approved CSR: its subject and IP SANs (``csr_verdict`` checked them),
    serverAuth + clientAuth, ``seconds`` of life from a minute ago (clock skew between nodes)."""
    req = x509.load_pem_x509_csr(pem)
    builder = (
        x509.CertificateBuilder()
        .subject_name(req.subject)
        .issuer_name(ca_cert.subject)
        .public_key(req.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(seconds=seconds))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(key_usage(authority=False, key_encipherment=True), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(cast(Any, ca_cert.public_key())), critical=False
        )
    )
    try:
        san = req.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        builder = builder.add_extension(san, critical=False)
    except x509.ExtensionNotFound:
        pass
    cert = builder.sign(ca_key, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM)


def make_csr(node: str, ips: Sequence[str], dns: Sequence[str] = ()) -> tuple[bytes, bytes]:
    """A fresh P-256 key and a CSR for the identity of ``node`` (PEM key, PEM CSR); ``ips`` and ``dns`` become
    SANs."""
    key = ec.generate_private_key(ec.SECP256R1())
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, agent_identity(node))])
    )
    names: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    names += [x509.DNSName(d) for d in dns]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    csr = builder.sign(key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, csr.public_bytes(serialization.Encoding.PEM)


def node_role(node: str) -> dict[str, Any]:
    """The per-node ClusterRole of the kubelet credential: checkpoint containers of ``node`` and no other."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": f"qos-agent-checkpoint:{node}", "labels": {NODE_LABEL: node}},
        "rules": [{"apiGroups": [""], "resources": ["nodes/checkpoint"], "verbs": ["create"], "resourceNames": [node]}],
    }


def node_binding(node: str) -> dict[str, Any]:
    name = f"qos-agent-checkpoint:{node}"
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name, "labels": {NODE_LABEL: node}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": agent_identity(node)}],
    }


def remaining_fraction(cert_pem: bytes, now: dt.datetime) -> float:
    """How much of a certificate's life is left (0 when expired or unreadable): renewal starts at one half."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return 0.0
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    life = (end - start).total_seconds()
    return max(0.0, (end - now).total_seconds() / life) if life > 0 else 0.0


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class Requester:
    """The agent's side: ask for a certificate of one signer, wait for it, write key and certificate, renew at
    half their life. ``api``: a kubernetes-asyncio ApiClient on the agent's own (bound) ServiceAccount token."""

    def __init__(
        self,
        api: Any,
        *,
        node: str,
        signer: str,
        usages: Sequence[str],
        ips: Sequence[str],
        dns: Sequence[str] = (),
        cert_file: Path,
        key_file: Path,
        expiration_seconds: int,
        timeout_seconds: float,
    ) -> None:
        self.api = api
        self.node, self.signer, self.usages, self.ips, self.dns = node, signer, tuple(usages), tuple(ips), tuple(dns)
        self.cert_file, self.key_file = cert_file, key_file
        self.expiration_seconds = expiration_seconds
        self.timeout_seconds = timeout_seconds

    def needs_renewal(self, now: dt.datetime) -> bool:
        try:
            pem = self.cert_file.read_bytes()
        except OSError:
            return True
        return remaining_fraction(pem, now) < 0.5 or not self.key_file.exists()

    async def obtain(self) -> None:
        """One CSR round: create, wait until signed (or refused), write. Raises RuntimeError with the reason."""
        from kubernetes_asyncio import client as k8s

        certs = k8s.CertificatesV1Api(self.api)
        key_pem, csr_pem = make_csr(self.node, self.ips, self.dns)
        kind = "kubelet" if self.signer == KUBELET_SIGNER else "agent"
        name = f"qos-agent-{self.node[:200]}-{kind}-{secrets.token_hex(4)}"
        body = {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {"name": name},
            "spec": {
                "signerName": self.signer,
                "request": base64.b64encode(csr_pem).decode(),
                "usages": list(self.usages),
                "expirationSeconds": self.expiration_seconds,
            },
        }
        await certs.create_certificate_signing_request(cast(Any, body), _request_timeout=30)
        log.info("certificate requested", extra={"node": self.node, "decision": {"csr": name, "signer": self.signer}})
        deadline = asyncio.get_running_loop().time() + self.timeout_seconds
        while True:
            resp = await certs.read_certificate_signing_request(name, _preload_content=False, _request_timeout=30)
            obj = cast(dict[str, Any], await read_json(resp))
            status = obj.get("status") or {}
            for cond in status.get("conditions") or []:
                if cond.get("type") in ("Denied", "Failed") and cond.get("status", "True") == "True":
                    raise RuntimeError(
                        f"CSR {name} {cond['type'].lower()}: {cond.get('message') or cond.get('reason')}"
                    )
            if status.get("certificate"):
                cert_pem = base64.b64decode(status["certificate"])
                break
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"CSR {name} not signed within {self.timeout_seconds:.0f}s")
            await asyncio.sleep(1.0)
        self.key_file.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.key_file, key_pem, 0o600)
        _write_atomic(self.cert_file, cert_pem, 0o644)
        log.info(
            "certificate written", extra={"node": self.node, "decision": {"csr": name, "file": str(self.cert_file)}}
        )

    async def run(self) -> None:
        """Renew forever: check every minute, obtain when half the life is gone; failures retry with backoff
        (the old certificate serves until it expires)."""
        backoff = 5.0
        while True:
            if self.needs_renewal(dt.datetime.now(dt.UTC)):
                try:
                    await self.obtain()
                    backoff = 5.0
                except Exception as exc:  # API errors, denial: logged, retried; nothing else depends on it
                    log.warning("certificate renewal failed", extra={"node": self.node, "error": str(exc)})
                    await asyncio.sleep(backoff)
                    backoff = min(300.0, backoff * 2)
                    continue
            await asyncio.sleep(60.0)
