"""`qos-extender autoscaler`: list+watch -> AutoscalerLoop.step -> provider / Events / metrics / hand-off.

One process: the shared reflectors keep an AutoscalerSnapshot in sync; a scan runs every
``scan_interval_seconds``, and sooner (after ``burst_debounce_seconds``) when a pod newly becomes
Unschedulable. Provider ``kwok`` executes the plans; provider ``cluster-autoscaler`` serves the gRPC expander
and runs the loop in dry-run (plans become metrics only: CA buys the nodes and removes them), and with
``cluster_autoscaler.cloud_provider`` also the externalgrpc cloud provider (our flavours as CA's node groups, nodes
from the kwok backend; its provisioning ledger is handed to the dry-run loop before every scan).
/metrics, /healthz and /readyz are served on ``metrics.host:port``: over HTTPS with ``metrics.cert_file`` (/metrics only
for the allowed scraper identities, ``metrics.clients``; the probes anonymous, as kubelet sends no certificate), plain
HTTP only on a loopback host. Every certificate of the sidecar (this listener's, the expander's, the cloud
provider's) is re-read when its files change. The command line and the
consolidation flow (the hand-off, when enabled) are wired in ``extender.processes.autoscaler``, above both packages.
With ``leader_election.enabled`` (the default) only the holder of the Lease ``leader_election.lease_name`` scans and
acts (buys, removes, hands nodes to consolidation, writes Events; extender/controller/leader.py); a standby keeps its
snapshot warm and serves the listeners, and each term starts with a fresh loop, as after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import Counter, Gauge

from extender.autoscaler.events import AutoscalerEvents
from extender.autoscaler.handoff import ConsolidationHandoff, RecordingHandoff
from extender.autoscaler.loop import AutoscalerLoop, Decisions
from extender.autoscaler.metrics import AutoscalerMetrics
from extender.autoscaler.providers.base import Provider
from extender.autoscaler.providers.provisioning_request import ProvisioningRequestProvider
from extender.autoscaler.settings import AutoscalerSettings, MetricsSettings
from extender.autoscaler.view import AutoscalerSnapshot
from extender.controller.leader import Leadership, own_namespace
from extender.kube.client import new_api_client
from extender.kube.watch import Reflector, node_reflector, pod_reflector
from extender.settings.extender import ConfigError, ExtenderConfig
from extender.tls import CertificateFiles, CertificateReloader, server_context, subject_common_names

__all__ = ["RunningAutoscaler", "certificate_names", "metrics_denial", "serve_metrics", "start_autoscaler"]

log = logging.getLogger("extender.autoscaler")


@dataclass
class RunningAutoscaler:
    config: ExtenderConfig
    settings: AutoscalerSettings
    snapshot: AutoscalerSnapshot
    loop: AutoscalerLoop
    metrics: AutoscalerMetrics
    handoff: ConsolidationHandoff
    api_client: Any
    provider: Provider | None
    expander: Any
    events: AutoscalerEvents | None
    runner: web.AppRunner
    metrics_port: int
    reflectors: list[Reflector]
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    scans: int = 0
    last: Decisions | None = None
    scanned: asyncio.Event = field(default_factory=asyncio.Event)
    cloud_provider: Any = None  # providers.externalgrpc.CloudProviderServer when served
    leadership: Leadership | None = None  # None: leader election off, this replica always acts

    @property
    def standby(self) -> bool:
        return self.leadership is not None and not self.leadership.leading

    def acting(self) -> bool:
        """May this replica act at this instant (the Lease's authority, or no election)?"""
        return self.leadership is None or self.leadership.acting()

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.provider is not None:
            await self.provider.close()
        if self.expander is not None:
            await self.expander.stop()
        if self.cloud_provider is not None:
            await self.cloud_provider.stop()
        await self.runner.cleanup()
        await self.api_client.close()


ANONYMOUS_PATHS = frozenset({"/healthz", "/readyz"})  # kubelet's probes carry no client certificate


def certificate_names(peercert: Any) -> tuple[str, ...]:
    """Subject CN(s) and SAN values of a verified peer certificate (``getpeercert()``), () without one."""
    if not peercert:
        return ()
    names = list(subject_common_names(peercert))
    for _, value in peercert.get("subjectAltName", ()):
        if isinstance(value, str) and value not in names:
            names.append(value)
    return tuple(names)


def metrics_denial(path: str, tls: bool, peercert: Any, clients: tuple[str, ...]) -> tuple[str, str] | None:
    """None when the caller may GET ``path``, else (reason label, message for the 403). Pure: the tests call it
    through the real listener. Without TLS (a loopback listener, MetricsSettings) nothing is checked."""
    if not tls or path != "/metrics":
        return None  # the probes are anonymous; any other path is a 404 for everybody
    names = certificate_names(peercert)
    if not names:
        return "no_certificate", "/metrics requires a client certificate signed by autoscaler.metrics.client_ca_file"
    if any(n in clients for n in names):
        return None
    who = ", ".join(repr(n) for n in names)
    return "permission_denied", (
        f"client certificate ({who}) may not read /metrics: add it to autoscaler.metrics.clients"
    )


def _metrics_app(
    running: Callable[[], RunningAutoscaler | None],
    snapshot: AutoscalerSnapshot,
    m: AutoscalerMetrics,
    settings: MetricsSettings | None = None,
) -> web.Application:
    tls = settings is not None and settings.cert_file is not None
    clients = settings.clients if settings is not None else ()

    @web.middleware
    async def access(request: web.Request, handler: Any) -> web.StreamResponse:
        ssl_object = request.transport.get_extra_info("ssl_object") if request.transport is not None else None
        peercert = ssl_object.getpeercert() if ssl_object is not None else None
        denied = metrics_denial(request.path, tls, peercert, clients)
        if denied is not None:
            reason, message = denied
            m.refused_calls.labels("metrics", request.path, reason).inc()
            log.warning("metrics request refused: %s", message, extra={"decision": {"reason": reason}})
            return web.json_response({"error": message}, status=403)
        response: web.StreamResponse = await handler(request)
        return response

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=m.exposition(), content_type="text/plain", charset="utf-8")

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        r = running()
        ok = snapshot.ready and r is not None and (r.scans > 0 or r.standby)  # a synced standby is ready
        return web.Response(text="ok" if ok else "not ready", status=200 if ok else 503)

    app = web.Application(middlewares=[access])
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def serve_metrics(
    app: web.Application, mset: MetricsSettings, metrics: AutoscalerMetrics
) -> tuple[web.AppRunner, int, CertificateReloader | None]:
    """Serve ``app`` on ``mset.host:port``: HTTPS with a client certificate optional at the TLS level (the probes
    have none; /metrics checks it, ``metrics_denial``) when ``cert_file`` is set, else plain HTTP (loopback only:
    MetricsSettings refuses another host). Returns the runner, the port, and the reloader of the certificate files
    (the caller runs it)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    reloader: CertificateReloader | None = None
    ssl_context = None
    if mset.cert_file is not None and mset.key_file is not None:
        files = CertificateFiles(mset.cert_file, mset.key_file, mset.client_ca_file)
        ssl_context = server_context(files, client_certificate="optional")
        reloader = CertificateReloader(files, [ssl_context], on_reload=metrics.reloaded("metrics"))
    site = web.TCPSite(runner, mset.host, mset.port, ssl_context=ssl_context)
    await site.start()
    server = site._server
    port = server.sockets[0].getsockname()[1] if server is not None and server.sockets else mset.port  # type: ignore[attr-defined]
    return runner, int(port), reloader


async def _apply(r: RunningAutoscaler, d: Decisions) -> None:
    provider = r.provider
    if provider is not None:
        for entry in d.cancel:
            await provider.cancel(entry.node_name)
        if d.provision:
            await provider.create_all(d.provision)
        if d.fulfilled:
            await provider.fulfilled(d.fulfilled)
        for name in d.delete:
            await provider.delete(name)
        for name in d.retire:
            await provider.set_retiring(name, True)
        for name in d.unretire:
            await provider.set_retiring(name, False)
    if r.events is not None:
        for notice in d.notices:
            r.events.emit(notice)
    if d.consolidation is not None:
        r.handoff.handoff(d.consolidation)
    r.metrics.observe(d)
    for plan in d.plans:
        log.info(
            "scale-up plan",
            extra={
                "decision": {
                    "group": plan.group.value,
                    "pods": plan.pods,
                    "flavours": dict(plan.flavour_counts),
                    "cost_per_hour": round(plan.cost_per_hour, 6),
                    "unservable": list(plan.unservable),
                    "forecast_shortage": {"cpu_milli": d.forecast.cpu_milli, "memory_bytes": d.forecast.memory_bytes},
                    "lag_estimate_seconds": round(d.lag_estimate, 3),
                    "dry_run": r.settings.dry_run,
                }
            },
        )
    for name, lag in d.arrived:
        log.info("node joined", extra={"decision": {"node": name, "lag_seconds": round(lag, 3)}})
    for name in d.delete:
        log.info("scale-down: empty node", extra={"decision": {"node": name}})


async def _scan_forever(r: RunningAutoscaler, wake: asyncio.Event, clock: Callable[[], float]) -> None:
    for reflector in r.reflectors:
        await reflector.synced.wait()
    while True:
        wake.clear()
        started = time.perf_counter()
        if r.leadership is not None:  # one line per scan of a leader: the record tests/test_leader_live.py compares
            log.info(
                "scan",
                extra={
                    "decision": {
                        "identity": r.leadership.identity,
                        "term": r.leadership.terms,
                        "scan": r.scans,
                        "at": time.time(),
                    }
                },
            )
        try:
            if r.cloud_provider is not None:  # CA buys through it: plan against its ledger
                await r.cloud_provider.refresh()
                state = r.cloud_provider.state
                r.loop.adopt_ledger(state.ledger, state.groups_of_ledger(), state.drain_arrivals())
            if isinstance(r.provider, ProvisioningRequestProvider):  # CA's verdict on the demand we handed it
                for adopted in await r.provider.sync():
                    r.loop.adopt_demand(*adopted)
                # no request before our own were listed once: a restart must not buy again what it made before
                r.loop.demand_ready = r.provider.listed
                r.loop.forget_demand(r.provider.drain_failed())
                r.loop.forget_demand(r.provider.drain_not_created(), refund=True)
            d = r.loop.step(r.snapshot, clock())
        except Exception:  # a bug in one scan must not stop the sidecar; it is logged and retried
            log.exception("autoscaler scan failed")
        else:
            await _apply(r, d)
            r.last = d
        r.metrics.scan_duration.observe(time.perf_counter() - started)
        r.scans += 1
        r.scanned.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout=r.settings.scan_interval_seconds)
            await asyncio.sleep(r.settings.burst_debounce_seconds)


def ca_mode_settings(settings: AutoscalerSettings) -> AutoscalerSettings:
    """Under cluster-autoscaler the loop never creates or deletes a node (CA does): dry run for its own writes.
    A user's ``dry_run: true`` also means no ProvisioningRequest: plans are only reported."""
    expander = settings.expander
    if settings.dry_run:
        off = expander.provisioning_requests.model_copy(update={"enabled": False})
        expander = expander.model_copy(update={"provisioning_requests": off})
    return settings.model_copy(update={"dry_run": True, "cluster_autoscaler": expander})


