"""kubelet backend pieces that run without a kubelet: where the archive the kubelet names is read (the agent sees
the node's checkpoint directory mounted elsewhere), the containerd import encoding (checked byte for byte against
stubs protoc generates from our own extender/agent/protos/containerd_minimal.proto), the OCI archive stream.

The real thing (kubelet checkpoint -> transfer -> containerd import -> restored pod) is e2e/test_migration_real.py.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import ssl
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from extender.agent import containerd as ctd
from extender.agent.backends.base import BackendError, WorkloadRef
from extender.agent.backends.kubelet import (
    KubeletBackend,
    archive_in,
    checkpoint_annotations,
    checkpoint_image_ref,
    restore_support,
    write_oci_layout,
)
from extender.agent.settings import KubeletConfig
from tests.test_agent_support import free_port, make_pki

ROOT = Path(__file__).resolve().parents[1]
POD = WorkloadRef(namespace="batch", pod="train-7", container="worker")
NODE_PATH = "/var/lib/qos-local-nodes/node-a/kubelet/checkpoints/"
NAME = "checkpoint-train-7_batch-worker-2026-11-22T19:50:01Z.tar"


def test_archive_in_reads_the_kubelets_file_name_in_the_mounted_directory(tmp_path: Path) -> None:
    assert archive_in(tmp_path, NODE_PATH + NAME) == tmp_path / NAME
    assert archive_in("/var/lib/kubelet/checkpoints", NAME) == Path("/var/lib/kubelet/checkpoints") / NAME
    offset = "checkpoint-p_ns-c-2026-11-22T19:50:01.123+01:00.tar"
    assert archive_in(tmp_path, "/x/" + offset) == tmp_path / offset


@pytest.mark.parametrize(
    "returned",
    [None, 7, "", "/var/lib/kubelet/checkpoints/", "/etc/shadow", "/x/checkpoint-..tar", "/x/checkpoint-a/../b.tar",
     "/x/checkpoint-a.tar.gz", "/x/.checkpoint-a.tar", "/x/checkpoint-a b.tar", "/x/checkpoint-\0.tar", "../x"],
)  # fmt: skip
def test_archive_in_refuses_anything_but_a_kubelet_archive_name(tmp_path: Path, returned: Any) -> None:
    with pytest.raises(BackendError):
        archive_in(tmp_path, returned)


def test_checkpoint_image_ref_is_a_valid_unique_reference() -> None:
    digest = "sha256:" + "ab" * 32
    assert checkpoint_image_ref("localhost/qos-checkpoint", "batch", "train-7-mv-1a2b3c", digest) == (
        "localhost/qos-checkpoint/batch-train-7-mv-1a2b3c:" + "ab" * 10
    )
    ref = checkpoint_image_ref("localhost/q/", "Ns", "a.b" + "x" * 300, "cd" * 32)
    repo, tag = ref.rsplit(":", 1)
    assert repo.startswith("localhost/q/ns-a-b") and len(repo) <= len("localhost/q/") + 120 and tag == "cd" * 10
    with pytest.raises(ValueError):
        checkpoint_image_ref("p", "n", "p", "sha256:xyz")


async def test_checkpoint_copies_the_archive_the_kubelet_names_from_the_mounted_dir(tmp_path: Path) -> None:
    """A stand-in kubelet (HTTPS, client certificate required) answers a node path; the archive exists only in
    the agent's mount of that directory. The agent copies it and removes the kubelet's copy."""
    pki = make_pki(tmp_path / "pki", {"kubelet": "127.0.0.1", "agent": ""})
    mounted = tmp_path / "mounted-checkpoints"
    mounted.mkdir()
    data = hashlib.sha256(b"x").digest() * 1000
    (mounted / NAME).write_bytes(data)
    seen: list[str] = []

    async def checkpoint(request: web.Request) -> web.Response:
        seen.append(request.path_qs)
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        assert peer, "the agent presents its client certificate"
        return web.json_response({"items": [NODE_PATH + NAME]})

    app = web.Application()
    app.router.add_post("/checkpoint/{ns}/{pod}/{container}", checkpoint)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca))
    ctx.load_cert_chain(pki.dir / "kubelet.crt", pki.dir / "kubelet.key")
    ctx.verify_mode = ssl.CERT_REQUIRED
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port("127.0.0.1")
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ctx).start()
    try:
        tls = pki.tls("agent")
        cfg = KubeletConfig(port=port, cert_file=tls.cert_file, key_file=tls.key_file, ca_file=tls.ca_file,
                            checkpoint_timeout_seconds=5, checkpoint_dir=str(mounted),
                            containerd_socket=None)  # fmt: skip
        backend = KubeletBackend("127.0.0.1", cfg)
        result = await backend.checkpoint(POD, tmp_path / "image", leave_running=True)
    finally:
        await runner.cleanup()
    assert seen == ["/checkpoint/batch/train-7/worker?timeout=5"]
    assert (tmp_path / "image" / "checkpoint.tar").read_bytes() == data
    assert not (mounted / NAME).exists(), "the kubelet's copy (the container's memory) is removed"
    assert result.meta["kubelet_archive"] == NAME and result.meta["archive_bytes"] == len(data)
    assert backend.image_complete(tmp_path / "image")
    # without a containerd socket this node refuses to be a destination, before anything is disrupted
    with pytest.raises(BackendError, match="containerd"):
        await backend.prepare(result.meta)


async def test_discard_only_touches_this_agents_checkpoint_images(tmp_path: Path) -> None:
    backend = KubeletBackend("127.0.0.1", KubeletConfig(containerd_socket=str(tmp_path / "absent.sock")))
    for image in (None, "docker.io/library/busybox:1", "localhost/qos-checkpoint-evil/x:1"):
        with pytest.raises(BackendError, match="not a checkpoint image"):
            await backend.discard(WorkloadRef(namespace="n", pod="p", image=image))


async def test_prepare_refuses_without_a_reachable_containerd(tmp_path: Path) -> None:
    backend = KubeletBackend("127.0.0.1", KubeletConfig(containerd_socket=str(tmp_path / "absent.sock")))
    with pytest.raises(BackendError, match="no containerd socket"):
        await backend.prepare({"kubelet_archive": NAME})
    with pytest.raises(BackendError, match="kubelet checkpoint"):
        await backend.prepare({})


# ------------------------------------------------------------------ containerd wire encoding


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("containerd-stubs")
    proto_dir = ROOT / "extender/agent/protos"
    include = str(Path(protoc.__file__).resolve().parent / "_proto")
    rc = protoc.main(["protoc", f"-I{proto_dir}", f"-I{include}", f"--python_out={out}", "containerd_minimal.proto"])
    assert rc == 0
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module("containerd_minimal_pb2")
    finally:
        sys.path.remove(str(out))


def test_transfer_request_matches_our_proto(stubs: Any) -> None:
    any_pb2 = importlib.import_module("google.protobuf.any_pb2")
    pb = stubs
    platform = pb.Platform(os="linux", architecture="amd64")
    store = pb.ImageStore(
        platforms=[platform],
        extra_references=[pb.ImageReference(name="localhost/qos-checkpoint", is_prefix=True, allow_overwrite=True)],
        unpacks=[pb.UnpackConfiguration(platform=platform, snapshotter="")],
    )
    assert ctd.image_store("localhost/qos-checkpoint") == store.SerializeToString()
    src = any_pb2.Any(type_url=ctd.IMPORT_STREAM, value=pb.ImageImportStream(stream="s-1").SerializeToString())
    dst = any_pb2.Any(type_url=ctd.IMAGE_STORE, value=store.SerializeToString())
    want = pb.TransferRequest(source=src, destination=dst).SerializeToString()
    assert ctd.transfer_request("s-1", ctd.image_store("localhost/qos-checkpoint")) == want
    init = any_pb2.Any(type_url=ctd.STREAM_INIT, value=pb.StreamInit(id="s-1").SerializeToString())
    assert ctd.any_message(ctd.STREAM_INIT, pb.StreamInit(id="s-1").SerializeToString()) == init.SerializeToString()
    data = pb.Data(data=b"\0" * 40000).SerializeToString()
    assert ctd.any_message(ctd.DATA, b"\n" + bytes([0xC0, 0xB8, 0x02]) + b"\0" * 40000) == (
        any_pb2.Any(type_url=ctd.DATA, value=data).SerializeToString()
    )


def test_decoding_what_containerd_sends(stubs: Any) -> None:
    pb = stubs
    for n in (1, 65536, 2**31 - 1):
        assert ctd.decode_fields(pb.WindowUpdate(update=n).SerializeToString()) == [(1, n)]
    negative = ctd.decode_fields(pb.WindowUpdate(update=-5).SerializeToString())
    assert negative == [(1, 2**64 - 5)]  # int32 on the wire: a 64-bit two's complement varint
    target = pb.Descriptor(media_type="application/vnd.oci.image.manifest.v1+json", digest="sha256:" + "e" * 64, size=9)
    raw = pb.GetImageResponse(image=pb.Image(name="localhost/x:y", target=target)).SerializeToString()
    assert ctd.image_target_digest(raw) == "sha256:" + "e" * 64
    assert ctd.image_target_digest(b"") is None
    with pytest.raises(ValueError):
        ctd.decode_fields(b"\x0a\x05ab")


def test_oci_archive_stream_is_the_layout_as_a_tar(tmp_path: Path) -> None:
    archive = tmp_path / "checkpoint.tar"
    with tarfile.open(archive, "w") as tar:
        payload = bytes(range(256)) * 700  # not a multiple of 512: padding
        info = tarfile.TarInfo("checkpoint/pages-1.img")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    layout = tmp_path / "oci"
    ref = checkpoint_image_ref("localhost/qos-checkpoint", "batch", "train-7", "ab" * 32)
    digest = write_oci_layout(archive, layout, checkpoint_annotations(POD), ref)
    stream = b"".join(ctd.oci_archive_chunks(layout, block=1000))
    assert len(stream) % 512 == 0
    with tarfile.open(fileobj=io.BytesIO(stream)) as tar:
        names = tar.getnames()
        assert names[:2] == ["oci-layout", "index.json"]
        for name in names:
            member = tar.extractfile(name)
            assert member is not None and member.read() == (layout / name).read_bytes()
    index = json.loads((layout / "index.json").read_text())
    (entry,) = index["manifests"]
    assert entry["digest"] == digest
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == ref  # the name containerd gives it
    assert entry["annotations"]["org.criu.checkpoint.container.name"] == "worker"
    # the layer is the archive itself, linked rather than copied
    layer = layout / "blobs" / "sha256" / hashlib.sha256(archive.read_bytes()).hexdigest()
    assert layer.read_bytes() == archive.read_bytes() and layer.stat().st_ino == archive.stat().st_ino


def test_workload_ref_carries_the_checkpoint_image() -> None:
    ref = WorkloadRef.from_json({"namespace": "n", "pod": "p", "container": "c", "image": "localhost/q/n-p:ab"})
    assert ref.image == "localhost/q/n-p:ab" and ref.to_json()["image"] == "localhost/q/n-p:ab"
    assert "image" not in POD.to_json()
    for bad in ("", " x", 5):
        with pytest.raises(ValueError):
            WorkloadRef.from_json({"namespace": "n", "pod": "p", "image": bad})


@pytest.mark.parametrize("kind", ["ok", "symlink", "traversal", "absolute", "device"])
def test_unpack_without_tarfile_filters_as_in_the_images_python(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The image's Python (3.11.2) has no tarfile extraction filters: the same archives are accepted/refused."""
    from extender.agent import archive as arc

    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    path = tmp_path / "a.tar"
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo({"traversal": "../escape", "absolute": "/tmp/escape"}.get(kind, "d/pages-1.img"))
        if kind == "symlink":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
        elif kind == "device":
            info.type = tarfile.CHRTYPE
            tar.addfile(info)
        else:
            info.size, info.mode = 3, 0o4755
            tar.addfile(info, io.BytesIO(b"abc"))
    if kind != "ok":
        with pytest.raises(tarfile.TarError):
            arc.unpack(path, tmp_path / "out")
        assert not (tmp_path / "escape").exists()
        return
    assert arc.unpack(path, tmp_path / "out") == ["d/pages-1.img"]
    out = tmp_path / "out" / "d" / "pages-1.img"
    assert out.read_bytes() == b"abc" and out.stat().st_mode & 0o7777 == 0o755


