"""The consolidation flow's decisions for the kubelet backend (a container checkpoint restored into a new pod on
another node): which pods it refuses, the destination pod made from the checkpoint image, when it counts as
restored, which destination container states end the wait at once. The real move: e2e/test_migration_real.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from extender.consolidation import policy

IMAGE = "localhost/qos-checkpoint/ns-job-mv-1:" + "ab" * 10


def src(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "metadata": {"name": "job", "namespace": "ns", "uid": "u1", "annotations": {"keep": "me"}},
        "spec": {
            "nodeName": "a",
            "containers": [{"name": "c", "image": "qos-local/busybox:1.35.0", "imagePullPolicy": "IfNotPresent"}],
            "volumes": [{"name": "kube-api-access-x", "projected": {"sources": []}}],
        },
        "status": {"phase": "Running"},
    }
    base["spec"].update(spec)
    return base


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ({}, None),
        (
            {
                "volumes": [
                    {"name": "c", "configMap": {}},
                    {"name": "s", "secret": {}},
                    {"name": "d", "downwardAPI": {}},
                ]
            },
            None,
        ),
        ({"volumes": None}, None),
        ({"containers": [{"name": "c"}, {"name": "d"}]}, None),  # each container checkpointed
        ({"containers": []}, "no containers"),
        ({"initContainers": [{"name": "i"}]}, "init container(s) i not finished"),
        ({"initContainers": [{"name": "side", "restartPolicy": "Always"}]}, "sidecar container(s) side"),
        ({"volumes": [{"name": "scratch", "emptyDir": {}}]}, "volume 'scratch' (emptyDir)"),
        ({"volumes": [{"name": "h", "hostPath": {"path": "/x"}}]}, "volume 'h' (hostPath)"),
        ({"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "c"}}]}, "(persistentVolumeClaim)"),
    ],
)
def test_checkpoint_blocker(spec: dict[str, Any], why: str | None) -> None:
    got = policy.checkpoint_blocker(src(**spec))
    if why is None:
        assert got is None
    else:
        assert got is not None and why in got and "ns/job" in got


def test_finished_init_containers_are_not_run_again_and_each_container_gets_its_image() -> None:
    s = src(containers=[{"name": "c", "image": "a"}, {"name": "d", "image": "b"}], initContainers=[{"name": "i"}])
    assert "not finished" in (policy.checkpoint_blocker(s) or "")
    s["status"]["initContainerStatuses"] = [{"name": "i", "state": {"terminated": {"exitCode": 1}}}]
    assert "not finished" in (policy.checkpoint_blocker(s) or ""), "a failed init container is not done"
    s["status"]["initContainerStatuses"] = [{"name": "i", "state": {"terminated": {"exitCode": 0}}}]
    assert policy.checkpoint_blocker(s) is None
    images = {"c": IMAGE, "d": IMAGE.replace("ab", "cd")}
    m = policy.destination_manifest(s, "job-mv-1", scheduler_name="q", migration="m", checkpoint_image=images)
    assert [(c["name"], c["image"], c["imagePullPolicy"]) for c in m["spec"]["containers"]] == [
        ("c", images["c"], "Never"),
        ("d", images["d"], "Never"),
    ]
    assert "initContainers" not in m["spec"], "they ran on the source"
    assert [policy.container_migration_id("m", i) for i in range(3)] == ["m", "m-1", "m-2"]
    rec = {"outcome": "succeeded", "meta": {"kubelet_archive": "x.tar"}, "restored_workload": {"image": IMAGE}}
    pod = {"spec": {"nodeName": "b", "containers": m["spec"]["containers"]},
           "status": {"containerStatuses": [{"name": "c", "state": {"running": {}}},
                                            {"name": "d", "state": {"running": {}}}]}}  # fmt: skip
    assert policy.confirm_destination(pod, "b", rec, images=images) is None
    swapped = {"c": images["d"], "d": images["c"]}
    assert "checkpoint image" in (policy.confirm_destination(pod, "b", rec, images=swapped) or "")
    assert "checkpoint image" in (policy.confirm_destination(pod, "b", rec) or ""), "one image for all: d differs"


def test_destination_manifest_runs_the_checkpoint_image_never_pulled() -> None:
    s = src()
    before = copy.deepcopy(s)
    m = policy.destination_manifest(s, "job-mv-1", scheduler_name="qos-consolidation", migration="m-1",
                                    checkpoint_image=IMAGE)  # fmt: skip
    assert s == before
    (c,) = m["spec"]["containers"]
    assert c["image"] == IMAGE and c["imagePullPolicy"] == "Never"
    assert "nodeName" not in m["spec"] and m["spec"]["schedulerName"] == "qos-consolidation"
    assert m["metadata"]["annotations"][policy.MIGRATED_FROM_ANNOTATION] == "ns/job"
    plain = policy.destination_manifest(s, "job-mv-2", scheduler_name="q", migration="m-2")
    assert plain["spec"]["containers"][0]["image"] == "qos-local/busybox:1.35.0"


def _restored(state: dict[str, Any], image: str = IMAGE, node: str = "b") -> dict[str, Any]:
    return {
        "metadata": {"name": "job-mv-1"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": image}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "c", "state": state}]},
    }


def test_confirm_destination_for_a_checkpoint_restore() -> None:
    rec = {
        "outcome": "succeeded",
        "meta": {"kubelet_archive": "checkpoint-x.tar"},
        "restored_workload": {"image": IMAGE},
    }
    assert policy.confirm_destination(_restored({"running": {"startedAt": "t"}}), "b", rec) is None
    assert "not running" in (policy.confirm_destination(_restored({"waiting": {}}), "b", rec) or "")
    assert "checkpoint image" in (policy.confirm_destination(_restored({"running": {}}, image="x:y"), "b", rec) or "")
    assert "not 'c'" in (policy.confirm_destination(_restored({"running": {}}), "c", rec) or "")
    no_image = {**rec, "restored_workload": {}}
    assert "checkpoint image" in (policy.confirm_destination(_restored({"running": {}}), "b", no_image) or "")


def test_container_failure_ends_the_wait_only_for_states_that_do_not_heal() -> None:
    waiting = _restored({"waiting": {"reason": "CreateContainerError", "message": "failed to restore: criu"}})
    assert policy.container_failure(waiting) == "container c: CreateContainerError: failed to restore: criu"
    assert policy.container_failure(_restored({"waiting": {"reason": "ContainerCreating"}})) is None
    assert policy.container_failure(_restored({"running": {}})) is None
    assert policy.container_failure(_restored({"terminated": {"reason": "Error", "exitCode": 1}})) == (
        "container c terminated: Error (exit 1)"
    )
    assert policy.container_failure(None) is None
    assert policy.container_failure({"status": {}}) is None


def test_destination_node_gone_keeps_the_source() -> None:
    assert policy.destination_node_gone({"metadata": {"name": "b"}}, "b") is None
    assert policy.destination_node_gone(None, "b") == "the destination node b is gone"
    deleting = {"metadata": {"name": "b", "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert policy.destination_node_gone(deleting, "b") == "the destination node b is being deleted"


def test_an_unconfirmed_kubelet_move_rolls_back_a_criu_move_keeps_both() -> None:
    # kubelet checkpoint: the source never stopped, so it is the copy to keep (both would run the work twice)
    assert policy.after_unconfirmed(source_still_runs=True) is policy.MoveVerdict.ROLL_BACK
    # CRIU: the source was stopped at the final dump; the destination may hold the only copy
    assert policy.after_unconfirmed(source_still_runs=False) is policy.MoveVerdict.KEEP_BOTH
