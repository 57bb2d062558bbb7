"""Events of the autoscaler (TriggeredScaleUp, NotServableByAnyFlavour, ProvisioningTimedOut, ScaleDownEmpty,
UnderutilizedBatchNode, ScaleUpGaveUp) through the shared ``KubeEventSink`` queue and worker.

The shared sink only knows the InvalidQoSAnnotation Event on pods; this subclass adds ``emit`` for any reason
on a Pod or a Node and otherwise reuses its bounded queue, its background poster and its error handling.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

from extender.autoscaler.loop import Notice
from extender.kube.events import KubeEventSink

__all__ = ["AutoscalerEvents", "notice_event"]

log = logging.getLogger("extender.autoscaler.events")


def notice_event(notice: Notice, component: str, instance: str) -> dict[str, Any]:
    now = datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    namespace = notice.namespace or "default"  # Events about cluster-scoped Nodes live in "default"
    involved: dict[str, Any] = {"apiVersion": "v1", "kind": notice.kind, "name": notice.name}
    if notice.kind == "Pod":
        involved["namespace"] = notice.namespace
    if notice.uid:
        involved["uid"] = notice.uid
    elif notice.kind == "Node":
        involved["uid"] = notice.name  # kubelet's convention for Node events
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{notice.name}.", "namespace": namespace},
        "involvedObject": involved,
        "reason": notice.reason,
        "message": notice.message[:1024],
        "type": "Warning" if notice.warning else "Normal",
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class AutoscalerEvents(KubeEventSink):
    def emit(self, notice: Notice) -> None:
        try:
            self._queue.put_nowait(notice_event(notice, self._component, self._instance))
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning("event queue full, event dropped", extra={"object": f"{notice.kind}/{notice.name}"})
