"""Configuration of the consolidation flow: the ``consolidation:`` section of its own YAML file
(``qos-extender autoscaler --consolidation-config FILE``), strict like the other config files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from extender.config import (
    ConfigError,
    load_yaml_config,
    read_bool,
    read_file_path,
    read_int,
    read_number,
    read_req_str,
    section,
)

__all__ = ["ConsolidationSettings", "load_consolidation_config", "parse_consolidation_config"]


@dataclass(frozen=True, slots=True)
class ConsolidationSettings:
    enabled: bool = False
    # the agents (DaemonSet, host network): node annotation qos.kube-qos-extender.io/agent-url, else
    # scheme://<node InternalIP>:agent_port; mTLS with a certificate signed by the agents' CA
    agent_port: int = 9443
    agent_scheme: str = "https"
    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None
    migration_timeout_seconds: float = 300.0  # one POST /v1/migrations answers when the migration has ended
    request_attempts: int = 3  # a POST without an answer is repeated with the same id (idempotent)
    destination_scheduler_name: str = "qos-consolidation"  # served by nobody: only our Binding places the pod
    destination_ready_timeout_seconds: float = 60.0
    left_alone_seconds: float = 3600.0  # a node whose plan could not complete is not tried again before this
    provisioned_only: bool = True  # only nodes labelled provisioned-by=qos-autoscaler are consolidated
    batch_queue_quiet_seconds: float | None = None  # None: the autoscaler's batch_queue_quiet_seconds


SECTION = {
    "enabled",
    "agent",
    "migration_timeout_seconds",
    "request_attempts",
    "destination_scheduler_name",
    "destination_ready_timeout_seconds",
    "left_alone_seconds",
    "provisioned_only",
    "batch_queue_quiet_seconds",
}


def parse_consolidation_config(raw: object, base: Path | None = None) -> ConsolidationSettings:
    top = section(raw, "", {"consolidation"})
    p = "consolidation"
    c = section(top.get("consolidation"), p, SECTION)
    a = section(c.get("agent"), f"{p}.agent", {"port", "scheme", "cert_file", "key_file", "ca_file"})
    scheme = read_req_str(a, "scheme", f"{p}.agent", "https", choices=("https", "http"))
    cert, key, ca = (read_file_path(a, k, f"{p}.agent", base) for k in ("cert_file", "key_file", "ca_file"))
    enabled = read_bool(c, "enabled", p, False)
    if enabled and scheme == "https" and (cert is None or key is None or ca is None):
        raise ConfigError(
            f"{p}.agent: cert_file, key_file and ca_file are required (the agents accept mTLS clients only)"
        )
    quiet = c.get("batch_queue_quiet_seconds")
    name = read_req_str(c, "destination_scheduler_name", p, "qos-consolidation")
    if not name or len(name) > 253:
        raise ConfigError(f"{p}.destination_scheduler_name: must be a non-empty name, got {name!r}")
    return ConsolidationSettings(
        enabled=enabled,
        agent_port=read_int(a, "port", f"{p}.agent", 9443, minimum=1, maximum=65535),
        agent_scheme=scheme,
        cert_file=cert,
        key_file=key,
        ca_file=ca,
        migration_timeout_seconds=read_number(c, "migration_timeout_seconds", p, 300.0, minimum=0, exclusive_min=True),
        request_attempts=read_int(c, "request_attempts", p, 3, minimum=1, maximum=100),
        destination_scheduler_name=name,
        destination_ready_timeout_seconds=read_number(
            c, "destination_ready_timeout_seconds", p, 60.0, minimum=0, exclusive_min=True
        ),
        left_alone_seconds=read_number(c, "left_alone_seconds", p, 3600.0, minimum=0),
        provisioned_only=read_bool(c, "provisioned_only", p, True),
        batch_queue_quiet_seconds=None
        if quiet is None
        else read_number(c, "batch_queue_quiet_seconds", p, 0, minimum=0),
    )


def load_consolidation_config(path: str | Path) -> ConsolidationSettings:
    return load_yaml_config(
        Path(path), "consolidation config", lambda raw, base: parse_consolidation_config(raw, base=base)
    )