async def start_autoscaler(
    config: ExtenderConfig,
    settings: AutoscalerSettings,
    *,
    handoff: ConsolidationHandoff | None = None,
    clock: Callable[[], float] = time.time,
    term_services: Sequence[TermService] = (),
) -> RunningAutoscaler:
    """Start the listeners and reflectors, and the scan loop: at once without leader election, else in each term
    of the Lease. ``term_services`` (the consolidation flow) run only within a term too: started when it begins,
    stopped (their work in flight cancelled) when it ends."""
    try:
        api_client = await new_api_client(config.kubernetes)
    except Exception as exc:
        raise ConfigError(f"cannot load Kubernetes credentials (kubernetes.kubeconfig, $KUBECONFIG): {exc}") from exc
    wake = asyncio.Event()
    holder: list[RunningAutoscaler] = []
    snapshot = AutoscalerSnapshot(config, on_unschedulable=wake.set)
    metrics = AutoscalerMetrics()
    events = AutoscalerEvents(api_client, config.kubernetes.event_component) if config.kubernetes.events else None
    reflectors = [
        node_reflector(api_client, snapshot, config.kubernetes, clock=clock),
        pod_reflector(
            api_client,
            snapshot,
            config.kubernetes,
            on_problems=(lambda problems: events.report(problems) if holder and holder[0].acting() else None)
            if events
            else None,
            clock=clock,
        ),
    ]
    provider: Provider | None = None
    expander: Any = None
    cloud_provider: Any = None
    if settings.provider == "cluster-autoscaler":
        from extender.autoscaler.providers.cluster_autoscaler import ExpanderServer
        from extender.autoscaler.providers.grpc_guard import ReloadingServerCredentials

        settings = ca_mode_settings(settings)
        assert settings.expander.cert_file is not None and settings.expander.key_file is not None
        expander = ExpanderServer(
            config,
            settings.flavours,
            settings.weights,
            listen=settings.expander.listen,
            credentials=ReloadingServerCredentials(
                CertificateFiles(settings.expander.cert_file, settings.expander.key_file),
                client_auth=False,
                on_reload=metrics.reloaded("expander"),
            ).credentials,
            max_message_bytes=settings.expander.max_message_bytes,
            metrics=metrics,
        )
        await expander.start()
        if settings.expander.provreq is not None:
            provider = ProvisioningRequestProvider(
                api_client,
                settings.expander.provisioning_requests.namespace,
                class_name=settings.expander.provisioning_requests.class_name,
                delivered_grace_seconds=settings.expander.provisioning_requests.delivered_grace_seconds,
                request_timeout=config.kubernetes.request_timeout_seconds,
                metrics=metrics,
                events=events,
                clock=clock,
            )
        if settings.expander.cloud_provider is not None:
            cloud_provider = _cloud_provider(config, settings, snapshot, api_client, metrics, clock)
            try:
                await cloud_provider.start()
            except Exception:
                await expander.stop()
                raise
    else:
        from extender.autoscaler.providers.kwok import KwokProvider

        provider = KwokProvider(api_client, settings.kwok_lag, config.kubernetes.request_timeout_seconds)
    loop = AutoscalerLoop(settings, config.node_groups, slo={n: c.slo for n, c in config.policy.classes.items()})
    app = _metrics_app(lambda: holder[0] if holder else None, snapshot, metrics, settings.metrics)
    mset = settings.metrics
    runner, port, reloader = await serve_metrics(app, mset, metrics)
    running = RunningAutoscaler(
        config,
        settings,
        snapshot,
        loop,
        metrics,
        handoff if handoff is not None else RecordingHandoff(),
        api_client,
        provider,
        expander,
        events,
        runner,
        int(port),
        reflectors,
    )
    running.cloud_provider = cloud_provider
    holder.append(running)
    running.tasks = [asyncio.create_task(r.run(), name=f"reflector-{r.resource}") for r in reflectors]
    if events is not None:
        running.tasks.append(asyncio.create_task(events.run(), name="events"))
    if reloader is not None:
        running.tasks.append(asyncio.create_task(reloader.run(mset.reload_seconds), name="metrics-tls-reload"))
    running.tasks.append(_start_acting(running, wake, clock, term_services))
    log.info(
        "autoscaler started",
        extra={
            "decision": {
                "provider": settings.provider,
                "dry_run": settings.dry_run,
                "metrics_port": port,
                "flavours": [f.name for f in settings.flavours],
                "expander_port": expander.port if expander is not None else None,
                "cloud_provider_port": cloud_provider.port if cloud_provider is not None else None,
            }
        },
    )
    return running


