"""The decide pass's numpy host table against the per-node qos.feasibility loop it replaces: the same
decisions and the same random stream (the rng state after the pass), on random crowded clusters."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from extender.controller import decide as decide_mod
from extender.controller.accounting import Account, RequestState
from extender.controller.decide import Decision, GatedPod, Settings, World, decide
from extender.core import qos
from extender.core.model import DEFAULT_CLASSES, InvalidInputError, Node, Pod, Resources, WorkloadKind

CLASSES = ("gold", "silver", "bronze")
PRIORITY = {"gold": 1000, "silver": 500, "bronze": 100}


def _world(seed: int, priorities: bool) -> World:
    r = random.Random(seed)
    now = 10_000.0
    nodes: list[Node] = []
    running: dict[str, str] = {}
    accounts: dict[str, Account] = {}
    for n in range(r.randint(1, 12)):
        pods = []
        for k in range(r.randint(0, 9)):
            cls = r.choice(CLASSES)
            key = f"n{n}p{k}"
            req = Resources.request(r.choice((250, 375, 500, 1000)), r.choice((256, 384, 1024)) * 2**20, 1)
            pods.append(
                Pod(
                    key,
                    req,
                    request_id=key,
                    class_name=cls,
                    node_name=f"node{n}",
                    priority=PRIORITY[cls] if priorities else 0,
                )
            )
            if r.random() < 0.85:  # the rest are not QoS-managed: never victims
                running[f"default/{key}"] = key
                e = r.uniform(0, 3000)
                accounts[key] = Account(
                    e,
                    r.uniform(0, 1500),
                    RequestState.RUNNING,
                    now,
                    0.0,
                    cls,
                    preemptions=r.choice((0, 0, 1, 3)),
                    overhead=r.choice((0.0, 5.0, 400.0)),
                    run_started=now - r.choice((10.0, 60.0, 1000.0)),
                )
        nodes.append(
            Node(
                f"node{n}",
                Resources(r.choice((2000, 3750, 8000)), r.choice((2048, 3840)) * 2**20, r.choice((4, 110))),
                labels={"zone": r.choice("ab")},
                pods=tuple(pods),
                unschedulable=r.random() < 0.1,
            )
        )
    gated = []
    for k in range(r.randint(0, 25)):
        cls = r.choice(CLASSES)
        key = f"g{k}"
        req = Resources.request(r.choice((250, 375, 1000, 3000)), r.choice((256, 384, 2048)) * 2**20, 1)
        pod = Pod(key, req, request_id=key, class_name=cls, priority=PRIORITY[cls] if priorities else 0)
        accounts[key] = Account(r.uniform(0, 2000), r.uniform(0, 2000), RequestState.PENDING, now, 0.0, cls)
        selector = {"zone": r.choice("ab")} if r.random() < 0.2 else {}
        gated.append(GatedPod(pod, key, now - r.uniform(0, 100), selector))
    return World(tuple(nodes), running, tuple(gated), accounts, now)


def _run(
    world: World, policy: qos.QosPolicy, settings: Settings, seed: int, vectorised: bool
) -> tuple[Decision, object]:
    old = decide_mod._VECTORISED
    decide_mod._VECTORISED = vectorised
    try:
        rng = random.Random(seed)
        return decide(world, policy, settings, rng), rng.getstate()
    finally:
        decide_mod._VECTORISED = old


@pytest.mark.parametrize("seed", range(120))
def test_host_table_takes_the_per_node_loops_decisions_and_draws(seed: int) -> None:
    world = _world(seed, priorities=seed % 2 == 0)
    policies = [
        qos.QosPolicy(classes=DEFAULT_CLASSES, alpha_seconds=2.0),
        qos.QosPolicy(
            classes=DEFAULT_CLASSES,
            alpha_seconds=2.0,
            min_run_quantum_seconds=qos.RECOMMENDED_QUANTUM_SECONDS,
            q_hysteresis_seconds=qos.RECOMMENDED_HYSTERESIS_SECONDS,
        ),
        qos.QosPolicy(classes=DEFAULT_CLASSES, alpha_seconds=2.0, overhead_cap=False, relax_by_importance=False),
    ]
    for policy in policies:
        for settings in (Settings(), Settings(host_score="profile")):
            fast = _run(world, policy, settings, seed, vectorised=True)
            slow = _run(world, policy, settings, seed, vectorised=False)
            assert fast == slow


def _crowded(seed: int) -> World:
    """One class, full nodes, many gated pods of a few sizes: most of them fit nowhere, which is where the pass
    refuses a pod by dominance (a pod at least as large and at least as high in Q was refused before it)."""
    r = random.Random(seed)
    now = 10_000.0
    nodes: list[Node] = []
    running: dict[str, str] = {}
    accounts: dict[str, Account] = {}
    for n in range(6):
        pods = []
        for k in range(4):
            key = f"n{n}p{k}"
            pods.append(Pod(key, Resources.request(500, 512 * 2**20, 1), request_id=key, class_name="bronze"))
            running[f"default/{key}"] = key
            accounts[key] = Account(
                r.uniform(0, 3000),
                r.uniform(0, 1500),
                RequestState.RUNNING,
                now,
                0.0,
                "bronze",
                run_started=now - r.choice((10.0, 1000.0)),
            )
        nodes.append(Node(f"node{n}", Resources(2000, 2048 * 2**20, 110), pods=tuple(pods)))
    gated = []
    for k in range(30):
        key = f"g{k}"
        req = Resources.request(r.choice((500, 1000, 1500)), r.choice((512, 1024)) * 2**20, 1)
        pod = Pod(key, req, request_id=key, class_name="bronze")
        accounts[key] = Account(r.uniform(0, 2000), r.uniform(0, 2000), RequestState.PENDING, now, 0.0, "bronze")
        gated.append(GatedPod(pod, key, now - r.uniform(0, 100)))
    return World(tuple(nodes), running, tuple(gated), accounts, now)


@pytest.mark.parametrize("seed", range(40))
def test_dominance_refusals_take_the_per_node_loops_decisions_and_draws(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = _crowded(seed)
    calls = 0
    options = decide_mod._Hosts.options

    def counted(self: decide_mod._Hosts, *args: object, **kwargs: object) -> list[qos.Feasibility]:
        nonlocal calls
        calls += 1
        return options(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(decide_mod._Hosts, "options", counted)
    policy = qos.QosPolicy(
        classes=DEFAULT_CLASSES,
        alpha_seconds=2.0,
        min_run_quantum_seconds=qos.RECOMMENDED_QUANTUM_SECONDS,
        q_hysteresis_seconds=qos.RECOMMENDED_HYSTERESIS_SECONDS,
    )
    for settings in (Settings(), Settings(host_score="profile")):
        calls = 0
        fast = _run(world, policy, settings, seed, vectorised=True)
        assert calls < len(world.gated)  # some pods were refused by dominance, without testing the nodes
        monkeypatch.setattr(decide_mod, "_DOMINANCE", False)
        no_dominance = _run(world, policy, settings, seed, vectorised=True)
        monkeypatch.setattr(decide_mod, "_DOMINANCE", True)
        slow = _run(world, policy, settings, seed, vectorised=False)
        assert fast == no_dominance == slow


@pytest.mark.parametrize("where", ["node", "gated", "running"])
def test_exabyte_quantities_take_the_exact_path_instead_of_crashing_the_pass(where: str) -> None:
    """Found by review: a node (or pod) declaring 16Ei overflowed the int64 table and every controller pass
    raised, so no gated pod was ever released. Such a world is decided by the exact per-node loop."""
    world = _world(3, priorities=False)
    huge = Resources(4000, 2**64, 110)
    nodes = list(world.nodes)
    gated = list(world.gated)
    if where == "node":
        nodes[0] = Node(nodes[0].name, huge, labels=nodes[0].labels, pods=nodes[0].pods)  # 16Ei of memory
    elif where == "gated":
        g = gated[0]
        big = Pod(g.pod.key, Resources.request(500, 10**19, 1), request_id=g.pod.request_id, class_name="gold")
        gated[0] = GatedPod(big, g.request, g.gated_since, g.node_selector)
    else:
        n = next(n for n in nodes if n.pods)
        p = n.pods[0]
        fat = Pod(p.key, Resources.request(500, 2**63, 1), request_id=p.request_id, class_name=p.class_name)
        nodes[nodes.index(n)] = Node(n.name, n.allocatable, labels=n.labels, pods=(fat, *n.pods[1:]))
    world = World(tuple(nodes), world.running, tuple(gated), world.accounts, world.now)
    policy = qos.QosPolicy(classes=DEFAULT_CLASSES, alpha_seconds=2.0)
    fast = _run(world, policy, Settings(), 3, vectorised=True)
    assert fast == _run(world, policy, Settings(), 3, vectorised=False)


def _mixed(seed: int) -> World:
    """Batch and service pods with runtimes, some nodes with room and some full of lower-Q peers: a gated pod
    usually has both a free host and hosts it could preempt on, which is where the profile score's lazy path
    (free hosts only) must choose as the full option list does. Runtimes spread the nodes over time bins."""
    r = random.Random(seed)
    now = 10_000.0
    nodes: list[Node] = []
    running: dict[str, str] = {}
    accounts: dict[str, Account] = {}
    for n in range(r.randint(3, 10)):
        pods = []
        for k in range(r.randint(0, 6)):
            cls = r.choice(CLASSES)
            key = f"n{n}p{k}"
            batch = r.random() < 0.7
            pods.append(
                Pod(
                    key,
                    Resources.request(r.choice((250, 500, 1000)), r.choice((256, 512, 1024)) * 2**20, 1),
                    request_id=key,
                    class_name=cls,
                    node_name=f"node{n}",
                    kind=WorkloadKind.BATCH if batch else WorkloadKind.SERVICE,
                    runtime_seconds=r.choice((60.0, 400.0, 1300.0, 5000.0)) if batch else None,
                    started_at=now - r.choice((10.0, 200.0, 900.0)),
                )
            )
            running[f"default/{key}"] = key
            accounts[key] = Account(
                r.uniform(0, 3000),
                r.uniform(0, 3000),
                RequestState.RUNNING,
                now,
                0.0,
                cls,
                run_started=now - r.choice((10.0, 1000.0)),
            )
        nodes.append(
            Node(
                f"node{n}",
                Resources(r.choice((2000, 4000)), r.choice((2048, 4096)) * 2**20, 110),
                pods=tuple(pods),
                unschedulable=r.random() < 0.05,
            )
        )
    gated = []
    for k in range(r.randint(1, 20)):
        cls = r.choice(CLASSES)
        key = f"g{k}"
        batch = r.random() < 0.7
        pod = Pod(
            key,
            Resources.request(r.choice((250, 500, 1500)), r.choice((256, 1024)) * 2**20, 1),
            request_id=key,
            class_name=cls,
            kind=WorkloadKind.BATCH if batch else WorkloadKind.SERVICE,
            runtime_seconds=r.choice((30.0, 700.0, 4000.0)) if batch else None,
        )
        accounts[key] = Account(r.uniform(0, 2000), r.uniform(0, 4000), RequestState.PENDING, now, 0.0, cls)
        gated.append(GatedPod(pod, key, now - r.uniform(0, 100)))
    return World(tuple(nodes), running, tuple(gated), accounts, now)


def test_profile_score_on_free_hosts_only_takes_the_full_option_lists_decisions_and_draws(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = 0
    feasibility = qos.feasibility

    def counted(*args: object, **kwargs: object) -> qos.Feasibility:
        nonlocal calls
        calls += 1
        return feasibility(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(qos, "feasibility", counted)
    policy = qos.QosPolicy(classes=DEFAULT_CLASSES, alpha_seconds=2.0)
    lazy_calls = full_calls = 0
    releases = 0
    for seed in range(60):
        world = _mixed(seed)
        for settings in (Settings(host_score="profile"), Settings(host_score="profile", profile="spread")):
            calls = 0
            lazy = _run(world, policy, settings, seed, vectorised=True)
            lazy_calls += calls
            monkeypatch.setattr(decide_mod, "_LAZY_PROFILE", False)
            calls = 0
            full = _run(world, policy, settings, seed, vectorised=True)
            full_calls += calls
            monkeypatch.setattr(decide_mod, "_LAZY_PROFILE", True)
            slow = _run(world, policy, settings, seed, vectorised=False)
            assert lazy == full == slow
            releases += len(lazy[0].releases)
    assert releases > 100
    assert lazy_calls < full_calls / 2  # the lazy path skipped the preemption walks (it fired)


def _thresholds(seed: int) -> World:
    """The crowded world with running requests near the anti-thrashing quantum and the overhead cap: whether a
    victim is protected turns on the current run and Eq. 8's overhead the pass computes for it."""
    world = _crowded(seed)
    r = random.Random(seed)
    accounts = dict(world.accounts)
    for rid in world.running.values():
        acc = accounts[rid]
        e = r.choice((0.0, 100.0, 1000.0))
        accounts[rid] = replace(
            acc,
            e=e,
            preemptions=r.choice((0, 1, 2)),
            overhead=r.choice((0.0, e * 0.5, e * 0.5 + 1.0, e * 0.4)),
            run_started=world.now - r.choice((100.0, 119.0, 121.0, 200.0, 16.0, 15.9)),
        )
    return replace(world, accounts=accounts)


