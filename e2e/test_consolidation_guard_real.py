"""The disruption guard rails on REAL nodes (issue 32 part 4): a budget of one node in motion is respected with two
candidate nodes, and dry-run moves nothing and reports both.

The cluster and the deployed product are e2e/test_deployed.py's (kind in phase 3 of hack/run-live-tests.sh, real
kubelet nodes in phase 2), with two real batch nodes A and B. The autoscaler and the consolidation flow run in this
process against it, with the deployed agents, as in e2e/test_consolidation_real.py. Each holds a busybox counter
(kind batch). Both nodes are candidates, and the flow is handed one plan per node that empties it into the other:
with two batch nodes the autoscaler's own plans never empty both (a node that receives pods is not emptied in the
same round), a third node would do the same with more machines. The flow may run two nodes at once
(``concurrent_nodes: 2``); the budget ``one-node`` (batch group, max_nodes 1) is what holds it to one:

1. dry-run: both nodes and both counters get an Event ``QosDisruptionDryRun`` with the move it would make, the
   metric counts them; nothing is cordoned, no counter restarts or moves, no pod is created;
2. real, budget of one node: A is emptied into B (its counter migrates with its count) while B waits (Event
   ``QosDisruptionWaiting`` naming the budget); only once A's consolidation has ended does B's start (its two
   counters migrate to A). The two consolidations never overlap.

And a PodDisruptionBudget holds a migration as it holds an eviction: a counter covered by a PDB that allows no
disruption is not moved (the flow asked with an Eviction dryRun=All, waited, gave up: nothing checkpointed, the
source untouched); the PDB deleted, the same move goes.

"Removing" a node here is the local stand-in for a cloud returning the machine to the pool: the stand-in records
the deletion and uncordons the node, so the cluster is left as it was found (the counters run on A).

Runs with ``-m deployed``; fails, never skips, without the cluster.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from typing import Any

import pytest

from e2e.test_consolidation_real import Background, _events, _non_daemon_pods, background  # noqa: F401
from e2e.test_deployed import Product, _ready, namespace, product  # noqa: F401  (fixtures)
from e2e.test_migration_real import GROUP, _cid, _counter, flow  # noqa: F401  (fixture)
from extender.autoscaler.handoff import Consolidation
from extender.autoscaler.loop import ProvisionRequest
from extender.autoscaler.settings import AutoscalerSettings, MetricsSettings
from extender.consolidation import policy
from extender.consolidation.flow import ConsolidationFlow
from extender.consolidation.policy import MoveVerdict, NodeOutcome
from extender.consolidation.settings import AgentEndpoint, ConsolidationSettings
from extender.core.model import Flavour, Resources
from extender.core.reschedule import MigrationPlan
from extender.processes.sidecar import RunningAutoscaler, start_autoscaler
from extender.settings import load_settings
from extender.settings.extender import ExtenderConfig, KubernetesConfig
from extender.settings.sections import DisruptionSettings

pytestmark = [pytest.mark.live, pytest.mark.deployed]

GI = 2**30
BUDGET = {"name": "one-node", "group": "batch", "max_nodes": 1}


class ReturningProvider:
    """The STAND-IN FOR A CLOUD that takes an emptied machine back into its pool: ``delete`` records the time and
    uncordons the node (so the next test finds the cluster as it was). It buys nothing."""

    name = "returning"

    def __init__(self, machines_of: Product) -> None:
        self.product = machines_of
        self.deleted: list[tuple[str, float]] = []

    async def create(self, request: ProvisionRequest) -> None:
        raise RuntimeError(f"this stand-in does not buy machines (asked for {request.name})")

    async def cancel(self, node_name: str) -> None:
        return None

    async def delete(self, node_name: str) -> None:
        self.deleted.append((node_name, time.time()))
        body = policy.cordon_patch(None)
        await asyncio.to_thread(
            self.product.kube.request,
            "PATCH",
            f"/api/v1/nodes/{node_name}",
            body,
            content_type="application/merge-patch+json",
        )

    async def close(self) -> None:
        return None


class TimedFlow(ConsolidationFlow):
    """The product's flow, with each node's consolidation timed (start, end) for the test."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spans: list[tuple[str, float, float, bool]] = []

    async def consolidate(self, plan: MigrationPlan, *, dry_run: bool = False) -> NodeOutcome:
        t0 = time.time()
        try:
            return await super().consolidate(plan, dry_run=dry_run)
        finally:
            self.spans.append((plan.source, t0, time.time(), dry_run))


