"""Build hook: the gRPC stubs of our cluster-autoscaler protos are generated when the package is built (a wheel,
the image, `pip install -e`), never at run time. grpcio-tools and mypy-protobuf are build requirements only
(pyproject.toml [build-system]); the wheel carries the stubs with their .pyi, so mypy checks every use of them.

protoc runs with the project folder as its include root, so the stubs import each other as package modules
(`from extender.autoscaler.protos import k8s_core_v1_minimal_pb2`). An editable install writes them into the
source folder (ignored by git), a regular build into the build folder.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PROTOS = (
    "extender/autoscaler/protos/k8s_core_v1_minimal.proto",
    "extender/autoscaler/protos/expander.proto",
    "extender/autoscaler/protos/externalgrpc.proto",
)
GRPC_SERVICES = ("extender/autoscaler/protos/expander.proto", "extender/autoscaler/protos/externalgrpc.proto")


def _plugin(name: str) -> str:
    """A protoc plugin installed beside this interpreter (the build environment's scripts)."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError(f"{name} not found: mypy-protobuf must be a build requirement")
    return found


def generate(out: Path) -> list[str]:
    """Run protoc over PROTOS into ``out`` (the tree root); the generated files, relative to it."""
    from grpc_tools import protoc

    root = Path(__file__).resolve().parent
    include = Path(protoc.__file__).resolve().parent / "_proto"  # google/protobuf/*.proto
    out.mkdir(parents=True, exist_ok=True)
    common = ["protoc", f"-I{root}", f"-I{include}"]
    messages = [
        *common,
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--python_out={out}",
        f"--mypy_out={out}",
        *(str(root / p) for p in PROTOS),
    ]
    services = [
        *common,
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--grpc_python_out={out}",
        f"--mypy_grpc_out={out}",
        *(str(root / p) for p in GRPC_SERVICES),
    ]
    for args in (messages, services):
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
    made = []
    for proto in PROTOS:
        stem = proto.removesuffix(".proto")
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi"):
            if (out / f"{stem}{suffix}").is_file():
                made.append(f"{stem}{suffix}")
    return made


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        super().run()
        target = Path.cwd() if self.editable_mode else Path(self.build_lib)
        self._stubs = generate(target)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if not self.editable_mode:
            outputs += [os.path.join(self.build_lib, f) for f in getattr(self, "_stubs", [])]
        return outputs


setup(cmdclass={"build_py": BuildPyWithStubs})
