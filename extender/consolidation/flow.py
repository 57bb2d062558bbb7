"""The consolidation flow (issue #8): the autoscaler's ``ConsolidationHandoff`` that acts.

Each scan the autoscaler hands over the sustained under-utilised batch nodes and the all-or-nothing plans
of ``core.reschedule.consolidation_plans`` (worst-utilised first), once its batch queue has been quiet. This
shell applies what ``policy`` decides, one node at a time, in a background task (``handoff`` returns at
once):

1. pick the first plan worth starting (``select_plan``) and check the batch queue is still quiet;
2. cordon the node (``spec.unschedulable`` + annotation ``qos.kube-qos-extender.io/consolidation=<plan>``),
   then re-check the plan on the live pods and the current destinations (``check_plan``);
3. for each pod: create the destination pod (same spec, new name, a schedulerName nobody serves), bind it
   to the planned node through our binder (``KubeBinder``, UID precondition), wait until it runs, ask the
   source node's agent to migrate (checkpoint -> verified transfer -> restore at the destination agent),
   check the destination holds the workload (``confirm_destination``), and only then delete the source pod;
   a rolled-back move deletes the destination pod (the source kept running) and ends the plan. With the
   kubelet backend (real pods) the order differs: the agents first checkpoint the container and import the
   checkpoint image on the destination node, then the destination pod is created from that image, and the
   source is deleted once its container runs (``move_pod``);
4. all pods moved and nothing else on the node (``removable``): delete it through the provider; otherwise
   uncordon it and leave it alone for ``left_alone_seconds``. Every step that fails says why in an Event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes_asyncio import client as k8s

from extender.agent.client import AgentClient, PeerError
from extender.agent.protocol import FailureKind
from extender.agent.settings import AgentTlsConfig
from extender.autoscaler.events import AutoscalerEvents
from extender.autoscaler.handoff import Consolidation
from extender.autoscaler.loop import PROVISIONED_BY_LABEL, PROVISIONED_BY_VALUE, Notice
from extender.autoscaler.metrics import AutoscalerMetrics
from extender.autoscaler.providers.base import Provider
from extender.autoscaler.settings import AutoscalerSettings
from extender.autoscaler.view import AutoscalerSnapshot
from extender.consolidation import policy
from extender.consolidation.metrics import ConsolidationMetrics
from extender.consolidation.policy import MoveVerdict, NodeOutcome
from extender.consolidation.settings import ConsolidationSettings
from extender.core import owners
from extender.core.disruption import Action, Disruption, DisruptionKind, Verdict, decide
from extender.core.migration import agent_identity
from extender.core.model import WorkloadKind
from extender.core.owners import OwnerKind
from extender.core.reschedule import MigrationPlan
from extender.kube.binder import KubeBinder
from extender.kube.binding import BindArgs, BindError
from extender.kube.client import ApiError, read_json
from extender.settings.extender import ConfigError, ExtenderConfig
from extender.settings.sections import DisruptionSettings

__all__ = ["AutoscalerRuntime", "ConsolidationFlow"]

log = logging.getLogger("extender.consolidation")


class _Abort(Exception):
    """The plan cannot be completed: uncordon, leave the node alone, say why."""


class AutoscalerRuntime(Protocol):
    """What the flow uses of a started autoscaler (``autoscaler.main.RunningAutoscaler`` satisfies it): its
    API client, provider, snapshot, settings, Events and /metrics registry. Narrow on purpose, so the flow
    depends on the autoscaler's parts, never on the process that wires them (no import cycle)."""

    @property
    def config(self) -> ExtenderConfig: ...
    @property
    def settings(self) -> AutoscalerSettings: ...
    @property
    def snapshot(self) -> AutoscalerSnapshot: ...
    @property
    def metrics(self) -> AutoscalerMetrics: ...
    @property
    def api_client(self) -> Any: ...
    @property
    def provider(self) -> Provider | None: ...
    @property
    def events(self) -> AutoscalerEvents | None: ...


