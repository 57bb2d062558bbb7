"""Kubernetes Events on pods whose qos.kube-qos-extender.io/ annotations are malformed.

``report`` never blocks a verb: it queues, and one background task posts core/v1 Events. Each (pod UID,
problem) is reported once per process, however many filter calls and watch events show the same pod.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client as k8s

from extender.kube.client import ApiError, read_json
from extender.kube.convert import PodProblems

__all__ = ["EVENT_REASON", "KubeEventSink"]

log = logging.getLogger("extender.kube.events")

EVENT_REASON = "InvalidQoSAnnotation"
_SEEN_LIMIT = 50_000
_QUEUE_LIMIT = 1_000


class KubeEventSink:
    def __init__(self, api_client: Any, component: str, timeout_seconds: float = 10.0) -> None:
        self._core = k8s.CoreV1Api(api_client)
        self._component = component
        self._instance = socket.gethostname()
        self._timeout = timeout_seconds
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(_QUEUE_LIMIT)
        self._seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self.posted = 0
        self.dropped = 0

    def report(self, problems: PodProblems) -> None:
        for problem in problems.problems:
            key = (problems.uid or f"{problems.namespace}/{problems.name}", problem.key, problem.message)
            if key in self._seen:
                continue
            self._seen[key] = None
            if len(self._seen) > _SEEN_LIMIT:
                self._seen.popitem(last=False)
            try:
                self._queue.put_nowait(self._event(problems, f"{problem.key}: {problem.message}"))
            except asyncio.QueueFull:
                self.dropped += 1
                log.warning("event queue full, event dropped", extra={"pod": f"{problems.namespace}/{problems.name}"})

    def _event(self, problems: PodProblems, message: str) -> dict[str, Any]:
        now = datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{problems.name}.", "namespace": problems.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": problems.name,
                "namespace": problems.namespace,
                "uid": problems.uid,
            },
            "reason": EVENT_REASON,
            "message": message[:1024],
            "type": "Warning",
            "source": {"component": self._component},
            "reportingComponent": self._component,
            "reportingInstance": self._instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }

    async def run(self) -> None:
        """Post queued Events until cancelled; an API error is logged, never fatal."""
        while True:
            event: Any = await self._queue.get()
            namespace = event["metadata"]["namespace"]
            try:
                response = await self._core.create_namespaced_event(
                    namespace, event, _preload_content=False, _request_timeout=self._timeout
                )
                await read_json(response)
                self.posted += 1
            except (ApiError, TimeoutError, OSError) as exc:
                log.warning(
                    "could not post event",
                    extra={"pod": f"{namespace}/{event['involvedObject']['name']}", "error": str(exc)},
                )
            except Exception as exc:  # aiohttp.ClientError and anything else: keep the worker alive
                log.warning("could not post event", extra={"error": repr(exc)})
            finally:
                self._queue.task_done()

    async def drain(self) -> None:
        await self._queue.join()
