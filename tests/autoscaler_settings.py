"""Tests build AutoscalerSettings from the loop's flat names (max_nodes=..., lag_window=...): this maps them onto
the settings' sections (limits, lag, metrics, kwok, cluster_autoscaler, score_weights). Test-only: files use the
sections, and a section built here is not bounds-checked (parity tests lift limits beyond a file's bounds)."""

from __future__ import annotations

from typing import Any

from extender.autoscaler.settings import (
    AutoscalerSettings,
    KwokSettings,
    LagSettings,
    LimitsSettings,
    MetricsSettings,
    ScoreWeightsSettings,
)

_SECTIONS: dict[str, tuple[str, str]] = {
    "lag_default_seconds": ("lag", "default_seconds"),
    "lag_window": ("lag", "window"),
    "lag_quantile": ("lag", "quantile"),
    "max_nodes_per_cycle": ("limits", "max_nodes_per_cycle"),
    "max_nodes": ("limits", "max_nodes"),
    "retire_drain_seconds": ("limits", "retire_drain_seconds"),
    "max_attempts_per_pod": ("limits", "max_attempts_per_pod"),
    "metrics_host": ("metrics", "host"),
    "metrics_port": ("metrics", "port"),
    "kwok_lag": ("kwok", "lag"),
}
_MODELS = {"lag": LagSettings, "limits": LimitsSettings, "metrics": MetricsSettings, "kwok": KwokSettings}


def make_settings(**flat: Any) -> AutoscalerSettings:
    kw: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        if key in _SECTIONS:
            section, field = _SECTIONS[key]
            parts.setdefault(section, {})[field] = value
        elif key == "expander":
            kw["cluster_autoscaler"] = value
        elif key == "weights":
            kw["score_weights"] = ScoreWeightsSettings(cpu=value.cpu, memory=value.memory)
        else:
            kw[key] = value
    for section, values in parts.items():
        # unvalidated: parity tests lift limits beyond what a file may set (10**6 attempts: "no limit")
        kw[section] = _MODELS[section].model_construct(**values)
    return AutoscalerSettings(**kw)
