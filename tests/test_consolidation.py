"""The consolidation flow's decisions (extender/consolidation/policy.py) and config, without a cluster."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from extender.agent.backends.simulated import PROGRESS_ANNOTATION, STOPPED_ANNOTATION
from extender.agent.protocol import check_migration_id
from extender.autoscaler.handoff import Consolidation
from extender.consolidation import policy
from extender.consolidation.policy import MoveVerdict
from extender.consolidation.settings import ConsolidationSettings, load_consolidation_config, parse_consolidation_config
from extender.core import reschedule
from extender.core.model import Node, NodeGroup, Pod, Resources, WorkloadKind
from extender.core.reschedule import MigrationPlan
from extender.kube.convert import node_from_k8s, pod_from_k8s
from extender.settings import SettingsError
from extender.settings.extender import ExtenderConfig
from tests.test_autoscaler_loop import LARGE, SMALL, loop, node, pod, snap

GI = 2**30
CONFIG = ExtenderConfig()


def batch(name: str, cpu: int = 1000, *, node_name: str = "a", migratable: bool = True) -> Pod:
    return Pod(name, Resources(cpu, GI, 1), kind=WorkloadKind.BATCH, runtime_seconds=600.0, node_name=node_name,
               migratable=migratable, started_at=0.0)  # fmt: skip


def bnode(name: str, *pods: Pod, cpu: int = 4000, group: NodeGroup = NodeGroup.BATCH, cordoned: bool = False) -> Node:
    return Node(name, Resources(cpu, 8 * GI, 110), group=group, pods=pods, unschedulable=cordoned)


def kpod(
    name: str, *, phase: str = "Running", annotations: dict[str, str] | None = None, **meta: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": annotations or {}, **meta},
        "spec": {"nodeName": "a", "containers": [{"name": "c"}]},
        "status": {"phase": phase},
    }


# ------------------------------------------------------------------------------------------ when, which


def test_batch_queue_quiet_clock_starts_at_first_look_and_restarts_on_a_pending_pod() -> None:
    assert policy.batch_queue_quiet(False, None, 100.0, 300.0) == (False, 100.0)
    assert policy.batch_queue_quiet(False, 100.0, 399.0, 300.0) == (False, 100.0)
    assert policy.batch_queue_quiet(False, 100.0, 400.0, 300.0) == (True, 100.0)
    assert policy.batch_queue_quiet(True, 100.0, 500.0, 300.0) == (False, 500.0)
    assert policy.batch_queue_quiet(False, None, 7.0, 0.0) == (True, 7.0)


def test_select_plan_takes_the_first_worst_utilised_plan_not_busy_not_left_alone_and_owned() -> None:
    p1, p2, p3 = (MigrationPlan(n, ((f"ns/{n}-0", "z"),)) for n in ("a", "b", "c"))
    c = Consolidation(10.0, ("a", "b", "c"), (p1, p2, p3))
    assert policy.select_plan(c, now=10.0) is p1
    assert policy.select_plan(c, busy=frozenset({"a"}), now=10.0) is p2
    assert policy.select_plan(c, left_alone={"a": 20.0, "b": 5.0}, now=10.0) is p2  # b's back-off ended
    assert policy.select_plan(c, left_alone={"a": 20.0}, owned=frozenset({"c"}), now=10.0) is p3
    assert policy.select_plan(Consolidation(10.0, ("b",), (p1,)), now=10.0) is None  # not a candidate now
    assert policy.select_plan(Consolidation(10.0, (), ()), now=10.0) is None


def test_handoff_of_the_autoscaler_feeds_select_plan_and_a_pinned_pod_keeps_its_node() -> None:
    """The autoscaler's hand-off on a real Snapshot: two under-used batch nodes, one holding a pod annotated
    migratable=false -> only the other one has a plan; the pinned node is never selected."""
    free = pod("j1", "500m", "512Mi", kind="batch", runtime=600, node="b1")
    pinned = pod("j2", "500m", "512Mi", kind="batch", runtime=600, node="b2")
    pinned["metadata"]["annotations"]["qos.kube-qos-extender.io/migratable"] = "false"
    filler = pod("j3", "2", "4Gi", kind="batch", runtime=600, node="b3")
    s = snap([node(n, LARGE, "batch") for n in ("b1", "b2", "b3")], [free, pinned, filler])
    lp = loop(underutil_sustain_seconds=10.0, batch_queue_quiet_seconds=10.0)
    lp.step(s, 0.0)
    d = lp.step(s, 20.0)
    assert d.consolidation is not None
    assert set(d.consolidation.candidates) >= {"b1", "b2"}
    plan = policy.select_plan(d.consolidation, now=20.0)
    assert plan is not None and plan.source == "b1" and [k for k, _ in plan.moves] == ["default/j1"]
    assert all(p.source != "b2" for p in d.consolidation.plans)
    # the plan still holds on the same view; it does not once someone binds a pod to b1 meanwhile
    assert policy.check_plan(plan, s.node_views()) is None
    s.apply_pod("ADDED", pod("late", "100m", "64Mi", kind="batch", runtime=60, node="b1"))
    assert "default/late" in (policy.check_plan(plan, s.node_views()) or "")
    assert SMALL.name  # catalogue in use


def test_may_cordon_only_nodes_nobody_else_cordoned() -> None:
    n: dict[str, Any] = {"metadata": {"name": "a", "annotations": {}}, "spec": {}}
    assert policy.may_cordon(n) is None
    n["spec"]["unschedulable"] = True
    assert "someone else" in (policy.may_cordon(n) or "")
    n["metadata"]["annotations"][policy.CONSOLIDATION_ANNOTATION] = "a-123"  # ours, from a previous attempt
    assert policy.may_cordon(n) is None
    n["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    assert "deleted" in (policy.may_cordon(n) or "")


def test_one_remover_per_node_with_cluster_autoscaler() -> None:
    """We honour cluster-autoscaler's annotations and taints (a node kept by its owner, or being scaled down by CA,
    is never consolidated), and CA honours ours: while we empty a node it carries scale-down-disabled, removed with
    the cordon; an emptied node handed to CA only loses scale-down-disabled (still cordoned under our plan)."""
    n: dict[str, Any] = {"metadata": {"name": "a", "annotations": {}}, "spec": {}}
    n["metadata"]["annotations"][policy.SCALE_DOWN_DISABLED_ANNOTATION] = "true"
    assert "owner wants it kept" in (policy.may_cordon(n) or "")
    n["metadata"]["annotations"][policy.SCALE_DOWN_DISABLED_ANNOTATION] = "false"
    assert policy.may_cordon(n) is None
    for key in ("ToBeDeletedByClusterAutoscaler", "DeletionCandidateOfClusterAutoscaler"):
        n["spec"]["taints"] = [{"key": key, "value": "1700000000", "effect": "NoSchedule"}]
        assert key in (policy.may_cordon(n) or "")
    n["spec"]["taints"] = [{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}]
    assert policy.may_cordon(n) is None
    # ours (a previous attempt of ours set it): not a refusal
    n["metadata"]["annotations"] = {
        policy.CONSOLIDATION_ANNOTATION: "a-1",
        policy.SCALE_DOWN_DISABLED_ANNOTATION: "true",
    }
    n["spec"]["unschedulable"] = True
    assert policy.may_cordon(n) is None
    start, end = policy.cordon_patch("a-2"), policy.cordon_patch(None)
    assert start["metadata"]["annotations"] == {
        policy.CONSOLIDATION_ANNOTATION: "a-2",
        policy.SCALE_DOWN_DISABLED_ANNOTATION: "true",
    } and start["spec"] == {"unschedulable": True}
    assert (
        end["metadata"]["annotations"] == dict.fromkeys(start["metadata"]["annotations"])
        and not end["spec"]["unschedulable"]
    )
    assert policy.handed_to_cluster_autoscaler_patch() == {
        "metadata": {"annotations": {policy.SCALE_DOWN_DISABLED_ANNOTATION: None}}
    }


@pytest.mark.parametrize(
    ("p", "expect"),
    [
        (kpod("ok"), None),
        (kpod("pinned", annotations={"qos.kube-qos-extender.io/migratable": "False"}), "migratable=false"),
        (kpod("rs", ownerReferences=[{"kind": "ReplicaSet", "name": "web-1", "controller": True}]), "ReplicaSet"),
        (kpod("pending", phase="Pending"), "not Running"),
        (kpod("gone", deletionTimestamp="2025-01-01T00:00:00Z"), "being deleted"),
        (kpod("ca", annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}),
         "cluster-autoscaler.kubernetes.io/safe-to-evict=false"),
        (kpod("ca-ok", annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}), None),
        (kpod("kp", annotations={"karpenter.sh/do-not-disrupt": "True"}), "karpenter.sh/do-not-disrupt=true"),
        (kpod("kp-ok", annotations={"karpenter.sh/do-not-disrupt": "false"}), None),
    ],
)  # fmt: skip
def test_pod_blocker(p: dict[str, Any], expect: str | None) -> None:
    got = policy.pod_blocker(p)
    assert (got is None) if expect is None else (expect in (got or "")), got


def test_node_blocker_names_the_first_pod_that_keeps_the_node_and_skips_daemonset_and_finished_pods() -> None:
    ds = {"kind": "DaemonSet", "name": "qos-agent", "controller": True}
    pinned = {"karpenter.sh/do-not-disrupt": "true"}
    assert (
        policy.node_blocker([kpod("a"), kpod("agent", ownerReferences=[ds]), kpod("done", phase="Succeeded")]) is None
    )
    assert policy.node_blocker([]) is None
    why = policy.node_blocker(
        [
            kpod("b"),
            kpod("z", annotations=pinned),
            kpod("y", annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}),
        ]
    )
    assert (
        why
        == "pod ns/y is annotated cluster-autoscaler.kubernetes.io/safe-to-evict=false: its node is not consolidated"
    )
    # a finished pod's annotation does not keep the node (it holds nothing to move)
    assert policy.node_blocker([kpod("old", phase="Failed", annotations=pinned)]) is None
    # check_plan after the cordon says the same (the annotation may appear between the look and the cordon)
    plan = MigrationPlan("a", (("ns/z", "b"),))
    nodes = [bnode("a", batch("ns/z")), bnode("b")]
    assert "karpenter.sh/do-not-disrupt=true" in (policy.check_plan(plan, nodes, [kpod("z", annotations=pinned)]) or "")


def test_daemonset_pods_go_with_their_node_neither_moved_nor_keeping_it() -> None:
    """Every real node runs the agent DaemonSet: its pod (a service pod by the defaults) must not stop the plan."""
    agent = Pod("qos-agent-x", Resources(50, GI // 8, 1), kind=WorkloadKind.SERVICE, node_name="a",
                request_id="kube-qos-agent/DaemonSet/qos-agent")  # fmt: skip
    other = Pod("web", Resources(50, GI // 8, 1), kind=WorkloadKind.SERVICE, node_name="a",
                request_id="ns/ReplicaSet/web-1")  # fmt: skip
    job = batch("job")
    plans = reschedule.consolidation_plans([bnode("a", agent, job), bnode("b")], ["a"], 0.0, 300.0)
    assert plans == [MigrationPlan("a", (("default/job", "b"),))]
    assert policy.check_plan(plans[0], [bnode("a", agent, job), bnode("b")]) is None
    assert reschedule.consolidation_plans([bnode("a", other, job), bnode("b")], ["a"], 0.0, 300.0) == []


def test_check_plan_holds_or_names_what_changed() -> None:
    j1, j2 = batch("j1"), batch("j2")
    src = bnode("a", j1, j2, cordoned=True)  # cordoned by us: still a valid source
    x = bnode("x", batch("f", 2000, node_name="x"))
    y = bnode("y")
    plan = MigrationPlan("a", (("default/j1", "x"), ("default/j2", "x")))
    assert policy.check_plan(plan, [src, x, y]) is None
    # cumulative: x has room for both only together with nothing else
    fuller = bnode("x", batch("f", 2500, node_name="x"))
    assert "no longer fits on x" in (policy.check_plan(plan, [src, fuller]) or "")
    assert "gone" in (policy.check_plan(plan, [x, y]) or "")
    assert "destination x is gone" in (policy.check_plan(plan, [src, y]) or "")
    assert "cordoned" in (policy.check_plan(plan, [src, bnode("x", cordoned=True)]) or "")
    assert "group" in (policy.check_plan(plan, [src, bnode("x", group=NodeGroup.SERVICE)]) or "")
    svc = Pod("s", Resources(100, GI, 1), node_name="a")
    assert "not in the plan" in (policy.check_plan(plan, [bnode("a", j1, j2, svc), x]) or "")
    assert "no longer on a" in (policy.check_plan(plan, [bnode("a", j1), x]) or "")
    stuck = batch("j2", migratable=False)
    assert "not migratable" in (policy.check_plan(plan, [bnode("a", j1, stuck), x]) or "")
    live = [kpod("j1"), kpod("j2")]
    for p in live:
        p["metadata"]["namespace"] = "default"
    assert policy.check_plan(plan, [src, x], live) is None
    assert "ns2/z" in (
        policy.check_plan(plan, [src, x], [*live, {"metadata": {"name": "z", "namespace": "ns2"}}]) or ""
    )
    live[1]["metadata"]["annotations"] = {"qos.kube-qos-extender.io/migratable": "false"}
    assert "migratable=false" in (policy.check_plan(plan, [src, x], live) or "")


# ------------------------------------------------------------------------------------------ one move


def test_ids_and_names_are_valid_and_do_not_chain_suffixes() -> None:
    pid = policy.plan_id("qos-as-batch-e2e.large-0a1b2c", "abc123")
    assert pid.endswith("-abc123") and len(pid) <= 50
    for i in (1, 12, 999):
        check_migration_id(policy.migration_id(pid, i))
    check_migration_id(policy.migration_id("x" * 200, 3))
    first = policy.destination_name("job-7", "aaaaaa")
    assert first == "job-7-mv-aaaaaa"
    assert policy.destination_name(first, "bbbbbb") == "job-7-mv-bbbbbb"
    long = policy.destination_name("j" * 253, "cccccc")
    assert len(long) == 253 and long.endswith("-mv-cccccc")


def test_destination_manifest_copies_the_spec_unbound_without_admission_fields_or_progress() -> None:
    src: dict[str, Any] = {
        "metadata": {
            "name": "job",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "9",
            "labels": {"app": "x"},
            "annotations": {PROGRESS_ANNOTATION: "12.5", STOPPED_ANNOTATION: "true", "keep": "me"},
        },
        "spec": {
            "nodeName": "a",
            "schedulerName": "qos-scheduler",
            "schedulingGates": [{"name": "g"}],
            "priorityClassName": "batch-low",
            "priority": 100,
            "preemptionPolicy": "PreemptLowerPriority",
            "volumes": [{"name": "kube-api-access-abcde", "projected": {}}, {"name": "data", "emptyDir": {}}],
            "containers": [
                {"name": "c", "volumeMounts": [{"name": "kube-api-access-abcde", "mountPath": "/var/run"}]},
                {"name": "d", "volumeMounts": [{"name": "data", "mountPath": "/d"}]},
            ],
        },
        "status": {"phase": "Running"},
    }
    before = copy.deepcopy(src)
    m = policy.destination_manifest(src, "job-mv-1", scheduler_name="qos-consolidation", migration="m-1")
    assert src == before, "the source object is not modified"
    assert m["metadata"] == {
        "name": "job-mv-1",
        "namespace": "ns",
        "labels": {"app": "x"},
        "annotations": {"keep": "me", policy.MIGRATED_FROM_ANNOTATION: "ns/job", policy.MIGRATION_ID_ANNOTATION: "m-1"},
    }
    spec = m["spec"]
    assert "nodeName" not in spec and "schedulingGates" not in spec and "priority" not in spec
    assert spec["schedulerName"] == "qos-consolidation" and spec["priorityClassName"] == "batch-low"
    assert spec["volumes"] == [{"name": "data", "emptyDir": {}}]
    assert "volumeMounts" not in spec["containers"][0] and spec["containers"][1]["volumeMounts"][0]["name"] == "data"
    assert "status" not in m
    # the converted destination pod requests what the source requested (same spec)
    k = {**src, "spec": {**src["spec"], "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}
    mk = policy.destination_manifest(k, "job-mv-2", scheduler_name="s", migration="m-2")
    a, _ = pod_from_k8s(k, CONFIG.pod_defaults, CONFIG.policy.classes, CONFIG.scheduling.managed_resources)
    b, _ = pod_from_k8s(mk, CONFIG.pod_defaults, CONFIG.policy.classes, CONFIG.scheduling.managed_resources)
    assert a.requests == b.requests and a.kind is b.kind


def test_destination_manifest_drops_the_controllers_pin_to_the_source_node_only() -> None:
    """A pod the QoS controller released is pinned to its node (required affinity, matchFields metadata.name In
    [node]); kept in the destination pod, the destination's kubelet rejected it (NodeAffinity: the pod Failed) and
    every move of such a pod rolled back (found by ``make demo`` on kind, issue 31). The user's own terms stay."""
    pin = {"key": "metadata.name", "operator": "In", "values": ["a"]}
    zone = {"key": "zone", "operator": "In", "values": ["z1"]}

    def moved(terms: list[dict[str, Any]]) -> dict[str, Any]:
        src = {
            "metadata": {"name": "job", "namespace": "ns"},
            "spec": {
                "nodeName": "a",
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": terms}}},
                "containers": [{"name": "c"}],
            },
        }  # fmt: skip
        before = copy.deepcopy(src)
        spec: dict[str, Any] = policy.destination_manifest(src, "job-mv", scheduler_name="s", migration="m")["spec"]
        assert src == before
        return spec

    assert "affinity" not in moved([{"matchFields": [pin]}])  # ours alone: the affinity goes
    spec = moved([{"matchExpressions": [zone], "matchFields": [pin]}])
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchExpressions": [zone]}]
    }
    other = {"key": "metadata.name", "operator": "In", "values": ["b"]}  # a user's own pin to another node stays
    spec = moved([{"matchFields": [other]}])
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchFields": [other]}]
    }


