"""The typed settings base (issue 28): no string ever becomes a boolean or a number, every error of a file is
named at once, the generated reference and schema are the ones in the repo, and deployed files hold only what
differs from the defaults."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import Field

from extender.agent.settings import AgentConfig, IssuerConfig, load_agent_config
from extender.autoscaler.settings import AutoscalerSettings
from extender.consolidation.settings import ConsolidationSettings
from extender.processes.settings_reference import generated
from extender.settings import Settings, SettingsError, load_settings
from extender.settings.extender import ExtenderConfig, load_config

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "settings"


class _Inner(Settings):
    """An inner section."""

    ratio: float = Field(0.5, ge=0, le=1)
    """A bounded number."""
    names: tuple[str, ...] = ("a",)


class _Probe(Settings):
    flag: bool = False
    count: int = Field(1, ge=1)
    name: str = "x"
    inner: _Inner = _Inner()


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({"flag": "false"}, "flag"),
        ({"flag": "true"}, "flag"),
        ({"flag": 0}, "flag"),
        ({"flag": "yes"}, "flag"),
        ({"count": "3"}, "count"),
        ({"count": 2.5}, "count"),
        ({"count": True}, "count"),
        ({"name": 5}, "name"),
        ({"inner": {"ratio": "0.1"}}, "inner.ratio"),
        ({"inner": {"names": "a"}}, "inner.names"),
        ({"inner": {"names": [1]}}, "inner.names[0]"),
        ({"inner": []}, "inner"),
        ({"typo": 1}, "typo"),
        ({"count": 0}, "count"),
        ({"inner": {"ratio": 2}}, "inner.ratio"),
    ],
)
def test_no_value_is_coerced_and_the_error_names_the_option(raw: dict[str, Any], path: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(_Probe, raw, "probe.yaml")
    assert [p for p, _ in err.value.problems] == [path]
    assert str(err.value).startswith(f"probe.yaml: {path}: ")


def test_every_error_of_a_file_is_named_at_once() -> None:
    raw = {"flag": "false", "count": "2", "inner": {"ratio": 7, "extra": 1}, "other": None}
    with pytest.raises(SettingsError) as err:
        load_settings(_Probe, raw, "f.yaml")
    assert sorted(p for p, _ in err.value.problems) == ["count", "flag", "inner.extra", "inner.ratio", "other"]
    assert "5 problems" in str(err.value)


def test_lists_become_tuples_and_integers_floats_nothing_else() -> None:
    got = load_settings(_Probe, {"inner": {"ratio": 1, "names": ["p", "q"]}, "count": 3})
    assert got.inner.names == ("p", "q") and got.inner.ratio == 1.0 and isinstance(got.inner.ratio, float)
    assert load_settings(_Probe, None) == _Probe()  # an empty file: the defaults
    with pytest.raises(SettingsError, match="must be a mapping"):
        load_settings(_Probe, ["not", "a", "mapping"])
    with pytest.raises(SettingsError, match="not plain data"):
        load_settings(_Probe, {"name": object()})


@given(st.one_of(st.text(), st.integers(), st.floats(allow_nan=False), st.lists(st.integers(), max_size=2)))
def test_a_boolean_option_takes_only_a_boolean(value: object) -> None:
    with pytest.raises(SettingsError):
        load_settings(_Probe, {"flag": value})


def test_settings_are_frozen() -> None:
    s = _Probe()
    with pytest.raises(ValueError):
        s.flag = True  # type: ignore[misc]


def _scalar_options(model: type[Settings], prefix: str = "") -> list[tuple[str, type]]:
    """(path, type) of every boolean, integer and number option of ``model``, its sections included."""
    out: list[tuple[str, type]] = []
    for attr, field in model.model_fields.items():
        if field.exclude:
            continue
        name = field.alias or attr
        path = f"{prefix}.{name}" if prefix else name
        ann = field.annotation
        args = [a for a in getattr(ann, "__args__", (ann,)) if a is not type(None)]
        if len(args) == 1 and isinstance(args[0], type) and issubclass(args[0], Settings):
            out += _scalar_options(args[0], path)
        elif len(args) == 1 and args[0] in (bool, int, float):
            out.append((path, args[0]))
    return out


def _nest(path: str, value: object) -> dict[str, Any]:
    doc: Any = value
    for part in reversed(path.split(".")):
        doc = {part: doc}
    return doc


MODELS: list[tuple[str, type[Settings], dict[str, Any]]] = [
    ("extender", ExtenderConfig, {}),
    ("agent", AgentConfig, {"node_name": "n", "allow_plaintext": True}),
    ("autoscaler", AutoscalerSettings, {}),
    ("consolidation", ConsolidationSettings, {}),
    ("agent-issuer", IssuerConfig, {}),
]
SCALARS = [(name, model, base, path, kind) for name, model, base in MODELS for path, kind in _scalar_options(model)]


def test_the_walk_finds_the_options_the_issue_named() -> None:
    found = {(name, path) for name, _, _, path, _ in SCALARS}
    assert {("agent", "allow_plaintext"), ("agent", "test_fault_injection"), ("extender", "server.port")} <= found
    assert {("extender", "controller.leader_election.enabled"), ("extender", "slack.characterise.k")} <= found
    assert len(SCALARS) > 100


@pytest.mark.parametrize(("name", "model", "base", "path", "kind"), SCALARS, ids=[f"{s[0]}:{s[3]}" for s in SCALARS])
def test_a_string_for_a_boolean_or_a_number_is_refused_in_every_file(
    name: str, model: type[Settings], base: dict[str, Any], path: str, kind: type
) -> None:
    """Done-when of issue 28, over every option of every process: the string spelling of a valid value ("false",
    "8888") is refused at load, naming the option, and never read as its value."""
    value = "false" if kind is bool else "1"
    raw = {**base, **_nest(path, value)}
    with pytest.raises(SettingsError) as err:
        load_settings(model, raw, f"{name}.yaml")
    assert path in [p for p, _ in err.value.problems], str(err.value)


# ---------------------------------------------------------------------------------------- generated files


def test_the_generated_reference_and_schema_are_the_ones_in_the_repo() -> None:
    files = generated()
    assert files, "nothing generated"
    for name, text in files.items():
        on_disk = DOCS / name
        assert on_disk.is_file(), f"{on_disk} missing: run `python -m extender.processes.settings_reference`"
        assert on_disk.read_text() == text, f"{on_disk} is stale: run `python -m extender.processes.settings_reference`"
    left = sorted(p.name for p in DOCS.iterdir() if p.name != "README.md")
    assert left == sorted(files)  # nothing left over from a removed model


def test_the_agent_reference_loads_back_to_the_defaults() -> None:
    """The generated reference is a file users may copy: it must mean exactly the defaults."""
    got = load_agent_config(str(DOCS / "agent.yaml"), node_name="n", allow_plaintext=True)
    assert got == AgentConfig(node_name="n", allow_plaintext=True)
    schema = json.loads((DOCS / "agent.schema.json").read_text())
    assert schema["additionalProperties"] is False and "allow_plaintext" in schema["properties"]
    assert schema["properties"]["allow_plaintext"]["type"] == "boolean"


def test_every_generated_reference_means_the_defaults() -> None:
    consolidation = yaml.safe_load((DOCS / "consolidation.yaml").read_text())
    assert load_settings(ConsolidationSettings, consolidation["consolidation"]) == ConsolidationSettings()
    assert load_config(DOCS / "extender.yaml") == ExtenderConfig()
    assert "# Classes per resource" in (DOCS / "extender.yaml").read_text()  # the descriptions are carried


def _leaves(doc: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(doc, dict):
        out: dict[str, Any] = {}
        for k, v in doc.items():
            out |= _leaves(v, f"{prefix}.{k}" if prefix else k)
        return out
    return {prefix: doc}


DEPLOYED: list[tuple[str, str | None, Any]] = [
    ("config/base/extender.yaml", None, ExtenderConfig()),
    ("config/base/controller.yaml", None, ExtenderConfig()),
    ("config/controller/controller.yaml", None, ExtenderConfig()),
    ("config/autoscaler/extender.yaml", None, ExtenderConfig()),
    ("config/agent/agent.yaml", "agent", AgentConfig(node_name="n", allow_plaintext=True)),
    ("config/autoscaler/consolidation/consolidation.yaml", "consolidation", ConsolidationSettings()),
    ("config/autoscaler/autoscaler.yaml", "autoscaler", AutoscalerSettings()),
    ("config/autoscaler/kwok/autoscaler.yaml", "autoscaler", AutoscalerSettings()),
    ("config/cluster-autoscaler/cloud-provider/autoscaler.yaml", "autoscaler", AutoscalerSettings()),
]


@pytest.mark.parametrize(("path", "top", "defaults"), DEPLOYED, ids=[d[0] for d in DEPLOYED])
def test_a_deployed_config_holds_only_what_differs_from_the_defaults(path: str, top: str | None, defaults: Any) -> None:
    """No whole copies of the defaults in the manifests (they drifted from the code before): each key a deployed
    file sets is one whose value differs, and every key is an option (the loader refuses unknown ones)."""
    raw = yaml.safe_load((ROOT / path).read_text())
    if top is not None:
        assert list(raw) == [top]
        raw = raw[top]
    values = defaults.model_dump(mode="json", by_alias=True)
    for leaf, value in _leaves(raw).items():
        default: Any = values
        for part in leaf.split("."):
            if default is None:  # inside a section that is off by default (cloud_provider: null): all of it differs
                break
            assert isinstance(default, dict) and part in default, f"{path}: {leaf} is no option"
            default = default[part]
        else:
            assert value != default, f"{path} sets {leaf} to its default ({value!r}): drop it"


def test_the_deployed_agent_config_is_valid() -> None:
    load_agent_config(str(ROOT / "config" / "agent" / "agent.yaml"), node_name="n")
