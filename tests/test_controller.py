"""QoS controller without a cluster: accounting, observation, the pure decision pass, release patches.

The decision pass is checked against the rules it must obey (paper 002 Algorithm 1 and §3.3.1 as implemented
by extender.core.qos): increasing-Q order, no victim below its margin except by the importance relaxations,
the same-class overhead cap, pinning, the gate bound, and agreement with the simulator's call pattern.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.controller.accounting import (
    Account,
    RequestState,
    decode_account,
    derivable_from_pod,
    due_writes,
    encode_account,
)
from extender.controller.decide import GatedPod, Settings, World, decide
from extender.controller.observe import observe
from extender.controller.patches import admission_patch, owner_instance, release_patch, route_known
from extender.controller.state import PodInfo, pod_info
from extender.core import qos
from extender.core.model import DEFAULT_CLASSES, InvalidInputError, Node, Pod, Resources

GATE = "qos.kube-qos-extender.io/ordering"
SLOT = Resources.request(375, 384 * 2**20, 1)
HOST = Resources(3750, 3840 * 2**20, 110)
POLICY = qos.QosPolicy(classes=DEFAULT_CLASSES, alpha_seconds=2.0)


def pod(name: str, cls: str, node: str | None = None) -> Pod:
    return Pod(name, SLOT, request_id=f"default/ReplicaSet/{name}", class_name=cls, node_name=node)


def running_acc(cls: str, e: float, p: float, now: float, run: float = 1000.0, **kw: Any) -> Account:
    return Account(e, p, RequestState.RUNNING, now, 0.0, cls, run_started=now - run, **kw)


def pending_acc(cls: str, e: float, p: float, now: float) -> Account:
    return Account(e, p, RequestState.PENDING, now, 0.0, cls)


def full_node(name: str, members: list[tuple[str, str]]) -> Node:
    return Node(name, HOST, pods=tuple(pod(n, c, name) for n, c in members))


# ------------------------------------------------------------------------------------------- accounting


def test_account_folds_time_into_the_state_it_was_in() -> None:
    acc = Account.admit("silver", 100.0)
    acc = acc.transition(RequestState.RUNNING, 110.0)  # 10 s pending
    acc = acc.transition(RequestState.PENDING, 140.0)  # 30 s running
    assert acc.ep(150.0) == (30.0, 20.0)
    assert acc.availability(150.0) == pytest.approx(0.6)
    assert acc.starts == 1


def test_restart_after_preemption_records_allocation_overhead() -> None:
    acc = Account.admit("gold", 0.0).transition(RequestState.RUNNING, 1.0)
    acc = acc.preempted().transition(RequestState.PENDING, 50.0).released(60.0)
    acc = acc.transition(RequestState.RUNNING, 62.5)
    assert acc.preemptions == 1
    assert acc.overhead == pytest.approx(2.5)  # release -> Running of the restart (Eq. 8 alpha^1)


def test_transition_never_runs_time_backwards() -> None:
    acc = Account.admit("bronze", 100.0)
    moved = acc.transition(RequestState.RUNNING, 90.0)
    assert moved.since == 100.0
    assert moved.ep(100.0) == (0.0, 0.0)


def test_account_annotation_round_trip_and_rejects_garbage() -> None:
    acc = Account(12.5, 3.25, RequestState.RUNNING, 1000.0, 900.0, "silver", 2, 1.5, 3, 990.0, None)
    assert decode_account(encode_account(acc)) == acc
    for bad in ("nope", "{}", '{"v":1,"e":-1,"p":0,"state":"running","since":1,"admitted":1,"class":"x"}'):
        with pytest.raises(InvalidInputError):
            decode_account(bad)


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 100)), max_size=30))
def test_e_plus_p_is_elapsed_time(steps: list[tuple[bool, float]]) -> None:
    acc = Account.admit("silver", 0.0)
    t = 0.0
    for running, dt in steps:
        t += dt
        acc = acc.transition(RequestState.RUNNING if running else RequestState.PENDING, t)
    e, p = acc.ep(t + 1.0)
    assert e + p == pytest.approx(t + 1.0)


# ------------------------------------------------------------------------------------------- observation


def info(
    name: str, running: bool, created: float, *, request: str | None = None, since: float | None = None
) -> PodInfo:
    return PodInfo(
        key=f"default/{name}",
        uid=name,
        request=request or f"default/ReplicaSet/{name}",
        owner_kind="ReplicaSet",
        owner_name=name,
        gated=not running,
        phase="Running" if running else "Pending",
        running=running,
        deleting=False,
        node_name="n1" if running else None,
        created=created,
        running_since=since,
        pinned_node=None,
        spec={},
    )


def test_observe_admits_and_tracks_transitions() -> None:
    obs = observe({}, [info("a", False, 10.0)], {"default/a": "gold"}, 12.0)
    acc = obs.accounts["default/ReplicaSet/a"]
    assert acc.state is RequestState.PENDING and acc.ep(12.0) == (0.0, 2.0) and acc.class_name == "gold"
    obs = observe(obs.accounts, [info("a", True, 10.0)], {"default/a": "gold"}, 15.0)
    assert obs.accounts["default/ReplicaSet/a"].ep(20.0) == (5.0, 5.0)
    assert obs.changed == {"default/ReplicaSet/a"}


def test_rebuild_dates_missed_transitions_from_pod_timestamps() -> None:
    """After a restart, a request stored as pending whose pod has been Running since t=30 gets its e from 30,
    not from the restart time: nothing is lost beyond the timestamps' granularity, nothing resets."""
    stored = {"default/ReplicaSet/a": Account(100.0, 10.0, RequestState.PENDING, 20.0, 0.0, "silver")}
    obs = observe(stored, [info("a", True, 25.0, since=30.0)], {}, 60.0, rebuild=True)
    assert obs.accounts["default/ReplicaSet/a"].ep(60.0) == (130.0, 20.0)
    plain = observe(stored, [info("a", True, 25.0, since=30.0)], {}, 60.0, rebuild=False)
    assert plain.accounts["default/ReplicaSet/a"].ep(60.0) == (100.0, 50.0)


