"""The QoS controller's preemptions and the slack controller's evictions under the disruption guard rails (issue 32
part 4): a budget holds them (Event QosDisruptionWaiting naming it), dry-run reports each (QosDisruptionDryRun)
and makes none; without budgets and dry-run nothing is held (today's behaviour)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from extender.colocation.controller import SlackController, SlackMetrics, SlackParams
from extender.controller.decide import Evict, Release
from extender.controller.loop import QosController
from extender.controller.metrics import ControllerMetrics
from extender.core.disruption import Disruption, DisruptionKind
from extender.core.model import NodeGroup
from extender.settings import load_settings
from extender.settings.sections import DisruptionSettings


def _guard(**raw: Any) -> DisruptionSettings:
    return load_settings(DisruptionSettings, raw)


@dataclass
class _Said:
    pod: str
    uid: str
    reason: str
    message: str
    type_: str


class _Events:
    def __init__(self) -> None:
        self.said: list[_Said] = []

    def emit(self, pod: str, uid: str, reason: str, message: str, type_: str) -> None:
        self.said.append(_Said(pod, uid, reason, message, type_))


def _controller(guard: DisruptionSettings) -> tuple[QosController, _Events]:
    """The controller's guard step alone: its snapshot is two batch nodes and one victim being evicted on n1."""
    ctl = object.__new__(QosController)
    events = _Events()
    batch = SimpleNamespace(node=SimpleNamespace(group=NodeGroup.BATCH))
    ctl.guard = guard
    ctl._guard_said = {}
    ctl.snapshot = SimpleNamespace(  # type: ignore[assignment]
        nodes={"n1": batch, "n2": batch},
        pods={"ns/old": SimpleNamespace(pod=SimpleNamespace(node_name="n1"))},
        qos_pods={},
    )
    ctl.metrics = ControllerMetrics(CollectorRegistry())
    ctl.events = events  # type: ignore[assignment]
    ctl.clock = lambda: 1000.0
    ctl._evicting = {}
    return ctl, events


def _ev(victim: str, for_pod: str, node: str) -> Evict:
    return Evict(victim, f"uid-{victim}", victim, for_pod, node, 10.0, -5.0, "qos")


RELEASES = [Release(p, "", p, n, -5.0, 1.0) for p, n in (("ns/p1", "n1"), ("ns/p2", "n2"), ("ns/p3", "n2"))]
BY_POD = {"ns/p1": [_ev("ns/v1", "ns/p1", "n1")], "ns/p2": [_ev("ns/v2", "ns/p2", "n2")]}  # p3 needs no victim


def test_without_budgets_or_dry_run_no_preemption_is_held() -> None:
    ctl, events = _controller(DisruptionSettings())
    assert ctl._guard_preemptions(RELEASES, BY_POD) == set() and not events.said


def test_a_budget_of_one_node_holds_the_preemption_on_a_second_node_and_names_itself() -> None:
    ctl, events = _controller(_guard(budgets=[{"name": "one-node", "kinds": ["preemption"], "max_nodes": 1}]))
    assert ctl._guard_preemptions(RELEASES, BY_POD) == {"ns/p2"}
    assert [(s.pod, s.reason) for s in events.said] == [("ns/p2", "QosDisruptionWaiting")]
    assert "one-node" in events.said[0].message and "ns/v2 on n2" in events.said[0].message
    assert ctl.metrics.disruptions.labels("preemption", "waited")._value.get() == 1
    # a victim still being evicted on n1 is in motion: p1 (its victim on n1 too) goes, p2 (on n2) still waits
    ctl._evicting = {"ns/old": 2000.0}
    assert ctl._guard_preemptions(RELEASES, BY_POD) == {"ns/p2"}
    assert len(events.said) == 1, "said once per report interval"


def test_dry_run_releases_no_pod_that_needs_a_victim_and_reports_each_victim() -> None:
    ctl, events = _controller(_guard(dry_run=True))
    assert ctl._guard_preemptions(RELEASES, BY_POD) == {"ns/p1", "ns/p2"}  # p3 (no victim) is released as ever
    assert sorted((s.pod, s.reason) for s in events.said) == [
        ("ns/v1", "QosDisruptionDryRun"),
        ("ns/v2", "QosDisruptionDryRun"),
    ]
    assert "would evict for ns/p1 on n1" in events.said[0].message and events.said[0].uid == "uid-ns/v1"
    assert ctl.metrics.disruptions.labels("preemption", "dry_run")._value.get() == 2
    ctl._guard_preemptions(RELEASES, BY_POD)  # the next pass: the same victims, not reported or counted again
    assert len(events.said) == 2 and ctl.metrics.disruptions.labels("preemption", "dry_run")._value.get() == 2


class _Core:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def create_namespaced_event(self, ns: str, event: dict[str, Any], **kw: Any) -> Any:
        self.events.append(event)
        return _Response()


class _Response:
    status = 201

    async def read(self) -> bytes:
        return b"{}"

    def release(self) -> None:
        return None


def _slack(guard: DisruptionSettings, tmp_path: Path) -> tuple[SlackController, _Core]:
    core = _Core()
    params = SlackParams(model_path=tmp_path / "model.json", guard=guard)
    ctl = SlackController(params, core, None, clock=lambda: 1000.0, metrics=SlackMetrics())  # type: ignore[arg-type]
    return ctl, core


def _slack_d(pod: str, node: str = "n1") -> Disruption:
    return Disruption(DisruptionKind.SLACK_EVICTION, node, "batch", pod)


async def test_slack_evictions_go_as_ever_without_budgets(tmp_path: Path) -> None:
    ctl, core = _slack(DisruptionSettings(), tmp_path)
    assert await ctl._guarded(_slack_d("ns/b1"), "u", 1000.0) and not core.events


async def test_a_pod_budget_holds_a_second_slack_eviction_and_dry_run_evicts_none(tmp_path: Path) -> None:
    ctl, core = _slack(_guard(budgets=[{"name": "one-pod", "max_pods": 1}]), tmp_path)
    assert await ctl._guarded(_slack_d("ns/b1"), "u1", 1000.0)
    ctl._evicting["ns/b1"] = (_slack_d("ns/b1"), 1120.0)
    assert not await ctl._guarded(_slack_d("ns/b2"), "u2", 1000.0)
    assert [(e["reason"], e["involvedObject"]["name"], e["type"]) for e in core.events] == [
        ("QosDisruptionWaiting", "b2", "Normal")
    ]
    assert "one-pod" in core.events[0]["message"]
    assert ctl.metrics.disruptions.labels("slack-eviction", "waited")._value.get() == 1

    ctl, core = _slack(_guard(dry_run=True), tmp_path)
    assert not await ctl._guarded(_slack_d("ns/b1"), "u1", 1000.0)
    assert not await ctl._guarded(_slack_d("ns/b1"), "u1", 1001.0)  # reported once per interval
    assert [(e["reason"], e["involvedObject"]["name"]) for e in core.events] == [("QosDisruptionDryRun", "b1")]
    assert ctl.metrics.disruptions.labels("slack-eviction", "dry_run")._value.get() == 1  # once per report
