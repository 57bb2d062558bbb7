"""The issuer's verdict on an agent's CSR (extender/agent/identity.py ``csr_verdict``), the certificate it signs,
and the reload of a live TLS context when its files change (extender/tls.py): the pure parts of per-node
identities, driven with real keys and CSRs (cryptography). The API round trip is tests/test_agent_identity_live.py.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from extender.agent.identity import AGENT_SIGNER, KUBELET_SIGNER, CsrRequest, csr_verdict, make_csr, sign
from extender.tls import CertificateFiles, CertificateReloader, server_context, subject_common_names

USER = "system:serviceaccount:kube-qos-agent:qos-agent"
LABELS = {"app.kubernetes.io/name": "qos-agent"}
AGENT_USAGES = ["digital signature", "server auth", "client auth"]
KUBELET_USAGES = ["digital signature", "client auth"]


def _ca(cn: str = "test-ca") -> tuple[x509.Certificate, Any]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _csr(
    pem: bytes,
    *,
    signer: str = AGENT_SIGNER,
    usages: list[str] | None = None,
    node: str = "n1",
    pod: str = "qos-agent-abc",
    uid: str = "u1",
    user: str = USER,
    seconds: int | None = 86400,
) -> CsrRequest:
    prefix = "authentication.kubernetes.io/"
    extra = {prefix + "node-name": [node], prefix + "pod-name": [pod], prefix + "pod-uid": [uid]}
    default = AGENT_USAGES if signer == AGENT_SIGNER else KUBELET_USAGES
    spec: dict[str, Any] = {
        "signerName": signer,
        "username": user,
        "extra": extra,
        "request": base64.b64encode(pem).decode(),
        "usages": usages if usages is not None else default,
    }
    if seconds is not None:
        spec["expirationSeconds"] = seconds
    return CsrRequest.from_object({"metadata": {"name": "c"}, "spec": spec})


POD: dict[str, Any] = {"metadata": {"name": "qos-agent-abc", "uid": "u1", "labels": LABELS}, "spec": {"nodeName": "n1"}}
NODE: dict[str, Any] = {
    "metadata": {"name": "n1"},
    "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]},
}


def _verdict(csr: CsrRequest, pod: Any = POD, node: Any = NODE) -> tuple[bool, str]:
    dns = frozenset({"qos-agent.kube-qos-agent.svc"})
    return csr_verdict(
        csr, agent_user=USER, agent_pod_labels=LABELS, pod=pod, node=node, max_expiration_seconds=86400, allowed_dns=dns
    )


def test_identity_verdict_approves_exactly_the_nodes_own_identity() -> None:
    _, agent = make_csr("n1", ["10.0.0.1"], ["qos-agent.kube-qos-agent.svc"])
    assert _verdict(_csr(agent)) == (True, "agent certificate of qos-agent:n1 for ['10.0.0.1']")
    _, kubelet = make_csr("n1", [])
    assert _verdict(_csr(kubelet, signer=KUBELET_SIGNER))[0] is True


def _grouped(cn: str) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])  # fmt: skip
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(name)
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("another node's CN", "subject must be exactly CN=qos-agent:n1"),
        ("an IP not the node's", "must be among node n1's InternalIPs"),
        ("no IP", "must be among node n1's InternalIPs"),
        ("a DNS name not allowed", "are not among the agents' names"),
        ("a group", "subject must be exactly"),
        ("another user", "not by the agents' ServiceAccount"),
        ("a token bound to no pod", "not bound to a pod on a node"),
        ("a pod that is gone", "does not exist"),
        ("a pod recreated under the same name", "uid changed"),
        ("a pod on another node", "runs on n2, not on n1"),
        ("a pod that is not an agent", "is not an agent pod"),
        ("a node that is gone", "node n1 does not exist"),
        ("server auth for the kubelet signer", "usages"),
        ("no client auth", "usages"),
        ("a year of life", "expirationSeconds must be set, between 600 and 86400"),
        ("no expiration", "expirationSeconds must be set"),
        ("another signer", "is not one the agents use"),
        ("a SAN for the kubelet", "carries no subjectAltName"),
    ],
)
def test_identity_verdict_denies(case: str, why: str) -> None:
    _, good = make_csr("n1", ["10.0.0.1"])
    pod: dict[str, Any] | None = POD
    node: dict[str, Any] | None = NODE
    csr: CsrRequest
    if case == "another node's CN":
        csr = _csr(make_csr("n2", ["10.0.0.1"])[1])
    elif case == "an IP not the node's":
        csr = _csr(make_csr("n1", ["10.0.0.9"])[1])
    elif case == "no IP":
        csr = _csr(make_csr("n1", [])[1])
    elif case == "a DNS name not allowed":
        csr = _csr(make_csr("n1", ["10.0.0.1"], ["kubernetes.default.svc"])[1])
    elif case == "a group":
        csr = _csr(_grouped("qos-agent:n1"), signer=KUBELET_SIGNER)
    elif case == "another user":
        csr = _csr(good, user="system:serviceaccount:default:default")
    elif case == "a token bound to no pod":
        csr = CsrRequest(**{**_csr(good).__dict__, "extra": {}})
    elif case == "a pod that is gone":
        csr, pod = _csr(good), None
    elif case == "a pod recreated under the same name":
        csr = _csr(good, uid="u-old")
    elif case == "a pod on another node":
        csr, pod = _csr(good), {**POD, "spec": {"nodeName": "n2"}}
    elif case == "a pod that is not an agent":
        csr, pod = _csr(good), {**POD, "metadata": {**POD["metadata"], "labels": {"app": "x"}}}
    elif case == "a node that is gone":
        csr, node = _csr(good), None
    elif case == "server auth for the kubelet signer":
        csr = _csr(make_csr("n1", [])[1], signer=KUBELET_SIGNER, usages=["digital signature", "server auth"])
    elif case == "no client auth":
        csr = _csr(good, usages=["digital signature", "server auth"])
    elif case == "a year of life":
        csr = _csr(good, seconds=365 * 86400)
    elif case == "no expiration":
        csr = _csr(good, seconds=None)
    elif case == "another signer":
        csr = _csr(good, signer="kubernetes.io/kubelet-serving")
    else:
        csr = _csr(good, signer=KUBELET_SIGNER)
    ok, reason = _verdict(csr, pod, node)
    assert not ok and why in reason, (case, reason)


def test_identity_signed_certificate_names_the_node_and_lives_as_asked() -> None:
    ca, ca_key = _ca()
    _, pem = make_csr("n1", ["10.0.0.1"], ["qos-agent.kube-qos-agent.svc"])
    now = dt.datetime.now(dt.UTC)
    cert = x509.load_pem_x509_certificate(sign(pem, ca, ca_key, seconds=3600, now=now))
    cert.verify_directly_issued_by(ca)
    assert cert.subject.rfc4514_string() == "CN=qos-agent:n1"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(i) for i in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["qos-agent.kube-qos-agent.svc"]
    assert cert.not_valid_after_utc - now <= dt.timedelta(seconds=3600)
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def _issue(d: Path, ca: x509.Certificate, ca_key: Any, node: str) -> CertificateFiles:
    key_pem, csr_pem = make_csr(node, ["127.0.0.1"])
    (d / "tls.key").write_bytes(key_pem)
    (d / "tls.crt").write_bytes(sign(csr_pem, ca, ca_key, seconds=3600, now=dt.datetime.now(dt.UTC)))
    (d / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return CertificateFiles(str(d / "tls.crt"), str(d / "tls.key"), str(d / "ca.crt"))


async def _served_cn(port: int, ca: Path) -> tuple[str, ...]:
    ctx = ssl.create_default_context(cafile=str(ca))
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1")
    try:
        return subject_common_names(writer.get_extra_info("peercert"))
    finally:
        writer.close()


async def test_a_renewed_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    ca, ca_key = _ca()
    files = _issue(tmp_path, ca, ca_key, "before")
    ctx = server_context(files, client_certificate="none")
    seen: list[bool] = []
    reloader = CertificateReloader(files, [ctx], on_reload=seen.append)
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        assert await _served_cn(port, tmp_path / "ca.crt") == ("qos-agent:before",)
        assert reloader.check() is False  # nothing changed: nothing loaded
        (tmp_path / "tls.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\nhalf written")
        assert reloader.check() is False and seen == [False]  # a broken file keeps the old chain
        assert await _served_cn(port, tmp_path / "ca.crt") == ("qos-agent:before",)
        _issue(tmp_path, ca, ca_key, "after")
        assert reloader.check() is True and seen == [False, True]
        assert await _served_cn(port, tmp_path / "ca.crt") == ("qos-agent:after",)
    finally:
        server.close()
        await server.wait_closed()