def test_a_bare_pods_account_is_derivable_exactly_while_its_timestamps_rebuild_it() -> None:
    """The accounts the controller does not write (bare pods, no history): a restart's rebuild from the pod's
    own timestamps gives the same e and p, and any history (preemption, second start) makes it written."""
    bare = "default/solo"
    pod_info = info("solo", False, 10.0, request=bare)
    live = observe({}, [pod_info], {}, 10.0)  # admitted at creation
    assert derivable_from_pod(live.accounts[bare])
    running = info("solo", True, 10.0, request=bare, since=14.0)
    live = observe(live.accounts, [running], {}, 14.0)  # the watch sees it Running at 14
    acc = live.accounts[bare]
    assert derivable_from_pod(acc)
    rebuilt = observe({}, [running], {}, 50.0, rebuild=True).accounts[bare]  # a restart at 50, nothing stored
    assert rebuilt.ep(60.0) == acc.ep(60.0) == (46.0, 4.0)
    assert not derivable_from_pod(acc.preempted())
    again = acc.transition(RequestState.PENDING, 20.0)
    assert not derivable_from_pod(again)  # back to pending: the first run is not on the pods any more
    assert not derivable_from_pod(again.transition(RequestState.RUNNING, 25.0))


def test_vanished_pod_makes_the_request_pending_then_finished() -> None:
    stored = {"r": Account(10.0, 0.0, RequestState.RUNNING, 10.0, 0.0, "gold", run_started=0.0)}
    obs = observe(stored, [], {}, 20.0, absent_grace=100.0)
    assert obs.accounts["r"].state is RequestState.PENDING and obs.accounts["r"].ep(20.0) == (20.0, 0.0)
    later = observe(obs.accounts, [], {}, 200.0, absent_grace=100.0)
    assert "r" not in later.accounts and later.finished == {"r"}


def test_pod_info_reads_gate_owner_phase_and_pin() -> None:
    obj = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": True}],
        },
        "spec": {
            "schedulingGates": [{"name": GATE}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n7"]}]}
                        ]
                    }
                }
            },
        },
        "status": {"phase": "Pending"},
    }
    got = pod_info(obj, GATE, "x")
    assert (got.request, got.gated, got.running, got.pinned_node) == ("ns/ReplicaSet/rs", True, False, "n7")