def test_lease_requests_match_our_proto(stubs: Any) -> None:
    pb = stubs
    labels = {"containerd.io/gc.expire": "2026-11-23T19:00:00Z", "a": "b"}
    want = pb.CreateLeaseRequest(id="qos-agent-import-1", labels=labels)
    got = pb.CreateLeaseRequest.FromString(ctd.create_lease_request("qos-agent-import-1", labels))
    assert got == want  # map order on the wire is free: compare decoded
    assert ctd.delete_lease_request("l-1") == pb.DeleteLeaseRequest(id="l-1").SerializeToString()
    assert ctd.delete_lease_request("l-1", sync=True) == pb.DeleteLeaseRequest(id="l-1", sync=True).SerializeToString()


@pytest.mark.parametrize(
    ("version", "config", "supported", "says"),
    [
        ("v2.3.7", {"enableExperimentalRestoreViaCreate": True}, True, "containerd 2.3.7 with"),
        ("2.2.7", {"enableExperimentalRestoreViaCreate": False}, False, "off (set it true"),
        ("v2.1.4", {}, True, "not yet behind an option"),
        ("v2.1.4", None, True, "not yet behind an option"),
        ("v2.2.0", None, None, "did not report"),
        ("v2.0.6", {"enableExperimentalRestoreViaCreate": True}, False, "came in 2.1"),
        ("v1.7.27", None, False, "came in 2.1"),
        ("v2.4.0", {"enableExperimentalRestoreViaCreate": True}, False, "removed in 2.4"),
        ("v3.0.0-beta.1", None, False, "removed in 2.4"),
        ("main", None, None, "not understood"),
        ("", None, None, "not understood"),
    ],
)
def test_restore_support_per_runtime_version(
    version: str, config: dict[str, Any] | None, supported: bool | None, says: str
) -> None:
    """The runtime matrix (agent README "Runtime support"): asked of the destination before any checkpoint."""
    ok, why = restore_support(version, config)
    assert ok is supported and says in why, (ok, why)