def test_agent_url_from_annotation_else_internal_ip() -> None:
    n: dict[str, Any] = {"metadata": {"annotations": {policy.AGENT_URL_ANNOTATION: "https://127.0.0.5:9443/"}}}
    assert policy.agent_url(n, port=1) == "https://127.0.0.5:9443"
    ip = {"metadata": {}, "status": {"addresses": [{"type": "Hostname", "address": "h"},
                                                   {"type": "InternalIP", "address": "10.0.0.7"}]}}  # fmt: skip
    assert policy.agent_url(ip, port=9443) == "https://10.0.0.7:9443"
    v6 = {"status": {"addresses": [{"type": "InternalIP", "address": "fd00::7"}]}}
    assert policy.agent_url(v6, port=9443, scheme="http") == "http://[fd00::7]:9443"
    assert policy.agent_url({"metadata": {}}, port=9443) is None


@pytest.mark.parametrize(
    ("outcome", "verdict"),
    [
        ("succeeded", MoveVerdict.COMMIT),
        ("rolled_back", MoveVerdict.ROLL_BACK),
        ("refused", MoveVerdict.ROLL_BACK),
        ("in_doubt", MoveVerdict.KEEP_BOTH),
        ("failed", MoveVerdict.KEEP_BOTH),
        (None, MoveVerdict.KEEP_BOTH),
        ("something-new", MoveVerdict.KEEP_BOTH),
    ],
)
def test_after_outcome(outcome: str | None, verdict: MoveVerdict) -> None:
    assert policy.after_outcome(outcome) is verdict


