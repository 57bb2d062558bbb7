"""Settings of `qos-extender serve` (and what the autoscaler shares with it): the root of the sections in
extender.settings.sections, and its loader.

Every option is declared once, in the sections: its type, default, bounds and description (the attribute
docstring). The reference users copy from (docs/settings/extender.yaml) and its JSON Schema are generated from the
models (``python -m extender.processes.settings_reference``), so they cannot drift. Loading is strict: an unknown
key, a wrong type (``server.port: "8888"``, ``controller.enabled: "false"``) or an out-of-range value stops the
process, and every such error of the files is named at once, because a typo that silently falls back to a default
changes placement decisions without anyone noticing.

Deployed files hold only what differs from the defaults. ``--config`` may be given several times: the files are
layered in order (a section merges option by option; an option's value -- a list, a label map, the class table
-- replaces; a bare section header changes nothing), so an overlay
(config/controller's ``controller.enabled: true``) is one line, not a copy of the base. The flavour catalogue is
set in one place, extender/flavours.yaml (config/flavours.yaml), and is the default of ``flavours``.

Only the wiring (processes, the webhook's app, the controller) takes the root; the low layers take their sections
(an import-linter contract).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, model_validator

from extender.core.model import InvalidInputError
from extender.core.qos import QosPolicy
from extender.settings import Settings, SettingsError, layer, load_settings, read_yaml, resolve_files
from extender.settings.sections import (
    DEFAULT_CLASS_SETTINGS,
    FLAVOURS_PATH,
    MARKER_RESOURCE,
    METRICS_CLIENT_CN,
    SCHEDULER_CLIENT_CN,
    BindConfig,
    Catalogue,
    CharacteriseSettings,
    ClassSettings,
    ColocateConfig,
    ControllerConfig,
    DisruptionSettings,
    KubernetesConfig,
    LabelSelector,
    LeaderElectionConfig,
    LoggingConfig,
    NodeGroupsConfig,
    NonEmpty,
    PodDefaults,
    QosSettings,
    SchedulingConfig,
    ServerConfig,
    SlackConfig,
    TlsConfig,
    parse_flavours,
    read_catalogue,
)

__all__ = [
    "FLAVOURS_PATH",
    "MARKER_RESOURCE",
    "METRICS_CLIENT_CN",
    "SCHEDULER_CLIENT_CN",
    "BindConfig",
    "CharacteriseSettings",
    "ClassSettings",
    "ColocateConfig",
    "ConfigError",
    "ControllerConfig",
    "ExtenderConfig",
    "KubernetesConfig",
    "LabelSelector",
    "LeaderElectionConfig",
    "LoggingConfig",
    "NodeGroupsConfig",
    "PodDefaults",
    "QosSettings",
    "SchedulingConfig",
    "ServerConfig",
    "SlackConfig",
    "TlsConfig",
    "deep_merge",
    "load_config",
    "parse_config",
    "parse_flavours",
    "read_yaml_files",
]


class ConfigError(SettingsError):
    """The configuration files are unusable; the message names every offending option."""


class ExtenderConfig(Settings):
    """Configuration of `qos-extender serve` (the kube-scheduler extender webhook and the QoS controller); the
    autoscaler reads the same file for what it shares (Kubernetes access, node groups, classes, flavours)."""

    server: ServerConfig = ServerConfig()
    kubernetes: KubernetesConfig = KubernetesConfig()
    bind: BindConfig = BindConfig()
    scheduling: SchedulingConfig = SchedulingConfig()
    pod_defaults: PodDefaults = PodDefaults()
    node_groups: NodeGroupsConfig = NodeGroupsConfig()
    qos: QosSettings = QosSettings()
    classes: dict[NonEmpty, ClassSettings] = Field(default_factory=lambda: dict(DEFAULT_CLASS_SETTINGS), min_length=1)
    """Service classes by name (paper 002 §3.1, §4.2; defaults gold, silver, bronze)."""
    flavours: Catalogue = Field(default_factory=lambda: read_catalogue(FLAVOURS_PATH))
    """Node flavours (instance types): name, cpu and memory as Kubernetes quantities, pods (default 110),
    price_per_hour > 0. Default: extender/flavours.yaml (paper 000 Table 7, Nectar flavours priced as Azure
    B-series); a list given here replaces it whole."""
    logging: LoggingConfig = LoggingConfig()
    controller: ControllerConfig = ControllerConfig()
    slack: SlackConfig = SlackConfig()
    disruption: DisruptionSettings = DisruptionSettings()

    _policy: tuple[object, object, QosPolicy] | None = PrivateAttr(None)

    @property
    def policy(self) -> QosPolicy:
        """The core's QoS policy from `qos` and `classes` (built once per pair of sections)."""
        memo = self._policy
        if memo is None or memo[0] is not self.qos or memo[1] is not self.classes:
            memo = (self.qos, self.classes, self._build_policy())
            self._policy = memo
        return memo[2]

    @property
    def log_level(self) -> str:
        return self.logging.level

    def _build_policy(self) -> QosPolicy:
        q = self.qos
        return QosPolicy(
            classes={name: c.core(name) for name, c in self.classes.items()},
            alpha_seconds=q.alpha_seconds,
            min_run_quantum_seconds=q.min_run_quantum_seconds,
            q_hysteresis_seconds=q.q_hysteresis_seconds,
            overhead_cap=q.overhead_cap,
            relax_by_importance=q.relax_by_importance,
            peer_rescue_only=q.peer_rescue_only,
            peer_victim_wait_seconds=q.peer_victim_wait_seconds,
        )

    @model_validator(mode="after")
    def _cross(self) -> ExtenderConfig:
        classes = sorted(self.classes)
        if self.pod_defaults.class_name not in self.classes:
            raise ValueError(
                f"pod_defaults.class: unknown class {self.pod_defaults.class_name!r} (defined: {', '.join(classes)})"
            )
        unknown = sorted(set(self.slack.colocate.classes) - set(self.classes))
        if unknown and self.slack.colocate.enabled:
            raise ValueError(f"slack.colocate.classes: unknown class {unknown[0]!r} (known: {', '.join(classes)})")
        if self.bind.timeout_seconds >= self.server.request_timeout_seconds:
            raise ValueError(
                f"bind.timeout_seconds: must be < server.request_timeout_seconds "
                f"({self.server.request_timeout_seconds}): a bind must answer before the request is cut off"
            )
        try:  # the core's own checks, at start; and the policy is built once
            self._policy = (self.qos, self.classes, self._build_policy())
        except InvalidInputError as exc:
            raise ValueError(f"classes: {exc}") from exc
        return self


