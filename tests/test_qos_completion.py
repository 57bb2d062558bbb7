"""Q counts the run still ahead of a batch pod with a declared runtime (issue 33).

On Alibaba 2017 (every task a bronze batch pod) the paper's Q made a 5-second task that had waited as long as an
hour-long one exactly as urgent, so short tasks queued behind long ones for room and bronze met its SLO for
fewer requests than under default Kubernetes. These tests fail with the paper's Q (``remaining`` ignored).
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.controller import decide
from extender.controller.accounting import Account, RequestState
from extender.core import qos
from extender.core.model import (
    DEFAULT_CLASSES,
    InvalidInputError,
    Node,
    NodeGroup,
    Pod,
    Resources,
    WorkloadKind,
)
from extender.sim.engine import SimConfig, simulate
from extender.sim.workloads import HostSpec, RequestSpec, Workload
from extender.webhook import verbs

POLICY = qos.QosPolicy(alpha_seconds=2.0)
BRONZE = DEFAULT_CLASSES["bronze"]


def _batch_pod(name: str, runtime: float | None, cpu: int = 1000, **kw: object) -> Pod:
    return Pod(
        name=name,
        requests=Resources.request(cpu, 2**30),
        request_id=name,
        uid=name,
        class_name="bronze",
        kind=WorkloadKind.BATCH,
        runtime_seconds=runtime,
        **kw,  # type: ignore[arg-type]
    )


slos = st.floats(min_value=0.05, max_value=1.0)
times = st.floats(min_value=0.0, max_value=1e6)


@given(e=times, p=times, slo=slos, remaining=times)
def test_q_is_the_margin_at_completion(e: float, p: float, slo: float, remaining: float) -> None:
    """Q with ``remaining`` is the paper's Q of the request as it will stand when it completes without more
    waiting: e + remaining run, p pending."""
    q = qos.q_metric(e, p, slo, 2.0, remaining)
    if e + p == 0:
        assert q == pytest.approx(remaining * (1 / slo - 1), rel=1e-9, abs=1e-6)
    else:
        at_completion = (e + remaining) / slo - (e + remaining + p) - 2.0
        assert q == pytest.approx(at_completion, rel=1e-9, abs=1e-6)
    assert q >= qos.q_metric(e, p, slo, 2.0) - 1e-9  # never less urgent... than the paper's for nothing ahead


@given(e=times, p=times, slo=slos)
def test_services_keep_the_papers_q(e: float, p: float, slo: float) -> None:
    assert qos.q_metric(e, p, slo, 2.0, 0.0) == qos.q_metric(e, p, slo, 2.0)


@given(e=times, p=times, remaining=times)
def test_instance_q_equals_q_metric(e: float, p: float, remaining: float) -> None:
    inst = qos.Instance(_batch_pod("x", 1e7), e, p, remaining_seconds=remaining)
    assert qos.instance_q(inst, POLICY) == qos.q_metric(e, p, BRONZE.slo, 2.0, remaining)


def test_a_request_not_yet_admitted_has_the_run_ahead_as_q() -> None:
    inst = qos.Instance(_batch_pod("x", 100.0), 0.0, 0.0, admitted=False, remaining_seconds=100.0)
    assert qos.instance_q(inst, POLICY) == 100.0  # bronze: 100 s of run buy 100 s of waiting


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_remaining_is_refused(bad: float) -> None:
    with pytest.raises(InvalidInputError, match="remaining"):
        qos.Instance(_batch_pod("x", 100.0), 0.0, 0.0, remaining_seconds=bad)
    with pytest.raises(InvalidInputError, match="remaining"):
        qos.q_metric(1.0, 1.0, 0.5, 2.0, bad)


def test_a_short_task_goes_before_a_long_one_that_waited_as_long() -> None:
    """Same class, same wait: the task whose availability at completion is nearer the SLO goes first. The long
    one's key sorts first, so with the paper's Q (a tie broken by key) the long one would."""
    long = qos.Instance(_batch_pod("a-long", 3600.0), 0.0, 30.0, remaining_seconds=3600.0)
    short = qos.Instance(_batch_pod("b-short", 20.0), 0.0, 30.0, remaining_seconds=20.0)
    assert [i.pod.key for i in qos.queue_order([long, short], POLICY)] == ["default/b-short", "default/a-long"]


def test_the_long_run_ahead_makes_a_running_task_the_victim() -> None:
    """Of two running peers with the same past, the one with more run ahead can afford to wait: it is the
    victim the walk takes first."""
    now = 1000.0
    long = _batch_pod("a-long", 3600.0, started_at=now - 500.0, node_name="n")
    short = _batch_pod("b-short", 600.0, started_at=now - 500.0, node_name="n")
    node = Node("n", Resources(2000, 4 * 2**30, 110), pods=(long, short), group=NodeGroup.BATCH)
    running = {
        p.key: qos.Instance(p, 500.0, 0.0, current_run_seconds=500.0, remaining_seconds=p.remaining_runtime(now))
        for p in (long, short)
    }
    pending = qos.Instance(_batch_pod("c-new", 60.0), 0.0, 10.0, remaining_seconds=60.0)
    result = qos.feasibility(pending, node, running, POLICY, random.Random(1))
    assert result.victims == ("default/a-long",)


def test_controller_pass_releases_the_short_task_into_the_one_free_slot() -> None:
    """``controller.decide`` (the pass the controller and the simulator both run) with room for one of two
    gated peers that waited as long: the short one is released, the long one stays gated."""
    now = 500.0
    node = Node("n", Resources(1000, 4 * 2**30, 110), group=NodeGroup.BATCH)
    gated, accounts = [], {}
    for name, runtime in (("a-long", 3600.0), ("b-short", 20.0)):
        pod = _batch_pod(name, runtime)
        gated.append(decide.GatedPod(pod, name, gated_since=now - 5.0))
        accounts[name] = Account(
            e=0.0, p=0.0, state=RequestState.PENDING, since=now - 5.0, admitted=now - 5.0, class_name="bronze"
        )
    world = decide.World([node], {}, gated, accounts, now)
    settings = decide.Settings(host_score="profile", profile="cost")
    d = decide.decide(world, POLICY, settings, random.Random(1))
    assert [r.request for r in d.releases] == ["b-short"]
    assert d.q_of_request["b-short"] == pytest.approx(20.0 - 5.0 - 2.0)
    assert d.q_of_request["a-long"] == pytest.approx(3600.0 - 5.0 - 2.0)


def test_preempt_verb_counts_the_run_ahead() -> None:
    """The webhook's preempt verb builds its Instances from the pods' own timestamps, the run ahead included."""
    pod = _batch_pod("x", 300.0, started_at=100.0, node_name="n")
    inst = verbs._instance(pod, 50.0, 200.0)
    assert inst.remaining_seconds == 200.0
    assert inst.running_seconds == 100.0 and inst.pending_seconds == 50.0


def _spec(name: str, arrival: float, duration: float) -> RequestSpec:
    return RequestSpec(name, arrival, 1000, 2**30, duration, "bronze", WorkloadKind.BATCH)


def test_short_task_meets_its_slo_on_a_full_host() -> None:
    """One 1-core host, full until t = 102; a 3,600-s task and a 20-s task arrive together at t = 95. The short
    one must get the freed core (it waits 9 s: availability 20 / 29); with the paper's Q the tie went to the
    long one by key, the short one waited for a preemption after the 120-s quantum and missed bronze's 0.5."""
    w = Workload(
        "full-host",
        (_spec("x-first", 0.0, 100.0), _spec("a-long", 95.0, 3600.0), _spec("b-short", 95.0, 20.0)),
        hosts=(HostSpec("h", Resources(1000, 4 * 2**30, 110), NodeGroup.BATCH),),
    )
    res = simulate(w, "qos-driven", SimConfig(seed=1))
    reqs = {r.spec.request_id: r for r in res.reqs}
    short = reqs["b-short"]
    assert short.done_at is not None
    assert qos.availability(short.e, short.p) >= BRONZE.slo
    assert short.preemptions == 0 and reqs["a-long"].preemptions == 0
    assert res.counters.preemptions == 0


