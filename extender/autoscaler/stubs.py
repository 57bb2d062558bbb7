"""The gRPC stubs of our cluster-autoscaler protos (``protos/``: our own ``expander.proto``, ``externalgrpc.proto``
and ``k8s_core_v1_minimal.proto``, see protos/ORIGIN.md), generated when the package is built (setup.py: protoc
and mypy-protobuf are build requirements, not runtime ones) and typed by their .pyi files. The providers import
the modules directly, so mypy checks every message and field they use; the bundles below serve the tests and
tools that take both the messages and the service glue."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from google.protobuf.message import DecodeError

from extender.autoscaler.protos import (
    expander_pb2,
    expander_pb2_grpc,
    externalgrpc_pb2,
    externalgrpc_pb2_grpc,
    k8s_core_v1_minimal_pb2,
)

__all__ = ["PROTO_DIR", "ExpanderStubs", "ExternalGrpcStubs", "load_expander", "load_externalgrpc"]

PROTO_DIR = Path(__file__).resolve().parent / "protos"


@dataclass(frozen=True, slots=True)
class ExpanderStubs:
    """The generated modules: messages (``pb2``), service glue (``grpc``) and our minimal core/v1 (``core``).

    ``decode_error`` is protobuf's ``DecodeError``, raised by ``FromString`` on bytes that are not the message.
    """

    pb2: ModuleType
    grpc: ModuleType
    core: ModuleType
    directory: Path
    decode_error: type[Exception]


ExternalGrpcStubs = ExpanderStubs


def load_expander() -> ExpanderStubs:
    return ExpanderStubs(expander_pb2, expander_pb2_grpc, k8s_core_v1_minimal_pb2, PROTO_DIR, DecodeError)


def load_externalgrpc() -> ExpanderStubs:
    return ExpanderStubs(externalgrpc_pb2, externalgrpc_pb2_grpc, k8s_core_v1_minimal_pb2, PROTO_DIR, DecodeError)
