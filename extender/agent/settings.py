"""Agent settings: a YAML file (every key optional) plus command-line overrides, validated at start on the strict
settings base (extender.settings): a string where a boolean belongs (``allow_plaintext: "false"``) is refused by
name instead of read as true, and every error of the file is reported at once. The reference with every option
and its description is generated from these models: docs/settings/agent.yaml (a test keeps it so)."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, model_validator

from extender.agent.protocol import RetryPolicy
from extender.settings import Settings, SettingsError, load_settings

__all__ = [
    "BACKENDS",
    "AgentAuthzConfig",
    "AgentConfig",
    "AgentConfigError",
    "AgentTlsConfig",
    "CriuConfig",
    "IdentityConfig",
    "IssuerConfig",
    "KubeletConfig",
    "MigrationPolicyConfig",
    "find_criu",
    "load_agent_config",
]

BACKENDS = ("criu", "kubelet", "simulated")
Backend = Literal["criu", "kubelet", "simulated"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


class AgentConfigError(SettingsError):
    """A configuration that cannot start an agent; the message names every offending key."""


class AgentTlsConfig(Settings):
    """mTLS: this agent's certificate and key, and the CA that signs every agent's and controller's certificate.
    The server requires a client certificate signed by ``ca_file``; the client presents ``cert_file`` and
    verifies the peer against ``ca_file``. Use a CA dedicated to the agents: any certificate it signed is
    trusted."""

    cert_file: str | None = None
    """This agent's certificate (PEM), served and presented as a client to peer agents."""
    key_file: str | None = None
    """Its private key (PEM)."""
    ca_file: str | None = None
    """The agents' CA (PEM): peers and callers must present a certificate it signed."""

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None

    @model_validator(mode="after")
    def _all_or_none(self) -> AgentTlsConfig:
        if self.cert_file is not None and (self.key_file is None or self.ca_file is None):
            raise ValueError("cert_file, key_file and ca_file must be set together (mTLS)")
        if self.cert_file is None and (self.key_file is not None or self.ca_file is not None):
            raise ValueError("key_file and ca_file need cert_file (mTLS)")
        return self


class AgentAuthzConfig(Settings):
    """Who may call what (extender/agent/authz.py): every certificate of the agents' CA passes the handshake, so
    each route names the identities (subject CNs) it serves. Agents are recognised by their CN
    ``qos-agent:<node>``; the controller and the scraper by the names below. Everything else gets 403."""

    controllers: tuple[str, ...] = ("qos-autoscaler-consolidation",)
    """CNs that may start a migration (POST /v1/migrations), read records and discard restores: the
    consolidation flow's client certificate."""
    metrics_clients: tuple[str, ...] = ("qos-agent-metrics",)
    """CNs that may read /metrics, and nothing else (Prometheus' scrape certificate)."""


class MigrationPolicyConfig(Settings):
    """Which pods this agent checkpoints, and how much it stages (extender/core/migration.py): checked before any
    checkpoint is taken, whoever asked. The destination is always checked too: https, and the certificate of
    the agent of the node the request names (CN qos-agent:<node>, signed by the agents' CA)."""

    denied_namespaces: tuple[str, ...] = ("kube-system", "kube-public", "kube-node-lease")
    """Never migrated, opt-in or not (their pods hold cluster credentials in memory)."""
    namespaces: tuple[str, ...] = ()
    """Namespaces whose pods are opted in."""
    scheduler_names: tuple[str, ...] = ("qos-scheduler",)
    """Pods scheduled by these schedulers are opted in (choosing the qos-scheduler is choosing its
    consolidation); a pod may also opt in with the annotation qos.kube-qos-extender.io/migratable: "true"."""
    check_pods: bool = True
    """Read the pod from the API server before a checkpoint and apply the opt-in and blocker rules to its live
    object (needs `get pods`); false: only the namespace rules apply (tests without an API server)."""
    max_migration_bytes: int = Field(16 * 2**30, gt=0)
    """Destination side: largest total of the archives of one migration staged here."""
    max_staging_bytes: int = Field(32 * 2**30, gt=0)
    """Destination side: largest total of every migration's archives staged here at once; an upload beyond
    it is refused (507) before a byte is written."""


class IdentityConfig(Settings):
    """Per-node identities through the CertificateSigningRequest API (extender/agent/identity.py): at start and
    at half their life, the agent asks for its mTLS certificate (written to tls.cert_file/key_file) and its
    kubelet client certificate (kubelet.cert_file/key_file), both naming this node only. Needs the agent's
    ServiceAccount token (bound to its pod) and `create`/`get` on certificatesigningrequests."""

    enabled: bool = False
    """false: the certificate files are given (a Secret, or tests); true: they are requested and renewed."""
    node_ip: str | None = None
    """The IP SAN of the agent certificate (peers dial https://<InternalIP>:port); null: $NODE_IP."""
    dns_names: tuple[str, ...] = ()
    """DNS SANs every agent's certificate also carries (the name Prometheus verifies when it scrapes a pod);
    the issuer must allow them (agent_dns_names)."""
    expiration_seconds: int = Field(86400, ge=600)
    """Life asked for each certificate; renewed at half of it."""
    kubelet_client: bool = True
    """Also ask for the kubelet client certificate (kubelet backend)."""
    timeout_seconds: float = Field(120.0, gt=0, allow_inf_nan=False)
    """Longest wait for a CSR to be signed at start (the issuer and kube-controller-manager act on it)."""