class TermService(Protocol):
    """Something that acts and so runs only while this replica leads (the consolidation flow)."""

    async def start_term(self, running: RunningAutoscaler) -> None: ...

    async def stop_term(self) -> None: ...


def _start_acting(
    r: RunningAutoscaler, wake: asyncio.Event, clock: Callable[[], float], services: Sequence[TermService]
) -> asyncio.Task[None]:
    """The scan loop and the term services: one term forever without leader election, else one per Lease term.
    A later term starts from a fresh AutoscalerLoop (its ledger and lag estimates from an earlier term may be
    stale by a whole standby period), exactly as a restart would."""
    election = r.settings.leader_election
    leader_gauge = Gauge(
        "qos_extender_autoscaler_leader",
        "1 while this replica holds the autoscaler's Lease and acts (or runs without leader election), else 0.",
        registry=r.metrics.registry,
    )
    transitions = Counter(
        "qos_extender_autoscaler_leader_transitions",
        "Terms this replica began as the Lease holder (a leader change anywhere shows as a rise on one replica).",
        registry=r.metrics.registry,
    )
    began = [0]

    async def term() -> None:
        if began[0] > 0:
            r.loop = AutoscalerLoop(
                r.settings, r.config.node_groups, slo={n: c.slo for n, c in r.config.policy.classes.items()}
            )
        began[0] += 1
        transitions.inc()
        started: list[TermService] = []
        try:
            for service in services:
                await service.start_term(r)
                started.append(service)
            await _scan_forever(r, wake, clock)
        finally:
            for service in reversed(started):
                await service.stop_term()

    if not election.enabled:
        leader_gauge.set(1)
        return asyncio.create_task(term(), name="autoscaler-scan")
    if election.lease_namespace is None:  # the pod's own namespace (the Role is there), else kube-system
        election = election.model_copy(update={"lease_namespace": own_namespace()})
    r.leadership = Leadership(r.api_client, election, election.lease_name, term, lambda on: leader_gauge.set(int(on)))
    return asyncio.create_task(r.leadership.run(), name="autoscaler-election")


