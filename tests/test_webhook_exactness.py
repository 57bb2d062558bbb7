"""Issue 17's exactness defects against kube-scheduler v1.35.8, one test (or more) each, plus the vectorised
filter/prioritize paths checked against the per-node reference on random clusters.

Bind runs against a ``Binder`` written here that plays the watch during the call (our interface; the API
server is not faked: the real binder runs in tests/test_webhook_live.py and e2e/).
"""

from __future__ import annotations

import asyncio
import copy
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.core import packing
from extender.core.model import InvalidInputError
from extender.kube.binding import BindArgs, BindError
from extender.kube.snapshot import Snapshot
from extender.settings.extender import ExtenderConfig
from extender.webhook import verbs
from tests.test_webhook_snapshot import node, pod, synced

CONFIG = ExtenderConfig()
NOW = 1_800_000_000.0


def args(p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": p, "NodeNames": names, "Nodes": None}


def with_rv(p: dict[str, Any], rv: str = "1") -> dict[str, Any]:
    p = copy.deepcopy(p)
    p["metadata"]["resourceVersion"] = rv
    return p


# --------------------------------------------------------------------------- 4. unknown node: unresolvable


def test_unknown_node_is_unresolvable_not_a_preemption_candidate() -> None:
    snap = synced(node("n1"))
    res = verbs.filter_nodes(args(pod("p"), ["n1", "ghost"]), snap, CONFIG, NOW)
    assert res.body["NodeNames"] == ["n1"]
    assert "ghost" in res.body["FailedAndUnresolvableNodes"]
    assert "ghost" not in res.body["FailedNodes"]
    assert res.filtered_out["unknown_node"] == 1


# ------------------------------------------------------------------ 7. unschedulable taint: ToleratesTaint


CORDON = "node.kubernetes.io/unschedulable"


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": CORDON, "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"key": CORDON, "operator": "Equal", "effect": "NoSchedule"}, True),  # empty value == taint's ""
        ({"key": CORDON, "operator": "Equal", "value": "", "effect": "NoSchedule"}, True),
        ({"key": CORDON, "effect": "NoSchedule"}, True),  # empty operator means Equal
        ({"key": CORDON}, True),  # empty effect matches every effect
        ({"operator": "Exists"}, True),  # empty key + Exists: everything
        ({"operator": "Equal"}, True),  # empty key matches any key, Equal "" == ""
        ({"key": CORDON, "operator": "Equal", "value": "true", "effect": "NoSchedule"}, False),
        ({"key": CORDON, "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": CORDON, "operator": "Exists", "effect": "PreferNoSchedule"}, False),
        ({"key": "other", "operator": "Exists"}, False),
        ({"key": CORDON, "operator": "Lt", "value": "5"}, False),  # the taint's "" is not an integer
        ({"key": CORDON, "operator": "Bogus"}, False),
    ],
)
def test_unschedulable_toleration_matches_upstream_tolerates_taint(toleration: dict[str, str], tolerated: bool) -> None:
    p = pod("p")
    p["spec"]["tolerations"] = [toleration]
    assert verbs.tolerates_unschedulable(p) is tolerated
    cordoned = node("n1")
    cordoned["spec"]["unschedulable"] = True
    snap = synced(cordoned, *[node(f"m{i}") for i in range(40)])  # 41 nodes: the vectorised path too
    for names in (["n1"], ["n1", *[f"m{i}" for i in range(40)]]):
        res = verbs.filter_nodes(args(p, names), snap, CONFIG, NOW).body
        assert ("n1" in res["NodeNames"]) is tolerated, (names[:2], res["FailedAndUnresolvableNodes"].get("n1"))


def _tolerating_pod() -> dict[str, Any]:
    p = pod("p", cpu="1")
    p["spec"]["tolerations"] = [{"key": CORDON, "operator": "Exists", "effect": "NoSchedule"}]
    return p


def test_prioritize_scores_a_cordoned_node_the_pod_tolerates_like_the_filter() -> None:
    """The filter passes a cordoned node to a pod tolerating the unschedulable taint: prioritize must not
    then score it 0 (its best fit), on the per-node path (1 node) nor on the vectorised one (41 nodes)."""
    cordoned = node("n1", cpu="2")  # the tightest fit: bfd's best
    cordoned["spec"]["unschedulable"] = True
    snap = synced(cordoned, *[node(f"m{i}", cpu="8") for i in range(40)])
    for names in (["n1"], ["n1", *[f"m{i}" for i in range(40)]]):
        for p, scored in ((_tolerating_pod(), True), (pod("q", cpu="1"), False)):
            res = verbs.prioritize(args(p, names), snap, CONFIG, NOW).body
            hosts = {h["Host"]: h["Score"] for h in res}
            assert ("n1" in hosts) is scored, (len(names), p["metadata"]["name"], hosts)
            if scored:
                assert hosts["n1"] == max(hosts.values())