class IssuerConfig(Settings):
    """`qos-extender agent-issuer`: approves the agents' CSRs that name the node their bound token was issued
    for, signs their mTLS certificates with the agents' CA (which only this process holds), and keeps one
    ClusterRole per node for the kubelet credential (extender/agent/identity.py)."""

    kubeconfig: str | None = None
    """Kubeconfig; null: in-cluster."""
    ca_cert_file: str = "/etc/qos-agent-issuer/ca/tls.crt"
    """The agents' CA certificate (PEM)."""
    ca_key_file: str = "/etc/qos-agent-issuer/ca/tls.key"
    """Its private key (PEM): the only copy in the cluster."""
    agent_namespace: str = "kube-qos-agent"
    """The agents' namespace (their pods and ServiceAccount)."""
    agent_service_account: str = "qos-agent"
    """The agents' ServiceAccount: only its CSRs are considered."""
    agent_pod_labels: dict[str, str] = Field(default_factory=lambda: {"app.kubernetes.io/name": "qos-agent"})
    """Labels the requesting pod must carry (the DaemonSet's)."""
    max_expiration_seconds: int = Field(86400, ge=600)
    """Longest life granted."""
    agent_dns_names: tuple[str, ...] = ("qos-agent.kube-qos-agent.svc",)
    """DNS SANs an agent certificate may carry besides its node's IPs (shared by every agent: they name no
    node, so peers check the CN and IP, never these)."""
    poll_seconds: float = Field(2.0, gt=0, allow_inf_nan=False)
    """How often pending CSRs are read."""
    role_grace_seconds: float = Field(120.0, ge=0, allow_inf_nan=False)
    """How long a node's kubelet role outlives its Node object. A Node deleted and registered again by the same
    kubelet (the agent pod on it untouched, so it never asks again) keeps its agent's right to checkpoint; a
    node gone for longer loses the role, and its pods are gone too (the pod garbage collector deletes pods of a
    missing node after 40 s), so an agent there again is a new pod that enrols afresh."""
    request_timeout_seconds: float = Field(20.0, gt=0, allow_inf_nan=False)
    """Longest one API call may take."""
    log_level: LogLevel = "INFO"


class CriuConfig(Settings):
    """The criu backend: process checkpoints by PID with the criu binary (not for pods: see backend)."""

    path: str | None = None
    """The criu binary; null: $QOS_CRIU, then hack/build-criu.sh's cache, then PATH."""
    extra_dump_args: tuple[str, ...] = ()
    """Appended to every `criu dump`."""
    extra_restore_args: tuple[str, ...] = ()
    """Appended to every `criu restore`."""
    pid_free_timeout_seconds: float = Field(10.0, gt=0, allow_inf_nan=False)
    """How long a restore waits for the checkpointed PID to be free on this node."""
    command_timeout_seconds: float = Field(120.0, gt=0, allow_inf_nan=False)
    """Longest one criu command may run."""


class KubeletConfig(Settings):
    """The kubelet backend: KEP-2008 container checkpoints through the kubelet API; the destination imports the
    checkpoint image into its node's containerd."""

    port: int = Field(10250, ge=1, le=65535)
    """The kubelet's port on $NODE_IP."""
    cert_file: str | None = None
    """Client certificate allowed to create nodes/checkpoint (PEM)."""
    key_file: str | None = None
    """Its private key (PEM)."""
    ca_file: str | None = None
    """CA of the kubelet's serving certificate (it must carry the node's IP)."""
    checkpoint_timeout_seconds: int = Field(60, ge=1)
    """The kubelet's checkpoint timeout (whole seconds: its API takes an integer)."""
    checkpoint_dir: str = "/var/lib/kubelet/checkpoints"
    """The kubelet's <root-dir>/checkpoints as mounted here (the kubelet answers its own path)."""
    runtime: Literal["containerd", "cri-o"] = "containerd"
    """The node's container runtime, into whose image store a destination puts the checkpoint image: containerd
    (its Transfer API, ``containerd_socket``) or CRI-O (skopeo into the store CRI-O names on ``crio_socket``). A
    cluster with both runs one agent DaemonSet per runtime (config/agent/crio/)."""
    containerd_socket: str | None = "/run/containerd/containerd.sock"
    """Destination side: the node's containerd, into which checkpoint images are imported; null: this node
    refuses to be a migration destination (prepare answers 409). Read when runtime is containerd."""
    crio_socket: str | None = "/var/run/crio/crio.sock"
    """Destination side, runtime cri-o: the node's CRI-O socket (CRI and its HTTP info API); null: this node
    refuses to be a migration destination. Its image store must be mounted at the paths CRI-O reports."""
    skopeo: str = "skopeo"
    """runtime cri-o: the skopeo that writes the checkpoint image into CRI-O's containers/storage."""
    containerd_namespace: str = "k8s.io"
    """containerd namespace of the imported images (CRI's)."""
    image_prefix: str = "localhost/qos-checkpoint"
    """Checkpoint images are named <image_prefix>/<namespace>.<pod>:<sha256[:20]>."""
    import_timeout_seconds: float = Field(300.0, gt=0, allow_inf_nan=False)
    """Longest an image import may take."""


