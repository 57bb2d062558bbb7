"""The aiohttp app: POST /filter /prioritize /preempt /bind, GET /healthz /readyz /metrics.

Every body is orjson both ways. Bad input never reaches a 500. kube-scheduler never reads the body of a
non-200 answer (its error says only "code 503") and each one costs it a new connection, so /filter and /bind,
whose result types have an ``Error`` field, answer every failure 200 with ``Error`` set (bad JSON, wrong types,
too large, not synced, past the deadline); /prioritize and /preempt have no such field and answer 400 (bad
input), 413 (too large), 503 (not synced / past the per-request deadline) with ``{"Error": ...}``. Unknown path
404, wrong method 405, a client certificate not allowed on the path 403 (see ``access``).

``make_app(verbs_only=True)`` is the loopback listener's app (server.loopback_verbs_port): the four verbs and
nothing else, no TLS, for the sidecar topology where only the pod's own kube-scheduler can reach 127.0.0.1.

Every refusal (403 by identity, 413/408 for a body too large or too slow, a /bind of a pod that is not ours or
already bound) is counted in qos_extender_requests_refused_total{server,route,reason}. The TLS listener's
certificates are reloaded when their files change (``extender.tls.CertificateReloader``), and a connection must
deliver each request's headers within server.read_timeout_seconds (aiohttp's keep-alive timer, which also runs
from the connection's start) and its body within the same time.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from aiohttp import web

from extender.core.model import InvalidInputError
from extender.kube.snapshot import Snapshot
from extender.settings.extender import ExtenderConfig, TlsConfig
from extender.tls import CertificateFiles, CertificateReloader, server_context
from extender.webhook import access, verbs
from extender.webhook.admission import add_admission_route
from extender.webhook.metrics import Metrics

__all__ = [
    "CONFIG_KEY",
    "INTERNAL_ERROR_PREFIX",
    "EventSink",
    "make_app",
    "make_reloader",
    "make_ssl_context",
    "start_loopback_server",
    "start_server",
]

log = logging.getLogger("extender.webhook.app")

CONFIG_KEY = web.AppKey("config", ExtenderConfig)
SNAPSHOT_KEY = web.AppKey("snapshot", Snapshot)
METRICS_KEY = web.AppKey("metrics", Metrics)

Clock = Callable[[], float]


class EventSink(Protocol):
    def report(self, problems: verbs.PodProblems) -> None:
        """Queue an Event about malformed annotations on a pod (must not block)."""
        ...


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"Error": message}, status)


def _in_band_error(verb: str, message: str) -> web.Response:
    """A failure of /filter or /bind answered the way kube-scheduler reads it: 200 with ``Error`` set."""
    if verb == "filter":
        body: dict[str, Any] = {
            "Nodes": None,
            "NodeNames": None,
            "FailedNodes": {},
            "FailedAndUnresolvableNodes": {},
            "Error": message,
        }
        return _json(body)
    return _json({"Error": message})


IN_BAND_ERRORS = frozenset({"filter", "bind"})
# The start of the answer to an unexpected exception (the verb follows); tests assert it never appears.
INTERNAL_ERROR_PREFIX = "internal error in "


class _Outcome(Exception):
    def __init__(self, response: web.Response, outcome: str, message: str) -> None:
        super().__init__(outcome)
        self.response = response
        self.outcome = outcome
        self.message = message


async def _read_json(request: web.Request) -> Any:
    server = request.app[CONFIG_KEY].server
    try:
        async with asyncio.timeout(server.read_timeout_seconds):
            raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        message = f"request body larger than the limit of {server.max_body_bytes} bytes"
        raise _Outcome(_error(413, message), "too_large", message) from exc
    except TimeoutError as exc:
        message = f"request body not received within {server.read_timeout_seconds:g} s"
        raise _Outcome(_error(408, message), "read_timeout", message) from exc
    if not raw:
        message = "empty request body (expected a JSON object)"
        raise _Outcome(_error(400, message), "bad_request", message)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        message = f"request body is not valid JSON: {exc}"
        raise _Outcome(_error(400, message), "bad_request", message) from exc


@dataclass(frozen=True, slots=True)
class _Served:
    """What the handlers serve from, kept on the app (``SERVED_KEY``): the handlers are plain module-level
    functions of the request, so each can be read, tested and profiled on its own."""

    config: ExtenderConfig
    snapshot: Snapshot
    binder: verbs.Binder
    events: EventSink | None
    metrics: Metrics
    clock: Clock
    server: str  # the metric's server label: extender (the TLS listener) or extender-loopback
    listener: access.Listener
    read_pod: verbs.PodReader | None


SERVED_KEY = web.AppKey("served", _Served)
Handler = Callable[[web.Request], Awaitable[tuple[web.Response, str]]]


def _report(served: _Served, result: verbs.VerbResult) -> None:
    """A verb's side outputs: filter reasons, decisions, victims and annotation problems as metrics and Events."""
    metrics = served.metrics
    for reason, n in result.filtered_out.items():
        metrics.filtered_nodes.labels(reason).inc(n)
    for policy, n in result.decisions.items():
        metrics.decisions.labels(policy).inc(n)
    if result.victims_kept:
        metrics.preemption_victims.labels("kept").inc(result.victims_kept)
    if result.victims_dropped:
        metrics.preemption_victims.labels("dropped").inc(result.victims_dropped)
    if result.problems is not None:
        metrics.annotation_problems.inc(len(result.problems.problems))
        if served.events is not None:
            served.events.report(result.problems)