class ConsolidationFlow:
    """A ``ConsolidationHandoff`` that empties and deletes under-utilised batch nodes through the agents."""

    def __init__(
        self,
        settings: ConsolidationSettings,
        *,
        clock: Callable[[], float] = time.time,
        token: Callable[[], str] = lambda: secrets.token_hex(3),
        disruption: DisruptionSettings | None = None,
    ) -> None:
        self.s = settings
        # the guard rails (budgets, dry-run, PDBs): the extender file's `disruption:` section (start() takes the
        # running autoscaler's unless one is given here)
        self.disruption = disruption
        self._clock = clock
        self._token = token
        self.latest: Consolidation | None = None
        self.left_alone: dict[str, float] = {}
        self.busy: set[str] = set()
        self.outcomes: list[NodeOutcome] = []
        self.metrics = ConsolidationMetrics()
        self._wake = asyncio.Event()
        self._last_pending: float | None = None
        self._done_at = -math.inf
        self._task: asyncio.Task[None] | None = None
        self._running: AutoscalerRuntime | None = None
        self._client: AgentClient | None = None
        self._events: Any = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._motion_nodes: set[str] = set()  # nodes being emptied (not dry-run): in motion for the budgets
        self._moving: dict[str, Disruption] = {}  # pod key -> its migration in flight
        self._reported: dict[str, float] = {}  # dry-run: node -> until when it is not reported again
        self._said: dict[tuple[str, str, str], float] = {}  # (reason, kind, object) -> until when not said again

    # ------------------------------------------------------------------------------------------ lifecycle

    def handoff(self, consolidation: Consolidation) -> None:
        self.latest = consolidation
        self._wake.set()

    async def start(self, running: AutoscalerRuntime) -> None:
        """Attach to a started autoscaler (its API client, provider, snapshot, Events, /metrics registry)."""
        if running.provider is None:
            raise ConfigError(
                "consolidation needs a provider: kwok (it deletes the emptied node) or cluster-autoscaler with "
                "provisioning_requests (the emptied node is left to CA's scale-down)"
            )
        self._running = running
        if self.disruption is None:
            self.disruption = running.config.disruption
        self.metrics = ConsolidationMetrics(running.metrics.registry)
        self.attach(running.api_client, running.config.bind, events=running.events)
        self._task = asyncio.create_task(self._run(), name="consolidation")
        log.info("consolidation flow started", extra={"decision": {"provisioned_only": self.s.provisioned_only}})

    async def start_term(self, running: AutoscalerRuntime) -> None:
        """A leader term of the autoscaler began (extender.processes.sidecar.TermService): the first starts the
        flow, a later one restarts its loop (metrics and client are kept)."""
        if self._running is None:
            await self.start(running)
        elif self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="consolidation")

    async def stop_term(self) -> None:
        """The term ended: cancel the loop and the consolidation in flight; a former leader writes nothing more."""
        await self._cancel()

    async def _cancel(self) -> None:
        for task in [self._task, *self._tasks]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def attach(self, api_client: Any, bind: Any, *, events: Any = None) -> None:
        """The API client, binder settings (``ExtenderConfig.bind``), Events sink and agent client ``move_pod``
        needs; ``start`` calls it. Alone, it lets a caller move single pods without running the autoscaler."""
        self._core = k8s.CoreV1Api(api_client)
        self._apps = k8s.AppsV1Api(api_client)
        self._binder = KubeBinder(api_client, bind)
        self._events = events
        tls = AgentTlsConfig(cert_file=self.s.cert_file, key_file=self.s.key_file, ca_file=self.s.ca_file)
        self._client = AgentClient(tls, timeout_seconds=self.s.migration_timeout_seconds)

    async def stop(self) -> None:
        await self._cancel()
        if self._client is not None:
            await self._client.close()

    @property
    def r(self) -> AutoscalerRuntime:
        assert self._running is not None, "ConsolidationFlow.start() first"
        return self._running

    # ------------------------------------------------------------------------------------------ the loop

    def _pending_batch(self) -> bool:
        snap = self.r.snapshot
        names = frozenset(self.r.settings.scheduler_names)
        return any(
            e.pod.kind is WorkloadKind.BATCH
            and e.pod.node_name is None
            and (info := snap.pending.get(k)) is not None
            and info.scheduler_name in names
            for k, e in snap.pods.items()
        )

    def _owned(self) -> frozenset[str] | None:
        if not self.s.provisioned_only:
            return None
        return frozenset(
            name
            for name, entry in self.r.snapshot.nodes.items()
            if entry.node.labels.get(PROVISIONED_BY_LABEL) == PROVISIONED_BY_VALUE
        )

    async def _run(self) -> None:
        quiet_for = self.s.batch_queue_quiet_seconds
        if quiet_for is None:
            quiet_for = self.r.settings.batch_queue_quiet_seconds
        while True:
            await self._wake.wait()
            self._wake.clear()
            c = self.latest
            now = self._clock()
            quiet, self._last_pending = policy.batch_queue_quiet(
                self._pending_batch(), self._last_pending, now, quiet_for
            )
            if c is None or c.at <= self._done_at or not quiet:
                continue  # a hand-off from before the last consolidation ended is stale: wait for a new scan
            self._start_plans(c, now)

    @property
    def guard(self) -> DisruptionSettings:
        if self.disruption is None:
            self.disruption = DisruptionSettings()
        return self.disruption

    def _group(self, node: str) -> str:
        entry = self.r.snapshot.nodes.get(node) if self._running is not None else None
        group = entry.node.group if entry is not None else None
        return group.value if group is not None else "none"

    def _in_motion(self) -> list[Disruption]:
        nodes = [Disruption(DisruptionKind.CONSOLIDATION, n, self._group(n)) for n in sorted(self._motion_nodes)]
        return nodes + list(self._moving.values())

    def _start_plans(self, c: Consolidation, now: float) -> None:
        """Start as many of the hand-off's plans as ``concurrent_nodes`` and the disruption budgets allow (the
        worst-utilised first: when a budget holds one, none after it overtakes it); in dry-run each is only
        looked at and reported."""
        self._reported = {n: t for n, t in self._reported.items() if t > now}
        while len(self.busy) < self.s.concurrent_nodes:
            plan = policy.select_plan(
                c,
                busy=frozenset(self.busy),
                left_alone={**self.left_alone, **self._reported},
                owned=self._owned(),
                now=now,
            )
            if plan is None:
                return
            d = Disruption(DisruptionKind.CONSOLIDATION, plan.source, self._group(plan.source))
            verdict = decide(self.guard.core_budgets, self._in_motion(), [d], now, dry_run=self.guard.dry_run)[0]
            if verdict.action is Action.WAIT:
                self._waiting(verdict, "Node", "", plan.source)
                return
            dry = verdict.action is Action.REPORT
            if dry:
                self._reported[plan.source] = now + max(self.guard.report_interval_seconds, 1.0)
            else:
                self._motion_nodes.add(plan.source)
            self.busy.add(plan.source)
            task = asyncio.create_task(self._consolidate_task(plan, dry), name=f"consolidation {plan.source}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _consolidate_task(self, plan: MigrationPlan, dry_run: bool) -> None:
        try:
            outcome = await self.consolidate(plan, dry_run=dry_run)
        except Exception:  # a bug must not stop the flow; consolidate() already uncordoned
            log.exception("consolidation failed", extra={"node": plan.source})
        else:
            self.outcomes.append(outcome)
        finally:
            self.busy.discard(plan.source)
            self._motion_nodes.discard(plan.source)
            if not dry_run:
                self._done_at = self._clock()
            self._wake.set()

    def _once(self, reason: str, kind: str, obj: str) -> bool:
        """Say this (an Event) now? Once per ``report_interval_seconds`` per reason and object."""
        now = self._clock()
        key = (reason, kind, obj)
        if self._said.get(key, -math.inf) > now:
            return False
        self._said = {k: t for k, t in self._said.items() if t > now}
        self._said[key] = now + self.guard.report_interval_seconds
        return True

    def _waiting(self, verdict: Verdict, kind: str, namespace: str, name: str) -> None:
        d = verdict.disruption
        self.metrics.disruptions.labels(d.kind.value, "waited").inc()
        obj = f"{namespace}/{name}" if namespace else name
        if self._once("QosDisruptionWaiting", kind, obj):
            what = f"{d.kind.value} of {d.pod or d.node}"
            self._say(kind, namespace, name, "", "QosDisruptionWaiting", f"{what} waits: {verdict.reason}", False)

    # ------------------------------------------------------------------------------------------ one node

    def _say(self, kind: str, namespace: str, name: str, uid: str, reason: str, message: str, warning: bool) -> None:
        log.info(message, extra={"decision": {"object": f"{kind}/{namespace}/{name}", "reason": reason}})
        if self._events is not None:
            self._events.emit(Notice(kind, namespace, name, uid, reason, message, warning))

    async def _node(self, name: str) -> dict[str, Any] | None:
        try:
            node: dict[str, Any] = await read_json(await self._core.read_node(name, _preload_content=False))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return node

    async def _pods_on(self, node: str) -> list[dict[str, Any]]:
        raw = await read_json(
            await self._core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}", _preload_content=False)
        )
        items: list[dict[str, Any]] = raw.get("items", [])
        return items

    async def _cordon(self, node: str, plan_id: str | None) -> None:
        body = policy.cordon_patch(plan_id)
        await read_json(await self._core.patch_node(node, body, _preload_content=False))

    async def consolidate(self, plan: MigrationPlan, *, dry_run: bool = False) -> NodeOutcome:
        """Empty ``plan.source`` through the agents and delete it, or leave it uncordoned with an Event. In dry-run
        only read: the node and pods are checked as for a real start, then each move it would make is reported
        (Event ``QosDisruptionDryRun`` on the node and on each pod, metric) and nothing changes."""
        source = plan.source
        plan_id = policy.plan_id(source, self._token())
        try:
            node = await self._node(source)
            if node is None:
                self.metrics.plans.labels("skipped").inc()
                return NodeOutcome(source, plan_id, False, "the node is gone")
            why = policy.may_cordon(node)
            if why is None:  # a pod annotated do-not-disrupt (or not migratable) keeps the node: not even a cordon
                why = policy.node_blocker(await self._pods_on(source))
        except Exception as exc:  # the API is failing: back off from this node as an aborted plan would
            self.left_alone[source] = self._clock() + self.s.left_alone_seconds
            self.metrics.plans.labels("aborted").inc()
            reason = f"{type(exc).__name__}: {exc}"
            message = (
                f"not cordoned: reading the node and its pods failed ({reason}); "
                f"left alone for {self.s.left_alone_seconds:.0f}s"
            )
            self._say("Node", "", source, "", "ConsolidationAborted", message, True)
            return NodeOutcome(source, plan_id, False, reason)
        if why is not None:
            self.metrics.plans.labels("skipped").inc()
            self.left_alone[source] = self._clock() + self.s.left_alone_seconds
            self._say("Node", "", source, "", "ConsolidationSkipped", why, True)
            return NodeOutcome(source, plan_id, False, why)
        if dry_run:
            return self._dry_run_report(plan, plan_id)
        self.busy.add(source)
        self.metrics.in_progress.inc()
        moves: list[Mapping[str, Any]] = []
        cordoned = False
        try:
            await self._cordon(source, plan_id)
            cordoned = True
            summary = ", ".join(f"{k} -> {d}" for k, d in plan.moves)
            self._say("Node", "", source, "", "ConsolidationStarted", f"cordoned; moving: {summary}", False)
            live = [p for p in await self._pods_on(source) if not _finished(p)]
            why = policy.check_plan(plan, self.r.snapshot.node_views(), [p for p in live if not _daemon(p)])
            if why is not None:
                raise _Abort(why)
            by_key = {policy.object_key(p): p for p in live}
            for i, (key, dest) in enumerate(plan.moves, start=1):
                migration = Disruption(DisruptionKind.MIGRATION, source, self._group(source), key)
                await self._within_budget(migration)
                self._moving[key] = migration
                try:
                    move = await self.move_pod(policy.migration_id(plan_id, i), by_key[key], source, dest)
                finally:
                    self._moving.pop(key, None)
                moves.append(move)
                if move["verdict"] is not MoveVerdict.COMMIT:
                    raise _Abort(f"moving {key} to {dest}: {move['outcome']}: {move['reason']}")
            why = policy.removable(await self._pods_on(source))
            if why is not None:
                raise _Abort(why)
            assert self.r.provider is not None
            preserved = sum(float((m.get("record") or {}).get("work_seconds") or 0.0) for m in moves)
            if self.r.settings.provider == "cluster-autoscaler":
                # one remover per node: CA removes empty nodes; we only stop holding its scale-down off
                body = policy.handed_to_cluster_autoscaler_patch()
                await read_json(await self._core.patch_node(source, body, _preload_content=False))
                self.metrics.plans.labels("emptied").inc()
                message = (
                    f"emptied by {len(moves)} migration(s) ({preserved:.1f}s of work preserved); left cordoned to "
                    "cluster-autoscaler's scale-down"
                )
                self._say("Node", "", source, "", "ConsolidatedNodeLeftToClusterAutoscaler", message, False)
                return NodeOutcome(source, plan_id, True, message, tuple(moves))
            await self.r.provider.delete(source)
            self.metrics.nodes_removed.inc()
            self.metrics.plans.labels("removed").inc()
            message = f"emptied by {len(moves)} migration(s) ({preserved:.1f}s of work preserved) and deleted"
            self._say("Node", "", source, "", "ConsolidatedNodeRemoved", message, False)
            return NodeOutcome(source, plan_id, True, message, tuple(moves))
        except Exception as exc:  # any failure (API, network, a bug): the node must not stay cordoned
            reason = str(exc) if isinstance(exc, _Abort) else f"{type(exc).__name__}: {exc}"
            if cordoned:
                with contextlib.suppress(Exception):
                    await self._cordon(source, None)
            self.left_alone[source] = self._clock() + self.s.left_alone_seconds
            self.metrics.plans.labels("aborted").inc()
            message = (
                f"consolidation stopped after {sum(1 for m in moves if m['verdict'] is MoveVerdict.COMMIT)} of "
                f"{len(plan.moves)} move(s): {reason}; uncordoned and left alone for {self.s.left_alone_seconds:.0f}s"
            )
            self._say("Node", "", source, "", "ConsolidationAborted", message, True)
            return NodeOutcome(source, plan_id, False, reason, tuple(moves))
        finally:
            self.busy.discard(source)
            self.metrics.in_progress.dec()

    def _dry_run_report(self, plan: MigrationPlan, plan_id: str) -> NodeOutcome:
        source = plan.source
        summary = ", ".join(f"{k} -> {d}" for k, d in plan.moves)
        self.metrics.disruptions.labels(DisruptionKind.CONSOLIDATION.value, "dry_run").inc()
        self.metrics.plans.labels("dry_run").inc()
        self._say("Node", "", source, "", "QosDisruptionDryRun",
                  f"dry-run: would cordon and empty this node by {len(plan.moves)} migration(s) ({summary}); "
                  "nothing changed", False)  # fmt: skip
        for key, dest in plan.moves:
            ns, name = key.split("/", 1)
            self.metrics.disruptions.labels(DisruptionKind.MIGRATION.value, "dry_run").inc()
            self._say("Pod", ns, name, "", "QosDisruptionDryRun",
                      f"dry-run: would migrate from {source} to {dest} (consolidation of {source}); nothing changed",
                      False)  # fmt: skip
        return NodeOutcome(source, plan_id, False, f"dry-run: would move {summary}")

    async def _within_budget(self, d: Disruption) -> None:
        """Wait until the budgets let this migration go (another node's move may hold a pod budget); give up
        (abort the plan) after ``pdb_wait_seconds``."""
        deadline = time.monotonic() + self.guard.pdb_wait_seconds
        while True:
            others = [m for m in self._in_motion() if m != d]
            verdict = decide(self.guard.core_budgets, others, [d], self._clock())[0]
            if verdict.action is not Action.WAIT:
                return
            ns, name = (d.pod or "/").split("/", 1)
            self._waiting(verdict, "Pod", ns, name)
            if time.monotonic() >= deadline:
                raise _Abort(f"migration of {d.pod} held for {self.guard.pdb_wait_seconds:.0f}s: {verdict.reason}")
            await asyncio.sleep(1.0)

    async def _pdb_allows(self, ns: str, name: str, uid: str) -> str | None:
        """Would the API evict this pod now (its PodDisruptionBudgets)? An Eviction with dryRun=All: None when it
        would, else why not (HTTP 429: a PDB allows no disruption now)."""
        body: Any = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
            "deleteOptions": {"dryRun": ["All"], **({"preconditions": {"uid": uid}} if uid else {})},
        }
        try:
            await read_json(
                await self._core.create_namespaced_pod_eviction(name, ns, body, dry_run="All", _preload_content=False)
            )
        except ApiError as exc:
            if exc.status == 429:
                return f"a PodDisruptionBudget allows no disruption of {ns}/{name} now ({exc})"
            raise
        return None

    async def _wait_for_pdb(self, ns: str, name: str, uid: str) -> None:
        """A migration deletes its source pod: wait while its PDBs forbid that, up to ``pdb_wait_seconds``."""
        if not self.guard.honour_pdbs_for_migrations:
            return
        deadline = time.monotonic() + self.guard.pdb_wait_seconds
        while True:
            why = await self._pdb_allows(ns, name, uid)
            if why is None:
                return
            self.metrics.disruptions.labels(DisruptionKind.MIGRATION.value, "pdb").inc()
            if self._once("QosDisruptionWaiting", "Pod", f"{ns}/{name}"):
                self._say("Pod", ns, name, uid, "QosDisruptionWaiting", f"migration waits: {why}", False)
            if time.monotonic() >= deadline:
                raise _Refused(f"{why}; waited {self.guard.pdb_wait_seconds:.0f}s")
            await asyncio.sleep(min(5.0, max(self.guard.pdb_wait_seconds / 10, 0.2)))

    # ------------------------------------------------------------------------------------------ one pod

    async def move_pod(self, mid: str, src: dict[str, Any], source: str, dest: str) -> dict[str, Any]:
        """Move one pod (its JSON) from node ``source`` to ``dest`` through the agents; never raises for a
        failed move: the result says how it ended (``verdict``, ``outcome``, ``reason``, the agent's record)."""
        t0 = time.monotonic()
        meta = src["metadata"]
        ns, name, uid = meta.get("namespace") or "default", meta["name"], meta.get("uid", "")
        dname = policy.destination_name(name, self._token())
        result: dict[str, Any] = {"id": mid, "pod": f"{ns}/{name}", "destination_pod": f"{ns}/{dname}", "node": dest}
        record: dict[str, Any] | None = None
        created = False
        checkpoint_image = False  # kubelet backend: the destination node holds a checkpoint image of this move
        source_gone = False  # a StatefulSet's source is stopped before its destination exists
        images: dict[str, str] = {}  # kubelet backend: container -> its checkpoint image on the destination
        moved: list[str] = []  # kubelet backend: the agents' migration ids, one per container
        kind = OwnerKind.NONE
        try:
            await self._wait_for_pdb(ns, name, uid)
            urls = {n: policy.agent_url(await self._node(n) or {}, port=self.s.agent_port, scheme=self.s.agent_scheme)
                    for n in (source, dest)}  # fmt: skip
            missing = [n for n, u in urls.items() if u is None]
            if missing:
                raise _Refused(f"no agent address for node(s) {', '.join(missing)} (annotation or InternalIP)")
            assert self._client is not None
            for node, url in urls.items():  # each agent must answer as its node's (CN qos-agent:<node>)
                self._client.pin(str(url), agent_identity(node))
            kind = owners.owner_kind(src)
            result["owner"] = kind.value
            if await self._backend(urls[source]) == "kubelet":
                # A container checkpoint restored into a new pod: the agents first make the checkpoint image on
                # the destination node, then the pod is created from it. The source never stops, so anything
                # failing before the source is deleted rolls back by deleting the destination pod.
                why = policy.checkpoint_blocker(src)
                if why is not None:
                    raise _Refused(why)
                await self._can_restore(urls[dest], dest)
                # one checkpoint per container, one after the other (agent migration ids <mid>, <mid>-1, ...): a
                # container restored in a pod of several keeps its own state as of its own checkpoint
                for i, c in enumerate(src["spec"]["containers"]):
                    cmid = policy.container_migration_id(mid, i)
                    rec = await self._migrate(cmid, urls[source], urls[dest], dest, ns, name, dname, c["name"])
                    record = record or rec
                    if i:  # the first is ``record``; the others' (their own checkpoint and commit times) beside it
                        result.setdefault("container_records", {})[c["name"]] = rec
                    checkpoint_image = True
                    moved.append(cmid)
                    outcome = str(rec.get("outcome")) if rec is not None else "unknown"
                    reason = str(rec.get("reason", "")) if rec is not None else "no answer from the source agent"
                    image = ((rec or {}).get("restored_workload") or {}).get("image")
                    if outcome != "succeeded" or not image:
                        break
                    images[c["name"]] = str(image)
                if outcome != "succeeded" and len(moved) > 1:  # an earlier container's image nobody will run
                    reason = f"container {len(moved) - 1}: {reason}" + await self._discard(urls[dest], *moved[:-1])
                if outcome == "succeeded":
                    assert record is not None
                    result["images"] = images
                    try:
                        if len(images) != len(src["spec"]["containers"]):
                            raise _Refused("the destination agent named no checkpoint image")
                        if kind is OwnerKind.STATEFUL_SET:
                            # the ordinal's name is its identity: the source goes first, the destination is born
                            # under its name (core.owners); from here on the source is no longer a fallback
                            trial, dname = dname, name
                            result["destination_pod"] = f"{ns}/{name}"
                            created = await self._restore_stateful(mid, src, dest, images, trial, result)
                            source_gone = True
                        else:
                            manifest: Any = policy.destination_manifest(
                                src, dname, scheduler_name=self.s.destination_scheduler_name, migration=mid,
                                checkpoint_image=images, owner=kind,
                            )  # fmt: skip
                            created = await self._create_bound(ns, dname, manifest, dest)
                            if kind is OwnerKind.REPLICA_SET:
                                min_ready = await self._min_ready_seconds(src)
                                await self._wait_running(ns, dname, ready=True, min_ready_seconds=min_ready)
                            else:
                                await self._wait_running(ns, dname)
                        gone = policy.destination_node_gone(await self._node(dest), dest)
                        if gone is not None:
                            raise _Refused(gone)
                    except Exception as exc:  # the source kept running: nothing is lost by giving up here
                        why = str(exc) if isinstance(exc, _Refused) else f"{type(exc).__name__}: {exc}"
                        source_gone = bool(result.get("source_released"))
                        if source_gone:
                            # a StatefulSet's source is stopped: its controller re-creates the ordinal from the
                            # template once the name is free (the workload runs again, from its start)
                            outcome = "failed"
                            reason = (f"the StatefulSet pod was stopped for the move but its restore on {dest} "
                                      f"failed: {why}; the StatefulSet re-creates it from its template")  # fmt: skip
                        else:
                            outcome = "rolled_back"
                            reason = f"restoring from the checkpoint image on {dest} failed: {why}"
                        if created:
                            await self._delete_pod(ns, dname)
                            created = False
                        reason += await self._discard(urls[dest], *moved)
            else:
                if kind is OwnerKind.STATEFUL_SET:
                    raise _Refused(
                        f"pod {ns}/{name} belongs to a StatefulSet: it moves with the kubelet backend only (its "
                        "name must be free before the destination exists, and this backend starts the destination "
                        "first)"
                    )
                manifest = policy.destination_manifest(
                    src, dname, scheduler_name=self.s.destination_scheduler_name, migration=mid, owner=kind
                )
                created = await self._create_bound(ns, dname, manifest, dest)
                await self._wait_running(ns, dname)
                record = await self._migrate(mid, urls[source], urls[dest], dest, ns, name, dname)
                outcome = str(record.get("outcome")) if record is not None else "unknown"
                reason = str(record.get("reason", "")) if record is not None else "no answer from the source agent"
        except _Refused as exc:
            outcome, reason = "refused", str(exc)
        except Exception as exc:  # API/network errors before the agent was asked: nothing moved
            outcome, reason = "refused", f"{type(exc).__name__}: {exc}"
        verdict = policy.after_outcome(outcome)
        if verdict is MoveVerdict.COMMIT:
            assert record is not None
            why = policy.confirm_destination(await self._pod(ns, dname), dest, record, images=images or None)
            if why is not None:
                verdict = policy.after_unconfirmed(source_still_runs=checkpoint_image)
                if verdict is MoveVerdict.ROLL_BACK:
                    outcome = "rolled_back"
                    reason = f"destination not confirmed: {why}" + await self._discard(urls[dest], *moved)
                else:
                    outcome, reason = "unconfirmed", why
        if verdict is MoveVerdict.COMMIT and kind in (OwnerKind.REPLICA_SET, OwnerKind.JOB):
            try:
                result.update(await self._hand_over(kind, mid, ns, name, dname))
            except _HandOverFailed as exc:
                verdict, outcome = MoveVerdict.ROLL_BACK, "rolled_back"
                reason = f"handing {ns}/{name} over to {dname} failed: {exc}"
                if checkpoint_image:
                    reason += await self._discard(urls[dest], *moved)
        if verdict is MoveVerdict.COMMIT and not source_gone:
            try:
                await self._delete_pod(ns, name)
            except Exception as exc:  # both copies run now: say so, never raise (the caller ends the plan)
                verdict, outcome = MoveVerdict.KEEP_BOTH, "unconfirmed"
                reason = f"the destination runs but deleting the source pod failed: {type(exc).__name__}: {exc}"
        if verdict is MoveVerdict.COMMIT and kind is OwnerKind.JOB:
            await self._job_settled(ns, name, result)
        if verdict is MoveVerdict.COMMIT:
            if checkpoint_image:
                # The checkpoint image stays on the destination node while the pod exists: the pod names it with
                # imagePullPolicy Never, so a restart of the container (a crash, a liveness failure) restores
                # the checkpoint again instead of failing with ErrImageNeverPull and leaving the moved workload
                # with no runnable copy. Once no container uses it the kubelet's image GC may remove it.
                result["checkpoint_image"] = "kept for the destination pod's container restarts"
        elif verdict is MoveVerdict.ROLL_BACK:
            if created:
                await self._delete_pod(ns, dname)
            self._say("Pod", ns, name, uid, "ConsolidationMoveRolledBack",
                      f"not moved to {dest}: {reason}; it keeps running on {source}", True)  # fmt: skip
        elif source_gone:
            self._say("Pod", ns, name, uid, "ConsolidationMoveFailed", f"moving to {dest} failed: {reason}", True)
        else:
            self._say("Pod", ns, name, uid, "ConsolidationMoveInDoubt",
                      f"moving to {dest} as {dname} ended {outcome}: {reason}; both pods kept for an operator",
                      True)  # fmt: skip
        seconds = time.monotonic() - t0
        self.metrics.observe_move(outcome, record, seconds)
        result.update(outcome=outcome, reason=reason, verdict=verdict, record=record, seconds=round(seconds, 4))
        log.info(
            "pod move ended",
            extra={"decision": {k: v for k, v in result.items() if k != "record"} | {"verdict": verdict.value}},
        )
        return result

    async def _backend(self, agent: str | None) -> str | None:
        """The source agent's backend (``GET /v1/info``): kubelet moves go in another order."""
        assert self._client is not None and agent
        try:
            info = await self._client.request("GET", f"{agent}/v1/info")
        except PeerError as exc:
            raise _Refused(f"source agent unreachable: {exc.reason}") from None
        backend = info.get("backend")
        return str(backend) if backend is not None else None

    async def _can_restore(self, agent: str | None, node: str) -> None:
        """Before any checkpoint: the destination agent says whether its runtime can restore a checkpoint image
        (``restore`` in ``GET /v1/info``: containerd's version and CRI config). A clear no refuses the move
        with that reason; "cannot tell" goes on (a failed restore still rolls back: the source never stops)."""
        assert self._client is not None and agent
        try:
            info = await self._client.request("GET", f"{agent}/v1/info")
        except PeerError as exc:
            raise _Refused(f"destination agent unreachable: {exc.reason}") from None
        restore = (info.get("features") or {}).get("restore") or {}
        if restore.get("supported") is False:
            raise _Refused(f"{node} cannot restore a checkpoint: {restore.get('reason')}")

    async def _discard(self, agent: str | None, *mids: str) -> str:
        """Ask the destination agent to drop the checkpoint images nobody runs (best effort; says how it went)."""
        assert self._client is not None and agent
        for mid in mids:
            try:
                await self._client.request("POST", f"{agent}/v1/migrations/{mid}/discard", {})
            except PeerError as exc:
                return f"; the checkpoint image stays on the destination ({exc.reason})"
        return "; checkpoint image discarded" if len(mids) < 2 else f"; {len(mids)} checkpoint images discarded"

    async def _create_bound(self, ns: str, name: str, manifest: Any, node: str) -> bool:
        """Create the destination pod and bind it to ``node`` through our binder. True once created."""
        made = await read_json(await self._core.create_namespaced_pod(ns, manifest, _preload_content=False))
        try:
            await self._binder.bind(BindArgs(ns, name, made["metadata"]["uid"], node))
        except BindError as exc:
            await self._delete_pod(ns, name)
            raise _Refused(f"binding the destination pod: {exc}") from None
        return True

    async def _migrate(
        self,
        mid: str,
        source_url: str | None,
        dest_url: str | None,
        dest_node: str,
        ns: str,
        name: str,
        dname: str,
        container: str | None = None,
    ) -> dict[str, Any] | None:
        """POST the migration to the source agent; an unanswered POST is repeated with the same id (the agent
        answers the recorded outcome, or 409 while it is still running it). None: never learned the outcome."""
        assert self._client is not None and source_url and dest_url
        extra = {"container": container} if container else {}
        body = {
            "id": mid,
            "workload": {"namespace": ns, "pod": name, **extra},
            # node: the source agent checks the destination presents that node's agent certificate
            "destination": {"url": dest_url, "node": dest_node, "workload": {"namespace": ns, "pod": dname, **extra}},
        }
        for attempt in range(self.s.request_attempts):
            try:
                return await self._client.request("POST", f"{source_url}/v1/migrations", body)
            except PeerError as exc:
                in_progress = exc.status == 409 and attempt > 0
                if exc.kind is FailureKind.REFUSED and not in_progress:
                    raise _Refused(f"source agent refused: {exc.reason}") from None
                log.warning("migration request unanswered", extra={"migration": mid, "error": exc.reason})
                await asyncio.sleep(min(5.0, 0.5 * 2**attempt))
        return None

    async def _pod(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            pod: dict[str, Any] = await read_json(
                await self._core.read_namespaced_pod(name, ns, _preload_content=False)
            )
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return pod

    async def _wait_running(self, ns: str, name: str, *, ready: bool = False, min_ready_seconds: int = 0) -> None:
        """Until the pod runs (``ready``: and is Ready: a ReplicaSet ranks a not-ready pod first for deletion; and
        has been for ``min_ready_seconds``, the ReplicaSet's minReadySeconds: only then does the ReplicaSet count
        it available, what a Deployment's ``maxUnavailable`` bounds, so handing it the source's place never
        drops the available count while the source goes)."""
        deadline = time.monotonic() + self.s.destination_ready_timeout_seconds + min_ready_seconds
        while True:
            pod = await self._pod(ns, name)
            phase = ((pod or {}).get("status") or {}).get("phase")
            if phase == "Running" and (
                not ready or owners.available_in(pod or {}, min_ready_seconds, datetime.now(UTC)) == 0.0
            ):
                return
            if pod is None or phase in ("Succeeded", "Failed"):
                raise _Refused(f"destination pod {ns}/{name} is {phase or 'gone'}")
            failed = policy.container_failure(pod)
            if failed is not None:
                raise _Refused(f"destination pod {ns}/{name}: {failed}")
            if time.monotonic() > deadline:
                if phase == "Running" and min_ready_seconds:
                    why = f"not available after {min_ready_seconds}s of minReadySeconds"
                else:
                    why = f"not Running after {self.s.destination_ready_timeout_seconds:.0f}s"
                raise _Refused(f"destination pod {ns}/{name} {why}")
            await asyncio.sleep(0.1)

    async def _min_ready_seconds(self, pod: Mapping[str, Any]) -> int:
        """The ``minReadySeconds`` of the ReplicaSet that controls ``pod`` (0 when it has none)."""
        ref = owners.controller_ref(pod) or {}
        ns = (pod.get("metadata") or {}).get("namespace") or "default"
        rs = await read_json(
            await self._apps.read_namespaced_replica_set(str(ref.get("name")), ns, _preload_content=False)
        )
        return int((rs.get("spec") or {}).get("minReadySeconds") or 0)

    async def _delete_pod(self, ns: str, name: str, *, grace: int | None = 0, uid: str | None = None) -> None:
        """Delete a pod (``grace`` None: its own grace period; ``uid``: only that incarnation of the name)."""
        kwargs: dict[str, Any] = {} if grace is None else {"grace_period_seconds": grace}
        if uid:
            kwargs["body"] = {"preconditions": {"uid": uid}}
        try:
            await read_json(await self._core.delete_namespaced_pod(name, ns, _preload_content=False, **kwargs))
        except ApiError as exc:
            if exc.status not in (404, 409):  # 409: the uid precondition failed, that pod is already gone
                raise

    async def _patch_pod(self, ns: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch: lists (ownerReferences, finalizers) are replaced, a null label removed."""
        # the generated client takes _content_type through **kwargs (its stubs do not list it); without it a dict
        # body goes as a strategic merge patch, which merges ownerReferences and finalizers instead of replacing
        merge: dict[str, Any] = {"_content_type": "application/merge-patch+json", "_preload_content": False}
        patched: dict[str, Any] = await read_json(await self._core.patch_namespaced_pod(name, ns, body, **merge))
        return patched

    async def _wait_gone(self, ns: str, name: str, uid: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (pod := await self._pod(ns, name)) is not None and (pod.get("metadata") or {}).get("uid") == uid:
            if time.monotonic() > deadline:
                raise _Refused(f"pod {ns}/{name} still there {timeout:.0f}s after its deletion")
            await asyncio.sleep(0.05)

    # ---------------------------------------------------------------------------------- owner hand-over

    async def _hand_over(self, kind: OwnerKind, mid: str, ns: str, name: str, dname: str) -> dict[str, Any]:
        """Give the held destination the source's place in its controller's count (core.owners), in the order
        that never shows the controller a gap it would fill from scratch nor a surplus it would cut from the
        restore. Raises _HandOverFailed with the source back in its controller's count."""
        source, destination = await self._pod(ns, name), await self._pod(ns, dname)
        if source is None or destination is None:
            raise _HandOverFailed(f"{'source' if source is None else 'destination'} pod gone before the hand-over")
        out: dict[str, Any] = {}
        released = False
        try:
            if kind is OwnerKind.REPLICA_SET:
                await self._patch_pod(ns, name, owners.surplus_patch())
            else:
                ref = owners.controller_ref(source) or {}
                out["job_pods_before"] = sorted(self._uids(await self._owned_pods(str(ref.get("uid")))))
                await self._patch_pod(ns, name, owners.release_patch(source, mid))
                released = True
            await self._patch_pod(ns, dname, owners.adopt_patch(destination, source))
        except (ApiError, ValueError) as exc:
            with contextlib.suppress(ApiError):  # the source back in its controller's count, as it was
                if released:
                    await self._patch_pod(ns, name, owners.restore_patch(source))
                elif kind is OwnerKind.REPLICA_SET:
                    cost = ((source.get("metadata") or {}).get("annotations") or {}).get(
                        owners.DELETION_COST_ANNOTATION
                    )
                    await self._patch_pod(
                        ns, name, {"metadata": {"annotations": {owners.DELETION_COST_ANNOTATION: cost}}}
                    )
            raise _HandOverFailed(str(exc)) from None
        return out

    async def _owned_pods(self, owner_uid: str) -> list[dict[str, Any]]:
        """A Job's pods, by the label its controller puts on each (``batch.kubernetes.io/controller-uid``)."""
        raw = await read_json(
            await self._core.list_pod_for_all_namespaces(
                label_selector=f"batch.kubernetes.io/controller-uid={owner_uid}", _preload_content=False
            )
        )
        return list(raw.get("items") or [])

    @staticmethod
    def _uids(pods: list[dict[str, Any]]) -> set[str]:
        return {str((p.get("metadata") or {}).get("uid")) for p in pods}

    async def _job_settled(self, ns: str, name: str, result: dict[str, Any]) -> None:
        """After a Job's hand-over: did its controller start a replacement in the window between the release
        and the adoption? It acts on pod events after a one-second batch, so look after that: a replacement
        is reported (Event, result), never hidden; the Job controller removes it as a surplus itself."""
        await asyncio.sleep(self.s.owner_settle_seconds)
        dest = await self._pod(*result["destination_pod"].split("/"))
        ref = owners.controller_ref(dest or {}) or {}
        known = set(result.pop("job_pods_before", [])) | self._uids([dest] if dest else [])
        extra = owners.replacements(await self._owned_pods(str(ref.get("uid"))), str(ref.get("uid")), known)
        result["job_replacements"] = extra
        if extra:
            why = f"Job/{ref.get('name')} started {', '.join(extra)} while {name} was handed over"
            self._say("Pod", ns, name, "", "QosJobReplacementRaced", why, True)

    async def _restore_stateful(
        self,
        mid: str,
        src: dict[str, Any],
        dest: str,
        images: dict[str, str],
        trial: str,
        result: dict[str, Any],
    ) -> bool:
        """A StatefulSet's pod: first a **trial** restore on the destination under another name, held (no labels,
        no owner: no Service or controller sees it), which proves the node can run the checkpoint (its base
        image, CRIU, the node itself) while the source still runs; a failed trial is a rollback with the source
        untouched. Then release the source (its name, still taken, makes the controller's own re-create fail and
        back off), stop it with its grace period, and create the destination under the same name, adopted from
        birth, from the checkpoint image. True once created. ``result["source_released"]``: the source is no
        longer a fallback."""
        meta = src["metadata"]
        ns, name, uid = meta.get("namespace") or "default", meta["name"], meta.get("uid", "")
        t_trial = time.monotonic()
        held = policy.destination_manifest(
            src, trial, scheduler_name=self.s.destination_scheduler_name, migration=mid, checkpoint_image=images,
            owner=OwnerKind.STATEFUL_SET, held=True,  # matched by no selector, owned by nobody
        )  # fmt: skip
        held["spec"].pop("hostname", None)  # not the ordinal's identity, even for the seconds it runs
        held["spec"].pop("subdomain", None)
        try:
            await self._create_bound(ns, trial, held, dest)
            await self._wait_running(ns, trial)
            gone = policy.destination_node_gone(await self._node(dest), dest)
            if gone is not None:
                raise _Refused(gone)
        except Exception as exc:
            why = str(exc) if isinstance(exc, _Refused) else f"{type(exc).__name__}: {exc}"
            raise _Refused(f"trial restore before stopping the StatefulSet pod: {why}") from None
        finally:
            trial_pod = await self._pod(ns, trial)
            if trial_pod is not None:
                tuid = str((trial_pod.get("metadata") or {}).get("uid"))
                await self._delete_pod(ns, trial, grace=0, uid=tuid)
                await self._wait_gone(ns, trial, tuid, 60.0)
        result["statefulset_trial_seconds"] = round(time.monotonic() - t_trial, 3)
        live = await self._pod(ns, name)
        if live is None or (live.get("metadata") or {}).get("uid") != uid:
            raise _Refused(f"pod {ns}/{name} changed before the hand-over")
        await self._patch_pod(ns, name, owners.release_patch(live, mid))
        result["source_released"] = True
        t_stop = time.monotonic()
        grace = (live.get("spec") or {}).get("terminationGracePeriodSeconds")
        await self._delete_pod(ns, name, grace=None, uid=uid)
        await self._wait_gone(ns, name, uid, float(grace if grace is not None else 30) + 60.0)
        result["statefulset_stop_seconds"] = round(time.monotonic() - t_stop, 3)
        manifest = policy.destination_manifest(
            src, name, scheduler_name=self.s.destination_scheduler_name, migration=mid, checkpoint_image=images,
            owner=OwnerKind.STATEFUL_SET,
        )  # fmt: skip
        raced = 0
        for _ in range(5):
            try:
                created = await self._create_bound(ns, name, manifest, dest)
                break
            except ApiError as exc:
                if exc.status != 409:
                    raise
            # the StatefulSet controller re-created the ordinal from its template first: take the name back
            # before that pod does any work (released so its own re-create fails again, deleted at once)
            other = await self._pod(ns, name)
            if other is None:
                continue
            raced += 1
            ouid = str((other.get("metadata") or {}).get("uid"))
            await self._patch_pod(ns, name, owners.release_patch(other, mid))
            await self._delete_pod(ns, name, grace=0, uid=ouid)
            await self._wait_gone(ns, name, ouid, 60.0)
        else:
            raise _Refused(f"the StatefulSet kept re-creating {ns}/{name} first ({raced} times)")
        result["statefulset_recreates_taken_back"] = raced
        await self._wait_running(ns, name)
        return created


class _Refused(Exception):
    """The move never started (or its destination pod could not be made): nothing moved."""


class _HandOverFailed(Exception):
    """The owner hand-over could not be made; the source is back in its controller's count."""


def _finished(pod: Mapping[str, Any]) -> bool:
    return ((pod.get("status") or {}).get("phase")) in ("Succeeded", "Failed")


def _daemon(pod: Mapping[str, Any]) -> bool:
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("kind") == "DaemonSet" for r in refs)