class AgentConfig(Settings):
    """`qos-extender agent`: the node agent that checkpoints batch containers and restores them on another node."""

    node_name: str = Field(
        default_factory=socket.gethostname, min_length=1, json_schema_extra={"default_doc": "<the host name>"}
    )
    """This node's name (the DaemonSet passes --node-name from the Downward API); default: the host name."""
    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = Field(9443, ge=0, le=65535)
    """Port to listen on (0: any free port)."""
    tls: AgentTlsConfig = AgentTlsConfig()
    """mTLS, required unless allow_plaintext."""
    certificate_check_seconds: float = Field(30.0, gt=0, allow_inf_nan=False)
    """How often the certificate files are read again; a change is loaded for the next connections."""
    allow_plaintext: bool = False
    """TESTS ONLY: serve and call without TLS."""
    state_dir: str = "/var/lib/kube-qos-extender/agent"
    """Journal and archives (a hostPath in the DaemonSet, so a restarted agent finishes or rolls back)."""
    backend: Backend = "criu"
    """kubelet (pods, KEP-2008), criu (processes by PID) or simulated (kwok nodes: a SIMULATION)."""
    criu: CriuConfig = CriuConfig()
    kubelet: KubeletConfig = KubeletConfig()
    simulated_store: Literal["memory", "kubernetes"] = "memory"
    """Where the simulated backend keeps progress."""
    kubeconfig: str | None = None
    """Kubeconfig for the API (Events, the simulated store); null: in-cluster."""
    retry: RetryPolicy = RetryPolicy()
    authz: AgentAuthzConfig = AgentAuthzConfig()
    identity: IdentityConfig = IdentityConfig()
    migration: MigrationPolicyConfig = MigrationPolicyConfig()
    request_timeout_seconds: float = Field(60.0, gt=0, allow_inf_nan=False)
    """Longest one call to a peer agent may take."""
    resolve_timeout_seconds: float = Field(30.0, gt=0, allow_inf_nan=False)
    """Longest resolving a pod's container on this node may take."""
    max_archive_bytes: int = Field(16 * 2**30, gt=0)
    """Largest archive accepted from a peer."""
    events: bool = True
    """Post Kubernetes Events on the pods moved."""
    log_level: LogLevel = "INFO"
    test_fault_injection: bool = False
    """TEST ONLY (PUT /v1/test/faults): never in a cluster."""

    @model_validator(mode="after")
    def _mtls_unless_plaintext(self) -> AgentConfig:
        if not self.tls.enabled and not self.allow_plaintext:
            raise ValueError(
                "tls: agents talk mTLS; set tls.cert_file/key_file/ca_file, or allow_plaintext: true (tests only)"
            )
        return self


def find_criu(configured: str | None = None) -> str | None:
    """The criu binary: configured path, $QOS_CRIU, hack/build-criu.sh's cache, then PATH."""
    candidates: list[str] = []
    if configured:
        candidates.append(configured)
    env = os.environ.get("QOS_CRIU")
    if env:
        candidates.append(env)
    cache = Path(os.environ.get("QOS_CACHE", str(Path.home() / ".cache" / "kube-qos-extender")))
    candidates.extend(str(p / "criu") for p in sorted(cache.glob("criu-*"), reverse=True))
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return shutil.which("criu")


def load_agent_config(path: str | None = None, **overrides: Any) -> AgentConfig:
    """Read ``path`` (YAML, top-level key ``agent:`` or the keys directly) and apply the non-None ``overrides``
    (command-line flags; a nested section is given as a mapping and replaces the file's keys it names)."""
    raw: dict[str, Any] = {}
    source = path or "agent"
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise AgentConfigError(source, [("", f"cannot read: {exc}")]) from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise AgentConfigError(source, [("", f"must be a mapping, got {type(loaded).__name__}")])
        raw = dict(loaded or {})
        if "agent" in raw:
            inner = raw.pop("agent")
            if raw:
                raise AgentConfigError(source, [(k, "unknown option (beside agent:)") for k in sorted(raw)])
            if inner is not None and not isinstance(inner, dict):
                raise AgentConfigError(source, [("agent", f"must be a mapping, got {type(inner).__name__}")])
            raw = dict(inner or {})
    for key, value in overrides.items():
        if value is None:
            continue
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    try:
        return load_settings(AgentConfig, raw, source)
    except SettingsError as exc:
        raise AgentConfigError(exc.source, exc.problems) from None
