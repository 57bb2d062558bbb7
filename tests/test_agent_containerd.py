"""The containerd import of a checkpoint image against a real containerd (a private instance started here: own
root, state and socket in a temporary directory, CRI plugins off), as the kubelet backend's destination does it.

Needs root (overlayfs) and the containerd of hack/build-tools.sh ($QOS_CACHE/v1.35.8/bin/containerd, or
$QOS_CONTAINERD): FAILS, never skips, without it, like the CRIU suite without criu.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from extender.agent.backends.base import BackendError, WorkloadRef
from extender.agent.backends.kubelet import KubeletBackend, checkpoint_annotations, checkpoint_image_ref
from extender.agent.containerd import ContainerdError, ContainerdImporter
from extender.agent.settings import KubeletConfig

SOURCE = WorkloadRef(namespace="batch", pod="counter", container="c")


def cached_binary(name: str, env: str, build: str) -> str:
    """A binary the hack/ scripts built into $QOS_CACHE/<kube version>/bin (or the path in ``env``); fails, never
    skips, naming the script that builds it."""
    given = os.environ.get(env)
    cache = Path(os.environ.get("QOS_CACHE", str(Path.home() / ".cache/kube-qos-extender")))
    for c in [given] if given else sorted(cache.glob(f"v*/bin/{name}"), reverse=True):
        if c and os.access(c, os.X_OK):
            return str(c)
    pytest.fail(f"{name} not found: run {build} (or set {env})")


def _containerd_binary() -> str:
    return cached_binary("containerd", "QOS_CONTAINERD", "hack/build-tools.sh")


@pytest.fixture(scope="module")
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.fail("the containerd import test needs root (containerd's overlayfs snapshotter)")
    d = tmp_path_factory.mktemp("containerd")
    sock = d / "c.sock"
    (d / "config.toml").write_text(
        "version = 3\n"
        f'root = "{d}/root"\nstate = "{d}/state"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", '
        '"io.containerd.cri.v1.images", "io.containerd.podsandbox.controller.v1.podsandbox", '
        '"io.containerd.sandbox.controller.v1.shim"]\n'
        f'[grpc]\n  address = "{sock}"\n[ttrpc]\n  address = "{sock}.ttrpc"\n[metrics]\n  address = ""\n'
    )
    log = (d / "containerd.log").open("wb")
    proc = subprocess.Popen([_containerd_binary(), "--config", str(d / "config.toml")], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"containerd did not start:\n{(d / 'containerd.log').read_text()[-3000:]}")
            time.sleep(0.05)
        yield str(sock)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def _archive(path: Path, pages: bytes) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in (("config.dump", b'{"id": "x"}'), ("checkpoint/pages-1.img", pages)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


async def test_restore_imports_and_unpacks_the_checkpoint_image(containerd: str, tmp_path: Path) -> None:
    image_dir = tmp_path / "final"
    image_dir.mkdir()
    pages = os.urandom(5 * 2**20 + 123)  # several windows of the stream, not a multiple of 512
    _archive(image_dir / "checkpoint.tar", pages)
    backend = KubeletBackend("127.0.0.1", KubeletConfig(containerd_socket=containerd))
    meta = {"kubelet_archive": "checkpoint-counter_batch-c-2026-11-22T20:00:00Z.tar", **SOURCE.to_json()}
    await backend.prepare(meta)
    target = WorkloadRef(namespace="batch", pod="counter-mv-abc123", container="c")
    restored = await backend.restore(image_dir, meta, target)
    assert restored.pod == "counter-mv-abc123" and restored.container == "c"
    assert restored.image is not None and restored.image.startswith("localhost/qos-checkpoint/batch-counter-mv-abc123:")
    assert not (image_dir / "oci").exists(), "the layout is removed once imported"
    ctr = Path(_containerd_binary()).with_name("ctr")
    out = subprocess.run([str(ctr), "--address", containerd, "-n", "k8s.io", "images", "ls"],
                         capture_output=True, text=True, timeout=30, check=True).stdout  # fmt: skip
    assert restored.image in out and "linux/amd64" in out, out
    # unpacked into the default snapshotter: CRI restores from a View of this snapshot (chain id = layer digest)
    snaps = subprocess.run([str(ctr), "--address", containerd, "-n", "k8s.io", "snapshots", "ls"],
                           capture_output=True, text=True, timeout=30, check=True).stdout  # fmt: skip
    assert "Committed" in snaps, snaps
    # the import's lease (which keeps its stream from the garbage collector) is gone: the image record holds it all
    leases = subprocess.run([str(ctr), "--address", containerd, "-n", "k8s.io", "leases", "ls"],
                            capture_output=True, text=True, timeout=30, check=True).stdout  # fmt: skip
    assert "qos-agent-import-" not in leases, leases
    # the manifest carries the annotation containerd's CRI looks for to restore instead of start
    importer = ContainerdImporter(containerd)
    assert (await importer.image_digest(restored.image) or "").startswith("sha256:")
    assert checkpoint_annotations(SOURCE)["org.criu.checkpoint.container.name"] == "c"
    # the same checkpoint again (a retried restore) is idempotent
    assert await backend.restore(image_dir, meta, target) == restored
    await backend.discard(restored)
    assert await importer.image_digest(restored.image) is None


async def test_an_import_that_stores_nothing_is_caught_and_errors_are_containerd_errors(
    containerd: str, tmp_path: Path
) -> None:
    """containerd accepts an archive whose index names a manifest it does not hold and stores no image: only the
    Images/Get check after the import (what restore does) notices. A dead socket is a ContainerdError."""
    importer = ContainerdImporter(containerd)
    layout = tmp_path / "oci"
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    ref = checkpoint_image_ref("localhost/qos-checkpoint", "n", "p", "ab" * 32)
    missing = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:" + "0" * 64, "size": 9,
               "annotations": {"org.opencontainers.image.ref.name": ref}}  # fmt: skip
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [missing]}))
    with contextlib.suppress(ContainerdError):  # refusing it is fine too: what matters is that no image appears
        await asyncio.wait_for(importer.import_layout(layout, "localhost/qos-checkpoint"), 60)
    assert await importer.image_digest(ref) is None
    dead = ContainerdImporter(str(tmp_path / "none.sock"))
    with pytest.raises(ContainerdError, match="UNAVAILABLE"):
        await dead.image_digest(ref)
    with pytest.raises(BackendError, match="containerd"):
        await KubeletBackend("x", KubeletConfig(containerd_socket=str(tmp_path / "none.sock"))).prepare(
            {"kubelet_archive": "checkpoint-a.tar"}
        )


async def test_the_runtime_probe_asks_the_real_containerd(containerd: str) -> None:
    """Version from containerd itself; this one runs without the CRI plugins, so it reports no CRI config and the
    answer is "cannot tell" (a node whose CRI is on answers its config: e2e/test_migration_real.py)."""
    out = subprocess.run([_containerd_binary(), "--version"], capture_output=True, text=True, check=True).stdout
    version, config = await ContainerdImporter(containerd).runtime()
    assert version and version.lstrip("v") in out, (version, out)
    assert config is None
    backend = KubeletBackend("127.0.0.1", KubeletConfig(containerd_socket=containerd))
    answer = (await backend.features())["restore"]
    assert answer["runtime"] == f"containerd {version}" and answer["supported"] is None, answer
    assert "did not report" in answer["reason"], answer
    gone = KubeletBackend("127.0.0.1", KubeletConfig(containerd_socket=containerd + ".none"))
    assert (await gone.restore_support())["supported"] is None
