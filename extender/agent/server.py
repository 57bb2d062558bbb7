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
import datetime as dt
import hashlib
import logging
import os
import shutil
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from extender.agent import archive as arc
from extender.agent import authz
from extender.agent.backends.base import Backend, BackendError, WorkloadNotFoundError, WorkloadRef
from extender.agent.client import AgentClient, PeerError
from extender.agent.events import EventSink, KubeEventSink, NullEventSink
from extender.agent.faults import FaultInjection, FaultPoint
from extender.agent.identity import Requester
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
from extender.core.migration import MigrationPolicy, agent_identity, migration_refusal
from extender.signals import stop_event
from extender.tls import CertificateFiles, CertificateReloader, server_context, subject_common_names

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


def certificate_files(config: AgentConfig) -> CertificateFiles | None:
    tls = config.tls
    if not tls.enabled:
        return None
    assert tls.cert_file and tls.key_file and tls.ca_file
    return CertificateFiles(tls.cert_file, tls.key_file, tls.ca_file)


def server_ssl_context(config: AgentConfig) -> ssl.SSLContext | None:
    """mTLS server side: every client must present a certificate signed by the agents' CA; which routes it may
    call is ``authz``'s decision (the middleware below)."""
    files = certificate_files(config)
    return server_context(files, client_certificate="required") if files is not None else None


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
        api: Any = None,
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
        self.api = api  # kubernetes-asyncio ApiClient: reads the pod before a checkpoint (migration.check_pods)
        self.staging_reserved = 0  # bytes of uploads in flight, counted against migration.max_staging_bytes

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

    def staging_used(self) -> int:
        """Bytes under every destination staging directory (archives, unpacked images, partial uploads)."""
        root = self.journal.archive_dir("destination", "x").parent
        total = 0
        for path in root.rglob("*") if root.is_dir() else ():
            try:
                if path.is_file() and not path.is_symlink():
                    total += path.stat().st_size
            except OSError:
                continue
        return total

    def staging_refusal(self, rec: dict[str, Any], size: int) -> str | None:
        """Why an archive of ``size`` bytes may not be staged for ``rec`` (migration.max_migration_bytes,
        max_staging_bytes, the disk's free space), or None. Checked before a byte is written."""
        policy = self.config.migration
        mine = sum(int(a.get("size", 0)) for a in rec.get("archives", {}).values())
        if mine + size > policy.max_migration_bytes:
            return (
                f"migration {rec['id']} would stage {mine + size} bytes here, more than "
                f"migration.max_migration_bytes ({policy.max_migration_bytes})"
            )
        used = self.staging_used() + self.staging_reserved
        if used + size > policy.max_staging_bytes:
            return (
                f"staging is full: {used} bytes in use and {size} more asked, limit migration.max_staging_bytes "
                f"({policy.max_staging_bytes})"
            )
        root = self.journal.archive_dir("destination", rec["id"]).parent
        root.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(root).free
        if size * 2 > free:  # the tar and its unpacked image are on disk together for a moment
            return f"staging disk has {free} bytes free, an archive of {size} bytes needs twice that"
        return None

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
CALLER_KEY = web.RequestKey("qos_caller", authz.Caller)


