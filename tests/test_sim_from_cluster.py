"""`simulate --from-cluster` without a cluster: the pure conversion of a cluster's history into a replay and its
actual bill / SLIs (extender/sim/from_cluster.py), the shell's pure parsing of API objects and Prometheus answers
(extender/processes/history.py), and the command's one-line errors on bad input."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from extender import cli
from extender.core import qos
from extender.core.model import DEFAULT_CLASSES, InvalidInputError, NodeGroup, WorkloadKind
from extender.processes.history import PromQueries, from_prometheus, nodes_from_k8s, pods_from_k8s
from extender.settings.sections import FLAVOURS_PATH, NodeGroupsConfig, PodDefaults, read_catalogue
from extender.sim.engine import simulate
from extender.sim.from_cluster import (
    ClusterHistory,
    ObservedNode,
    ObservedPod,
    compare,
    format_comparison,
    nearest_flavour,
    parse_duration,
    replay_from_history,
)
from extender.sim.report import run_json

FLAVOURS = read_catalogue(FLAVOURS_PATH)
PRICE = {f.name: f.price_per_hour for f in FLAVOURS}
NOW = 1_800_000_000.0
T0 = NOW - 3600.0
GIB = 2**30
BATCH = frozenset((NodeGroup.BATCH,))
SERVICE = frozenset((NodeGroup.SERVICE,))


def _billed(seconds: float, price: float) -> float:
    return math.ceil(seconds / 60 - 1e-9) * price / 60


def _pod(key: str, created: float | None, **kw: Any) -> ObservedPod:
    base: dict[str, Any] = {"cpu_milli": 500, "memory_bytes": GIB, "class_name": "bronze", "kind": WorkloadKind.BATCH}
    base.update(kw)
    return ObservedPod(key=key, created=created, **base)


def _history(**kw: Any) -> ClusterHistory:
    nodes = (
        # there all along, a catalogued flavour: the replay starts with it
        ObservedNode("a", created=T0 - 86400, cpu_milli=4000, memory_bytes=16 * GIB, flavour_label="m1.large",
                     groups=BATCH),
        # added after the first pod arrived (the cluster's own scaling), no label: nearest flavour (m3.small)
        ObservedNode("b", created=T0 + 1000, cpu_milli=2000, memory_bytes=4 * GIB, groups=SERVICE),
        # deleted mid-window (Prometheus), catalogued
        ObservedNode("c", created=T0 - 600, deleted=T0 + 1830, flavour_label="m1.medium", groups=SERVICE,
                     source="prometheus"),
        # unknown label with a price annotation: that price; both node groups
        ObservedNode("d", created=T0 - 10, cpu_milli=8000, memory_bytes=32 * GIB, flavour_label="big.one",
                     price_annotation="0.5", groups=frozenset((NodeGroup.BATCH, NodeGroup.SERVICE))),
        # gone before the window: not billed
        ObservedNode("e", created=T0 - 9000, deleted=T0 - 100, flavour_label="m1.medium", source="prometheus"),
    )  # fmt: skip
    pods = (
        _pod("ns/done", T0 + 100, started=T0 + 110, finished=T0 + 410, phase="Succeeded", node="a"),
        _pod("ns/svc", T0 - 1000, started=T0 - 990, phase="Running", node="c", class_name="silver",
             kind=WorkloadKind.SERVICE),
        _pod("ns/waiting", T0 + 3000, runtime_seconds=120.0),
        _pod("ns/old", T0 - 5000, started=T0 - 4990, finished=T0 - 10, phase="Succeeded"),
        _pod("ns/bad", T0 + 200, started=T0 + 200, finished=T0 + 260, phase="Failed",
             problems=("qos.kube-qos-extender.io/kind: unknown kind 'bach'; using 'service'",)),
        _pod("ns/weird", T0 + 300, started=T0 + 330, finished=T0 + 400, phase="Succeeded", class_name="platinum"),
    )  # fmt: skip
    args: dict[str, Any] = {"now": NOW, "nodes": nodes, "pods": pods}
    args.update(kw)
    return ClusterHistory(**args)


def test_parse_duration() -> None:
    assert parse_duration("3h") == 10800
    assert parse_duration("1h30m") == 5400
    assert parse_duration("90m") == 5400
    assert parse_duration("600") == 600
    assert parse_duration("2d") == 172800
    for bad in ("", "xx", "0s", "-5m", "5x", "h", "3h5"):
        with pytest.raises(InvalidInputError, match="--since"):
            parse_duration(bad)


def test_nearest_flavour() -> None:
    assert nearest_flavour(3000, 6 * GIB, FLAVOURS).name == "m1.medium"
    assert nearest_flavour(2000, 4 * GIB, FLAVOURS).name == "m3.small"
    assert nearest_flavour(1000, 1 * GIB, FLAVOURS).name == "t3.xsmall"
    assert nearest_flavour(64000, 256 * GIB, FLAVOURS).name == "m1.xlarge"
    with pytest.raises(InvalidInputError):
        nearest_flavour(1000, GIB, ())


def test_actual_bill_is_each_node_life_in_the_window_times_its_price() -> None:
    r = replay_from_history(_history(), FLAVOURS, DEFAULT_CLASSES, 3600.0)
    assert (r.start, r.end) == (T0, NOW)
    rows = {n["name"]: n for n in r.actual["nodes"]}
    assert set(rows) == {"a", "b", "c", "d"}  # e was gone before the window
    assert rows["a"]["seconds"] == 3600 and rows["a"]["priced_by"] == "flavour label"
    assert rows["b"]["seconds"] == 2600 and rows["b"]["priced_by"] == "nearest flavour"
    assert rows["b"]["replayed_as"] == "m3.small"
    assert rows["c"]["seconds"] == 1830 and rows["c"]["deleted"] == T0 + 1830
    assert rows["d"]["priced_by"] == "price annotation" and rows["d"]["price_per_hour"] == 0.5
    expected = (
        _billed(3600, PRICE["m1.large"])
        + _billed(2600, PRICE["m3.small"])
        + _billed(1830, PRICE["m1.medium"])  # 31 minutes, rounded up
        + _billed(3600, 0.5)
    )
    assert r.actual["cost_usd"] == pytest.approx(expected, rel=1e-12)
    assert r.actual["node_seconds"] == 3600 + 2600 + 1830 + 3600
    # the replay starts with the nodes there before the first pod (T0 + 0: svc was created before the window)
    assert sorted(r.workload.initial) == sorted(
        [("m1.large", NodeGroup.BATCH), ("m1.medium", NodeGroup.SERVICE), ("m1.xlarge", NodeGroup.SERVICE)]
    )
    text = "\n".join(r.assumptions)
    assert "node b: no flavour label; priced by nearest flavour" in text
    assert "node d: label 'big.one' not in the catalogue; priced by price annotation at $0.5000/h" in text
    assert "node d accepts both node groups: replayed as a service node" in text
    assert "node a:" not in text


def test_observed_slis_and_the_replayed_requests() -> None:
    r = replay_from_history(_history(), FLAVOURS, DEFAULT_CLASSES, 3600.0)
    reqs = {q.request_id: q for q in r.workload.requests}
    assert set(reqs) == {"ns/done", "ns/svc", "ns/waiting", "ns/bad", "ns/weird"}  # old ended before the window
    assert (reqs["ns/done"].arrival, reqs["ns/done"].duration) == (100, 300)
    assert (reqs["ns/svc"].arrival, reqs["ns/svc"].duration) == (0, 3600)  # running: to the window's end
    assert (reqs["ns/waiting"].arrival, reqs["ns/waiting"].duration) == (3000, 120)  # its annotation
    assert reqs["ns/weird"].class_name == "bronze"  # not configured: the least important class
    assert r.workload.horizon == 3600 and r.workload.bill_to_horizon
    a = r.actual
    assert (a["pods"], a["requests_completed"], a["requests_running_at_end"], a["requests_never_started"]) == (
        5, 3, 1, 1)  # fmt: skip
    bronze = a["classes"]["bronze"]
    assert bronze["requests"] == 4 and a["classes"]["silver"]["requests"] == 1
    # done: e 300 p 10; waiting: never ran (0); bad: 60 / 0; weird: 70 / 30
    want = sorted([qos.availability(300, 10), 0.0, 1.0, qos.availability(70, 30)])
    assert bronze["availability_min"] == 0.0
    assert bronze["availability_mean"] == pytest.approx(sum(want) / 4)
    assert bronze["slo_fulfillment"] == 0.75
    assert a["annotation_problems"] == 1 and a["pods_with_annotation_problems"] == 1
    text = "\n".join(r.assumptions)
    assert "1 malformed qos annotation(s) on 1 pod(s)" in text and "unknown kind 'bach'" in text
    assert "1 pod(s) of class 'platinum', not configured" in text
    assert "1 pod(s) still running at the window's end" in text
    assert "1 pod(s) never started in the window" in text
    assert "no Prometheus (--prometheus)" in text
    assert "window clipped" not in text


def test_window_is_clipped_to_what_the_cluster_shows() -> None:
    h = ClusterHistory(
        now=NOW,
        nodes=(ObservedNode("a", created=NOW - 600, flavour_label="m1.medium", groups=SERVICE),),
        pods=(_pod("ns/p", NOW - 500, started=NOW - 490, node="a"),),
        prometheus=True,
        notes=("Prometheus has no kube-state-metrics node series",),
    )
    r = replay_from_history(h, FLAVOURS, DEFAULT_CLASSES, 3 * 3600.0)
    assert (r.start, r.end) == (NOW - 600, NOW)
    assert r.actual["cost_usd"] == pytest.approx(_billed(600, PRICE["m1.medium"]))
    assert r.assumptions[0] == "Prometheus has no kube-state-metrics node series"
    assert any("window clipped to what the cluster shows: 600 s of the 10800 s asked" in x for x in r.assumptions)
    assert not any("no Prometheus" in x for x in r.assumptions)


def test_bad_input_is_refused_or_defaulted() -> None:
    with pytest.raises(InvalidInputError):
        replay_from_history(_history(), (), DEFAULT_CLASSES, 3600.0)
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(InvalidInputError):
            replay_from_history(_history(), FLAVOURS, DEFAULT_CLASSES, bad)
    # nothing at all: an empty workload, no cost, no crash
    r = replay_from_history(ClusterHistory(now=NOW, nodes=(), pods=()), FLAVOURS, DEFAULT_CLASSES, 60.0)
    assert r.workload.requests == () and r.actual["cost_usd"] == 0
    # a node without any size or label is priced as the cluster's most common flavour
    h = ClusterHistory(
        now=NOW,
        nodes=(
            ObservedNode("x", created=T0, flavour_label="m1.large"),
            ObservedNode("y", created=T0),
        ),
        pods=(),
    )
    rows = {n["name"]: n for n in replay_from_history(h, FLAVOURS, DEFAULT_CLASSES, 3600.0).actual["nodes"]}
    assert rows["y"]["priced_by"] == "most common flavour" and rows["y"]["replayed_as"] == "m1.large"


def test_replay_runs_to_the_window_end_under_product() -> None:
    """The replayed run is billed over the same window: it does not stop at the last completion, and an idle
    starting node is deleted (idle_seconds) instead of being billed to the end."""
    h = ClusterHistory(
        now=NOW,
        nodes=(
            ObservedNode("a", created=T0 - 10, flavour_label="m1.large", groups=BATCH),
            ObservedNode("s", created=T0 - 10, flavour_label="m1.medium", groups=SERVICE),
        ),
        pods=(_pod("ns/j", T0 + 10, started=T0 + 11, finished=T0 + 311, phase="Succeeded", node="a"),),
    )
    r = replay_from_history(h, FLAVOURS, DEFAULT_CLASSES, 3600.0)
    res = simulate(r.workload, "product")
    run = run_json(res)
    assert res.end == 3600 and run["requests_completed"] == 1
    # both idle nodes go (300 s idle) instead of staying billed to the end (bill_to_horizon off: 70 % of actual)
    assert run["nodes_removed"] == 2
    assert run["cost_usd"] < 0.25 * r.actual["cost_usd"]
    vs = compare(r.actual, run)
    assert vs["saving"] == pytest.approx(1 - run["cost_usd"] / r.actual["cost_usd"])
    assert vs["classes"]["bronze"]["at_least_observed"] is True
    text = format_comparison(r.actual, vs, r.assumptions)
    assert "under product you would have paid" in text and "% less" in text and "ASSUMPTIONS" in text


def test_compare_says_no_when_the_replay_misses_more() -> None:
    actual = {"cost_usd": 1.0, "classes": {"silver": {"slo_fulfillment": 1.0}, "gold": {"slo_fulfillment": 0.5}}}
    run = {"cost_usd": 1.2, "classes": {"silver": {"slo_fulfillment": 0.9}}}
    vs = compare(actual, run)
    assert vs["saving"] == pytest.approx(-0.2)
    assert vs["classes"]["silver"] == {"observed": 1.0, "replayed": 0.9, "at_least_observed": False}
    assert vs["classes"]["gold"]["replayed"] is None and not vs["classes"]["gold"]["at_least_observed"]
    assert compare({"cost_usd": 0.0, "classes": {}}, run)["saving"] is None


# ------------------------------------------------------------------------------------ the shell's parsing


def _k8s_node(name: str, labels: dict[str, str], cap: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels, "creationTimestamp": "2027-01-15T08:00:00Z", **meta},
        "status": {"capacity": cap or {"cpu": "4", "memory": "16Gi", "pods": "110"}},
    }


def test_nodes_from_k8s() -> None:
    groups = NodeGroupsConfig()
    nodes, control = nodes_from_k8s(
        [
            _k8s_node("n1", {"node.kubernetes.io/instance-type": "m1.large",
                             "qos.kube-qos-extender.io/node-group": "batch"}),
            _k8s_node("cp", {"node-role.kubernetes.io/control-plane": ""}),
            _k8s_node("n2", {}, {"cpu": "bogus"}, annotations={"qos.kube-qos-extender.io/price-per-hour": "0.3"}),
            {"metadata": {}},  # no name: ignored
        ],
        groups,
    )  # fmt: skip
    assert control == 1
    by = {n.name: n for n in nodes}
    assert set(by) == {"n1", "n2"}
    assert by["n1"].flavour_label == "m1.large" and by["n1"].groups == BATCH
    assert (by["n1"].cpu_milli, by["n1"].memory_bytes) == (4000, 16 * GIB)
    assert by["n1"].created == pytest.approx(1_800_000_000 + 0 * 1.0, abs=2e7)  # parsed, a unix time
    assert (by["n2"].cpu_milli, by["n2"].memory_bytes) == (None, None)  # unreadable capacity: unknown
    assert by["n2"].price_annotation == "0.3" and by["n2"].groups == frozenset((NodeGroup.BATCH, NodeGroup.SERVICE))


def _k8s_pod(name: str, ns: str = "app", ann: dict[str, str] | None = None, **kw: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {"name": name, "namespace": ns, "annotations": ann or {},
                     "creationTimestamp": "2027-01-15T08:00:00Z"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}}}]},
        "status": {"phase": "Pending"},
    }  # fmt: skip
    for k, v in kw.items():
        pod[k].update(v)
    return pod


def test_pods_from_k8s() -> None:
    done = _k8s_pod(
        "done",
        ann={"qos.kube-qos-extender.io/class": "silver", "qos.kube-qos-extender.io/kind": "batch"},
        spec={"nodeName": "n1"},
        status={
            "phase": "Succeeded",
            "startTime": "2027-01-15T08:00:05Z",
            "containerStatuses": [
                {"state": {"terminated": {"finishedAt": "2027-01-15T08:01:05Z"}}},
                {"state": {"terminated": {"finishedAt": "2027-01-15T08:02:05Z"}}},
            ],
        },
    )
    bad = _k8s_pod("bad", ann={"qos.kube-qos-extender.io/class": "platinum", "qos.kube-qos-extender.io/kind": "x"})
    ds = _k8s_pod("ds", metadata={"ownerReferences": [{"kind": "DaemonSet", "name": "d", "controller": True}]})
    sysp = _k8s_pod("coredns", ns="kube-system")
    broken = _k8s_pod("broken", spec={"containers": [{"name": "c", "resources": {"requests": {"cpu": "lots"}}}]})
    elsewhere = _k8s_pod("elsewhere", spec={"nodeName": "other"})
    pods, excluded = pods_from_k8s(
        [done, bad, ds, sysp, broken, elsewhere], PodDefaults(), DEFAULT_CLASSES, nodes={"n1"}
    )
    by = {p.key: p for p in pods}
    assert set(by) == {"app/done", "app/bad"}
    d = by["app/done"]
    assert (d.class_name, d.kind, d.cpu_milli, d.node, d.phase) == (
        "silver",
        WorkloadKind.BATCH,
        250,
        "n1",
        "Succeeded",
    )
    assert d.finished is not None and d.started is not None and d.finished - d.started == 120  # the last container
    b = by["app/bad"]
    assert b.class_name == "bronze" and b.kind is WorkloadKind.SERVICE and len(b.problems) == 2
    assert b.started is None and b.finished is None
    reasons = "\n".join(f"{k}: {v}" for k, v in excluded.items())
    assert "DaemonSet" in reasons and "kube-system" in reasons and "outside --node-selector" in reasons
    assert "unreadable spec" in reasons
    # --namespace kube-system takes them
    pods, _ = pods_from_k8s([sysp, done], PodDefaults(), DEFAULT_CLASSES, ("kube-system",))
    assert [p.key for p in pods] == ["kube-system/coredns"]


def _vec(*rows: tuple[dict[str, str], float]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": m, "value": [NOW, str(v)]} for m, v in rows]},
    }


def test_from_prometheus_recovers_deleted_objects() -> None:
    empty = _vec()
    docs = {name: empty for name in PromQueries(3600, 15).all()}
    docs.update(
        node_created=_vec(({"node": "gone"}, T0 + 60), ({"node": "alive"}, T0 - 50)),
        node_last_seen=_vec(({"node": "gone"}, T0 + 1200), ({"node": "alive"}, NOW)),
        node_capacity=_vec(({"node": "gone", "resource": "cpu"}, 2), ({"node": "gone", "resource": "memory"}, 8 * GIB)),
        node_labels=_vec(({"node": "gone", "label_node_kubernetes_io_instance_type": "m1.medium",
                           "label_qos_kube_qos_extender_io_node_group": "batch"}, 1)),
        pod_created=_vec(({"namespace": "app", "pod": "p1"}, T0 + 100), ({"namespace": "kube-system", "pod": "x"}, 1)),
        pod_last_seen=_vec(({"namespace": "app", "pod": "p1"}, T0 + 900)),
        pod_start=_vec(({"namespace": "app", "pod": "p1"}, T0 + 110)),
        pod_requests=_vec(({"namespace": "app", "pod": "p1", "resource": "cpu"}, 0.5),
                          ({"namespace": "app", "pod": "p1", "resource": "memory"}, GIB)),
        pod_annotations=_vec(({"namespace": "app", "pod": "p1",
                               "annotation_qos_kube_qos_extender_io_class": "silver"}, 1)),
        own_cost=_vec(({}, 0.42)),
    )  # fmt: skip
    nodes, pods, notes, own = from_prometheus(
        docs,
        known_nodes={"alive"},
        known_pods=set(),
        now=NOW,
        step=15,
        groups=NodeGroupsConfig(),
        defaults=PodDefaults(),
        classes=DEFAULT_CLASSES,
    )
    assert own == 0.42
    (n,) = nodes
    assert (n.name, n.created, n.deleted, n.cpu_milli, n.memory_bytes, n.flavour_label, n.groups) == (
        "gone", T0 + 60, T0 + 1200, 2000, 8 * GIB, "m1.medium", BATCH)  # fmt: skip
    (p,) = pods  # kube-system left out
    assert (p.key, p.created, p.started, p.finished, p.cpu_milli, p.class_name) == (
        "app/p1", T0 + 100, T0 + 110, T0 + 900, 500, "silver")  # fmt: skip
    assert any("recovered from kube-state-metrics" in x for x in notes)
    # no kube-state-metrics at all: said so, nothing made up
    nodes, pods, notes, own = from_prometheus(
        {name: empty for name in PromQueries(3600, 15).all()},
        known_nodes=set(),
        known_pods=set(),
        now=NOW,
        step=15,
        groups=NodeGroupsConfig(),
        defaults=PodDefaults(),
        classes=DEFAULT_CLASSES,
    )
    assert (nodes, pods, own) == ([], [], None)
    assert any("kube_node_created" in x for x in notes) and any("kube_pod_created" in x for x in notes)
    with pytest.raises(InvalidInputError, match="Prometheus answered"):
        from_prometheus(
            {**docs, "node_created": {"status": "error", "error": "bad query"}},
            known_nodes=set(),
            known_pods=set(),
            now=NOW,
            step=15,
            groups=NodeGroupsConfig(),
            defaults=PodDefaults(),
            classes=DEFAULT_CLASSES,
        )


# ------------------------------------------------------------------------------------------------ the CLI


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kcfg = tmp_path / "kubeconfig"
    kcfg.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    cases = [
        (["--from-cluster", "--kubeconfig", str(kcfg)], "cannot reach the API server at https://127.0.0.1:1"),
        (["--from-cluster", "--kubeconfig", str(tmp_path / "none")], "no such file"),
        (["--from-cluster", "--since", "soon"], "--since"),
        (["--from-cluster", "--policy", "qos-driven"], "autoscaled policies only"),
        (["--from-cluster", "--workload", "htas-stable"], "no --workload"),
        (["--workload", "htas-stable", "--since", "1h"], "for --from-cluster only"),
        ([], "--workload NAME_OR_PATH or --from-cluster"),
    ]
    for argv, said in cases:
        assert cli.main(["simulate", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
