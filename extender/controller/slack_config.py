"""The ``slack`` section of the extender config: batch on the slack of long-running services (issue 16).

Why a module of its own and not a parser in ``extender/config.py``: the section's types (the
characterisation knobs, :class:`extender.controller.slack.SlackSettings`) belong to the slack controller, and
config sits below the controller in the import layers. ``extender.config`` keeps the section as given
(``ExtenderConfig.slack``); ``qos-extender serve`` validates it here at start with the same strict readers
(unknown key, wrong type or out-of-range value: an error naming the option, exit 2), and the admission
webhook reads its ``colocate`` part the same way.

Off by default: lending a service's idle capacity changes what kube-scheduler admits and evicts batch pods
when a prediction is wrong, and it needs a Prometheus that has scraped the kubelets' usage for the
observation time. A user turns it on knowing both; with it off nothing is published, evicted or rewritten.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extender.config import ConfigError, read_bool, read_int, read_number, read_str, section
from extender.core.characterise import CharacteriseConfig
from extender.core.model import InvalidInputError, ServiceClass

__all__ = ["ColocateConfig", "SlackConfig", "parse_slack_config"]

DEFAULT_PROMETHEUS_URL = "http://prometheus.monitoring.svc:9090"
DEFAULT_MODEL_PATH = "/var/lib/kube-qos-extender/workload-model.json"
_CHARACTERISE_KEYS = {
    "k",
    "seeds",
    "interval_seconds",
    "observation_seconds",
    "recluster_seconds",
    "prediction_seconds",
}
_KEYS = {
    "enabled",
    "prometheus_url",
    "rate_window",
    "model_path",
    "refresh_seconds",
    "history_seconds",
    "classify_seconds",
    "step_seconds",
    "node_selector",
    "evict",
    "miss_tolerance",
    "stale_seconds",
    "characterise",
    "colocate",
}


@dataclass(frozen=True, slots=True)
class ColocateConfig:
    """Which pods the admission webhook moves onto the slack: pods annotated
    ``qos.kube-qos-extender.io/colocate: "true"`` whose class is in ``classes`` (and of kind batch)."""

    enabled: bool = False
    classes: tuple[str, ...] = ("bronze",)


@dataclass(frozen=True, slots=True)
class SlackConfig:
    enabled: bool = False
    prometheus_url: str = DEFAULT_PROMETHEUS_URL
    rate_window: str = "1m"
    model_path: str = DEFAULT_MODEL_PATH
    refresh_seconds: float = 900.0
    history_seconds: float = 8 * 86_400.0
    classify_seconds: float = 86_400.0
    step_seconds: float = 60.0
    node_selector: str | None = None
    evict: bool = True
    miss_tolerance: float = 0.05
    stale_seconds: float = 1800.0
    characterise: CharacteriseConfig = field(default_factory=CharacteriseConfig)
    colocate: ColocateConfig = field(default_factory=ColocateConfig)


def _rate_window(value: str, path: str) -> str:
    """A PromQL duration (``30s``, ``1m``, ``5m``): it goes into a query, so nothing else is accepted."""
    digits = value[:-1] if value[-1:] in ("s", "m", "h") else ""
    if not digits.isdigit() or int(digits) == 0:
        raise ConfigError(f"{path}: must be a duration like 30s, 1m or 5m, got {value!r}")
    return value


def parse_slack_config(
    raw: object, classes: Mapping[str, ServiceClass] | None = None, base: Path | None = None
) -> SlackConfig:
    """Validate the ``slack`` section (None: every default, i.e. off). ``classes``: the config's service
    classes, which ``colocate.classes`` must name; ``base``: the config file's folder (a relative
    ``model_path`` is resolved against it)."""
    path = "slack"
    s = section(raw, path, _KEYS)
    c = section(s.get("characterise"), f"{path}.characterise", _CHARACTERISE_KEYS)
    cp = f"{path}.characterise"
    seeds = read_int(c, "seeds", cp, 10, minimum=1, maximum=1000)
    try:
        characterise = CharacteriseConfig(
            k=read_int(c, "k", cp, 20, minimum=1, maximum=1000),
            seeds=tuple(range(seeds)),
            interval_seconds=read_int(c, "interval_seconds", cp, 900, minimum=1, maximum=86_400),
            observation_seconds=read_number(c, "observation_seconds", cp, 86_400.0, minimum=0, exclusive_min=True),
            recluster_seconds=read_number(c, "recluster_seconds", cp, 86_400.0, minimum=0, exclusive_min=True),
            prediction_seconds=read_number(c, "prediction_seconds", cp, 900.0, minimum=0, exclusive_min=True),
        )
    except InvalidInputError as exc:
        raise ConfigError(f"{cp}: {exc}") from exc
    co = section(s.get("colocate"), f"{path}.colocate", {"enabled", "classes"})
    names = co.get("classes", ["bronze"])
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"{path}.colocate.classes: must be a non-empty list of class names, got {names!r}")
    if classes is not None:
        unknown = sorted(set(names) - set(classes))
        if unknown:
            raise ConfigError(
                f"{path}.colocate.classes: unknown class {unknown[0]!r} (known: {', '.join(sorted(classes))})"
            )
    model_path = read_str(s, "model_path", path, DEFAULT_MODEL_PATH)
    assert model_path is not None
    if base is not None and not Path(model_path).is_absolute():
        model_path = str(base / model_path)
    observation = characterise.observation_seconds
    classify = read_number(s, "classify_seconds", path, 86_400.0, minimum=0, exclusive_min=True)
    if classify < observation:
        raise ConfigError(
            f"{path}.classify_seconds: must cover characterise.observation_seconds ({observation}), got {classify}"
            " (no new service could ever be classified)"
        )
    url = read_str(s, "prometheus_url", path, DEFAULT_PROMETHEUS_URL)
    assert url is not None
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{path}.prometheus_url: must be an http:// or https:// URL, got {url!r}")
    window = read_str(s, "rate_window", path, "1m")
    assert window is not None
    enabled = read_bool(s, "enabled", path, False)
    colocate = read_bool(co, "enabled", f"{path}.colocate", False)
    if colocate and not enabled:
        raise ConfigError(
            f"{path}.colocate.enabled: true needs {path}.enabled: true (co-located pods request the batch"
            " resources only the slack publisher sets on nodes; without it they would stay Pending)"
        )
    return SlackConfig(
        enabled=enabled,
        prometheus_url=url,
        rate_window=_rate_window(window, f"{path}.rate_window"),
        model_path=model_path,
        refresh_seconds=read_number(s, "refresh_seconds", path, 900.0, minimum=1.0),
        history_seconds=read_number(s, "history_seconds", path, 8 * 86_400.0, minimum=0, exclusive_min=True),
        classify_seconds=classify,
        step_seconds=read_number(s, "step_seconds", path, 60.0, minimum=1.0),
        node_selector=read_str(s, "node_selector", path, None),
        evict=read_bool(s, "evict", path, True),
        miss_tolerance=read_number(s, "miss_tolerance", path, 0.05, minimum=0.0, maximum=0.99),
        stale_seconds=read_number(s, "stale_seconds", path, 1800.0, minimum=0, exclusive_min=True),
        characterise=characterise,
        colocate=ColocateConfig(enabled=colocate, classes=tuple(names)),
    )


def config_section(config: Any) -> object:
    """The raw ``slack`` section of an ``ExtenderConfig`` (None on a config that has none)."""
    return getattr(config, "slack", None)
