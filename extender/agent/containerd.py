"""Import an OCI image archive into the node's containerd, the way ``ctr images import`` does, without ``ctr``.

The kubelet backend's destination turns a checkpoint archive into a checkpoint image (``write_oci_layout``) that
the node's container runtime must hold before a pod can be created from it (``imagePullPolicy: Never``; no
registry). containerd 2.x's Transfer service does the import and the unpack into the CRI snapshotter in one
call, exactly as ``ctr images import`` (which is what was verified by hand, ../shared/LOCAL-CLUSTER-NOTES.md):

0. ``Leases/Create`` a lease that expires on its own (``containerd.io/gc.expire``); the stream and the transfer
   carry it (``containerd-lease``) and it is deleted at the end: containerd's garbage collector keeps an unleased
   stream only in a namespace that already holds metadata, so a node's first import could lose its stream;
1. ``Streaming/Stream`` (bidi, ``google.protobuf.Any`` both ways): send ``StreamInit{id}``, read the ack;
2. ``Transfer/Transfer{source: ImageImportStream{stream: id}, destination: ImageStore{...}}``; while it runs,
   containerd pulls the tar through the stream: it grants a window (``WindowUpdate``), we send ``Data`` chunks
   within it, then half-close;
3. ``Images/Get`` checks the image exists under the expected name.

Why this and not our own content/snapshot/diff/image calls: one server-side call that unpacks into the
snapshotter CRI restores from (``View`` of the chain id in ``CRImportCheckpoint``), sets the GC labels and
holds its own lease; five services and their GC rules would be ours to get right otherwise. Why no generated
stubs: the agent runs read-only without a compiler, and the messages are nine small ones; the wire encoding
below follows ``protos/containerd_minimal.proto`` (our own subset of containerd's api v1.11 protos, field
numbers checked against upstream), and tests/test_agent_containerd.py checks it byte for byte against stubs
protoc generates from that file.
"""

from __future__ import annotations

import asyncio
import contextlib
import tarfile
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

__all__ = [
    "ContainerdError",
    "ContainerdImporter",
    "ImageStoreError",
    "any_message",
    "decode_fields",
    "image_store",
    "oci_archive_chunks",
    "status_info",
    "status_request",
    "transfer_request",
    "version_of",
]

NAMESPACE_HEADER = "containerd-namespace"
LEASE_HEADER = "containerd-lease"
LEASE_EXPIRE_LABEL = "containerd.io/gc.expire"  # a lease left by a crashed agent ends on its own
_STREAM = "/containerd.services.streaming.v1.Streaming/Stream"
_TRANSFER = "/containerd.services.transfer.v1.Transfer/Transfer"
_IMAGE_GET = "/containerd.services.images.v1.Images/Get"
_IMAGE_DELETE = "/containerd.services.images.v1.Images/Delete"
_LEASE_CREATE = "/containerd.services.leases.v1.Leases/Create"
_LEASE_DELETE = "/containerd.services.leases.v1.Leases/Delete"
_VERSION = "/containerd.services.version.v1.Version/Version"
_CRI_STATUS = "/runtime.v1.RuntimeService/Status"
# Type URLs: containerd resolves transfer objects by the bare full name (typeurl v2 for unregistered protos).
STREAM_INIT = "containerd.services.streaming.v1.StreamInit"
IMPORT_STREAM = "containerd.types.transfer.ImageImportStream"
IMAGE_STORE = "containerd.types.transfer.ImageStore"
DATA = "containerd.types.transfer.Data"
WINDOW_UPDATE = "containerd.types.transfer.WindowUpdate"
_MAX_DATA = 32 * 1024  # containerd's own chunk size for stream data


class ImageStoreError(Exception):
    """The node's runtime could not take, report or drop a checkpoint image (containerd's or CRI-O's store: the
    kubelet backend handles both alike)."""


class ContainerdError(ImageStoreError):
    """The node's containerd refused or could not be reached; the message says which call and why."""


