"""Kubernetes JSON -> core model: requests as kube-scheduler computes them, annotations with defaults/problems."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.core.model import DEFAULT_CLASSES, InvalidInputError, NodeGroup, WorkloadKind
from extender.kube.convert import (
    CLASS_KEY,
    KIND_KEY,
    MIGRATABLE_KEY,
    RUNTIME_KEY,
    node_from_k8s,
    node_group_of,
    parse_timestamp,
    pod_from_k8s,
    pod_requests,
    pod_settings,
)
from extender.settings.extender import LabelSelector, NodeGroupsConfig, PodDefaults

DEFAULTS = PodDefaults()


def container(cpu: str | None = None, memory: str | None = None, **extra: str) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None} | extra
    return {"name": "c", "resources": {"requests": requests}}


def pod(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "creationTimestamp": "2026-11-21T23:24:27Z"},
        "spec": {"containers": containers, "initContainers": init or [], **spec},
    }


# ------------------------------------------------------------------------------------------- requests


def test_requests_sum_containers() -> None:
    r = pod_requests(pod([container("100m", "64Mi"), container("250m", "1Gi")]))
    assert (r.cpu_milli, r.memory_bytes, r.pods) == (350, 64 * 2**20 + 2**30, 1)


def test_init_containers_take_the_max() -> None:
    r = pod_requests(pod([container("100m", "64Mi")], init=[container("500m", "32Mi"), container("200m", "1Gi")]))
    assert (r.cpu_milli, r.memory_bytes) == (500, 2**30)


def test_sidecars_add_to_containers_and_to_later_init_containers() -> None:
    """KEP-753: restartable init containers run beside everything started after them."""
    sidecar = container("100m", "100Mi") | {"restartPolicy": "Always"}
    r = pod_requests(
        pod([container("300m", "200Mi")], init=[container("1", "50Mi"), sidecar, container("250m", "10Mi")])
    )
    # steady state: 300m + 100m; init #1 alone: 1000m; init #3 beside the sidecar: 350m -> cpu 1000m
    # memory: steady 300Mi; init #1 50Mi; init #3 110Mi -> 300Mi
    assert (r.cpu_milli, r.memory_bytes) == (1000, 300 * 2**20)


def test_pod_overhead_and_pod_level_requests() -> None:
    p = pod([container("100m", "64Mi")], overhead={"cpu": "50m", "memory": "10Mi"})
    assert pod_requests(p).cpu_milli == 150
    p["spec"]["resources"] = {"requests": {"cpu": "2"}}
    r = pod_requests(p)
    assert r.cpu_milli == 2050 and r.memory_bytes == 74 * 2**20  # pod-level cpu replaces the sum, memory kept


def test_extended_resources_only_when_managed() -> None:
    p = pod([container("1", **{"example.com/gpu": "2"}), container(**{"example.com/gpu": "1"})])
    assert pod_requests(p).extended == ()
    assert pod_requests(p, ["example.com/gpu"]).ext("example.com/gpu") == 3


def test_quantities_round_up_and_reject_garbage() -> None:
    assert pod_requests(pod([container("0.5m")])).cpu_milli == 1
    assert pod_requests(pod([container(memory="1.5")])).memory_bytes == 2
    with pytest.raises(InvalidInputError, match=r"spec.containers\[0\].resources.requests.cpu: malformed"):
        pod_requests(pod([container("x")]))
    with pytest.raises(InvalidInputError, match="must be a string or number"):
        pod_requests(pod([{"resources": {"requests": {"cpu": True}}}]))
    with pytest.raises(InvalidInputError, match=r"spec\.containers must be a list"):
        pod_requests({"spec": {"containers": "c"}})


def test_no_containers_is_zero_but_one_slot() -> None:
    r = pod_requests({"spec": {}})
    assert (r.cpu_milli, r.memory_bytes, r.pods) == (0, 0, 1)


@settings(max_examples=200)
@given(
    containers=st.lists(st.integers(0, 5000), max_size=4),
    init=st.lists(st.tuples(st.integers(0, 5000), st.booleans()), max_size=4),
    overhead=st.integers(0, 100),
)
def test_requests_match_the_kube_scheduler_formula(
    containers: list[int], init: list[tuple[int, bool]], overhead: int
) -> None:
    """max(sum(containers) + sum(sidecars), max_i(init_i + sidecars before i)) + overhead, per resource."""
    p = pod(
        [container(f"{c}m") for c in containers],
        init=[container(f"{c}m") | ({"restartPolicy": "Always"} if side else {}) for c, side in init],
        overhead={"cpu": f"{overhead}m"},
    )
    sidecars = 0
    peak = 0
    for c, side in init:
        if side:
            sidecars += c
            peak = max(peak, sidecars)
        else:
            peak = max(peak, c + sidecars)
    assert pod_requests(p).cpu_milli == max(sum(containers) + sidecars, peak) + overhead


# ---------------------------------------------------------------------------------------- annotations


def annotated(
    annotations: dict[str, Any] | None = None, labels: dict[str, str] | None = None, priority: int | None = None
) -> dict[str, Any]:
    p = pod([container("100m")])
    p["metadata"]["annotations"] = annotations or {}
    p["metadata"]["labels"] = labels or {}
    if priority is not None:
        p["spec"]["priority"] = priority
    return p


def test_no_annotations_get_the_documented_defaults() -> None:
    s = pod_settings(annotated(), DEFAULTS, DEFAULT_CLASSES)
    assert (s.class_name, s.kind, s.runtime_seconds, s.migratable, s.problems) == (
        "bronze",
        WorkloadKind.SERVICE,
        None,
        False,
        (),
    )


@pytest.mark.parametrize(
    ("priority", "cls"),
    [
        (None, "bronze"),
        (0, "bronze"),
        (100, "bronze"),
        (499, "bronze"),
        (500, "silver"),
        (1000, "gold"),
        (2_000_000_000, "gold"),
    ],
)
def test_class_from_priority(priority: int | None, cls: str) -> None:
    assert pod_settings(annotated(priority=priority), DEFAULTS, DEFAULT_CLASSES).class_name == cls
    off = PodDefaults(class_name="silver", class_from_priority=False)
    assert pod_settings(annotated(priority=priority), off, DEFAULT_CLASSES).class_name == "silver"


def test_valid_annotations_and_label_fallback() -> None:
    s = pod_settings(
        annotated({CLASS_KEY: "gold", KIND_KEY: "Batch", RUNTIME_KEY: "3600", MIGRATABLE_KEY: "false"}),
        DEFAULTS,
        DEFAULT_CLASSES,
    )
    assert (s.class_name, s.kind, s.runtime_seconds, s.migratable, s.problems) == (
        "gold",
        WorkloadKind.BATCH,
        3600.0,
        False,
        (),
    )
    s = pod_settings(annotated(labels={CLASS_KEY: "silver", KIND_KEY: "batch"}), DEFAULTS, DEFAULT_CLASSES)
    assert (s.class_name, s.kind, s.migratable) == ("silver", WorkloadKind.BATCH, True)
    s = pod_settings(annotated({CLASS_KEY: "gold"}, labels={CLASS_KEY: "silver"}), DEFAULTS, DEFAULT_CLASSES)
    assert s.class_name == "gold"  # the annotation wins


@pytest.mark.parametrize(
    ("annotations", "key", "fragment"),
    [
        (
            {CLASS_KEY: "platinum"},
            CLASS_KEY,
            "unknown class 'platinum' in annotation (known: bronze, gold, silver); using 'bronze'",
        ),
        ({KIND_KEY: "daemon"}, KIND_KEY, "unknown kind 'daemon'"),
        ({KIND_KEY: "batch", RUNTIME_KEY: "an hour"}, RUNTIME_KEY, "malformed runtime 'an hour'"),
        ({RUNTIME_KEY: "-5"}, RUNTIME_KEY, "malformed runtime '-5'"),
        ({RUNTIME_KEY: "inf"}, RUNTIME_KEY, "malformed runtime 'inf'"),
        ({RUNTIME_KEY: "nan"}, RUNTIME_KEY, "malformed runtime 'nan'"),
        ({MIGRATABLE_KEY: "yes"}, MIGRATABLE_KEY, "malformed value 'yes'"),
    ],
)
def test_malformed_annotations_give_default_and_problem(annotations: dict[str, str], key: str, fragment: str) -> None:
    s = pod_settings(annotated(annotations), DEFAULTS, DEFAULT_CLASSES)
    (problem,) = s.problems
    assert problem.key == key and fragment in problem.message
    assert s.class_name in DEFAULT_CLASSES


def test_batch_default_runtime() -> None:
    d = PodDefaults(batch_runtime_seconds=900.0)
    assert pod_settings(annotated({KIND_KEY: "batch"}), d, DEFAULT_CLASSES).runtime_seconds == 900.0
    assert pod_settings(annotated(), d, DEFAULT_CLASSES).runtime_seconds is None


def test_pod_from_k8s_fields() -> None:
    p = annotated({CLASS_KEY: "silver"}, priority=7)
    p["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "web-1", "controller": True}]
    p["spec"]["nodeName"] = "node-1"
    p["status"] = {"startTime": "2026-11-21T23:25:00Z"}
    core, problems = pod_from_k8s(p, DEFAULTS, DEFAULT_CLASSES)
    assert problems == ()
    assert (core.key, core.uid, core.priority, core.class_name, core.node_name) == (
        "ns/p",
        "u-1",
        7,
        "silver",
        "node-1",
    )
    assert core.request_id == "ns/ReplicaSet/web-1"
    assert core.started_at == parse_timestamp("2026-11-21T23:25:00Z")
    # Bound pod without startTime: PodScheduled condition, else the fallback (our bind time).
    del p["status"]
    assert pod_from_k8s(p, DEFAULTS, DEFAULT_CLASSES, started_at=5.0)[0].started_at == 5.0
    p["status"] = {
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-21T23:24:49Z"}]
    }
    assert pod_from_k8s(p, DEFAULTS, DEFAULT_CLASSES, started_at=5.0)[0].started_at == parse_timestamp(
        "2026-11-21T23:24:49Z"
    )


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda p: p.update(metadata={}), "metadata.name is missing"),
        (lambda p: p["metadata"].update(name=3), "metadata.name must be a string"),
        (lambda p: p["metadata"].update(annotations={"a": 1}), "annotations['a'] must be a string"),
        (lambda p: p["spec"].update(priority=1.5), "priority must be an integer"),
        (lambda p: p["spec"].update(nodeName=[]), "nodeName must be a string"),
        (lambda p: p.update(spec=[]), "pod spec must be an object"),
    ],
)
def test_pod_shape_errors(mutate: Any, message: str) -> None:
    p = annotated()
    mutate(p)
    with pytest.raises(InvalidInputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        pod_from_k8s(p, DEFAULTS, DEFAULT_CLASSES)


def test_timestamps() -> None:
    assert parse_timestamp("1970-01-01T00:01:00Z") == 60.0
    assert parse_timestamp("2026-11-21T23:24:27.5+00:00") == parse_timestamp("2026-11-21T23:24:27Z") + 0.5  # type: ignore[operator]
    assert parse_timestamp("yesterday") is None and parse_timestamp(None) is None and parse_timestamp(5) is None


# ---------------------------------------------------------------------------------------------- nodes

NODE = {
    "metadata": {
        "name": "n1",
        "labels": {"qos.kube-qos-extender.io/node-group": "batch", "node.kubernetes.io/instance-type": "m1.large"},
        "creationTimestamp": "2026-11-21T23:24:19Z",
    },
    "spec": {},
    "status": {
        "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110", "example.com/gpu": "2"},
        "allocatable": {"cpu": "3900m", "memory": "15Gi", "pods": "110", "example.com/gpu": "2", "hugepages-2Mi": "0"},
    },
}


def test_node_from_k8s() -> None:
    n = node_from_k8s(NODE, NodeGroupsConfig(), ["example.com/gpu"])
    assert (n.name, n.allocatable.cpu_milli, n.allocatable.memory_bytes, n.allocatable.pods) == (
        "n1",
        3900,
        15 * 2**30,
        110,
    )
    assert n.allocatable.ext("example.com/gpu") == 2 and n.capacity is not None and n.capacity.cpu_milli == 4000
    assert (n.group, n.flavour, n.unschedulable, n.pods) == (NodeGroup.BATCH, "m1.large", False, ())
    assert node_from_k8s(NODE, NodeGroupsConfig()).allocatable.extended == ()  # unmanaged: ignored


def test_node_groups() -> None:
    g = NodeGroupsConfig()
    both = {"qos.kube-qos-extender.io/node-group": "batch"}
    assert node_group_of(both, g) == {NodeGroup.BATCH}
    assert node_group_of({}, g) == {NodeGroup.BATCH, NodeGroup.SERVICE}
    assert node_group_of({}, NodeGroupsConfig(unlabelled="none")) == set()
    assert node_group_of({}, NodeGroupsConfig(unlabelled="service")) == {NodeGroup.SERVICE}
    custom = NodeGroupsConfig(
        batch=LabelSelector(match_labels={"pool": "spot"}),
        service=LabelSelector(match_labels={"pool": "spot", "tier": "web"}),
    )
    assert node_group_of({"pool": "spot", "tier": "web"}, custom) == {NodeGroup.BATCH, NodeGroup.SERVICE}
    n = copy.deepcopy(NODE)
    n["metadata"]["labels"] = {}
    n["spec"]["unschedulable"] = True
    del n["status"]["allocatable"]
    core = node_from_k8s(n, g)
    assert core.group is None and core.unschedulable and core.allocatable.cpu_milli == 0
    with pytest.raises(InvalidInputError, match=r"node metadata\.name is missing"):
        node_from_k8s({"metadata": {}}, g)
