"""hack/kind's pieces that run before or beside any cluster: the OCI runtime wrapper kind-up installs where
`docker run --privileged` fails (root without some capabilities), and kind-up's refusal of bad node specs.

The cluster itself (kind built offline, the product on it) is phase 3 of hack/run-live-tests.sh."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _wrapper() -> ModuleType:
    spec = importlib.util.spec_from_file_location("runc_caps", ROOT / "hack/kind/runc-caps.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ALL = ["CAP_CHOWN", "CAP_SYS_ADMIN", "CAP_SYS_RESOURCE", "CAP_NET_ADMIN"]


def _run(mod: ModuleType, monkeypatch: pytest.MonkeyPatch, argv: list[str], allowed: set[str]) -> list[Any]:
    calls: list[Any] = []
    monkeypatch.setattr(mod, "bounding", lambda: allowed)
    monkeypatch.setattr(mod.os, "execv", lambda path, args: calls.append((path, args)))
    mod.main(["qos-runc", *argv])
    return calls


def test_wrapper_drops_from_a_bundle_the_capabilities_the_host_lacks_and_runs_runc_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = _wrapper()
    caps = {k: list(ALL) for k in ("bounding", "effective", "permitted", "inheritable")}
    (tmp_path / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "process": {"capabilities": caps}}))
    argv = ["--root", "/run/x", "create", "--bundle", str(tmp_path), "--pid-file", "p", "cid"]
    calls = _run(mod, monkeypatch, argv, allowed={"CAP_CHOWN", "CAP_SYS_ADMIN", "CAP_NET_ADMIN"})
    doc = json.loads((tmp_path / "config.json").read_text())
    for key in caps:
        assert doc["process"]["capabilities"][key] == ["CAP_CHOWN", "CAP_SYS_ADMIN", "CAP_NET_ADMIN"], key
    assert doc["ociVersion"] == "1.0.2"
    assert calls == [(mod.RUNC, [mod.RUNC, *argv])]  # the same arguments, to the real runc


def test_wrapper_fixes_an_exec_process_file_and_leaves_unknown_capabilities(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = _wrapper()
    process = tmp_path / "process.json"
    process.write_text(json.dumps({"args": ["sh"], "capabilities": {"bounding": [*ALL, "CAP_FROM_THE_FUTURE"]}}))
    calls = _run(mod, monkeypatch, ["exec", f"--process={process}", "cid"], allowed={"CAP_CHOWN"})
    # a capability this wrapper does not know is not its to judge: runc reports it
    assert json.loads(process.read_text())["capabilities"]["bounding"] == ["CAP_CHOWN", "CAP_FROM_THE_FUTURE"]
    assert len(calls) == 1


def test_wrapper_leaves_a_spec_alone_when_the_host_has_every_capability(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = _wrapper()
    text = json.dumps({"process": {"capabilities": {"bounding": ALL}}}, indent=3)
    (tmp_path / "config.json").write_text(text)
    _run(mod, monkeypatch, ["run", "-b", str(tmp_path), "cid"], allowed=set(ALL))
    assert (tmp_path / "config.json").read_text() == text  # not even rewritten


def test_wrapper_reads_this_hosts_bounding_set() -> None:
    names = _wrapper().bounding()
    assert "CAP_CHOWN" in names and all(n.startswith("CAP_") for n in names)
    status = Path("/proc/self/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapBnd:")), 16)
    assert ("CAP_SYS_RESOURCE" in names) == bool(mask >> 24 & 1)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("service", "bad node spec service"),
        ("service:m1.medium=x", "bad node spec"),
        ("service:m9.huge=1", "unknown flavour m9.huge"),
        ("kwok:batch:nope=2", "unknown flavour nope"),
    ],
)
def test_kind_up_refuses_bad_node_specs_before_touching_docker(spec: str, message: str, tmp_path: Path) -> None:
    out = subprocess.run(
        [str(ROOT / "hack/kind-up.sh"), "service:m1.medium=1", spec],
        env={
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "QOS_KIND_STATE": str(tmp_path / "s"),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode != 0 and message in out.stderr, out.stderr
    assert not (tmp_path / "s").exists()  # nothing made