# ----------------------------------------------------------------------------------------------- decide


def world(nodes: list[Node], accounts: dict[str, Account], gated: list[GatedPod], now: float = 5000.0) -> World:
    running = {p.key: p.request_id for n in nodes for p in n.pods if p.request_id in accounts}
    return World(nodes, running, gated, accounts, now)


def gate(name: str, cls: str, since: float = 4990.0) -> GatedPod:
    return GatedPod(pod(name, cls), f"default/ReplicaSet/{name}", since)


def test_free_space_releases_in_increasing_q_and_pins() -> None:
    now = 5000.0
    node = full_node("n1", [(f"x{i}", "bronze") for i in range(9)])  # one slot left
    accounts = {f"default/ReplicaSet/x{i}": running_acc("bronze", 100, 100, now, run=10.0) for i in range(9)}
    accounts["default/ReplicaSet/a"] = pending_acc("gold", 100, 50, now)  # Q = 100 - 150 - 2 < 0
    accounts["default/ReplicaSet/b"] = pending_acc("bronze", 100, 10, now)  # Q = 200 - 110 - 2 > 0
    d = decide(world([node], accounts, [gate("b", "bronze"), gate("a", "gold")]), POLICY, Settings(), random.Random(1))
    assert d.order == ("default/a", "default/b")
    assert [(r.pod, r.node) for r in d.releases] == [("default/a", "n1")]  # b does not fit any more
    assert not d.evictions


def test_preemption_follows_the_qos_rules_and_reports_why() -> None:
    now = 5000.0
    members = [(f"v{i}", "bronze") for i in range(10)]
    node = full_node("n1", members)
    accounts = {f"default/ReplicaSet/v{i}": running_acc("bronze", 1000.0 + i, 0.0, now) for i in range(10)}
    accounts["default/ReplicaSet/g"] = pending_acc("gold", 100.0, 20.0, now)
    d = decide(world([node], accounts, [gate("g", "gold")]), POLICY, Settings(), random.Random(1))
    assert len(d.evictions) == 1
    ev = d.evictions[0]
    assert ev.victim == "default/v9"  # largest Q goes first
    assert ev.for_pod == "default/g" and ev.reason == "qos" and ev.q_victim > ev.q_pending
    assert d.releases[0].node == "n1" and d.releases[0].victims == ("default/v9",)


def test_no_victim_below_its_margin_for_a_less_important_class() -> None:
    now = 5000.0
    node = full_node("n1", [(f"g{i}", "gold") for i in range(10)])
    accounts = {f"default/ReplicaSet/g{i}": running_acc("gold", 1000.0, 0.0, now) for i in range(10)}  # Q = -2
    accounts["default/ReplicaSet/b"] = pending_acc("bronze", 10.0, 1000.0, now)  # violating badly
    d = decide(world([node], accounts, [gate("b", "bronze")]), POLICY, Settings(), random.Random(1))
    assert not d.evictions and not d.releases


def test_overhead_cap_protects_a_same_class_victim() -> None:
    now = 5000.0
    node = full_node("n1", [(f"s{i}", "silver") for i in range(10)])
    accounts = {
        f"default/ReplicaSet/s{i}": running_acc("silver", 1000.0, 0.0, now, preemptions=3, overhead=200.0)
        for i in range(10)
    }  # O = 0.2 > 1 - 0.9
    accounts["default/ReplicaSet/p"] = pending_acc("silver", 10.0, 500.0, now)
    d = decide(world([node], accounts, [gate("p", "silver")]), POLICY, Settings(), random.Random(1))
    assert not d.evictions


def test_gate_held_too_long_is_released_unpinned() -> None:
    node = full_node("n1", [(f"g{i}", "gold") for i in range(10)])
    accounts = {f"default/ReplicaSet/g{i}": running_acc("gold", 1000.0, 0.0, 5000.0) for i in range(10)}
    d = decide(
        world([node], accounts, [gate("b", "bronze", since=0.0)]),
        POLICY,
        Settings(max_gate_seconds=600.0),
        random.Random(1),
    )
    assert [(r.pod, r.node, r.timeout) for r in d.releases] == [("default/b", None, True)]


