"""The `slack` section of the extender config (extender.settings.extender): the shipped defaults (off),
strict validation with errors naming the option, and relative model paths."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from extender.colocation.controller import settings_from_config
from extender.core.model import DEFAULT_CLASSES
from extender.settings import SettingsError
from extender.settings.extender import ExtenderConfig, SlackConfig, load_config, parse_config


def parse_slack_config(raw: object, _classes: object = None, base: Path | None = None) -> SlackConfig:
    """The slack section as the extender's loader reads it (classes: the file's defaults)."""
    return parse_config({"slack": {} if raw is None else raw}, base).slack


def test_the_shipped_section_is_the_defaults_and_off() -> None:
    got = load_config().slack
    assert got == SlackConfig() and not got.enabled and not got.colocate.enabled
    assert (
        got.characterise.k == 20
        and got.characterise.seeds == 10
        and len(got.characterise.core().seeds) == 10
        and got.characterise.slots == 96
    )
    assert parse_slack_config(None) == SlackConfig()


def test_an_enabled_section_reaches_the_controller_settings(tmp_path: Path) -> None:
    raw = {
        "enabled": True,
        "prometheus_url": "http://127.0.0.1:9093",
        "rate_window": "30s",
        "model_path": "state/model.json",
        "refresh_seconds": 30,
        "classify_seconds": 600,
        "characterise": {"k": 2, "seeds": 1, "observation_seconds": 20},
        "colocate": {"enabled": True, "classes": ["bronze", "silver"]},
    }
    got = parse_slack_config(raw, DEFAULT_CLASSES, tmp_path)
    assert got.enabled and got.model_path == str(tmp_path / "state/model.json") and got.rate_window == "30s"
    assert got.colocate.classes == ("bronze", "silver")
    settings = settings_from_config(got, DEFAULT_CLASSES, load_config().pod_defaults)
    assert settings.config.k == 2 and settings.config.seeds == (0,) and settings.classify_seconds == 600
    assert settings.model_path == tmp_path / "state/model.json" and settings.classes["gold"].importance == 1


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"enabeld": True}, "slack.enabeld: unknown option"),
        ({"enabled": "yes"}, "slack.enabled: Input should be a valid boolean (got 'yes')"),
        ({"prometheus_url": "prometheus:9090"}, "slack.prometheus_url: must be an http"),
        ({"rate_window": "1m) or vector(1"}, "slack.rate_window: must be a duration"),
        ({"refresh_seconds": 0}, "slack.refresh_seconds: Input should be greater than or equal to 1"),
        ({"classify_seconds": 60}, "slack.classify_seconds: must cover"),
        ({"miss_tolerance": 1}, "slack.miss_tolerance: Input should be less than or equal to 0.99"),
        ({"characterise": {"k": 0}}, "slack.characterise.k: Input should be greater than or equal to 1"),
        ({"characterise": {"interval_seconds": 7}}, "slack.characterise: interval_seconds must be a positive"),
        (
            {"enabled": True, "colocate": {"enabled": True, "classes": ["platinum"]}},
            "slack.colocate.classes: unknown class 'platinum'",
        ),
        ({"colocate": {"classes": []}}, "slack.colocate.classes: Tuple should have at least 1 item"),
        ([], "slack: Input should be an object"),
    ],
)
def test_bad_values_are_refused_naming_the_option(raw: object, message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_slack_config(raw, DEFAULT_CLASSES)


def test_serve_refuses_a_bad_section_at_start(tmp_path: Path) -> None:
    """`qos-extender serve` validates the section before anything starts (exit 2, the option named)."""
    import subprocess
    import sys

    doc = ExtenderConfig().model_dump(mode="json", by_alias=True)
    doc["slack"]["characterise"]["k"] = -1
    bad = tmp_path / "extender.yaml"
    bad.write_text(yaml.safe_dump(doc))
    proc = subprocess.run(
        [sys.executable, "-m", "extender.cli", "serve", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "slack.characterise.k: Input should be greater than or equal to 1" in proc.stderr, (
        proc.stderr
    )


def test_colocation_without_the_publisher_is_refused_naming_both_options() -> None:
    """Co-located pods request batch resources only the publisher sets on nodes: without it they stay Pending."""
    with pytest.raises(SettingsError, match=r"slack\.colocate\.enabled.*slack\.enabled"):
        parse_slack_config({"colocate": {"enabled": True}}, DEFAULT_CLASSES)
    with pytest.raises(SettingsError, match=r"slack\.colocate\.enabled.*slack\.enabled"):
        parse_slack_config({"enabled": False, "colocate": {"enabled": True}}, DEFAULT_CLASSES)
    got = parse_slack_config({"enabled": True, "colocate": {"enabled": True}}, DEFAULT_CLASSES)
    assert got.enabled and got.colocate.enabled
