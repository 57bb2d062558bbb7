"""Snapshot (watch events -> indexed core model) and the bind ledger (assume / confirm / expire)."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.core import packing
from extender.core.model import InvalidInputError, Pod, Resources
from extender.kube.convert import pod_from_k8s
from extender.kube.snapshot import BindLedger, Snapshot
from extender.settings.extender import ExtenderConfig
from extender.webhook import verbs

CONFIG = ExtenderConfig()


def node(name: str, cpu: str = "4", memory: str = "8Gi", pods: str = "110", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": pods}},
    }


def pod(
    name: str, cpu: str = "1", memory: str = "1Gi", node_name: str | None = None, uid: str | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": uid or f"uid-{name}"},
        "spec": {
            "schedulerName": "qos-scheduler",  # the profile this extender serves (bind.scheduler_names)
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
            "nodeName": node_name,
        },
        "status": {"phase": "Running" if node_name else "Pending"},
    }


def core_pod(name: str, cpu: int = 1000) -> Pod:
    return Pod(name, Resources.request(cpu, 2**30), uid=f"uid-{name}")


def synced(*nodes: dict[str, Any]) -> Snapshot:
    s = Snapshot(CONFIG)
    s.replace_nodes(list(nodes), "1", now=0.0)
    s.replace_pods([], "1", now=0.0)
    return s


# ------------------------------------------------------------------------------------------------- ledger


def test_ledger_assume_confirm_expire() -> None:
    ledger = BindLedger(ttl_seconds=30)
    ledger.assume(core_pod("a"), "n1", now=100)
    ledger.assume(core_pod("b"), "n1", now=110)
    assert {e.pod.key for e in ledger.on_node("n1")} == {"default/a", "default/b"}
    assert ledger.expire(now=129.9) == []
    expired = ledger.expire(now=130)
    assert [e.pod.key for e in expired] == ["default/a"]
    confirmed = ledger.confirm("default/b")
    assert confirmed is not None and confirmed.node == "n1"
    assert len(ledger) == 0 and list(ledger.on_node("n1")) == []
    assert ledger.confirm("default/b") is None


def test_ledger_expire_stops_at_the_first_fresh_entry_in_assume_order() -> None:
    """expire scans from the oldest assumption and stops at the first fresh one (issue 34): a re-assumed pod
    moves to the end, so it is not expired on its first time; a clock stepped back delays, never hastens."""
    ledger = BindLedger(ttl_seconds=30)
    ledger.assume(core_pod("a"), "n1", now=100)
    ledger.assume(core_pod("b"), "n1", now=105)
    ledger.assume(core_pod("a"), "n2", now=110)  # a again: now younger than b
    ledger.assume(core_pod("c"), "n1", now=90)  # the clock stepped back: c sits behind a fresh entry
    assert [e.pod.key for e in ledger.expire(now=136)] == ["default/b"]
    assert [e.pod.key for e in ledger.expire(now=140)] == ["default/a", "default/c"]
    assert len(ledger) == 0


def test_ledger_reassume_moves_the_pod() -> None:
    ledger = BindLedger(ttl_seconds=30)
    ledger.assume(core_pod("a"), "n1", now=0)
    ledger.assume(core_pod("a"), "n2", now=1)
    assert list(ledger.on_node("n1")) == [] and [e.node for e in ledger.on_node("n2")] == ["n2"]
    with pytest.raises(InvalidInputError):
        BindLedger(ttl_seconds=0)


# ----------------------------------------------------------------------------------------------- snapshot


def test_ready_only_after_both_lists() -> None:
    s = Snapshot(CONFIG)
    assert not s.ready and s.age(10.0) is None
    s.replace_nodes([node("n1")], "5", now=1.0)
    assert not s.ready
    s.replace_pods([], "7", now=2.0)
    assert s.ready and s.node_resource_version == "5" and s.pod_resource_version == "7" and s.age(10.0) == 8.0


def test_pod_events_keep_node_totals() -> None:
    s = synced(node("n1"), node("n2"))
    s.apply_pod("ADDED", pod("a", "1", node_name="n1"))
    s.apply_pod("ADDED", pod("b", "500m", node_name="n1"))
    s.apply_pod("ADDED", pod("c", "2"))  # pending: on no node
    assert s.requested_on("n1")[0].cpu_milli == 1500 and s.requested_on("n1")[1] == 2
    s.apply_pod("MODIFIED", pod("b", "500m", node_name="n2"))  # cannot happen in k8s, but must stay consistent
    assert s.requested_on("n1") == (Resources(1000, 2**30, 1), 1)
    assert s.requested_on("n2")[0].cpu_milli == 500
    done = pod("a", "1", node_name="n1")
    done["status"]["phase"] = "Succeeded"
    s.apply_pod("MODIFIED", done)
    assert s.requested_on("n1")[1] == 0 and "default/a" not in s.pods
    s.apply_pod("DELETED", pod("b", node_name="n2"))
    assert s.requested_on("n2")[1] == 0 and s.key_for_uid("uid-b") is None
    assert s.key_for_uid("uid-c") == "default/c"
    assert s.counts() == {"nodes": 2, "pods": 1, "bound_pods": 0, "assumed_pods": 0}


def test_bind_is_assumed_until_the_watch_confirms() -> None:
    s = synced(node("n1"))
    s.apply_pod("ADDED", pod("a", "3"))
    s.record_bind(s.pods["default/a"].pod, "n1", now=10.0)
    assert "default/a" in s.ledger and s.requested_on("n1")[0].cpu_milli == 3000
    # filter for another 3-CPU pod sees the space taken, before any watch event
    body = {"Pod": pod("b", "3"), "Nodes": None, "NodeNames": ["n1"]}
    assert verbs.filter_nodes(body, s, CONFIG, 11.0).body["NodeNames"] == []
    s.apply_pod("MODIFIED", pod("a", "3", node_name="n1"))  # the watch shows it: confirmed, counted once
    assert "default/a" not in s.ledger and s.requested_on("n1") == (Resources(3000, 2**30, 1), 1)
    assert s.pods["default/a"].pod.started_at == 10.0  # no startTime yet: our bind time


def test_an_assumed_pod_is_seen_bound_where_views_hold_it() -> None:
    """The ledger builds the bound copy at its first read: node views must see it on the node since the bind,
    while the watched pod itself stays unbound."""
    s = synced(node("n1"))
    s.apply_pod("ADDED", pod("a", "3"))
    source = s.pods["default/a"].pod
    entry = s.assume_bind(source, "n1", 10.0)
    view = s.node_view("n1")
    assert view is not None
    [held] = [p for p in view.pods if p.key == "default/a"]
    assert (held.node_name, held.started_at) == ("n1", 10.0)
    assert held == source.bound_to("n1", 10.0) and entry.pod is held  # built once
    assert (source.node_name, source.started_at) == (None, None)
    assert (entry.key, entry.uid, entry.node, entry.assumed_at) == ("default/a", source.uid, "n1", 10.0)


@pytest.mark.parametrize("now", [math.nan, math.inf, -math.inf])
def test_a_bind_at_a_clock_that_is_no_time_is_refused_and_leaves_nothing(now: float) -> None:
    s = synced(node("n1"))
    s.apply_pod("ADDED", pod("a", "3"))
    with pytest.raises(InvalidInputError, match="finite"):
        s.assume_bind(s.pods["default/a"].pod, "n1", now)
    assert "default/a" not in s.ledger and "default/a" not in s.bound_at and s.requested_on("n1")[1] == 0


def test_bind_after_watch_is_not_assumed_twice() -> None:
    s = synced(node("n1"))
    s.apply_pod("ADDED", pod("a", "3", node_name="n1"))
    s.record_bind(s.pods["default/a"].pod, "n1", now=10.0)
    assert len(s.ledger) == 0 and s.requested_on("n1")[1] == 1


def test_the_pod_being_scheduled_does_not_block_itself() -> None:
    s = synced(node("n1"))
    s.apply_pod("ADDED", pod("a", "3"))
    s.record_bind(s.pods["default/a"].pod, "n1", now=0.0)
    body = {"Pod": pod("a", "3"), "Nodes": None, "NodeNames": ["n1"]}
    assert verbs.filter_nodes(body, s, CONFIG, 1.0).body["NodeNames"] == ["n1"]


def test_ledger_expiry_frees_the_space_and_deletion_forgets() -> None:
    s = synced(node("n1"))
    s.apply_pod("ADDED", pod("a", "3"))
    s.record_bind(s.pods["default/a"].pod, "n1", now=0.0)
    body = {"Pod": pod("b", "3"), "Nodes": None, "NodeNames": ["n1"]}
    assert verbs.filter_nodes(body, s, CONFIG, CONFIG.bind.ledger_ttl_seconds - 1).body["NodeNames"] == []
    assert verbs.filter_nodes(body, s, CONFIG, CONFIG.bind.ledger_ttl_seconds).body["NodeNames"] == ["n1"]
    s.record_bind(s.pods["default/a"].pod, "n1", now=100.0)
    s.apply_pod("DELETED", pod("a", "3"))
    assert len(s.ledger) == 0 and "default/a" not in s.bound_at


def test_relist_replaces_everything() -> None:
    s = synced(node("n1"), node("n2"))
    s.apply_pod("ADDED", pod("a", node_name="n1"))
    s.replace_nodes([node("n2")], "9")
    s.replace_pods([pod("b", node_name="n2")], "9")
    assert set(s.nodes) == {"n2"} and set(s.pods) == {"default/b"}
    assert s.requested_on("n1")[1] == 0 and s.key_for_uid("uid-a") is None


def test_unreadable_objects_are_counted_not_fatal() -> None:
    s = synced(node("n1"))
    s.apply_pod("ADDED", {"metadata": {}})
    s.apply_pod("ADDED", pod("x", cpu="lots"))
    s.apply_node("ADDED", {"metadata": {"name": "n2"}, "status": {"allocatable": {"cpu": "many"}}})
    s.apply_node("ADDED", {"kind": "Node"})
    assert s.conversion_errors == 4
    assert set(s.nodes) == {"n1"} and s.pods == {}


def test_watch_reports_annotation_problems() -> None:
    s = synced(node("n1"))
    bad = pod("a")
    bad["metadata"]["annotations"] = {"qos.kube-qos-extender.io/kind": "cronjob"}
    (problem,) = s.apply_pod("ADDED", bad)
    assert "unknown kind 'cronjob'" in problem.message
    found = s.replace_pods([bad, pod("b")], "2")
    assert [key for key, _ in found] == ["default/a"]


# ------------------------------------------------------------------------- filter == packing.fits


@settings(max_examples=300, deadline=None)
@given(
    alloc=st.tuples(st.integers(0, 8000), st.integers(0, 8), st.integers(0, 6)),
    placed=st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 3)), max_size=6),
    assumed=st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 3)), max_size=3),
    incoming=st.tuples(st.integers(0, 4000), st.integers(0, 4)),
    cordoned=st.booleans(),
)
def test_filter_agrees_with_packing_fits(
    alloc: tuple[int, int, int],
    placed: list[tuple[int, int]],
    assumed: list[tuple[int, int]],
    incoming: tuple[int, int],
    cordoned: bool,
) -> None:
    """The fast path of filter (incremental totals + ledger) passes a node iff core packing.fits does on the
    full node view; a rejected node always has a reason, in exactly one of the two maps."""
    n = node("n1", cpu=f"{alloc[0]}m", memory=f"{alloc[1]}Gi", pods=str(alloc[2]))
    n["spec"]["unschedulable"] = cordoned
    s = synced(n)
    for i, (cpu, mem) in enumerate(placed):
        s.apply_pod("ADDED", pod(f"p{i}", f"{cpu}m", f"{mem}Gi", node_name="n1"))
    for i, (cpu, mem) in enumerate(assumed):
        s.apply_pod("ADDED", pod(f"q{i}", f"{cpu}m", f"{mem}Gi"))
        s.record_bind(s.pods[f"default/q{i}"].pod, "n1", now=0.0)
    body = {"Pod": pod("new", f"{incoming[0]}m", f"{incoming[1]}Gi"), "Nodes": None, "NodeNames": ["n1"]}
    res = verbs.filter_nodes(copy.deepcopy(body), s, CONFIG, 1.0).body
    view = s.node_view("n1", exclude="default/new")
    assert view is not None
    incoming_pod = body["Pod"]
    assert isinstance(incoming_pod, dict)
    new, _ = pod_from_k8s(incoming_pod, CONFIG.pod_defaults, CONFIG.policy.classes)
    assert (res["NodeNames"] == ["n1"]) == packing.fits(view, new)
    rejected = set(res["FailedNodes"]) | set(res["FailedAndUnresolvableNodes"])
    assert (res["NodeNames"] == []) == (rejected == {"n1"})
    assert not set(res["FailedNodes"]) & set(res["FailedAndUnresolvableNodes"])


def test_node_views_follow_every_change() -> None:
    """node_view is cached; every change to what it shows must drop the cache."""
    s = synced(node("n1"), node("n2"))

    def keys(name: str, exclude: str | None = None) -> list[str]:
        view = s.node_view(name, exclude)
        assert view is not None
        return sorted(p.key for p in view.pods)

    s.apply_pod("ADDED", pod("a", node_name="n1"))
    assert keys("n1") == ["default/a"]
    s.apply_pod("ADDED", pod("b", node_name="n1"))
    assert keys("n1") == ["default/a", "default/b"]
    s.apply_pod("DELETED", pod("a", node_name="n1"))
    assert keys("n1") == ["default/b"]
    s.apply_pod("MODIFIED", pod("b", node_name="n2"))
    assert keys("n1") == [] and keys("n2") == ["default/b"]
    s.apply_pod("ADDED", pod("c"))
    s.record_bind(s.pods["default/c"].pod, "n1", now=0.0)
    assert keys("n1") == ["default/c"]
    assert keys("n1", exclude="default/c") == []  # the pod being scheduled is left out, cache untouched
    assert keys("n1") == ["default/c"]
    s.ledger.expire(now=1e9)
    assert keys("n1") == []
    s.apply_node("MODIFIED", node("n1", cpu="8"))
    view = s.node_view("n1")
    assert view is not None and view.allocatable.cpu_milli == 8000
    s.replace_pods([pod("d", node_name="n1")], "2")
    assert keys("n1") == ["default/d"]
