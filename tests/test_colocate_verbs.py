"""The filter and score verbs on the published prediction (issue 16, deliverable 3's last sentence): a
co-located batch pod (requesting batch-cpu/batch-memory) passes the node-group rule on service nodes, is
filtered on the slack the controller published minus what other tenants hold, and is scored by LRP (cpu 0.38 /
memory 0.62) over the predicted availability; ordinary pods keep their rules."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.core import slack
from extender.core.model import NodeGroup, Resources, WorkloadKind
from extender.core.slack import BATCH_CPU, BATCH_MEMORY, Amount
from extender.kube.snapshot import Snapshot
from extender.settings.extender import MARKER_RESOURCE, ExtenderConfig
from extender.webhook import verbs

GI = 2**30
GROUP = "qos.kube-qos-extender.io/node-group"


def _node(name: str, group: str, cpu: str = "4", memory: str = "8Gi", slack_cpu: int = 0, slack_mem: int = 0) -> Any:
    alloc: dict[str, str] = {"cpu": cpu, "memory": memory, "pods": "110"}
    if slack_cpu or slack_mem:
        alloc |= {BATCH_CPU: str(slack_cpu), BATCH_MEMORY: str(slack_mem)}
    return {"metadata": {"name": name, "labels": {GROUP: group}}, "spec": {}, "status": {"allocatable": alloc}}


def _pod(name: str, requests: dict[str, str], node: str | None = None, kind: str = "batch") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "qos-scheduler",
        "containers": [{"name": "c", "resources": {"requests": {**requests, MARKER_RESOURCE: "1"}}}],
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "annotations": {"qos.kube-qos-extender.io/kind": kind, "qos.kube-qos-extender.io/class": "bronze"},
        },
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


def _colocated(name: str, cpu_milli: int, mem: int, node: str | None = None) -> dict[str, Any]:
    return _pod(name, {BATCH_CPU: str(cpu_milli), BATCH_MEMORY: str(mem)}, node)


NODES = [
    _node("svc-big", "service", slack_cpu=1500, slack_mem=3 * GI),  # 2 of 4 cpu requested by a service
    _node("svc-small", "service", slack_cpu=500, slack_mem=GI),
    _node("svc-none", "service"),  # nothing published: no prediction, nothing lent
    _node("batch", "batch"),
]


def _snapshot(pods: list[dict[str, Any]]) -> Snapshot:
    snap = Snapshot(ExtenderConfig())
    snap.replace_nodes(NODES, "1", now=0.0)
    service = _pod("svc", {"cpu": "2", "memory": "4Gi"}, "svc-big", kind="service")
    snap.replace_pods([service, *pods], "1", now=0.0)
    return snap


def _filter(snap: Snapshot, pod: dict[str, Any]) -> dict[str, Any]:
    body = {"Pod": pod, "Nodes": None, "NodeNames": [n["metadata"]["name"] for n in NODES]}
    out: dict[str, Any] = verbs.filter_nodes(body, snap, ExtenderConfig(), 1.0).body
    return out


def test_enforced_groups_let_a_colocated_batch_pod_onto_service_nodes() -> None:
    """enforce: true (the default), and the pod is batch: only the published slack decides."""
    assert ExtenderConfig().node_groups.enforce
    out = _filter(_snapshot([]), _colocated("co", 1000, 2 * GI))
    assert out["NodeNames"] == ["svc-big"]
    assert out["FailedNodes"] == {}
    unresolvable = out["FailedAndUnresolvableNodes"]
    assert set(unresolvable) == {"svc-small", "svc-none", "batch"}
    assert BATCH_CPU in unresolvable["svc-none"] and "node group" not in unresolvable["svc-none"]


def test_an_ordinary_batch_pod_still_keeps_to_batch_nodes() -> None:
    out = _filter(_snapshot([]), _pod("plain", {"cpu": "500m", "memory": "1Gi"}))
    assert out["NodeNames"] == ["batch"]
    assert all("node group mismatch" in why for why in out["FailedAndUnresolvableNodes"].values())


def test_slack_held_by_another_tenant_is_not_lent_twice() -> None:
    snap = _snapshot([_colocated("tenant", 1000, GI, node="svc-big")])
    out = _filter(snap, _colocated("co", 1000, GI))
    assert out["NodeNames"] == []
    why = out["FailedNodes"]["svc-big"]  # resolvable: preempting the tenant would free it
    assert "predicted slack cpu 500m left of 1500m, pod needs 1000m" in why
    assert "memory" not in why
    # what still fits in the 500 m left passes, on that node only
    assert _filter(snap, _colocated("small", 500, GI))["NodeNames"] == ["svc-big", "svc-small"]


def test_the_pod_itself_does_not_count_against_its_own_slack() -> None:
    """kube-scheduler re-filters a pod the extender already assumed or sees bound: it is excluded."""
    snap = _snapshot([_colocated("co", 1500, GI, node="svc-big")])
    assert "svc-big" in _filter(snap, _colocated("co", 1500, GI))["NodeNames"]


def _prioritize(snap: Snapshot, pod: dict[str, Any]) -> dict[str, int]:
    body = {"Pod": pod, "Nodes": None, "NodeNames": [n["metadata"]["name"] for n in NODES]}
    result = verbs.prioritize(body, snap, ExtenderConfig(), 1.0)
    assert result.decisions == {"lrp-slack": 1}
    return {h["Host"]: h["Score"] for h in result.body}


def test_prioritize_ranks_by_lrp_over_the_predicted_availability() -> None:
    """svc-big: A'_v = (4000 - 2000 + 1500 - 400) m, (8 - 4 + 3 - 1) GiB of 4000 m / 8 GiB; svc-small: 4000 +
    500 - 400 m (clamped to the capacity), 8 + 1 - 1 GiB: emptier by prediction, so it ranks first."""
    scores = _prioritize(_snapshot([]), _colocated("co", 400, GI))
    assert scores == {"svc-small": 10, "svc-big": 9}
    # 100 * (0.38 * 3100 / 4000 + 0.62 * 6 / 8) = 75.95 for svc-big; svc-small is at the capacity on both
    assert slack.lrp_score(Resources(4000, 8 * GI), Amount(3100, 6 * GI), Resources(0, 0)) == 75
    # the same choice as Alg. 1 on those availabilities
    pick = slack.lrp_choose(
        [
            ("svc-big", Resources(4000, 8 * GI), Amount(3500, 7 * GI)),
            ("svc-small", Resources(4000, 8 * GI), Amount(4500, 9 * GI)),
        ],
        Resources(400, GI),
    )
    assert pick == "svc-small"


def test_prioritize_scores_only_where_the_slack_fits() -> None:
    assert _prioritize(_snapshot([]), _colocated("co", 1000, 2 * GI)) == {"svc-big": 10}


def test_group_and_demand_rules() -> None:
    colocated = Resources.request(0, 0, 1, {BATCH_CPU: 100})
    plain = Resources.request(100, 0, 1)
    assert slack.node_groups_for(WorkloadKind.BATCH, colocated) == {NodeGroup.BATCH, NodeGroup.SERVICE}
    assert slack.node_groups_for(WorkloadKind.BATCH, plain) == {NodeGroup.BATCH}
    assert slack.node_groups_for(WorkloadKind.SERVICE, colocated) == {NodeGroup.SERVICE}
    assert slack.slack_demand(plain) is None
    assert slack.slack_demand(Resources.request(0, 0, 1, {BATCH_MEMORY: GI})) == Resources(0, GI, 1)
    assert slack.with_batch_resources(("example.com/gpu", BATCH_CPU)) == ("example.com/gpu", BATCH_CPU, BATCH_MEMORY)


def test_bad_weights_are_refused() -> None:
    cand = [("n", Resources.request(4000, GI, 110, {BATCH_CPU: 1000, BATCH_MEMORY: GI}), Resources())]
    with pytest.raises(ValueError, match="weights"):
        slack.colocated_scores(cand, Resources(100, 0), weights=(-1.0, 1.0))


@given(
    st.lists(
        st.tuples(
            st.integers(1000, 16_000),
            st.integers(1, 64),
            st.integers(0, 8000),
            st.integers(0, 16),
            st.integers(0, 4000),
            st.integers(0, 8),
        ),
        min_size=1,
        max_size=8,
    ),
    st.integers(1, 3000),
    st.integers(0, 4),
)
def test_the_top_score_is_alg1s_choice(nodes: list[tuple[int, int, int, int, int, int]], cpu: int, mem: int) -> None:
    """colocated_scores gives 10 exactly to the nodes scoring like lrp_choose's pick (ties share it), and 0
    where the demand does not fit in the published slack left."""
    demand = Resources(cpu, mem * GI)
    cands, choose = [], []
    for i, (c, m, slack_c, slack_m, used_c, used_m) in enumerate(nodes):
        alloc = Resources.request(c, m * GI, 110, {BATCH_CPU: slack_c, BATCH_MEMORY: slack_m * GI})
        used = Resources.request(min(used_c, c), min(used_m, m) * GI, 1)
        cands.append((f"n{i}", alloc, used))
        avail = Amount(c - used.cpu_milli, m * GI - used.memory_bytes) + slack.lendable(alloc, used)
        lent = slack.lendable(alloc, used)
        choose.append((f"n{i}", Resources(c, m * GI), avail if slack.fits(lent, demand) else Amount(-1, -1)))
    scores = slack.colocated_scores(cands, demand)
    pick = slack.lrp_choose(choose, demand)
    if pick is None:
        assert set(scores.values()) == {0}
    else:
        assert scores[pick] == 10
    for (name, alloc, used), (_, _, _) in zip(cands, choose, strict=True):
        if not slack.fits(slack.lendable(alloc, used), demand):
            assert scores[name] == 0


def test_the_controller_pins_a_colocated_pod_where_prioritize_ranks_it_first() -> None:
    """host_score "profile": the QoS controller's pin must agree with the prioritize verb, so a co-located pod
    is pinned by LRP on the prediction (svc-small, as above), not by time-bin BFD."""
    import random

    from extender.controller.decide import GatedPod, Settings, World, decide
    from extender.core import qos
    from extender.core.model import DEFAULT_CLASSES

    snap = _snapshot([_colocated("co", 400, GI)])
    pod = snap.pods["default/co"].pod
    views = [snap.node_view(n["metadata"]["name"]) for n in NODES]
    nodes = [v for v in views if v is not None]
    world = World(nodes, {}, [GatedPod(pod, pod.key, 0.0)], {}, 10.0)
    policy = qos.QosPolicy(classes=DEFAULT_CLASSES, alpha_seconds=2.0)
    (release,) = decide(world, policy, Settings(host_score="profile"), random.Random(0)).releases
    assert release.node == "svc-small"
    scores = _prioritize(_snapshot([]), _colocated("co", 400, GI))
    assert max(scores, key=lambda n: scores[n]) == release.node