def test_confirm_destination() -> None:
    rec: dict[str, Any] = {"outcome": "succeeded", "work_seconds": 42.5, "meta": {"simulated": True}}
    good: dict[str, Any] = {"metadata": {"annotations": {PROGRESS_ANNOTATION: "42.5"}}, "spec": {"nodeName": "x"}}
    assert policy.confirm_destination(good, "x", rec) is None
    assert "gone" in (policy.confirm_destination(None, "x", rec) or "")
    assert policy.confirm_destination(good, "y", rec) == "the destination pod is on 'x', not 'y'"
    wrong = copy.deepcopy(good)
    wrong["metadata"]["annotations"][PROGRESS_ANNOTATION] = "1.0"
    assert "checkpoint had 42.5" in (policy.confirm_destination(wrong, "x", rec) or "")
    stopped = copy.deepcopy(good)
    stopped["metadata"]["annotations"][STOPPED_ANNOTATION] = "true"
    assert "stopped" in (policy.confirm_destination(stopped, "x", rec) or "")
    missing = {"metadata": {}, "spec": {"nodeName": "x"}}
    assert "checkpoint had" in (policy.confirm_destination(missing, "x", rec) or "")
    assert policy.confirm_destination(missing, "x", {"meta": {"identity": "ns/p"}}) is None  # not simulated