def _plans(p: Product, order: list[str], done: set[str]) -> Consolidation:
    """One plan per node not yet emptied: every pod on it (but DaemonSet pods) to the other node."""
    plans = []
    for node in order:
        if node in done:
            continue
        other = next(n for n in order if n != node)
        keys = sorted(policy.object_key(x) for x in _non_daemon_pods(p, node))
        if keys:
            plans.append(MigrationPlan(node, tuple((k, other) for k in keys)))
    return Consolidation(time.time(), tuple(order), tuple(plans))


def _leave_no_pods(p: Product, ns: str) -> None:
    """Delete this test's pods and wait until they are gone: the next test looks for batch nodes free of pods."""
    for x in p.kube.pods(ns):
        p.kube.delete_pod(ns, x["metadata"]["name"])
    p.kube.wait(lambda: not p.kube.pods(ns) or None, "the test's pods gone", timeout=120, interval=0.5)


def test_a_budget_of_one_node_holds_two_candidates_to_one_at_a_time_and_dry_run_moves_nothing(
    product: Product,  # noqa: F811
    namespace: str,  # noqa: F811
    background: Background,  # noqa: F811
) -> None:
    kube, env = product.kube, product.env
    groups = {n: kube.get(f"/api/v1/nodes/{n}")["metadata"]["labels"].get(GROUP) for n in product.real_nodes}
    batch_nodes = sorted(n for n, g in groups.items() if g == "batch")
    assert len(batch_nodes) >= 2, f"needs two real batch nodes, got {groups}"
    busy = {n: [x["metadata"]["name"] for x in _non_daemon_pods(product, n)] for n in batch_nodes}
    free = [n for n in batch_nodes if not busy[n]]
    assert len(free) >= 2, f"needs two real batch nodes none of the product's pods runs on: {busy}"
    a, b = free[0], free[1]
    for name, node in (("counter-a", a), ("counter-b", b)):
        kube.create_pod(namespace, _counter(name, node))
    pods = {
        name: kube.wait(
            lambda name=name: x if _ready(x := kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")) else None,
            f"{name} Running",
            timeout=120,
        )
        for name in ("counter-a", "counter-b")
    }
    cids = {name: _cid(p) for name, p in pods.items()}

    missing = [k for k in ("AGENT_CA", "AGENT_CLIENT_CERT", "AGENT_CLIENT_KEY") if not env.get(k)]
    assert not missing, f"the deploy did not print {missing}"
    config = ExtenderConfig(kubernetes=KubernetesConfig(kubeconfig=env["KUBECONFIG"], watch_timeout_seconds=60))
    settings = AutoscalerSettings(
        scheduler_names=("qos-scheduler",),
        flavours=(Flavour("m1.large", Resources(4000, 8 * GI, 110), 0.2),),
        scan_interval_seconds=0.5,
        burst_debounce_seconds=0.2,
        batch_cycle_seconds=300.0,
        idle_seconds=3600.0,
        underutil_sustain_seconds=3600.0,  # the autoscaler's own plans are not what is tested: the test hands its own
        batch_queue_quiet_seconds=0.0,
        metrics=MetricsSettings(port=0),
    )
    dry = load_settings(DisruptionSettings, {"dry_run": True, "budgets": [BUDGET], "report_interval_seconds": 600.0})
    timed = TimedFlow(
        ConsolidationSettings(
            enabled=True,
            agent=AgentEndpoint(
                cert_file=env["AGENT_CLIENT_CERT"], key_file=env["AGENT_CLIENT_KEY"], ca_file=env["AGENT_CA"]
            ),
            migration_timeout_seconds=180,
            destination_ready_timeout_seconds=90,
            left_alone_seconds=3.0,  # B's plan may find A still cordoned in the watch right after A: soon again
            provisioned_only=False,  # real nodes are not bought by the autoscaler; this test owns them
            batch_queue_quiet_seconds=0.0,
            concurrent_nodes=2,  # the flow could run both: only the budget holds it to one
        ),
        disruption=dry,
    )
    machines = ReturningProvider(product)
    order = [a, b]

    async def start() -> RunningAutoscaler:
        running = await start_autoscaler(config, settings)
        running.provider = machines
        await timed.start(running)
        return running

    async def feed(stop: asyncio.Event) -> None:
        """The hand-offs: every 0.5 s the plans of the nodes not yet emptied, as the autoscaler's scan would."""
        while not stop.is_set():
            done = {n for n, _ in machines.deleted}
            timed.handoff(await asyncio.to_thread(_plans, product, order, done))
            await asyncio.sleep(0.5)

    running: RunningAutoscaler = background.run(start())
    stop_feeding = asyncio.Event()
    feeder = asyncio.run_coroutine_threadsafe(feed(stop_feeding), background.loop)
    timings: dict[str, float] = {}
    try:
        # ---- 1. dry-run: both nodes and both counters reported, nothing changed
        t0 = time.monotonic()

        def reported() -> dict[str, str] | None:
            found = {}
            for obj, ns in ((a, "default"), (b, "default"), ("counter-a", namespace), ("counter-b", namespace)):
                evs = [e for e in _events(product, ns, obj) if e["reason"] == "QosDisruptionDryRun"]
                if evs:
                    found[obj] = evs[0]["message"]
            return found if len(found) == 4 else None

        messages = kube.wait(reported, "QosDisruptionDryRun on both nodes and both counters", timeout=90, interval=0.5)
        timings["dry_run_reported_seconds"] = round(time.monotonic() - t0, 3)
        assert f"would migrate from {a} to {b}" in messages["counter-a"], messages
        assert f"would migrate from {b} to {a}" in messages["counter-b"], messages
        assert "would cordon and empty this node by 1 migration(s)" in messages[a], messages
        time.sleep(2.0)  # a few more hand-offs: still nothing changes, nothing is reported twice
        for node in (a, b):
            assert not kube.get(f"/api/v1/nodes/{node}")["spec"].get("unschedulable"), f"dry-run cordoned {node}"
        assert sorted(x["metadata"]["name"] for x in kube.pods(namespace)) == ["counter-a", "counter-b"]
        for name, cid in cids.items():
            assert _cid(kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")) == cid, f"dry-run touched {name}"
        assert not machines.deleted and all(s[3] for s in timed.spans), timed.spans
        m = timed.metrics.disruptions
        assert m.labels("migration", "dry_run")._value.get() == 2, "each move reported once"
        assert m.labels("consolidation", "dry_run")._value.get() == 2

        # ---- 2. for real, a budget of one node in motion: A, then B, never both
        timed.disruption = load_settings(DisruptionSettings, {"budgets": [BUDGET], "pdb_wait_seconds": 60.0})
        timed._reported.clear()  # the dry-run's "reported, not again for a while" is no longer a reason to wait
        t1 = time.monotonic()

        def both_done() -> bool | None:
            return len(machines.deleted) == 2 or None

        try:
            kube.wait(both_done, "both nodes emptied one after the other", timeout=300, interval=0.5)
        except Exception:
            outcomes = [o.__dict__ if hasattr(o, "__dict__") else repr(o) for o in timed.outcomes]
            raise AssertionError(json.dumps(outcomes, default=str)[-4000:]) from None
        timings["both_emptied_seconds"] = round(time.monotonic() - t1, 3)
    finally:
        background.loop.call_soon_threadsafe(stop_feeding.set)
        feeder.result(30)
        background.run(timed.stop())
        background.run(running.stop())

    real = sorted((s for s in timed.spans if not s[3]), key=lambda s: s[1])
    for (n1, _, end, _), (n2, begin, _, _) in itertools.pairwise(real):
        assert end <= begin, f"{n2} started at {begin} before {n1} ended at {end}: two nodes in motion ({real})"
    assert [n for n, _ in machines.deleted] == [a, b]
    a0, a1 = next((s[1], s[2]) for s in real if s[0] == a)
    b0, b1 = next((s[1], s[2]) for s in reversed(real) if s[0] == b)
    waits = [e for e in _events(product, "default", b) if e["reason"] == "QosDisruptionWaiting"]
    assert waits and "one-node" in waits[0]["message"], waits
    assert timed.metrics.disruptions.labels("consolidation", "waited")._value.get() >= 1
    moves = [m for o in timed.outcomes if o.removed for m in o.moves]
    assert [m["outcome"] for m in moves] == ["succeeded"] * 3, moves
    # both counters run on A with their counts (three checkpoint migrations: counter-a twice)
    left = {x["metadata"]["name"]: x for x in kube.pods(namespace)}
    assert len(left) == 2 and all(x["spec"]["nodeName"] == a and _ready(x) for x in left.values()), left
    assert {x["metadata"]["annotations"][policy.MIGRATED_FROM_ANNOTATION] for x in left.values()} == {
        f"{namespace}/counter-b",
        next(m["pod"] for m in moves if m["node"] == a and "counter-a" in m["pod"]),
    }
    for node in (a, b):
        assert not kube.get(f"/api/v1/nodes/{node}")["spec"].get("unschedulable"), f"{node} left cordoned"
    timings.update(
        {
            "a_seconds": round(a1 - a0, 3),
            "b_waited_after_a_seconds": round(b0 - a1, 3),
            "b_seconds": round(b1 - b0, 3),
        }
    )
    product.timings.update({f"guard_{k}": v for k, v in timings.items()})
    report = {"a": a, "b": b, **timings, "moves_seconds": [m["seconds"] for m in moves]}
    print("\ndisruption guard rails on real nodes:", json.dumps(report))
    _leave_no_pods(product, namespace)


def test_a_pod_disruption_budget_holds_a_migration_until_it_allows_it(
    product: Product,  # noqa: F811
    namespace: str,  # noqa: F811
    flow: ConsolidationFlow,  # noqa: F811
) -> None:
    kube = product.kube
    groups = {n: kube.get(f"/api/v1/nodes/{n}")["metadata"]["labels"].get(GROUP) for n in product.real_nodes}
    batch_nodes = sorted(n for n, g in groups.items() if g == "batch")
    assert len(batch_nodes) >= 2, f"needs two real batch nodes, got {groups}"
    source, dest = batch_nodes[0], batch_nodes[1]
    pod = _counter("guarded", source)
    pod["metadata"]["labels"] = {"app": "guarded"}
    kube.create_pod(namespace, pod)
    path = f"/api/v1/namespaces/{namespace}/pods/guarded"
    src = kube.wait(lambda: x if _ready(x := kube.get(path)) else None, "the counter Running", timeout=120)
    src_cid = _cid(src)
    pdbs = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
    kube.create(pdbs, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "keep"},
                       "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}})  # fmt: skip
    kube.wait(lambda: kube.get(f"{pdbs}/keep").get("status", {}).get("expectedPods") == 1 or None,
              "the PDB observed by the disruption controller", timeout=60, interval=0.5)  # fmt: skip
    loop: asyncio.AbstractEventLoop = flow.loop  # type: ignore[attr-defined]
    flow.disruption = load_settings(DisruptionSettings, {"pdb_wait_seconds": 3.0})

    t0 = time.monotonic()
    held = loop.run_until_complete(flow.move_pod(f"guarded-{uuid.uuid4().hex[:8]}", kube.get(path), source, dest))
    held_seconds = time.monotonic() - t0
    assert held["outcome"] == "refused" and "PodDisruptionBudget" in held["reason"], held
    assert held["verdict"] is MoveVerdict.ROLL_BACK and held.get("record") is None, "nothing was checkpointed"
    assert [x["metadata"]["name"] for x in kube.pods(namespace)] == ["guarded"], "no destination pod"
    assert _cid(kube.get(path)) == src_cid, "the source is untouched"
    assert flow.metrics.disruptions.labels("migration", "pdb")._value.get() >= 1

    kube.request("DELETE", f"{pdbs}/keep", ok=(200, 202, 404))
    t1 = time.monotonic()
    moved = loop.run_until_complete(flow.move_pod(f"guarded-{uuid.uuid4().hex[:8]}", kube.get(path), source, dest))
    moved_seconds = time.monotonic() - t1
    assert moved["verdict"] is MoveVerdict.COMMIT, moved
    dest_ns, dest_name = moved["destination_pod"].split("/")
    assert kube.get(f"/api/v1/namespaces/{dest_ns}/pods/{dest_name}")["spec"]["nodeName"] == dest
    product.timings.update({"guard_pdb_held_seconds": round(held_seconds, 3),
                            "guard_pdb_released_move_seconds": round(moved_seconds, 3)})  # fmt: skip
    report = {"held_seconds": round(held_seconds, 3), "move_after_pdb_deleted_seconds": round(moved_seconds, 3)}
    print("\nPDB held a migration:", json.dumps(report))
    _leave_no_pods(product, namespace)