def test_compression_scales_measured_time_only() -> None:
    """A replay 10x faster takes the decision of the real-time replay: Q is computed in workload seconds."""
    now = 500.0
    node = full_node("n1", [(f"v{i}", "bronze") for i in range(10)])
    fast = {f"default/ReplicaSet/v{i}": running_acc("bronze", 100.0 + i / 10, 0.0, now, run=100.0) for i in range(10)}
    fast["default/ReplicaSet/g"] = pending_acc("gold", 10.0, 2.0, now)
    slow = {
        k: Account(a.e * 10, a.p * 10, a.state, now, 0.0, a.class_name, run_started=now - 1000.0)
        for k, a in fast.items()
    }
    d_fast = decide(
        world([node], fast, [gate("g", "gold", 490.0)], now), POLICY, Settings(compression=10.0), random.Random(3)
    )
    d_slow = decide(world([node], slow, [gate("g", "gold", 490.0)], now), POLICY, Settings(), random.Random(3))
    assert [e.victim for e in d_fast.evictions] == [e.victim for e in d_slow.evictions]
    assert d_fast.q_of_request == pytest.approx(d_slow.q_of_request)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["gold", "silver", "bronze"]), st.floats(0, 3000), st.floats(0, 3000)),
        min_size=1,
        max_size=30,
    ),
    st.lists(
        st.tuples(st.sampled_from(["gold", "silver", "bronze"]), st.floats(0, 3000), st.floats(0, 3000)),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, 2**16),
)
def test_decision_respects_capacity_and_eligibility(
    running: list[tuple[str, float, float]], pending: list[tuple[str, float, float]], seed: int
) -> None:
    """Whatever the state: every victim is allowed by may_preempt for the pod it is evicted for, no node is
    over-committed after the effects, a pod is released at most once and releases follow increasing Q."""
    now = 10_000.0
    nodes: list[Node] = []
    accounts: dict[str, Account] = {}
    for i, (cls, e, p) in enumerate(running):
        accounts[f"default/ReplicaSet/r{i}"] = running_acc(cls, e, p, now, run=e)
    for n in range(3):
        members = [(f"r{i}", running[i][0]) for i in range(len(running)) if i % 3 == n][:10]
        nodes.append(full_node(f"n{n}", members))
    gated = []
    for j, (cls, e, p) in enumerate(pending):
        accounts[f"default/ReplicaSet/w{j}"] = pending_acc(cls, e, p, now)
        gated.append(gate(f"w{j}", cls))
    w = world(nodes, accounts, gated, now)
    d = decide(w, POLICY, Settings(max_gate_seconds=1e9), random.Random(seed))
    released = [r.pod for r in d.releases]
    assert len(released) == len(set(released))
    assert [r.pod for r in d.releases] == [k for k in d.order if k in released]
    victims = {e.victim for e in d.evictions}
    assert len(victims) == len(d.evictions)
    for ev in d.evictions:
        v_req = w.running[ev.victim]
        v_pod = next(p for n in nodes for p in n.pods if p.key == ev.victim)
        v_inst = qos.Instance(v_pod, *accounts[v_req].ep(now), current_run_seconds=accounts[v_req].current_run(now))
        p_req = ev.for_pod.replace("default/", "default/ReplicaSet/")
        p_pod = next(g.pod for g in gated if g.pod.key == ev.for_pod)
        p_inst = qos.Instance(p_pod, *accounts[p_req].ep(now))
        assert qos.may_preempt(v_inst, p_inst, POLICY)
    load = {n.name: len(n.pods) for n in nodes}
    for ev in d.evictions:
        load[ev.node] -= 1
    for r in d.releases:
        assert r.node is not None
        load[r.node] += 1
    assert all(v <= 10 for v in load.values())


# ---------------------------------------------------------------------------------------------- patches


def test_release_patch_removes_only_our_gate_and_pins() -> None:
    spec = {"schedulingGates": [{"name": "other/gate"}, {"name": GATE}]}
    ops = release_patch(spec, GATE, "n3")
    assert ops[0] == {"op": "test", "path": "/spec/schedulingGates/1/name", "value": GATE}
    assert ops[1] == {"op": "remove", "path": "/spec/schedulingGates/1"}
    assert ops[2]["path"] == "/spec/affinity"
    assert release_patch({"schedulingGates": []}, GATE, "n3") == []


