"""The ``simulated`` backend — SIMULATION for kwok nodes, which run no containers; never a real checkpoint.

A pod's "progress" (seconds of work done) lives in a ``ProgressStore``: in memory for unit tests, or the pod
annotation ``qos.kube-qos-extender.io/progress-seconds`` (``KubeAnnotationProgressStore``) so an e2e can
check that a migrated pod resumes where it stopped. The "image" is a JSON file with that progress; it goes
through the very same protocol (pre-copy, verified transfer, cutover, restore, rollback) as a CRIU image.

- checkpoint: read the source pod's progress (the final one also marks the source stopped);
- restore: write the progress onto the destination pod (``destination.workload`` of the migration request,
  created by the controller) — or back onto the source pod on rollback;
- stop: clear the source's progress (deleting the source pod is the controller's job, as with the kubelet).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Protocol

from extender.agent.backends.base import BackendError, CheckpointResult, WorkloadNotFoundError, WorkloadRef
from extender.core.model import ANNOTATION_PREFIX

__all__ = [
    "PROGRESS_ANNOTATION",
    "STOPPED_ANNOTATION",
    "InMemoryProgressStore",
    "KubeAnnotationProgressStore",
    "ProgressStore",
    "SimulatedBackend",
]

PROGRESS_ANNOTATION = ANNOTATION_PREFIX + "progress-seconds"
STOPPED_ANNOTATION = ANNOTATION_PREFIX + "simulated-stopped"
_IMAGE = "progress.json"


class ProgressStore(Protocol):
    async def get(self, namespace: str, pod: str) -> tuple[float, bool]:
        """(progress seconds, stopped); raises WorkloadNotFoundError for an unknown pod."""
        ...

    async def put(self, namespace: str, pod: str, progress: float | None, stopped: bool) -> None:
        """Set the progress (None: remove it) and the stopped flag."""
        ...


class InMemoryProgressStore:
    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], tuple[float | None, bool]] = {}

    async def get(self, namespace: str, pod: str) -> tuple[float, bool]:
        if (namespace, pod) not in self.pods:
            raise WorkloadNotFoundError(f"pod {namespace}/{pod} not found")
        progress, stopped = self.pods[(namespace, pod)]
        return (progress or 0.0), stopped

    async def put(self, namespace: str, pod: str, progress: float | None, stopped: bool) -> None:
        self.pods[(namespace, pod)] = (progress, stopped)


def _parse_progress(raw: str | None) -> float:
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise BackendError(f"{PROGRESS_ANNOTATION}={raw!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise BackendError(f"{PROGRESS_ANNOTATION}={raw!r} must be a finite number >= 0")
    return value


class KubeAnnotationProgressStore:
    """Progress in pod annotations, through kubernetes_asyncio (merge patch of metadata.annotations)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes_asyncio import client as k8s

        self._core = k8s.CoreV1Api(api_client)

    async def get(self, namespace: str, pod: str) -> tuple[float, bool]:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            obj = await self._core.read_namespaced_pod(pod, namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise WorkloadNotFoundError(f"pod {namespace}/{pod} not found") from None
            raise BackendError(f"reading pod {namespace}/{pod}: {exc.status} {exc.reason}") from None
        annotations = obj.metadata.annotations or {}
        return _parse_progress(annotations.get(PROGRESS_ANNOTATION)), annotations.get(STOPPED_ANNOTATION) == "true"

    async def put(self, namespace: str, pod: str, progress: float | None, stopped: bool) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        body = {
            "metadata": {
                "annotations": {
                    PROGRESS_ANNOTATION: None if progress is None else repr(float(progress)),
                    STOPPED_ANNOTATION: "true" if stopped else None,
                }
            }
        }
        try:
            await self._core.patch_namespaced_pod(pod, namespace, body)
        except ApiException as exc:
            raise BackendError(f"patching pod {namespace}/{pod}: {exc.status} {exc.reason}") from None


class SimulatedBackend:
    name = "simulated"
    fenced_by_pid = False

    def __init__(self, store: ProgressStore) -> None:
        self.store = store

    async def features(self) -> dict[str, Any]:
        return {"simulated": True, "dirty_tracking": False}

    def precopy_is_incremental(self) -> bool:
        return False

    def validate(self, ref: WorkloadRef) -> None:
        if not ref.namespace or not ref.pod:
            raise ValueError("the simulated backend migrates pods: workload.namespace and workload.pod are required")

    async def checkpoint(
        self, ref: WorkloadRef, image_dir: Path, *, leave_running: bool, parent_dir: Path | None = None
    ) -> CheckpointResult:
        self.validate(ref)
        assert ref.namespace and ref.pod
        progress, stopped = await self.store.get(ref.namespace, ref.pod)
        if stopped:
            raise WorkloadNotFoundError(f"pod {ref.pod_key} is stopped")
        if not leave_running:
            await self.store.put(ref.namespace, ref.pod, progress, stopped=True)
        image_dir.mkdir(parents=True, exist_ok=True)
        image = {"namespace": ref.namespace, "pod": ref.pod, "progress_seconds": progress}
        (image_dir / _IMAGE).write_text(json.dumps(image))
        return CheckpointResult(image_dir, {"identity": ref.pod_key, "simulated": True}, progress)

    def image_complete(self, image_dir: Path) -> bool:
        return (image_dir / _IMAGE).is_file()

    async def prepare(self, meta: dict[str, Any]) -> None:
        if not meta.get("simulated"):
            raise BackendError("a simulated agent restores only simulated images")

    async def restore(self, image_dir: Path, meta: dict[str, Any], target: WorkloadRef | None) -> WorkloadRef:
        try:
            image = json.loads((image_dir / _IMAGE).read_text())
            progress = _parse_progress(str(image["progress_seconds"]))
            source = WorkloadRef(namespace=str(image["namespace"]), pod=str(image["pod"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BackendError(f"simulated image unreadable: {exc}") from None
        dest = target if target is not None and target.pod else source
        assert dest.namespace and dest.pod
        await self.store.put(dest.namespace, dest.pod, progress, stopped=False)
        return WorkloadRef(namespace=dest.namespace, pod=dest.pod)

    async def is_running(self, ref: WorkloadRef, meta: dict[str, Any]) -> bool:
        if not ref.namespace or not ref.pod:
            return False
        try:
            _, stopped = await self.store.get(ref.namespace, ref.pod)
        except WorkloadNotFoundError:
            return False
        return not stopped

    async def stop(self, ref: WorkloadRef, meta: dict[str, Any]) -> None:
        if ref.namespace and ref.pod:
            try:
                await self.store.put(ref.namespace, ref.pod, None, stopped=True)
            except WorkloadNotFoundError:
                return

    async def quiesce(self, state_dir: Path, timeout: float) -> None:
        return None

    async def close(self) -> None:
        return None
