"""The routing marker (scheduling.marker_resource): pods request it so that kube-scheduler's managedResources
sends them to the extender; nodes never advertise it, so filter must never require it."""

from __future__ import annotations

from typing import Any

from extender.kube.snapshot import Snapshot
from extender.settings.extender import MARKER_RESOURCE, ExtenderConfig, SchedulingConfig, load_config
from extender.webhook import verbs


def _node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"qos.kube-qos-extender.io/node-group": "service"}},
        "spec": {},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}},
    }


def _marked_pod(extra: dict[str, str] | None = None) -> dict[str, Any]:
    res = {"cpu": "1", "memory": "1Gi", MARKER_RESOURCE: "1", **(extra or {})}
    return {
        "metadata": {"name": "p", "namespace": "default", "uid": "uid-p"},
        "spec": {
            "schedulerName": "qos-scheduler",
            "containers": [{"name": "c", "resources": {"requests": res, "limits": {MARKER_RESOURCE: "1"}}}],
        },
        "status": {"phase": "Pending"},
    }


def _filter(config: ExtenderConfig, pod: dict[str, Any]) -> dict[str, Any]:
    snap = Snapshot(config)
    snap.replace_nodes([_node("n1"), _node("n2")], "1", now=0.0)
    snap.replace_pods([], "1", now=0.0)
    body = {"Pod": pod, "Nodes": None, "NodeNames": ["n1", "n2"]}
    out: dict[str, Any] = verbs.filter_nodes(body, snap, config, 1.0).body
    return out


def test_default_marker_is_the_documented_name() -> None:
    assert ExtenderConfig().scheduling.marker_resource == MARKER_RESOURCE == "qos.kube-qos-extender.io/managed"
    assert load_config(None).scheduling.marker_resource == MARKER_RESOURCE


def test_filter_passes_a_marked_pod_on_nodes_without_the_marker() -> None:
    res = _filter(ExtenderConfig(), _marked_pod())
    assert res["NodeNames"] == ["n1", "n2"]
    assert res["FailedNodes"] == {} and res["FailedAndUnresolvableNodes"] == {}


def test_filter_ignores_the_marker_even_if_a_config_object_lists_it_as_managed() -> None:
    """Parsing forbids listing the marker in managed_resources; a config built in code may still do it."""
    config = ExtenderConfig().model_copy(
        update=dict(scheduling=SchedulingConfig.model_construct(managed_resources=(MARKER_RESOURCE, "example.com/gpu")))
    )
    assert _filter(config, _marked_pod())["NodeNames"] == ["n1", "n2"]
    # ...while a real managed extended resource the nodes lack is still checked.
    res = _filter(config, _marked_pod({"example.com/gpu": "1"}))
    assert res["NodeNames"] == [] and set(res["FailedAndUnresolvableNodes"]) == {"n1", "n2"}


def test_marker_can_be_switched_off() -> None:
    config = ExtenderConfig().model_copy(update=dict(scheduling=SchedulingConfig(marker_resource=None)))
    assert _filter(config, _marked_pod())["NodeNames"] == ["n1", "n2"]
