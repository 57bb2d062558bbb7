"""Autoscaler configuration: strict parsing, and catalogues no plan can come from are config errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from extender.autoscaler.settings import load_autoscaler_config, parse_autoscaler_config
from extender.cli import build_parser
from extender.processes.autoscaler import run_autoscaler_command
from extender.settings import SettingsError
from extender.settings.extender import ExtenderConfig, load_config

EXT = ExtenderConfig(flavours=())  # no flavours of its own: the catalogue comes from the document


def parse(doc: dict[str, Any]) -> Any:
    return parse_autoscaler_config(doc, EXT)


def flavours(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": "a", "cpu": "2", "memory": "4Gi", "price_per_hour": 0.1}, *extra]


def test_default_file_with_the_extender_catalogue() -> None:
    s = load_autoscaler_config(None, load_config(None))
    assert s.provider == "kwok" and s.scheduler_names == ("qos-scheduler",)
    assert s.batch_cycle_seconds == 300.0 and s.idle_seconds == 300.0
    assert len(s.flavours) == 6


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"flavours": flavours({"name": "free", "cpu": "1", "memory": "1Gi", "price_per_hour": 0})}, "price_per_hour"),
        ({"flavours": flavours({"name": "z", "cpu": "0", "memory": "1Gi", "price_per_hour": 1})}, "positive"),
        ({"flavours": flavours({"name": "a", "cpu": "1", "memory": "1Gi", "price_per_hour": 1})}, "duplicate"),
        ({"flavours": []}, "empty"),
        ({}, "empty"),  # neither file has a catalogue
        ({"flavours": flavours(), "autoscaler": {"idle_second": 5}}, "unknown option"),
        ({"flavours": flavours(), "autoscaler": {"provider": "aws"}}, "autoscaler.provider: Input should be 'kwok'"),
        ({"flavours": flavours(), "autoscaler": {"provider": "cluster-autoscaler"}}, "cert_file"),
        ({"flavours": flavours(), "autoscaler": {"score_weights": {"cpu": 0, "memory": 0}}}, "both be zero"),
        ({"flavours": flavours(), "autoscaler": {"kwok": {"lag": {"distribution": "gamma"}}}}, "kwok.lag.distribution"),
        ({"flavours": flavours(), "autoscaler": {"node_name_prefix": "Bad_Prefix"}}, "node_name_prefix"),
        ({"flavours": flavours(), "autoscaler": {"scan_interval_seconds": 0}}, "scan_interval_seconds"),
        ({"flavours": flavours(), "autoscaler": {"limits": {"max_nodes": 0}}}, "max_nodes"),
        ({"flavours": flavours(), "autoscaler": {"dry_run": "false"}}, "autoscaler.dry_run: Input should be a valid"),
        ({"flavours": flavours(), "autoscaler": {"flavours": []}}, "autoscaler.flavours"),
    ],
)
def test_bad_config_is_a_clear_error(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse(doc)


def test_cli_exits_2_with_the_option_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "as.yaml"
    path.write_text("flavours:\n  - {name: free, cpu: '1', memory: 1Gi, price_per_hour: 0}\n")
    args = build_parser().parse_args(["autoscaler", "--autoscaler-config", str(path), "--check-config"])
    assert run_autoscaler_command(args) == 2
    err = capsys.readouterr().err
    assert "flavours[0].price_per_hour" in err and "must be a finite number > 0" in err
    path.write_text("autoscaler: {kwok: {lag: {distribution: uniform, min: 1, max: 3}}}\n")
    args = build_parser().parse_args(["autoscaler", "--autoscaler-config", str(path), "--check-config"])
    assert run_autoscaler_command(args) == 0
    assert "m1.xlarge" in capsys.readouterr().out
