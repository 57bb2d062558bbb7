"""Python stubs for the vendored cluster-autoscaler expander.proto, generated with grpcio-tools on first use.

Nothing generated is committed or hand-written: the stubs are built from ``protos/`` (see protos/ORIGIN.md)
into a cache directory keyed by the hash of the .proto files and the grpcio-tools version, then imported.
A second call (or another process) reuses the directory. ``python -m extender.autoscaler.protogen`` builds
them ahead of time (e.g. in an image build) and prints the directory.

The Kubernetes protos live under ``k8s.io/...``; protoc's Python generator turns that path into the module
``k8s.io.api.core.v1.generated_pb2``, i.e. packages ``k8s`` and ``io``. grpcio-tools 1.85 writes the files
to ``k8s/io/...`` accordingly; should an older protoc keep a ``k8s.io`` folder, it is moved to ``k8s/io``.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PROTO_DIR", "ExpanderStubs", "generate", "load_expander"]

PROTO_DIR = Path(__file__).resolve().parent / "protos"
_ROOT_PROTOS = ("expander.proto",)


@dataclass(frozen=True, slots=True)
class ExpanderStubs:
    """The generated modules: messages (``pb2``), service glue (``grpc``) and core/v1 (``core``)."""

    pb2: Any
    grpc: Any
    core: Any
    directory: Path


def _proto_files() -> list[Path]:
    return sorted(p for p in PROTO_DIR.rglob("*.proto"))


def _fingerprint() -> str:
    from importlib.metadata import version

    h = hashlib.sha256(version("grpcio-tools").encode())
    for path in _proto_files():
        h.update(str(path.relative_to(PROTO_DIR)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _cache_root() -> Path:
    env = os.environ.get("QOS_PROTO_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("QOS_CACHE") or str(Path.home() / ".cache" / "kube-qos-extender")
    return Path(base) / "protos"


def generate(target: Path | None = None) -> Path:
    """Run protoc (grpcio-tools) over the vendored protos; returns the directory holding the stubs.

    Written to a temporary sibling and renamed into place, so concurrent first uses never see half a tree.
    """
    from grpc_tools import protoc

    out = target if target is not None else _cache_root() / _fingerprint()
    if (out / "expander_pb2_grpc.py").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".gen-", dir=out.parent))
    try:
        include = str(Path(protoc.__file__).resolve().parent / "_proto")  # google/protobuf/*.proto
        deps = [str(p.relative_to(PROTO_DIR)) for p in _proto_files() if p.name not in _ROOT_PROTOS]
        args = ["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={tmp}", *deps]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed for {deps}")
        args = ["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={tmp}", f"--grpc_python_out={tmp}"]
        if protoc.main([*args, *_ROOT_PROTOS]) != 0:
            raise RuntimeError(f"protoc failed for {_ROOT_PROTOS}")
        if (tmp / "k8s.io").is_dir():  # older protoc: the dotted folder is kept as-is
            (tmp / "k8s").mkdir(exist_ok=True)
            shutil.move(str(tmp / "k8s.io"), str(tmp / "k8s" / "io"))
        try:
            tmp.rename(out)
        except OSError:  # another process won the race: use its tree
            if not (out / "expander_pb2_grpc.py").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


_loaded: ExpanderStubs | None = None


def load_expander() -> ExpanderStubs:
    """Generate (once) and import the expander stubs."""
    global _loaded
    if _loaded is not None:
        return _loaded
    directory = generate()
    if str(directory) not in sys.path:
        sys.path.append(str(directory))
    pb2 = importlib.import_module("expander_pb2")
    grpc_mod = importlib.import_module("expander_pb2_grpc")
    core = importlib.import_module("k8s.io.api.core.v1.generated_pb2")
    _loaded = ExpanderStubs(pb2, grpc_mod, core, directory)
    return _loaded


if __name__ == "__main__":
    print(generate())
