"""The CRI-O side of the kubelet backend's destination against a real CRI-O (a private instance started here: own
root, runroot, socket and state in a temporary directory, no kubelet, no CNI), as a destination agent on a CRI-O
node uses it: the runtime probe over CRI and CRI-O's /config, the checkpoint image written into CRI-O's
containers/storage with skopeo, read back over CRI as the kubelet will (manifest digest, checkpoint annotation),
and discarded. The restore itself (a pod created from that image) runs on real CRI-O kubelet nodes:
e2e/test_migration_crio_real.py.

Needs root, CRI-O and pinns (hack/build-crio.sh: $QOS_CACHE/<kube>/bin/crio, or $QOS_CRIO / $QOS_PINNS), conmon and
skopeo (Debian), runc (hack/build-tools.sh) and CRIU (hack/build-criu.sh): FAILS, never skips, without them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from extender.agent.backends.base import BackendError, WorkloadRef
from extender.agent.backends.kubelet import CRIO_LEGACY_NAME_ANNOTATION, KubeletBackend, write_oci_layout
from extender.agent.crio import CrioError, CrioImporter
from extender.agent.settings import KubeletConfig
from tests.test_agent_containerd import _archive, cached_binary

SOURCE = WorkloadRef(namespace="batch", pod="counter", container="c")
CACHE = Path(os.environ.get("QOS_CACHE", str(Path.home() / ".cache/kube-qos-extender")))


def _tool(name: str) -> str:
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} not found: run hack/build-crio.sh (it installs Debian's conmon and skopeo)")
    return found


def _criu_dir() -> str:
    for d in sorted(CACHE.glob("criu-*"), reverse=True):
        if (d / "criu").is_file():
            return str(d)
    pytest.fail("criu not found: run hack/build-criu.sh")


def _start_crio(d: Path, *, criu: bool) -> tuple[subprocess.Popen[bytes], str]:
    """A CRI-O of its own under ``d``; ``criu=False`` leaves criu off its PATH (CRI-O then turns checkpoint/restore
    off itself, as on a node without CRIU)."""
    if os.geteuid() != 0:
        pytest.fail("the CRI-O tests need root (containers/storage overlay)")
    sock = d / "crio.sock"
    runc = cached_binary("runc", "QOS_RUNC", "hack/build-tools.sh")
    for sub in ("conf.d", "policies", "hooks.d", "cdi", "keys"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "crio.conf").write_text(
        f"""[crio]