def test_preempt_keeps_a_cordoned_node_the_pod_tolerates() -> None:
    cordoned = node("n1", cpu="4")
    cordoned["spec"]["unschedulable"] = True
    snap = synced(cordoned)
    running = [pod(f"v{i}", cpu="1", node_name="n1") for i in range(3)]
    for r in running:
        r["metadata"]["creationTimestamp"] = "2027-01-15T08:00:00Z"
        r["status"]["startTime"] = "2027-01-15T08:00:05Z"
    snap.replace_pods(running, "2", now=NOW)
    pending = pod("hi", cpu="2")
    pending["spec"]["priority"] = 1000
    pending["metadata"]["creationTimestamp"] = "2027-01-15T08:30:00Z"
    res = verbs.preempt(_preempt_args(pending, {"n1": ["v0", "v1"]}), snap, CONFIG, NOW)
    assert res.body["NodeNameToMetaVictims"] == {}  # not tolerated: the cordon drops the node
    pending["spec"]["tolerations"] = [{"key": CORDON, "operator": "Exists"}]
    pending["metadata"]["uid"] = "uid-hi-tolerating"
    res = verbs.preempt(_preempt_args(pending, {"n1": ["v0", "v1"]}), snap, CONFIG, NOW)
    assert set(res.body["NodeNameToMetaVictims"]) == {"n1"}


# --------------------------------------------------------------------------- 2. preempt: whole set or none


def _running(prefix: str, node_name: str, n: int) -> list[dict[str, Any]]:
    """``n`` bronze pods of 1 cpu on ``node_name``, started half an hour before the pending pod."""
    out = [pod(f"{prefix}{i}", cpu="1", node_name=node_name) for i in range(n)]
    for r in out:
        r["metadata"]["creationTimestamp"] = "2027-01-15T08:00:00Z"
        r["status"]["startTime"] = "2027-01-15T08:00:05Z"
    return out


def _gold_pending() -> dict[str, Any]:
    pending = pod("hi", cpu="2")
    pending["spec"]["priority"] = 1000  # gold by class_from_priority
    pending["metadata"]["creationTimestamp"] = "2027-01-15T08:30:00Z"
    return pending


def _preempt_setup() -> tuple[Snapshot, dict[str, Any]]:
    """n1 (4 cpu) holds three bronze pods of 1 cpu; a gold pending pod of 2 cpu needs two of them gone."""
    snap = synced(node("n1", cpu="4"), node("n2", cpu="4"))
    snap.replace_pods(_running("v", "n1", 3) + _running("w", "n2", 3), "2", now=NOW)
    return snap, _gold_pending()


def _preempt_args(pending: dict[str, Any], victims: dict[str, list[str]]) -> dict[str, Any]:
    return {
        "Pod": pending,
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            n: {"Pods": [{"UID": f"uid-{v}"} for v in vs], "NumPDBViolations": 1} for n, vs in victims.items()
        },
    }


def test_preempt_returns_the_whole_proposed_set_even_when_our_view_needs_fewer() -> None:
    """Upstream proposes a minimal set counting nominated pods we cannot see: three victims where our
    snapshot would need one. Narrowing to one would evict too few and start another round."""
    snap, pending = _preempt_setup()
    res = verbs.preempt(_preempt_args(pending, {"n1": ["v2", "v0", "v1"]}), snap, CONFIG, NOW)
    out = res.body["NodeNameToMetaVictims"]
    assert out == {"n1": {"Pods": [{"UID": "uid-v2"}, {"UID": "uid-v0"}, {"UID": "uid-v1"}], "NumPDBViolations": 1}}
    assert (res.victims_kept, res.victims_dropped) == (3, 0)