async def _sync_verb(
    request: web.Request, fn: Callable[[object, Snapshot, ExtenderConfig, float], verbs.VerbResult]
) -> tuple[web.Response, str]:
    """filter, prioritize and preempt: pure functions of (body, snapshot, settings, now), answered from memory."""
    served = request.app[SERVED_KEY]
    body = await _read_json(request)
    before = len(served.snapshot.ledger)
    result = fn(body, served.snapshot, served.config, served.clock())
    expired = before - len(served.snapshot.ledger)
    if expired > 0:
        served.metrics.ledger_expired.inc(expired)
    _report(served, result)
    return _json(result.body), "ok"


async def _filter(request: web.Request) -> tuple[web.Response, str]:
    return await _sync_verb(request, verbs.filter_nodes)


async def _prioritize(request: web.Request) -> tuple[web.Response, str]:
    return await _sync_verb(request, verbs.prioritize)


async def _preempt(request: web.Request) -> tuple[web.Response, str]:
    return await _sync_verb(request, verbs.preempt)


async def _bind(request: web.Request) -> tuple[web.Response, str]:
    served = request.app[SERVED_KEY]
    metrics = served.metrics
    body = await _read_json(request)
    args = verbs.parse_bind_args(body)
    try:
        result, retries = await verbs.bind(args, served.snapshot, served.binder, served.clock(), served.read_pod)
    except verbs.BindRefused as exc:
        metrics.requests_refused.labels(served.server, "/bind", exc.reason).inc()
        log.warning("bind refused", extra={"pod": args.key, "node": args.node, "decision": {"reason": exc.reason}})
        return _json({"Error": str(exc)}), "refused"
    except verbs.BindError as exc:
        metrics.bind_failures.inc()
        metrics.bind_retries.inc(exc.retries)
        return _json({"Error": str(exc)}), "error"
    metrics.bind_retries.inc(retries)
    if result["Error"]:
        metrics.bind_failures.inc()
        return _json(result), "error"
    return _json(result), "ok"


_VERBS: dict[str, Handler] = {"filter": _filter, "prioritize": _prioritize, "preempt": _preempt, "bind": _bind}


