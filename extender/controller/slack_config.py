"""The ``slack`` section of the extender config: batch on the slack of long-running services (issue 16).

Why a module of its own and not a parser in ``extender/config.py``: the section's types (the
characterisation knobs, :class:`extender.controller.slack.SlackSettings`) belong to the slack controller, and
config sits below the controller in the import layers. ``extender.config`` keeps the section as given
(``ExtenderConfig.slack``); ``qos-extender serve`` validates it here at start on the strict settings base
(extender.settings: unknown key, wrong type or out-of-range value, every one named at once, exit 2), and the
admission webhook reads its ``colocate`` part the same way.

Off by default: lending a service's idle capacity changes what kube-scheduler admits and evicts batch pods
when a prediction is wrong, and it needs a Prometheus that has scraped the kubelets' usage for the
observation time. A user turns it on knowing both; with it off nothing is published, evicted or rewritten.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from extender.core.characterise import CharacteriseConfig
from extender.core.model import InvalidInputError, ServiceClass
from extender.settings import Settings, SettingsError, load_settings

__all__ = ["CharacteriseSettings", "ColocateConfig", "SlackConfig", "parse_slack_config"]

DEFAULT_PROMETHEUS_URL = "http://prometheus.monitoring.svc:9090"
DEFAULT_MODEL_PATH = "/var/lib/kube-qos-extender/workload-model.json"
_PROMQL_DURATION = re.compile(r"^[1-9][0-9]*[smh]$")


class CharacteriseSettings(Settings):
    """Paper 004's characterisation: classes per resource (paper: 20), k-means++ seeding runs (best inertia kept),
    interval of the day (must divide 86400), observation time before a new service gets a class (EOT),
    re-clustering cycle and the prediction window of Eq. 3, all in seconds."""

    k: int = Field(20, ge=1, le=1000)
    """Classes per resource (an upper bound: fewer distinct services give fewer classes)."""
    seeds: int = Field(10, ge=1, le=1000)
    """k-means++ seeding runs; the lowest inertia wins."""
    interval_seconds: int = Field(900, ge=1, le=86_400)
    """One interval of the day (must divide 86400)."""
    observation_seconds: float = Field(86_400.0, gt=0, allow_inf_nan=False)
    """How long a new service is watched before it is given a class."""
    recluster_seconds: float = Field(86_400.0, gt=0, allow_inf_nan=False)
    """The re-clustering cycle."""
    prediction_seconds: float = Field(900.0, gt=0, allow_inf_nan=False)
    """The window of Eq. 3's max."""

    def core(self) -> CharacteriseConfig:
        """The core's knobs (seeds 0..n-1)."""
        return CharacteriseConfig(
            k=self.k,
            seeds=tuple(range(self.seeds)),
            interval_seconds=self.interval_seconds,
            observation_seconds=self.observation_seconds,
            recluster_seconds=self.recluster_seconds,
            prediction_seconds=self.prediction_seconds,
        )

    @model_validator(mode="after")
    def _core_accepts(self) -> CharacteriseSettings:
        try:
            self.core()
        except InvalidInputError as exc:
            raise ValueError(str(exc)) from exc
        return self

    # the controller's reads of the core knobs
    @property
    def slots(self) -> int:
        return self.core().slots


class ColocateConfig(Settings):
    """Which pods the admission webhook moves onto the slack: pods annotated
    ``qos.kube-qos-extender.io/colocate: "true"`` whose class is in ``classes`` (and of kind batch)."""

    enabled: bool = False
    """Move such pods onto the slack (needs slack.enabled: only the publisher sets the batch resources)."""
    classes: tuple[str, ...] = Field(("bronze",), min_length=1)
    """Service classes whose annotated batch pods are co-located."""

    @field_validator("classes")
    @classmethod
    def _names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not all(value):
            raise ValueError("class names must be non-empty")
        return value