@pytest.mark.parametrize("seed", range(40))
def test_q_from_accounts_without_instances_takes_the_same_decisions_and_draws(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Q, current run and overhead cap computed from the accounts (Instances built only for the hosts tested
    and the victims) against every Instance built first, on random, crowded and mixed worlds, with a
    compression factor (the arithmetic scales e, p and overheads) and with the controller's own settings."""
    policy = qos.QosPolicy(
        classes=DEFAULT_CLASSES,
        alpha_seconds=2.0,
        min_run_quantum_seconds=qos.RECOMMENDED_QUANTUM_SECONDS,
        q_hysteresis_seconds=qos.RECOMMENDED_HYSTERESIS_SECONDS,
    )
    built = 0
    instance = decide_mod._instance

    def counted(*args: object) -> qos.Instance:
        nonlocal built
        built += 1
        return instance(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(decide_mod, "_instance", counted)
    lazy_built = eager_built = 0
    for world in (_world(seed, priorities=seed % 2 == 0), _crowded(seed), _mixed(seed), _thresholds(seed)):
        for settings in (Settings(), Settings(host_score="profile", compression=7.5)):
            built = 0
            lazy = _run(world, policy, settings, seed, vectorised=True)
            lazy_built += built
            monkeypatch.setattr(decide_mod, "_LAZY_INSTANCES", False)
            built = 0
            eager = _run(world, policy, settings, seed, vectorised=True)
            eager_built += built
            slow = _run(world, policy, settings, seed, vectorised=False)
            monkeypatch.setattr(decide_mod, "_LAZY_INSTANCES", True)
            assert lazy == eager == slow
    assert lazy_built < eager_built


@pytest.mark.parametrize("field", ["e", "p", "overhead", "preemptions"])
@pytest.mark.parametrize("who", ["running", "gated"])
def test_a_bad_account_raises_the_instances_error_without_instances_too(
    field: str, who: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = _crowded(3)
    rid = next(iter(world.running.values())) if who == "running" else world.gated[0].request
    bad: dict[str, Any] = {"e": float("nan"), "p": -1.0, "overhead": float("inf"), "preemptions": -2}
    accounts = dict(world.accounts)
    accounts[rid] = replace(accounts[rid], **{field: bad[field]})
    broken = replace(world, accounts=accounts)
    policy = qos.QosPolicy(classes=DEFAULT_CLASSES, alpha_seconds=2.0)
    errors = []
    for lazy in (True, False):
        monkeypatch.setattr(decide_mod, "_LAZY_INSTANCES", lazy)
        with pytest.raises(InvalidInputError) as err:
            decide(broken, policy, Settings(), random.Random(1))
        errors.append(str(err.value))
    assert errors[0] == errors[1]


class _CountingRandom(random.Random):
    """Not a plain Random: _skip_draws must draw one by one for it (its random() may be overridden)."""

    calls = 0

    def random(self) -> float:
        type(self).calls += 1
        return super().random()


@pytest.mark.parametrize("n", [0, 1, 2, 2047, 2048, 2049, 3 * 2048, 10_007])
def test_skipping_draws_leaves_the_rng_where_drawing_them_would(n: int) -> None:
    """The pass skips the draws of hosts it proves by table; the tie-breaks after them depend on the skip
    consuming exactly the words n random() calls consume, in one getrandbits or in chunks."""
    drawn, skipped = random.Random(n), random.Random(n)
    for _ in range(n):
        drawn.random()
    decide_mod._skip_draws(skipped, n)
    assert skipped.getstate() == drawn.getstate()
    counting = _CountingRandom(n)
    _CountingRandom.calls = 0
    decide_mod._skip_draws(counting, n)
    assert _CountingRandom.calls == n and counting.getstate() == drawn.getstate()