root = "{d}/root"
runroot = "{d}/run"
storage_driver = "overlay"
log_dir = "{d}/pods"
version_file = "{d}/version"
clean_shutdown_file = "{d}/clean.shutdown"
[crio.api]
listen = "{sock}"
stream_address = "127.0.0.1"
stream_port = "0"
[crio.runtime]
conmon = "{_tool("conmon")}"
conmon_cgroup = "pod"
cgroup_manager = "cgroupfs"
container_exits_dir = "{d}/exits"
container_attach_socket_dir = "{d}/attach"
namespaces_dir = "{d}/ns"
pinns_path = "{cached_binary("pinns", "QOS_PINNS", "hack/build-crio.sh")}"
hooks_dir = ["{d}/hooks.d"]
cdi_spec_dirs = ["{d}/cdi"]
decryption_keys_path = "{d}/keys"
irqbalance_config_restore_file = "disable"
enable_criu_support = true
default_runtime = "runc"
[crio.runtime.runtimes.runc]
runtime_path = "{runc}"
runtime_root = "{d}/runc"
[crio.image]
signature_policy_dir = "{d}/policies"
pause_image = "registry.k8s.io/pause:3.10"
[crio.network]
network_dir = "{d}/cni"
plugin_dirs = ["/usr/lib/cni"]
[crio.metrics]
enable_metrics = false
[crio.nri]
enable_nri = false
"""
    )
    path = f"{_criu_dir()}:/usr/sbin:/usr/bin:/sbin:/bin" if criu else "/usr/sbin:/usr/bin:/sbin:/bin"
    log = (d / "crio.log").open("wb")
    proc = subprocess.Popen(
        [
            cached_binary("crio", "QOS_CRIO", "hack/build-crio.sh"),
            "--config",
            str(d / "crio.conf"),
            "--config-dir",
            str(d / "conf.d"),
        ],
        stdout=log,
        stderr=log,
        env={"PATH": path},
    )
    deadline = time.monotonic() + 60
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"CRI-O did not start:\n{(d / 'crio.log').read_text()[-3000:]}")
        time.sleep(0.1)
    return proc, str(sock)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="module")
def crio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("crio")
    # skopeo run as root keeps a blob-info cache in /var/lib/containers/cache (no option moves it; in the agent's
    # read-only pod it falls back to memory): on this host, remove what the tests made
    host_cache = Path("/var/lib/containers")
    had_cache = host_cache.exists()
    proc, sock = _start_crio(d, criu=True)
    try:
        yield sock
    finally:
        _stop(proc)
        subprocess.run(["umount", "-R", str(d / "root" / "overlay")], capture_output=True)
        if not had_cache:
            shutil.rmtree(host_cache, ignore_errors=True)


async def test_the_runtime_probe_asks_the_real_crio(crio: str, tmp_path: Path) -> None:
    backend = KubeletBackend("10.0.0.1", KubeletConfig(runtime="cri-o", crio_socket=crio))
    answer = await backend.restore_support()
    assert answer["supported"] is True, answer
    assert answer["runtime"].startswith("cri-o 1.") and "enable_criu_support" in answer["reason"]
    features = await backend.features()
    assert features["runtime"] == "cri-o" and features["crio"] == crio and features["containerd"] is None
    # the same CRI-O without criu on its PATH turns checkpoint/restore off itself: a clear no, before any checkpoint
    proc, sock = _start_crio(tmp_path / "nocriu", criu=False)
    try:
        no = await KubeletBackend("10.0.0.1", KubeletConfig(runtime="cri-o", crio_socket=sock)).restore_support()
    finally:
        _stop(proc)
    assert no["supported"] is False and "enable_criu_support" in no["reason"], no


async def test_restore_puts_the_checkpoint_image_into_crio_as_the_kubelet_sees_it(crio: str, tmp_path: Path) -> None:
    backend = KubeletBackend("10.0.0.1", KubeletConfig(runtime="cri-o", crio_socket=crio))
    await backend.prepare({"kubelet_archive": "checkpoint-x.tar"})
    image_dir = tmp_path / "image"
    image_dir.mkdir()
    pages = os.urandom(3 * 4096)
    _archive(image_dir / "checkpoint.tar", pages)
    target = WorkloadRef(namespace="batch", pod="counter-moved", container="c")
    meta = {**SOURCE.to_json(), "kubelet_archive": "checkpoint-x.tar"}
    restored = await backend.restore(image_dir, meta, target)
    assert restored.image and restored.image.startswith("localhost/qos-checkpoint/batch-counter-moved:")
    assert not (image_dir / "oci").exists()  # the layout is gone once CRI-O holds the image
    assert not (image_dir / "oci.skopeo-tmp").exists()  # and so is skopeo's staging directory
    importer = backend.importer
    assert isinstance(importer, CrioImporter)
    annotations = await importer.image_annotations(restored.image)
    # what CRI-O's CreateContainer looks for to restore instead of start (checkIfCheckpointOCIImage)
    assert annotations is not None and annotations[CRIO_LEGACY_NAME_ANNOTATION] == "c", annotations
    digest = await importer.image_digest(restored.image)
    layer = hashlib.sha256((image_dir / "checkpoint.tar").read_bytes()).hexdigest()
    assert digest and digest.startswith("sha256:") and restored.image.endswith(layer[:20])
    # the same bytes again: the same name and digest (an agent retrying a restore)
    again = await backend.restore(image_dir, meta, target)
    assert again.image == restored.image and await importer.image_digest(again.image) == digest
    await backend.discard(restored)
    assert await importer.image_digest(restored.image) is None
    assert await importer.image_annotations(restored.image) is None
    await backend.discard(restored)  # twice is fine
    with pytest.raises(BackendError, match="not a checkpoint image"):
        await backend.discard(WorkloadRef(namespace="n", pod="p", image="registry.k8s.io/pause:3.10"))


async def test_bad_layouts_are_refused_and_leave_nothing(crio: str, tmp_path: Path) -> None:
    importer = CrioImporter(crio)
    archive = _archive(tmp_path / "checkpoint.tar", b"x" * 100)
    ann = {CRIO_LEGACY_NAME_ANNOTATION: "c"}
    outside = tmp_path / "outside"
    write_oci_layout(archive, outside, ann, "docker.io/library/busybox:latest")
    with pytest.raises(CrioError, match="not under this agent's prefix"):
        await importer.import_layout(outside, "localhost/qos-checkpoint")
    assert await importer.image_digest("docker.io/library/busybox:latest") is None
    # a layer whose bytes do not match its digest (a corrupted archive): skopeo refuses, nothing is stored
    corrupt = tmp_path / "corrupt"
    write_oci_layout(archive, corrupt, ann, "localhost/qos-checkpoint/batch-c:0123456789abcdef0123")
    layer = corrupt / "blobs" / "sha256" / hashlib.sha256(archive.read_bytes()).hexdigest()
    layer.unlink()
    layer.write_bytes(b"y" * 100)
    with pytest.raises(CrioError, match="skopeo copy"):
        await importer.import_layout(corrupt, "localhost/qos-checkpoint")
    assert await importer.image_digest("localhost/qos-checkpoint/batch-c:0123456789abcdef0123") is None
    # not a layout at all
    (tmp_path / "empty").mkdir()
    with pytest.raises(CrioError, match="not an OCI layout"):
        await importer.import_layout(tmp_path / "empty", "localhost/qos-checkpoint")
    # a skopeo that is not there: a clear error, not a crash
    with pytest.raises(CrioError, match="cannot run"):
        await CrioImporter(crio, skopeo=str(tmp_path / "no-skopeo")).import_layout(corrupt, "localhost/qos-checkpoint")
