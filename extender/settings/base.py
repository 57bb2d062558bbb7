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
import math
import re
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import orjson
import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, ValidationInfo

__all__ = [
    "ExistingFile",
    "RelativePath",
    "Settings",
    "SettingsError",
    "json_schema",
    "layer",
    "load_settings",
    "load_yaml_file",
    "read_yaml",
    "reference_yaml",
    "resolve_files",
]

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

    def __init__(self, source: str, problems: list[tuple[str, str]] | None = None) -> None:
        if problems is None:  # one message, already naming its option (the older loaders' form)
            source, problems = "", [("", source)]
        self.source = source
        self.problems = problems
        lines = [f"{path}: {msg}" if path else msg for path, msg in problems]
        head = f"{source}: " if source else ""
        if len(lines) == 1:
            super().__init__(head + lines[0])
        else:
            super().__init__(head + f"{len(lines)} problems\n  " + "\n  ".join(lines))


def _existing_file(value: str, info: ValidationInfo) -> str:
    """A path to a file that must exist at start; relative paths are taken from the settings file's folder
    (validation context ``base``), so a file and the certificates beside it move together."""
    path = Path(value)
    base = (info.context or {}).get("base")
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    if not path.is_file():
        raise ValueError(f"file {str(path)!r} does not exist")
    return str(path)


ExistingFile = Annotated[str, AfterValidator(_existing_file)]


def _relative_path(value: str, info: ValidationInfo) -> str:
    """A path that need not exist yet (a file the process writes); relative: from the settings file's folder."""
    if not value:
        raise ValueError("must be a non-empty path")
    base = (info.context or {}).get("base")
    if base is not None and not Path(value).is_absolute():
        return str(Path(base) / value)
    return value


RelativePath = Annotated[str, AfterValidator(_relative_path)]
_PATH_VALIDATORS = (_existing_file, _relative_path)


def _file_options(model: type[BaseModel]) -> dict[str, Any]:
    """{option: True} for each option of ``model`` that holds a path, {section: {...}} for sections holding some."""
    out: dict[str, Any] = {}
    for attr, field in model.model_fields.items():
        name = field.alias or attr
        if any(getattr(m, "func", None) in _PATH_VALIDATORS for m in field.metadata) or any(
            getattr(m, "func", None) in _PATH_VALIDATORS
            for arg in getattr(field.annotation, "__args__", ())
            for m in getattr(arg, "__metadata__", ())
        ):
            out[name] = True
            continue
        sub = _settings_type(field.annotation)
        if sub is not None:
            inner = _file_options(sub)
            if inner:
                out[name] = inner
    return out