def test_preempt_drops_a_node_when_any_proposed_victim_is_protected_or_unknown() -> None:
    snap, pending = _preempt_setup()
    gold = pod("g", cpu="1", node_name="n2", uid="uid-g")
    gold["spec"]["priority"] = 1000
    gold["metadata"]["creationTimestamp"] = "2027-01-15T08:29:00Z"
    gold["status"]["startTime"] = "2027-01-15T08:29:30Z"  # gold, just started: protected by its run quantum
    snap.apply_pod("ADDED", gold, now=NOW)
    victims = {"n1": ["v0", "v1", "not-there"], "n2": ["w0", "w1", "g"]}
    res = verbs.preempt(_preempt_args(pending, victims), snap, CONFIG, NOW)
    assert res.body["NodeNameToMetaVictims"] == {}
    assert (res.victims_kept, res.victims_dropped) == (0, 6)


def test_preempt_drops_a_node_of_a_group_the_pod_may_not_use() -> None:
    """kube-scheduler offers as preemption candidates the nodes its own plugins failed (Insufficient cpu), which
    never reached our filter, where a node of the wrong group is unresolvable: a batch pod's victims on a
    service node would be evicted for room the pod may not take (the kind demo: a silver batch pod preempted
    two bronze services on service nodes, then preempted again on a batch node). The same victims on a batch
    node, and on the service node with node_groups.enforce off, are kept."""
    group = "qos.kube-qos-extender.io/node-group"
    snap = synced(node("svc", cpu="4", **{group: "service"}), node("bat", cpu="4", **{group: "batch"}))
    running = _running("s", "svc", 4) + _running("b", "bat", 4)
    snap.replace_pods(running, "2", now=NOW)
    pending = _gold_pending()
    pending["metadata"]["annotations"] = {"qos.kube-qos-extender.io/kind": "batch"}
    victims = {"svc": ["s0", "s1"], "bat": ["b0", "b1"]}
    res = verbs.preempt(_preempt_args(pending, victims), snap, snap.config, NOW)
    assert set(res.body["NodeNameToMetaVictims"]) == {"bat"}
    assert (res.victims_kept, res.victims_dropped) == (2, 2)
    lax = ExtenderConfig.model_validate({"node_groups": {"enforce": False}})
    relaxed = Snapshot(lax)
    relaxed.replace_nodes([node("svc", cpu="4", **{group: "service"}), node("bat", cpu="4", **{group: "batch"})], "1")
    relaxed.replace_pods(running, "2", now=NOW)
    res = verbs.preempt(_preempt_args(pending, victims), relaxed, lax, NOW)
    assert set(res.body["NodeNameToMetaVictims"]) == {"svc", "bat"}


