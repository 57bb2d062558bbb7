"""The QoS controller's async shell: observe -> persist -> decide -> apply, on every event and every watchdog.

Runs inside `qos-extender serve` next to the verbs and shares their snapshot (``TrackingSnapshot``). Each pass:
1. advances every request's account from its pods (``observe``) and queues a write of each changed account
   to its owner's annotation (persistence survives restarts and leader changes);
2. builds the World (nodes with pods bound, released-and-pinned pods on their node, victims being evicted
   removed) and calls the pure ``decide``;
3. applies the effects: for a release that needs victims, evict them all through the Eviction API
   (PodDisruptionBudgets honoured: a 429 holds the release back), then remove the gate and pin the pod with
   one JSON Patch; a gate held past ``max_gate_seconds`` is released unpinned with a Warning Event.
Every decision leaves Events with the Q values that justified it on the pods involved.

In-flight bookkeeping (until the watch shows the outcome) keeps two passes from acting twice on one pod:
``_released`` (patched, watch still shows the gate) and ``_evicting`` (evicted, watch still shows the pod).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client as k8s
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

from extender.controller.accounting import (
    ACCOUNT_ANNOTATION,
    Account,
    decode_account,
    derivable_from_pod,
    due_writes,
    encode_account,
)
from extender.controller.decide import (
    Decision,
    Evict,
    GatedPod,
    PinnedWait,
    Release,
    Settings,
    World,
    decide,
    stuck_pins,
)
from extender.controller.metrics import ControllerMetrics, RequestSample
from extender.controller.observe import observe
from extender.controller.patches import (
    INSTANCE_ANNOTATION,
    owner_instance,
    release_patch,
    requeue_action,
    requeue_copy,
    route_known,
)
from extender.controller.state import PodInfo, TrackingSnapshot
from extender.core import disruption as guard_rails
from extender.core.gates import BYPASS_ANNOTATION, GateView, bypassed_admission
from extender.core.model import InvalidInputError, Node, NodeGroup, Pod
from extender.core.qos import availability
from extender.core.slack import node_groups_for
from extender.core.taints import Toleration
from extender.core.taints import blocking as taints_blocking
from extender.kube.client import ApiError, RawCore, read_json
from extender.kube.convert import PodProblems, parse_timestamp
from extender.kube.events import KubeEventSink
from extender.settings.extender import ExtenderConfig

__all__ = ["ControllerEvents", "QosController"]

log = logging.getLogger("extender.controller")

_IN_FLIGHT_SECONDS = 30.0  # how long a patch/eviction is assumed pending before the watch must show it
_REQUEUE_FINISH_SECONDS = 70.0  # a stopping controller waits this long for re-queues in flight (create retries: 60 s)
_DEBOUNCE_SECONDS = 0.05  # coalesce a burst of watch events into one pass
# A pass is O(pods) on the event loop that also answers the verbs: after a pass that took d seconds the next one
# waits at least d x this factor, so passes take at most ~1/(1+factor) of the loop however fast events arrive
# (at 2,000 pods x 500 nodes back-to-back passes held the loop ~90 % busy and binds timed out behind them).
_PASS_SPACING_FACTOR = 2.0
# With no pod gated a pass only keeps accounts (pods bound, started, gone): at most this often, or the next gated
# pod. Every watch event used to start one (50 ms debounce), O(accounts) each: with 2,000 pods binding and
# 4,000 accounts that was half the event loop the verbs run on. Transitions are dated by the pass, so the
# accounts' resolution is this long (creationTimestamps have whole seconds anyway).
_ACCOUNTING_SECONDS = 1.0
_RATE_WINDOW_SECONDS = 5.0  # the release rate that sizes the backlog the next pass may start with
_NAMESPACE_REFRESH_SECONDS = 5.0  # how soon a namespace (re)labelled for an instance takes effect for ungated pods


class ControllerEvents(KubeEventSink):
    """The extender's Event sink (queue + one poster task) with free reason, type and message."""

    def emit(self, pod_key: str, uid: str, reason: str, message: str, type_: str = "Normal") -> None:
        namespace, name = pod_key.split("/", 1)
        event = self._event(PodProblems(namespace, name, uid, ()), message)
        event["reason"] = reason
        event["type"] = type_
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1


@dataclass(frozen=True, slots=True)
class _Owner:
    kind: str | None  # None: a bare pod (the request is the pod)
    namespace: str
    name: str


def _unchanged(uid: str, resource_version: object) -> Any:
    """DeleteOptions that delete only this incarnation of the pod (never the copy that replaced it), and only as it
    was read: bound (or changed) meanwhile, the delete is refused (409) and the pod kept."""
    preconditions: dict[str, str] = {"uid": uid}
    if isinstance(resource_version, str) and resource_version:
        preconditions["resourceVersion"] = resource_version
    return {"preconditions": preconditions}


def _owner(request: str) -> _Owner:
    parts = request.split("/")
    if len(parts) == 3:
        return _Owner(parts[1], parts[0], parts[2])
    return _Owner(None, parts[0], parts[1])