def resolve_files(model: type[BaseModel], raw: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """``raw`` with each relative path option made absolute from ``base`` (the folder of the file it came from):
    when several files are layered, each path stays relative to the file that set it."""

    def walk(doc: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(doc)
        for key, spec in options.items():
            value = out.get(key)
            if spec is True and isinstance(value, str) and value and not Path(value).is_absolute():
                out[key] = str(base / value)
            elif isinstance(spec, Mapping) and isinstance(value, Mapping):
                out[key] = walk(value, spec)
        return out

    return walk(raw, _file_options(model))


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
        path = _path(prefix, loc)
        if err["type"] == "value_error":  # a validator of ours: its own words, "option: why" naming the option
            msg = str((err.get("ctx") or {}).get("error") or msg)
            head, sep, rest = msg.partition(": ")
            if sep and _OPTION.match(head):
                path, msg = (f"{path}.{head}" if path else head), rest
            out.append((path, msg))
            continue
        if err["type"] == "extra_forbidden":
            msg = "unknown option"
        elif err["type"] not in ("missing",) and "input" in err and not isinstance(err["input"], dict | list):
            msg = f"{msg} (got {err['input']!r})"
        out.append((path, msg))
    return out


_OPTION = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*$")


def _section(annotation: Any) -> type[BaseModel] | None:
    """The model of a field that is a section (``M``, never ``M | None``)."""
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _collection(annotation: Any) -> bool:
    """A field holding a mapping or a list (``dict[...]``, ``tuple[...]``), not nullable itself."""
    return getattr(annotation, "__origin__", None) in (dict, tuple, list)


def _prepare(
    model: type[BaseModel], raw: Mapping[str, Any], path: str, problems: list[tuple[str, str]]
) -> dict[str, Any]:
    """The document as the model reads it. A bare header (``tls:`` or ``flavours:`` with everything under it
    commented out) is YAML null: for a section or a list or map option it means the defaults, as an absent key
    does; a null where a single value belongs is still an error. An option spelled by its Python name where the
    file's name differs (``class_name`` for ``class``) is an unknown option, as the reference names it."""
    out = dict(raw)
    for name, field in model.model_fields.items():
        key = field.alias or name
        if field.alias and name in out and name != field.alias:
            problems.append((f"{path}.{name}" if path else name, f"unknown option (the option is {field.alias!r})"))
        if key not in out:
            continue
        sub = _section(field.annotation)
        if out[key] is None and (sub is not None or _collection(field.annotation)):
            del out[key]
        elif sub is not None and isinstance(out[key], Mapping):
            out[key] = _prepare(sub, out[key], f"{path}.{key}" if path else key, problems)
    return out


def layer(model: type[BaseModel], base: Mapping[str, Any], overlay: Mapping[str, Any]) -> dict[str, Any]:
    """``overlay`` on ``base``, as the model reads them: a section merges option by option (recursively), any
    option's value replaces -- a list, a label map or a class table included, so an overlay can remove entries.
    A bare section header in the overlay (null) changes nothing; a null option value sets null. Neither argument
    is changed."""
    out = dict(base)
    fields = {(f.alias or n): f for n, f in model.model_fields.items()}
    for key, value in overlay.items():
        field = fields.get(key)
        sub = _section(field.annotation) if field is not None else None
        if sub is not None and value is None:
            continue
        if sub is not None and isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = layer(sub, out[key], value)
        else:
            out[key] = value
    return out


def _finite(value: Any) -> Any:
    """NaN and infinities as the text YAML spells them: JSON has no such numbers (orjson would write null), and
    no option takes one, so the error then quotes what the user wrote."""
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def load_settings(model: type[M], raw: object, source: str = "", prefix: str = "", base: Path | None = None) -> M:
    """Validate ``raw`` (parsed YAML: mappings, lists, scalars; None for an empty file) into ``model``; every
    error of it raised at once as a ``SettingsError`` naming each option by its path (``prefix`` first).
    ``base``: the folder relative ``ExistingFile`` paths are read from."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise SettingsError(source, [(prefix, f"must be a mapping, got {type(raw).__name__}")])
    found: list[tuple[str, str]] = []
    prepared = _prepare(model, raw, prefix, found)
    try:
        text = orjson.dumps(_finite(prepared))
    except TypeError as exc:  # a YAML timestamp or a non-string key: not a value any option takes
        raise SettingsError(source, [(prefix, f"not plain data: {exc}")]) from exc
    try:
        got = model.model_validate_json(text, context={"base": base})
    except ValidationError as exc:
        raise SettingsError(source, found + problems_of(exc, prefix)) from None
    if found:
        raise SettingsError(source, found)
    return got


def read_yaml(path: Path, error: type[SettingsError] = SettingsError) -> Any:
    """One YAML document (None for an empty file); unreadable or not YAML: ``error`` naming the file."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(str(path), [("", f"cannot read: {exc.strerror or exc}")]) from exc
    except yaml.YAMLError as exc:
        raise error(str(path), [("", f"not valid YAML: {exc}")]) from exc


def load_yaml_file(model: type[M], path: str | Path, top: str | None = None) -> M:
    """Read one settings file: YAML, optionally all under one ``top`` key (``consolidation:``); every error
    reported at once, prefixed with the file's name. Relative file options are read from the file's folder."""
    p = Path(path)
    source = str(p)
    raw = read_yaml(p)
    if top is not None:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise SettingsError(source, [("", f"must be a mapping with {top}:, got {type(raw).__name__}")])
        others = sorted(str(k) for k in raw if k != top)
        if others:
            raise SettingsError(source, [(k, f"unknown option (this file holds only {top}:)") for k in others])
        raw = raw.get(top)
    return load_settings(model, raw, source, prefix=top or "", base=p.resolve().parent)


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


def _yaml_flow(value: Any) -> str:
    """One value on one line: a scalar as _yaml_scalar writes it, a mapping or list in YAML flow style."""
    if isinstance(value, dict | list | tuple):
        return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10_000).strip()
    return _yaml_scalar(value)


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
    for attr, field in model.model_fields.items():
        if field.exclude:  # set by a loader, not an option of the file
            continue
        name = field.alias or attr
        sub = _settings_type(field.annotation)
        desc = " ".join((field.description or (sub.__doc__ if sub is not None else "") or "").split())
        if desc:
            for line in textwrap.wrap(desc, width - len(indent) - 2, break_on_hyphens=False):
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
                lines += [f"{indent}  - {_yaml_flow(v)}" for v in value]
        elif isinstance(value, dict):
            if not value:
                lines.append(f"{indent}{name}: {{}}")
            else:
                lines.append(f"{indent}{name}:")
                lines += [f"{indent}  {k}: {_yaml_flow(v)}" for k, v in value.items()]
        else:
            lines.append(f"{indent}{name}: {_yaml_scalar(value)}")


def _settings_type(annotation: Any) -> type[Settings] | None:
    """The settings model of a field that holds one (``M`` or ``M | None``), not of a collection of them."""
    if isinstance(annotation, type) and issubclass(annotation, Settings):
        return annotation
    if _collection(annotation):
        return None
    for arg in getattr(annotation, "__args__", ()):
        if isinstance(arg, type) and issubclass(arg, Settings):
            return arg
    return None