# ----------------------------------------------------------------------------------- peer_rescue_only

RESCUE = qos.QosPolicy(alpha_seconds=2.0, peer_rescue_only=True)


def _running(name: str, runtime: float | None, ran: float, now: float, kind: WorkloadKind = WorkloadKind.BATCH) -> Pod:
    return Pod(
        name=name,
        requests=Resources.request(1000, 2**30),
        request_id=name,
        uid=name,
        class_name="bronze",
        kind=kind,
        runtime_seconds=runtime,
        started_at=now - ran,
        node_name="n",
    )


def _victim(pod: Pod, now: float) -> qos.Instance:
    ran = now - (pod.started_at or now)
    return qos.Instance(pod, ran, 0.0, current_run_seconds=ran, remaining_seconds=pod.remaining_runtime(now))


@pytest.mark.parametrize(("waited", "preempts"), [(100.0, False), (110.0, True), (115.0, True)])
def test_a_batch_peer_preempts_only_when_about_to_miss(waited: float, preempts: bool) -> None:
    """A 120-s task that waited w has Q = 120 - w - 2 at completion (18, 8, 3 s); it may take a peer's room only
    once that is below bronze's 10-s safety margin. The paper's rule lets it whenever Q_v > Q_p + h."""
    now = 10_000.0
    victim = _victim(_running("v", 7200.0, 600.0, now), now)
    pending = qos.Instance(_batch_pod("p", 120.0), 0.0, waited, remaining_seconds=120.0)
    assert qos.instance_q(pending, RESCUE) == pytest.approx(120.0 - waited - 2.0)
    assert qos.may_preempt(victim, pending, qos.QosPolicy(alpha_seconds=2.0))  # the paper's rule: always here
    assert qos.may_preempt(victim, pending, RESCUE) is preempts


