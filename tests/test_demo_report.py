"""`make demo`'s pure parts, without a cluster: the workload it submits, the report it builds from what it observed,
the claims it fails on, the text and the plot (lab/demo.py, lab/demo_report.py). CI runs `make demo` itself on
kind (.ci/run); these catch a regression in the parsing, the checks or the plot before that."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from extender.autoscaler.settings import AutoscalerSettings
from extender.core.autoscale import plan_pods, with_headroom
from extender.core.model import Pod, Resources, WorkloadKind, cpu_millicores, memory_bytes
from extender.settings.extender import ExtenderConfig
from lab import demo
from lab.demo_report import (
    Migration,
    Report,
    VerbRow,
    build_report,
    failures,
    parse_release,
    parse_ticks,
    preemptions_in,
    release_order,
    render,
    rfc3339,
    write_plot,
)

P = "qos.kube-qos-extender.io/"
T0 = rfc3339("2026-11-22T10:00:00Z")


def stamp(seconds: float) -> str:
    whole = int(T0 + seconds)
    from datetime import UTC, datetime

    return datetime.fromtimestamp(whole, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------- parsing


def test_release_events_are_parsed_pinned_or_not() -> None:
    msg = "gate released in increasing-Q order pinned to kind-worker2: Q=-2.6s after 0.6s"
    assert parse_release(msg) == (-2.6, 0.6, "kind-worker2")
    assert parse_release("gate released in increasing-Q order: Q=197.4s after 53.0s") == (197.4, 53.0, None)
    assert parse_release("gate released in increasing-Q order pinned to n: Q=1.0s after 2.0s; preempted a, b") == (
        1.0,
        2.0,
        "n",
    )
    assert parse_release("no room by the QoS rules (Q=597.3s), but lower-priority pods could make some") is None
    # QoSReleasedForPriority since session 24: with the wait, unpinned
    msg = "no room by the QoS rules (Q=597.3s after 12.0s), but lower-priority pods could make some: released unpinned"
    assert parse_release(msg) == (597.3, 12.0, None)


def test_ticks_with_kubelet_nanosecond_timestamps() -> None:
    text = "2026-11-22T10:00:01.123456789Z tick 7\n2026-11-22T10:00:02.5Z tick 8\nnoise\n"
    assert parse_ticks(text) == [(T0 + 1.123456789, 7), (T0 + 2.5, 8)]
    with pytest.raises(ValueError, match="RFC 3339"):
        rfc3339("yesterday")


# ---------------------------------------------------------------------------------------------- fixtures


def pod(
    name: str, cls: str, kind: str, node: str | None, cpu: str = "500m", label: str | None = None, **ann: str
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "qos-demo",
            "creationTimestamp": stamp(0),
            "annotations": {P + "class": cls, P + "kind": kind, **ann},
            "labels": {"app.kubernetes.io/part-of": "qos-demo", "qos-demo/name": label or name},
        },
        "spec": {"nodeName": node, "containers": [{"name": "main", "resources": {"requests": {"cpu": cpu}}}]},
        "status": {"phase": "Running" if node else "Pending"},
    }


def node(name: str, group: str, flavour: str, kind: str, price: float, *, bought: bool = False) -> dict[str, Any]:
    labels = {P + "node-group": group, "node.kubernetes.io/instance-type": flavour, "type": kind}
    if bought:
        labels[P + "provisioned-by"] = "qos-autoscaler"
    return {
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {P + "price-per-hour": str(price)},
            "creationTimestamp": stamp(55 if bought else -300),
        },
        "status": {"allocatable": {"cpu": "2" if not bought else "1"}},
    }


def released(name: str, q: float, waited: float, node: str) -> dict[str, Any]:
    return {
        "reason": "QoSReleased",
        "involvedObject": {"name": name},
        "firstTimestamp": stamp(waited),
        "message": f"gate released in increasing-Q order pinned to {node}: Q={q:.1f}s after {waited:.1f}s",
    }


def migration(**kw: Any) -> Migration:
    base: dict[str, Any] = {
        "pod": "counter",
        "source": "w2",
        "destination": "w3",
        "destination_pod": "counter-mv-1",
        "outcome": "succeeded",
        "reason": "restored at the destination and confirmed",
        "seconds": 1.7,
        "ticks_source": tuple((T0 + i, i) for i in range(10)),
        # the source's log carried over (up to tick 10, before the commit), then the restored process's own
        "ticks_destination": (*((T0 + i, i) for i in range(11)), (T0 + 12.5, 11), (T0 + 13.5, 12)),
        "committed": T0 + 12.0,
        "phases": (("new", T0 + 10.0), ("committed", T0 + 12.0)),
    }
    return Migration(**{**base, **kw})


def report(**kw: Any) -> Report:
    workload = [
        pod("web-gold-0", "gold", "service", "w1"),
        pod("web-bronze-0", "bronze", "service", "bought-svc-a"),
        pod("web-bronze-1", "bronze", "service", "bought-svc-b"),
        pod("batch-silver-0", "silver", "batch", "w2", **{P + "runtime-seconds": "900"}),
        pod("counter-mv-1", "gold", "batch", "w3", "100m", "counter", **{P + "migrated-from": "qos-demo/counter"}),
    ]
    control_plane = {"metadata": {"name": "cp", "labels": {"node-role.kubernetes.io/control-plane": ""}}}
    nodes = [
        node("cp", "-", "-", "-", 0.0) | control_plane,
        node("w1", "service", "m1.medium", "kind", 0.1371),
        node("w2", "batch", "m1.large", "kind", 0.2746),
        node("w3", "batch", "m1.large", "kind", 0.2746),
        node("bought-svc-a", "service", "m3.xsmall", "kwok", 0.0344, bought=True),
        node("bought-svc-b", "service", "t3.xsmall", "kwok", 0.0198, bought=True),
    ]  # fmt: skip
    events = [
        released("web-gold-0", -2.5, 0.4, "w1"),
        released("counter", -2.6, 0.6, "w2"),
        released("batch-silver-0", 97.4, 0.7, "w2"),
        released("web-bronze-0", 198.6, 57.5, "bought-svc-a"),
        released("web-bronze-1", 198.3, 57.8, "bought-svc-b"),
        {"reason": "TriggeredScaleUp", "involvedObject": {"name": "web-bronze-0"}, "message": "node ..."},
    ]
    args: dict[str, Any] = {
        "t0": T0,
        "workload": workload,
        "all_pods": workload,
        "nodes": nodes,
        "events": events,
        "running_at": {"web-gold-0": 4.7, "counter": 5.7, "batch-silver-0": 5.0, "web-bronze-0": 57.9,
                       "web-bronze-1": 57.9},
        "verbs": [VerbRow("filter", 5, 0.8, 8.5), VerbRow("prioritize", 0, None, None), VerbRow("bind", 5, 120, 425)],
        "class_metrics": {"gold": {"fulfilment": 0.0, "availability": 0.98}, "bronze": {"fulfilment": 1.0}},
        "slo": {"gold": 1.0, "silver": 0.9, "bronze": 0.5},
        "releases_by_reason": {"fits": 5.0},
        "migration": migration(),
    }  # fmt: skip
    args.update(kw)
    return build_report(**args)


# ---------------------------------------------------------------------------------------------- report


def test_report_rows_from_the_observations() -> None:
    r = report()
    by = {p.name: p for p in r.pods}
    assert by["web-bronze-0"].q == 198.6 and by["web-bronze-0"].waited == 57.5
    assert by["web-bronze-0"].node == "bought-svc-a" and by["web-bronze-0"].running_at == 57.9
    # the migrated pod keeps its source's release and start (it was released and started as the source)
    moved = by["counter-mv-1"]
    assert moved.migrated_from == "counter" and moved.q == -2.6 and moved.running_at == 5.7 and moved.cpu_m == 100
    assert [p.node for p in r.purchases] == ["bought-svc-a", "bought-svc-b"]
    assert r.purchases[0].after == pytest.approx(55.0) and r.purchases[0].pods == ("web-bronze-0",)
    assert r.cost_before == pytest.approx(0.1371 + 2 * 0.2746)
    assert r.cost_after == pytest.approx(r.cost_before + 0.0344 + 0.0198)
    assert r.nodes[-1].type == "control-plane" and not r.nodes[-1].bought
    classes = {c.cls: c for c in r.classes}
    assert classes["bronze"].waited_mean == pytest.approx(57.65) and classes["bronze"].slo == 0.5
    assert classes["gold"].availability == 0.98 and classes["silver"].fulfilment is None
    assert failures(r) == []


def test_release_order_groups_passes_and_orders_each_by_q() -> None:
    r = report()
    ranked = sorted((p for p in r.pods if p.released_rank), key=lambda p: p.released_rank or 0)
    assert [p.name for p in ranked] == ["counter-mv-1", "web-gold-0", "batch-silver-0", "web-bronze-1", "web-bronze-0"]
    assert [p.released_pass for p in ranked] == [1, 1, 1, 2, 2]
    rank, passes = release_order([])
    assert rank == {} and passes == {}


def test_a_pod_released_for_priority_has_its_place_in_the_order_and_says_so() -> None:
    """A pod the controller released unpinned to kube-scheduler's priority preemption (QoSReleasedForPriority)
    waited behind the gate like any other: the ordering table ranks it and marks it, instead of a row of '-' as
    if it had never been gated (which misled a diagnosis in session 23)."""
    events = [
        released("web-gold-0", -2.5, 0.4, "w9"),
        {
            "reason": "QoSReleasedForPriority",
            "involvedObject": {"name": "batch-silver-0"},
            "firstTimestamp": stamp(0.5),
            "message": "no room by the QoS rules (Q=97.0s after 0.5s), but lower-priority pods could make some: "
            "released unpinned to kube-scheduler's priority preemption",
        },
    ]
    r = report(events=events)
    by = {p.name: p for p in r.pods}
    silver = by["batch-silver-0"]
    assert (silver.q, silver.waited, silver.for_priority) == (97.0, 0.5, True)
    assert silver.released_rank == 2 and not by["web-gold-0"].for_priority
    lines = render(r)
    row = next(line for line in lines if "batch-silver-0" in line and "97.0" in line)
    assert "batch-silver-0^" in row
    assert any(line.startswith("^ no room by the QoS rules") for line in lines)
    assert not any(line.startswith("^ ") for line in render(report()))


def test_a_requeued_pod_counts_its_last_release() -> None:
    events = [released("web-gold-0", -2.5, 0.4, "w9"), released("web-gold-0", -30.0, 30.0, "w1")]
    r = report(events=events)
    assert {p.name: p.waited for p in r.pods}["web-gold-0"] == 30.0


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"migration": None}, "no migration was attempted"),
        ({"migration": migration(outcome="rolled_back", reason="destination pod Failed")}, "ended rolled_back"),
        # the restored process counting from 0 again: its progress was lost
        ({"migration": migration(ticks_destination=((1e12, 0), (1e12 + 1, 1)))}, "did not go on from tick 9"),
        ({"verbs": [VerbRow("filter", 3, 1.0, 2.0)]}, "no bind request"),
        ({"events": []}, "released nothing"),
    ],
)
def test_each_claim_that_did_not_hold_is_a_failure(change: dict[str, Any], expected: str) -> None:
    problems = failures(report(**change))
    assert any(expected in p for p in problems), problems


def test_no_purchase_one_flavour_pending_pods_and_inverted_order_fail() -> None:
    r = report()
    r.purchases = []
    assert any("bought no node" in p for p in failures(r))
    r = report()
    r.purchases = [r.purchases[0], r.purchases[0]]
    assert any("one flavour only" in p for p in failures(r))
    pending = report(workload=[pod("web-gold-0", "gold", "service", None)])
    assert any("not Running at the end: web-gold-0" in p for p in failures(pending))
    inverted = report(events=[released("web-gold-0", 1.0, 60.0, "w1"), released("web-bronze-0", 1.0, 1.0, "w1")])
    assert any("gold waited longer than bronze" in p for p in failures(inverted))


def test_preemptions_and_lost_pods_are_reported() -> None:
    """A service preempted by kube-scheduler (priority) or by the controller (Q) is named with the demo's names
    (the victim's pod is gone by the end: the demo remembers every pod it saw); a demo name with no pod Running
    at the end fails the run even though no pod of it is left to be not Running."""
    events = [
        {"reason": "Preempted", "involvedObject": {"name": "web-bronze-0-abc"},
         "message": "Preempted by pod 1234-uid on node w1"},
        {"reason": "QoSPreempted", "involvedObject": {"name": "batch-bronze-1"},
         "message": "evicted for qos-demo/batch-bronze-0 on w2: Q_victim=900.0s, Q_pending=10.0s (base rule of "
                    "paper 002 §3.3.1)"},
    ]  # fmt: skip
    r = report(
        events=events,
        names={"web-bronze-0-abc": "web-bronze-0", "web-silver-0-xyz": "web-silver-0"},
        uids={"1234-uid": "web-silver-0-xyz"},
        expected=["web-gold-0", "web-bronze-9"],
    )
    assert [(x.victim, x.by, x.node, x.who.split()[0]) for x in r.preemptions] == [
        ("web-bronze-0", "web-silver-0", "w1", "kube-scheduler"),
        ("batch-bronze-1", "batch-bronze-0", "w2", "QoS"),
    ]
    assert r.preemptions[1].detail.startswith("Q_victim=900.0s")
    text = "\n".join(render(r))
    assert "preempted: web-bronze-0 on w1 for web-silver-0, by kube-scheduler (priority)" in text
    assert r.missing == ["web-bronze-9"]
    assert any("not Running at the end: web-bronze-9" in p for p in failures(r))


def test_a_bare_pod_deleted_by_kube_schedulers_preemption_is_gone_not_stuck() -> None:
    """CI stop 43: kube-scheduler preempted the bare batch-bronze-1 for batch-silver-0 (released for priority by
    the controller), which deletes a bare pod for good; the demo waited 420 s for it and failed. Gone by
    preemption is reported, not a failure; a bare pod missing without that Event, a service's pod (its
    ReplicaSet re-creates it) and a bare pod whose name has a pod again are still failures."""
    preempted = {"reason": "Preempted", "involvedObject": {"name": "batch-bronze-1"},
                 "message": "Preempted by pod 1234-uid on node w2"}  # fmt: skip
    base = {"events": [released("web-gold-0", -2.5, 0.4, "w9"), preempted], "uids": {"1234-uid": "batch-silver-0"}}
    r = report(**base, expected=["web-gold-0", "batch-bronze-1"], bare=["batch-bronze-1"])
    assert r.missing == ["batch-bronze-1"] and r.preempted_gone == ["batch-bronze-1"]
    assert not any("not Running" in p for p in failures(r)), failures(r)
    assert "batch-bronze-1: a bare pod preempted by kube-scheduler is deleted" in "\n".join(render(r))
    assert [(x.victim, x.who) for x in preemptions_in(base["events"], {}, {})] == [
        ("batch-bronze-1", "kube-scheduler (priority)")
    ]
    # not bare (a Deployment's pod): the ReplicaSet owes a new one
    r = report(**base, expected=["web-gold-0", "batch-bronze-1"])
    assert r.preempted_gone == [] and any("not Running at the end: batch-bronze-1" in p for p in failures(r))
    # bare but no preemption Event: stuck or lost, a failure
    r = report(events=base["events"][:1], expected=["web-gold-0", "batch-bronze-1"], bare=["batch-bronze-1"])
    assert r.preempted_gone == [] and any("not Running at the end: batch-bronze-1" in p for p in failures(r))
    # bare and preempted, but a pod of that name exists again and is not Running: not gone
    again = [pod("batch-bronze-1", "bronze", "batch", None)]
    r = report(**base, workload=again, expected=["batch-bronze-1"], bare=["batch-bronze-1"])
    assert r.preempted_gone == [] and any("not Running at the end: batch-bronze-1" in p for p in failures(r))


def test_services_are_deployments_of_their_pod() -> None:
    svc = next(p for p in demo.sample_workload() if p["metadata"]["name"] == "web-gold-0")
    d = demo.as_deployment(svc)
    assert d["kind"] == "Deployment" and d["metadata"]["name"] == "web-gold-0" and d["spec"]["replicas"] == 1
    template = d["spec"]["template"]
    assert "name" not in template["metadata"] and template["spec"] == svc["spec"]
    assert d["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert template["metadata"]["labels"][demo.NAME_LABEL] == "web-gold-0"


def test_progress_kept_needs_the_restored_count_to_go_on_by_one() -> None:
    assert migration().progress_kept and migration().first_restored_tick == 11
    assert not migration(committed=None).progress_kept
    skipping = migration(ticks_destination=((T0 + 13, 11), (T0 + 14, 13)))
    assert not skipping.progress_kept
    assert not migration(ticks_source=()).progress_kept


def test_render_says_what_happened() -> None:
    text = "\n".join(render(report()))
    assert "counter*" in text and "progress kept" in text
    assert "2 nodes bought, flavours m3.xsmall, t3.xsmall" in text
    assert "bought-svc-a" in text and "kwok, bought" in text
    assert "releases by reason: fits 5" in text
    lost = "\n".join(render(report(migration=migration(ticks_destination=()))))
    assert "PROGRESS LOST" in lost


def test_report_json_round_trips(tmp_path: Path) -> None:
    import json

    doc = json.loads(report().to_json())
    assert doc["migration"]["progress_kept"] is True and doc["migration"]["first_restored_tick"] == 11
    assert len(doc["purchases"]) == 2


def test_plot_is_written(tmp_path: Path) -> None:
    path = write_plot(report(), tmp_path / "sub" / "demo-report.png")
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 20_000
    # and with nothing bought or migrated (a failed run still gets its plot)
    empty = report(migration=None)
    empty.purchases = []
    assert write_plot(empty, tmp_path / "empty.png").stat().st_size > 10_000


# ---------------------------------------------------------------------------------------------- workload


def _cpu(p: dict[str, Any]) -> int:
    return cpu_millicores(p["spec"]["containers"][0]["resources"]["requests"]["cpu"])


def test_the_workload_is_real_containers_that_overflow_both_groups() -> None:
    pods = demo.sample_workload()
    assert len({p["metadata"]["name"] for p in pods}) == len(pods)
    for p in pods:
        c = p["spec"]["containers"][0]
        assert c["image"] == demo.BUSYBOX and c["imagePullPolicy"] == "Never"
        assert p["spec"]["schedulerName"] == "qos-scheduler"
        assert p["metadata"]["annotations"][P + "class"] in ("gold", "silver", "bronze")
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for p in pods:
        by_kind.setdefault(p["metadata"]["annotations"][P + "kind"], []).append(p)
    # more than the kind workers offer (one service worker, two batch workers, demo.ROOM_M each): a purchase
    assert sum(map(_cpu, by_kind["service"])) > demo.ROOM_M
    assert sum(map(_cpu, by_kind["batch"])) > 2 * demo.ROOM_M
    # every class in both groups, and the counter the demo migrates is a batch pod printing ticks
    for kind in ("service", "batch"):
        assert {p["metadata"]["annotations"][P + "class"] for p in by_kind[kind]} == {"gold", "silver", "bronze"}
    counter = next(p for p in pods if p["metadata"]["name"] == demo.COUNTER)
    assert counter["metadata"]["annotations"][P + "kind"] == "batch" and "tick" in str(counter["spec"])


def test_the_bronze_services_left_over_are_bought_as_two_flavours() -> None:
    """The demo's heterogeneous purchase: the three bronze services (what the gold and silver ones leave no room
    for) planned by the autoscaler's own planner on kind, where every node keeps room for the agent and route
    DaemonSets (55m, 112 MiB)."""
    pods = [p for p in demo.sample_workload() if p["metadata"]["name"].startswith("web-bronze")]
    first = [p for p in demo.sample_workload() if p["metadata"]["name"].startswith(("web-gold", "web-silver"))]
    assert sum(map(_cpu, first)) <= demo.ROOM_M < sum(map(_cpu, first)) + _cpu(pods[0])
    core = [
        Pod(
            p["metadata"]["name"],
            Resources(_cpu(p), memory_bytes(p["spec"]["containers"][0]["resources"]["requests"]["memory"]), 1),
            kind=WorkloadKind.SERVICE,
        )
        for p in pods
    ]
    flavours = with_headroom(ExtenderConfig().flavours, Resources(55, 112 * 2**20, 0))
    plan = plan_pods(core, flavours, AutoscalerSettings().weights)
    assert len({f.name for f, _ in plan.nodes}) >= 2, plan.nodes


def test_no_set_of_leftover_pods_fills_a_flavour_to_its_daemonsets_room() -> None:
    """The QoS controller fills a new node before its DaemonSet pods arrive; on kind the route DaemonSet's pod
    (system-node-critical) then preempted a bronze batch pod that two of a kind had packed a t3.xsmall with
    (a bare pod: lost). So no set of the pods left for bought nodes fits a flavour without leaving it the room
    of the DaemonSets (55m, 112 MiB), whatever the controller packs together."""
    from itertools import combinations

    left = [p for p in demo.sample_workload() if "bronze" in p["metadata"]["name"]]
    for kind in ("service", "batch"):
        pods = [p for p in left if p["metadata"]["annotations"][P + "kind"] == kind]
        sizes = [(_cpu(p), memory_bytes(p["spec"]["containers"][0]["resources"]["requests"]["memory"])) for p in pods]
        for flavour in ExtenderConfig().flavours:
            cap = flavour.capacity
            for n in range(1, len(sizes) + 1):
                for group in combinations(sizes, n):
                    cpu, mem = sum(c for c, _ in group), sum(m for _, m in group)
                    if cpu <= cap.cpu_milli and mem <= cap.memory_bytes:
                        assert cap.cpu_milli - cpu >= 55 and cap.memory_bytes - mem >= 112 * 2**20, (kind, flavour)


def test_filler_leaves_exactly_the_room() -> None:
    n = {"metadata": {"name": "w"}, "status": {"allocatable": {"cpu": "2"}}}
    running = {"spec": {"nodeName": "w", "containers": [{"resources": {"requests": {"cpu": "565m"}}}]}, "status": {}}
    done = copy.deepcopy(running) | {"status": {"phase": "Succeeded"}}
    elsewhere = copy.deepcopy(running)
    elsewhere["spec"]["nodeName"] = "x"
    assert demo.filler_cpu(n, [running, done, elsewhere]) == 2000 - 565 - demo.ROOM_M
    assert demo.filler_cpu(n, [running], room_m=1900) == 0


def test_a_failed_kind_up_still_tears_down_and_exits_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The cluster is removed whatever happens (CI must not leave kind containers behind), and a cluster that
    never came up is exit status 2."""
    calls: list[str] = []

    def up(self: demo.KindCluster) -> dict[str, str]:
        calls.append("up")
        raise RuntimeError("hack/kind-up.sh failed (exit 1)")

    monkeypatch.setattr(demo.KindCluster, "up", up)
    monkeypatch.setattr(demo.KindCluster, "down", lambda self: calls.append("down"))
    monkeypatch.setenv("QOS_DEMO_STATE", str(tmp_path / "state"))
    assert demo.main(["--no-simulate"]) == 2
    assert calls == ["up", "down"]
    assert (tmp_path / "state.report" / "demo.log").is_file()
