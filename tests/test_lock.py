"""requirements.lock: the image installs every dependency, transitive ones included, at one version and with its
hashes (reproducible builds, issue 28). Kept in step with pyproject.toml, and the test venv runs what ships."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _locked() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, its hashes), from the lock's `name==version \\` + `--hash=sha256:...` lines."""
    out: dict[str, tuple[str, list[str]]] = {}
    current: str | None = None
    for line in LOCK.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)==([^ ;\\]+)", line)
        if m:
            current = _norm(m.group(1))
            out[current] = (m.group(2), [])
            continue
        h = re.match(r"^\s+--hash=sha256:([0-9a-f]{64})", line)
        if h and current is not None:
            out[current][1].append(h.group(1))
    return out


def test_every_direct_dependency_is_locked_at_its_pin() -> None:
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    locked = _locked()
    for pin in pins:
        name, _, want = pin.partition("==")
        assert want, f"{pin}: pyproject pins every dependency with =="
        assert _norm(name) in locked, f"{name} is not in requirements.lock: run `make lock`"
        assert locked[_norm(name)][0] == want, f"{name}: pyproject {want}, lock {locked[_norm(name)][0]}: `make lock`"


def test_every_locked_requirement_has_hashes_and_runs_in_this_venv() -> None:
    """pip's hash mode refuses a lock with one unhashed line; and the tests must run the versions the image ships
    (the venv is installed with the lock as constraints)."""
    locked = _locked()
    assert len(locked) >= 30  # the closure, not just the direct pins
    for name, (pinned, hashes) in locked.items():
        assert hashes, f"{name}: no --hash"
        try:
            installed = version(name)
        except PackageNotFoundError:
            continue  # a platform-only dependency absent here
        assert installed == pinned, f"{name}: venv {installed}, lock {pinned}: `make venv` again"