# ------------------------------------------------------------------------------------------ protobuf wire format


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len(field: int, data: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _str(field: int, value: str) -> bytes:
    return _len(field, value.encode()) if value else b""


def _bool(field: int, value: bool) -> bytes:
    return _varint(field << 3) + b"\x01" if value else b""


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value) if value else b""


def decode_fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs of a message: varints as int, length-delimited as bytes (no groups)."""
    out: list[tuple[int, int | bytes]] = []
    i = 0

    def varint() -> int:
        nonlocal i
        shift = result = 0
        while True:
            if i >= len(data):
                raise ValueError("truncated varint")
            b = data[i]
            i += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    while i < len(data):
        key = varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            out.append((field, varint()))
        elif wire == 2:
            n = varint()
            if i + n > len(data):
                raise ValueError("truncated field")
            out.append((field, data[i : i + n]))
            i += n
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            out.append((field, int.from_bytes(data[i : i + width], "little")))
            i += width
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return out


def any_message(type_url: str, value: bytes) -> bytes:
    """google.protobuf.Any{type_url = 1, value = 2}."""
    return _str(1, type_url) + _len(2, value)


def _platform(os_name: str, arch: str) -> bytes:  # containerd.types.Platform{os = 1, architecture = 2}
    return _str(1, os_name) + _str(2, arch)


def image_store(prefix: str, *, os_name: str = "linux", arch: str = "amd64", snapshotter: str = "") -> bytes:
    """containerd.types.transfer.ImageStore as ``ctr images import --base-name PREFIX`` builds it: the image is
    named by its index entry's ``org.opencontainers.image.ref.name`` (a full reference is kept as is, a bare tag
    becomes PREFIX:tag), only ``os/arch`` is kept, and it is unpacked into ``snapshotter`` ("" = containerd's
    default, overlayfs, the CRI one here)."""
    reference = _str(1, prefix) + _bool(2, True) + _bool(3, True)  # ImageReference{name, is_prefix, allow_overwrite}
    unpack = _len(1, _platform(os_name, arch)) + _str(2, snapshotter)  # UnpackConfiguration{platform, snapshotter}
    return _len(3, _platform(os_name, arch)) + _len(6, reference) + _len(10, unpack)


def transfer_request(stream_id: str, store: bytes, media_type: str = "") -> bytes:
    """containerd.services.transfer.v1.TransferRequest{source: Any(ImageImportStream), destination: Any(store)}."""
    source = _str(1, stream_id) + _str(2, media_type)
    return _len(1, any_message(IMPORT_STREAM, source)) + _len(2, any_message(IMAGE_STORE, store))


def create_lease_request(lease_id: str, labels: dict[str, str]) -> bytes:
    """containerd.services.leases.v1.CreateRequest{id = 1, labels = 3 (map entries {key = 1, value = 2})}."""
    return _str(1, lease_id) + b"".join(_len(3, _str(1, k) + _str(2, v)) for k, v in sorted(labels.items()))


def delete_lease_request(lease_id: str, sync: bool = False) -> bytes:
    """containerd.services.leases.v1.DeleteRequest{id = 1, sync = 2}."""
    return _str(1, lease_id) + _bool(2, sync)


def _parse_any(raw: bytes) -> tuple[str, bytes]:
    url, value = "", b""
    for field, v in decode_fields(raw):
        if field == 1 and isinstance(v, bytes):
            url = v.decode()
        elif field == 2 and isinstance(v, bytes):
            value = v
    return url, value


def image_target_digest(get_image_response: bytes) -> str | None:
    """GetImageResponse{image = 1: Image{name = 1, target = 3: Descriptor{digest = 2}}} -> the target digest."""
    for f1, image in decode_fields(get_image_response):
        if f1 == 1 and isinstance(image, bytes):
            for f2, target in decode_fields(image):
                if f2 == 3 and isinstance(target, bytes):
                    for f3, digest in decode_fields(target):
                        if f3 == 2 and isinstance(digest, bytes):
                            return digest.decode()
    return None


# ------------------------------------------------------------------------------------------ the archive


def version_of(response: bytes) -> str:
    """``VersionResponse.version`` (``v2.3.7`` / ``2.3.7``), or "" when containerd sent none."""
    for field, value in decode_fields(response):
        if field == 1 and isinstance(value, bytes):
            return value.decode(errors="replace")
    return ""


def status_request(verbose: bool = True) -> bytes:
    return _bool(1, verbose)


def status_info(response: bytes) -> dict[str, str]:
    """``StatusResponse.info``: the map entries (key 1, value 2) of field 2."""
    info: dict[str, str] = {}
    for field, value in decode_fields(response):
        if field == 2 and isinstance(value, bytes):
            entry = {f: v for f, v in decode_fields(value) if isinstance(v, bytes)}
            info[entry.get(1, b"").decode(errors="replace")] = entry.get(2, b"").decode(errors="replace")
    return info


def _member(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def oci_archive_chunks(layout: Path, block: int = 1 << 20) -> Iterator[bytes]:
    """The OCI image layout directory as a tar stream (what ``ctr images import`` reads), without a copy on
    disk: ``oci-layout``, ``index.json``, then every blob."""
    files = [layout / "oci-layout", layout / "index.json", *sorted((layout / "blobs" / "sha256").iterdir())]
    for path in files:
        size = path.stat().st_size
        yield _member(path.relative_to(layout).as_posix(), size)
        with path.open("rb") as f:
            while chunk := f.read(block):
                yield chunk
        if size % 512:
            yield b"\0" * (512 - size % 512)
    yield b"\0" * 1024


# ------------------------------------------------------------------------------------------ the client


class ContainerdImporter:
    """One node's containerd (unix socket), namespace ``k8s.io`` (CRI's)."""

    kind = "containerd"

    def __init__(self, socket: str, namespace: str = "k8s.io", timeout_seconds: float = 300.0) -> None:
        self.socket = socket
        self.namespace = namespace
        self.timeout = timeout_seconds

    def _channel(self) -> Any:
        import grpc

        options = [("grpc.max_receive_message_length", 1 << 24)]
        return grpc.aio.insecure_channel(f"unix://{self.socket}", options=options)

    def _md(self) -> tuple[tuple[str, str], ...]:
        return ((NAMESPACE_HEADER, self.namespace),)

    async def check(self) -> None:
        """Reachable and serving the image API (an unknown image is the expected answer)."""
        if not Path(self.socket).exists():
            raise ContainerdError(f"no containerd socket at {self.socket} (mount the node's socket into the agent)")
        await self.image_digest("qos-agent.invalid/probe:none")

    async def runtime(self) -> tuple[str, dict[str, Any] | None]:
        """(containerd's version, its CRI config as CRI Status reports it, or None when the CRI plugin does not
        answer): what ``restore_support`` decides from."""
        import json

        import grpc

        async with self._channel() as ch:
            try:
                version = version_of(await ch.unary_unary(_VERSION)(b"", timeout=10))
            except grpc.aio.AioRpcError as exc:
                raise ContainerdError(f"containerd Version: {exc.code().name}: {exc.details()}") from None
            try:
                info = status_info(await ch.unary_unary(_CRI_STATUS)(status_request(), timeout=10))
            except grpc.aio.AioRpcError:
                return version, None
        try:
            config = json.loads(info.get("config") or "null")
        except ValueError:
            config = None
        return version, config if isinstance(config, dict) else None

    async def image_digest(self, ref: str) -> str | None:
        """The manifest digest an image name points at, or None if there is no such image."""
        import grpc

        async with self._channel() as ch:
            try:
                raw = await ch.unary_unary(_IMAGE_GET)(_str(1, ref), metadata=self._md(), timeout=30)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    return None
                raise ContainerdError(f"containerd Images/Get {ref}: {exc.code().name}: {exc.details()}") from None
        return image_target_digest(raw)

    async def delete_image(self, ref: str) -> None:
        import grpc

        async with self._channel() as ch:
            try:
                await ch.unary_unary(_IMAGE_DELETE)(_str(1, ref), metadata=self._md(), timeout=30)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    why = f"{exc.code().name}: {exc.details()}"
                    raise ContainerdError(f"containerd Images/Delete {ref}: {why}") from None

    async def import_layout(self, layout: Path, prefix: str) -> None:
        """Stream ``layout`` as an OCI archive into containerd's Transfer service (import + unpack)."""
        import grpc

        sid = f"qos-agent-import-{uuid.uuid4().hex[:12]}"
        tasks: list[asyncio.Future[Any]] = []
        async with self._channel() as ch:
            # Stream and Transfer under a lease (as containerd's own client does): an unleased stream survives a
            # garbage collection only if its namespace already holds metadata, so on a node's first import the
            # collector could close it between our registration and the Transfer (NOT_FOUND "not found").
            expire = datetime.now(UTC) + timedelta(seconds=self.timeout + 60)
            labels = {LEASE_EXPIRE_LABEL: expire.strftime("%Y-%m-%dT%H:%M:%SZ")}
            try:
                await ch.unary_unary(_LEASE_CREATE)(create_lease_request(sid, labels), metadata=self._md(), timeout=30)
            except grpc.aio.AioRpcError as exc:
                raise ContainerdError(f"containerd lease for the import: {exc.code().name}: {exc.details()}") from None
            md = (*self._md(), (LEASE_HEADER, sid))
            stream = ch.stream_stream(_STREAM)(metadata=md, timeout=self.timeout)
            try:
                await stream.write(any_message(STREAM_INIT, _str(1, sid)))
                await stream.read()  # containerd acks the registration (an Empty)
                window = _Window()
                tasks.append(asyncio.ensure_future(_read_windows(stream, window)))
                request = transfer_request(sid, image_store(prefix))
                transfer = asyncio.ensure_future(ch.unary_unary(_TRANSFER)(request, metadata=md, timeout=self.timeout))
                sender = asyncio.ensure_future(_send(stream, _chunks_async(layout), window))
                tasks += [transfer, sender]
                done, _ = await asyncio.wait({transfer, sender}, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    task.result()  # an exception from either ends the import
                await transfer
                await sender
            except grpc.aio.AioRpcError as exc:
                raise ContainerdError(f"containerd import of {layout}: {exc.code().name}: {exc.details()}") from None
            finally:
                for task in tasks:
                    task.cancel()
                stream.cancel()
                # The image record now holds what the import wrote; a failed delete is left to the expiry label.
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await ch.unary_unary(_LEASE_DELETE)(delete_lease_request(sid), metadata=self._md(), timeout=30)


class _Window:
    def __init__(self) -> None:
        self.remaining = 0
        self.changed = asyncio.Event()
        self.closed = False


async def _read_windows(stream: Any, window: _Window) -> None:
    import grpc

    try:
        while True:
            raw = await stream.read()
            if raw is grpc.aio.EOF:
                break
            url, value = _parse_any(raw)
            if url.rsplit("/", 1)[-1] == WINDOW_UPDATE:
                for field, v in decode_fields(value):
                    if field == 1 and isinstance(v, int):
                        window.remaining += v - (1 << 64) if v >= 1 << 63 else v
                window.changed.set()
    except (grpc.aio.AioRpcError, asyncio.CancelledError):
        pass
    finally:
        window.closed = True
        window.changed.set()


async def _chunks_async(layout: Path) -> AsyncIterator[bytes]:
    it = oci_archive_chunks(layout)
    while True:
        chunk = await asyncio.to_thread(next, it, None)
        if chunk is None:
            return
        yield chunk


async def _send(stream: Any, chunks: AsyncIterator[bytes], window: _Window) -> None:
    async for chunk in chunks:
        view = memoryview(chunk)
        while view:
            while window.remaining <= 0:
                if window.closed:
                    raise ContainerdError("containerd closed the import stream before the archive was sent")
                window.changed.clear()
                await window.changed.wait()
            n = min(len(view), _MAX_DATA, window.remaining)
            await stream.write(any_message(DATA, _len(1, bytes(view[:n]))))
            window.remaining -= n
            view = view[n:]
    await stream.done_writing()