def test_runtime_probe_messages_match_our_proto(stubs: Any) -> None:
    pb = stubs
    assert ctd.status_request(True) == pb.StatusRequest(verbose=True).SerializeToString()
    raw = pb.StatusResponse(status=b"\x01\x02", info={"config": '{"a": 1}', "golang": "go1.24"}).SerializeToString()
    assert ctd.status_info(raw) == {"config": '{"a": 1}', "golang": "go1.24"}
    assert ctd.status_info(b"") == {}
    assert ctd.version_of(pb.VersionResponse(version="v2.3.7", revision="abc").SerializeToString()) == "v2.3.7"
    assert ctd.version_of(b"") == ""


# ------------------------------------------------------------------ CRI-O: wire encoding and the restore rule


def test_cri_messages_match_our_proto(stubs: Any) -> None:
    from extender.agent import crio

    pb = stubs
    spec = pb.CriImageSpec(image="localhost/qos-checkpoint/b-c:0123")
    assert crio.image_spec_request("localhost/qos-checkpoint/b-c:0123") == (
        pb.CriImageStatusRequest(image=spec).SerializeToString()
    )
    assert (
        crio.image_spec_request("x") == pb.CriRemoveImageRequest(image=pb.CriImageSpec(image="x")).SerializeToString()
    )
    version = pb.CriVersionResponse(version="0.1.0", runtime_name="cri-o", runtime_version="1.34.0",
                                    runtime_api_version="v1")  # fmt: skip
    assert crio.cri_version(version.SerializeToString()) == ("cri-o", "1.34.0")
    image = pb.CriImage(
        id="f" * 64,
        repo_tags=["localhost/qos-checkpoint/b-c:0123"],
        repo_digests=["localhost/qos-checkpoint/b-c@sha256:" + "a" * 64],
        size=4096,
        spec=pb.CriImageSpec(annotations={"io.kubernetes.cri-o.annotations.checkpoint.name": "worker", "k": "v"}),
    )
    got = crio.cri_image_digests(pb.CriImageStatusResponse(image=image, info={"a": "b"}).SerializeToString())
    assert got == ("f" * 64, ["localhost/qos-checkpoint/b-c@sha256:" + "a" * 64],
                   {"io.kubernetes.cri-o.annotations.checkpoint.name": "worker", "k": "v"})  # fmt: skip
    assert crio.cri_image_digests(pb.CriImageStatusResponse().SerializeToString()) is None  # no such image


