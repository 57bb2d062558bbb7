"""The one base every settings model derives from, and the loader that reports every error of a file at once.

Strict on purpose: a YAML ``"false"`` is a string, and a string that silently became ``True`` once started an
agent without mTLS (issue 28). Values are validated in JSON mode (YAML is parsed, then handed over as JSON), so
a list is accepted where a tuple is declared and an integer where a float is, and nothing else is converted:
no string becomes a boolean or a number, no number becomes a string. Unknown keys are errors (a typo must not
fall back to a default), and settings are frozen once loaded (processes share them).

Descriptions are the attributes' docstrings (``use_attribute_docstrings``): written once, next to the field, and
carried into the generated reference YAML and JSON Schema.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["Settings", "SettingsError", "json_schema", "load_settings", "reference_yaml"]

M = TypeVar("M", bound="Settings")


class Settings(BaseModel):
    """Base of every settings model: strict types, unknown keys refused, frozen."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        frozen=True,
        validate_default=True,
        use_attribute_docstrings=True,
        arbitrary_types_allowed=False,
    )


class SettingsError(ValueError):
    """Settings that cannot start a process. ``problems`` holds every (option path, message) found, and the
    message names them all, one per line, so a file is fixed in one pass instead of one error per restart."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = [f"{path}: {msg}" if path else msg for path, msg in problems]
        head = f"{source}: " if source else ""
        if len(lines) == 1:
            super().__init__(head + lines[0])
        else:
            super().__init__(head + f"{len(lines)} problems\n  " + "\n  ".join(lines))


def _path(prefix: str, loc: tuple[int | str, ...]) -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out = f"{out}.{part}" if out else str(part)
    return out


def problems_of(exc: ValidationError, prefix: str = "") -> list[tuple[str, str]]:
    """(option path, message) for each error pydantic found, with the offending value quoted."""
    out: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown option"
        elif err["type"] not in ("missing",) and "input" in err and not isinstance(err["input"], dict | list):
            msg = f"{msg} (got {err['input']!r})"
        out.append((_path(prefix, loc), msg))
    return out


def load_settings(model: type[M], raw: object, source: str = "", prefix: str = "") -> M:
    """Validate ``raw`` (parsed YAML: mappings, lists, scalars; None for an empty file) into ``model``; every
    error of it raised at once as a ``SettingsError`` naming each option by its path (``prefix`` first)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise SettingsError(source, [(prefix, f"must be a mapping, got {type(raw).__name__}")])
    try:
        text = orjson.dumps(raw)
    except TypeError as exc:  # a YAML timestamp or a non-string key: not a value any option takes
        raise SettingsError(source, [(prefix, f"not plain data: {exc}")]) from exc
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        raise SettingsError(source, problems_of(exc, prefix)) from None


def json_schema(model: type[Settings]) -> str:
    """The JSON Schema of ``model`` (what an editor or a CI check validates a file against), stable text."""
    return json.dumps(model.model_json_schema(mode="validation"), indent=2, sort_keys=True) + "\n"


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value) if (not value or value != value.strip() or ":" in value or "#" in value) else value
    return json.dumps(value)


def reference_yaml(model: type[Settings], top: str | None = None, width: int = 116) -> str:
    """Every option of ``model`` with its default and its description as a comment: the reference file users copy
    from, generated so it cannot drift from the code."""
    lines: list[str] = []
    doc = (model.__doc__ or "").strip()
    if doc:
        lines += ["# " + line if line else "#" for line in textwrap.fill(" ".join(doc.split()), width - 2).splitlines()]
    indent = ""
    if top:
        lines.append(f"{top}:")
        indent = "  "
    _emit(model, model.model_construct().model_dump(mode="json"), indent, lines, width)
    return "\n".join(lines) + "\n"


def _emit(model: type[Settings], values: Mapping[str, Any], indent: str, lines: list[str], width: int) -> None:
    for name, field in model.model_fields.items():
        sub = _settings_type(field.annotation)
        desc = " ".join((field.description or (sub.__doc__ if sub is not None else "") or "").split())
        if desc:
            for line in textwrap.wrap(desc, width - len(indent) - 2):
                lines.append(f"{indent}# {line}")
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if "default_doc" in extra:  # a default computed where the process runs (a host name): shown, not set
            lines.append(f"{indent}# {name}: {extra['default_doc']}")
            continue
        value = values.get(name)
        if sub is not None and isinstance(value, dict):
            lines.append(f"{indent}{name}:")
            _emit(sub, value, indent + "  ", lines, width)
        elif isinstance(value, list | tuple):
            if not value:
                lines.append(f"{indent}{name}: []")
            else:
                lines.append(f"{indent}{name}:")
                lines += [f"{indent}  - {_yaml_scalar(v)}" for v in value]
        elif isinstance(value, dict):
            if not value:
                lines.append(f"{indent}{name}: {{}}")
            else:
                lines.append(f"{indent}{name}:")
                lines += [f"{indent}  {k}: {_yaml_scalar(v)}" for k, v in value.items()]
        else:
            lines.append(f"{indent}{name}: {_yaml_scalar(value)}")


def _settings_type(annotation: Any) -> type[Settings] | None:
    if isinstance(annotation, type) and issubclass(annotation, Settings):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        if isinstance(arg, type) and issubclass(arg, Settings):
            return arg
    return None