def _cloud_provider(
    config: ExtenderConfig,
    settings: AutoscalerSettings,
    snapshot: AutoscalerSnapshot,
    api_client: Any,
    metrics: AutoscalerMetrics,
    clock: Callable[[], float],
) -> Any:
    """The externalgrpc cloud provider over the kwok backend (the only backend: the local stand-in for a cloud)."""
    from extender.autoscaler.nodegroups import NodeGroups
    from extender.autoscaler.providers.externalgrpc import CloudProviderServer, NodeGroupOptions
    from extender.autoscaler.providers.grpc_guard import ReloadingServerCredentials
    from extender.autoscaler.providers.kwok import PROVIDER_ID_PREFIX, KwokProvider, node_manifest

    cp = settings.expander.cloud_provider
    assert cp is not None
    state = NodeGroups.build(
        settings.flavours,
        config.node_groups,
        cp.groups,
        min_size=cp.min_size,
        max_size=cp.max_size,
        provider_id_prefix=PROVIDER_ID_PREFIX,
        node_name_prefix=cp.node_name_prefix,
        provisioning_timeout_seconds=settings.provisioning_timeout_seconds,
        max_nodes=settings.max_nodes,
    )
    backend = KwokProvider(api_client, settings.kwok_lag, config.kubernetes.request_timeout_seconds)
    options = (
        NodeGroupOptions(settings.idle_seconds, settings.provisioning_timeout_seconds)
        if cp.node_group_options
        else None
    )
    return CloudProviderServer(
        config,
        state,
        snapshot,
        backend,
        node_manifest,
        listen=cp.listen,
        credentials=ReloadingServerCredentials(
            CertificateFiles(cp.cert_file, cp.key_file, cp.client_ca_file),
            client_auth=True,
            on_reload=metrics.reloaded("cloudprovider"),
        ).credentials,
        clients=cp.clients,
        max_message_bytes=cp.max_message_bytes,
        gpu_label=cp.gpu_label,
        options=options,
        metrics=metrics,
        clock=clock,
    )
