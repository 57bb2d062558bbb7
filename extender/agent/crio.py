"""Put a checkpoint image into a CRI-O node's image store, and ask that CRI-O whether it can restore from it.

CRI-O restores a container, instead of starting it, when CreateContainer names an image of its
containers/storage whose annotations carry ``io.kubernetes.cri-o.annotations.checkpoint.name``
(``server/container_restore.go`` ``checkIfCheckpointOCIImage``, read in CRI-O 1.34.0) and ``enable_criu_support``
is on with ``criu`` on CRI-O's PATH. CRI has no image import, so the destination agent writes the image where
CRI-O reads it: ``skopeo copy oci:<layout>:<name> containers-storage:[driver@root+runroot:options]<name>``, the
way podman and CRI-O share one store on a node (containers/storage locks its files for concurrent writers).
Where that store is, and whether checkpoint/restore is on, CRI-O says itself on its socket's HTTP API
(``GET /config``: its effective TOML; CRI-O turns ``enable_criu_support`` off there when it found no ``criu``).
Which CRI-O it is, and what the kubelet will see, the agent asks over CRI on the same socket
(``RuntimeService/Version``, ``ImageService/ImageStatus`` / ``RemoveImage``: the messages are in our
``protos/containerd_minimal.proto``, hand-encoded like the containerd ones, checked against protoc stubs).

Why skopeo, not our own writer of containers/storage: its layer, image and lock files are a format of their own
that CRI-O reads concurrently; the tool that shares that store with CRI-O (the same library) is the one that can
write it safely. The agent's image carries Debian's skopeo; the store's directories must be mounted into the
agent at the paths CRI-O reports (config/agent/crio/).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import tomllib
from pathlib import Path
from typing import Any

from extender.agent.containerd import ImageStoreError, _len, _str, decode_fields

__all__ = [
    "CrioError",
    "CrioImporter",
    "cri_image_digests",
    "cri_version",
    "image_spec_request",
    "storage_location",
    "storage_spec",
]

_CRI_VERSION = "/runtime.v1.RuntimeService/Version"
_CRI_IMAGE_STATUS = "/runtime.v1.ImageService/ImageStatus"
_CRI_REMOVE_IMAGE = "/runtime.v1.ImageService/RemoveImage"
_REF_NAME = "org.opencontainers.image.ref.name"
# what a storage path or option may hold inside skopeo's "[driver@root+runroot:options]" (no brackets: they end it)
_SPEC_SAFE = re.compile(r"[^\[\]\s]+")


class CrioError(ImageStoreError):
    """The node's CRI-O (or skopeo writing into its store) refused or could not be reached; the message says
    which call and why."""


# ------------------------------------------------------------------------------------------ CRI messages


def image_spec_request(image: str) -> bytes:
    """ImageStatusRequest / RemoveImageRequest: ``{image = 1: ImageSpec{image = 1}}`` (the same two fields)."""
    return _len(1, _str(1, image))


def cri_version(response: bytes) -> tuple[str, str]:
    """CRI ``VersionResponse``: (runtime_name = 2, runtime_version = 3)."""
    fields = {f: v for f, v in decode_fields(response) if isinstance(v, bytes)}
    return fields.get(2, b"").decode(errors="replace"), fields.get(3, b"").decode(errors="replace")


def cri_image_digests(response: bytes) -> tuple[str, list[str], dict[str, str]] | None:
    """CRI ``ImageStatusResponse``: None when there is no such image (no ``image = 1``), else the image's id, its
    repo_digests (3) and the annotations of its spec (7: ImageSpec, annotations = 2, a map)."""
    image = next((v for f, v in decode_fields(response) if f == 1 and isinstance(v, bytes)), None)
    if image is None:
        return None
    ident, digests, annotations = "", [], {}
    for field, value in decode_fields(image):
        if not isinstance(value, bytes):
            continue
        if field == 1:
            ident = value.decode(errors="replace")
        elif field == 3:
            digests.append(value.decode(errors="replace"))
        elif field == 7:
            for sub, entry in decode_fields(value):
                if sub == 2 and isinstance(entry, bytes):
                    kv = {k: v for k, v in decode_fields(entry) if isinstance(v, bytes)}
                    annotations[kv.get(1, b"").decode(errors="replace")] = kv.get(2, b"").decode(errors="replace")
    return ident, digests, annotations


def storage_location(config: dict[str, Any]) -> tuple[str, str, str, list[str]]:
    """(driver, graphroot, runroot, options) of the store CRI-O's effective config names (its ``[crio]`` table:
    ``storage_driver``, ``root``, ``runroot``, ``storage_option``), checked to be passable to skopeo."""
    crio: dict[str, Any] = config["crio"] if isinstance(config.get("crio"), dict) else {}
    driver, root, runroot = crio.get("storage_driver") or "", crio.get("root") or "", crio.get("runroot") or ""
    options = [str(o) for o in crio.get("storage_option") or []]
    for what, value in (("root", root), ("runroot", runroot)):
        if not isinstance(value, str) or not value.startswith("/") or not _SPEC_SAFE.fullmatch(value):
            raise CrioError(f"CRI-O's config names no usable storage {what}: {value!r}")
    for value in [driver, *options]:
        if not isinstance(value, str) or (value and not _SPEC_SAFE.fullmatch(value)):
            raise CrioError(f"CRI-O's storage driver or option cannot be passed to skopeo: {value!r}")
    return driver, root, runroot, options


def storage_spec(config: dict[str, Any]) -> str:
    """skopeo's ``[driver@graphroot+runroot:option,...]`` for that store."""
    driver, root, runroot, options = storage_location(config)
    head = f"{driver}@{root}+{runroot}" if driver else f"{root}+{runroot}"
    return f"[{head}:{','.join(options)}]" if options else f"[{head}]"