def test_removable_ignores_daemonset_and_finished_pods() -> None:
    ds = kpod("ds", ownerReferences=[{"kind": "DaemonSet", "name": "agent", "controller": True}])
    done = kpod("done", phase="Succeeded")
    assert policy.removable([ds, done]) is None
    assert "ns/left" in (policy.removable([ds, kpod("left")]) or "")


def test_node_from_k8s_sees_our_cordon() -> None:
    n = node("b1", LARGE, "batch")
    n["spec"] = {"unschedulable": True}
    assert node_from_k8s(n, CONFIG.node_groups).unschedulable


# ------------------------------------------------------------------------------------------ config


def test_config_defaults_off_and_strict(tmp_path: Path) -> None:
    assert parse_consolidation_config({}) == ConsolidationSettings()
    with pytest.raises(SettingsError, match=r"consolidation\.agent: cert_file"):
        parse_consolidation_config({"consolidation": {"enabled": True}})
    with pytest.raises(SettingsError, match=r"consolidation\.bogus"):
        parse_consolidation_config({"consolidation": {"bogus": 1}})
    for name in ("c.crt", "c.key", "ca.crt"):
        (tmp_path / name).write_text("x")
    f = tmp_path / "c.yaml"
    f.write_text(
        "consolidation:\n  enabled: true\n  agent: {cert_file: c.crt, key_file: c.key, ca_file: ca.crt, port: 9555}\n"
        "  left_alone_seconds: 10\n  batch_queue_quiet_seconds: 0\n"
    )
    s = load_consolidation_config(f)
    assert s.enabled and s.agent_port == 9555 and s.cert_file == str(tmp_path / "c.crt")
    assert s.left_alone_seconds == 10.0 and s.batch_queue_quiet_seconds == 0.0
    default = Path(__file__).resolve().parents[1] / "docs" / "settings" / "consolidation.yaml"
    assert load_consolidation_config(default) == ConsolidationSettings()  # the generated reference: the defaults


