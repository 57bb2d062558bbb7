"""extender.core.taints: kube-scheduler's TaintToleration rules, and the two shells that now read them (the QoS
controller's eligible hosts, the autoscaler's capacity). Found by ``make demo`` on kind (issue 31): kind's control
plane carries ``node-role.kubernetes.io/control-plane:NoSchedule`` and no node-group label, so the controller
pinned batch pods to it (time-bin BFD prefers the fullest node) where kube-scheduler could never bind them, and
the autoscaler counted its room as batch capacity."""

from __future__ import annotations

import random
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes_asyncio import client as k8s
from prometheus_client import CollectorRegistry

from extender.autoscaler.view import GATED_DEMAND_SECONDS, AutoscalerSnapshot
from extender.controller.accounting import ACCOUNT_ANNOTATION
from extender.controller.decide import decide
from extender.controller.loop import QosController
from extender.controller.metrics import ControllerMetrics
from extender.controller.state import TrackingSnapshot
from extender.core.taints import Taint, Toleration, blocking, tolerates, withholds
from extender.kube.convert import taints_of, tolerations_of
from extender.settings.extender import ExtenderConfig
from tests.test_autoscaler_loop import SMALL, loop
from tests.test_autoscaler_loop import node as as_node
from tests.test_autoscaler_loop import pod as as_pod

CONFIG = ExtenderConfig()
GROUP = "qos.kube-qos-extender.io/node-group"
CONTROL_PLANE = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
DEFAULT_TOLERATIONS = [  # what the DefaultTolerationSeconds admission plugin adds to every pod
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
]


# ------------------------------------------------------------------------------------------------ core


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        (Toleration("k", "Equal", "v", "NoSchedule"), Taint("k", "v", "NoSchedule"), True),
        (Toleration("k", "", "v", "NoSchedule"), Taint("k", "v", "NoSchedule"), True),  # no operator = Equal
        (Toleration("k", "Equal", "w", "NoSchedule"), Taint("k", "v", "NoSchedule"), False),
        (Toleration("k", "Exists", "", "NoSchedule"), Taint("k", "anything", "NoSchedule"), True),
        (Toleration("k", "Exists", "", ""), Taint("k", "", "NoExecute"), True),  # empty effect: every effect
        (Toleration("k", "Exists", "", "NoExecute"), Taint("k", "", "NoSchedule"), False),
        (Toleration("", "Exists", "", ""), Taint("any", "x", "NoSchedule"), True),  # tolerates everything
        (Toleration("other", "Exists", "", ""), Taint("k", "", "NoSchedule"), False),
        (Toleration("k", "Lt", "10", "NoSchedule"), Taint("k", "5", "NoSchedule"), True),
        (Toleration("k", "Lt", "10", "NoSchedule"), Taint("k", "10", "NoSchedule"), False),
        (Toleration("k", "Gt", "10", "NoSchedule"), Taint("k", "11", "NoSchedule"), True),
        (Toleration("k", "Gt", "10", "NoSchedule"), Taint("k", "", "NoSchedule"), False),  # not an integer
        (Toleration("k", "Between", "1", "NoSchedule"), Taint("k", "1", "NoSchedule"), False),
    ],
)
def test_tolerates_follows_upstream(toleration: Toleration, taint: Taint, expected: bool) -> None:
    assert tolerates(toleration, taint) is expected


def test_only_noschedule_and_noexecute_keep_a_pod_off() -> None:
    prefer = Taint("k", "", "PreferNoSchedule")
    hard = Taint("k", "", "NoSchedule")
    assert blocking([prefer], []) is None
    assert blocking([prefer, hard], []) == hard
    assert blocking([hard], [Toleration("k", "Exists")]) is None
    assert blocking([], []) is None


def test_withholds_ignores_the_node_lifecycle_taints() -> None:
    assert withholds([Taint("node-role.kubernetes.io/control-plane", "", "NoSchedule")])
    assert withholds([Taint("dedicated", "gpu", "NoExecute")])
    assert not withholds([Taint("node.kubernetes.io/not-ready", "", "NoSchedule")])
    assert not withholds([Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")])
    assert not withholds([Taint("soft", "", "PreferNoSchedule")])


EFFECTS = st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"])
TAINTS = st.lists(st.builds(Taint, st.sampled_from("ab"), st.sampled_from(["", "1"]), EFFECTS), max_size=4)
TOLERATIONS = st.lists(
    st.builds(
        Toleration,
        st.sampled_from(["", "a", "b"]),
        st.sampled_from(["", "Equal", "Exists"]),
        st.sampled_from(["", "1"]),
        st.sampled_from(["", "NoSchedule", "NoExecute"]),
    ),
    max_size=3,
)


@given(TAINTS, TOLERATIONS)
def test_blocking_is_a_hard_taint_no_toleration_matches(taints: list[Taint], tolerations: list[Toleration]) -> None:
    found = blocking(taints, tolerations)
    hard_untolerated = [
        t for t in taints if t.effect != "PreferNoSchedule" and not any(tolerates(x, t) for x in tolerations)
    ]
    assert found == (hard_untolerated[0] if hard_untolerated else None)


def test_convert_reads_taints_and_tolerations() -> None:
    node = {
        "metadata": {"name": "n"},
        "spec": {"taints": [CONTROL_PLANE, {"key": "x", "value": "1", "effect": "NoExecute"}]},
    }
    assert taints_of(node) == (
        Taint("node-role.kubernetes.io/control-plane", "", "NoSchedule"),
        Taint("x", "1", "NoExecute"),
    )
    assert taints_of({"metadata": {"name": "n"}, "spec": {}}) == ()
    pod = {"spec": {"tolerations": [*DEFAULT_TOLERATIONS, {"operator": "Exists"}]}}
    assert tolerations_of(pod) == (
        Toleration("node.kubernetes.io/not-ready", "Exists", "", "NoExecute"),
        Toleration("node.kubernetes.io/unreachable", "Exists", "", "NoExecute"),
        Toleration("", "Exists", "", ""),
    )
    assert tolerations_of({"spec": {"tolerations": "nonsense"}}) == ()


# ------------------------------------------------------------------------------------------ controller


def _node(name: str, group: str | None, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {GROUP: group} if group else {}},
        "spec": {"taints": taints} if taints else {},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}},
    }