def test_services_keep_the_papers_peer_rule() -> None:
    """A pending service (measured as it goes) still evens Q out with its peers under ``peer_rescue_only``."""
    now = 10_000.0
    victim = _victim(_running("v", None, 600.0, now, WorkloadKind.SERVICE), now)
    service = Pod("s", Resources.request(1000, 2**30), request_id="s", uid="s", class_name="bronze")
    pending = qos.Instance(service, 400.0, 300.0)  # Q = 400 - 300 - 2 = 98 >= phi
    assert qos.instance_q(pending, RESCUE) >= BRONZE.safety_margin_seconds
    assert qos.may_preempt(victim, pending, RESCUE)


def test_rescue_only_leaves_other_classes_alone() -> None:
    """A silver batch pod that can still wait preempts a bronze one as the paper says (across classes)."""
    now = 10_000.0
    victim = _victim(_running("v", 7200.0, 600.0, now), now)
    silver = Pod(
        "g",
        Resources.request(1000, 2**30),
        request_id="g",
        uid="g",
        class_name="silver",
        kind=WorkloadKind.BATCH,
        runtime_seconds=600.0,
    )
    pending = qos.Instance(silver, 0.0, 5.0, remaining_seconds=600.0)
    assert qos.instance_q(pending, RESCUE) >= DEFAULT_CLASSES["silver"].safety_margin_seconds
    assert qos.may_preempt(victim, pending, RESCUE)


def _pass(policy: qos.QosPolicy, waited: float) -> decide.Decision:
    """One controller pass: a full 1-core node running a long task for 600 s, one 120-s peer gated ``waited`` s."""
    now = 10_000.0
    long = _running("long", 7200.0, 600.0, now)
    node = Node("n", Resources(1000, 4 * 2**30, 110), pods=(long,), group=NodeGroup.BATCH)
    gated = decide.GatedPod(_batch_pod("short", 120.0), "short", gated_since=now - waited)
    accounts = {
        "long": Account(
            e=600.0,
            p=0.0,
            state=RequestState.RUNNING,
            since=now,
            admitted=now - 600.0,
            class_name="bronze",
            run_started=now - 600.0,
            starts=1,
        ),
        "short": Account(
            e=0.0, p=waited, state=RequestState.PENDING, since=now, admitted=now - waited, class_name="bronze"
        ),
    }
    world = decide.World([node], {"default/long": "long"}, [gated], accounts, now)
    return decide.decide(world, policy, decide.Settings(host_score="profile"), random.Random(1))