def _route(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else request.path


@web.middleware
async def authorize(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every route answers only the identities ``authz.ROUTES`` names (the TLS layer has already required a
    certificate of the agents' CA). Without TLS (allow_plaintext, tests only) nobody can be told apart."""
    agent = request.app[AGENT_KEY]
    if not agent.config.tls.enabled or request.match_info.http_exception is not None:
        return await handler(request)  # plaintext, or a 404/405 the router answers anyway
    route = _route(request)
    transport = request.transport
    names = subject_common_names(transport.get_extra_info("peercert") if transport is not None else None)
    caller = authz.classify(names, agent.config.authz.controllers, agent.config.authz.metrics_clients)
    reason = authz.refusal(request.method, route, caller, agent.config.node_name)
    if reason is not None:
        agent.metrics.refused.labels(route, "identity").inc()
        log.warning(
            "request refused",
            extra={"node": agent.config.node_name, "decision": "forbidden", "route": route, "error": reason},
        )
        return _error(403, reason)
    request[CALLER_KEY] = caller
    return await handler(request)


def _owner_refusal(request: web.Request, rec: dict[str, Any]) -> web.Response | None:
    """A destination record belongs to the agent that first called for it (its CN, kept in ``owner``)."""
    caller = request.get(CALLER_KEY)
    if not isinstance(caller, authz.Caller):
        return None
    why = authz.owner_refusal(rec.get("owner"), caller)
    if why is not None:
        agent = request.app[AGENT_KEY]
        route = _route(request)
        agent.metrics.refused.labels(route, "owner").inc()
        log.warning("request refused", extra={"migration": rec["id"], "decision": "owner", "error": why})
        return _error(403, why)
    rec["owner"] = caller.name
    return None


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
    if agent.journal.get("source", req.id) is None:  # a repeated POST answers the outcome recorded
        refused = await _policy_refusal(agent, req) or await _destination_refusal(agent, req)
        if refused is not None:
            kind, reason = refused
            agent.metrics.refused.labels("/v1/migrations", kind).inc()
            log.warning(
                "migration refused",
                extra={"migration": req.id, "workload": str(req.workload), "decision": kind, "error": reason},
            )
            return _error(403, reason)
    try:
        rec = await agent.coordinator.migrate(req)
    except WorkloadNotFoundError as exc:
        return _error(404, str(exc))
    except RuntimeError as exc:
        return _error(409, str(exc))
    return _json(rec)


async def _read_pod(agent: Agent, namespace: str, name: str) -> dict[str, Any] | None:
    from kubernetes_asyncio import client as k8s

    from extender.kube.client import ApiError, read_json

    try:
        pod = await read_json(
            await k8s.CoreV1Api(agent.api).read_namespaced_pod(
                name, namespace, _preload_content=False, _request_timeout=agent.config.resolve_timeout_seconds
            )
        )
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    return pod if isinstance(pod, dict) else None


async def _policy_refusal(agent: Agent, req: MigrationRequest) -> tuple[str, str] | None:
    """Before any checkpoint: may this node's agent dump this workload at all (``core.migration``)?"""
    policy = agent.config.migration
    wl = req.workload
    if wl.namespace is None or wl.pod is None:
        return None  # a process by PID (criu backend, not for pods): no pod to ask about
    if wl.namespace in policy.denied_namespaces:
        return "policy", f"pod {wl.pod_key}: namespace {wl.namespace} is never migrated (migration.denied_namespaces)"
    if not policy.check_pods:
        return None
    if agent.api is None:
        return "policy", "this agent has no API access to read the pod (migration.check_pods needs `get pods`)"
    try:
        pod = await _read_pod(agent, wl.namespace, wl.pod)
    except Exception as exc:  # API unreachable, timeout, 403: the pod cannot be checked, so it is not moved
        return "policy", f"cannot read pod {wl.pod_key} to check it may be migrated: {exc}"
    if pod is None:
        return "policy", f"pod {wl.pod_key} does not exist"
    reason = migration_refusal(
        pod,
        agent.config.node_name,
        MigrationPolicy(policy.denied_namespaces, policy.namespaces, policy.scheduler_names),
    )
    return ("policy", reason) if reason is not None else None


async def _destination_refusal(agent: Agent, req: MigrationRequest) -> tuple[str, str] | None:
    """The archive holds the container's memory: it goes only to the agent of the node the request names, over
    https, and that agent must prove it with its certificate (CN qos-agent:<node>) before anything is dumped."""
    if not agent.config.tls.enabled:
        return None  # allow_plaintext (tests only): no identity to check
    url, node = req.destination_url, req.destination_node
    if not url.startswith("https://"):
        return "destination", f"destination.url {url!r} is not https: archives hold process memory"
    if node is None:
        return "destination", "destination.node is required: the destination must prove it is that node's agent"
    if node == agent.config.node_name:
        return "destination", f"destination node {node} is this node"
    identity = agent_identity(node)
    agent.client.pin(url, identity)
    try:
        info = await agent.client.request("GET", f"{url}/v1/info", timeout=10)
    except PeerError as exc:
        return "destination", f"destination {url} is not the agent of node {node}: {exc.reason}"
    if info.get("node") != node:
        return "destination", f"destination {url} says it is node {info.get('node')!r}, not {node}"
    return None


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
        if (denied := _owner_refusal(request, rec)) is not None:
            return denied
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
        full = agent.staging_refusal(rec, size)
        if full is not None:
            agent.metrics.refused.labels(_route(request), "staging").inc()
            log.warning("archive refused", extra={"migration": mid, "step": stage.value, "error": full})
            return _error(507, full)
        staging.mkdir(parents=True, exist_ok=True)
        part = staging / f"{stage.value}.tar.part"
        agent._dsave(rec, DestinationState.RECEIVING)
        agent.staging_reserved += size
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
        finally:
            agent.staging_reserved -= size  # what was written is on disk now, counted by staging_used()
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
        if (denied := _owner_refusal(request, rec)) is not None:
            return denied
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
        if (denied := _owner_refusal(request, rec)) is not None:
            return denied
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
        if (denied := _owner_refusal(request, rec)) is not None:
            return denied
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
        if (denied := _owner_refusal(request, rec)) is not None:
            return denied
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
    app = web.Application(client_max_size=1 << 20, middlewares=[authorize])
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


async def _identities(config: AgentConfig) -> tuple[Any, list[Requester]]:
    """identity.enabled: this node's certificates, requested through the CSR API before anything is served
    (the server and the peer client load them at start), then renewed in the background."""
    from extender.agent.identity import AGENT_SIGNER, KUBELET_SIGNER, Requester

    ident = config.identity
    tls, kubelet = config.tls, config.kubelet
    if not tls.cert_file or not tls.key_file:
        raise BackendError("identity.enabled needs tls.cert_file and tls.key_file: where the certificate is written")
    node_ip = ident.node_ip or os.environ.get("NODE_IP")
    if not node_ip:
        raise BackendError("identity.enabled needs the node's IP: identity.node_ip or $NODE_IP")
    api = await _api_client(config)
    common: dict[str, Any] = {
        "node": config.node_name,
        "expiration_seconds": ident.expiration_seconds,
        "timeout_seconds": ident.timeout_seconds,
    }
    requesters = [
        Requester(
            api,
            signer=AGENT_SIGNER,
            usages=("digital signature", "server auth", "client auth"),
            ips=(node_ip,),
            dns=ident.dns_names,
            cert_file=Path(tls.cert_file),
            key_file=Path(tls.key_file),
            **common,
        ),
    ]
    if ident.kubelet_client and config.backend == "kubelet":
        if not kubelet.cert_file or not kubelet.key_file:
            raise BackendError("identity.kubelet_client needs kubelet.cert_file and kubelet.key_file")
        requesters.append(
            Requester(
                api,
                signer=KUBELET_SIGNER,
                usages=("digital signature", "client auth"),
                ips=(),
                cert_file=Path(kubelet.cert_file),
                key_file=Path(kubelet.key_file),
                **common,
            )
        )
    now = dt.datetime.now(dt.UTC)
    for r in requesters:
        if r.needs_renewal(now):
            try:
                await r.obtain()
            except Exception as exc:  # denied, not signed in time, API refused: the agent cannot serve
                await api.close()
                raise BackendError(f"no {r.signer} certificate for node {config.node_name}: {exc}") from exc
    return api, requesters


async def run_agent(config: AgentConfig, started: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT: reconcile the journal first, then accept requests."""
    requesters: list[Requester] = []
    identity_api = None
    if config.identity.enabled:
        identity_api, requesters = await _identities(config)
    backend, closers = await make_backend(config)
    if identity_api is not None:
        closers.append(identity_api)
    events: EventSink = NullEventSink()
    if config.events and config.backend != "criu" and (config.kubeconfig or os.environ.get("KUBECONFIG")):
        api = await _api_client(config)
        closers.append(api)
        events = KubeEventSink(api)
    api = None
    if config.migration.check_pods and (
        config.kubeconfig or os.environ.get("KUBECONFIG") or os.environ.get("KUBERNETES_SERVICE_HOST")
    ):
        api = await _api_client(config)
        closers.append(api)
    agent = Agent(config, backend, events=events, api=api)
    await backend.quiesce(Path(config.state_dir), config.criu.command_timeout_seconds)
    agent.reconcile_destination()
    agent.gc()
    runner = web.AppRunner(make_app(agent), access_log=None)
    await runner.setup()
    ssl_ctx = server_ssl_context(config)
    reloader: CertificateReloader | None = None
    files = certificate_files(config)
    if files is not None and ssl_ctx is not None:
        # Short-lived identities (extender/agent/identity.py renews them) and Secret updates reach a running
        # agent: the server's and the peer client's contexts take the new chain.
        contexts = [ssl_ctx] + ([agent.client.ssl_context] if agent.client.ssl_context is not None else [])
        reloader = CertificateReloader(
            files,
            contexts,
            on_reload=lambda ok: agent.metrics.certificate_reloads.labels("ok" if ok else "failed").inc(),
        )
    site = web.TCPSite(runner, config.host, config.port, ssl_context=ssl_ctx)
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
    reload_task = loop.create_task(reloader.run(config.certificate_check_seconds)) if reloader else None
    renewals = [loop.create_task(r.run(), name=f"renew {r.signer}") for r in requesters]
    try:
        await stop.wait()
    finally:
        gc_task.cancel()
        for task in renewals:
            task.cancel()
        if reload_task is not None:
            reload_task.cancel()
        await runner.cleanup()
        await agent.client.close()
        await backend.close()
        for c in closers:
            await c.close()