async def _verb(request: web.Request) -> web.Response:
    """POST /<verb>: the verb under the per-request deadline, every failure answered as that verb's caller reads
    it (in band for filter and bind), and its duration and outcome counted."""
    served = request.app[SERVED_KEY]
    verb = request.path.lstrip("/")
    timeout = served.config.server.request_timeout_seconds

    def fail(status: int, message: str) -> web.Response:
        return _in_band_error(verb, message) if verb in IN_BAND_ERRORS else _error(status, message)

    start = time.perf_counter()
    outcome = "internal"
    try:
        async with asyncio.timeout(timeout):
            response, outcome = await _VERBS[verb](request)
        return response
    except _Outcome as o:
        outcome = o.outcome
        if o.outcome in ("too_large", "read_timeout"):
            reason = "body_too_large" if o.outcome == "too_large" else "read_timeout"
            served.metrics.requests_refused.labels(served.server, request.path, reason).inc()
        return fail(o.response.status, o.message)
    except verbs.NotReadyError as exc:
        outcome = "not_ready"
        return fail(503, str(exc))
    except InvalidInputError as exc:
        outcome = "bad_request"
        return fail(400, f"bad {verb} request: {exc}")
    except TimeoutError:
        outcome = "timeout"
        return fail(503, f"{verb} did not finish within {timeout} s")
    except Exception:
        log.exception("unexpected error", extra={"verb": verb})
        return fail(500, f"{INTERNAL_ERROR_PREFIX}{verb}; see the extender's log")
    finally:
        served.metrics.request_duration.labels(verb).observe(time.perf_counter() - start)
        served.metrics.requests.labels(verb, outcome).inc()


