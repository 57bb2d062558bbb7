"""The owner hand-over's pure rules (extender/core/owners.py): which owners are handed over, what a held
destination looks like, and that the patches do what the controllers' rules need when the API server applies
them (RFC 7386 merge patch, applied here by ``merge``)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.consolidation import policy
from extender.core import owners
from extender.core.migration import pod_blocker
from extender.core.owners import OwnerKind


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies ``application/merge-patch+json``."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out


def ref(kind: str, api: str, uid: str = "u-1", controller: bool = True) -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "name": f"{kind.lower()}-1", "uid": uid, "controller": controller,
            "blockOwnerDeletion": True}  # fmt: skip


def pod(refs: list[dict[str, Any]] | None = None, **meta: Any) -> dict[str, Any]:
    m = {"name": "p", "namespace": "ns", "uid": "pod-uid", "resourceVersion": "7",
         "labels": {"app": "a", "pod-template-hash": "h1"}} | meta  # fmt: skip
    if refs is not None:
        m["ownerReferences"] = refs
    return {"metadata": m, "spec": {"containers": [{"name": "c", "image": "i"}]}, "status": {"phase": "Running"}}


JOB = ref("Job", "batch/v1")
RS = ref("ReplicaSet", "apps/v1")
STS = ref("StatefulSet", "apps/v1")


@pytest.mark.parametrize(
    ("refs", "kind"),
    [
        (None, OwnerKind.NONE),
        ([ref("ReplicaSet", "apps/v1", controller=False)], OwnerKind.NONE),
        ([RS], OwnerKind.REPLICA_SET),
        ([JOB], OwnerKind.JOB),
        ([STS], OwnerKind.STATEFUL_SET),
        ([ref("DaemonSet", "apps/v1")], OwnerKind.DAEMON_SET),
        ([ref("Job", "example.com/v1")], OwnerKind.OTHER),  # an operator's own "Job" is not batch/v1's
        ([ref("Node", "v1")], OwnerKind.OTHER),  # a static pod's mirror: deleting it stops nothing
        ([ref("Workflow", "argoproj.io/v1alpha1")], OwnerKind.OTHER),
    ],
)
def test_owner_kind(refs: list[dict[str, Any]] | None, kind: OwnerKind) -> None:
    assert owners.owner_kind(pod(refs)) is kind


def test_owner_blocker_refuses_what_cannot_be_handed_over_and_says_why() -> None:
    assert owners.owner_blocker(pod(None)) is None
    assert owners.owner_blocker(pod([RS])) is None
    assert owners.owner_blocker(pod([STS])) is None
    assert owners.owner_blocker(pod([JOB], finalizers=[owners.JOB_TRACKING_FINALIZER])) is None
    assert "stays with its node" in (owners.owner_blocker(pod([ref("DaemonSet", "apps/v1")])) or "")
    assert "rules we do not know" in (owners.owner_blocker(pod([ref("Workflow", "argoproj.io/v1")])) or "")
    assert "count it twice" in (owners.owner_blocker(pod([JOB])) or ""), "a Job pod without the tracking finalizer"
    sts = pod([STS])
    sts["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}}]
    assert "PersistentVolumeClaim data-web-0" in (owners.owner_blocker(sts) or "")
    # the flow's and the agent's one answer: pod_blocker carries it
    assert "rules we do not know" in (pod_blocker(pod([ref("Workflow", "argoproj.io/v1")])) or "")
    assert pod_blocker(pod([RS])) is None
    held = pod([RS], annotations={owners.HELD_LABELS_ANNOTATION: "{}"})
    assert "hand-over" in (pod_blocker(held) or ""), "a pod mid hand-over is never picked for another move"


def test_held_destination_matches_no_selector_and_adoption_gives_the_source_its_place() -> None:
    src = pod([JOB], finalizers=[owners.JOB_TRACKING_FINALIZER])
    src["metadata"]["annotations"] = {owners.DELETION_COST_ANNOTATION: "5", "keep": "me"}
    dest = policy.destination_manifest(src, "p-mv-x", scheduler_name="none", migration="m1", owner=OwnerKind.JOB)
    dm = dest["metadata"]
    assert dm["labels"] == {owners.MIGRATION_LABEL: "m1"}, "no selector of the owner, a Service or a PDB matches"
    assert "ownerReferences" not in dm and "finalizers" not in dm
    assert json.loads(dm["annotations"][owners.HELD_LABELS_ANNOTATION]) == src["metadata"]["labels"]
    assert dm["annotations"]["keep"] == "me" and owners.DELETION_COST_ANNOTATION not in dm["annotations"]

    live = merge(dest, {"metadata": {"uid": "d-uid", "resourceVersion": "9"}})
    adopted = merge(live, owners.adopt_patch(live, src))["metadata"]
    assert adopted["labels"] == src["metadata"]["labels"]
    assert adopted["ownerReferences"] == [JOB]
    assert adopted["finalizers"] == [owners.JOB_TRACKING_FINALIZER], "its completion is counted once, by the Job"
    assert owners.HELD_LABELS_ANNOTATION not in adopted["annotations"]
    assert owners.adopt_patch(live, src)["metadata"]["resourceVersion"] == "9", "guarded against a stale view"

    # a ReplicaSet's source: no tracking finalizer is invented
    rs_src = pod([RS])
    rs_dest = policy.destination_manifest(rs_src, "q", scheduler_name="n", migration="m2", owner=OwnerKind.REPLICA_SET)
    assert merge(rs_dest, owners.adopt_patch(rs_dest, rs_src))["metadata"]["finalizers"] == []
    assert merge(rs_src, owners.surplus_patch())["metadata"]["annotations"] == {
        owners.DELETION_COST_ANNOTATION: str(owners.MIN_DELETION_COST)
    }

    # a StatefulSet's destination is born adopted, under the name it is given (the source's)
    sts_src = pod([STS], name="web-0")
    sts_dest = policy.destination_manifest(
        sts_src, "web-0", scheduler_name="n", migration="m3", owner=OwnerKind.STATEFUL_SET
    )
    assert sts_dest["metadata"]["name"] == "web-0" and sts_dest["metadata"]["ownerReferences"] == [STS]
    assert sts_dest["metadata"]["labels"] == sts_src["metadata"]["labels"]
    # ... and its trial restore is held: no owner, labels parked, nothing but our migration label to match
    trial = policy.destination_manifest(
        sts_src, "web-0-trial", scheduler_name="n", migration="m3", owner=OwnerKind.STATEFUL_SET, held=True
    )
    assert "ownerReferences" not in trial["metadata"]
    assert trial["metadata"]["labels"] == {owners.MIGRATION_LABEL: "m3"}
    assert json.loads(trial["metadata"]["annotations"][owners.HELD_LABELS_ANNOTATION]) == sts_src["metadata"]["labels"]


def test_adopt_refuses_a_destination_that_holds_nothing() -> None:
    with pytest.raises(ValueError, match="holds no"):
        owners.adopt_patch(pod(None), pod([RS]))
    bad = pod(None, annotations={owners.HELD_LABELS_ANNOTATION: '{"a": 1}'})
    with pytest.raises(ValueError, match="not a map of strings"):
        owners.adopt_patch(bad, pod([RS]))


labels = st.dictionaries(st.from_regex(r"[a-z][a-z0-9.-]{0,8}", fullmatch=True), st.text(max_size=6), max_size=5)


@given(labels=labels, finalizers=st.lists(st.sampled_from([owners.JOB_TRACKING_FINALIZER, "x.io/keep"]), unique=True),
       other=st.booleans())  # fmt: skip
def test_release_then_restore_is_the_source_as_it_was(
    labels: dict[str, str], finalizers: list[str], other: bool
) -> None:
    refs = [JOB] + ([ref("Thing", "x.io/v1", uid="o", controller=False)] if other else [])
    src = pod(refs, labels=labels, finalizers=finalizers)
    released = merge(src, owners.release_patch(src, "m"))["metadata"]
    assert released["labels"] == {owners.MIGRATION_LABEL: "m"}, "no selector matches the released source"
    assert all(not r.get("controller") for r in released["ownerReferences"]), "its controller no longer owns it"
    assert owners.JOB_TRACKING_FINALIZER not in released["finalizers"], "never counted as failed or succeeded"
    assert [f for f in released["finalizers"]] == [f for f in finalizers if f != owners.JOB_TRACKING_FINALIZER]
    back = merge({"metadata": released}, owners.restore_patch(src))["metadata"]
    for field in ("labels", "ownerReferences", "finalizers"):
        assert back[field] == src["metadata"][field], field
    assert owners.HELD_LABELS_ANNOTATION not in back["annotations"]


def test_replacements_are_the_owners_new_pods_only() -> None:
    def p(uid: str, owner: str | None) -> dict[str, Any]:
        return {"metadata": {"name": f"n-{uid}", "uid": uid,
                             "ownerReferences": [ref("Job", "batch/v1", uid=owner)] if owner else []}}  # fmt: skip

    pods = [p("a", "J"), p("b", "J"), p("c", "J"), p("d", "K"), p("e", None)]
    assert owners.replacements(pods, "J", {"a", "b"}) == ["n-c"]
    assert owners.replacements(pods, "J", {"a", "b", "c"}) == []


def _ready_pod(status: str | None, since: str | None = "2026-11-26T10:00:00Z") -> dict[str, Any]:
    conds = [] if status is None else [{"type": "Ready", "status": status, "lastTransitionTime": since}]
    return {"status": {"conditions": [{"type": "PodScheduled", "status": "True"}, *conds]}}


def test_available_in_follows_the_replicasets_rule() -> None:
    """A ReplicaSet counts a pod available once Ready for minReadySeconds (podutil.IsPodAvailable): the hand-over
    waits that long, or the Deployment's available count (what maxUnavailable bounds) dips while the source goes."""
    from datetime import UTC, datetime, timedelta

    from extender.core.owners import available_in

    t0 = datetime(2026, 11, 26, 10, 0, 0, tzinfo=UTC)
    assert available_in(_ready_pod("True"), 0, t0) == 0.0
    assert available_in(_ready_pod("True"), 5, t0 + timedelta(seconds=2)) == pytest.approx(3.0)
    assert available_in(_ready_pod("True"), 5, t0 + timedelta(seconds=5)) == 0.0
    assert available_in(_ready_pod("True"), 5, t0 + timedelta(seconds=60)) == 0.0
    assert available_in(_ready_pod("True", "2026-11-26T10:00:00+00:00"), 5, t0 + timedelta(seconds=4)) == (
        pytest.approx(1.0)
    )
    # not Ready, or no Ready condition yet: not available, however long minReadySeconds is
    assert available_in(_ready_pod("False"), 0, t0) is None
    assert available_in(_ready_pod(None), 0, t0) is None
    assert available_in({}, 3, t0) is None
    # a Ready condition without a usable time: never "available" (the flow waits until its deadline, then refuses)
    assert available_in(_ready_pod("True", None), 7, t0) == 7.0
    assert available_in(_ready_pod("True", "yesterday"), 7, t0) == 7.0
