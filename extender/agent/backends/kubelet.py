"""The ``kubelet`` backend: KEP-2008 container checkpoints at the source, an OCI checkpoint image at the destination.

CANNOT RUN HERE (no kubelet, no CRI-O/containerd): only the request construction, the archive naming and the
OCI image layout/annotations are tested. What it does on a real node:

- checkpoint: ``POST https://<node>:10250/checkpoint/{ns}/{pod}/{container}?timeout=s`` with a client cert the
  kubelet authorises for ``nodes/checkpoint`` (feature gate ContainerCheckpoint, beta and on since 1.30). The
  kubelet answers ``{"items": ["/var/lib/kubelet/checkpoints/checkpoint-<pod>_<ns>-<container>-<RFC3339>.tar"]}``;
  the agent (a DaemonSet with that hostPath) copies the tar into the migration's image directory. The kubelet
  always leaves the container running: the final checkpoint is followed by deleting the source pod (the
  controller's job), so the protocol's final image is taken the same way.
- restore: the checkpoint tar becomes the single layer of an OCI image layout with the checkpoint annotations
  CRI-O (``enable_criu_support``) and containerd >= 2.1 look for (``org.criu.checkpoint.container.name``;
  older CRI-O: ``io.kubernetes.cri-o.annotations.checkpoint.name``). Pushing it to a registry the destination
  node can pull from, and creating the destination pod with that image, are left to the controller.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import ssl
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from extender.agent.backends.base import BackendError, CheckpointResult, WorkloadNotFoundError, WorkloadRef
from extender.agent.config import KubeletConfig

__all__ = [
    "CRIO_LEGACY_NAME_ANNOTATION",
    "KubeletBackend",
    "checkpoint_annotations",
    "checkpoint_archive_name",
    "checkpoint_url",
    "write_oci_layout",
]

CRIO_LEGACY_NAME_ANNOTATION = "io.kubernetes.cri-o.annotations.checkpoint.name"
_LAYER_MEDIA = "application/vnd.oci.image.layer.v1.tar"
_CONFIG_MEDIA = "application/vnd.oci.image.config.v1+json"
_MANIFEST_MEDIA = "application/vnd.oci.image.manifest.v1+json"
_INDEX_MEDIA = "application/vnd.oci.image.index.v1+json"
_ARCHIVE = "checkpoint.tar"


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
    shutil.copyfile(archive, layout / "blobs" / "sha256" / layer_digest)
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

    def __init__(self, node_address: str, config: KubeletConfig) -> None:
        self.node = node_address
        self.config = config

    async def features(self) -> dict[str, Any]:
        return {"kubelet": f"{self.node}:{self.config.port}", "dirty_tracking": False}

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
        image_dir.mkdir(parents=True, exist_ok=True)
        src = Path(str(items[0]))
        try:
            shutil.copyfile(src, image_dir / _ARCHIVE)
            src.unlink()  # nothing else cleans /var/lib/kubelet/checkpoints, and the tar holds secrets
        except OSError as exc:
            raise BackendError(f"cannot read kubelet archive {src}: {exc}") from None
        return CheckpointResult(image_dir, {"identity": str(ref), "kubelet_archive": src.name, **ref.to_json()})

    def image_complete(self, image_dir: Path) -> bool:
        return (image_dir / _ARCHIVE).is_file()

    async def prepare(self, meta: dict[str, Any]) -> None:
        if "kubelet_archive" not in meta:
            raise BackendError("a kubelet agent restores only kubelet checkpoint archives")

    async def restore(self, image_dir: Path, meta: dict[str, Any], target: WorkloadRef | None) -> WorkloadRef:
        source = WorkloadRef.from_json({k: meta[k] for k in ("namespace", "pod", "container") if k in meta})
        dest = target or source
        layout = image_dir / "oci"
        digest = write_oci_layout(
            image_dir / _ARCHIVE, layout, checkpoint_annotations(source), f"checkpoint-{source.pod}"
        )
        raise BackendError(
            f"OCI checkpoint image written ({layout}, {digest}); creating pod {dest.pod_key} from it needs a registry "
            "and a CRI runtime with checkpoint support, which this agent does not drive"
        )

    async def is_running(self, ref: WorkloadRef, meta: dict[str, Any]) -> bool:
        # A kubelet checkpoint never stops the container: the source runs until the controller deletes its pod.
        return True

    async def stop(self, ref: WorkloadRef, meta: dict[str, Any]) -> None:
        return None  # the controller deletes the source pod

    async def quiesce(self, state_dir: Path, timeout: float) -> None:
        return None

    async def close(self) -> None:
        return None