def test_crio_storage_spec_for_skopeo() -> None:
    from extender.agent.crio import CrioError, storage_spec

    conf = {"crio": {"root": "/var/lib/containers/storage", "runroot": "/run/containers/storage",
                     "storage_driver": "overlay", "storage_option": []}}  # fmt: skip
    assert storage_spec(conf) == "[overlay@/var/lib/containers/storage+/run/containers/storage]"
    conf["crio"]["storage_option"] = ["overlay.mountopt=nodev"]
    assert storage_spec(conf).endswith("+/run/containers/storage:overlay.mountopt=nodev]")
    conf["crio"]["storage_driver"] = ""
    assert storage_spec(conf).startswith("[/var/lib/containers/storage+")
    for bad in ({}, {"crio": {"root": "relative", "runroot": "/r"}}, {"crio": {"root": "/a]b", "runroot": "/r"}},
                {"crio": {"root": "/a", "runroot": "/r", "storage_option": ["x y"]}}):  # fmt: skip
        with pytest.raises(CrioError):
            storage_spec(bad)


@pytest.mark.parametrize(
    ("config", "want"),
    [
        ({"crio": {"runtime": {"enable_criu_support": True}}}, True),
        ({"crio": {"runtime": {"enable_criu_support": True}, "image": {"signature_policy": ""}}}, True),
        ({"crio": {"runtime": {"enable_criu_support": True}, "image": {"signature_policy": "/etc/p.json"}}}, False),
        ({"crio": {"runtime": {"enable_criu_support": False}}}, False),
        ({"crio": {"runtime": {}}}, None),  # a CRI-O older than the option
        ({"crio": "garbage"}, None),
        (None, None),  # /config could not be read
    ],
)
def test_crio_restore_rule(config: dict[str, Any] | None, want: bool | None) -> None:
    from extender.agent.backends.kubelet import crio_restore_support

    ok, why = crio_restore_support("1.34.0", config)
    assert ok is want
    assert "CRI-O 1.34.0" in why
    if want is False:
        assert ("enable_criu_support" in why) != ("signature_policy" in why), why


async def test_a_crio_agent_without_a_socket_refuses_to_be_a_destination(tmp_path: Path) -> None:
    config = KubeletConfig(runtime="cri-o", crio_socket=str(tmp_path / "missing.sock"))
    backend = KubeletBackend("10.0.0.1", config)
    answer = await backend.restore_support()
    assert answer["supported"] is None and "cri-o not asked" in answer["reason"]
    with pytest.raises(BackendError, match="CRI-O socket"):
        await backend.prepare({"kubelet_archive": NAME})
    none = KubeletBackend("10.0.0.1", KubeletConfig(runtime="cri-o", crio_socket=None))
    assert (await none.restore_support())["supported"] is False
    with pytest.raises(BackendError, match=r"kubelet\.crio_socket"):
        await none.prepare({"kubelet_archive": NAME})
