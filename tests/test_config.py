"""extender.settings.extender: the extender's settings -- defaults, strict validation naming every wrong option at
once, and layered files (several --config deep-merged in order)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.core.model import DEFAULT_CLASSES, WorkloadKind
from extender.settings.extender import FLAVOURS_PATH, ConfigError, ExtenderConfig, deep_merge, load_config, parse_config


def test_no_file_is_every_default_and_the_catalogue_comes_from_its_one_file() -> None:
    loaded = load_config()
    assert loaded == ExtenderConfig() == load_config([])
    assert dict(loaded.policy.classes) == dict(DEFAULT_CLASSES)
    assert loaded.log_level == "INFO"
    names = [f["name"] for f in yaml.safe_load(FLAVOURS_PATH.read_text())["flavours"]]
    assert [f.name for f in loaded.flavours] == names
    assert names == ["t3.xsmall", "m3.xsmall", "m3.small", "m1.medium", "m1.large", "m1.xlarge"]
    assert Path("config/flavours.yaml").resolve() == FLAVOURS_PATH  # the one catalogue, linked for hack/


def test_empty_file_is_all_defaults(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("")
    assert load_config(p) == ExtenderConfig()


def test_a_bare_section_header_is_its_defaults(tmp_path: Path) -> None:
    """`server:` with every option commented out is YAML null: the section's defaults, not an error. A null
    where a value belongs is still refused."""
    p = tmp_path / "c.yaml"
    p.write_text("server:\n  # port: 9443\ncontroller:\n  leader_election:\n")
    assert load_config(p) == ExtenderConfig()
    assert "server.port: Input should be a valid integer" in _err({"server": {"port": None}})
    # a list or map option under a bare header: its defaults too (the catalogue, the classes)
    assert parse_config({"flavours": None, "classes": None}) == ExtenderConfig()


def test_an_option_is_named_as_the_reference_names_it() -> None:
    """`class_name` is the Python attribute of `pod_defaults.class`: a file that spells it so gets an error, not
    a silent second spelling."""
    assert "pod_defaults.class_name: unknown option (the option is 'class')" in _err(
        {"pod_defaults": {"class_name": "gold"}}
    )


def _err(raw: Any, tmp_path: Path | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(raw, base=tmp_path)
    return str(info.value)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"sever": {}}, "sever: unknown option"),
        ({"server": {"prot": 1}}, "server.prot: unknown option"),
        ({"server": {"port": 70000}}, "server.port: Input should be less than or equal to 65535"),
        ({"server": {"port": "8888"}}, "server.port: Input should be a valid integer (got '8888')"),
        ({"server": {"port": 8888.5}}, "server.port: Input should be a valid integer"),
        ({"server": {"max_body_bytes": 10}}, "server.max_body_bytes: Input should be greater than or equal to 1024"),
        ({"server": {"request_timeout_seconds": 0}}, "server.request_timeout_seconds: Input should be greater than 0"),
        ({"server": {"request_timeout_seconds": float("nan")}}, "server.request_timeout_seconds: Input should be a"),
        ({"server": {"request_timeout_seconds": "12"}}, "server.request_timeout_seconds: Input should be a valid n"),
        ({"server": []}, "server: Input should be an object"),
        ({"bind": {"timeout_seconds": 42.5}}, "bind.timeout_seconds: must be < server.request_timeout_seconds"),
        ({"bind": {"attempt_timeout_seconds": 5, "timeout_seconds": 3}}, "bind.attempt_timeout_seconds: must be <="),
        ({"controller": {"release_concurrency": 0}}, "controller.release_concurrency: Input should be greater"),
        ({"controller": {"enabled": "false"}}, "controller.enabled: Input should be a valid boolean (got 'false')"),
        ({"controller": {"gate_name": "ordering"}}, "controller.gate_name: 'ordering' must be a qualified name"),
        ({"controller": {"instance": "Bad_Name"}}, "controller.instance: 'Bad_Name' must be a lowercase DNS label"),
        ({"controller": {"watchdog_seconds": 20, "max_gate_seconds": 10}}, "controller.max_gate_seconds: must be >="),
        (
            {"controller": {"leader_election": {"lease_duration_seconds": 5}}},
            "controller.leader_election.renew_deadline_seconds: must be < lease_duration_seconds (5)",
        ),
        (
            {"controller": {"leader_election": {"retry_period_seconds": 9}}},
            "controller.leader_election.retry_period_seconds: must be < renew_deadline_seconds / 1.2",
        ),
        ({"scheduling": {"profile": "fast"}}, "scheduling.profile: Input should be 'cost' or 'spread' (got 'fast')"),
        ({"scheduling": {"scaling_cycle_seconds": -1}}, "scheduling.scaling_cycle_seconds: Input should be greater"),
        ({"scheduling": {"managed_resources": ["cpu"]}}, "scheduling.managed_resources: 'cpu' is always checked"),
        ({"scheduling": {"managed_resources": ["gpu"]}}, "'gpu' is not an extended resource name"),
        ({"scheduling": {"managed_resources": "x/y"}}, "scheduling.managed_resources: Input should be a valid array"),
        ({"scheduling": {"marker_resource": "managed"}}, "scheduling.marker_resource: 'managed' is not an extended"),
        (
            {"scheduling": {"managed_resources": ["qos.kube-qos-extender.io/managed"]}},
            "scheduling.managed_resources: 'qos.kube-qos-extender.io/managed' is the marker_resource",
        ),
        ({"pod_defaults": {"class": "platinum"}}, "pod_defaults.class: unknown class 'platinum'"),
        ({"pod_defaults": {"kind": "daemon"}}, "pod_defaults.kind: Input should be 'batch' or 'service'"),
        ({"pod_defaults": {"class_from_priority": "yes"}}, "pod_defaults.class_from_priority: Input should be a valid"),
        ({"node_groups": {"unlabelled": "some"}}, "node_groups.unlabelled: Input should be 'any', 'batch'"),
        ({"node_groups": {"batch": {"match_labels": {}}}}, "node_groups.batch.match_labels: Dictionary should have"),
        (
            {"node_groups": {"batch": {"match_labels": {"a": "b"}}, "service": {"match_labels": {"a": "b"}}}},
            "node_groups: batch and service selectors are identical",
        ),
        ({"node_groups": {"batch": {"match_labels": {"a": 1}}}}, "node_groups.batch.match_labels.a: Input should be"),
        (
            {"kubernetes": {"backoff_initial_seconds": 5, "backoff_max_seconds": 1}},
            "kubernetes.backoff_max_seconds: must be >= backoff_initial_seconds (5.0)",
        ),
        ({"kubernetes": {"watch_timeout_seconds": 0}}, "kubernetes.watch_timeout_seconds: Input should be greater"),
        ({"kubernetes": {"kubeconfig": "/nonexistent/kubeconfig"}}, "kubernetes.kubeconfig: file '/nonexistent"),
        ({"qos": {"alpha_seconds": -1}}, "qos.alpha_seconds: Input should be greater than or equal to 0"),
        ({"qos": {"overhead_cap": 1}}, "qos.overhead_cap: Input should be a valid boolean (got 1)"),
        ({"classes": {}}, "classes: Dictionary should have at least 1 item"),
        ({"classes": {"gold": {"importance": 1}}}, "classes.gold.slo: Field required"),
        ({"classes": {"gold": {"slo": 1.5, "importance": 1}}}, "classes.gold.slo: Input should be less than or equal"),
        ({"classes": {"gold": {"slo": 0.9, "importance": 0}}}, "classes.gold.importance: Input should be greater"),
        ({"classes": {"gold": {"slo": 0.9, "importance": 1, "sigma": 2}}}, "classes.gold.sigma: unknown option"),
        ({"flavours": {"a": 1}}, "flavours: Input should be a valid array"),
        ({"flavours": [{"name": "a", "cpu": "2", "memory": "1Gi"}]}, "flavours[0].price_per_hour: is required"),
        ({"flavours": [{"name": "a", "cpu": "two", "memory": "1Gi", "price_per_hour": 1}]}, "flavours[0].cpu: malfo"),
        ({"flavours": [{"name": "a", "cpu": "0", "memory": "1Gi", "price_per_hour": 1}]}, "must be positive"),
        ({"flavours": [{"name": "a", "cpu": "1", "memory": "1Gi", "price_per_hour": "1"}]}, "flavours[0].price_per"),
        ({"flavours": [{"name": "a", "cpu": "1", "memory": "1Gi", "price_per_hour": 1, "gpu": 1}]}, "[0].gpu: unkno"),
        (
            {"flavours": [{"name": "a", "cpu": "1", "memory": "1Gi", "price_per_hour": 1}] * 2},
            "flavours: duplicate flavour 'a'",
        ),
        ({"logging": {"level": "LOUD"}}, "logging.level: Input should be 'DEBUG', 'INFO', 'WARNING' or 'ERROR'"),
        ({"slack": {"enabled": "true"}}, "slack.enabled: Input should be a valid boolean (got 'true')"),
        (
            {"slack": {"enabled": True, "colocate": {"enabled": True, "classes": ["platinum"]}}},
            "slack.colocate.classes: unknown class 'platinum'",
        ),
        ([1, 2], "must be a mapping, got list"),
    ],
)
def test_invalid_options_are_named(raw: Any, message: str) -> None:
    assert message in _err(raw)


def test_every_error_of_a_file_is_named_at_once(tmp_path: Path) -> None:
    """The issue's case: a string port and an unknown key, plus a string boolean deeper down -- all three named in
    one error, each by its path, so a file is fixed in one pass."""
    p = tmp_path / "extender.yaml"
    p.write_text('server: {port: "8888", bogus: 1}\ncontroller: {leader_election: {enabled: "false"}}\n')
    with pytest.raises(ConfigError) as info:
        load_config(p)
    assert [path for path, _ in info.value.problems] == [
        "server.port",
        "server.bogus",
        "controller.leader_election.enabled",
    ]
    text = str(info.value)
    assert text.startswith(f"{p}: 3 problems")
    assert "got '8888'" in text and "got 'false'" in text


def test_tls_options(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("x")
    (tmp_path / "tls.key").write_text("x")
    (tmp_path / "ca.crt").write_text("x")
    assert "server.tls.cert_file: cert_file and key_file must be set together" in _err(
        {"server": {"tls": {"cert_file": "tls.crt"}}}, tmp_path
    )
    assert "server.tls.client_ca_file: client certificates need TLS" in _err(
        {"server": {"tls": {"client_ca_file": "ca.crt"}}}, tmp_path
    )
    assert "server.tls.cert_file: file" in _err(
        {"server": {"tls": {"cert_file": "nope.crt", "key_file": "tls.key"}}}, tmp_path
    )
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
                "bind": {"attempt_timeout_seconds": 2},
            }
        )
    )
    cfg = load_config(p)
    assert cfg.scheduling.profile == "spread" and cfg.scheduling.managed_resources == ("example.com/gpu",)
    assert cfg.pod_defaults.kind is WorkloadKind.BATCH and cfg.pod_defaults.batch_runtime_seconds == 600
    assert list(cfg.policy.classes) == ["silver"]
    assert cfg.policy.classes["silver"].safety_margin_seconds == 10.0
    assert cfg.node_groups.unlabelled == "none" and cfg.node_groups.enforce is False
    assert cfg.bind.attempt_seconds == 2.0 and ExtenderConfig().bind.attempt_seconds == 40.0


def test_files_are_layered_in_order(tmp_path: Path) -> None:
    """An overlay holds only what it changes: mappings merge key by key, a list replaces, a later file wins."""
    base = tmp_path / "base" / "extender.yaml"
    base.parent.mkdir()
    (base.parent / "kubeconfig").write_text("x")
    base.write_text(
        "kubernetes: {kubeconfig: kubeconfig}\nserver: {port: 8443, host: 0.0.0.0}\n"
        "flavours: [{name: a, cpu: '1', memory: 1Gi, price_per_hour: 1}]\n"
    )
    overlay = tmp_path / "controller.yaml"
    overlay.write_text(
        "server: {port: 9443}\ncontroller: {enabled: true}\n"
        "flavours: [{name: b, cpu: '2', memory: 2Gi, price_per_hour: 2}]\n"
    )
    cfg = load_config([base, overlay])
    assert (cfg.server.host, cfg.server.port, cfg.controller.enabled) == ("0.0.0.0", 9443, True)
    assert [f.name for f in cfg.flavours] == ["b"]
    assert cfg.kubernetes.kubeconfig == str(base.parent / "kubeconfig")  # from the first file's folder
    assert load_config([overlay, base]).server.port == 8443
    # sections merge option by option; a label map or the class table replaces (an overlay can remove entries); a
    # bare section header in an overlay changes nothing (it must not drop the base's TLS); a null option sets null
    base_doc = {
        "server": {"host": "0.0.0.0", "port": 8443},
        "node_groups": {"batch": {"match_labels": {"pool": "batch", "zone": "a"}}},
        "classes": {"gold": {"slo": 1.0, "importance": 1}, "silver": {"slo": 0.9, "importance": 2}},
        "scheduling": {"marker_resource": "example.com/marker"},
    }
    over = {
        "server": None,
        "node_groups": {"batch": {"match_labels": {"pool": "spot"}}},
        "classes": {"gold": {"slo": 1.0, "importance": 1}},
        "scheduling": {"marker_resource": None},
        "pod_defaults": {"class": "gold"},
    }
    got = parse_config(deep_merge(base_doc, over))
    assert (got.server.host, got.server.port) == ("0.0.0.0", 8443)
    assert dict(got.node_groups.batch_selector) == {"pool": "spot"}
    assert list(got.classes) == ["gold"] and got.scheduling.marker_resource is None
    # an error names every file it came from
    overlay.write_text("controller: {enabled: 'yes'}\n")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(base))} \+ {re.escape(str(overlay))}: controller"):
        load_config([base, overlay])


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing.yaml: cannot read"):
        load_config(tmp_path / "missing.yaml")
    p = tmp_path / "broken.yaml"
    p.write_text("server: {port: [}\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)
    p.write_text("- 1\n")
    with pytest.raises(ConfigError, match="must be a mapping, got list"):
        load_config(p)
    p.write_text("server: {port: -1}\n")
    with pytest.raises(ConfigError, match=rf"{re.escape(str(p))}: server.port"):
        load_config(p)
