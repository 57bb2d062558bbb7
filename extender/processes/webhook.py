"""`qos-extender serve`: wire the snapshot (list+watch), binder, events and the HTTP app, run until signalled."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from kubernetes_asyncio import client as k8s

from extender.controller.accounting import ACCOUNT_ANNOTATION
from extender.controller.leader import Leadership
from extender.controller.loop import ControllerEvents, QosController
from extender.controller.metrics import ControllerMetrics
from extender.controller.state import TrackingSnapshot
from extender.heap import GcPauses, freeze_start_up_heap, set_young_threshold
from extender.kube.binder import KubeBinder
from extender.kube.client import ApiError, binder_client, new_api_client, read_json
from extender.kube.events import KubeEventSink
from extender.kube.snapshot import Snapshot
from extender.kube.watch import Reflector, node_reflector, pod_reflector
from extender.settings.extender import ConfigError, ExtenderConfig
from extender.signals import stop_event
from extender.webhook.app import make_app, make_reloader, make_ssl_context, start_loopback_server, start_server
from extender.webhook.metrics import Metrics
from extender.webhook.verbs import PodReader

__all__ = ["Running", "serve", "start"]

log = logging.getLogger("extender.processes.webhook")


@dataclass
class Running:
    """A started extender: stop it with ``await running.stop()``."""

    config: ExtenderConfig
    snapshot: Snapshot
    metrics: Metrics
    runner: web.AppRunner
    port: int
    api_client: Any
    reflectors: list[Reflector]
    events: KubeEventSink | None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    controller: QosController | None = None  # the current term's controller (None: standby or disabled)
    leadership: Leadership | None = None
    loopback: web.AppRunner | None = None  # server.loopback_verbs_port's plain-HTTP verbs listener
    loopback_port: int | None = None
    bind_client: Any = None  # the binder's own connection pool (None: it shares api_client)
    gc_pauses: GcPauses | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.config.server.tls.enabled else "http"
        return f"{scheme}://{self.config.server.host}:{self.port}"

    async def stop(self) -> None:
        if self.gc_pauses is not None:
            self.gc_pauses.uninstall()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.loopback is not None:
            await self.loopback.cleanup()
        await self.runner.cleanup()
        await self.api_client.close()
        if self.bind_client is not None:
            await self.bind_client.close()


async def start(config: ExtenderConfig) -> Running:
    """Connect to the API server, start list+watch and the HTTP server (which answers 503 until synced)."""
    try:
        api_client = await new_api_client(config.kubernetes)
    except Exception as exc:  # kubernetes_asyncio raises ConfigException, TypeError, OSError... for bad credentials
        raise ConfigError(
            f"cannot load Kubernetes credentials (kubernetes.kubeconfig, $KUBECONFIG, in-cluster): {exc}"
        ) from exc
    # With the QoS controller the snapshot also tracks qos pods' gates and phases: one list+watch serves both.
    snapshot = TrackingSnapshot(config, ACCOUNT_ANNOTATION) if config.controller.enabled else Snapshot(config)
    metrics = Metrics()
    events = KubeEventSink(api_client, config.kubernetes.event_component) if config.kubernetes.events else None
    on_problems = events.report if events is not None else None

    def on_restart(resource: str, reason: str) -> None:
        metrics.watch_restarts.labels(resource, reason).inc()

    reflectors = [
        node_reflector(api_client, snapshot, config.kubernetes, on_restart=on_restart),
        pod_reflector(api_client, snapshot, config.kubernetes, on_problems=on_problems, on_restart=on_restart),
    ]
    # The Binding POSTs get their own connection pool: they are kube-scheduler's critical path, and in the shared
    # pool they waited for connections behind a burst of the controller's release PATCHes
    # (controller.release_concurrency), account writes, Events and the watches' long-lived connections.
    # No cap on its connections (binder_client, issue 34): the binder's bind.max_in_flight slots bound them.
    bind_client = binder_client(api_client)
    binder = KubeBinder(bind_client, config.bind)
    read_pod = _pod_reader(bind_client, config.bind.attempt_seconds)
    app = make_app(config, snapshot, binder, events=events, metrics=metrics, clock=time.time, read_pod=read_pod)
    ssl_context = make_ssl_context(config.server.tls)
    runner, port = await start_server(app, config, ssl_context)
    loopback: web.AppRunner | None = None
    loopback_port: int | None = None
    if config.server.loopback_verbs_port is not None:
        verbs_app = make_app(
            config,
            snapshot,
            binder,
            events=events,
            metrics=metrics,
            clock=time.time,
            verbs_only=True,
            read_pod=read_pod,
        )
        loopback, loopback_port = await start_loopback_server(verbs_app, config.server.loopback_verbs_port)
    tasks = [asyncio.create_task(r.run(), name=f"reflector-{r.resource}") for r in reflectors]
    reloader = make_reloader(config.server.tls, ssl_context, metrics) if ssl_context is not None else None
    if reloader is not None:
        interval = config.server.tls.reload_interval_seconds
        tasks.append(asyncio.create_task(reloader.run(interval), name="certificate-reload"))
    if events is not None:
        tasks.append(asyncio.create_task(events.run(), name="events"))
    running = Running(config, snapshot, metrics, runner, port, api_client, reflectors, events, tasks)
    running.loopback, running.loopback_port = loopback, loopback_port
    running.bind_client = bind_client
    running.gc_pauses = GcPauses(metrics.registry)
    running.gc_pauses.install()
    set_young_threshold(config.server.gc_young_threshold)
    if config.server.freeze_heap:
        tasks.append(asyncio.create_task(_freeze_when_listed(snapshot), name="freeze-heap"))
    if isinstance(snapshot, TrackingSnapshot):
        ctl_events = (
            ControllerEvents(api_client, config.kubernetes.event_component) if config.kubernetes.events else None
        )
        ctl_metrics = ControllerMetrics(metrics.registry)

        async def lead() -> None:
            # A fresh controller per term: it rebuilds every account from the owners' annotations, so a leader
            # change is exactly a restart (nothing in memory carries over from an earlier term).
            running.controller = QosController(api_client, snapshot, config, ctl_metrics, ctl_events)
            try:
                await running.controller.run()
            finally:
                running.controller = None
                ctl_metrics.set_samples([])

        election = config.controller.leader_election
        if election.enabled:
            running.leadership = Leadership(
                api_client, election, config.controller.lease_name, lead, lambda on: ctl_metrics.leader.set(int(on))
            )
            tasks.append(asyncio.create_task(running.leadership.run(), name="qos-controller-election"))
        else:
            ctl_metrics.leader.set(1)
            tasks.append(asyncio.create_task(lead(), name="qos-controller"))
        if ctl_events is not None:
            tasks.append(asyncio.create_task(ctl_events.run(), name="controller-events"))
    log.info(
        "serving",
        extra={
            "decision": {
                "host": config.server.host,
                "port": port,
                "tls": config.server.tls.enabled,
                "loopback_verbs_port": loopback_port,
            }
        },
    )
    return running


async def _freeze_when_listed(snapshot: Snapshot) -> None:
    """heap.freeze_start_up_heap once the first node and pod lists are in the snapshot: the long-lived part
    of the heap is then built, and every later full collection skips it."""
    while not snapshot.ready:
        await asyncio.sleep(0.1)
    freeze_start_up_heap()


def _pod_reader(api_client: Any, timeout: float) -> PodReader:
    """verbs.PodReader over the binder's connection pool: /bind reads a pod its snapshot does not hold yet."""
    _core = k8s.CoreV1Api(api_client)  # named as tests/test_manifests.py finds the calls RBAC must grant

    async def read_pod(namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            async with asyncio.timeout(timeout):
                response = await _core.read_namespaced_pod(
                    name, namespace, _preload_content=False, _request_timeout=timeout
                )
                obj = await read_json(response)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return obj if isinstance(obj, Mapping) else None

    return read_pod


async def serve(config: ExtenderConfig) -> None:
    running = await start(config)
    stop = stop_event()
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        await running.stop()
