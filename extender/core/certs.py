"""What our certificate keeper must do, decided (issue 31: no hand-made Secret, certificates rotated by our own
process).

The keeper (``qos-extender certs``, extender/certs) owns a few certificate authorities and the leaf
certificates the parts mount (the extender's serving certificate, the scrape client's, the autoscaler's, the
consolidation flow's client identity towards the agents). Each pass it reads what is in the cluster, describes
it as plain facts (``CertFacts``), and asks these functions what to do. Why decided here and not in the shell:
the rules are the product's promise (when a certificate is renewed, when an authority rotates, which Secret is
never touched) and they are tested without a cluster or a clock.

Rules:
- **Never take over a Secret we did not make.** A Secret of the wanted name without our ``managed-by`` label is
  the user's (cert-manager's, a hand-made one): it is left alone and reported, never overwritten.
- **Leaves are renewed at ``renew_fraction`` of their life** (and at once when missing, unreadable, signed by
  another authority, or issued for another name, usage or key size than the spec asks).
- **Authorities rotate with overlap.** An authority with less than ``renew_fraction`` of its life left gets a
  successor; the trust bundle then holds both until the old one expires, so every verifier trusts the new leaves
  before they are served (the kubelet takes up to a minute to refresh a mounted Secret) and old leaves still
  verify until they are replaced.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "AuthorityDecision",
    "CertFacts",
    "LeafAction",
    "LeafSpec",
    "authority_decision",
    "leaf_action",
    "trust_bundle",
]


@dataclass(frozen=True, slots=True)
class CertFacts:
    """One certificate as the shell read it (PEM parsed; nothing of the key but whether it matches)."""

    fingerprint: str  # sha256 of the DER: the identity of an authority in bundles and "issued by" checks
    not_before: dt.datetime
    not_after: dt.datetime
    common_name: str
    organizations: tuple[str, ...] = ()
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()
    usages: frozenset[str] = frozenset()  # "server" / "client" (extendedKeyUsage)
    issuer_fingerprint: str | None = None  # the authority that signed it, when one we know verifies it
    key_matches: bool = True  # the Secret's key is the certificate's

    def remaining_fraction(self, now: dt.datetime) -> float:
        """Share of the validity period still ahead (0 when expired, 1 when not yet started)."""
        life = (self.not_after - self.not_before).total_seconds()
        if life <= 0:
            return 0.0
        left = (self.not_after - now).total_seconds()
        return max(0.0, min(1.0, left / life))


@dataclass(frozen=True, slots=True)
class LeafSpec:
    """A certificate a part mounts: where it lives, which authority signs it, what it must say."""

    namespace: str
    secret: str
    authority: str
    common_name: str
    organizations: tuple[str, ...] = ()
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()
    usages: frozenset[str] = frozenset({"server"})

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.secret}"


class LeafAction(StrEnum):
    """What a pass does with one leaf Secret. ``KEEP`` and ``FOREIGN`` write nothing."""

    KEEP = "keep"
    ISSUE = "issue"  # missing: create
    REISSUE = "reissue"  # ours, but due (or wrong): a new key and certificate
    UPDATE_BUNDLE = "update-bundle"  # certificate fine, the trust bundle beside it (ca.crt) is stale
    FOREIGN = "foreign"  # a Secret of that name that is not ours: left alone, reported


@dataclass(frozen=True, slots=True)
class AuthorityDecision:
    """``create``: no authority yet; ``rotate``: a successor is due; ``keep``. ``why`` is logged and evented."""

    action: str
    why: str


def authority_decision(current: CertFacts | None, now: dt.datetime, renew_fraction: float) -> AuthorityDecision:
    if current is None:
        return AuthorityDecision("create", "no authority yet")
    left = current.remaining_fraction(now)
    if left <= 0.0:
        return AuthorityDecision("rotate", f"expired at {current.not_after.isoformat()}")
    if left < renew_fraction:
        return AuthorityDecision("rotate", f"{left:.0%} of its life left (rotates below {renew_fraction:.0%})")
    return AuthorityDecision("keep", f"{left:.0%} of its life left")


def trust_bundle(current: CertFacts, previous: Sequence[CertFacts], now: dt.datetime) -> tuple[str, ...]:
    """The fingerprints a verifier must trust, newest first: the current authority and every predecessor that
    has not expired yet (leaves it signed may still be served until the next pass replaces them)."""
    out = [current.fingerprint]
    for p in previous:
        if p.not_after > now and p.fingerprint not in out:
            out.append(p.fingerprint)
    return tuple(out)


def leaf_action(
    spec: LeafSpec,
    *,
    exists: bool,
    ours: bool,
    cert: CertFacts | None,
    bundle_current: bool,
    authority_fingerprint: str,
    now: dt.datetime,
    renew_fraction: float,
) -> tuple[LeafAction, str]:
    """The action for one leaf and why. ``cert`` is None when the Secret has no readable certificate;
    ``bundle_current`` says whether its ca.crt is the authority's trust bundle of this pass."""
    if not exists:
        return LeafAction.ISSUE, "missing"
    if not ours:
        return LeafAction.FOREIGN, f"Secret {spec.key} exists without our managed-by label: left as it is"
    if cert is None:
        return LeafAction.REISSUE, "no readable certificate in it"
    if not cert.key_matches:
        return LeafAction.REISSUE, "its key is not the certificate's"
    if cert.issuer_fingerprint != authority_fingerprint:
        return LeafAction.REISSUE, f"not signed by the current {spec.authority} authority"
    if cert.common_name != spec.common_name or tuple(cert.organizations) != tuple(spec.organizations):
        return LeafAction.REISSUE, f"subject {cert.common_name!r} {list(cert.organizations)}: the spec changed"
    if set(cert.dns_names) != set(spec.dns_names) or set(cert.ip_addresses) != set(spec.ip_addresses):
        return LeafAction.REISSUE, "subject alternative names differ from the spec"
    if cert.usages != spec.usages:
        return LeafAction.REISSUE, f"usages {sorted(cert.usages)} != {sorted(spec.usages)}"
    left = cert.remaining_fraction(now)
    if left < renew_fraction:
        return LeafAction.REISSUE, f"{left:.0%} of its life left (renewed below {renew_fraction:.0%})"
    if not bundle_current:
        return LeafAction.UPDATE_BUNDLE, "its ca.crt is not the current trust bundle"
    return LeafAction.KEEP, f"{left:.0%} of its life left"
