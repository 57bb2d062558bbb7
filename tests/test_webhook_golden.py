"""Golden tests: the verbs on request bodies a real kube-scheduler sent (tests/golden/, see ORIGIN.md)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from extender.core import packing
from extender.core.model import InvalidInputError
from extender.kube.convert import CLASS_KEY
from extender.settings.extender import ExtenderConfig, SchedulingConfig
from extender.webhook import verbs
from tests.golden.replay import FULL_LOG, NODECACHE_LOG, V135_LOGS, Step, load_log, node_objects, replay

CONFIG = ExtenderConfig()


def _input_names(request: dict[str, Any]) -> list[str]:
    if request.get("NodeNames") is not None:
        return list(request["NodeNames"])
    return [n["metadata"]["name"] for n in request["Nodes"]["items"]]


def _steps(path: Any, verb: str) -> list[tuple[int, str]]:
    return [(e["seq"], e["request"]["Pod"]["metadata"]["name"]) for e in load_log(path) if e["verb"] == verb]


def test_golden_logs_are_what_origin_says() -> None:
    full, cache = load_log(FULL_LOG), load_log(NODECACHE_LOG)
    assert {e["verb"] for e in full} == {"filter", "prioritize", "preempt", "bind"}
    assert all(e["request"].get("NodeNames") is None for e in full if e["verb"] in ("filter", "prioritize"))
    assert all(e["request"].get("Nodes") is None for e in cache if e["verb"] in ("filter", "prioritize"))
    assert [n["metadata"]["name"] for n in node_objects()] == ["node-1", "node-2", "node-3"]


@pytest.mark.parametrize("path", [FULL_LOG, NODECACHE_LOG], ids=["nodeCacheCapable=false", "nodeCacheCapable=true"])
def test_filter_agrees_with_kube_scheduler_on_every_recorded_request(path: Any) -> None:
    """kube-scheduler sends the extender only nodes its own NodeResourcesFit found feasible: with the same
    state, our exact fit must accept every one of them, and answer in the shape of the mode."""
    seen = 0
    for step in replay(path, CONFIG):
        if step.verb != "filter":
            continue
        seen += 1
        req = step.request
        res = verbs.filter_nodes(req, step.snapshot, CONFIG, step.now).body
        names = _input_names(req)
        assert res["FailedNodes"] == {} and res["FailedAndUnresolvableNodes"] == {}, (step.event["seq"], res)
        assert res["Error"] == ""
        if req.get("NodeNames") is not None:
            assert res["Nodes"] is None
            assert res["NodeNames"] == names
        else:
            assert res["NodeNames"] is None
            assert res["Nodes"]["items"] == req["Nodes"]["items"]
    assert seen == len(_steps(path, "filter"))


def _step(path: Any, verb: str, seq: int, **kw: Any) -> Step:
    for step in replay(path, CONFIG, **kw):
        if step.verb == verb and step.event["seq"] == seq:
            return step
    raise AssertionError(f"no {verb} {seq}")


def test_filter_rejects_the_nodes_kube_scheduler_left_out_with_reasons() -> None:
    """filter-004 (low-3, 3 CPU): the scheduler sent only node-3. Offered all three nodes, we must reject
    node-1 (pod-a + low-1, bound by us, known only through the ledger here) with a reason. node-2 passes:
    low-2 is only *assumed* there inside kube-scheduler (its bind comes after this request in the log), and
    an extender cannot know about a pod before its bind."""
    step = _step(FULL_LOG, "filter", 4, watch_confirms=False)
    req = step.request
    req["Nodes"] = {"metadata": {}, "items": node_objects()}
    res = verbs.filter_nodes(req, step.snapshot, CONFIG, step.now).body
    assert [n["metadata"]["name"] for n in res["Nodes"]["items"]] == ["node-2", "node-3"]
    assert set(res["FailedNodes"]) == {"node-1"}
    assert "insufficient cpu" in res["FailedNodes"]["node-1"]
    assert "free 500m" in res["FailedNodes"]["node-1"]


def test_ledger_keeps_our_binding_visible_before_the_watch_shows_it() -> None:
    """filter 3 (low-2) in the nodecache log comes after bind 1 of nc-low-1 to node-1 with no watch update:
    only the ledger knows node-1 is taken. Offered node-1, filter must refuse it."""
    step = _step(NODECACHE_LOG, "filter", 3, watch_confirms=False)
    assert len(step.snapshot.ledger) >= 1
    req = step.request
    req["NodeNames"] = ["node-1", "node-2", "node-3"]
    res = verbs.filter_nodes(req, step.snapshot, CONFIG, step.now).body
    assert "node-1" in res["FailedNodes"]
    assert "node-1" not in res["NodeNames"]
    # Without the ledger (e.g. after TTL expiry) the same space would be offered twice.
    step.snapshot.ledger.expire(step.now + CONFIG.bind.ledger_ttl_seconds + 1)
    res = verbs.filter_nodes(req, step.snapshot, CONFIG, step.now + CONFIG.bind.ledger_ttl_seconds + 1).body
    assert "node-1" in res["NodeNames"]


def test_filter_node_groups_and_cordon_are_unresolvable() -> None:
    step = _step(FULL_LOG, "filter", 1)
    snap = step.snapshot
    nodes = node_objects()
    nodes[0]["metadata"]["labels"]["qos.kube-qos-extender.io/node-group"] = "batch"
    nodes[1]["spec"]["unschedulable"] = True
    snap.replace_nodes(nodes, "2", now=step.now)
    res = verbs.filter_nodes(step.request, snap, CONFIG, step.now).body
    assert [n["metadata"]["name"] for n in res["Nodes"]["items"]] == ["node-3"]
    assert "node group" in res["FailedAndUnresolvableNodes"]["node-1"]
    assert "cordoned" in res["FailedAndUnresolvableNodes"]["node-2"]
    assert res["FailedNodes"] == {}
    # A batch pod goes to the batch node and not to the unlabelled... unless unlabelled accepts any (default).
    batch = copy.deepcopy(step.request)
    batch["Pod"]["metadata"]["annotations"] = {"qos.kube-qos-extender.io/kind": "batch"}
    batch["Pod"]["metadata"]["resourceVersion"] += "-edited"  # request Pods are parsed once per version
    res = verbs.filter_nodes(batch, snap, CONFIG, step.now).body
    assert [n["metadata"]["name"] for n in res["Nodes"]["items"]] == ["node-1", "node-3"]


def test_filter_pod_larger_than_any_node_is_unresolvable() -> None:
    step = _step(FULL_LOG, "filter", 1)
    req = step.request
    req["Pod"] = copy.deepcopy(req["Pod"])
    req["Pod"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "5"
    res = verbs.filter_nodes(req, step.snapshot, CONFIG, step.now).body
    assert res["Nodes"]["items"] == []
    assert set(res["FailedAndUnresolvableNodes"]) == {"node-1", "node-2", "node-3"}
    assert "cpu 5000m > allocatable 4000m" in res["FailedAndUnresolvableNodes"]["node-1"]


@pytest.mark.parametrize("path", [FULL_LOG, NODECACHE_LOG], ids=["nodeCacheCapable=false", "nodeCacheCapable=true"])
def test_prioritize_every_recorded_request(path: Any) -> None:
    for step in replay(path, CONFIG):
        if step.verb != "prioritize":
            continue
        res = verbs.prioritize(step.request, step.snapshot, CONFIG, step.now).body
        names = _input_names(step.request)
        hosts = [h["Host"] for h in res]  # input order; hosts scoring 0 are left out (same as 0 upstream)
        assert hosts == [n for n in names if n in hosts]
        assert all(isinstance(h["Score"], int) and 0 < h["Score"] <= packing.MAX_EXTENDER_SCORE for h in res)
        # The node BFD would choose gets the top score.
        views = [step.snapshot.node_view(n) for n in names]
        pod_obj = step.request["Pod"]
        from extender.kube.convert import pod_from_k8s

        pod, _ = pod_from_k8s(pod_obj, CONFIG.pod_defaults, CONFIG.policy.classes)
        chosen = packing.bfd_choose([v for v in views if v is not None], pod)
        assert chosen is not None
        assert dict((h["Host"], h["Score"]) for h in res)[chosen.name] == 10


def test_prioritize_cost_packs_and_spread_spreads() -> None:
    """prioritize 2 (low-1, 3 CPU) with pod-a on node-1: BFD prefers node-1, LeastAllocated avoids it."""
    step = _step(FULL_LOG, "prioritize", 2)
    cost = {h["Host"]: h["Score"] for h in verbs.prioritize(step.request, step.snapshot, CONFIG, step.now).body}
    assert cost == {"node-1": 10, "node-2": 9, "node-3": 9}
    spread_cfg = CONFIG.model_copy(update=dict(scheduling=SchedulingConfig(profile="spread")))
    spread = {h["Host"]: h["Score"] for h in verbs.prioritize(step.request, step.snapshot, spread_cfg, step.now).body}
    assert spread["node-1"] < spread["node-2"] == spread["node-3"] == 10


def _victim_uids(request: dict[str, Any]) -> dict[str, set[str]]:
    if request.get("NodeNameToMetaVictims") is not None:
        return {n: {p["UID"] for p in v["Pods"]} for n, v in request["NodeNameToMetaVictims"].items()}
    return {n: {p["metadata"]["uid"] for p in v["Pods"]} for n, v in request["NodeNameToVictims"].items()}


@pytest.mark.parametrize("path", [FULL_LOG, NODECACHE_LOG], ids=["nodeCacheCapable=false", "nodeCacheCapable=true"])
def test_preempt_high_priority_pod_may_preempt_bronze_victims(path: Any) -> None:
    """preempt-001: a priority-1000 pod (gold by class_from_priority) vs priority-100 victims (bronze): the
    QoS rules allow every proposed victim, each node keeps exactly its victim, answered as meta victims."""
    step = _step(path, "preempt", 1)
    res = verbs.preempt(step.request, step.snapshot, CONFIG, step.now)
    proposed = _victim_uids(step.request)
    out = res.body["NodeNameToMetaVictims"]
    assert set(out) == set(proposed) == {"node-1", "node-2", "node-3"}
    for node, victims in out.items():
        assert {p["UID"] for p in victims["Pods"]} == proposed[node]
        assert victims["NumPDBViolations"] == 0
    assert res.victims_kept == 3 and res.victims_dropped == 0


@pytest.mark.parametrize("path", [FULL_LOG, NODECACHE_LOG], ids=["nodeCacheCapable=false", "nodeCacheCapable=true"])
def test_preempt_protects_more_important_victims(path: Any) -> None:
    """Same request, but the victims are gold and the preemptor bronze: below their safety margins, gold
    instances may not be preempted by a less important class (paper 002 §3.3.1) -> every node dropped."""
    step = _step(path, "preempt", 1)
    snap = step.snapshot
    for node, uids in _victim_uids(step.request).items():
        for uid in uids:
            key = snap.key_for_uid(uid)
            assert key is not None
            entry = snap.pods[key]
            snap.pods[key] = dataclasses.replace(entry, pod=dataclasses.replace(entry.pod, class_name="gold"))
            assert entry.pod.node_name == node
    req = step.request
    req["Pod"] = copy.deepcopy(req["Pod"])
    req["Pod"]["metadata"]["annotations"] = {CLASS_KEY: "bronze"}
    req["Pod"]["metadata"]["resourceVersion"] += "-edited"  # request Pods are parsed once per version
    res = verbs.preempt(req, snap, CONFIG, step.now)
    assert res.body == {"NodeNameToMetaVictims": {}}
    assert res.victims_dropped == 3


def test_preempt_never_returns_a_uid_it_was_not_given() -> None:
    step = _step(NODECACHE_LOG, "preempt", 1)
    req = step.request
    # Offer node-1 with no victim at all, and node-2 with an unknown UID only.
    req["NodeNameToMetaVictims"]["node-1"]["Pods"] = []
    req["NodeNameToMetaVictims"]["node-2"]["Pods"] = [{"UID": "00000000-0000-0000-0000-000000000000"}]
    res = verbs.preempt(req, step.snapshot, CONFIG, step.now).body["NodeNameToMetaVictims"]
    assert set(res) == {"node-3"}
    given = {p["UID"] for v in step.request["NodeNameToMetaVictims"].values() for p in v["Pods"]}
    assert all(p["UID"] in given for v in res.values() for p in v["Pods"])


def test_bind_bodies_parse() -> None:
    for path in (FULL_LOG, NODECACHE_LOG):
        for event in load_log(path):
            if event["verb"] == "bind":
                args = verbs.parse_bind_args(event["request"])
                assert args.node == event["request"]["Node"]
                assert args.uid == event["request"]["PodUID"]


def test_verbs_refuse_before_first_sync() -> None:
    from extender.kube.snapshot import Snapshot

    step = _step(FULL_LOG, "filter", 1)
    cold = Snapshot(CONFIG)
    with pytest.raises(verbs.NotReadyError):
        verbs.filter_nodes(step.request, cold, CONFIG, step.now)
    cold.replace_nodes(node_objects(), "1")
    with pytest.raises(verbs.NotReadyError):  # nodes alone are half a snapshot
        verbs.prioritize(step.request, cold, CONFIG, step.now)
    cold.replace_pods([], "1")
    assert verbs.prioritize(step.request, cold, CONFIG, step.now).body


def test_malformed_pod_in_golden_body_is_input_error() -> None:
    step = _step(FULL_LOG, "filter", 1)
    req = step.request
    req["Pod"] = copy.deepcopy(req["Pod"])
    req["Pod"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    with pytest.raises(InvalidInputError, match="cpu"):
        verbs.filter_nodes(req, step.snapshot, CONFIG, step.now)


# ----------------------------------------------------------------------------------------------------------------
# v1.35.8 recapture (tests/golden/capture.sh): the pinned kube-scheduler talking to this extender, pods carrying
# the routing marker (managedResources), both nodeCacheCapable modes. Each record holds the real extender's answer.

V135_IDS = ["v1.35.8-nodeCacheCapable=true", "v1.35.8-nodeCacheCapable=false"]


def test_v135_capture_is_what_origin_says() -> None:
    cache, full = (load_log(p) for p in V135_LOGS)
    for log in (cache, full):
        assert {e["verb"] for e in log} == {"filter", "prioritize", "preempt", "bind"}
        for e in log:
            pod = e["request"].get("Pod")
            if pod is not None:  # every pod that reached the extender requested the marker
                requests = pod["spec"]["containers"][0]["resources"]["requests"]
                assert requests.get(CONFIG.scheduling.marker_resource) == "1"
    assert all(e["request"].get("Nodes") is None for e in cache if e["verb"] in ("filter", "prioritize"))
    assert all(e["request"].get("NodeNames") is None for e in full if e["verb"] in ("filter", "prioritize"))
    assert all("NodeNameToMetaVictims" in e["request"] for e in cache if e["verb"] == "preempt")
    assert all(e["request"].get("NodeNameToVictims") for e in full if e["verb"] == "preempt")


@pytest.mark.parametrize("path", V135_LOGS, ids=V135_IDS)
def test_v135_filter_and_prioritize_answer_as_recorded(path: Any) -> None:
    """Replayed state, today's code: the same answers the extender gave the real scheduler. The one exception
    is a recorded race (nodeCacheCapable=false, filter 5): the preemption victim's deletion had not reached the
    extender's watch yet, so it answered 'insufficient cpu' and kube-scheduler retried (filter 6). The replay
    applies the deletion at once, so there the node passes."""
    checked = 0
    for step in replay(path, CONFIG):
        if step.verb not in ("filter", "prioritize"):
            continue
        fn = verbs.filter_nodes if step.verb == "filter" else verbs.prioritize
        got = fn(step.request, step.snapshot, CONFIG, step.now).body
        want = step.event["response"]
        if step.verb == "filter" and (want["FailedNodes"] or want["FailedAndUnresolvableNodes"]):
            assert set(want["FailedNodes"]) <= set(_input_names(step.request))
            assert got["FailedNodes"] == {} and got["FailedAndUnresolvableNodes"] == {}
            continue
        assert got == want, (step.verb, step.event["seq"])
        checked += 1
    assert checked >= 6


@pytest.mark.parametrize("path", V135_LOGS, ids=V135_IDS)
def test_v135_prioritize_packs_the_busier_node(path: Any) -> None:
    """low-1 (3 CPU) next to pod-a (0.5 CPU) on node-1: BFD ranks node-1 first, the two empty nodes tie."""
    step = _step(path, "prioritize", 2)
    scores = {h["Host"]: h["Score"] for h in verbs.prioritize(step.request, step.snapshot, CONFIG, step.now).body}
    assert scores["node-1"] == 10 and scores["node-2"] == scores["node-3"] < 10


@pytest.mark.parametrize("path", V135_LOGS, ids=V135_IDS)
def test_v135_preempt_keeps_bronze_victims_for_gold_and_only_given_uids(path: Any) -> None:
    step = _step(path, "preempt", 1)
    req = step.request
    got = verbs.preempt(req, step.snapshot, CONFIG, step.now).body["NodeNameToMetaVictims"]
    if req.get("NodeNameToMetaVictims"):
        given = {n: {p["UID"] for p in v["Pods"]} for n, v in req["NodeNameToMetaVictims"].items()}
    else:
        given = {n: {p["metadata"]["uid"] for p in v["Pods"]} for n, v in req["NodeNameToVictims"].items()}
    assert got and set(got) <= set(given)
    for node, victims in got.items():
        assert {p["UID"] for p in victims["Pods"]} <= given[node]
    assert got == step.event["response"]["NodeNameToMetaVictims"]
    # The same victims marked gold are protected from a gold preemptor (same class: run quantum, no relaxation).
    golden = copy.deepcopy(req)
    for node in given:
        for uid in given[node]:
            key = step.snapshot.key_for_uid(uid)
            assert key is not None
            entry = step.snapshot.pods[key]
            obj = {
                "metadata": {
                    "name": entry.pod.name,
                    "namespace": entry.pod.namespace,
                    "uid": uid,
                    "annotations": {CLASS_KEY: "gold"},
                },
                "spec": {
                    "nodeName": node,
                    "containers": [{"name": "c", "resources": {"requests": {"cpu": "3", "memory": "256Mi"}}}],
                },
                "status": {"phase": "Running"},
            }
            step.snapshot.apply_pod("MODIFIED", obj, now=step.now)
    assert verbs.preempt(golden, step.snapshot, CONFIG, step.now).body["NodeNameToMetaVictims"] == {}


@pytest.mark.parametrize("path", V135_LOGS, ids=V135_IDS)
def test_v135_bind_bodies_parse(path: Any) -> None:
    binds = [e for e in load_log(path) if e["verb"] == "bind"]
    assert len(binds) == 5
    for event in binds:
        args = verbs.parse_bind_args(event["request"])
        assert args.node == event["request"]["Node"] and args.uid == event["request"]["PodUID"]
        assert event["response"] == {"Error": ""}