def test_cli_consolidation_config_errors_exit_2_and_the_default_file_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from extender.cli import build_parser
    from extender.processes.autoscaler import run_autoscaler_command

    bad = tmp_path / "c.yaml"
    bad.write_text("consolidation: {enabled: true}\n")
    args = build_parser().parse_args(["autoscaler", "--consolidation-config", str(bad), "--check-config"])
    assert run_autoscaler_command(args) == 2
    assert "consolidation.agent: cert_file" in capsys.readouterr().err
    default = Path(__file__).resolve().parents[1] / "docs" / "settings" / "consolidation.yaml"
    args = build_parser().parse_args(["autoscaler", "--consolidation-config", str(default), "--check-config"])
    assert run_autoscaler_command(args) == 0


def test_decide_is_pure() -> None:
    """Decisions import no I/O framework and read no clock (the shell passes ``now``)."""
    import ast

    path = Path(__file__).resolve().parents[1] / "extender" / "consolidation" / "policy.py"
    imported: set[str] = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import):
            imported.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom) and n.module:
            imported.add(n.module)
    banned = {"asyncio", "aiohttp", "kubernetes_asyncio", "time", "socket", "subprocess", "prometheus_client"}
    assert not imported & banned, imported & banned
    assert not [m for m in imported if m.startswith(("extender.kube", "extender.agent"))]


