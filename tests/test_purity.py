"""The core must stay pure: no I/O frameworks, no asyncio, no clock reads (docs/DESIGN.md)."""

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[1] / "extender" / "core"
FORBIDDEN_MODULES = {
    "aiohttp",
    "kubernetes_asyncio",
    "asyncio",
    "prometheus_client",
    "socket",
    "subprocess",
    "time",
}
FORBIDDEN_PREFIXES = (
    "extender.kube",
    "extender.webhook",
    "extender.controller",
    "extender.autoscaler",
    "extender.agent",
    "extender.sim",
    "extender.cli",
)
FORBIDDEN_CALLS = {"open", "print", "input"}


def _core_files() -> list[Path]:
    files = sorted(CORE.glob("*.py"))
    assert len(files) >= 2, "core modules not found"
    return files


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: p.name)
def test_core_module_imports_nothing_impure(path: Path) -> None:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            assert name.split(".")[0] not in FORBIDDEN_MODULES, f"{path.name} imports {name}"
            assert not name.startswith(FORBIDDEN_PREFIXES), f"{path.name} imports shell {name}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in FORBIDDEN_CALLS, f"{path.name} calls {node.func.id}()"
        if isinstance(node, ast.Attribute) and node.attr in {
            "now",
            "utcnow",
            "time",
            "monotonic",
            "perf_counter",
        }:
            base = node.value
            if isinstance(base, ast.Name):
                assert base.id not in {"datetime", "time"}, f"{path.name} reads the clock ({base.id}.{node.attr})"


def test_detector_catches_a_violation(tmp_path: Path) -> None:
    """The checker above must be able to fail: feed it a module that imports asyncio."""
    bad = tmp_path / "bad.py"
    bad.write_text("import asyncio\n")
    with pytest.raises(AssertionError, match="imports asyncio"):
        test_core_module_imports_nothing_impure(bad)