def test_preempt_drops_a_node_where_the_whole_set_does_not_free_enough() -> None:
    snap, pending = _preempt_setup()
    res = verbs.preempt(_preempt_args(pending, {"n1": ["v0"]}), snap, CONFIG, NOW)  # 1 cpu free + 1 < 2? no: 2
    assert "n1" in res.body["NodeNameToMetaVictims"]
    big = copy.deepcopy(pending)
    big["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "3"
    big["metadata"]["uid"] = "uid-big"
    res = verbs.preempt(_preempt_args(big, {"n1": ["v0"]}), snap, CONFIG, NOW)
    assert res.body["NodeNameToMetaVictims"] == {}


# ------------------------------------------------------------------ 3. bind: assume before the Binding POST


class WatchingBinder:
    """A Binder that checks what a concurrent filter would see during the POST and can play a watch event
    (the pod deleted) before answering."""

    def __init__(
        self,
        snap: Snapshot,
        delete: dict[str, Any] | None = None,
        fail: bool = False,
        raises: BaseException | None = None,
    ) -> None:
        self.snap = snap
        self.delete = delete
        self.fail = fail
        self.raises = raises
        self.seen_during_call: list[tuple[int, int]] = []

    async def bind(self, a: BindArgs) -> int:
        requested, count = self.snap.requested_on(a.node)
        self.seen_during_call.append((requested.cpu_milli, count))
        await asyncio.sleep(0)
        if self.delete is not None:
            self.snap.apply_pod("DELETED", self.delete, now=NOW)
        if self.fail:
            raise BindError("refused")
        if self.raises is not None:
            raise self.raises
        return 0


def _bind_args(p: dict[str, Any], node_name: str) -> BindArgs:
    m = p["metadata"]
    return BindArgs(m["namespace"], m["name"], m["uid"], node_name)


async def test_bind_assumes_the_pod_before_the_post_returns() -> None:
    snap = synced(node("n1", cpu="4"))
    p = pod("p", cpu="1500m")
    snap.apply_pod("ADDED", p, now=NOW)
    binder = WatchingBinder(snap)
    body, _ = await verbs.bind(_bind_args(p, "n1"), snap, binder, NOW)
    assert body == {"Error": ""}
    assert binder.seen_during_call == [(1500, 1)]  # a filter during the POST already counts it
    assert "default/p" in snap.ledger


async def test_bind_failure_drops_the_assumption() -> None:
    snap = synced(node("n1", cpu="4"))
    p = pod("p", cpu="1500m")
    snap.apply_pod("ADDED", p, now=NOW)
    with pytest.raises(BindError):
        await verbs.bind(_bind_args(p, "n1"), snap, WatchingBinder(snap, fail=True), NOW)
    assert "default/p" not in snap.ledger and snap.requested_on("n1") == (snap.requested_on("n1")[0], 0)
    assert "default/p" not in snap.bound_at


@pytest.mark.parametrize(
    "raised",
    [asyncio.CancelledError(), BindError("timed out", in_doubt=True), TimeoutError(), RuntimeError("bug")],
    ids=["cancelled", "in-doubt", "timeout", "other"],
)
async def test_bind_that_may_have_been_applied_stays_assumed_until_the_ttl(raised: BaseException) -> None:
    """Cancelled (kube-scheduler's httpTimeout), timed out, or broken after the POST may have been sent: the
    Binding may exist, so the space stays taken until the watch shows the pod or the ledger's TTL ends."""
    snap = synced(node("n1", cpu="4"))
    p = pod("p", cpu="1500m")
    snap.apply_pod("ADDED", p, now=NOW)
    with pytest.raises(type(raised)):
        await verbs.bind(_bind_args(p, "n1"), snap, WatchingBinder(snap, raises=raised), NOW)
    assert "default/p" in snap.ledger
    assert snap.requested_on("n1")[0].cpu_milli == 1500
    snap.ledger.expire(NOW + snap.ledger.ttl_seconds)
    assert "default/p" not in snap.ledger and snap.requested_on("n1")[1] == 0


async def test_in_doubt_bind_is_confirmed_by_the_watch() -> None:
    snap = synced(node("n1", cpu="4"))
    p = pod("p", cpu="1500m")
    snap.apply_pod("ADDED", p, now=NOW)
    with pytest.raises(BindError):
        await verbs.bind(_bind_args(p, "n1"), snap, WatchingBinder(snap, raises=BindError("t", in_doubt=True)), NOW)
    bound = copy.deepcopy(p)
    bound["spec"]["nodeName"] = "n1"
    snap.apply_pod("MODIFIED", bound, now=NOW)
    assert "default/p" not in snap.ledger  # the watch accounts for it now, once
    assert snap.requested_on("n1")[0].cpu_milli == 1500 and snap.requested_on("n1")[1] == 1


async def test_pod_deleted_during_the_bind_is_not_assumed_afterwards() -> None:
    snap = synced(node("n1", cpu="4"))
    p = pod("p", cpu="1500m")
    snap.apply_pod("ADDED", p, now=NOW)
    body, _ = await verbs.bind(_bind_args(p, "n1"), snap, WatchingBinder(snap, delete=p), NOW)
    assert body == {"Error": ""}
    assert "default/p" not in snap.ledger
    assert snap.requested_on("n1")[1] == 0  # the deleted pod does not hold space for the ledger's TTL


async def test_bind_assumes_a_pod_the_watch_has_not_delivered_from_its_filter_request() -> None:
    snap = synced(node("n1", cpu="4"))
    p = with_rv(pod("late", cpu="1"))
    verbs.filter_nodes(args(p, ["n1"]), snap, CONFIG, NOW)  # kube-scheduler filters before it binds
    assert "default/late" not in snap.pods
    binder = WatchingBinder(snap)

    async def read_pod(namespace: str, name: str) -> dict[str, Any]:
        return p  # the API server's copy: ours (qos-scheduler) and unbound, which the bind verb checks first

    await verbs.bind(_bind_args(p, "n1"), snap, binder, NOW, read_pod)
    assert binder.seen_during_call == [(1000, 1)]
    assert "default/late" in snap.ledger


# ------------------------------------------------------------------------ parse once per UID + version


def test_request_pod_is_parsed_once_per_uid_and_resource_version() -> None:
    snap = synced(node("n1"))
    p = with_rv(pod("p"))
    verbs.filter_nodes(args(p, ["n1"]), snap, CONFIG, NOW)
    first = snap.request_pods.get("uid-p", "1")
    verbs.prioritize(args(copy.deepcopy(p), ["n1"]), snap, CONFIG, NOW)
    assert snap.request_pods.get("uid-p", "1") is first
    changed = with_rv(p, "2")
    changed["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "3"
    verbs.filter_nodes(args(changed, ["n1"]), snap, CONFIG, NOW)
    assert snap.request_pods.get("uid-p", "2")[0].requests.cpu_milli == 3000  # type: ignore[index]
    snap.apply_pod("DELETED", changed, now=NOW)
    assert snap.request_pods.latest("uid-p") is None


def test_filter_reuses_the_watchs_parse_of_the_same_version_and_only_that() -> None:
    """A released pod usually reaches the filter in the version the watch has parsed already: the verb takes
    that parse (the very object) instead of parsing kube-scheduler's copy again. Another version, a bound
    entry or other settings parse the request's copy, whose content then decides."""
    snap = synced(node("n1", cpu="4"))
    cfg = snap.config  # the settings the snapshot parsed under, as the webhook serves them
    watched = with_rv(pod("p", cpu="1"), "7")
    watched["metadata"]["annotations"] = {"qos.kube-qos-extender.io/class": "no-such-class"}
    snap.apply_pod("MODIFIED", watched, now=NOW)
    out = verbs.filter_nodes(args(copy.deepcopy(watched), ["n1"]), snap, cfg, NOW)
    assert snap.request_pods.get("uid-p", "7")[0] is snap.pods["default/p"].pod  # type: ignore[index]
    assert out.body["NodeNames"] == ["n1"]
    # the bad annotation still reaches the Event path, as when the request's copy is parsed
    assert out.problems is not None and out.problems.problems == snap.pods["default/p"].problems
    fresh = verbs.filter_nodes(args(copy.deepcopy(watched), ["n1"]), synced(node("n1", cpu="4")), cfg, NOW)
    assert fresh.problems is not None and fresh.problems.problems == out.problems.problems

    # kube-scheduler already holds a newer version (the watch lags): its copy is parsed and decides
    newer = with_rv(pod("p", cpu="8"), "8")
    out = verbs.filter_nodes(args(newer, ["n1"]), snap, cfg, NOW)
    assert out.body["NodeNames"] == [] and snap.request_pods.get("uid-p", "8")[0].requests.cpu_milli == 8000  # type: ignore[index]

    # a bound entry of the same version is not an unbound pod's parse (its start time, its node)
    bound = with_rv(pod("q", cpu="1", node_name="n1"), "3")
    snap.apply_pod("ADDED", bound, now=NOW)
    request = copy.deepcopy(bound)
    request["spec"]["nodeName"] = None
    verbs.filter_nodes(args(request, ["n1"]), snap, cfg, NOW)
    assert snap.request_pods.get("uid-q", "3")[0] is not snap.pods["default/q"].pod  # type: ignore[index]

    # settings other than the snapshot's: parsed under the caller's
    other = with_rv(pod("r", cpu="1"), "5")
    snap.apply_pod("ADDED", other, now=NOW)
    verbs.filter_nodes(args(copy.deepcopy(other), ["n1"]), snap, ExtenderConfig(), NOW)
    assert snap.request_pods.get("uid-r", "5")[0] is not snap.pods["default/r"].pod  # type: ignore[index]


# ------------------------------------------------------------- vectorised paths == per-node reference


def _random_cluster(seed: int, n: int) -> tuple[Snapshot, list[dict[str, Any]]]:
    rng = random.Random(seed)
    nodes = []
    for i in range(n):
        labels = {}
        if rng.random() < 0.3:
            labels["qos.kube-qos-extender.io/node-group"] = rng.choice(["batch", "service"])
        nd = node(f"n{i}", cpu=str(rng.choice([1, 2, 4])), memory=f"{rng.choice([2, 4, 8])}Gi",
                  pods=str(rng.choice([2, 3, 110])), **labels)  # fmt: skip
        if rng.random() < 0.1:
            nd["spec"]["unschedulable"] = True
        nodes.append(nd)
    snap = synced(*nodes)
    pods = []
    for j in range(n * 2):
        pods.append(pod(f"r{j}", cpu=f"{rng.choice([100, 250, 500, 1000])}m",
                        memory=f"{rng.choice([128, 512, 1024])}Mi", node_name=f"n{rng.randrange(n)}"))  # fmt: skip
    snap.replace_pods(pods, "2", now=NOW)
    for j in range(n // 4):  # assumed bindings not watched yet
        snap.record_bind(verbs._pod(args(pod(f"a{j}", cpu="300m"), []), CONFIG)[0], f"n{rng.randrange(n)}", NOW)
    return snap, nodes


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), cpu=st.sampled_from(["100m", "700m", "1500m", "5"]), unknown=st.booleans())
def test_vectorised_filter_and_prioritize_equal_the_per_node_reference(seed: int, cpu: str, unknown: bool) -> None:
    snap, _ = _random_cluster(seed, 48)
    names = [f"n{i}" for i in range(48)] + (["ghost"] if unknown else [])
    random.Random(seed).shuffle(names)
    p = with_rv(pod("pending", cpu=cpu, memory="700Mi"), str(seed))
    if seed % 3 == 0:  # the pod itself already held on a node (an assumed bind): excluded on that node
        snap.record_bind(verbs._pod(args(p, []), CONFIG)[0], names[0] if names[0] != "ghost" else names[1], NOW)
    got = verbs.filter_nodes(args(p, names), snap, CONFIG, NOW)
    assert len(names) >= verbs._VECTOR_MIN_NODES
    f = verbs._FilterInput(verbs._pod(args(p, []), CONFIG)[0].requests, packing_group(p), True, False,
                           "default/pending", verbs._pod(args(p, []), CONFIG)[0].kind)  # fmt: skip
    want_pass = [n for n in names if verbs._judge(n, snap, f) is None]
    assert got.body["NodeNames"] == want_pass
    # prioritize: vectorised BFD ranks == packing.score_nodes over node views
    scores = {h["Host"]: h["Score"] for h in verbs.prioritize(args(p, names), snap, CONFIG, NOW).body}
    core = verbs._pod(args(p, []), CONFIG)[0]
    views = [
        v
        for n in names
        if (e := snap.nodes.get(n)) is not None and packing_group(p) & e.accepts
        if (v := snap.node_view(n, exclude=core.key)) is not None
    ]
    want = packing.score_nodes("cost", views, core, NOW, CONFIG.scheduling.scaling_cycle_seconds)
    assert scores == {n: want[n] for n in names if want.get(n, 0) > 0}


def packing_group(p: dict[str, Any]) -> Any:
    return verbs._group_needed(verbs._pod(args(p, []), CONFIG)[0])


def test_preempt_table_precheck_equals_the_per_node_path(monkeypatch: pytest.MonkeyPatch) -> None:
    snap, _ = _random_cluster(7, 60)
    pending = pod("hi", cpu="1500m")
    pending["spec"]["priority"] = 1000
    pending["metadata"]["creationTimestamp"] = "2027-01-15T08:30:00Z"
    by_node: dict[str, list[str]] = {}
    for e in snap.pods.values():
        if e.pod.node_name is not None:
            by_node.setdefault(e.pod.node_name, []).append(e.pod.uid)
    body = {
        "Pod": pending,
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            n: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0} for n, uids in sorted(by_node.items())
        },
    }
    assert len(by_node) >= verbs._VECTOR_MIN_NODES
    fast = verbs.preempt(copy.deepcopy(body), snap, CONFIG, NOW)
    monkeypatch.setattr(verbs, "_VECTOR_MIN_NODES", 10**9)
    slow = verbs.preempt(copy.deepcopy(body), snap, CONFIG, NOW)
    assert fast.body == slow.body and fast.body["NodeNameToMetaVictims"]
    assert (fast.victims_kept, fast.victims_dropped) == (slow.victims_kept, slow.victims_dropped)


def test_bind_args_keep_string_values_as_given() -> None:
    """The common body (plain strings) and a caller's str subclass parse to the same values; a wrong type is
    named by its field."""

    class Name(str):
        def __str__(self) -> str:
            return "not the value"

    body = {"PodName": "p", "PodNamespace": "default", "PodUID": "", "Node": "n1"}
    assert verbs.parse_bind_args(body) == BindArgs("default", "p", "", "n1")
    args = verbs.parse_bind_args({**body, "PodName": Name("p")})
    assert args == BindArgs("default", "p", "", "n1") and type(args.name) is Name
    with pytest.raises(InvalidInputError, match="Node must be a non-empty string"):
        verbs.parse_bind_args({**body, "Node": 7})
