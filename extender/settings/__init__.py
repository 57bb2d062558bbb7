"""Typed settings: every option of every process declared once (type, default, bounds, description) on one strict
base, so a wrong type is refused by name, every error of a file is reported at once, and the reference YAML and
JSON Schema are generated from the same declarations (issue 28)."""

from extender.settings.base import (
    ExistingFile,
    RelativePath,
    Settings,
    SettingsError,
    json_schema,
    layer,
    load_settings,
    load_yaml_file,
    read_yaml,
    reference_yaml,
    resolve_files,
)

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
