"""Agent configuration: a YAML file (all keys optional) plus command-line overrides, validated up front."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from extender.agent.protocol import RetryPolicy

__all__ = [
    "BACKENDS",
    "AgentConfig",
    "AgentConfigError",
    "CriuConfig",
    "KubeletConfig",
    "TlsConfig",
    "find_criu",
    "load_agent_config",
]

BACKENDS = ("criu", "kubelet", "simulated")


class AgentConfigError(ValueError):
    """A configuration that cannot start an agent; the message names the key."""


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """mTLS: this agent's certificate and key, and the CA that signs every agent's and controller's cert.

    The server requires a client certificate signed by ``ca_file``; the client presents ``cert_file`` and
    verifies the peer against ``ca_file``. Use a CA dedicated to the agents: any cert it signed is trusted.
    """

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None


@dataclass(frozen=True, slots=True)
class CriuConfig:
    path: str | None = None  # None: $QOS_CRIU, the hack/build-criu.sh cache, then PATH
    extra_dump_args: tuple[str, ...] = ()
    extra_restore_args: tuple[str, ...] = ()
    pid_free_timeout_seconds: float = 10.0
    command_timeout_seconds: float = 120.0


@dataclass(frozen=True, slots=True)
class KubeletConfig:
    port: int = 10250
    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None
    checkpoint_timeout_seconds: int = 60
    checkpoint_dir: str = "/var/lib/kubelet/checkpoints"  # the kubelet's <root-dir>/checkpoints, as mounted here
    # Destination: the node's containerd (checkpoint images are imported into it, namespace k8s.io); None: this
    # node refuses to be a destination (prepare answers 409).
    containerd_socket: str | None = "/run/containerd/containerd.sock"
    containerd_namespace: str = "k8s.io"
    image_prefix: str = "localhost/qos-checkpoint"  # checkpoint images: <prefix>/<namespace>.<pod>:<sha256[:20]>
    import_timeout_seconds: float = 300.0


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node_name: str = field(default_factory=socket.gethostname)
    host: str = "127.0.0.1"
    port: int = 9443
    tls: TlsConfig = field(default_factory=TlsConfig)
    allow_plaintext: bool = False
    state_dir: str = "/var/lib/kube-qos-extender/agent"
    backend: str = "criu"
    criu: CriuConfig = field(default_factory=CriuConfig)
    kubelet: KubeletConfig = field(default_factory=KubeletConfig)
    simulated_store: str = "memory"  # memory | kubernetes
    kubeconfig: str | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    request_timeout_seconds: float = 60.0
    resolve_timeout_seconds: float = 30.0
    max_archive_bytes: int = 16 * 2**30
    events: bool = True
    log_level: str = "INFO"
    test_fault_injection: bool = False

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise AgentConfigError(f"backend: must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if not (0 <= self.port <= 65535):
            raise AgentConfigError(f"port: must be 0..65535, got {self.port}")
        if self.tls.enabled and (self.tls.key_file is None or self.tls.ca_file is None):
            raise AgentConfigError("tls: cert_file, key_file and ca_file must be set together (mTLS)")
        if not self.tls.enabled and not self.allow_plaintext:
            raise AgentConfigError(
                "tls: agents talk mTLS; set tls.cert_file/key_file/ca_file, or allow_plaintext: true (tests only)"
            )
        if self.simulated_store not in ("memory", "kubernetes"):
            raise AgentConfigError(f"simulated_store: memory or kubernetes, got {self.simulated_store!r}")
        for name in ("request_timeout_seconds", "resolve_timeout_seconds"):
            if not getattr(self, name) > 0:
                raise AgentConfigError(f"{name}: must be > 0")
        if self.max_archive_bytes <= 0:
            raise AgentConfigError("max_archive_bytes: must be > 0")


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


def _section(raw: Any, name: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise AgentConfigError(f"{name}: must be a mapping")
    return raw


def _build(cls: Any, raw: dict[str, Any], name: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise AgentConfigError(f"{name}: unknown key(s) {', '.join(unknown)}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, AgentConfigError):
            raise
        raise AgentConfigError(f"{name}: {exc}") from exc


def load_agent_config(path: str | None = None, **overrides: Any) -> AgentConfig:
    """Read ``path`` (YAML, top-level key ``agent:`` or the keys directly) and apply non-None overrides."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise AgentConfigError(f"cannot read {path}: {exc}") from exc
        raw = dict(_section(loaded, path))
        if "agent" in raw:
            raw = dict(_section(raw["agent"], "agent"))
    nested = {"tls": TlsConfig, "criu": CriuConfig, "kubelet": KubeletConfig, "retry": RetryPolicy}
    for key, cls in nested.items():
        if key in raw:
            raw[key] = _build(cls, _section(raw[key], key), key)
    raw.update({k: v for k, v in overrides.items() if v is not None})
    return _build(AgentConfig, raw, "agent")  # type: ignore[no-any-return]
