"""The source side of a migration: checkpoint, verified transfer, cutover, confirm — or roll back.

The decisions (which rollback after which failure, what a restarted agent does) are ``protocol``'s; this
module carries them out, journaling each phase *before* the step that depends on it, so a source agent
killed at any point can finish or undo the migration when it comes back (``Coordinator.reconcile``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from extender.agent import archive as arc
from extender.agent.backends.base import Backend, BackendError, WorkloadNotFoundError, WorkloadRef
from extender.agent.client import AgentClient, PeerError
from extender.agent.events import EventSink
from extender.agent.faults import FaultInjection, FaultPoint
from extender.agent.journal import Journal
from extender.agent.metrics import AgentMetrics
from extender.agent.protocol import (
    DestinationState,
    FailureKind,
    InDoubtAction,
    Outcome,
    Phase,
    RetryPolicy,
    SourceAction,
    Stage,
    after_abort,
    check_migration_id,
    in_doubt_action,
    reconcile_source,
    rollback_for,
)
from extender.core.migration import agent_identity

__all__ = ["Coordinator", "MigrationRequest"]

log = logging.getLogger("extender.agent.migrate")
T = TypeVar("T")


class MigrationRequest:
    def __init__(self, body: Any) -> None:
        if not isinstance(body, dict):
            raise ValueError("body must be a JSON object")
        unknown = set(body) - {"id", "workload", "destination"}
        if unknown:
            raise ValueError(f"unknown field(s): {', '.join(sorted(unknown))}")
        self.id = check_migration_id(body["id"]) if body.get("id") is not None else uuid.uuid4().hex[:20]
        self.workload = WorkloadRef.from_json(body.get("workload"))
        dest = body.get("destination")
        if not isinstance(dest, dict) or not isinstance(dest.get("url"), str):
            raise ValueError("destination.url (the destination agent's base URL) is required")
        if set(dest) - {"url", "workload", "node"}:
            raise ValueError("destination accepts only url, node and workload")
        node = dest.get("node")
        if node is not None and (not isinstance(node, str) or not node or len(node) > 253 or "/" in node):
            raise ValueError(f"destination.node must be a node name, got {node!r}")
        self.destination_node: str | None = node
        url = str(dest["url"]).rstrip("/")
        if not url.startswith(("https://", "http://")):
            raise ValueError(f"destination.url must be http(s)://host:port, got {url!r}")
        self.destination_url = url
        self.destination_workload = WorkloadRef.from_json(dest["workload"]) if dest.get("workload") else None


class StepFailed(Exception):
    def __init__(self, step: str, kind: FailureKind, reason: str) -> None:
        super().__init__(f"{step}: {reason}")
        self.step = step
        self.kind = kind
        self.reason = reason


class Coordinator:
    def __init__(
        self,
        *,
        node: str,
        backend: Backend,
        journal: Journal,
        client: AgentClient,
        metrics: AgentMetrics,
        events: EventSink,
        retry: RetryPolicy,
        resolve_timeout_seconds: float,
        faults: FaultInjection,
        boot_id: str,
    ) -> None:
        self.node = node
        self.backend = backend
        self.journal = journal
        self.client = client
        self.metrics = metrics
        self.events = events
        self.retry = retry
        self.resolve_timeout = resolve_timeout_seconds
        self.faults = faults
        self.boot_id = boot_id
        self._busy: set[str] = set()

    # ---------------------------------------------------------------- helpers
    def _save(self, rec: dict[str, Any], phase: Phase | None = None) -> None:
        if phase is not None:
            rec["phase"] = phase.value
            rec.setdefault("history", []).append([phase.value, round(time.time(), 3)])
        self.journal.save("source", rec)

    async def _retrying(self, rec: dict[str, Any], step: str, fn: Callable[[], Awaitable[T]]) -> T:
        p = self.retry

        def before_sleep(state: RetryCallState) -> None:
            self.metrics.retries.labels(step).inc()
            exc = state.outcome.exception() if state.outcome else None
            log.warning(
                "retrying step",
                extra={"migration": rec["id"], "step": step, "error": str(exc), "decision": state.attempt_number},
            )

        attempts = 0
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(p.attempts),
                wait=wait_exponential(
                    multiplier=p.initial_backoff_seconds, exp_base=p.multiplier, max=p.max_backoff_seconds
                )
                + wait_random(0, p.jitter_seconds),
                retry=retry_if_exception(lambda e: isinstance(e, PeerError) and e.kind is FailureKind.TRANSIENT),
                before_sleep=before_sleep,
                reraise=True,
            ):
                with attempt:
                    attempts += 1
                    return await fn()
        except PeerError as exc:
            raise StepFailed(step, exc.kind, f"{exc.reason} (after {attempts} attempt(s))") from None
        finally:
            rec.setdefault("attempts", {})[step] = attempts
        raise AssertionError("unreachable")  # pragma: no cover

    async def _dump(self, rec: dict[str, Any], stage: Stage, workload: WorkloadRef) -> arc.ArchiveInfo:
        base = self.journal.archive_dir("source", rec["id"])
        image_dir = base / stage.value
        parent = base / Stage.PRECOPY.value if stage is Stage.FINAL else None
        t0 = time.monotonic()
        try:
            result = await self.backend.checkpoint(
                workload, image_dir, leave_running=stage is Stage.PRECOPY, parent_dir=parent
            )
        except BackendError as exc:
            raise StepFailed(f"checkpoint-{stage.value}", FailureKind.LOCAL, str(exc)) from None
        seconds = time.monotonic() - t0
        self.metrics.checkpoint_seconds.labels(stage.value).observe(seconds)
        rec["meta"] = result.meta
        rec["work_seconds"] = result.work_seconds
        info = await asyncio.to_thread(arc.pack_dir, image_dir, base / f"{stage.value}.tar")
        rec["archives"][stage.value] = {"size": info.size, "sha256": info.sha256}
        rec["timings"][f"checkpoint_{stage.value}"] = round(seconds, 4)
        return info

    async def _transfer(self, rec: dict[str, Any], stage: Stage, info: arc.ArchiveInfo) -> None:
        t0 = time.monotonic()
        await self._retrying(
            rec, f"transfer-{stage.value}", lambda: self.client.upload(rec["destination"], rec["id"], stage, info)
        )
        seconds = time.monotonic() - t0
        self.metrics.transfer_seconds.labels(stage.value).observe(seconds)
        self.metrics.bytes_moved.inc(info.size)
        rec["bytes"] = rec.get("bytes", 0) + info.size
        rec["timings"][f"transfer_{stage.value}"] = round(seconds, 4)

    def _cleanup_archives(self, mid: str) -> None:
        arc.remove_path(self.journal.archive_dir("source", mid))

    async def _post(self, rec: dict[str, Any], path: str, body: Any, timeout: float | None = None) -> dict[str, Any]:
        return await self.client.request(
            "POST", f"{rec['destination']}/v1/migrations/{rec['id']}/{path}", body, timeout=timeout
        )

    # ---------------------------------------------------------------- the protocol
    async def migrate(self, req: MigrationRequest) -> dict[str, Any]:
        self.backend.validate(req.workload)
        existing = self.journal.get("source", req.id)
        if existing is not None:
            if req.id in self._busy or not Phase(existing["phase"]).terminal:
                raise RuntimeError(f"migration {req.id} is in progress (phase {existing['phase']})")
            return existing  # idempotent: the recorded outcome
        if not await self.backend.is_running(req.workload, {}):
            raise WorkloadNotFoundError(f"{req.workload} is not running here")
        key = str(req.workload)
        if key in self._busy:
            raise RuntimeError(f"{key} is already being migrated")
        self._busy.update({req.id, key})
        try:
            return await self._migrate(req)
        finally:
            self._busy.difference_update({req.id, key})

    async def _migrate(self, req: MigrationRequest) -> dict[str, Any]:
        t_start = time.monotonic()
        rec: dict[str, Any] = {
            "id": req.id,
            "role": "source",
            "node": self.node,
            "workload": req.workload.to_json(),
            "destination": req.destination_url,
            "destination_node": req.destination_node,
            "destination_workload": req.destination_workload.to_json() if req.destination_workload else None,
            "archives": {},
            "timings": {},
            "created": time.time(),
        }
        self._save(rec, Phase.NEW)
        log.info(
            "migration started", extra={"migration": req.id, "workload": str(req.workload), "node": req.destination_url}
        )
        phase = Phase.NEW
        try:
            if getattr(self.backend, "single_checkpoint", False):
                return await self._migrate_single(req, rec, t_start)
            precopy = await self._dump(rec, Stage.PRECOPY, req.workload)
            phase = Phase.CHECKPOINTED
            self._save(rec, phase)
            self.faults.maybe_kill(FaultPoint.SOURCE_KILL_AFTER_CHECKPOINT)

            await self._transfer(rec, Stage.PRECOPY, precopy)
            phase = Phase.TRANSFERRED
            self._save(rec, phase)

            await self._prepare(rec)
            phase = Phase.PREPARED
            self._save(rec, phase)

            # Cutover: journal first — from here the process may be stopped by the final dump.
            phase = Phase.CUTOVER
            self._save(rec, phase)
            final = await self._dump(rec, Stage.FINAL, req.workload)
            phase = Phase.FINAL_DUMPED
            self._save(rec, phase)
            self.faults.maybe_kill(FaultPoint.SOURCE_KILL_AFTER_FINAL_DUMP)

            await self._transfer(rec, Stage.FINAL, final)
            phase = Phase.FINAL_TRANSFERRED
            self._save(rec, phase)

            phase = Phase.RESTORE_SENT
            self._save(rec, phase)
            return await self._restore_and_commit(rec, t_start)
        except StepFailed as exc:
            rec["failed_step"] = exc.step
            rec["reason"] = f"{exc.step} failed: {exc.reason}"
            log.warning("migration step failed", extra={"migration": req.id, "step": exc.step, "error": exc.reason})
            return await self._rollback(rec, phase, exc.kind, t_start)

    async def _migrate_single(self, req: MigrationRequest, rec: dict[str, Any], t_start: float) -> dict[str, Any]:
        """One checkpoint per move, for backends whose checkpoint never stops the workload (kubelet: the source
        container runs on until its pod is deleted). A pre-copy would be a second full checkpoint, transferred
        for nothing: the final one replaces it whole. So: cutover (journaled), the one checkpoint, transfer,
        prepare (the destination checks it can restore this image), restore. Every failure before the restore
        request rolls back to "the source never stopped"; the phases and fault points keep their meaning."""
        phase = Phase.CUTOVER
        try:
            self._save(rec, phase)
            final = await self._dump(rec, Stage.FINAL, req.workload)
            phase = Phase.FINAL_DUMPED
            self._save(rec, phase)
            self.faults.maybe_kill(FaultPoint.SOURCE_KILL_AFTER_CHECKPOINT)
            self.faults.maybe_kill(FaultPoint.SOURCE_KILL_AFTER_FINAL_DUMP)

            await self._transfer(rec, Stage.FINAL, final)
            phase = Phase.FINAL_TRANSFERRED
            self._save(rec, phase)
            await self._prepare(rec)

            phase = Phase.RESTORE_SENT
            self._save(rec, phase)
            return await self._restore_and_commit(rec, t_start)
        except StepFailed as exc:
            rec["failed_step"] = exc.step
            rec["reason"] = f"{exc.step} failed: {exc.reason}"
            log.warning("migration step failed", extra={"migration": req.id, "step": exc.step, "error": exc.reason})
            return await self._rollback(rec, phase, exc.kind, t_start)

    async def _prepare(self, rec: dict[str, Any]) -> None:
        """Asks the destination to get ready for this migration (it checks it can restore the image)."""
        prepared = await self._retrying(
            rec,
            "prepare",
            lambda: self._post(
                rec, "prepare", {"meta": rec["meta"], "source_node": self.node, "source_boot_id": self.boot_id}
            ),
        )
        rec["destination_node"] = prepared.get("node")
        rec["same_kernel"] = prepared.get("boot_id") == self.boot_id

    async def _restore_and_commit(self, rec: dict[str, Any], t_start: float) -> dict[str, Any]:
        """The restore request (the caller has journaled RESTORE_SENT), then the commit."""
        t0 = time.monotonic()
        restored = await self._retrying(
            rec,
            "restore",
            lambda: self._post(rec, "restore", {"meta": rec["meta"], "target": rec["destination_workload"]}),
        )
        rec["timings"]["restore"] = round(time.monotonic() - t0, 4)
        rec["timings"]["restore_at_destination"] = restored.get("seconds")
        rec["restored_workload"] = restored.get("workload")
        self.faults.maybe_kill(FaultPoint.SOURCE_KILL_BEFORE_COMMIT)
        return await self._commit(rec, t_start)

    async def _commit(self, rec: dict[str, Any], t_start: float) -> dict[str, Any]:
        """The destination confirmed: stop the source for good, delete archives on both sides."""
        workload = WorkloadRef.from_json(rec["workload"])
        try:
            await self.backend.stop(workload, rec.get("meta", {}))
        except BackendError as exc:
            log.warning("stopping the source after commit failed", extra={"migration": rec["id"], "error": str(exc)})
        rec["outcome"] = Outcome.SUCCEEDED.value
        retried = {step: n for step, n in rec.get("attempts", {}).items() if n > 1}
        if "reason" not in rec:
            rec["reason"] = "restored at the destination and confirmed" + (
                f" (retried: {', '.join(f'{s} x{n}' for s, n in retried.items())})" if retried else ""
            )
        rec["timings"]["total"] = round(time.monotonic() - t_start, 4)
        self._save(rec, Phase.COMMITTED)
        self._cleanup_archives(rec["id"])
        try:
            await self._retrying(rec, "commit", lambda: self._post(rec, "commit", {}))
        except StepFailed as exc:  # the destination GCs unconfirmed staging; the migration itself succeeded
            log.warning("commit notice not delivered", extra={"migration": rec["id"], "error": exc.reason})
        self.metrics.migrations.labels(Outcome.SUCCEEDED.value).inc()
        self.metrics.work_preserved.inc(float(rec.get("work_seconds") or 0.0))
        await self._event(
            rec, "MigrationSucceeded", f"migrated to {rec.get('destination_node') or rec['destination']}", warning=False
        )
        log.info("migration committed", extra={"migration": rec["id"], "seconds": rec["timings"]["total"]})
        return rec

    async def _abort_destination(self, rec: dict[str, Any]) -> DestinationState | None:
        """The fence: the destination answers restored/committed, or aborts for good. None: unreachable."""
        try:
            answer = await self._post(rec, "abort", {"reason": rec.get("reason", "")}, timeout=10)
        except PeerError as exc:
            rec["abort_error"] = exc.reason
            return None
        try:
            state = DestinationState(str(answer.get("state")))
        except ValueError:
            return None
        if state in (DestinationState.RESTORED, DestinationState.COMMITTED) and answer.get("workload"):
            rec["restored_workload"] = answer["workload"]
        return state

    async def _restore_local(self, rec: dict[str, Any]) -> tuple[bool, str]:
        workload = WorkloadRef.from_json(rec["workload"])
        meta = rec.get("meta", {})
        if await self.backend.is_running(workload, meta):
            return True, "the source workload is still running"
        image_dir = self.journal.archive_dir("source", rec["id"]) / Stage.FINAL.value
        if not self.backend.image_complete(image_dir):
            return False, f"no complete final image in {image_dir}"
        t0 = time.monotonic()
        try:
            await self.backend.restore(image_dir, meta, workload)
        except BackendError as exc:
            return False, f"local restore failed: {exc}"
        seconds = time.monotonic() - t0
        self.metrics.restore_seconds.labels("source").observe(seconds)
        rec["timings"]["restore_local"] = round(seconds, 4)
        return True, "restored at the source from the final image"

    async def _resolve(self, rec: dict[str, Any]) -> SourceAction | InDoubtAction:
        """Ask the destination (abort fence) until it answers or the resolve deadline passes."""
        deadline = time.monotonic() + self.resolve_timeout
        delay = 0.1
        while True:
            state = await self._abort_destination(rec)
            if state is not None:
                action = after_abort(state)
                rec["destination_state"] = state.value
                if action is not SourceAction.RESOLVE:
                    return action
            if time.monotonic() >= deadline:
                return in_doubt_action(bool(rec.get("same_kernel")), self.backend.fenced_by_pid)
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)

    async def _rollback(self, rec: dict[str, Any], phase: Phase, kind: FailureKind, t_start: float) -> dict[str, Any]:
        plan = rollback_for(phase, kind)
        action: SourceAction | InDoubtAction = plan.source
        rec["rollback"] = {"phase": phase.value, "kind": kind.value, "action": plan.source.value}
        if plan.source is SourceAction.RESOLVE:
            action = await self._resolve(rec)
            rec["rollback"]["resolved"] = action.value
            if action is SourceAction.COMMIT:
                rec["reason"] = f"{rec.get('reason')}; the destination had restored it: committed"
                return await self._commit(rec, t_start)
        elif plan.abort_destination:
            state = await self._abort_destination(rec)
            if state in (DestinationState.RESTORED, DestinationState.COMMITTED):  # cannot happen before RESTORE_SENT
                return await self._commit(rec, t_start)
        if action is InDoubtAction.KEEP_IN_DOUBT:
            return await self._finish(
                rec,
                Outcome.IN_DOUBT,
                Phase.IN_DOUBT,
                t_start,
                "the destination stayed unreachable after the restore request; final image kept for recovery",
            )
        if action is InDoubtAction.RESTORE_LOCAL:
            meta = rec.get("meta", {})
            workload = WorkloadRef.from_json(rec["workload"])
            if await self.backend.is_running(workload, {"identity": meta.get("identity")}):
                # Same kernel, PID taken by a process that looks like ours: almost surely the destination's
                # restored copy. Restoring would be refused anyway (the PID fence); do not guess further.
                return await self._finish(
                    rec,
                    Outcome.IN_DOUBT,
                    Phase.IN_DOUBT,
                    t_start,
                    f"the destination stayed unreachable; {workload} runs on this kernel under the original PID "
                    "(most likely the destination's restored copy); final image kept for recovery",
                )
        ok = True
        detail = "the source workload never stopped"
        if action in (SourceAction.RESTORE_LOCAL, SourceAction.ENSURE_RUNNING, InDoubtAction.RESTORE_LOCAL):
            ok, detail = await self._restore_local(rec)
        elif action is SourceAction.NOTHING:
            ok = await self.backend.is_running(WorkloadRef.from_json(rec["workload"]), rec.get("meta", {}))
            if not ok:
                detail = "the source workload is not running any more (it exited or was stopped by someone else)"
        if ok:
            return await self._finish(rec, Outcome.ROLLED_BACK, Phase.ROLLED_BACK, t_start, detail)
        return await self._finish(rec, Outcome.FAILED, Phase.FAILED, t_start, detail)

    async def _finish(
        self, rec: dict[str, Any], outcome: Outcome, phase: Phase, t_start: float, detail: str
    ) -> dict[str, Any]:
        rec["outcome"] = outcome.value
        rec["reason"] = f"{rec.get('reason', 'interrupted')}; {detail}"
        rec["timings"]["total"] = round(time.monotonic() - t_start, 4)
        keep = outcome in (Outcome.IN_DOUBT, Outcome.FAILED)
        rec["archives_kept"] = str(self.journal.archive_dir("source", rec["id"])) if keep else None
        self._save(rec, phase)
        if not keep:
            self._cleanup_archives(rec["id"])
        self.metrics.migrations.labels(outcome.value).inc()
        await self._event(
            rec,
            "MigrationRolledBack" if outcome is Outcome.ROLLED_BACK else "MigrationFailed",
            f"{outcome.value}: {rec['reason']}",
            warning=True,
        )
        log.warning(
            "migration ended", extra={"migration": rec["id"], "decision": outcome.value, "error": rec["reason"]}
        )
        return rec

    async def _event(self, rec: dict[str, Any], reason: str, message: str, *, warning: bool) -> None:
        ref = WorkloadRef.from_json(rec["workload"])
        if ref.pod_key is not None:
            await self.events.emit(ref, reason, message, warning=warning)

    # ---------------------------------------------------------------- restart
    async def reconcile(self) -> list[dict[str, Any]]:
        """Finish or roll back every migration this agent was coordinating when it died."""
        done = []
        for rec in self.journal.all("source"):
            phase = Phase(rec["phase"])
            if phase.terminal:
                continue
            t_start = time.monotonic()
            if rec.get("destination_node"):
                self.client.pin(rec["destination"], agent_identity(rec["destination_node"]))
            workload = WorkloadRef.from_json(rec["workload"])
            alive = await self.backend.is_running(workload, rec.get("meta", {}))
            image_dir = self.journal.archive_dir("source", rec["id"]) / Stage.FINAL.value
            complete = self.backend.image_complete(image_dir)
            action = reconcile_source(phase, alive, complete)
            rec["reason"] = f"source agent restarted during phase {phase.value}"
            log.warning(
                "reconciling migration", extra={"migration": rec["id"], "step": phase.value, "decision": action.value}
            )
            kind = FailureKind.TRANSIENT
            if action is SourceAction.NOTHING:
                done.append(await self._rollback(rec, min(phase, Phase.PREPARED, key=_order), kind, t_start))
            elif action is SourceAction.ENSURE_RUNNING:
                done.append(await self._rollback(rec, Phase.CUTOVER, kind, t_start))
            else:
                done.append(await self._rollback(rec, Phase.RESTORE_SENT, kind, t_start))
        return done


def _order(p: Phase) -> int:
    return list(Phase).index(p)


def archive_path(journal: Journal, mid: str, stage: Stage) -> Path:
    return journal.archive_dir("source", mid) / f"{stage.value}.tar"
