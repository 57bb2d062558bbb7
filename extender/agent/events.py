"""Kubernetes Events for migrations that involve a pod (the kubelet and simulated backends)."""

from __future__ import annotations

import logging
import socket
from datetime import UTC, datetime
from typing import Any, Protocol

from extender.agent.backends.base import WorkloadRef

__all__ = ["EventSink", "KubeEventSink", "NullEventSink", "RecordingEventSink"]

log = logging.getLogger("extender.agent.events")
COMPONENT = "qos-extender-agent"


class EventSink(Protocol):
    async def emit(self, ref: WorkloadRef, reason: str, message: str, *, warning: bool) -> None: ...


class NullEventSink:
    async def emit(self, ref: WorkloadRef, reason: str, message: str, *, warning: bool) -> None:
        return None


class RecordingEventSink:
    """Keeps events in memory (tests)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, bool]] = []

    async def emit(self, ref: WorkloadRef, reason: str, message: str, *, warning: bool) -> None:
        if ref.pod_key is not None:
            self.events.append((ref.pod_key, reason, message, warning))


def event_body(ref: WorkloadRef, reason: str, message: str, warning: bool, instance: str) -> dict[str, Any]:
    now = datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{ref.pod}.", "namespace": ref.namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": ref.pod, "namespace": ref.namespace},
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": COMPONENT, "host": instance},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class KubeEventSink:
    """Posts core/v1 Events; an API error is logged, never fatal to a migration."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes_asyncio import client as k8s

        self._core = k8s.CoreV1Api(api_client)
        self._instance = socket.gethostname()

    async def emit(self, ref: WorkloadRef, reason: str, message: str, *, warning: bool) -> None:
        if ref.pod_key is None or ref.namespace is None:
            return
        body: Any = event_body(ref, reason, message, warning, self._instance)
        try:
            await self._core.create_namespaced_event(ref.namespace, body)
        except Exception as exc:  # any API failure only costs the Event
            log.warning("cannot post event", extra={"workload": ref.pod_key, "error": str(exc)})
