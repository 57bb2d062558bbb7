"""The agent's HTTP API (aiohttp, mTLS): the controller's entry point and the destination side of the protocol.

Routes (all JSON; errors as ``{"error": reason}``):
  POST /v1/migrations                          controller -> source: migrate, answers the outcome record
  GET  /v1/migrations/{id}                     either role: the journaled record
  PUT  /v1/migrations/{id}/archive/{stage}     source -> destination: tar stream + size + sha256 headers
  POST /v1/migrations/{id}/prepare             source -> destination: can you restore this? (409: refused)
  POST /v1/migrations/{id}/restore             source -> destination: restore the final image (idempotent)
  POST /v1/migrations/{id}/commit              source -> destination: confirmed, delete the archives
  POST /v1/migrations/{id}/abort               source -> destination: the fence (answers the final state)
  POST /v1/migrations/{id}/discard             controller -> destination: the restored workload was not used
                                               (kubelet: its pod never ran): drop what the restore left
  GET  /v1/info, /healthz, /metrics
  PUT  /v1/test/faults                         TEST ONLY, 404 unless started with test fault injection
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import ssl
import time
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from extender.agent import archive as arc
from extender.agent.backends.base import Backend, BackendError, WorkloadNotFoundError, WorkloadRef
from extender.agent.client import AgentClient
from extender.agent.events import EventSink, KubeEventSink, NullEventSink
from extender.agent.faults import FaultInjection, FaultPoint
from extender.agent.journal import Journal
from extender.agent.metrics import AgentMetrics
from extender.agent.migrate import Coordinator, MigrationRequest
from extender.agent.protocol import (
    ARCHIVE_SHA256_HEADER,
    ARCHIVE_SIZE_HEADER,
    DestinationState,
    Stage,
    check_declared,
    check_migration_id,
    reconcile_destination,
    transfer_verdict,
)
from extender.agent.settings import AgentConfig, find_criu
from extender.signals import stop_event

__all__ = ["Agent", "make_app", "run_agent", "server_ssl_context"]

log = logging.getLogger("extender.agent.server")
_STAGING_TTL_SECONDS = 3600.0
_RETENTION_SECONDS = 7 * 86400.0
_DONE = (DestinationState.RESTORED, DestinationState.COMMITTED)


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:  # pragma: no cover
        return "unknown"


def server_ssl_context(config: AgentConfig) -> ssl.SSLContext | None:
    """mTLS server side: every client (peer agent or controller) must present a cert signed by the CA."""
    tls = config.tls
    if not tls.enabled:
        return None
    assert tls.cert_file and tls.key_file and tls.ca_file
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cafile=tls.ca_file)
    return ctx


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _error(status: int, reason: str) -> web.Response:
    return _json({"error": reason}, status)


class Agent:
    """Everything one agent process holds: backend, journal, peer client, metrics, coordinator."""

    def __init__(
        self,
        config: AgentConfig,
        backend: Backend,
        *,
        events: EventSink | None = None,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.faults = FaultInjection(enabled=config.test_fault_injection)
        self.metrics = metrics or AgentMetrics()
        self.journal = Journal(Path(config.state_dir))
        self.client = AgentClient(config.tls, config.request_timeout_seconds, self.faults)
        self.boot_id = boot_id()
        self.coordinator = Coordinator(
            node=config.node_name,
            backend=backend,
            journal=self.journal,
            client=self.client,
            metrics=self.metrics,
            events=events or NullEventSink(),
            retry=config.retry,
            resolve_timeout_seconds=config.resolve_timeout_seconds,
            faults=self.faults,
            boot_id=self.boot_id,
        )
        self._locks: dict[str, asyncio.Lock] = {}
        self.ready = False

    def lock(self, mid: str) -> asyncio.Lock:
        return self._locks.setdefault(mid, asyncio.Lock())

    # ------------------------------------------------------------ destination state
    def _drec(self, mid: str) -> dict[str, Any]:
        rec = self.journal.get("destination", mid)
        if rec is None:
            rec = {
                "id": mid,
                "role": "destination",
                "state": DestinationState.UNKNOWN.value,
                "archives": {},
                "created": time.time(),
            }
        return rec

    def _dsave(self, rec: dict[str, Any], state: DestinationState) -> None:
        rec["state"] = state.value
        self.journal.save("destination", rec)

    def _staging(self, mid: str) -> Path:
        return self.journal.archive_dir("destination", mid)

    def reconcile_destination(self) -> None:
        for rec in self.journal.all("destination"):
            state = DestinationState(rec["state"])
            alive = False
            if state is DestinationState.RESTORING:
                meta = rec.get("meta", {})
                pid = meta.get("pid")
                alive = _pid_alive(pid, meta.get("identity")) if isinstance(pid, int) else False
            new = reconcile_destination(state, alive)
            if new is not state:
                log.warning(
                    "reconciled destination record",
                    extra={"migration": rec["id"], "decision": f"{state.value}->{new.value}"},
                )
                if new is DestinationState.RESTORED:
                    rec["restored_workload"] = {"pid": rec["meta"]["pid"]}
                for part in self._staging(rec["id"]).glob("*.part"):
                    part.unlink(missing_ok=True)
                self._dsave(rec, new)

    def gc(self) -> None:
        """Drop staging of migrations nobody finished within the TTL (a source that died and never came back),
        and journal records of finished migrations after the retention period."""
        now = time.time()
        for rec in self.journal.all("destination"):
            age = now - float(rec.get("updated", now))
            state = DestinationState(rec["state"])
            if age > _RETENTION_SECONDS and state in (DestinationState.COMMITTED, DestinationState.ABORTED):
                self.journal.delete("destination", rec["id"])
            elif age > _STAGING_TTL_SECONDS and self._staging(rec["id"]).exists():
                arc.remove_path(self._staging(rec["id"]))
                if state not in _DONE:
                    self._dsave(rec, DestinationState.ABORTED)
        for rec in self.journal.all("source"):
            if rec.get("outcome") and now - float(rec.get("updated", now)) > _RETENTION_SECONDS:
                self.journal.delete("source", rec["id"])


def _pid_alive(pid: int, identity: str | None) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    comm = raw[raw.find("(") + 1 : raw.rfind(")")]
    state = raw[raw.rfind(")") + 2 :].split()[0]
    return state not in ("Z", "X") and (identity is None or comm == identity)


AGENT_KEY = web.AppKey("agent", Agent)


def _agent(request: web.Request) -> Agent:
    return request.app[AGENT_KEY]


def _mid(request: web.Request) -> str:
    try:
        return check_migration_id(request.match_info["id"])
    except ValueError as exc:
        raise web.HTTPBadRequest(
            text=orjson.dumps({"error": str(exc)}).decode(), content_type="application/json"
        ) from None


async def _body(request: web.Request) -> Any:
    try:
        return orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise web.HTTPBadRequest(
            text=orjson.dumps({"error": f"invalid JSON: {exc}"}).decode(), content_type="application/json"
        ) from None


# ---------------------------------------------------------------- controller-facing
async def post_migration(request: web.Request) -> web.Response:
    agent = _agent(request)
    try:
        req = MigrationRequest(await _body(request))
        agent.backend.validate(req.workload)
    except ValueError as exc:
        return _error(400, str(exc))
    try:
        rec = await agent.coordinator.migrate(req)
    except WorkloadNotFoundError as exc:
        return _error(404, str(exc))
    except RuntimeError as exc:
        return _error(409, str(exc))
    return _json(rec)


async def get_migration(request: web.Request) -> web.Response:
    agent = _agent(request)
    mid = _mid(request)
    role = request.query.get("role")
    for r in ("source", "destination"):
        if role in (None, r):
            rec = agent.journal.get("source" if r == "source" else "destination", mid)
            if rec is not None:
                return _json(rec)
    return _error(404, f"no migration {mid}")


# ---------------------------------------------------------------- destination side
async def put_archive(request: web.Request) -> web.Response:
    agent = _agent(request)
    mid = _mid(request)
    try:
        stage = Stage(request.match_info["stage"])
        size, sha = check_declared(
            request.headers.get(ARCHIVE_SIZE_HEADER),
            request.headers.get(ARCHIVE_SHA256_HEADER),
            agent.config.max_archive_bytes,
        )
    except ValueError as exc:
        return _error(400, str(exc))
    async with agent.lock(mid):
        rec = agent._drec(mid)
        state = DestinationState(rec["state"])
        if state in (
            DestinationState.ABORTED,
            DestinationState.COMMITTED,
            DestinationState.RESTORED,
            DestinationState.RESTORING,
            DestinationState.RESTORE_FAILED,
        ):
            return _error(409, f"migration {mid} is {state.value}: no more archives accepted")
        staging = agent._staging(mid)
        staging.mkdir(parents=True, exist_ok=True)
        part = staging / f"{stage.value}.tar.part"
        agent._dsave(rec, DestinationState.RECEIVING)
        t0 = time.monotonic()
        h = hashlib.sha256()
        got = 0
        kill_at = max(1, min(agent.faults.cut_after_bytes, size // 2))
        try:
            with part.open("wb") as f:
                async for chunk in request.content.iter_chunked(1 << 20):
                    got += len(chunk)
                    if got > size:
                        break
                    h.update(chunk)
                    f.write(chunk)
                    if got >= kill_at:
                        agent.faults.maybe_kill(FaultPoint.DEST_KILL_DURING_TRANSFER)
        except Exception as exc:  # a cut connection surfaces as several aiohttp/OS error types
            part.unlink(missing_ok=True)
            agent._dsave(rec, DestinationState.UNKNOWN if not rec["archives"] else DestinationState.STAGED)
            log.warning("upload broke off", extra={"migration": mid, "step": stage.value, "error": repr(exc)})
            return _error(400, f"upload broke off after {got} bytes: {exc!r}")
        verdict = transfer_verdict(size, sha, got, h.hexdigest())
        if not verdict.ok:
            part.unlink(missing_ok=True)
            agent._dsave(rec, DestinationState.STAGED if rec["archives"] else DestinationState.UNKNOWN)
            log.warning("archive rejected", extra={"migration": mid, "step": stage.value, "error": verdict.reason})
            return _error(422, f"{stage.value} archive rejected: {verdict.reason}")
        tar = staging / f"{stage.value}.tar"
        os.replace(part, tar)
        try:
            await asyncio.to_thread(arc.unpack, tar, staging / stage.value)
        except Exception as exc:  # any unreadable archive is the same refusal
            return _error(422, f"{stage.value} archive unreadable: {exc}")
        finally:
            tar.unlink(missing_ok=True)
        if stage is Stage.FINAL and not agent.backend.image_complete(staging / stage.value):
            return _error(422, "final archive holds no complete checkpoint")
        rec["archives"][stage.value] = {"size": size, "sha256": sha, "seconds": round(time.monotonic() - t0, 4)}
        agent._dsave(rec, DestinationState.STAGED)
        return _json({"size": size, "sha256": sha})


async def post_prepare(request: web.Request) -> web.Response:
    agent = _agent(request)
    mid = _mid(request)
    body = await _body(request)
    if not isinstance(body, dict) or not isinstance(body.get("meta"), dict):
        return _error(400, "prepare needs {meta: {...}}")
    async with agent.lock(mid):
        rec = agent._drec(mid)
        state = DestinationState(rec["state"])
        if state is not DestinationState.STAGED and state is not DestinationState.PREPARED:
            return _error(409, f"migration {mid} is {state.value}, not staged")
        if agent.faults.fires(FaultPoint.DEST_REFUSE_PREPARE):
            return _error(409, "TEST FAULT: destination refuses to prepare")
        try:
            await agent.backend.prepare(body["meta"])
        except BackendError as exc:
            return _error(409, f"destination cannot restore this image: {exc}")
        rec["meta"] = body["meta"]
        rec["source_node"] = body.get("source_node")
        agent._dsave(rec, DestinationState.PREPARED)
    return _json({"node": agent.config.node_name, "boot_id": agent.boot_id})


async def post_restore(request: web.Request) -> web.Response:
    agent = _agent(request)
    mid = _mid(request)
    body = await _body(request)
    if not isinstance(body, dict) or not isinstance(body.get("meta"), dict):
        return _error(400, "restore needs {meta: {...}, target: {...} | null}")
    try:
        target = WorkloadRef.from_json(body["target"]) if body.get("target") else None
    except ValueError as exc:
        return _error(400, str(exc))
    async with agent.lock(mid):
        rec = agent._drec(mid)
        state = DestinationState(rec["state"])
        if state in _DONE:
            return _json(
                {"state": state.value, "workload": rec.get("restored_workload"), "seconds": rec.get("restore_seconds")}
            )
        if state in (DestinationState.ABORTED, DestinationState.RESTORE_FAILED):
            return _error(409, f"migration {mid} is {state.value}: {rec.get('reason', '')}".rstrip(": "))
        image_dir = agent._staging(mid) / Stage.FINAL.value
        if "final" not in rec["archives"] or not image_dir.is_dir():
            return _error(409, "the final archive is not staged here")
        if agent.faults.fires(FaultPoint.DEST_REFUSE_RESTORE):
            rec["reason"] = "TEST FAULT: destination refuses restore"
            agent._dsave(rec, DestinationState.RESTORE_FAILED)
            arc.remove_path(agent._staging(mid))
            return _error(409, rec["reason"])
        if agent.faults.fires(FaultPoint.DEST_FAIL_RESTORE):
            return _error(500, "TEST FAULT: destination restore failed transiently")
        rec["meta"] = body["meta"]
        agent._dsave(rec, DestinationState.RESTORING)
        agent.faults.maybe_kill(FaultPoint.DEST_KILL_BEFORE_RESTORE)
        t0 = time.monotonic()
        try:
            restored = await agent.backend.restore(image_dir, body["meta"], target)
        except BackendError as exc:
            rec["reason"] = f"restore failed at {agent.config.node_name}: {exc}"
            agent._dsave(rec, DestinationState.RESTORE_FAILED)
            arc.remove_path(agent._staging(mid))
            log.warning("restore failed", extra={"migration": mid, "error": str(exc)})
            return _error(409, rec["reason"])
        seconds = time.monotonic() - t0
        agent.metrics.restore_seconds.labels("destination").observe(seconds)
        rec["restored_workload"] = restored.to_json()
        rec["restore_seconds"] = round(seconds, 4)
        agent._dsave(rec, DestinationState.RESTORED)
        agent.faults.maybe_kill(FaultPoint.DEST_KILL_AFTER_RESTORE)
        log.info("restored", extra={"migration": mid, "workload": str(restored), "seconds": round(seconds, 4)})
        return _json(
            {"state": DestinationState.RESTORED.value, "workload": restored.to_json(), "seconds": round(seconds, 4)}
        )


async def post_commit(request: web.Request) -> web.Response:
    agent = _agent(request)
    mid = _mid(request)
    async with agent.lock(mid):
        rec = agent._drec(mid)
        state = DestinationState(rec["state"])
        if state not in _DONE:
            return _error(409, f"migration {mid} is {state.value}, not restored")
        arc.remove_path(agent._staging(mid))
        agent._dsave(rec, DestinationState.COMMITTED)
    return _json({"state": DestinationState.COMMITTED.value})


async def post_abort(request: web.Request) -> web.Response:
    """The fence: restored/committed stays so (answered); anything else becomes aborted for good."""
    agent = _agent(request)
    mid = _mid(request)
    body = await _body(request) if request.can_read_body else {}
    async with agent.lock(mid):
        rec = agent._drec(mid)
        state = DestinationState(rec["state"])
        if state in _DONE:
            return _json({"state": state.value, "workload": rec.get("restored_workload")})
        arc.remove_path(agent._staging(mid))
        if state is not DestinationState.ABORTED:
            rec["reason"] = (
                f"aborted by the source: {(body or {}).get('reason', '')}" if isinstance(body, dict) else "aborted"
            )
            agent._dsave(rec, DestinationState.ABORTED)
    return _json({"state": DestinationState.ABORTED.value})


async def post_discard(request: web.Request) -> web.Response:
    """After a committed migration whose restored workload the controller gave up on (kubelet backend: the pod
    made from the checkpoint image never ran): remove what the restore left on this node (the image)."""
    agent = _agent(request)
    mid = _mid(request)
    async with agent.lock(mid):
        rec = agent.journal.get("destination", mid)
        if rec is None:
            return _error(404, f"no migration {mid} here")
        restored = rec.get("restored_workload")
        discard = getattr(agent.backend, "discard", None)
        if DestinationState(rec["state"]) not in _DONE or not isinstance(restored, dict):
            return _error(409, f"migration {mid} is {rec['state']}: nothing restored to discard")
        if discard is not None:
            try:
                await discard(WorkloadRef.from_json(restored))
            except BackendError as exc:
                return _error(500, f"discarding {restored}: {exc}")
        rec["discarded"] = True
        agent.journal.save("destination", rec)
    return _json({"discarded": restored})


# ---------------------------------------------------------------- misc
async def get_info(request: web.Request) -> web.Response:
    agent = _agent(request)
    return _json(
        {
            "node": agent.config.node_name,
            "boot_id": agent.boot_id,
            "backend": agent.backend.name,
            "features": await agent.backend.features(),
            "test_fault_injection": agent.faults.enabled,
            "pid": os.getpid(),
        }
    )


async def healthz(request: web.Request) -> web.Response:
    return web.Response(
        text="ok" if _agent(request).ready else "starting", status=200 if _agent(request).ready else 503
    )


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(_agent(request).metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def put_faults(request: web.Request) -> web.Response:
    agent = _agent(request)
    if not agent.faults.enabled:
        return _error(404, "not found")
    try:
        agent.faults.configure(await _body(request))
    except ValueError as exc:
        return _error(400, str(exc))
    return _json(agent.faults.snapshot())


async def get_faults(request: web.Request) -> web.Response:
    agent = _agent(request)
    if not agent.faults.enabled:
        return _error(404, "not found")
    return _json(agent.faults.snapshot())


def make_app(agent: Agent) -> web.Application:
    app = web.Application(client_max_size=1 << 20)
    app[AGENT_KEY] = agent
    app.router.add_post("/v1/migrations", post_migration)
    app.router.add_get("/v1/migrations/{id}", get_migration)
    app.router.add_put("/v1/migrations/{id}/archive/{stage}", put_archive)
    app.router.add_post("/v1/migrations/{id}/prepare", post_prepare)
    app.router.add_post("/v1/migrations/{id}/restore", post_restore)
    app.router.add_post("/v1/migrations/{id}/commit", post_commit)
    app.router.add_post("/v1/migrations/{id}/abort", post_abort)
    app.router.add_post("/v1/migrations/{id}/discard", post_discard)
    app.router.add_get("/v1/info", get_info)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_put("/v1/test/faults", put_faults)
    app.router.add_get("/v1/test/faults", get_faults)
    return app


async def make_backend(config: AgentConfig) -> tuple[Backend, list[Any]]:
    """The configured backend and what must be closed with it."""
    closers: list[Any] = []
    if config.backend == "criu":
        from extender.agent.backends.criu import ChildReaper, CriuBackend

        criu = find_criu(config.criu.path)
        if criu is None:
            raise BackendError("criu not found: set criu.path or $QOS_CRIU, or run hack/build-criu.sh")
        reaper = ChildReaper()
        reaper.start()
        closers.append(reaper)
        backend: Backend = CriuBackend(criu, config.criu, reaper)
        f = await backend.features()
        if not f["check_ok"]:
            raise BackendError(f"criu check failed on this node: {f['check']}")
        return backend, closers
    if config.backend == "simulated":
        from extender.agent.backends.simulated import (
            InMemoryProgressStore,
            KubeAnnotationProgressStore,
            SimulatedBackend,
        )

        if config.simulated_store == "kubernetes":
            api = await _api_client(config)
            closers.append(api)
            return SimulatedBackend(KubeAnnotationProgressStore(api)), closers
        return SimulatedBackend(InMemoryProgressStore()), closers
    from extender.agent.backends.kubelet import KubeletBackend

    return KubeletBackend(os.environ.get("NODE_IP", "127.0.0.1"), config.kubelet), closers


async def _api_client(config: AgentConfig) -> Any:
    from extender.kube.client import new_api_client
    from extender.settings.sections import KubernetesConfig

    return await new_api_client(KubernetesConfig(kubeconfig=config.kubeconfig))


async def run_agent(config: AgentConfig, started: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT: reconcile the journal first, then accept requests."""
    backend, closers = await make_backend(config)
    events: EventSink = NullEventSink()
    if config.events and config.backend != "criu" and (config.kubeconfig or os.environ.get("KUBECONFIG")):
        api = await _api_client(config)
        closers.append(api)
        events = KubeEventSink(api)
    agent = Agent(config, backend, events=events)
    await backend.quiesce(Path(config.state_dir), config.criu.command_timeout_seconds)
    agent.reconcile_destination()
    agent.gc()
    runner = web.AppRunner(make_app(agent), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, ssl_context=server_ssl_context(config))
    await site.start()
    server: Any = site._server
    port = server.sockets[0].getsockname()[1] if server is not None and server.sockets else config.port
    log.info(
        "agent listening",
        extra={
            "node": config.node_name,
            "decision": {
                "host": config.host,
                "port": port,
                "backend": backend.name,
                "tls": config.tls.enabled,
                "test_fault_injection": config.test_fault_injection,
                "features": await backend.features(),
            },
        },
    )
    stop = stop_event()
    loop = asyncio.get_running_loop()
    reconciled = await agent.coordinator.reconcile()
    for rec in reconciled:
        log.warning("reconciled migration", extra={"migration": rec["id"], "decision": rec.get("outcome")})
    agent.ready = True
    if started is not None:
        started.set()

    async def gc_loop() -> None:
        while True:
            await asyncio.sleep(600)
            agent.gc()

    gc_task = loop.create_task(gc_loop())
    try:
        await stop.wait()
    finally:
        gc_task.cancel()
        await runner.cleanup()
        await agent.client.close()
        await backend.close()
        for c in closers:
            await c.close()
