"""list+watch of Nodes and Pods into a Snapshot (the reflector pattern of client-go, in asyncio).

* list (paged) -> ``Snapshot.replace_*`` with the list's resourceVersion: the snapshot becomes ready only
  after both resources were listed completely;
* watch from that resourceVersion with bookmarks; every event is applied and advances the resume point;
  when the server closes the watch (``watch_timeout_seconds``) it resumes from the last resourceVersion;
* 410 Gone (resume point compacted away, or an expired list continue token) -> a fresh list;
* any other error (connection refused, 5xx, timeouts) -> reconnect with exponential backoff and jitter
  (tenacity), from the last resourceVersion when there is one.

Objects stay plain dicts (orjson), never the generated model classes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio import client as k8s
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential_jitter

from extender.kube.client import ApiError, read_json
from extender.kube.convert import PodProblems
from extender.kube.snapshot import Snapshot
from extender.settings.sections import KubernetesConfig

__all__ = ["Gone", "Reflector", "node_reflector", "pod_reflector"]

log = logging.getLogger("extender.kube.watch")

# kube-scheduler's pod informer leaves out terminal pods: they hold no resources.
POD_FIELD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"
LIST_PAGE = 500


class Gone(Exception):
    """410: the resourceVersion to resume from is too old; only a fresh list helps."""


class _Restart(Exception):
    """A transient failure; reconnect after backoff."""


ProblemSink = Callable[[PodProblems], None]
RestartHook = Callable[[str, str], None]


class Reflector:
    """Keeps one resource of a Snapshot in sync. ``run`` never returns until cancelled."""

    def __init__(
        self,
        resource: str,
        list_fn: Callable[..., Any],
        snapshot: Snapshot,
        config: KubernetesConfig,
        *,
        field_selector: str | None = None,
        on_problems: ProblemSink | None = None,
        on_restart: RestartHook | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if resource not in ("nodes", "pods"):
            raise ValueError(f"unknown resource {resource!r}")
        self.resource = resource
        self._list_fn = list_fn
        self._snapshot = snapshot
        self._config = config
        self._field_selector = field_selector
        self._on_problems = on_problems
        self._on_restart = on_restart
        self._clock = clock
        self.resource_version: str | None = None
        self.lists = 0
        self.events = 0
        self.synced = asyncio.Event()

    # ------------------------------------------------------------------------------------------- apply

    def _replace(self, items: list[dict[str, Any]], rv: str | None) -> None:
        now = self._clock()
        if self.resource == "nodes":
            self._snapshot.replace_nodes(items, rv, now=now)
            return
        for key, problems in self._snapshot.replace_pods(items, rv, now=now):
            self._report(key, items, problems)

    def _report(self, key: str, items: list[dict[str, Any]] | None, problems: Any, obj: Any = None) -> None:
        if self._on_problems is None or not problems:
            return
        if obj is None and items is not None:
            ns, name = key.split("/", 1)
            obj = next(
                (
                    i
                    for i in items
                    if i.get("metadata", {}).get("name") == name
                    and i.get("metadata", {}).get("namespace", "default") == ns
                ),
                None,
            )
        meta = obj.get("metadata", {}) if isinstance(obj, dict) else {}
        ns, name = key.split("/", 1)
        self._on_problems(PodProblems(ns, name, str(meta.get("uid", "")), tuple(problems)))

    def _apply(self, event_type: str, obj: dict[str, Any]) -> None:
        now = self._clock()
        if self.resource == "nodes":
            self._snapshot.apply_node(event_type, obj, now=now)
            return
        problems = self._snapshot.apply_pod(event_type, obj, now=now)
        if problems:
            meta = obj.get("metadata", {})
            self._report(f"{meta.get('namespace', 'default')}/{meta.get('name')}", None, problems, obj)

    # -------------------------------------------------------------------------------------------- I/O

    def _kwargs(self, **extra: Any) -> dict[str, Any]:
        kw: dict[str, Any] = {"_preload_content": False}
        if self._field_selector:
            kw["field_selector"] = self._field_selector
        kw.update(extra)
        return kw

    async def list(self) -> None:
        """A complete, paged list; replaces the snapshot's view of this resource."""
        items: list[dict[str, Any]] = []
        cont: str | None = None
        rv: str | None = None
        timeout = self._config.request_timeout_seconds
        while True:
            extra: dict[str, Any] = {"limit": LIST_PAGE, "_request_timeout": timeout}
            if cont:
                extra["_continue"] = cont
            try:
                page = await read_json(await self._list_fn(**self._kwargs(**extra)))
            except ApiError as exc:
                if exc.status == 410:
                    raise Gone(str(exc)) from exc  # continue token expired mid-list: start over
                raise
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            rv = meta.get("resourceVersion") or rv
            cont = meta.get("continue") or None
            if not cont:
                break
        self._replace(items, rv)
        self.resource_version = rv
        self.lists += 1
        self.synced.set()
        log.info(f"listed {len(items)} {self.resource}", extra={"decision": {"resourceVersion": rv}})

    async def _lines(self, response: Any) -> AsyncIterator[bytes]:
        """The watch's events, one JSON document per line. A chunk holds many events in a burst (tens of pod
        updates in 64 KiB): it is split once, and only its unfinished last line is carried to the next chunk,
        instead of re-slicing the rest of the buffer after every line (which copied it once per event)."""
        partial = b""
        try:
            async for chunk in response.content.iter_any():
                lines = chunk.split(b"\n")
                if len(lines) == 1:
                    partial += chunk
                    continue
                lines[0] = partial + lines[0]
                partial = lines.pop()
                for line in lines:
                    if line.strip():
                        yield line
            if partial.strip():
                yield partial
        finally:
            response.release()

    async def watch(self) -> None:
        """One watch request from ``resource_version`` until the server ends it."""
        seconds = self._config.watch_timeout_seconds
        response = await self._list_fn(
            **self._kwargs(
                watch=True,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=seconds,
                _request_timeout=aiohttp.ClientTimeout(connect=10, sock_connect=10, sock_read=seconds + 60),
            )
        )
        if response.status != 200:
            try:
                await read_json(response)
            except ApiError as exc:
                if exc.status == 410:
                    raise Gone(str(exc)) from exc
                raise
        async for line in self._lines(response):
            event = orjson.loads(line)
            event_type = event.get("type")
            obj = event.get("object") or {}
            if event_type == "ERROR":
                code = obj.get("code")
                if code == 410:
                    raise Gone(str(obj.get("message", "")))
                raise ApiError(int(code or 500), str(obj.get("reason", "")), str(obj.get("message", "")))
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if event_type in ("ADDED", "MODIFIED", "DELETED"):
                self._apply(event_type, obj)
                self.events += 1
            if rv:
                self.resource_version = rv

    async def cycle(self) -> None:
        """List if there is no resume point, then watch once. Gone -> forget the resume point."""
        try:
            if self.resource_version is None:
                await self.list()
            await self.watch()
            self._restarted("timeout")
        except Gone as exc:
            log.info(f"{self.resource} watch expired, relisting", extra={"error": str(exc)})
            self.resource_version = None
            self._restarted("gone")
        except asyncio.CancelledError:
            raise
        except (ApiError, aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            self._restarted("error")
            log.warning(f"{self.resource} list/watch failed", extra={"error": f"{type(exc).__name__}: {exc}"})
            raise _Restart(str(exc)) from exc

    def _restarted(self, reason: str) -> None:
        if self._on_restart is not None:
            self._on_restart(self.resource, reason)

    async def run(self) -> None:
        while True:
            async for attempt in AsyncRetrying(
                wait=wait_exponential_jitter(
                    multiplier=self._config.backoff_initial_seconds,
                    jitter=self._config.backoff_initial_seconds,
                    max=self._config.backoff_max_seconds,
                ),
                retry=retry_if_exception_type(_Restart),
            ):
                with attempt:
                    await self.cycle()


def node_reflector(api_client: Any, snapshot: Snapshot, config: KubernetesConfig, **kw: Any) -> Reflector:
    return Reflector("nodes", k8s.CoreV1Api(api_client).list_node, snapshot, config, **kw)


def pod_reflector(api_client: Any, snapshot: Snapshot, config: KubernetesConfig, **kw: Any) -> Reflector:
    return Reflector(
        "pods",
        k8s.CoreV1Api(api_client).list_pod_for_all_namespaces,
        snapshot,
        config,
        field_selector=POD_FIELD_SELECTOR,
        **kw,
    )