@pytest.mark.parametrize("vectorised", [True, False])
def test_controller_pass_preempts_a_peer_only_to_rescue(monkeypatch: pytest.MonkeyPatch, vectorised: bool) -> None:
    """The pass (vectorised eligibility and the per-node ``qos.feasibility`` walk alike) leaves the long task
    running while the short one can still make its SLO, and preempts it once the short one is about to miss."""
    monkeypatch.setattr(decide, "_VECTORISED", vectorised)
    assert [e.victim_request for e in _pass(qos.QosPolicy(alpha_seconds=2.0), 30.0).evictions] == ["long"]
    assert _pass(RESCUE, 30.0).evictions == ()  # Q = 120 - 30 - 2 = 88: it can wait
    rescued = _pass(RESCUE, 115.0)  # Q = 3 < 10
    assert [e.victim_request for e in rescued.evictions] == ["long"]
    assert [(r.request, r.node) for r in rescued.releases] == [("short", "n")]


def test_product_runs_the_rescue_rule() -> None:
    """The product's shipped settings (sim `product`, config/ through the settings defaults) turn it on."""
    from extender.settings.extender import ExtenderConfig
    from extender.sim.product import ProductSettings

    assert ProductSettings().qos_policy().peer_rescue_only
    assert ExtenderConfig().policy.peer_rescue_only


@pytest.mark.parametrize(("waited", "preempts"), [(100.0, False), (115.0, True)])
def test_a_rescue_is_not_held_back_by_the_quantum(waited: float, preempts: bool) -> None:
    """The victim's run is 30 s old, under the 120-s quantum. A peer that can still wait (Q 18 s) does not
    preempt it; one about to miss (Q 3 s < phi 10 s) does, as a violating more important class would: a task of
    seconds cannot wait two minutes for a peer's run to age. The victim keeps the hysteresis' 90 s of margin."""
    now = 10_000.0
    victim = _victim(_running("v", 7200.0, 30.0, now), now)
    assert victim.current_run_seconds < qos.RECOMMENDED_QUANTUM_SECONDS
    policy = qos.QosPolicy(
        alpha_seconds=2.0,
        min_run_quantum_seconds=qos.RECOMMENDED_QUANTUM_SECONDS,
        q_hysteresis_seconds=qos.RECOMMENDED_HYSTERESIS_SECONDS,
        peer_rescue_only=True,
    )
    pending = qos.Instance(_batch_pod("p", 120.0), 0.0, waited, remaining_seconds=120.0)
    assert qos.may_preempt(victim, pending, policy) is preempts
    paper_quantum = qos.QosPolicy(
        alpha_seconds=2.0,
        min_run_quantum_seconds=qos.RECOMMENDED_QUANTUM_SECONDS,
        q_hysteresis_seconds=qos.RECOMMENDED_HYSTERESIS_SECONDS,
    )
    assert not qos.may_preempt(victim, pending, paper_quantum)  # without the rule the quantum holds it back


@pytest.mark.parametrize("vectorised", [True, False])
def test_controller_pass_rescues_within_the_quantum(monkeypatch: pytest.MonkeyPatch, vectorised: bool) -> None:
    """The pass with the product's knobs: a 20-s task gated 15 s (Q 3 s) on a node whose long task started 30 s
    ago takes its room at once."""
    monkeypatch.setattr(decide, "_VECTORISED", vectorised)
    now = 10_000.0
    long = _running("long", 7200.0, 30.0, now)
    node = Node("n", Resources(1000, 4 * 2**30, 110), pods=(long,), group=NodeGroup.BATCH)
    gated = decide.GatedPod(_batch_pod("short", 20.0), "short", gated_since=now - 15.0)
    accounts = {
        "long": Account(
            e=30.0,
            p=0.0,
            state=RequestState.RUNNING,
            since=now,
            admitted=now - 30.0,
            class_name="bronze",
            run_started=now - 30.0,
            starts=1,
        ),
        "short": Account(
            e=0.0, p=15.0, state=RequestState.PENDING, since=now, admitted=now - 15.0, class_name="bronze"
        ),
    }
    world = decide.World([node], {"default/long": "long"}, [gated], accounts, now)
    from extender.sim.product import ProductSettings

    d = decide.decide(world, ProductSettings().qos_policy(), decide.Settings(host_score="profile"), random.Random(1))
    assert [e.victim_request for e in d.evictions] == ["long"]
    assert [(r.request, r.node) for r in d.releases] == [("short", "n")]
