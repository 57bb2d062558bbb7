"""``qos-extender certs`` settings: which authorities to keep, which leaf Secrets to issue from them, which
webhooks get a caBundle and which ConfigMaps publish trust bundles. The reference with every option is generated
from these models (docs/settings/certs.yaml; a test keeps it so), and config/certs/certs.yaml is the product's
own list, equal to what the chart renders by default (tests/test_chart.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from extender.settings import Settings

__all__ = ["AuthoritySettings", "CertificateSettings", "CertsConfig", "TrustConfigMap", "WebhookSettings"]

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
Name = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")]


class AuthoritySettings(Settings):
    """A certificate authority the keeper creates and rotates. Its Secret holds tls.crt / tls.key (the current
    authority: what signs) and ca.crt (the trust bundle: the current one and every unexpired predecessor)."""

    name: Name
    """How certificates, webhooks and ConfigMaps below refer to it."""
    namespace: Name
    secret: Name
    """Its Secret. The key in it is the only copy the keeper makes; mount it only where something signs."""
    common_name: str = Field(min_length=1)
    lifetime_hours: int = Field(87_600, ge=2)
    """Validity of an authority (10 years by default); its successor is made at renew_fraction of it."""


class CertificateSettings(Settings):
    """A leaf certificate a part mounts, in a Secret of type kubernetes.io/tls with ca.crt = its authority's
    trust bundle."""

    namespace: Name
    secret: Name
    authority: Name
    common_name: str = Field(min_length=1)
    """The subject CN: what the verifiers' allow-lists name (e.g. the extender's metrics_clients)."""
    organizations: tuple[str, ...] = ()
    """Subject O values (the agents' authz reads the consolidation flow's)."""
    services: tuple[str, ...] = ()
    """Services ("name.namespace") the certificate is served under: each adds name, name.namespace,
    name.namespace.svc and name.namespace.svc.<cluster_domain> as DNS names."""
    dns_names: tuple[str, ...] = ()
    """Further DNS names."""
    ip_addresses: tuple[str, ...] = ()
    """IP SANs (127.0.0.1 for a server the pod's own probes or sidecars call on the loopback)."""
    usages: tuple[Literal["server", "client"], ...] = Field(("server",), min_length=1)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.secret}"

    @model_validator(mode="after")
    def _check(self) -> CertificateSettings:
        for s in self.services:
            parts = s.split(".")
            if len(parts) != 2 or not all(parts):
                raise ValueError(f"services: {s!r} must be name.namespace")
        if len(set(self.usages)) != len(self.usages):
            raise ValueError(f"usages: must be distinct, got {list(self.usages)}")
        return self


class WebhookSettings(Settings):
    """A MutatingWebhookConfiguration whose every service webhook gets ``caBundle`` = the ca.crt of ``ca_from``
    (namespace/name of the serving Secret), whoever made that Secret: like cert-manager's inject-ca-from, so a
    Secret the user brings keeps its own CA in the webhook too."""

    name: Name
    ca_from: str = Field(pattern=r"^[a-z0-9][-a-z0-9.]*/[a-z0-9][-a-z0-9.]*$")


class TrustConfigMap(Settings):
    """A ConfigMap of public certificates for verifiers that must not see any key (the agents: their peers' CA
    and the kubelets' serving CA)."""

    namespace: Name
    name: Name
    authorities: dict[str, Name] = Field(default_factory=dict)
    """ConfigMap key -> authority name: the key holds that authority's trust bundle."""
    cluster_ca_key: str | None = None
    """A key that holds the cluster's CA (ca.crt of ConfigMap kube-root-ca.crt in the same namespace, which
    kube-controller-manager publishes): the kubelets' serving certificates are signed by it when they come from
    the kubernetes.io/kubelet-serving signer (serverTLSBootstrap)."""


class CertsConfig(Settings):
    """`qos-extender certs`: creates the authorities and leaf certificates the parts mount, renews them at
    renew_fraction of their life, injects the webhooks' caBundle, publishes trust bundles; never touches a
    Secret of a wanted name that it did not make (reported instead)."""

    kubeconfig: str | None = None
    """Kubeconfig; null: in-cluster."""
    authorities: tuple[AuthoritySettings, ...] = Field(min_length=1)
    """The certificate authorities (one per trust domain: a verifier trusts everything its CA signed)."""
    certificates: tuple[CertificateSettings, ...] = ()
    """The leaf certificates, each in its own Secret."""
    webhooks: tuple[WebhookSettings, ...] = ()
    """Admission webhook configurations whose caBundle the keeper injects."""
    trust_configmaps: tuple[TrustConfigMap, ...] = ()
    """ConfigMaps of public trust bundles."""
    leaf_lifetime_hours: float = Field(2160.0, gt=0, allow_inf_nan=False)
    """Validity of a leaf certificate (90 days by default)."""
    renew_fraction: float = Field(1 / 3, gt=0, lt=1, allow_inf_nan=False)
    """Renew (leaves) or rotate (authorities) when less than this share of the life is left."""
    cluster_domain: str = "cluster.local"
    poll_seconds: float = Field(30.0, gt=0, allow_inf_nan=False)
    """How often the keeper looks again (it also runs at start: a fresh install waits at most one pass)."""
    request_timeout_seconds: float = Field(20.0, gt=0, allow_inf_nan=False)
    events: bool = True
    """Events on the Secrets it issues, renews or leaves alone (reason QosCertificate*)."""
    log_level: LogLevel = "INFO"

    @model_validator(mode="after")
    def _check(self) -> CertsConfig:
        names = [a.name for a in self.authorities]
        if len(set(names)) != len(names):
            raise ValueError(f"authorities: names must be distinct, got {names}")
        secrets = [f"{a.namespace}/{a.secret}" for a in self.authorities] + [c.key for c in self.certificates]
        dupes = sorted({s for s in secrets if secrets.count(s) > 1})
        if dupes:
            raise ValueError(f"a Secret is named twice: {dupes}")
        known = set(names)
        for c in self.certificates:
            if c.authority not in known:
                raise ValueError(f"certificates: {c.key} names authority {c.authority!r}, not among {sorted(known)}")
        for cm in self.trust_configmaps:
            for key, auth in cm.authorities.items():
                if auth not in known:
                    raise ValueError(f"trust_configmaps: {cm.name} key {key} names unknown authority {auth!r}")
        return self
