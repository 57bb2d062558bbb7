"""The consolidation flow under the disruption guard rails (issue 32 part 4): budgets hold nodes and migrations,
dry-run reports each move and changes nothing, a PodDisruptionBudget holds a migration. The flow's API calls are
replaced by recorders here (the real ones run in e2e/test_consolidation_guard_real.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from extender.autoscaler.handoff import Consolidation
from extender.consolidation.flow import ConsolidationFlow
from extender.consolidation.settings import ConsolidationSettings
from extender.core.reschedule import MigrationPlan
from extender.kube.client import ApiError
from extender.settings import load_settings
from extender.settings.sections import DisruptionSettings


class _Events:
    def __init__(self) -> None:
        self.notices: list[Any] = []

    def emit(self, notice: Any) -> None:
        self.notices.append(notice)


def _guard(**raw: Any) -> DisruptionSettings:
    return load_settings(DisruptionSettings, raw)


def _pod(name: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": {}},
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


def _flow(guard: DisruptionSettings, **settings: Any) -> tuple[ConsolidationFlow, _Events]:
    flow = ConsolidationFlow(
        ConsolidationSettings(provisioned_only=False, **settings), clock=lambda: 1000.0, disruption=guard
    )
    events = _Events()
    flow._events = events
    return flow, events


PLANS = (MigrationPlan("a", (("ns/pa", "c"),)), MigrationPlan("b", (("ns/pb", "c"),)))


def _reasons(events: _Events) -> list[tuple[str, str]]:
    return [(n.reason, n.name) for n in events.notices]


async def test_a_budget_of_one_node_starts_one_of_two_plans_and_says_which_budget_held_the_other() -> None:
    flow, events = _flow(_guard(budgets=[{"name": "one-node", "max_nodes": 1}]), concurrent_nodes=2)
    release = asyncio.Event()
    started: list[str] = []

    async def consolidate(plan: MigrationPlan, *, dry_run: bool = False) -> Any:
        started.append(plan.source)
        await release.wait()
        return None

    flow.consolidate = consolidate  # type: ignore[method-assign]
    hand = Consolidation(1.0, ("a", "b"), PLANS)
    flow._start_plans(hand, 1000.0)
    await asyncio.sleep(0)
    assert started == ["a"] and flow.busy == {"a"}
    assert ("QosDisruptionWaiting", "b") in _reasons(events)
    waiting = next(n for n in events.notices if n.reason == "QosDisruptionWaiting")
    assert "one-node" in waiting.message and "consolidation of b" in waiting.message
    assert flow.metrics.disruptions.labels("consolidation", "waited")._value.get() == 1
    flow._start_plans(hand, 1000.0)  # again while a runs: still one
    await asyncio.sleep(0)
    assert started == ["a"]
    release.set()
    await asyncio.gather(*flow._tasks)
    assert flow.busy == set() and flow._motion_nodes == set()
    flow._start_plans(Consolidation(2000.0, ("b",), PLANS[1:]), 1000.0)  # a is done: b goes
    await asyncio.sleep(0)
    assert started == ["a", "b"]
    await asyncio.gather(*flow._tasks)


@pytest.mark.parametrize(("concurrent", "expect"), [(1, ["a"]), (2, ["a", "b"])])
async def test_without_budgets_concurrent_nodes_starts_that_many_and_the_default_one(
    concurrent: int, expect: list[str]
) -> None:
    if True:
        flow, _ = _flow(DisruptionSettings(), concurrent_nodes=concurrent)
        started: list[str] = []
        release = asyncio.Event()

        async def consolidate(plan: MigrationPlan, *, dry_run: bool = False) -> Any:
            started.append(plan.source)
            await release.wait()

        flow.consolidate = consolidate  # type: ignore[method-assign]
        flow._start_plans(Consolidation(1.0, ("a", "b"), PLANS), 1000.0)
        await asyncio.sleep(0)
        assert started == expect
        release.set()
        await asyncio.gather(*flow._tasks)


async def test_dry_run_reports_every_move_of_both_nodes_and_changes_nothing() -> None:
    flow, events = _flow(_guard(dry_run=True, budgets=[{"name": "one-node", "max_nodes": 1}]), concurrent_nodes=2)
    pods = {"a": [_pod("pa", "a")], "b": [_pod("pb", "b")]}

    async def node(name: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {}}

    async def pods_on(name: str) -> list[dict[str, Any]]:
        return pods[name]

    async def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"dry-run changed something: {args}")

    flow._node = node  # type: ignore[method-assign]
    flow._pods_on = pods_on  # type: ignore[method-assign,assignment]
    flow._cordon = forbidden  # type: ignore[method-assign]
    flow.move_pod = forbidden  # type: ignore[method-assign]
    hand = Consolidation(1.0, ("a", "b"), PLANS)
    flow._start_plans(hand, 1000.0)
    await asyncio.gather(*flow._tasks)
    # both reported (a dry-run puts nothing in motion, so the budget of one node holds neither back)
    assert sorted(r for r in _reasons(events) if r[0] == "QosDisruptionDryRun") == [
        ("QosDisruptionDryRun", "a"), ("QosDisruptionDryRun", "b"),
        ("QosDisruptionDryRun", "pa"), ("QosDisruptionDryRun", "pb"),
    ]  # fmt: skip
    pod_event = next(n for n in events.notices if n.name == "pa")
    assert pod_event.kind == "Pod" and pod_event.namespace == "ns" and "would migrate from a to c" in pod_event.message
    assert flow.metrics.disruptions.labels("migration", "dry_run")._value.get() == 2
    assert flow.metrics.disruptions.labels("consolidation", "dry_run")._value.get() == 2
    assert [o.removed for o in flow.outcomes] == [False, False] and all(not o.moves for o in flow.outcomes)
    assert flow.busy == set() and flow._motion_nodes == set()
    # reported once per report interval, not every scan
    flow._start_plans(hand, 1000.0)
    assert not flow._tasks


async def test_a_migration_waits_for_its_pdb_then_gives_up_with_the_reason() -> None:
    flow, events = _flow(_guard(pdb_wait_seconds=0.3))
    calls: list[Any] = []

    class _Core:
        async def create_namespaced_pod_eviction(self, name: str, ns: str, body: Any, **kw: Any) -> Any:
            calls.append((name, ns, kw.get("dry_run"), body["deleteOptions"]))
            raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the disruption budget.")

    flow._core = _Core()  # type: ignore[assignment]
    flow._token = lambda: "t0k"
    result = await flow.move_pod("m-1", _pod("pa", "a"), "a", "c")
    assert result["outcome"] == "refused" and "PodDisruptionBudget" in result["reason"], result
    assert calls and all(c[2] == "All" and c[3]["dryRun"] == ["All"] for c in calls)
    assert calls[0][3]["preconditions"] == {"uid": "uid-pa"}
    assert flow.metrics.disruptions.labels("migration", "pdb")._value.get() == len(calls)
    assert [n.reason for n in events.notices][:1] == ["QosDisruptionWaiting"]


async def test_a_migration_within_its_pdb_goes_on() -> None:
    flow, _ = _flow(DisruptionSettings())

    class _Core:
        async def create_namespaced_pod_eviction(self, name: str, ns: str, body: Any, **kw: Any) -> Any:
            return _Response()

    class _Response:
        status = 201

        async def read(self) -> bytes:
            return b'{"kind": "Status", "status": "Success"}'

        def release(self) -> None:
            return None

    flow._core = _Core()  # type: ignore[assignment]
    assert await flow._pdb_allows("ns", "pa", "uid") is None
