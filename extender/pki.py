"""Key and certificate making, and reading certificates back as ``CertFacts`` (the ``cryptography`` package):
shared by the certificate keeper (extender.certs) and the agents' identity issuer (extender.agent.identity), so
both sign leaves with the same key usages.

P-256 keys everywhere: every verifier here (Python's ssl, Go's crypto/tls in kube-apiserver and
cluster-autoscaler, Prometheus) speaks ECDSA, and a key is made in microseconds where RSA-2048 takes tens of
milliseconds. Certificates start a minute in the past (clock skew between nodes).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
from collections.abc import Iterable, Sequence
from typing import Any, cast

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from extender.core.certs import CertFacts

__all__ = ["facts", "fingerprint", "issue_leaf", "key_usage", "load_bundle", "new_authority", "pem_of"]

SKEW = dt.timedelta(minutes=1)
_USAGE_OIDS = {"server": ExtendedKeyUsageOID.SERVER_AUTH, "client": ExtendedKeyUsageOID.CLIENT_AUTH}


def key_usage(authority: bool, *, key_encipherment: bool = False) -> x509.KeyUsage:
    """An authority signs certificates (and CRLs) only; a leaf signs handshakes only (key_encipherment for RSA
    key exchange, which only the agents' CSR keys of other types might need)."""
    return x509.KeyUsage(
        digital_signature=True,
        key_encipherment=key_encipherment,
        content_commitment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=authority,
        crl_sign=authority,
        encipher_only=False,
        decipher_only=False,
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def pem_of(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def fingerprint(cert: x509.Certificate) -> str:
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def load_bundle(pem: bytes) -> list[x509.Certificate]:
    """Every certificate of a PEM bundle, in order ([] for empty or unreadable input: the caller decides)."""
    try:
        return list(x509.load_pem_x509_certificates(pem)) if pem.strip() else []
    except ValueError:
        return []


def new_authority(common_name: str, *, now: dt.datetime, hours: float) -> tuple[bytes, bytes]:
    """A self-signed CA (PEM certificate, PEM key) that may sign leaves only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    usage = key_usage(authority=True)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW)
        .not_valid_after(now + dt.timedelta(hours=hours))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return pem_of(cert), _key_pem(key)


def issue_leaf(
    *,
    common_name: str,
    organizations: Sequence[str],
    dns_names: Sequence[str],
    ip_addresses: Sequence[str],
    usages: Iterable[str],
    ca_cert: x509.Certificate,
    ca_key: Any,
    now: dt.datetime,
    hours: float,
) -> tuple[bytes, bytes]:
    """A fresh key and its certificate signed by ``ca_cert`` (PEM certificate, PEM key)."""
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    usage = key_usage(authority=False)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - SKEW)
        .not_valid_after(min(now + dt.timedelta(hours=hours), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([_USAGE_OIDS[u] for u in sorted(set(usages))]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(cast(Any, ca_cert.public_key())), critical=False
        )
    )
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ip_addresses]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return pem_of(builder.sign(ca_key, hashes.SHA256())), _key_pem(key)


def _issued_by(cert: x509.Certificate, authorities: Sequence[x509.Certificate]) -> str | None:
    for ca in authorities:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return fingerprint(ca)
    return None


def facts(
    cert_pem: bytes, key_pem: bytes | None = None, authorities: Sequence[x509.Certificate] = ()
) -> CertFacts | None:
    """What the decisions need of the first certificate in ``cert_pem``; None when there is none to read.
    ``issuer_fingerprint`` names whichever of ``authorities`` verifies its signature."""
    certs = load_bundle(cert_pem)
    if not certs:
        return None
    cert = certs[0]
    subject = cert.subject
    cn = [str(a.value) for a in subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    orgs = tuple(str(a.value) for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = tuple(san.get_values_for_type(x509.DNSName))
        ips = tuple(str(i) for i in san.get_values_for_type(x509.IPAddress))
    except x509.ExtensionNotFound:
        dns, ips = (), ()
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        usages = frozenset(u for u, oid in _USAGE_OIDS.items() if oid in eku)
    except x509.ExtensionNotFound:
        usages = frozenset()
    key_matches = True
    if key_pem is not None:
        try:
            key = serialization.load_pem_private_key(key_pem, password=None)
            key_matches = key.public_key() == cert.public_key()
        except (ValueError, TypeError):
            key_matches = False
    return CertFacts(
        fingerprint=fingerprint(cert),
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        common_name=cn[0] if cn else "",
        organizations=orgs,
        dns_names=dns,
        ip_addresses=ips,
        usages=usages,
        issuer_fingerprint=_issued_by(cert, authorities),
        key_matches=key_matches,
    )
