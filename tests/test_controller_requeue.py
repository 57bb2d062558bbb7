"""Re-queueing a released pod whose pinned host lost its room (pure parts: which, how, and the copy).

The live path (a real kube-scheduler finding the pinned pod Unschedulable, the controller re-creating it and
releasing it elsewhere) is tests/test_controller_live.py::test_a_pod_pinned_to_a_host_that_filled_up_is_requeued.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from extender.controller.decide import PinnedWait, stuck_pins
from extender.controller.patches import BOOKING_ANNOTATIONS, release_patch, requeue_action, requeue_copy
from extender.controller.state import pod_info
from extender.core.model import Node, Pod, Resources

GATE = "qos.kube-qos-extender.io/ordering"
HOST = Resources(2000, 4 * 2**30, 110)


def _pod(name: str, cpu: int, node: str | None = None) -> Pod:
    return Pod(name, Resources.request(cpu, 2**28, 1), node_name=node)


def test_only_a_host_that_no_longer_fits_or_is_gone_after_the_patience_requeues() -> None:
    squatter = _pod("squatter", 1500, "n1")
    nodes = {"n1": Node("n1", HOST, pods=(squatter,)), "n2": Node("n2", HOST)}
    waiting = [
        PinnedWait(_pod("full", 1000), "n1", 30.0),  # n1 has 500m left: stuck
        PinnedWait(_pod("early", 1000), "n1", 29.0),  # stuck too, but not for long enough yet
        PinnedWait(_pod("fits", 1000), "n2", 300.0),  # its host still has room: kube-scheduler's business
        PinnedWait(_pod("gone", 100), "n9", 30.0),  # its host went away
    ]
    assert stuck_pins(waiting, nodes, after_seconds=30.0) == ["default/full", "default/gone"]
    assert stuck_pins(waiting, nodes, after_seconds=31.0) == []  # nothing waited 31 s
    assert stuck_pins([], nodes, 0.0) == []


def test_a_cordoned_host_counts_as_lost() -> None:
    nodes = {"n1": Node("n1", HOST, unschedulable=True)}
    assert stuck_pins([PinnedWait(_pod("p", 100), "n1", 5.0)], nodes, 1.0) == ["default/p"]


def _raw(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "42",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "managedFields": [{"manager": "kubectl"}],
            "labels": {"app": "a"},
            "annotations": {
                "qos.kube-qos-extender.io/class": "gold",
                BOOKING_ANNOTATIONS[0]: "qos-service-x",
            },
        },
        "spec": {
            "schedulerName": "qos-scheduler",
            "schedulingGates": [{"name": GATE}],
            "containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}],
        },
        "status": {"phase": "Pending"},
    }
    body["metadata"].update(over.pop("metadata", {}))
    body["spec"].update(over.pop("spec", {}))
    assert not over
    return body


def _apply(pod: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """A minimal RFC 6902 apply for the ops release_patch emits (test, remove, add incl. '-')."""
    out = copy.deepcopy(pod)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        parent: Any = out
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        if op["op"] == "test":
            continue
        if op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif isinstance(parent, list):
            parent.append(op["value"]) if last == "-" else parent.insert(int(last), op["value"])
        else:
            parent[last] = op["value"]
    return out


def _released(pod: dict[str, Any], node: str) -> dict[str, Any]:
    return _apply(pod, release_patch(pod["spec"], GATE, node))


AFFINITIES: list[dict[str, Any] | None] = [
    None,
    {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
    {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {}}]}},
    {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["bad"]}]},
                ]
            }
        }
    },
]


@given(st.sampled_from(AFFINITIES), st.sampled_from(["n1", "node-b"]))
def test_the_copy_undoes_the_pin_exactly_and_is_gated_again(affinity: Any, node: str) -> None:
    original = _raw(spec={"affinity": copy.deepcopy(affinity)} if affinity is not None else {})
    released = _released(original, node)
    released["spec"]["nodeName"] = None  # (never set on a stuck pod; dropped if a caller passes one)
    released["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]}
    info = pod_info(released, GATE, "x")
    assert info.pinned_node == node and not info.gated  # the stuck pod: ungated and pinned

    got = requeue_copy(released, GATE, node)
    assert "status" not in got
    assert set(got["metadata"]) == {"name", "namespace", "labels", "annotations"}
    assert BOOKING_ANNOTATIONS[0] not in got["metadata"]["annotations"]  # planned afresh
    assert got["metadata"]["annotations"]["qos.kube-qos-extender.io/class"] == "gold"
    assert got["spec"]["schedulingGates"] == [{"name": GATE}]
    assert "nodeName" not in got["spec"]
    assert got["spec"].get("affinity") == affinity  # the user's own affinity, as written
    again = pod_info(got | {"status": {}}, GATE, "x")
    assert again.gated and again.pinned_node is None
    assert released["spec"]["schedulingGates"] == []  # the input was not changed


def test_a_copy_keeps_other_gates_and_only_our_pin() -> None:
    other = {"key": "metadata.name", "operator": "In", "values": ["elsewhere"]}
    pod = _raw(
        spec={
            "schedulingGates": [{"name": "example.com/other"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchFields": [other, {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                        ]
                    }
                }
            },
        }
    )
    got = requeue_copy(pod, GATE, "n1")
    assert got["spec"]["schedulingGates"] == [{"name": "example.com/other"}, {"name": GATE}]
    terms = got["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [{"matchFields": [other]}]


def test_how_a_stuck_pod_goes_back_depends_on_who_re_creates_it() -> None:
    owned = {"ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": True}]}
    assert requeue_action(_raw()) == "recreate"
    assert requeue_action(_raw(metadata=owned)) == "delete"
    for kind in ("StatefulSet", "Job", "ReplicationController"):
        ref = {"ownerReferences": [{"kind": kind, "name": "o", "controller": True}]}
        assert requeue_action(_raw(metadata=ref)) == "delete"
    # an owner we cannot count on to re-create it: deleting would lose the pod
    custom = {"ownerReferences": [{"kind": "Workflow", "name": "w", "controller": True}]}
    assert requeue_action(_raw(metadata=custom)) == "keep"
    # a non-controller owner reference is no owner that re-creates
    assert requeue_action(_raw(metadata={"ownerReferences": [{"kind": "ReplicaSet", "name": "rs"}]})) == "recreate"
    assert requeue_action(_raw(metadata={"finalizers": ["example.com/hold"]})) == "keep"
    assert requeue_action(_raw(metadata={"deletionTimestamp": "2026-01-01T00:00:01Z"})) == "keep"
    assert requeue_action(_raw(spec={"nodeName": "n1"})) == "keep"  # bound after all
    assert requeue_action({"metadata": "garbage"}) == "keep"


def test_pod_info_reads_unschedulable_only_from_the_scheduler_verdict() -> None:
    def cond(reason: str, status: str = "False") -> dict[str, Any]:
        return {"conditions": [{"type": "PodScheduled", "status": status, "reason": reason}]}

    assert pod_info(_raw() | {"status": cond("Unschedulable")}, GATE, "x").unschedulable
    assert not pod_info(_raw() | {"status": cond("SchedulingGated")}, GATE, "x").unschedulable
    assert not pod_info(_raw() | {"status": cond("", "True")}, GATE, "x").unschedulable
    assert not pod_info(_raw(), GATE, "x").unschedulable