async def _healthz(_: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    if request.app[SERVED_KEY].snapshot.ready:
        return _json({"ready": True})
    return _json({"ready": False, "Error": "snapshot not synced with the API server yet"}, 503)


async def _metrics(request: web.Request) -> web.Response:
    served = request.app[SERVED_KEY]
    served.metrics.update_snapshot(served.snapshot, served.clock())
    served.metrics.update_binder(served.binder)
    return web.Response(body=served.metrics.exposition(), headers={"Content-Type": "text/plain; version=0.0.4"})


@web.middleware
async def _json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """aiohttp's own 4xx answers (no route, wrong method, too large) as the JSON errors callers expect."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = exc.text if exc.text and not exc.text.startswith(str(exc.status)) else exc.reason
        if exc.status == 404:
            message = f"no such endpoint {request.path} (verbs: POST /filter /prioritize /preempt /bind)"
        elif exc.status == 405:
            message = f"method {request.method} not allowed on {request.path}"
        response = _error(exc.status, message)
        if exc.status == 405 and "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response


@web.middleware
async def _authorize(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Who may call what (access.denial), before a byte of the body is read: the certificate's subject CN
    against the route's allowed clients; /bind refused where no scheduler identity is configured. A refusal is
    403 with the reason, logged and counted; the connection is closed (its body is never read)."""
    served = request.app[SERVED_KEY]
    transport = request.transport
    peercert = transport.get_extra_info("peercert") if transport is not None else None
    refusal = access.denial(
        request.path,
        bool(peercert),
        access.subject_common_names(peercert),
        served.config.server.tls,
        served.listener,
    )
    if refusal is not None:
        route = access.route_label(request.path)
        served.metrics.requests_refused.labels(served.server, route, refusal.reason).inc()
        log.warning(
            "request refused",
            extra={"decision": {"route": route, "reason": refusal.reason, "server": served.server}},
        )
        response = _error(403, refusal.message)
        response.force_close()
        return response
    return await handler(request)


def make_app(
    config: ExtenderConfig,
    snapshot: Snapshot,
    binder: verbs.Binder,
    *,
    events: EventSink | None = None,
    metrics: Metrics | None = None,
    clock: Clock = time.time,
    verbs_only: bool = False,
    read_pod: verbs.PodReader | None = None,
) -> web.Application:
    """The extender app; ``clock`` is wall time (decisions compare it with Kubernetes timestamps).

    ``verbs_only``: the loopback listener's app (no health, metrics, admission; its caller is the pod's own
    kube-scheduler). ``read_pod``: how /bind reads a pod its snapshot does not hold yet (None: it refuses it).
    """
    metrics = metrics if metrics is not None else Metrics()
    app = web.Application(client_max_size=config.server.max_body_bytes, middlewares=[_json_errors, _authorize])
    listener: access.Listener = "loopback" if verbs_only else "main"
    server = "extender-loopback" if verbs_only else "extender"
    app[SERVED_KEY] = _Served(config, snapshot, binder, events, metrics, clock, server, listener, read_pod)
    app[CONFIG_KEY] = config
    app[SNAPSHOT_KEY] = snapshot
    app[METRICS_KEY] = metrics
    for verb in _VERBS:
        app.router.add_post(f"/{verb}", _verb)
    if verbs_only:
        return app
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    # POST /admission/mutate (issue 6): gates qos pods when the controller runs
    add_admission_route(
        app, config, lambda reason: metrics.requests_refused.labels(server, "/admission/mutate", reason).inc()
    )
    return app


# With a client CA, these paths also answer clients without a certificate (see access.py).
ANONYMOUS_PATHS = access.ANONYMOUS_PATHS


def make_ssl_context(tls: TlsConfig) -> ssl.SSLContext | None:
    """Server TLS; with a client CA, a presented client certificate must be signed by it (CERT_OPTIONAL, so
    ANONYMOUS_PATHS stay reachable); every other path refuses a client without an allowed one (403)."""
    if tls.cert_file is None or tls.key_file is None:
        return None
    files = CertificateFiles(tls.cert_file, tls.key_file, tls.client_ca_file)
    return server_context(files, client_certificate="optional" if tls.client_ca_file is not None else "none")


def make_reloader(tls: TlsConfig, context: ssl.SSLContext, metrics: Metrics) -> CertificateReloader | None:
    """Reloads ``context``'s chain (and client CA) when the files change, counted by result; None without TLS."""
    if tls.cert_file is None or tls.key_file is None:
        return None

    def counted(ok: bool) -> None:
        metrics.certificate_reloads.labels("extender", "ok" if ok else "failed").inc()

    files = CertificateFiles(tls.cert_file, tls.key_file, tls.client_ca_file)
    return CertificateReloader(files, [context], on_reload=counted)


LINGERING_SECONDS = 2.0
"""After a refusal that left a body unread (403, 413, 408), aiohttp keeps reading and dropping it for this long
before closing (its default, 10 s, would let a slow client hold the connection that much longer); a short
lingering still lets an honest client read the answer instead of a reset."""


async def start_server(
    app: web.Application, config: ExtenderConfig, ssl_context: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, int]:
    """Listen on config.server.host:port (port 0: any free port); returns the runner and the bound port.

    ``ssl_context``: the live context to serve with (a CertificateReloader keeps it current); default: one made
    from server.tls. keepalive_timeout is server.read_timeout_seconds: aiohttp starts that timer when a
    connection opens and after each answer, and closes a connection whose next request's headers are not all in
    by then (a slow-loris client); an idle kube-scheduler connection is closed too and simply reopened."""
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        keepalive_timeout=config.server.read_timeout_seconds,
        lingering_time=LINGERING_SECONDS,
    )
    await runner.setup()
    ctx = ssl_context if ssl_context is not None else make_ssl_context(config.server.tls)
    site = web.TCPSite(runner, config.server.host, config.server.port, ssl_context=ctx)
    await site.start()
    port = config.server.port
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            port = int(address[1])
            break
    return runner, port


async def start_loopback_server(app: web.Application, port: int) -> tuple[web.AppRunner, int]:
    """The verbs-only plain-HTTP listener on 127.0.0.1:port (``make_app(verbs_only=True)``)."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = port
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            bound = int(address[1])
            break
    return runner, bound
