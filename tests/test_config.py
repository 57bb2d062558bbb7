"""config/extender.yaml and extender.config: documented defaults, strict validation with clear errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.config import (
    DEFAULT_CONFIG_PATH,
    ConfigError,
    ExtenderConfig,
    load_config,
    parse_config,
)
from extender.core.model import DEFAULT_CLASSES, WorkloadKind


def test_default_file_loads_and_matches_code_defaults() -> None:
    loaded = load_config()
    code = ExtenderConfig()
    for section in ("server", "kubernetes", "bind", "scheduling", "pod_defaults", "node_groups"):
        assert getattr(loaded, section) == getattr(code, section), section
    assert dict(loaded.policy.classes) == dict(DEFAULT_CLASSES)
    assert loaded.policy == code.policy
    assert loaded.log_level == "INFO"
    assert [f.name for f in loaded.flavours] == [
        "t3.xsmall",
        "m3.xsmall",
        "m3.small",
        "m1.medium",
        "m1.large",
        "m1.xlarge",
    ]


def _yaml_keys(obj: Any, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            keys.add(f"{prefix}{k}")
            if k not in ("classes", "match_labels"):
                keys |= _yaml_keys(v, f"{prefix}{k}.")
    elif isinstance(obj, list):
        for item in obj:
            keys |= _yaml_keys(item, f"{prefix}[].")
    return keys


def test_every_option_is_in_the_default_file_with_a_comment() -> None:
    """The reference file lists every option the parser knows, and each value line sits under a comment."""
    text = DEFAULT_CONFIG_PATH.read_text()
    present = _yaml_keys(yaml.safe_load(text))
    known = {
        "server", "server.host", "server.port", "server.max_body_bytes", "server.request_timeout_seconds",
        "server.tls", "server.tls.cert_file", "server.tls.key_file", "server.tls.client_ca_file",
        "server.tls.verb_clients", "server.tls.metrics_clients", "server.loopback_verbs_port",
        "kubernetes", "kubernetes.kubeconfig", "kubernetes.context", "kubernetes.watch_timeout_seconds",
        "kubernetes.backoff_initial_seconds", "kubernetes.backoff_max_seconds", "kubernetes.request_timeout_seconds",
        "kubernetes.events", "kubernetes.event_component",
        "bind", "bind.timeout_seconds", "bind.attempt_timeout_seconds", "bind.backoff_initial_seconds",
        "bind.ledger_ttl_seconds",
        "scheduling", "scheduling.profile", "scheduling.scaling_cycle_seconds", "scheduling.managed_resources",
        "scheduling.marker_resource",
        "pod_defaults", "pod_defaults.class", "pod_defaults.class_from_priority", "pod_defaults.kind",
        "pod_defaults.batch_runtime_seconds",
        "node_groups", "node_groups.batch", "node_groups.batch.match_labels", "node_groups.service",
        "node_groups.service.match_labels", "node_groups.unlabelled", "node_groups.enforce",
        "node_groups.flavour_label",
        "qos", "qos.alpha_seconds", "qos.min_run_quantum_seconds", "qos.q_hysteresis_seconds", "qos.overhead_cap",
        "qos.relax_by_importance",
        "classes", "flavours", "flavours.[].name", "flavours.[].cpu", "flavours.[].memory", "flavours.[].pods",
        "flavours.[].price_per_hour", "logging", "logging.level",
        "controller", "controller.enabled", "controller.watchdog_seconds", "controller.gate_name",
        "controller.scheduler_name", "controller.max_gate_seconds", "controller.requeue_pinned_seconds",
        "controller.time_compression",
        "controller.persistence", "controller.persist_interval_seconds",
        "controller.persist_min_interval_seconds", "controller.release_concurrency", "controller.pin_node",
        "controller.host_score",
        "controller.instance", "controller.leader_election", "controller.leader_election.enabled",
        "controller.leader_election.lease_name", "controller.leader_election.lease_namespace",
        "controller.leader_election.identity", "controller.leader_election.lease_duration_seconds",
        "controller.leader_election.renew_deadline_seconds", "controller.leader_election.retry_period_seconds",
    }  # fmt: skip
    known |= {"slack", "slack.characterise", "slack.colocate"} | {  # validated by controller/slack_config.py
        f"slack.{k}"
        for k in (
            "enabled", "prometheus_url", "rate_window", "model_path", "refresh_seconds", "history_seconds",
            "classify_seconds", "step_seconds", "node_selector", "evict", "miss_tolerance", "stale_seconds",
            "colocate.enabled",
            "colocate.classes", "characterise.k", "characterise.seeds", "characterise.interval_seconds",
            "characterise.observation_seconds", "characterise.recluster_seconds", "characterise.prediction_seconds",
        )
    }  # fmt: skip
    assert present == known
    lines = text.splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([a-z_]+):\s*(\S.*)?$", line)
        if not m or not m.group(3):
            continue  # a section header: its children are checked
        j = i - 1
        while j >= 0 and lines[j].strip() and not lines[j].strip().startswith("#"):
            j -= 1
        if j < 0 or not lines[j].strip().startswith("#"):
            undocumented.append(line.strip())
    assert undocumented == []


def test_empty_file_is_all_defaults(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("")
    cfg = load_config(p)
    assert cfg.server == ExtenderConfig().server
    assert cfg.flavours == ()


def _err(raw: Any, tmp_path: Path | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(raw, base=tmp_path)
    return str(info.value)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"sever": {}}, "sever: unknown option"),
        ({"server": {"prot": 1}}, "server.prot: unknown option"),
        ({"server": {"port": 70000}}, "server.port: must be between 0 and 65535"),
        ({"server": {"port": "8888"}}, "server.port: must be an integer"),
        ({"server": {"max_body_bytes": 10}}, "server.max_body_bytes: must be between 1024"),
        ({"server": {"request_timeout_seconds": 0}}, "server.request_timeout_seconds: must be > 0"),
        ({"server": {"request_timeout_seconds": float("nan")}}, "must be a finite number"),
        ({"server": []}, "server: must be a mapping"),
        ({"bind": {"timeout_seconds": 12.5}}, "bind.timeout_seconds: must be < server.request_timeout_seconds"),
        ({"bind": {"attempt_timeout_seconds": 5, "timeout_seconds": 3}}, "bind.attempt_timeout_seconds: must be <="),
        ({"controller": {"release_concurrency": 0}}, "controller.release_concurrency: must be between 1 and 1024"),
        ({"scheduling": {"profile": "fast"}}, "scheduling.profile: must be one of cost, spread (got 'fast')"),
        ({"scheduling": {"scaling_cycle_seconds": -1}}, "scheduling.scaling_cycle_seconds: must be > 0"),
        ({"scheduling": {"managed_resources": ["cpu"]}}, "'cpu' is always checked"),
        ({"scheduling": {"managed_resources": ["gpu"]}}, "not an extended resource name"),
        ({"scheduling": {"managed_resources": "x/y"}}, "must be a list of resource names"),
        ({"scheduling": {"marker_resource": "managed"}}, "not an extended resource name"),
        (
            {"scheduling": {"managed_resources": ["qos.kube-qos-extender.io/managed"]}},
            "is the marker_resource",
        ),
        ({"pod_defaults": {"class": "platinum"}}, "pod_defaults.class: unknown class 'platinum'"),
        ({"pod_defaults": {"kind": "daemon"}}, "pod_defaults.kind: must be one of batch, service"),
        ({"pod_defaults": {"class_from_priority": "yes"}}, "must be true or false"),
        ({"node_groups": {"unlabelled": "some"}}, "node_groups.unlabelled: must be one of any, batch, service, none"),
        ({"node_groups": {"batch": {"match_labels": {}}}}, "must not be empty"),
        (
            {"node_groups": {"batch": {"match_labels": {"a": "b"}}, "service": {"match_labels": {"a": "b"}}}},
            "identical",
        ),
        ({"node_groups": {"batch": {"match_labels": {"a": 1}}}}, "labels must be non-empty strings"),
        ({"kubernetes": {"backoff_initial_seconds": 5, "backoff_max_seconds": 1}}, "must be >= backoff_initial"),
        ({"kubernetes": {"watch_timeout_seconds": 0}}, "kubernetes.watch_timeout_seconds"),
        ({"kubernetes": {"kubeconfig": "/nonexistent/kubeconfig"}}, "does not exist"),
        ({"qos": {"alpha_seconds": -1}}, "qos.alpha_seconds: must be >= 0"),
        ({"qos": {"overhead_cap": 1}}, "qos.overhead_cap: must be true or false"),
        ({"classes": {}}, "classes: must be a non-empty mapping"),
        ({"classes": {"gold": {"importance": 1}}}, "classes.gold.slo: is required"),
        ({"classes": {"gold": {"slo": 1.5, "importance": 1}}}, "classes.gold.slo: must be <= 1.0"),
        ({"classes": {"gold": {"slo": 0.9, "importance": 0}}}, "classes.gold.importance: must be between 1"),
        ({"classes": {"gold": {"slo": 0.9, "importance": 1, "sigma": 2}}}, "classes.gold.sigma: unknown option"),
        ({"flavours": {"a": 1}}, "flavours: must be a list"),
        ({"flavours": [{"name": "a", "cpu": "2", "memory": "1Gi"}]}, "flavours[0].price_per_hour: is required"),
        ({"flavours": [{"name": "a", "cpu": "two", "memory": "1Gi", "price_per_hour": 1}]}, "flavours[0].cpu"),
        ({"flavours": [{"name": "a", "cpu": "0", "memory": "1Gi", "price_per_hour": 1}]}, "must be positive"),
        (
            {"flavours": [{"name": "a", "cpu": "1", "memory": "1Gi", "price_per_hour": 1}] * 2},
            "flavours[1].name: duplicate flavour 'a'",
        ),
        ({"logging": {"level": "LOUD"}}, "logging.level: must be one of"),
        ([1, 2], "must be a mapping"),
    ],
)
def test_invalid_options_are_named(raw: Any, message: str) -> None:
    assert message in _err(raw)


def test_tls_options(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("x")
    (tmp_path / "tls.key").write_text("x")
    (tmp_path / "ca.crt").write_text("x")
    assert "cert_file and key_file must be set together" in _err(
        {"server": {"tls": {"cert_file": "tls.crt"}}}, tmp_path
    )
    assert "client certificates need TLS" in _err({"server": {"tls": {"client_ca_file": "ca.crt"}}}, tmp_path)
    assert "does not exist" in _err({"server": {"tls": {"cert_file": "nope.crt", "key_file": "tls.key"}}}, tmp_path)
    cfg = parse_config(
        {"server": {"tls": {"cert_file": "tls.crt", "key_file": "tls.key", "client_ca_file": "ca.crt"}}}, base=tmp_path
    )
    assert cfg.server.tls.enabled
    assert cfg.server.tls.client_ca_file == str(tmp_path / "ca.crt")  # relative to the config file


def test_custom_values_are_applied(tmp_path: Path) -> None:
    p = tmp_path / "extender.yaml"
    p.write_text(
        yaml.safe_dump(
            {
                "scheduling": {"profile": "spread", "managed_resources": ["example.com/gpu"]},
                "pod_defaults": {"class": "silver", "kind": "batch", "batch_runtime_seconds": 600},
                "classes": {"silver": {"slo": 0.9, "importance": 2}},
                "node_groups": {"unlabelled": "none", "enforce": False},
            }
        )
    )
    cfg = load_config(p)
    assert cfg.scheduling.profile == "spread" and cfg.scheduling.managed_resources == ("example.com/gpu",)
    assert cfg.pod_defaults.kind is WorkloadKind.BATCH and cfg.pod_defaults.batch_runtime_seconds == 600
    assert list(cfg.policy.classes) == ["silver"]
    assert cfg.policy.classes["silver"].safety_margin_seconds == 10.0
    assert cfg.node_groups.unlabelled == "none" and cfg.node_groups.enforce is False


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    p = tmp_path / "broken.yaml"
    p.write_text("server: {port: [}\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)
    p.write_text("server: {port: -1}\n")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(p))}: server.port"):
        load_config(p)
