"""Settings of the consolidation flow: the ``consolidation:`` section of its own YAML file
(``qos-extender autoscaler --consolidation-config FILE``), on the strict settings base (extender.settings).
Every option with its default: docs/settings/consolidation.yaml (generated from these models)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from extender.settings import ExistingFile, Settings, load_settings, load_yaml_file

__all__ = ["AgentEndpoint", "ConsolidationSettings", "load_consolidation_config", "parse_consolidation_config"]


class AgentEndpoint(Settings):
    """The node agents (`qos-extender agent`, a DaemonSet on the host network). A node's agent is the URL in its
    annotation qos.kube-qos-extender.io/agent-url, else scheme://<node InternalIP>:port."""

    port: int = Field(9443, ge=1, le=65535)
    """The agents' port."""
    scheme: Literal["https", "http"] = "https"
    """https (mTLS) in every real cluster; http only against plaintext test agents."""
    cert_file: ExistingFile | None = None
    """mTLS client certificate signed by the agents' CA (required with https when enabled)."""
    key_file: ExistingFile | None = None
    """Its private key."""
    ca_file: ExistingFile | None = None
    """The agents' CA."""


class ConsolidationSettings(Settings):
    """The consolidation flow (issue 8): empty under-used nodes by migrating their batch pods, then hand the empty
    node to the autoscaler. Off unless enabled. When and which nodes (threshold, sustain period, quiet batch queue)
    are the autoscaler's options (underutil_threshold, underutil_sustain_seconds, batch_queue_quiet_seconds)."""

    enabled: bool = False
    """Run the flow."""
    agent: AgentEndpoint = AgentEndpoint()
    migration_timeout_seconds: float = Field(300.0, gt=0, allow_inf_nan=False)
    """One POST /v1/migrations answers when the migration has ended (checkpoint, transfer, restore)."""
    request_attempts: int = Field(3, ge=1, le=100)
    """An unanswered migration request is repeated (same id: the agent answers the recorded outcome)."""
    destination_scheduler_name: str = Field("qos-consolidation", min_length=1, max_length=253)
    """Destination pods are created with this schedulerName (served by no scheduler) and bound by our binder."""
    destination_ready_timeout_seconds: float = Field(60.0, gt=0, allow_inf_nan=False)
    """How long a restored destination pod may take to become Ready."""
    owner_settle_seconds: float = Field(2.0, ge=0, le=60, allow_inf_nan=False)
    """After a Job's pod is handed over: how long to wait before looking for a replacement its controller may
    have started in the hand-over window (the Job controller acts on pod events after a one-second batch)."""
    left_alone_seconds: float = Field(3600.0, ge=0, allow_inf_nan=False)
    """A node whose plan could not complete is uncordoned and not tried again for this long."""
    provisioned_only: bool = True
    """Only nodes labelled qos.kube-qos-extender.io/provisioned-by=qos-autoscaler are consolidated (and deleted);
    false under cluster-autoscaler, whose nodes carry no such label."""
    batch_queue_quiet_seconds: float | None = Field(None, ge=0, allow_inf_nan=False)
    """Extra quiet-queue gate checked right before a node is started; null: the autoscaler's value."""
    concurrent_nodes: int = Field(1, ge=1, le=100)
    """Nodes emptied at once (each one pod move at a time), within the disruption budgets of the extender file's
    `disruption:` section (kinds consolidation and migration), which may hold some of them back."""

    @model_validator(mode="after")
    def _mtls_when_enabled(self) -> ConsolidationSettings:
        a = self.agent
        if self.enabled and a.scheme == "https" and (a.cert_file is None or a.key_file is None or a.ca_file is None):
            raise ValueError(
                "agent: cert_file, key_file and ca_file are required (the agents accept mTLS clients only)"
            )
        return self

    # the flow's names for the agent endpoint
    @property
    def agent_port(self) -> int:
        return self.agent.port

    @property
    def agent_scheme(self) -> str:
        return self.agent.scheme

    @property
    def cert_file(self) -> str | None:
        return self.agent.cert_file

    @property
    def key_file(self) -> str | None:
        return self.agent.key_file

    @property
    def ca_file(self) -> str | None:
        return self.agent.ca_file


def parse_consolidation_config(raw: object, base: Path | None = None) -> ConsolidationSettings:
    """A parsed document of the file (``{consolidation: {...}}``); ``base`` resolves relative certificate paths."""
    if raw is None:
        raw = {}
    if isinstance(raw, dict) and set(raw) <= {"consolidation"}:
        return load_settings(ConsolidationSettings, raw.get("consolidation"), prefix="consolidation", base=base)
    return load_settings(_File, raw, base=base).consolidation


class _File(Settings):
    consolidation: ConsolidationSettings = ConsolidationSettings()


def load_consolidation_config(path: str | Path) -> ConsolidationSettings:
    return load_yaml_file(ConsolidationSettings, path, top="consolidation")
