"""The ``kubelet`` backend: KEP-2008 container checkpoints at the source, an OCI checkpoint image at the destination.

Ran for real on this project's real kubelet nodes (hack/real-nodes.sh; e2e/test_migration_real.py):

- checkpoint: ``POST https://<node>:10250/checkpoint/{ns}/{pod}/{container}?timeout=s`` with a client cert the
  kubelet authorises for ``nodes/checkpoint`` (feature gate ContainerCheckpoint, beta and on since 1.30). The
  kubelet answers ``{"items": ["<root-dir>/checkpoints/checkpoint-<pod>_<ns>-<container>-<RFC3339>.tar"]}``, a
  path on the node; the agent (a DaemonSet) has that directory mounted at ``kubelet.checkpoint_dir`` and opens
  the archive of that *name* there (``archive_in``), copies it into the migration's image directory and unlinks
  the kubelet's copy. The kubelet always leaves the container running: the source pod is deleted by the
  controller once the destination runs, so the protocol's final image is taken the same way.
- restore: the checkpoint tar becomes the single layer of an OCI image layout with the checkpoint annotations
  containerd >= 2.1 (``enable_experimental_restore_via_create``) and CRI-O look for
  (``org.criu.checkpoint.container.name``; older CRI-O: ``io.kubernetes.cri-o.annotations.checkpoint.name``),
  imported and unpacked into the node's containerd through its Transfer API (``extender.agent.containerd``; no
  registry, no ``ctr``) as ``<image_prefix>/<namespace>-<pod>:<layer sha256[:20]>``. The restored workload
  names that image; the controller creates the destination pod from it (``imagePullPolicy: Never``), and
  containerd restores the container instead of starting it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import ssl
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from extender.agent.backends.base import BackendError, CheckpointResult, WorkloadNotFoundError, WorkloadRef
from extender.agent.containerd import ContainerdImporter, ImageStoreError
from extender.agent.crio import CrioImporter
from extender.agent.settings import KubeletConfig

__all__ = [
    "CRIO_LEGACY_NAME_ANNOTATION",
    "KubeletBackend",
    "archive_in",
    "checkpoint_annotations",
    "checkpoint_archive_name",
    "checkpoint_image_ref",
    "checkpoint_url",
    "crio_restore_support",
    "write_oci_layout",
]

CRIO_LEGACY_NAME_ANNOTATION = "io.kubernetes.cri-o.annotations.checkpoint.name"
_LAYER_MEDIA = "application/vnd.oci.image.layer.v1.tar"
_CONFIG_MEDIA = "application/vnd.oci.image.config.v1+json"
_MANIFEST_MEDIA = "application/vnd.oci.image.manifest.v1+json"
_INDEX_MEDIA = "application/vnd.oci.image.index.v1+json"
_ARCHIVE = "checkpoint.tar"
# checkpoint-<pod>_<namespace>-<container>-<RFC3339>.tar: DNS names, "_", and the timestamp's ":" "+" "."
_KUBELET_ARCHIVE_RE = re.compile(r"checkpoint-[A-Za-z0-9][A-Za-z0-9._:+-]*\.tar")
_REPO_COMPONENT_RE = re.compile(r"[^a-z0-9]+")


def archive_in(checkpoint_dir: str | Path, returned: object) -> Path:
    """Where this agent reads the archive the kubelet named: ``checkpoint_dir`` / its file name.

    The kubelet answers a path on the *node* (``<root-dir>/checkpoints/...``); the agent sees that directory
    wherever it is mounted. Only a plain kubelet archive name is accepted: no other directory, no traversal."""
    if not isinstance(returned, str) or not returned or "\0" in returned:
        raise BackendError(f"kubelet answered an archive path that is not a path: {returned!r}")
    name = returned.rsplit("/", 1)[-1]
    if not _KUBELET_ARCHIVE_RE.fullmatch(name) or ".." in name:
        raise BackendError(f"kubelet answered an unexpected archive name {name!r} (from {returned!r})")
    return Path(checkpoint_dir) / name


def checkpoint_image_ref(prefix: str, namespace: str, pod: str, layer_digest: str) -> str:
    """``<prefix>/<namespace>-<pod>:<sha256[:20]>``: a valid reference, unique per checkpoint archive."""
    repo = _REPO_COMPONENT_RE.sub("-", f"{namespace}-{pod}".lower()).strip("-")[:120].strip("-") or "pod"
    digest = layer_digest.removeprefix("sha256:")
    if not re.fullmatch(r"[0-9a-f]{20,64}", digest):
        raise ValueError(f"not a sha256 digest: {layer_digest!r}")
    return f"{prefix.rstrip('/')}/{repo}:{digest[:20]}"


def restore_support(version: str, cri_config: Mapping[str, Any] | None) -> tuple[bool | None, str]:
    """Can a containerd of ``version`` with this CRI config restore a container from a checkpoint image? (True,
    False or None for "cannot tell", and why). Asked before any checkpoint (the flow reads it from the
    destination agent's ``GET /v1/info``), so a runtime that cannot restore costs no checkpoint.

    containerd restores through CRI CreateContainer from 2.1 on; 2.2 put it behind
    ``enable_experimental_restore_via_create`` (off by default from 2.2.7 / 2.3.4) and 2.4 removed it with no
    replacement: 2.4.0-2.4.2 have no restore path at all. Their RELEASES.md points to KEP-5823: the CRI's pod-level
    ``CheckpointPod`` / ``RestorePod`` (in cri-api v0.37, Kubernetes 1.37, alpha), which containerd 2.4.2 builds
    against but does not implement (the methods answer Unimplemented)."""
    m = re.match(r"v?(\d+)\.(\d+)\.(\d+)", version.strip())
    if not m:
        return None, f"containerd version {version!r} not understood"
    v = tuple(int(x) for x in m.groups())
    name = f"containerd {'.'.join(map(str, v))}"
    if v < (2, 1, 0):
        return False, f"{name} cannot restore a checkpoint image (restore through CreateContainer came in 2.1)"
    if v >= (2, 4, 0):
        why = "2.4, and its replacement (CRI RestorePod, KEP-5823) is not implemented by containerd yet"
        return False, f"{name} cannot restore a checkpoint: restore through CreateContainer was removed in {why}"
    flag = (cri_config or {}).get("enableExperimentalRestoreViaCreate")
    if flag is True:
        return True, f"{name} with enable_experimental_restore_via_create"
    if flag is False:
        return False, f"{name} has enable_experimental_restore_via_create off (set it true in the CRI runtime config)"
    if v < (2, 2, 0):
        return True, f"{name} restores through CreateContainer (not yet behind an option)"
    return None, f"{name} did not report enable_experimental_restore_via_create"


def crio_restore_support(version: str, config: Mapping[str, Any] | None) -> tuple[bool | None, str]:
    """Can this CRI-O restore a container from a checkpoint image? (True, False or None for "cannot tell", and
    why.) CRI-O restores through CreateContainer whenever ``enable_criu_support`` is on in its effective config
    (``GET /config``), which CRI-O itself turns off when it finds no ``criu`` on its PATH; a CRI-O that does not
    report the option (older than checkpoint support) cannot be told apart from one without it. CRI-O (1.34)
    refuses every restore while a global ``signature_policy`` is set ("signature validation is not supported for
    container restore", ``server/container_restore.go``); a per-namespace policy file (``signature_policy_dir``)
    does the same for that namespace's pods only, which this node-wide answer cannot see: such a restore fails at
    CreateContainer and the move rolls back."""
    name = f"CRI-O {version.strip() or '(version not reported)'}"
    if config is None:
        return None, f"{name}: its configuration could not be read (GET /config on its socket)"
    crio: dict[str, Any] = config["crio"] if isinstance(config.get("crio"), dict) else {}
    runtime, image = crio.get("runtime"), crio.get("image")
    flag = runtime.get("enable_criu_support") if isinstance(runtime, dict) else None
    policy = image.get("signature_policy") if isinstance(image, dict) else None
    if flag is True and policy:
        return False, (f"{name} refuses restores while a signature_policy is set ({policy}): CRI-O cannot verify "
                       "a checkpoint image's signature")  # fmt: skip
    if flag is True:
        return True, f"{name} with enable_criu_support"
    if flag is False:
        return False, (f"{name} has checkpoint/restore off (enable_criu_support = false in [crio.runtime], or no "
                       "criu on its PATH)")  # fmt: skip
    return None, f"{name} did not report enable_criu_support"


def checkpoint_url(node: str, port: int, ref: WorkloadRef, timeout_seconds: int) -> str:
    """The kubelet checkpoint endpoint (KEP-2008). IPv6 literals are bracketed; names are path-escaped."""
    if not (ref.namespace and ref.pod and ref.container):
        raise ValueError("a kubelet checkpoint needs workload.namespace, workload.pod and workload.container")
    if timeout_seconds <= 0:
        raise ValueError("checkpoint timeout must be > 0 seconds")
    host = f"[{node}]" if ":" in node and not node.startswith("[") else node
    path = "/".join(quote(p, safe="") for p in (ref.namespace, ref.pod, ref.container))
    return f"https://{host}:{port}/checkpoint/{path}?timeout={timeout_seconds}"


def checkpoint_archive_name(pod: str, namespace: str, container: str, when: datetime) -> str:
    """The kubelet's archive name: ``checkpoint-<pod>_<namespace>-<container>-<RFC3339>.tar``.

    (The kubelet formats the pod's full name as ``<pod>_<namespace>``; the shared notes' shorter
    ``checkpoint-<pod>-<container>-...`` omits the namespace.)
    """
    stamp = when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"checkpoint-{pod}_{namespace}-{container}-{stamp}.tar"


def checkpoint_annotations(ref: WorkloadRef, rootfs_image: str | None = None) -> dict[str, str]:
    """Annotations on the checkpoint image's manifest that make CRI-O / containerd restore instead of start."""
    if not (ref.namespace and ref.pod and ref.container):
        raise ValueError("checkpoint annotations need namespace, pod and container")
    out = {
        "org.criu.checkpoint.container.name": ref.container,
        CRIO_LEGACY_NAME_ANNOTATION: ref.container,
        "org.criu.checkpoint.pod.name": ref.pod,
        "org.criu.checkpoint.pod.namespace": ref.namespace,
    }
    if rootfs_image:
        out["org.criu.checkpoint.rootfsImageName"] = rootfs_image
    return out


def _blob(layout: Path, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return f"sha256:{digest}", len(data)


def write_oci_layout(archive: Path, layout: Path, annotations: dict[str, str], ref_name: str) -> str:
    """An OCI image layout in ``layout`` whose single layer is the checkpoint tar; returns the manifest digest."""
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with archive.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    layer_digest = h.hexdigest()
    blob = layout / "blobs" / "sha256" / layer_digest
    if not blob.exists():
        try:
            os.link(archive, blob)  # same directory tree: no second copy of a possibly large archive
        except OSError:
            shutil.copyfile(archive, blob)
    layer_size = archive.stat().st_size
    config = {
        "architecture": "amd64",
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        "config": {},
    }
    config_digest, config_size = _blob(layout, json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": _MANIFEST_MEDIA,
        "config": {"mediaType": _CONFIG_MEDIA, "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": _LAYER_MEDIA, "digest": f"sha256:{layer_digest}", "size": layer_size}],
        "annotations": dict(sorted(annotations.items())),
    }
    manifest_digest, manifest_size = _blob(layout, json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "mediaType": _INDEX_MEDIA,
        "manifests": [
            {
                "mediaType": _MANIFEST_MEDIA,
                "digest": manifest_digest,
                "size": manifest_size,
                "annotations": {"org.opencontainers.image.ref.name": ref_name, **annotations},
            }
        ],
    }
    (layout / "index.json").write_text(json.dumps(index, sort_keys=True))
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    return manifest_digest


class KubeletBackend:
    name = "kubelet"
    fenced_by_pid = False
    # The kubelet never stops the container it checkpoints, and every checkpoint is whole: one per move
    # (``Coordinator._migrate_single``), not a pre-copy that the final checkpoint would replace.
    single_checkpoint = True

    def __init__(
        self, node_address: str, config: KubeletConfig, importer: ContainerdImporter | CrioImporter | None = None
    ) -> None:
        self.node = node_address
        self.config = config
        if importer is None and config.runtime == "cri-o" and config.crio_socket:
            importer = CrioImporter(config.crio_socket, config.skopeo, config.import_timeout_seconds)
        elif importer is None and config.runtime == "containerd" and config.containerd_socket:
            importer = ContainerdImporter(
                config.containerd_socket, config.containerd_namespace, config.import_timeout_seconds
            )
        self.importer = importer
        self._restore: tuple[float, dict[str, Any]] | None = None

    def _no_runtime(self) -> str:
        key = "crio_socket" if self.config.runtime == "cri-o" else "containerd_socket"
        return f"this agent has no {self.config.runtime} socket configured (kubelet.{key})"

    async def features(self) -> dict[str, Any]:
        return {
            "kubelet": f"{self.node}:{self.config.port}",
            "checkpoint_dir": self.config.checkpoint_dir,
            "runtime": self.config.runtime,
            "containerd": self.config.containerd_socket if self.config.runtime == "containerd" else None,
            "crio": self.config.crio_socket if self.config.runtime == "cri-o" else None,
            "dirty_tracking": False,
            "restore": await self.restore_support(),
        }

    async def restore_support(self) -> dict[str, Any]:
        """This node's answer to "can you restore?" (``restore_support`` on what containerd says), asked again
        at most every 10 s (a containerd restarted with another config is seen soon)."""
        now = time.monotonic()
        if self._restore is not None and now - self._restore[0] < 10.0:
            return self._restore[1]
        if self.importer is None:
            answer: dict[str, Any] = {"supported": False, "reason": self._no_runtime()}
        else:
            rule = crio_restore_support if isinstance(self.importer, CrioImporter) else restore_support
            try:
                version, config = await self.importer.runtime()
                ok, why = rule(version, config)
                answer = {"supported": ok, "reason": why, "runtime": f"{self.importer.kind} {version}"}
            except ImageStoreError as exc:
                answer = {"supported": None, "reason": f"{self.importer.kind} not asked: {exc}"}
        self._restore = (now, answer)
        return answer

    def precopy_is_incremental(self) -> bool:
        return False

    def validate(self, ref: WorkloadRef) -> None:
        if not (ref.namespace and ref.pod and ref.container):
            raise ValueError("the kubelet backend needs workload.namespace, workload.pod and workload.container")

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.config.ca_file)
        if self.config.cert_file and self.config.key_file:
            ctx.load_cert_chain(self.config.cert_file, self.config.key_file)
        return ctx

    async def checkpoint(
        self, ref: WorkloadRef, image_dir: Path, *, leave_running: bool, parent_dir: Path | None = None
    ) -> CheckpointResult:
        import aiohttp

        self.validate(ref)
        url = checkpoint_url(self.node, self.config.port, ref, self.config.checkpoint_timeout_seconds)
        timeout = aiohttp.ClientTimeout(total=self.config.checkpoint_timeout_seconds + 30)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session, session.post(url, ssl=self._ssl()) as resp:
                body = await resp.text()
                if resp.status == 404:
                    raise WorkloadNotFoundError(f"kubelet: {ref} not found: {body[:200]}")
                if resp.status != 200:
                    raise BackendError(f"kubelet checkpoint answered {resp.status}: {body[:300]}")
                items = json.loads(body).get("items") or []
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise BackendError(f"kubelet checkpoint request failed: {exc}") from None
        if not items:
            raise BackendError("kubelet checkpoint answered without an archive path")
        src = archive_in(self.config.checkpoint_dir, items[0])
        image_dir.mkdir(parents=True, exist_ok=True)
        try:
            await asyncio.to_thread(shutil.copyfile, src, image_dir / _ARCHIVE)
        except OSError as exc:
            raise BackendError(f"cannot read kubelet archive {src} (kubelet answered {items[0]!r}): {exc}") from None
        finally:
            # nothing else cleans <root-dir>/checkpoints, and the tar holds the container's memory and secrets
            with contextlib.suppress(OSError):
                src.unlink()
        size = (image_dir / _ARCHIVE).stat().st_size
        meta = {"identity": str(ref), "kubelet_archive": src.name, "archive_bytes": size, **ref.to_json()}
        return CheckpointResult(image_dir, meta)

    def image_complete(self, image_dir: Path) -> bool:
        return (image_dir / _ARCHIVE).is_file()

    async def prepare(self, meta: dict[str, Any]) -> None:
        if "kubelet_archive" not in meta:
            raise BackendError("a kubelet agent restores only kubelet checkpoint archives")
        if self.importer is None:
            raise BackendError(self._no_runtime())
        try:
            await self.importer.check()
        except ImageStoreError as exc:
            raise BackendError(f"the node's {self.importer.kind} cannot take a checkpoint image: {exc}") from None

    async def restore(self, image_dir: Path, meta: dict[str, Any], target: WorkloadRef | None) -> WorkloadRef:
        """Import the checkpoint as an image into this node's containerd; the workload to create names it."""
        source = WorkloadRef.from_json({k: meta[k] for k in ("namespace", "pod", "container") if k in meta})
        dest = target or source
        if self.importer is None:
            raise BackendError(self._no_runtime())
        if not (source.namespace and source.pod and source.container and dest.namespace and dest.pod):
            raise BackendError("restore needs the source's namespace/pod/container and the destination pod")
        archive = image_dir / _ARCHIVE
        layout = image_dir / "oci"
        layer = await asyncio.to_thread(_sha256, archive)
        ref = checkpoint_image_ref(self.config.image_prefix, dest.namespace, dest.pod, layer)
        digest = await asyncio.to_thread(write_oci_layout, archive, layout, checkpoint_annotations(source), ref)
        try:
            await self.importer.import_layout(layout, self.config.image_prefix)
            got = await self.importer.image_digest(ref)
        except ImageStoreError as exc:
            raise BackendError(f"importing checkpoint image {ref}: {exc}") from None
        finally:
            await asyncio.to_thread(shutil.rmtree, layout, True)
        if got != digest:
            raise BackendError(f"{self.importer.kind} holds {ref} as {got}, not the imported manifest {digest}")
        return WorkloadRef(namespace=dest.namespace, pod=dest.pod, container=dest.container or source.container,
                           image=ref)  # fmt: skip

    async def discard(self, ref: WorkloadRef) -> None:
        """The checkpoint image of a restore nobody used (its pod never ran): delete it from containerd."""
        ours = self.config.image_prefix.rstrip("/") + "/"
        if self.importer is None or not ref.image or not ref.image.startswith(ours):
            raise BackendError(f"not a checkpoint image of this agent: {ref.image!r}")
        try:
            await self.importer.delete_image(ref.image)
        except ImageStoreError as exc:
            raise BackendError(str(exc)) from None

    async def is_running(self, ref: WorkloadRef, meta: dict[str, Any]) -> bool:
        # A kubelet checkpoint never stops the container: the source runs until the controller deletes its pod.
        return True

    async def stop(self, ref: WorkloadRef, meta: dict[str, Any]) -> None:
        return None  # the controller deletes the source pod

    async def quiesce(self, state_dir: Path, timeout: float) -> None:
        return None

    async def close(self) -> None:
        return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