async def test_an_api_error_before_the_cordon_backs_off_from_the_node_with_an_event() -> None:
    """A failing API read (the node, its pods) must leave the node alone for ``left_alone_seconds`` like an
    aborted plan: without it every scan would pick the same node and hammer the failing API again."""
    import socket

    from kubernetes_asyncio import client as k8s_client

    from extender.consolidation.flow import ConsolidationFlow

    with socket.socket() as s:  # a port nobody listens on: a real connection refused, not a double
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = k8s_client.Configuration()
    cfg.host = f"http://127.0.0.1:{port}"
    notices: list[Any] = []

    class _Events:
        def emit(self, notice: Any) -> None:
            notices.append(notice)

    flow = ConsolidationFlow(ConsolidationSettings(left_alone_seconds=60.0), clock=lambda: 1000.0)
    async with k8s_client.ApiClient(cfg) as api:
        flow.attach(api, ExtenderConfig().bind, events=_Events())
        try:
            outcome = await flow.consolidate(MigrationPlan("n1", (("default/p", "n2"),)))
        finally:
            await flow.stop()
    assert not outcome.removed and "Connect" in outcome.reason, outcome.reason
    assert flow.left_alone == {"n1": 1060.0}
    assert [n.reason for n in notices] == ["ConsolidationAborted"] and notices[0].warning
    assert flow.busy == set()