def test_release_patch_tightens_existing_affinity_terms() -> None:
    spec = {
        "schedulingGates": [{"name": GATE}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["x"]}]},
                    ]
                }
            }
        },
    }
    ops = release_patch(spec, GATE, "n1")
    base = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"
    assert [o["path"] for o in ops[2:]] == [f"{base}/0/matchFields", f"{base}/1/matchFields/-"]


def test_admission_patch_adds_gate_and_marker_once() -> None:
    p = {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}
    ops = admission_patch(p, GATE, "qos.kube-qos-extender.io/managed")
    assert {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]} in ops
    assert {
        "op": "add",
        "path": "/spec/containers/0/resources/requests/qos.kube-qos-extender.io~1managed",
        "value": "1",
    } in ops
    assert {
        "op": "add",
        "path": "/spec/containers/0/resources/limits",
        "value": {"qos.kube-qos-extender.io/managed": "1"},
    } in ops
    done = {
        "spec": {
            "schedulingGates": [{"name": GATE}],
            "containers": [{"resources": {"requests": {"m/x": "1"}, "limits": {"m/x": "1"}}}],
        }
    }
    assert admission_patch(done, GATE, "m/x") == []
    assert admission_patch(p, GATE, None) == [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}]


# ----------------------------------------------------------------------------------------------- config