class QosController:
    def __init__(
        self,
        api_client: Any,
        snapshot: TrackingSnapshot,
        config: ExtenderConfig,
        metrics: ControllerMetrics,
        events: ControllerEvents | None = None,
        clock: Callable[[], float] = time.time,
        seed: int | None = None,
    ) -> None:
        self.cfg = config.controller
        self.policy = config.policy
        self.guard = config.disruption  # budgets and dry-run for the QoS preemptions (issue 32 part 4)
        self._guard_said: dict[tuple[str, str], float] = {}  # (reason, pod) -> until when not said again
        self.snapshot = snapshot
        self.metrics = metrics
        self.events = events
        self.clock = clock
        c = self.cfg.time_compression
        self.settings = Settings(
            compression=c,
            max_gate_seconds=self.cfg.max_gate_seconds / c,
            pin=self.cfg.pin_node,
            host_score=self.cfg.host_score,
            profile=config.scheduling.profile,
            cycle_seconds=config.scheduling.scaling_cycle_seconds,
        )
        self.watchdog = self.cfg.watchdog_seconds / c
        self.requeue_after = self.cfg.requeue_pinned_seconds / c
        # pinned released pods kube-scheduler found Unschedulable: key -> (uid, first seen so), and those being
        # re-queued now (one task each)
        self._unschedulable_since: dict[str, tuple[str, float]] = {}
        self._requeueing: set[str] = set()
        self._requeues: set[asyncio.Task[None]] = set()
        self.absent_grace = max(60.0, 30.0 * self.watchdog)
        self.persist = self.cfg.persistence == "annotation"
        self.enforce_groups = config.node_groups.enforce
        self.timeout = config.kubernetes.request_timeout_seconds
        self.rng = random.Random(seed)
        self.core = k8s.CoreV1Api(api_client)
        # the release PATCH, once per gated pod: raw (kube.client.RawCore), the generated path cost more than the call
        self._core = RawCore(api_client)
        self.apps = k8s.AppsV1Api(api_client)
        self.batch = k8s.BatchV1Api(api_client)
        self.accounts: dict[str, Account] = {}
        self.namespace_instances: dict[str, str] = {}  # namespace -> instance, from the namespace label
        self.namespaces_listed_at: float | None = None  # wall time the last successful namespace list started
        self.owner_created: dict[str, float] = {}
        self._written: dict[str, float] = {}
        self._dirty: set[str] = set()
        self._evicting: dict[str, float] = {}
        self._released: dict[str, tuple[str | None, float]] = {}
        # pods counted as having bypassed admission in this term (uid -> key) until the watch shows our mark, and
        # the PATCHes that mark them
        self._bypass_counted: dict[str, str] = {}
        # the pod versions (PodInfo objects: the watch makes a new one per change) already found not to have
        # bypassed admission: a pass looks again only at pods that changed since (key -> PodInfo)
        self._bypass_checked: dict[str, PodInfo] = {}
        self._bypass_tasks: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self.concurrency = self.cfg.release_concurrency  # release PATCHes (and their evictions) in flight
        self._sem = asyncio.Semaphore(self.concurrency)
        self._applying: set[asyncio.Task[None]] = set()  # releases (and their evictions) still being applied
        self._backlog_low = asyncio.Event()  # set while the releases left fit in the next pass (_backlog_limit)
        self._backlog_low.set()
        self._applied_at: deque[float] = deque(maxlen=4096)  # monotonic times releases finished
        self._decide_seconds = 0.0  # the last pass's decide (in its thread)
        self._writer_wake = asyncio.Event()
        self._write_sem = asyncio.Semaphore(8)
        self.passes = 0
        self.last_decision: Decision | None = None
        self._last_pass_seconds = 0.0
        metrics.set_sample_source(self._samples)
        snapshot.on_change = self._wake.set
        self._gated_wake = asyncio.Event()
        snapshot.on_gated = self._gated_wake.set

    # ------------------------------------------------------------------------------------------ start

    async def _list(self, fn: Callable[..., Any]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cont: str | None = None
        while True:
            kw: dict[str, Any] = {"_preload_content": False, "_request_timeout": self.timeout, "limit": 500}
            if cont:
                kw["_continue"] = cont
            page = await read_json(await fn(**kw))
            items.extend(page.get("items") or [])
            cont = (page.get("metadata") or {}).get("continue") or None
            if not cont:
                return items

    async def refresh_namespaces(self) -> None:
        """Which namespaces are routed to which controller instance (label qos.kube-qos-extender.io/controller),
        for the pods created while no webhook answered (``owner_instance``). A failed list keeps the last map."""
        started = time.time()  # wall time, as creationTimestamps (route_known), whatever self.clock is
        try:
            items = await self._list(lambda **kw: self.core.list_namespace(label_selector=INSTANCE_ANNOTATION, **kw))
        except (ApiError, OSError, TimeoutError) as exc:
            log.warning("cannot list namespaces for controller instances", extra={"error": str(exc)})
            return
        self.namespaces_listed_at = started
        self.namespace_instances = {
            (ns.get("metadata") or {}).get("name", ""): ((ns.get("metadata") or {}).get("labels") or {}).get(
                INSTANCE_ANNOTATION, ""
            )
            for ns in items
        }

    async def _namespaces_loop(self) -> None:
        while True:
            await asyncio.sleep(_NAMESPACE_REFRESH_SECONDS)
            await self.refresh_namespaces()

    def _owns_namespace(self, namespace: str) -> bool:
        return owner_instance(None, namespace, self.namespace_instances) == self.cfg.instance

    def mine(self) -> dict[str, PodInfo]:
        """The qos pods this instance manages (``owner_instance``): every other pod only occupies nodes."""
        me, routes, listed = self.cfg.instance, self.namespace_instances, self.namespaces_listed_at
        return {
            k: i
            for k, i in self.snapshot.qos_pods.items()
            if owner_instance(i.instance, k.split("/", 1)[0], routes) == me
            and (i.gated or route_known(i.instance, i.created, listed))
        }

    async def load(self) -> None:
        """Rebuild the accounts from the owners' annotations (and bare pods' own) before the first pass."""
        await self.refresh_namespaces()
        if not self.persist:
            return
        sources = (
            ("ReplicaSet", self.apps.list_replica_set_for_all_namespaces),
            ("StatefulSet", self.apps.list_stateful_set_for_all_namespaces),
            ("Job", self.batch.list_job_for_all_namespaces),
        )
        for kind, fn in sources:
            try:
                items = await self._list(fn)
            except (ApiError, OSError, TimeoutError) as exc:
                log.warning(f"cannot list {kind}s to rebuild accounts", extra={"error": str(exc)})
                self.metrics.accounts_loaded.labels("error").inc()
                continue
            for item in items:
                meta = item.get("metadata") or {}
                if not self._owns_namespace(meta.get("namespace", "default")):
                    continue  # another instance's request: never read (nor later write) its account
                request = f"{meta.get('namespace', 'default')}/{kind}/{meta.get('name')}"
                created = parse_timestamp(meta.get("creationTimestamp"))
                if created is not None:
                    self.owner_created[request] = created
                self._load_one(request, (meta.get("annotations") or {}).get(ACCOUNT_ANNOTATION))
        for info in self.mine().values():
            if info.request == info.key:
                self._load_one(info.request, info.account_text)
        log.info("accounts rebuilt", extra={"decision": {"accounts": len(self.accounts)}})

    def _load_one(self, request: str, text: object) -> None:
        if not isinstance(text, str):
            return
        try:
            acc = decode_account(text)
        except InvalidInputError as exc:
            log.warning("malformed account annotation ignored", extra={"pod": request, "error": str(exc)})
            self.metrics.accounts_loaded.labels("malformed").inc()
            return
        self.accounts[request] = acc
        self._written[request] = acc.since
        self.metrics.accounts_loaded.labels("ok").inc()

    async def run(self) -> None:
        """Wait for the snapshot, rebuild accounts, then pass on every event and at least every watchdog."""
        while not self.snapshot.ready:
            await asyncio.sleep(0.05)
        await self.load()
        writer = asyncio.create_task(self._writer(), name="controller-writer")
        namespaces = asyncio.create_task(self._namespaces_loop(), name="controller-namespaces")
        rebuild = True
        me = asyncio.current_task()
        try:
            while True:
                # Python 3.11's asyncio.wait_for returns the inner result when the wait completes in the same loop
                # iteration as a cancel(), and the CancelledError is lost: the task stays "cancelling" and this loop
                # would go on acting after its term ended (seen as a hung stop once a mark's PATCH shifted timing).
                if me is not None and me.cancelling():
                    raise asyncio.CancelledError
                try:
                    await self.reconcile(rebuild=rebuild)
                    rebuild = False
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("controller pass failed")
                # Deciding again while hundreds of PATCHes still queue releases nothing sooner (they would queue
                # behind them) and costs a pass: wait until the releases left are about what the PATCHes apply
                # while the next pass decides (_backlog_limit), so its releases follow without a gap. The last few
                # slow PATCHes never hold the next pass.
                await self._backlog_low.wait()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self.watchdog)
                # spacing by the time the pass held the event loop (decide runs in a thread and does not)
                on_loop = max(0.0, self._last_pass_seconds - self._decide_seconds)
                spacing = max(_DEBOUNCE_SECONDS, _PASS_SPACING_FACTOR * on_loop)
                started = time.monotonic()
                if not self._gated_wake.is_set() and not any(i.gated for i in self.snapshot.qos_pods.values()):
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._gated_wake.wait(), timeout=_ACCOUNTING_SECONDS)
                await asyncio.sleep(max(0.0, spacing - (time.monotonic() - started)))
                self._wake.clear()
                self._gated_wake.clear()
        finally:
            # No PATCH or eviction may leave a controller that stopped (lost the lease, shutting down): all are
            # cancelled before any is awaited, or a queued release would take a freed slot and send its PATCH.
            tasks = (writer, namespaces, *self._applying, *self._bypass_tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # A re-queue between its delete and its create is never cancelled (the pod would be lost): finished,
            # within the create's own retry budget.
            if self._requeues:
                await asyncio.wait(self._requeues, timeout=_REQUEUE_FINISH_SECONDS)

    def _backlog_limit(self, now: float) -> int:
        """How many releases may still be queued when the next pass starts: as many as are applied while a
        pass decides (the rate of the last ``_RATE_WINDOW_SECONDS`` x the last decide's duration), and at least
        the PATCHes in flight."""
        while self._applied_at and self._applied_at[0] < now - _RATE_WINDOW_SECONDS:
            self._applied_at.popleft()
        rate = len(self._applied_at) / _RATE_WINDOW_SECONDS
        return max(self.concurrency, int(rate * self._decide_seconds))

    def _applied(self, task: asyncio.Task[None]) -> None:
        self._applying.discard(task)
        now = time.monotonic()
        self._applied_at.append(now)
        if len(self._applying) <= self._backlog_limit(now):
            self._backlog_low.set()

    async def settle(self) -> None:
        """Wait until every release and eviction issued so far has been applied (or failed)."""
        while self._applying:
            await asyncio.gather(*self._applying, return_exceptions=True)

    # ------------------------------------------------------------------------------------------- pass

    def world(self, now: float, qos: Mapping[str, PodInfo] | None = None) -> World:
        """The decision input from the snapshot, this instance's pods and the in-flight bookkeeping."""
        snap = self.snapshot
        if qos is None:
            qos = self.mine()
        self._evicting = {k: t for k, t in self._evicting.items() if t > now and k in snap.pods}
        self._released = {k: v for k, v in self._released.items() if v[1] > now and k in qos and qos[k].gated}
        gone = set(self._evicting) | {k for k, i in qos.items() if i.deleting}
        extra: dict[str, list[Pod]] = {}
        for key, info in qos.items():
            if info.node_name or info.deleting or key not in snap.pods:
                continue
            node = self._released[key][0] if key in self._released else (None if info.gated else info.pinned_node)
            if node is not None:
                extra.setdefault(node, []).append(snap.pods[key].pod)
        nodes: list[Node] = []
        for name in snap.nodes:
            view = snap.node_view(name)
            if view is None:
                continue
            if gone & {p.key for p in view.pods}:
                view = view.without_pods(gone)
            more = extra.get(name)
            if more:  # one copy per node, not one per pinned pod (each copy re-sums the node's pods)
                view = dataclasses.replace(view, pods=(*view.pods, *more))
            nodes.append(view)
        running = {
            key: info.request for key, info in qos.items() if info.node_name and key not in gone and key in snap.pods
        }
        # The filter verb's node-group rule (node_groups.enforce): batch pods on batch nodes, services on service
        # nodes. The controller must respect it too, or it pins a pod where the extender will refuse it.
        by_group: dict[NodeGroup, frozenset[str]] = {}
        if self.enforce_groups:
            for group in NodeGroup:
                by_group[group] = frozenset(n for n, e in snap.nodes.items() if group in e.accepts)
        # kube-scheduler's TaintToleration filter, which runs before the extender ever sees a node: a pod pinned to
        # a node whose NoSchedule/NoExecute taint it does not tolerate is never bound (kind's control plane took
        # every batch pod, issue 31: extender.core.taints).
        tainted = {n: e.taints for n, e in snap.nodes.items() if e.taints}
        # One set per distinct (groups, tolerations) and pass (a pod's eligible nodes depend on nothing else): a
        # fresh union per gated pod copied every node name thousands of times per pass.
        unions: dict[tuple[frozenset[NodeGroup], tuple[Toleration, ...]], frozenset[str] | None] = {}

        def eligible(groups: frozenset[NodeGroup], tolerations: tuple[Toleration, ...]) -> frozenset[str] | None:
            if not by_group and not tainted:
                return None
            key = (groups, tolerations if tainted else ())
            if key in unions:
                return unions[key]
            found = frozenset().union(*(by_group[g] for g in groups)) if by_group else frozenset(snap.nodes)
            barred = {n for n, taints in tainted.items() if taints_blocking(taints, tolerations) is not None}
            unions[key] = found = found - barred if barred else found
            return found

        gated = [
            GatedPod(
                snap.pods[key].pod,
                info.request,
                now if info.created is None else info.created,
                info.node_selector,
                # core.slack.node_groups_for, as the filter verb: a co-located batch pod may use service nodes
                eligible(node_groups_for(p.kind, p.requests), info.tolerations),
            )
            for key, info in qos.items()
            if info.gated and not info.deleting and key not in self._released and key in snap.pods
            for p in (snap.pods[key].pod,)
        ]
        # a copy: decide runs in a thread while releases on the event loop advance accounts
        return World(nodes, running, gated, dict(self.accounts), now)

    async def reconcile(self, rebuild: bool = False) -> Decision:
        started = time.perf_counter()
        now = self.clock()
        snap = self.snapshot
        mine = self.mine()
        self._count_bypassed(mine)
        class_of = {k: snap.pods[k].pod.class_name for k in mine if k in snap.pods}
        obs = observe(
            self.accounts,
            mine.values(),
            class_of,
            now,
            rebuild=rebuild,
            absent_grace=self.absent_grace,
            admitted_at=self.owner_created,
        )
        self.accounts = obs.accounts
        for request in obs.finished:
            self._written.pop(request, None)
        self._dirty |= {r for r in obs.changed if not self._derivable(r)}
        for request in self.accounts:
            if now - self._written.get(request, 0.0) > self.cfg.persist_interval_seconds and not self._derivable(
                request
            ):
                self._dirty.add(request)
        if self._dirty:
            self._writer_wake.set()
        self._requeue_stuck(mine, now)
        if any(i.gated and not i.deleting for i in mine.values()) or self.last_decision is None:
            # decide is pure and takes seconds with a thousand pods gated on 500 nodes: in a thread, so the verbs,
            # the watch and the releases in flight keep being served (the GIL is handed over every few ms) instead
            # of a frozen loop timing out every bind in flight. One pass at a time uses self.rng.
            world = self.world(now, mine)
            t_decide = time.perf_counter()
            decision = await asyncio.to_thread(decide, world, self.policy, self.settings, self.rng)
            self._decide_seconds = time.perf_counter() - t_decide
        else:
            # Nothing gated: decide would release and evict nothing (it only places gated pods), and it draws
            # no random numbers without pending pods. Skip its O(pods) setup; the last Q values stay for the
            # gauges until the next pass that has work.
            decision = Decision((), (), self.last_decision.q_of_request, ())
            self._decide_seconds = 0.0
        self.last_decision = decision
        self.passes += 1
        self.metrics.passes.inc()
        self._last_pass_seconds = time.perf_counter() - started
        self.metrics.pass_duration.observe(self._last_pass_seconds)
        by_pod: dict[str, list[Evict]] = {}
        for ev in decision.evictions:
            by_pod.setdefault(ev.for_pod, []).append(ev)
        # The effects are applied in the background (``release_concurrency`` at a time), not awaited: a pass that waited
        # for its slowest PATCH held every pod admitted meanwhile, and released in bursts. Each released pod is
        # in flight from now on: counted on its node, never decided again, until the watch shows it ungated or
        # its PATCH is refused (then the next pass decides it anew).
        in_flight = self.clock() + _IN_FLIGHT_SECONDS
        held = self._guard_preemptions(decision.releases, by_pod)
        for rel in decision.releases:
            if rel.pod in held:
                continue  # its victims wait for a budget (or dry-run): not released, the next pass decides again
            self._released[rel.pod] = (rel.node, in_flight)
            task = asyncio.create_task(self._apply(rel, by_pod.get(rel.pod, []), now), name=f"release {rel.pod}")
            self._applying.add(task)
            task.add_done_callback(self._applied)
        if len(self._applying) > self._backlog_limit(time.monotonic()):
            self._backlog_low.clear()
        if decision.releases or decision.evictions:
            log.info(
                "controller pass",
                extra={
                    "decision": {
                        "seconds": round(self._last_pass_seconds, 4),
                        "decide_seconds": round(self._decide_seconds, 4),
                        "gated": len(decision.releases) + sum(1 for i in mine.values() if i.gated),
                        "releases": len(decision.releases),
                        "evictions": len(decision.evictions),
                        "applying": len(self._applying),
                    }
                },
            )
        return decision

    # ------------------------------------------------------------------------------ guard rails

    def _guard_preemptions(self, releases: Any, by_pod: Mapping[str, list[Evict]]) -> set[str]:
        """The releases whose preemptions the disruption guard rails hold back (``core.disruption.decide``): a
        budget with no room for its victims (Event QosDisruptionWaiting on the pending pod, naming the budget), or
        dry-run (Event QosDisruptionDryRun on each victim it would evict). Nothing held without budgets and
        dry-run: today's behaviour."""
        budgets = self.guard.core_budgets
        if not self.guard.dry_run and guard_rails.unlimited(budgets):
            return set()
        now = self.clock()
        self._guard_said = {k: t for k, t in self._guard_said.items() if t > now}
        motion = [self._disruption(v, self._node_of(v)) for v in self._evicting if self._node_of(v)]
        held: set[str] = set()
        for rel in releases:
            victims = by_pod.get(rel.pod, [])
            if not victims:
                continue
            candidates = [self._disruption(ev.victim, ev.node) for ev in victims]
            verdicts = guard_rails.decide(budgets, motion, candidates, now, dry_run=self.guard.dry_run)
            if all(v.action is guard_rails.Action.GO for v in verdicts):
                motion.extend(candidates)
                continue
            held.add(rel.pod)
            for ev, v in zip(victims, verdicts, strict=True):
                if v.action is guard_rails.Action.REPORT:  # counted once per report, as said
                    self._say_once(ev.victim, ev.victim_uid, "QosDisruptionDryRun",
                                   f"dry-run: would evict for {ev.for_pod} on {ev.node}: Q_victim={ev.q_victim:.1f}s, "
                                   f"Q_pending={ev.q_pending:.1f}s ({ev.reason}); nothing changed", now)  # fmt: skip
                elif v.action is guard_rails.Action.WAIT:
                    self.metrics.disruptions.labels("preemption", "waited").inc()
                    self._say_once(ev.for_pod, "", "QosDisruptionWaiting",
                                   f"preempting {ev.victim} on {ev.node} waits: {v.reason}", now)  # fmt: skip
            log.info("preemption guarded", extra={"pod": rel.pod, "decision": {
                "victims": [ev.victim for ev in victims], "verdicts": [v.action.value for v in verdicts],
                "reasons": sorted({v.reason for v in verdicts if v.action is not guard_rails.Action.GO})}})  # fmt: skip
        return held

    def _node_of(self, key: str) -> str | None:
        entry = self.snapshot.pods.get(key)
        return entry.pod.node_name if entry is not None else None

    def _disruption(self, victim: str, node: str | None) -> guard_rails.Disruption:
        entry = self.snapshot.nodes.get(node) if node else None
        group = entry.node.group if entry is not None else None
        return guard_rails.Disruption(
            guard_rails.DisruptionKind.PREEMPTION, node or "", group.value if group is not None else "none", victim
        )

    def _say_once(self, pod: str, uid: str, reason: str, message: str, now: float) -> None:
        if (reason, pod) in self._guard_said:
            return
        self._guard_said[(reason, pod)] = now + self.guard.report_interval_seconds
        if reason == "QosDisruptionDryRun":
            self.metrics.disruptions.labels("preemption", "dry_run").inc()
        self._event(pod, uid, reason, message)

    # ------------------------------------------------------------------------------ admission bypassed

    def _count_bypassed(self, mine: Mapping[str, PodInfo]) -> None:
        """Count (metric + Warning Event) each pod of this instance that bypassed the ordering webhook
        (``core.gates.bypassed_admission``), and mark it so that no later pass or term counts it again. Its
        account is kept like any other pod's (it is in ``mine``); only its Q order was lost."""
        live = {i.uid for i in mine.values()}
        for uid in [u for u in self._bypass_counted if u not in live]:
            del self._bypass_counted[uid]  # the pod is gone (or no longer this instance's)
        checked = self._bypass_checked
        for key in [k for k, i in checked.items() if mine.get(k) is not i]:
            del checked[key]  # changed, gone or no longer this instance's: looked at again
        views = [
            GateView(key, i.gated, i.instance, i.bypass_marked, deleting=i.deleting)
            for key, i in mine.items()
            if key not in checked and i.uid not in self._bypass_counted
        ]
        found = bypassed_admission(views)
        # bypassed_admission judges each pod on its own fields: a version judged innocent stays so until it changes
        innocent = {v.key for v in views}.difference(found)
        checked.update((key, mine[key]) for key in innocent)
        for key in found:
            info = mine[key]
            self._bypass_counted[info.uid] = key
            task = asyncio.create_task(self._mark_bypassed(key, info.uid), name=f"bypassed {key}")
            self._bypass_tasks.add(task)
            task.add_done_callback(self._bypass_tasks.discard)

    async def _mark_bypassed(self, key: str, uid: str) -> None:
        namespace, name = key.split("/", 1)
        # metadata.uid: only this incarnation of the pod (a PATCH naming another uid is refused)
        body = {"metadata": {"uid": uid, "annotations": {BYPASS_ANNOTATION: self.cfg.instance}}}
        try:
            await read_json(
                await self.core.patch_namespaced_pod(
                    name, namespace, body, _preload_content=False, _request_timeout=self.timeout
                )
            )
        except (ApiError, OSError, TimeoutError) as exc:
            # not marked: counted by the next pass (a pod that is gone leaves the snapshot and is never counted)
            self._bypass_counted.pop(uid, None)
            log.warning("cannot mark a pod that bypassed admission", extra={"pod": key, "error": str(exc)})
            return
        self.metrics.admission_bypassed.inc()
        self._event(
            key,
            uid,
            "QoSAdmissionBypassed",
            "created without the QoS admission webhook (it did not answer; failurePolicy Ignore): not gated, so "
            f"scheduled without Q ordering; accounted by controller instance {self.cfg.instance}",
            "Warning",
        )

    # ------------------------------------------------------------------------------------- re-queue

    def _requeue_stuck(self, mine: Mapping[str, PodInfo], now: float) -> None:
        """Put back in the queue the released pods whose pinned host lost its room (``decide.stuck_pins``)."""
        snap = self.snapshot
        waiting: list[PinnedWait] = []
        seen: set[str] = set()
        for key, info in mine.items():
            if (
                info.gated
                or info.node_name
                or info.deleting
                or info.pinned_node is None
                or not info.unschedulable
                or key not in snap.pods
            ):
                continue
            seen.add(key)
            uid, since = self._unschedulable_since.get(key, ("", now))
            if uid != info.uid:
                since = now
                self._unschedulable_since[key] = (info.uid, now)
            if key not in self._requeueing:
                waiting.append(PinnedWait(snap.pods[key].pod, info.pinned_node, now - since))
        self._unschedulable_since = {k: v for k, v in self._unschedulable_since.items() if k in seen}
        if not waiting:
            return
        gone = set(self._evicting)  # victims being evicted: their room is promised, not lost
        nodes = {}
        for name in {w.node for w in waiting}:
            view = snap.node_view(name)
            if view is not None:
                nodes[name] = view.without_pods(gone) if gone & {p.key for p in view.pods} else view
        for key in stuck_pins(waiting, nodes, self.requeue_after):
            info = mine[key]
            self._requeueing.add(key)
            waited = now - self._unschedulable_since[key][1]
            # a pod still there after this attempt (refused, kept, an API error) is tried again only after another
            # requeue_pinned_seconds: one attempt and one Event per period, not one per pass
            self._unschedulable_since[key] = (info.uid, now)
            task = asyncio.create_task(self._requeue(info, waited))
            self._requeues.add(task)
            task.add_done_callback(self._requeues.discard)
            task.add_done_callback(functools.partial(self._requeued, key))

    def _requeued(self, key: str, _task: asyncio.Task[None]) -> None:
        self._requeueing.discard(key)

    async def _requeue(self, info: PodInfo, waited: float) -> None:
        """Delete a stuck pinned pod for its owner to re-create, or re-create a bare one gated and unpinned. The
        pod never ran (unbound), so nothing is lost but its place: the delete is conditional on its uid, and a
        bare pod's copy is created (retried while the old one is still going) before anything else is tried."""
        namespace, name = info.key.split("/", 1)
        node = info.pinned_node or ""
        try:
            raw = await read_json(
                await self.core.read_namespaced_pod(
                    name, namespace, _preload_content=False, _request_timeout=self.timeout
                )
            )
        except (ApiError, OSError, TimeoutError) as exc:
            log.warning("stuck pinned pod not read", extra={"pod": info.key, "node": node, "error": str(exc)})
            return
        if (raw.get("metadata") or {}).get("uid") != info.uid:
            return  # already replaced
        action = requeue_action(raw)
        why = f"Unschedulable for {waited:.0f}s pinned to {node}, which has no room for it any more (or is gone)"
        if action == "keep":
            self._event(info.key, info.uid, "QoSPinnedStuck", f"{why}; not re-queued: its owner would not "
                        "re-create it (or a finalizer holds it). Delete it to queue it again.", "Warning")  # fmt: skip
            return
        copy = requeue_copy(raw, self.cfg.gate_name, node) if action == "recreate" else None
        try:
            await read_json(
                await self.core.delete_namespaced_pod(
                    name, namespace, body=_unchanged(info.uid, (raw.get("metadata") or {}).get("resourceVersion")),
                    grace_period_seconds=0, _preload_content=False, _request_timeout=self.timeout,
                )
            )  # fmt: skip
        except (ApiError, OSError, TimeoutError) as exc:
            self.metrics.requeued.labels("failed").inc()
            log.warning("stuck pinned pod not deleted", extra={"pod": info.key, "node": node, "error": str(exc)})
            return
        if copy is None:
            self.metrics.requeued.labels("deleted").inc()
            decision = {"requeue": "deleted", "waited": round(waited, 1)}
            log.info("stuck pinned pod re-queued", extra={"pod": info.key, "node": node, "decision": decision})
            self._event(info.key, info.uid, "QoSRequeued", f"{why}: deleted for its owner to re-create", "Warning")
            return
        created = await self._create_copy(info.key, copy)
        if created is None:
            self.metrics.requeued.labels("failed").inc()
            log.error(
                "stuck pinned pod deleted but not re-created: its spec follows, create it again by hand",
                extra={"pod": info.key, "node": node, "decision": {"requeue": "failed", "pod": copy}},
            )
            return
        self.metrics.requeued.labels("recreated").inc()
        decision = {"requeue": "recreated", "waited": round(waited, 1)}
        log.info("stuck pinned pod re-queued", extra={"pod": info.key, "node": node, "decision": decision})
        self._event(info.key, created, "QoSRequeued", f"{why}: re-created gated and unpinned, queued again", "Warning")

    async def _create_copy(self, key: str, body: Any) -> str | None:
        """Create the bare pod's copy; 409 while the old pod is still being removed, and transient errors, are
        retried for up to a minute. Returns the new uid, None when it could not be created."""
        namespace = key.split("/", 1)[0]

        def transient(exc: BaseException) -> bool:
            if isinstance(exc, ApiError):
                return exc.status in (409, 429) or exc.status >= 500
            return isinstance(exc, OSError | TimeoutError)

        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(transient),
                wait=wait_exponential_jitter(multiplier=0.2, max=5.0, jitter=0.2),
                stop=stop_after_delay(60.0),
                reraise=True,
            ):
                with attempt:
                    made = await read_json(
                        await self.core.create_namespaced_pod(
                            namespace, body, _preload_content=False, _request_timeout=self.timeout
                        )
                    )
        except (ApiError, OSError, TimeoutError) as exc:
            log.warning("re-queued pod not created", extra={"pod": key, "error": str(exc)})
            return None
        return str((made.get("metadata") or {}).get("uid") or "")

    def _derivable(self, request: str) -> bool:
        """A bare pod's account its own timestamps rebuild (``derivable_from_pod``): not written."""
        acc = self.accounts.get(request)
        return acc is not None and _owner(request).kind is None and derivable_from_pod(acc)

    def _samples(self) -> list[RequestSample]:
        """The SLI gauges' samples now (the metrics' source while this controller runs): every live request's
        availability, and its Q from the last decision."""
        now = self.clock()
        q_of_request = self.last_decision.q_of_request if self.last_decision is not None else {}
        samples = []
        for request, acc in self.accounts.items():
            cls = self.policy.classes.get(acc.class_name)
            if cls is None:
                continue
            e, p = acc.ep(now)
            samples.append(
                RequestSample(acc.class_name, acc.state.value, availability(e, p), q_of_request.get(request), cls.slo)
            )
        return samples

    # ------------------------------------------------------------------------------------------ apply

    async def _apply(self, rel: Release, victims: list[Evict], now: float) -> None:
        async with self._sem:
            if victims:
                results = await asyncio.gather(*(self._evict(v) for v in victims))
                if not all(results):
                    # held back: pinning it now would leave it unschedulable; the next pass decides again
                    self._released.pop(rel.pod, None)
                    return
            await self._release(rel, bool(victims), now)

    async def _evict(self, ev: Evict) -> bool:
        namespace, name = ev.victim.split("/", 1)
        body: Any = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": ev.victim_uid}} if ev.victim_uid else {},
        }
        try:
            response = await self.core.create_namespaced_pod_eviction(
                name, namespace, body, _preload_content=False, _request_timeout=self.timeout
            )
            await read_json(response)
        except ApiError as exc:
            if exc.status == 404:
                return True  # already gone: its space is free
            reason = "pdb" if exc.status == 429 else "error"
            self.metrics.eviction_failures.labels(reason).inc()
            self._event(
                ev.for_pod,
                "",
                "QoSPreemptionBlocked",
                f"could not evict {ev.victim} on {ev.node} ({exc}); Q_pending={ev.q_pending:.1f}s waits",
                "Warning",
            )
            return False
        except (OSError, TimeoutError) as exc:
            self.metrics.eviction_failures.labels("error").inc()
            log.warning("eviction failed", extra={"pod": ev.victim, "error": str(exc)})
            return False
        self._evicting[ev.victim] = self.clock() + _IN_FLIGHT_SECONDS
        acc = self.accounts.get(ev.victim_request)
        if acc is not None:
            self.accounts[ev.victim_request] = acc.preempted()
            self._dirty.add(ev.victim_request)
            self._writer_wake.set()
        self.metrics.preemptions.labels(ev.reason).inc()
        rule = {"qos": "base rule", "importance": "relaxation (i)", "peer": "relaxation (ii)"}[ev.reason]
        self._event(
            ev.victim,
            ev.victim_uid,
            "QoSPreempted",
            f"evicted for {ev.for_pod} on {ev.node}: Q_victim={ev.q_victim:.1f}s, Q_pending={ev.q_pending:.1f}s "
            f"({rule} of paper 002 §3.3.1)",
        )
        self._event(
            ev.for_pod,
            "",
            "QoSPreemption",
            f"evicted {ev.victim} (Q={ev.q_victim:.1f}s) on {ev.node} to make room; own Q={ev.q_pending:.1f}s ({rule})",
        )
        return True

    async def _release(self, rel: Release, preempted: bool, now: float) -> None:
        info = self.snapshot.qos_pods.get(rel.pod)
        if info is None:
            self._released.pop(rel.pod, None)
            return
        ops = release_patch(info.spec, self.cfg.gate_name, rel.node)
        if not ops:
            self._released.pop(rel.pod, None)
            return
        namespace, name = rel.pod.split("/", 1)
        try:
            await self._core.patch_namespaced_pod(name, namespace, ops, timeout=self.timeout)
        except ApiError as exc:
            log.warning("gate release failed", extra={"pod": rel.pod, "error": str(exc)})
            self._released.pop(rel.pod, None)  # refused: not applied, decided anew by the next pass
            return
        except (OSError, TimeoutError) as exc:
            # The PATCH may have been applied (the API server was slow, not absent): until the watch shows the
            # pod, count it on the node it was pinned to instead of deciding it again (another host, and this
            # node's space offered twice). If the gate is still there after the in-flight time, it is decided
            # anew.
            log.warning("gate release in doubt", extra={"pod": rel.pod, "error": f"{type(exc).__name__}: {exc}"})
            self._released[rel.pod] = (rel.node, self.clock() + _IN_FLIGHT_SECONDS)
            return
        self._released[rel.pod] = (rel.node, self.clock() + _IN_FLIGHT_SECONDS)
        acc = self.accounts.get(rel.request)
        if acc is not None:
            self.accounts[rel.request] = acc.released(now)
        cls = self.snapshot.pods[rel.pod].pod.class_name if rel.pod in self.snapshot.pods else "unknown"
        self.metrics.gate_wait.labels(cls).observe(rel.waited)
        if rel.timeout:
            self.metrics.gate_timeouts.inc()
            self.metrics.releases.labels("timeout").inc()
            self._event(
                rel.pod,
                rel.uid,
                "QoSGateTimeout",
                f"gate held {rel.waited:.1f}s > controller.max_gate_seconds: released unpinned (Q={rel.q:.1f}s)",
                "Warning",
            )
            return
        if rel.priority:
            self.metrics.releases.labels("priority").inc()
            self._event(
                rel.pod,
                rel.uid,
                "QoSReleasedForPriority",
                f"no room by the QoS rules (Q={rel.q:.1f}s after {rel.waited:.1f}s), but lower-priority pods could "
                "make some: released unpinned to kube-scheduler's priority preemption",
            )
            return
        self.metrics.releases.labels("preemption" if preempted else "fits").inc()
        where = f" pinned to {rel.node}" if rel.node else ""
        self._event(
            rel.pod,
            rel.uid,
            "QoSReleased",
            f"gate released in increasing-Q order{where}: Q={rel.q:.1f}s after {rel.waited:.1f}s"
            + (f"; preempted {', '.join(rel.victims)}" if rel.victims else ""),
        )

    def _event(self, pod: str, uid: str, reason: str, message: str, type_: str = "Normal") -> None:
        if self.events is None:
            return
        if not uid and pod in self.snapshot.qos_pods:
            uid = self.snapshot.qos_pods[pod].uid
        self.events.emit(pod, uid, reason, message, type_)

    # ----------------------------------------------------------------------------------- persistence

    async def _writer(self) -> None:
        """Write dirty accounts to their owners, a few at a time, each at most once per
        ``persist_min_interval_seconds`` (``due_writes``); a failed write stays dirty (retried)."""
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None
        while True:
            await self._writer_wake.wait()
            self._writer_wake.clear()
            if not self.persist:
                self._dirty.clear()
                continue
            self._dirty &= set(self.accounts)
            batch, next_due = due_writes(
                self._dirty, self._written, self.clock(), self.cfg.persist_min_interval_seconds
            )
            self._dirty -= batch
            await asyncio.gather(*(self._write_limited(r) for r in batch))
            if timer is not None:
                timer.cancel()
            if next_due is not None:
                timer = loop.call_later(max(0.0, next_due - self.clock()), self._writer_wake.set)

    async def _write_limited(self, request: str) -> None:
        async with self._write_sem:
            await self._write(request)

    async def _write(self, request: str) -> None:
        acc = self.accounts[request]
        owner = _owner(request)
        body = {"metadata": {"annotations": {ACCOUNT_ANNOTATION: encode_account(acc)}}}
        kw: dict[str, Any] = {"_preload_content": False, "_request_timeout": self.timeout}
        fns: dict[str | None, Callable[..., Any]] = {
            "ReplicaSet": self.apps.patch_namespaced_replica_set,
            "StatefulSet": self.apps.patch_namespaced_stateful_set,
            "Job": self.batch.patch_namespaced_job,
            None: self.core.patch_namespaced_pod,
        }
        fn = fns.get(owner.kind)
        if fn is None:
            self.metrics.account_writes.labels("unsupported").inc()
            self._written[request] = self.clock()  # kept in memory only; do not retry every pass
            return
        if owner.kind is None and request not in self.snapshot.qos_pods:
            # A bare pod our watch no longer has (deleted): the annotation has nowhere to go, the PATCH would be a
            # 404. The account stays for observe's absent grace (the pod may come back under the same name).
            self.metrics.account_writes.labels("gone").inc()
            self._written[request] = self.clock()
            return
        try:
            await read_json(await fn(owner.name, owner.namespace, body, **kw))
        except ApiError as exc:
            if exc.status == 404:
                # The owner is gone, so is the request: forget its account. Kept, it was dirtied again by every
                # pass (never written) for observe's absent grace: 55,335 PATCH 404s in one 500-node bench run.
                self.metrics.account_writes.labels("gone").inc()
                self.accounts.pop(request, None)
                self._written.pop(request, None)
                self._dirty.discard(request)
                return
            self.metrics.account_writes.labels("error").inc()
            self._dirty.add(request)
            return
        except (OSError, TimeoutError):
            self.metrics.account_writes.labels("error").inc()
            self._dirty.add(request)
            return
        self._written[request] = self.clock()
        self.metrics.account_writes.labels("ok").inc()