class SlackConfig(Settings):
    """Batch on the slack of long-running services (paper 004, issue 16): every refresh_seconds the controller
    classifies the running services from their usage in Prometheus, predicts what each will leave idle in the next
    interval (Eq. 3) and publishes each node's sum as the extended resources qos.kube-qos-extender.io/batch-cpu and
    .../batch-memory. Off by default."""

    enabled: bool = False
    """Publish slack and evict on wrong predictions."""
    prometheus_url: str = DEFAULT_PROMETHEUS_URL
    """Prometheus scraping the kubelets' /metrics/resource (or cAdvisor): http:// or https:// URL."""
    rate_window: str = "1m"
    """Rate window of the cpu usage counter (a PromQL duration like 30s, 1m, 5m: at least two scrapes)."""
    model_path: str = Field(DEFAULT_MODEL_PATH, min_length=1)
    """The fitted model, kept across restarts (relative: from the config file's folder)."""
    refresh_seconds: float = Field(900.0, ge=1.0, allow_inf_nan=False)
    """Publish, check and evict this often."""
    history_seconds: float = Field(8 * 86_400.0, gt=0, allow_inf_nan=False)
    """Usage history a (re)fit reads (the paper: 8 days)."""
    classify_seconds: float = Field(86_400.0, gt=0, allow_inf_nan=False)
    """Usage read each refresh to classify services (must cover characterise.observation_seconds)."""
    step_seconds: float = Field(60.0, ge=1.0, allow_inf_nan=False)
    """Resolution of those range queries."""
    node_selector: str | None = Field(None, min_length=1)
    """Label selector of the nodes to publish on; null: every node."""
    evict: bool = True
    """false: prediction misses are counted but nothing is evicted."""
    miss_tolerance: float = Field(0.05, ge=0.0, le=0.99)
    """A service leaving less idle than predicted by more than this fraction of its request is a miss."""
    stale_seconds: float = Field(1800.0, gt=0, allow_inf_nan=False)
    """Seconds the usage may stay unreadable before every node publishes 0 batch capacity."""
    characterise: CharacteriseSettings = CharacteriseSettings()
    colocate: ColocateConfig = ColocateConfig()

    @field_validator("prometheus_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
        return value

    @field_validator("rate_window")
    @classmethod
    def _window(cls, value: str) -> str:
        # it goes into a PromQL query: nothing but a duration is accepted
        if not _PROMQL_DURATION.match(value):
            raise ValueError(f"must be a duration like 30s, 1m or 5m, got {value!r}")
        return value

    @model_validator(mode="after")
    def _cross(self) -> SlackConfig:
        observation = self.characterise.observation_seconds
        if self.classify_seconds < observation:
            raise ValueError(
                f"classify_seconds: must cover characterise.observation_seconds ({observation}), got "
                f"{self.classify_seconds} (no new service could ever be classified)"
            )
        if self.colocate.enabled and not self.enabled:
            raise ValueError(
                "colocate.enabled: true needs slack.enabled: true (co-located pods request the batch resources"
                " only the slack publisher sets on nodes; without it they would stay Pending)"
            )
        return self


def parse_slack_config(
    raw: object, classes: Mapping[str, ServiceClass] | None = None, base: Path | None = None
) -> SlackConfig:
    """Validate the ``slack`` section (None: every default, i.e. off). ``classes``: the config's service
    classes, which ``colocate.classes`` must name; ``base``: the config file's folder (a relative
    ``model_path`` is resolved against it)."""
    got = load_settings(SlackConfig, raw, prefix="slack")
    if classes is not None:
        unknown = sorted(set(got.colocate.classes) - set(classes))
        if unknown:
            raise SettingsError(
                "",
                [("slack.colocate.classes", f"unknown class {unknown[0]!r} (known: {', '.join(sorted(classes))})")],
            )
    if base is not None and not Path(got.model_path).is_absolute():
        got = got.model_copy(update={"model_path": str(base / got.model_path)})
    return got


def config_section(config: Any) -> object:
    """The raw ``slack`` section of an ``ExtenderConfig`` (None on a config that has none)."""
    return getattr(config, "slack", None)
