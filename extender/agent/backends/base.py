"""The runtime backend interface: what the migration protocol needs from CRIU, the kubelet or a simulation."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "Backend",
    "BackendError",
    "CheckpointResult",
    "WorkloadNotFoundError",
    "WorkloadRef",
]


class BackendError(Exception):
    """A backend operation failed; the message is the reason reported in the outcome."""


class WorkloadNotFoundError(BackendError):
    """The workload to checkpoint does not exist (or is not running)."""


@dataclass(frozen=True, slots=True)
class WorkloadRef:
    """What is migrated: a process (criu) or a pod's container (kubelet, simulated)."""

    pid: int | None = None
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    image: str | None = None  # kubelet backend, destination: the checkpoint image the new pod is created from

    @property
    def pod_key(self) -> str | None:
        return f"{self.namespace}/{self.pod}" if self.namespace and self.pod else None

    def to_json(self) -> dict[str, Any]:
        return {
            k: v
            for k, v in (
                ("pid", self.pid),
                ("namespace", self.namespace),
                ("pod", self.pod),
                ("container", self.container),
                ("image", self.image),
            )
            if v is not None
        }

    @staticmethod
    def from_json(raw: Any) -> WorkloadRef:
        if not isinstance(raw, dict):
            raise ValueError("workload must be an object")
        unknown = set(raw) - {"pid", "namespace", "pod", "container", "image"}
        if unknown:
            raise ValueError(f"unknown workload field(s): {', '.join(sorted(unknown))}")
        pid = raw.get("pid")
        if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1):
            raise ValueError(f"workload.pid must be an integer > 1, got {pid!r}")
        for k in ("namespace", "pod", "container"):
            v = raw.get(k)
            if v is not None and (not isinstance(v, str) or not v or len(v) > 253 or "/" in v):
                raise ValueError(f"workload.{k} must be a non-empty name, got {v!r}")
        image = raw.get("image")
        if image is not None and not (isinstance(image, str) and 0 < len(image) <= 512 and image.strip() == image):
            raise ValueError(f"workload.image must be an image reference, got {image!r}")
        return WorkloadRef(pid, raw.get("namespace"), raw.get("pod"), raw.get("container"), image)

    def __str__(self) -> str:
        if self.pid is not None:
            return f"pid {self.pid}"
        return "/".join(p for p in (self.namespace, self.pod, self.container) if p)


@dataclass(frozen=True, slots=True)
class CheckpointResult:
    """What a checkpoint produced: the image directory and the metadata the destination needs to restore."""

    image_dir: Path
    meta: dict[str, Any] = field(default_factory=dict)  # identity, shell_job, parent, ... (JSON-safe)
    work_seconds: float = 0.0  # work the image preserves (process age, or simulated progress)


class Backend(Protocol):
    """Every method may raise BackendError with a human-readable reason."""

    name: str
    fenced_by_pid: bool  # a restore is refused while the original PID is taken (CRIU: same PID on restore)

    async def features(self) -> dict[str, Any]: ...

    def validate(self, ref: WorkloadRef) -> None:
        """Raise ValueError if ``ref`` does not name a workload this backend can move."""
        ...

    async def checkpoint(
        self, ref: WorkloadRef, image_dir: Path, *, leave_running: bool, parent_dir: Path | None = None
    ) -> CheckpointResult: ...

    def image_complete(self, image_dir: Path) -> bool:
        """A checkpoint in ``image_dir`` finished (used by restart reconciliation)."""
        ...

    def precopy_is_incremental(self) -> bool:
        """True when the final dump is incremental on the pre-copy image (needs dirty-page tracking)."""
        ...

    async def prepare(self, meta: dict[str, Any]) -> None:
        """Destination: refuse early (BackendError) if this node cannot restore such an image."""
        ...

    async def restore(self, image_dir: Path, meta: dict[str, Any], target: WorkloadRef | None) -> WorkloadRef: ...

    async def is_running(self, ref: WorkloadRef, meta: dict[str, Any]) -> bool: ...

    async def stop(self, ref: WorkloadRef, meta: dict[str, Any]) -> None:
        """Source, after the destination confirmed: make sure the original is gone."""
        ...

    async def quiesce(self, state_dir: Path, timeout: float) -> None:
        """At startup: wait for operations a previous incarnation of this agent left running (a criu child
        survives the agent's SIGKILL) to finish, so reconciliation sees their final effect."""
        ...

    async def close(self) -> None: ...
