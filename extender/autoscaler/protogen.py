"""Python stubs for our cluster-autoscaler protos, generated with grpcio-tools on first use.

Nothing generated is committed or hand-written: the stubs are built from ``protos/`` (our own ``expander.proto``,
``externalgrpc.proto`` and ``k8s_core_v1_minimal.proto``, see protos/ORIGIN.md) into a cache directory keyed by
the hash of the .proto
files and the grpcio-tools version, then imported. A second call (or another process) reuses the directory.
``python -m extender.autoscaler.protogen`` builds them ahead of time (e.g. in an image build) and prints the
directory. Only the .proto files are needed at run time, so an installed wheel (package data ``protos/*.proto``)
generates its stubs the same way.
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

__all__ = ["PROTO_DIR", "ExpanderStubs", "ExternalGrpcStubs", "generate", "load_expander", "load_externalgrpc"]

PROTO_DIR = Path(__file__).resolve().parent / "protos"
_PROTOS = ("k8s_core_v1_minimal.proto", "expander.proto", "externalgrpc.proto")
_MARKER = "externalgrpc_pb2_grpc.py"  # the tree is renamed into place whole: present = complete


@dataclass(frozen=True, slots=True)
class ExpanderStubs:
    """The generated modules: messages (``pb2``), service glue (``grpc``) and our minimal core/v1 (``core``).

    ``decode_error`` is protobuf's ``DecodeError``, raised by ``FromString`` on bytes that are not the message.
    """

    pb2: Any
    grpc: Any
    core: Any
    directory: Path
    decode_error: type[Exception]


def _proto_files() -> list[Path]:
    missing = [name for name in _PROTOS if not (PROTO_DIR / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{PROTO_DIR} lacks {missing}: the package was installed without its .proto files")
    return [PROTO_DIR / name for name in _PROTOS]


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
    """Run protoc (grpcio-tools) over our protos; returns the directory holding the stubs.

    Written to a temporary sibling and renamed into place, so concurrent first uses never see half a tree.
    """
    from grpc_tools import protoc

    out = target if target is not None else _cache_root() / _fingerprint()
    if (out / _MARKER).is_file():
        return out
    _proto_files()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".gen-", dir=out.parent))
    try:
        include = str(Path(protoc.__file__).resolve().parent / "_proto")  # google/protobuf/*.proto
        args = ["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={tmp}", f"--grpc_python_out={tmp}"]
        if protoc.main([*args, *_PROTOS]) != 0:
            raise RuntimeError(f"protoc failed for {_PROTOS} in {PROTO_DIR}")
        try:
            tmp.rename(out)
        except OSError:  # another process won the race: use its tree
            if not (out / _MARKER).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


@dataclass(frozen=True, slots=True)
class ExternalGrpcStubs:
    """The externalgrpc cloud provider's generated modules, shaped like ``ExpanderStubs``."""

    pb2: Any
    grpc: Any
    core: Any
    directory: Path
    decode_error: type[Exception]


_loaded: ExpanderStubs | None = None
_loaded_egrpc: ExternalGrpcStubs | None = None


def _import(name: str) -> tuple[Any, Any, Any, Path, type[Exception]]:
    directory = generate()
    if str(directory) not in sys.path:
        sys.path.append(str(directory))
    pb2 = importlib.import_module(f"{name}_pb2")
    grpc_mod = importlib.import_module(f"{name}_pb2_grpc")
    core = importlib.import_module("k8s_core_v1_minimal_pb2")
    decode_error = importlib.import_module("google.protobuf.message").DecodeError
    return pb2, grpc_mod, core, directory, decode_error


def load_expander() -> ExpanderStubs:
    """Generate (once) and import the expander stubs."""
    global _loaded
    if _loaded is None:
        _loaded = ExpanderStubs(*_import("expander"))
    return _loaded


def load_externalgrpc() -> ExternalGrpcStubs:
    """Generate (once) and import the externalgrpc cloud provider stubs."""
    global _loaded_egrpc
    if _loaded_egrpc is None:
        _loaded_egrpc = ExternalGrpcStubs(*_import("externalgrpc"))
    return _loaded_egrpc


if __name__ == "__main__":
    print(generate())