# ---------------------------------------------------------------------------------------------- loading


def deep_merge(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """Two extender documents layered (``settings.layer``): sections merge option by option; an option's value
    (a list, a label map, the class table) replaces; a bare section header in the overlay changes nothing."""
    return layer(ExtenderConfig, base, overlay)


def read_yaml_files(paths: Sequence[Path]) -> dict[str, Any]:
    """The files' YAML documents deep-merged in order (an empty file is {}), each file's relative file options
    made absolute from its folder; a file that cannot be read, is not YAML or is not a mapping is a ConfigError
    naming it."""
    merged: dict[str, Any] = {}
    for path in paths:  # each file's relative file options are taken from its own folder before the merge
        raw = read_yaml(path, ConfigError)
        if raw is None:
            continue
        if not isinstance(raw, dict):
            raise ConfigError(str(path), [("", f"must be a mapping, got {type(raw).__name__}")])
        merged = deep_merge(merged, resolve_files(ExtenderConfig, raw, path.resolve().parent))
    return merged


def parse_config(raw: object, base: Path | None = None, source: str = "") -> ExtenderConfig:
    """Validate a parsed YAML document (every error at once); ``base`` resolves relative file paths."""
    try:
        return load_settings(ExtenderConfig, raw, source, base=base)
    except ConfigError:
        raise
    except SettingsError as exc:
        raise ConfigError(exc.source, exc.problems) from None


def load_config(paths: str | Path | Sequence[str | Path] | None = None) -> ExtenderConfig:
    """The configuration from zero or more YAML files, deep-merged in order (none: every default). A relative file
    option is read from the folder of the file that sets it."""
    if paths is None:
        files: list[Path] = []
    elif isinstance(paths, str | Path):
        files = [Path(paths)]
    else:
        files = [Path(p) for p in paths]
    return parse_config(read_yaml_files(files), None, " + ".join(str(p) for p in files))