def _gated(name: str, kind: str, tolerations: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                     "labels": {"qos.kube-qos-extender.io/kind": kind}},
        "spec": {
            "schedulerName": CONFIG.controller.scheduler_name,
            "schedulingGates": [{"name": CONFIG.controller.gate_name}],
            "tolerations": tolerations,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}],
        },
        "status": {"phase": "Pending"},
    }  # fmt: skip


@pytest.fixture
async def api() -> AsyncIterator[Any]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = k8s.ApiClient(configuration=k8s.Configuration(host=f"http://127.0.0.1:{port}"))
    yield client
    await client.close()


async def test_controller_never_pins_to_a_node_whose_taint_the_pod_does_not_tolerate(api: Any) -> None:
    """kind's topology: an unlabelled, tainted control plane (it accepts any kind by node_groups.unlabelled: any)
    and labelled workers. A pod with only the default tolerations may go to its group's workers only; one that
    tolerates the control plane may go there too; with no tainted node nothing changes (None = any node when
    groups are not enforced)."""
    snap = TrackingSnapshot(CONFIG, ACCOUNT_ANNOTATION)
    snap.replace_nodes(
        [_node("cp", None, [CONTROL_PLANE]), _node("b0", "batch"), _node("b1", "batch"), _node("s0", "service")],
        "1",
        now=0.0,
    )
    tolerant = [*DEFAULT_TOLERATIONS, {"key": CONTROL_PLANE["key"], "operator": "Exists", "effect": "NoSchedule"}]
    snap.replace_pods(
        [
            _gated("plain-batch", "batch", DEFAULT_TOLERATIONS),
            _gated("plain-batch-2", "batch", DEFAULT_TOLERATIONS),
            _gated("plain-service", "service", DEFAULT_TOLERATIONS),
            _gated("tolerant-batch", "batch", tolerant),
        ],
        "1",
        now=0.0,
    )
    ctl = QosController(api, snap, CONFIG, ControllerMetrics(CollectorRegistry()))
    world = ctl.world(10.0)
    eligible = {g.pod.name: g.eligible_nodes for g in world.gated}
    assert eligible["plain-batch"] == frozenset({"b0", "b1"})
    assert eligible["plain-batch-2"] is eligible["plain-batch"], "one set per (groups, tolerations) and pass"
    assert eligible["plain-service"] == frozenset({"s0"})
    assert eligible["tolerant-batch"] == frozenset({"cp", "b0", "b1"})
    # and the pass pins the plain pods to workers, never to the control plane
    pins = {r.pod: r.node for r in decide(world, ctl.policy, ctl.settings, random.Random(1)).releases}
    assert pins["default/plain-batch"] in {"b0", "b1"} and pins["default/plain-batch-2"] in {"b0", "b1"}
    assert pins["default/plain-service"] == "s0"


async def test_controller_without_groups_or_taints_leaves_every_node_eligible(api: Any) -> None:
    cfg = ExtenderConfig.model_validate({"node_groups": {"enforce": False}})
    snap = TrackingSnapshot(cfg, ACCOUNT_ANNOTATION)
    snap.replace_nodes([_node("a", None), _node("b", "batch")], "1", now=0.0)
    snap.replace_pods([_gated("p", "batch", DEFAULT_TOLERATIONS)], "1", now=0.0)
    ctl = QosController(api, snap, cfg, ControllerMetrics(CollectorRegistry()))
    assert [g.eligible_nodes for g in ctl.world(1.0).gated] == [None]
    snap.replace_nodes([_node("a", None, [CONTROL_PLANE]), _node("b", "batch")], "2", now=1.0)
    assert [g.eligible_nodes for g in ctl.world(2.0).gated] == [frozenset({"b"})]


# ------------------------------------------------------------------------------------------ autoscaler


def test_autoscaler_buys_for_pods_that_fit_only_on_a_tainted_unlabelled_node() -> None:
    """The control plane has room for the held batch pod, but kube-scheduler will never put it there: the pod is
    demand. Without the taint the same room counts (no purchase)."""
    cp = as_node("cp", SMALL, "batch", owned=False)
    del cp["metadata"]["labels"]["qos.kube-qos-extender.io/node-group"]  # unlabelled: accepts any kind
    held = as_pod("held", "1", "1Gi", kind="batch", runtime=600, unschedulable=False)
    held["spec"]["schedulingGates"] = [{"name": CONFIG.controller.gate_name}]

    def step(taints: list[dict[str, str]]) -> list[str]:
        node = {**cp, "spec": {"taints": taints}}
        s = AutoscalerSnapshot(CONFIG)
        s.replace_nodes([node], "1", now=0.0)
        s.apply_pod("ADDED", held, now=0.0)
        d = loop(batch_cycle_seconds=1.0).step(s, now=GATED_DEMAND_SECONDS + 2)
        return [k for r in d.provision for k in r.pods]

    assert step([]) == []
    assert step([CONTROL_PLANE]) == ["default/held"]
    assert step([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]) == []  # comes back by itself