def test_controller_config_defaults_and_errors() -> None:
    from extender.settings.extender import ConfigError, parse_config

    cfg = parse_config({"controller": {"enabled": True, "time_compression": 6}})
    assert cfg.controller.enabled and cfg.controller.time_compression == 6.0
    assert cfg.controller.watchdog_seconds == 10.0 and cfg.controller.gate_name == GATE
    assert cfg.controller.leader_election.enabled and cfg.controller.lease_name == "kube-qos-extender-default"
    canary = parse_config({"controller": {"instance": "canary", "leader_election": {"lease_namespace": "ops"}}})
    assert canary.controller.lease_name == "kube-qos-extender-canary"
    assert canary.controller.leader_election.lease_namespace == "ops"
    for bad, message in (
        ({"controller": {"watchdog_seconds": 0}}, "controller.watchdog_seconds"),
        ({"controller": {"gate_name": "nodomain"}}, "controller.gate_name"),
        ({"controller": {"persistence": "etcd"}}, "controller.persistence"),
        ({"controller": {"max_gate_seconds": 1, "watchdog_seconds": 5}}, "controller.max_gate_seconds"),
        ({"controller": {"bogus": 1}}, "controller.bogus"),
        ({"controller": {"instance": "Canary_1"}}, "controller.instance"),
        ({"controller": {"host_score": "random"}}, "controller.host_score"),
        ({"controller": {"leader_election": {"renew_deadline_seconds": 15}}}, "renew_deadline_seconds"),
        ({"controller": {"leader_election": {"retry_period_seconds": 9}}}, "retry_period_seconds"),
        ({"controller": {"leader_election": {"lease_duration_seconds": 1}}}, "lease_duration_seconds"),
        ({"controller": {"leader_election": {"lease_duration_seconds": 15.5}}}, "lease_duration_seconds"),
        ({"controller": {"leader_election": {"leases": 1}}}, "controller.leader_election.leases"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_config(bad)


def test_metrics_expose_current_sli_distributions() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from extender.controller.metrics import ControllerMetrics, RequestSample

    reg = CollectorRegistry()
    m = ControllerMetrics(reg)
    m.set_samples(
        [
            RequestSample("gold", "running", 1.0, -2.0, 1.0),
            RequestSample("bronze", "pending", 0.3, -40.0, 0.5),
            RequestSample("bronze", "running", 0.6, 30.0, 0.5),
        ]
    )
    m.preemptions.labels("importance").inc()
    text = generate_latest(reg).decode()
    assert 'qos_extender_controller_slo_fulfillment{class="bronze"} 0.5' in text
    assert 'qos_extender_controller_request_availability_bucket{class="bronze",le="0.5"} 1.0' in text
    assert 'qos_extender_controller_request_q_seconds_bucket{class="bronze",le="+Inf",state="pending"} 1.0' in text
    assert 'qos_extender_controller_preemptions_total{reason="importance"} 1.0' in text
    m.set_samples([])  # requests finished: the distributions empty out instead of accumulating
    assert "qos_extender_controller_slo_fulfillment{" not in generate_latest(reg).decode()


def test_due_writes_coalesces_per_account_and_never_drops() -> None:
    written = {"ns/ReplicaSet/a": 100.0, "ns/ReplicaSet/b": 98.5}
    dirty = {"ns/ReplicaSet/a", "ns/ReplicaSet/b", "ns/ReplicaSet/new"}
    now_batch, next_due = due_writes(dirty, written, 101.0, 2.0)
    # b was written 2.5 s ago and the new one never: both due; a (1 s ago) waits until 102.
    assert now_batch == {"ns/ReplicaSet/b", "ns/ReplicaSet/new"}
    assert next_due == 102.0
    assert due_writes({"ns/ReplicaSet/a"}, written, 102.0, 2.0) == ({"ns/ReplicaSet/a"}, None)
    # interval 0: everything dirty is written at once (the pre-coalescing behaviour)
    assert due_writes(dirty, written, 100.0, 0.0) == (dirty, None)
    assert due_writes(set(), written, 100.0, 2.0) == (set(), None)


def test_pods_belong_to_the_instance_named_in_their_annotation_else_their_namespace() -> None:
    labelled = {"bench": "canary"}
    assert owner_instance("canary", "default", labelled) == "canary"
    assert owner_instance("default", "bench", labelled) == "default"  # the annotation wins
    # created while no webhook answered: the namespace's instance, as the webhooks' namespaceSelectors route
    assert owner_instance(None, "bench", labelled) == "canary"
    assert owner_instance(None, "team-a", labelled) == "default"


def test_an_unannotated_pod_waits_for_a_namespace_list_started_after_it() -> None:
    """The namespace map is a periodic list: a pod created in a namespace labelled for another instance just
    before the list would be routed to "default" (accounted and written by the wrong instance). It is routed
    only once a list that started after its creation (whole-second creationTimestamp: 1 s margin) is in."""
    assert route_known("canary", 100.0, None)  # the webhook's annotation needs no list
    assert route_known("canary", 100.0, 50.0)
    assert not route_known(None, 100.0, None)  # no list yet
    assert not route_known(None, 100.0, 100.5)  # created in the same second as the list started
    assert not route_known(None, 100.0, 101.0)
    assert route_known(None, 100.0, 101.2)
    assert route_known(None, None, 10.0)  # no creation time: the last list is all we will ever know


def test_host_score_profile_packs_where_least_allocated_spreads() -> None:
    now = 5000.0
    fuller = full_node("n-full", [(f"x{i}", "bronze") for i in range(6)])
    empty = Node("n-empty", HOST)
    accounts = {f"default/ReplicaSet/x{i}": running_acc("bronze", 100, 0, now) for i in range(6)}
    accounts["default/ReplicaSet/a"] = pending_acc("silver", 100, 10, now)
    w = world([empty, fuller], accounts, [gate("a", "silver")])
    spread = decide(w, POLICY, Settings(host_score="least-allocated"), random.Random(1))
    packed = decide(w, POLICY, Settings(host_score="profile", profile="cost"), random.Random(1))
    assert [r.node for r in spread.releases] == ["n-empty"]
    assert [r.node for r in packed.releases] == ["n-full"]  # BFD: the tightest node that fits


def test_higher_priority_pods_are_never_qos_victims_and_priority_is_handed_to_kube_scheduler() -> None:
    now = 5000.0
    # n1 is full of high-priority bronze pods far above their SLO: by Q alone they would be victims.
    high = [Pod(f"h{i}", SLOT, request_id=f"default/ReplicaSet/h{i}", class_name="bronze", node_name="n1", priority=900)
            for i in range(10)]  # fmt: skip
    accounts = {f"default/ReplicaSet/h{i}": running_acc("bronze", 1000.0, 0.0, now) for i in range(10)}
    accounts["default/ReplicaSet/g"] = pending_acc("gold", 100.0, 20.0, now)
    low_gold = GatedPod(
        Pod("g", SLOT, request_id="default/ReplicaSet/g", class_name="gold", priority=100),
        "default/ReplicaSet/g",
        4990.0,
    )
    d = decide(world([Node("n1", HOST, pods=tuple(high))], accounts, [low_gold]), POLICY, Settings(), random.Random(1))
    assert d.evictions == () and d.releases == ()  # stays gated: nothing it may preempt
    # a node full of pods we know nothing of (never QoS victims) but of lower priority: kube-scheduler's
    # priority preemption can make room, so the pod is handed over unpinned; at equal priority it cannot.
    plain = tuple(Pod(f"x{i}", SLOT, request_id=f"other/x{i}", node_name="n2", priority=10) for i in range(10))
    for priority, expected in ((10, []), (100, [("default/g", None, True)])):
        g = GatedPod(
            Pod("g", SLOT, request_id="default/ReplicaSet/g", class_name="gold", priority=priority),
            "default/ReplicaSet/g",
            4990.0,
        )
        w = world([Node("n2", HOST, pods=plain)], {"default/ReplicaSet/g": accounts["default/ReplicaSet/g"]}, [g])
        d = decide(w, POLICY, Settings(), random.Random(1))
        assert d.evictions == ()
        assert [(r.pod, r.node, r.priority) for r in d.releases] == expected


def test_a_pod_is_only_placed_on_the_nodes_of_its_group() -> None:
    now = 5000.0
    accounts = {"default/ReplicaSet/a": pending_acc("silver", 100, 10, now)}
    # least-allocated would pick the empty node, and it sorts first: only the group rule sends the pod to z-batch
    roomy, tight = Node("a-service", HOST), full_node("z-batch", [("x0", "bronze"), ("x1", "bronze")])
    free = decide(world([roomy, tight], accounts, [GatedPod(pod("a", "silver"), "default/ReplicaSet/a", 4990.0)]),
                  POLICY, Settings(), random.Random(1))  # fmt: skip
    assert [r.node for r in free.releases] == ["a-service"]
    g = GatedPod(pod("a", "silver"), "default/ReplicaSet/a", 4990.0, eligible_nodes=frozenset({"z-batch"}))
    d = decide(world([roomy, tight], accounts, [g]), POLICY, Settings(), random.Random(1))
    assert [r.node for r in d.releases] == ["z-batch"]
    nowhere = GatedPod(pod("a", "silver"), "default/ReplicaSet/a", 4990.0, eligible_nodes=frozenset())
    assert decide(world([roomy, tight], accounts, [nowhere]), POLICY, Settings(), random.Random(1)).releases == ()


async def test_the_sli_gauges_are_the_running_controllers_accounts_at_each_scrape() -> None:
    """The gauges are computed when scraped, from the accounts as they are then (no pass needed): a pass used to
    recompute one sample per request every second, a quarter of each pass at 10,000 pods (issue 34). A term
    that ended (set_samples([])) exports none."""
    from prometheus_client import CollectorRegistry, generate_latest

    from extender.controller.accounting import ACCOUNT_ANNOTATION, Account, RequestState
    from extender.controller.loop import QosController
    from extender.controller.metrics import ControllerMetrics
    from extender.controller.state import TrackingSnapshot
    from extender.settings.extender import ExtenderConfig

    reg = CollectorRegistry()
    m = ControllerMetrics(reg)
    now = [100.0]
    cfg = ExtenderConfig()
    ctl = QosController(None, TrackingSnapshot(cfg, ACCOUNT_ANNOTATION), cfg, m, clock=lambda: now[0])
    ctl.accounts["ns/a"] = Account.admit("bronze", 0.0).transition(RequestState.RUNNING, 50.0)
    bucket = 'qos_extender_controller_request_availability_bucket{class="bronze",le="%s"} %s'
    text = generate_latest(reg).decode()  # e 50 s, p 50 s: 0.5
    assert bucket % ("0.5", "1.0") in text
    now[0] = 150.0  # e 100 s, p 50 s: 0.67
    text = generate_latest(reg).decode()
    assert bucket % ("0.6", "0.0") in text and bucket % ("0.7", "1.0") in text
    m.set_samples([])
    assert 'request_availability_bucket{class="bronze"' not in generate_latest(reg).decode()