def _ref_name(layout: Path) -> str:
    """The one image name ``write_oci_layout`` gave the layout (its index's ``ref.name`` annotation)."""
    try:
        index = json.loads((layout / "index.json").read_text())
        names = [m["annotations"][_REF_NAME] for m in index["manifests"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CrioError(f"{layout} is not an OCI layout with a named image: {exc}") from None
    if len(names) != 1 or not isinstance(names[0], str) or not names[0]:
        raise CrioError(f"{layout} must hold exactly one named image, not {names!r}")
    return names[0]


# ------------------------------------------------------------------------------------------ the client


class CrioImporter:
    """One node's CRI-O: its socket (CRI gRPC and the HTTP info API) and, through skopeo, its image store."""

    kind = "cri-o"

    def __init__(self, socket: str, skopeo: str = "skopeo", timeout_seconds: float = 300.0) -> None:
        self.socket = socket
        self.skopeo = skopeo
        self.timeout = timeout_seconds

    async def _http(self, path: str) -> bytes:
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=10)
        try:
            async with (
                aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=self.socket), timeout=timeout) as s,
                s.get(f"http://crio{path}") as resp,
            ):
                body = await resp.read()
                if resp.status != 200:
                    raise CrioError(f"CRI-O GET {path} answered {resp.status}: {body[:200]!r}")
                return body
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise CrioError(f"CRI-O GET {path} on {self.socket}: {exc}") from None

    async def config(self) -> dict[str, Any]:
        """CRI-O's effective configuration (``GET /config``, TOML)."""
        raw = await self._http("/config")
        try:
            return tomllib.loads(raw.decode())
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise CrioError(f"CRI-O's /config is not TOML: {exc}") from None

    async def _cri(self, method: str, request: bytes) -> bytes:
        import grpc

        channel: Any = grpc.aio.insecure_channel(f"unix://{self.socket}")
        async with channel as ch:
            try:
                response: bytes = await ch.unary_unary(method)(request, timeout=30)
            except grpc.aio.AioRpcError as exc:
                raise CrioError(f"CRI-O {method.rsplit('/', 1)[-1]}: {exc.code().name}: {exc.details()}") from None
        return response

    async def check(self) -> None:
        """Reachable, and its store can be written from here (the directories CRI-O names are mounted)."""
        if not Path(self.socket).exists():
            raise CrioError(f"no CRI-O socket at {self.socket} (mount the node's socket into the agent)")
        _driver, root, runroot, _options = storage_location(await self.config())
        for d in (root, runroot):
            if not Path(d).is_dir():
                raise CrioError(f"CRI-O's image store {d} is not mounted into the agent at that path")

    async def runtime(self) -> tuple[str, dict[str, Any] | None]:
        """(CRI-O's version, its effective config or None when it cannot be read): what
        ``crio_restore_support`` decides from."""
        name, version = cri_version(await self._cri(_CRI_VERSION, _str(1, "v1")))
        if name and name.lower() not in ("cri-o", "crio"):
            raise CrioError(f"the socket {self.socket} is {name} {version}, not CRI-O")
        try:
            config: dict[str, Any] | None = await self.config()
        except CrioError:
            config = None
        return version, config

    async def image_digest(self, ref: str) -> str | None:
        """The manifest digest CRI-O reports for ``ref`` (``<name>@sha256:...`` among its repo digests), or None
        if there is no such image."""
        status = cri_image_digests(await self._cri(_CRI_IMAGE_STATUS, image_spec_request(ref)))
        if status is None:
            return None
        _id, digests, _annotations = status
        for d in digests:
            if "@" in d:
                return d.rsplit("@", 1)[1]
        return None

    async def image_annotations(self, ref: str) -> dict[str, str] | None:
        status = cri_image_digests(await self._cri(_CRI_IMAGE_STATUS, image_spec_request(ref)))
        return None if status is None else status[2]

    async def delete_image(self, ref: str) -> None:
        """Gone already is fine (a discard may be asked twice)."""
        if cri_image_digests(await self._cri(_CRI_IMAGE_STATUS, image_spec_request(ref))) is not None:
            await self._cri(_CRI_REMOVE_IMAGE, image_spec_request(ref))

    async def import_layout(self, layout: Path, prefix: str) -> None:
        """Copy the layout's one image into CRI-O's store under its own name (which must start with ``prefix``)."""
        name = _ref_name(layout)
        if not name.startswith(prefix.rstrip("/") + "/"):
            raise CrioError(f"refusing to import {name!r}: not under this agent's prefix {prefix!r}")
        spec = storage_spec(await self.config())
        # --insecure-policy: the image is the one this agent just wrote from a verified transfer, not a pull; the
        # node's /etc/containers/policy.json (absent in the agent's image) governs pulls, not this copy.
        # --tmpdir: skopeo stages blobs in /var/tmp by default, read-only in the agent's pod (and /tmp is a small
        # memory volume); a checkpoint holds the container's memory, so stage beside the layout, on the agent's
        # state volume. --preserve-digests: the stored manifest is ours byte for byte (image_digest checks it).
        tmp = layout.parent / f"{layout.name}.skopeo-tmp"
        tmp.mkdir(exist_ok=True)
        argv = [self.skopeo, "--insecure-policy", "--tmpdir", str(tmp), "copy", "--quiet", "--preserve-digests",
                f"oci:{layout}:{name}", f"containers-storage:{spec}{name}"]  # fmt: skip
        try:
            await self._skopeo(argv, name)
        finally:
            await asyncio.to_thread(shutil.rmtree, tmp, True)

    async def _skopeo(self, argv: list[str], name: str) -> None:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
        except OSError as exc:
            raise CrioError(f"cannot run {self.skopeo}: {exc}") from None
        try:
            _out, err = await asyncio.wait_for(proc.communicate(), self.timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise CrioError(f"skopeo copy of {name} into CRI-O's store took over {self.timeout:g} s") from None
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip()[-600:]
            raise CrioError(f"skopeo copy of {name} into CRI-O's store failed ({proc.returncode}): {tail}")
