"""The decide pass's free-host choice from node columns (``decide._FAST_HOSTS``) against scoring every free
host per node: the same decisions and the same random stream, on crowded mixed clusters under every host score."""

from __future__ import annotations

import random

import numpy as np
import pytest

from extender.controller import decide as decide_mod
from extender.controller.accounting import Account, RequestState
from extender.controller.decide import Decision, GatedPod, Settings, World, decide
from extender.core import packing, qos
from extender.core.model import DEFAULT_CLASSES, Node, Pod, Resources, WorkloadKind

CLASSES = ("gold", "silver", "bronze")
PRIORITY = {"gold": 1000, "silver": 500, "bronze": 100}
SETTINGS = (
    Settings(),
    Settings(host_score="profile"),
    Settings(host_score="profile", profile="spread"),
)


def _world(seed: int) -> World:
    """Many nodes of few flavours (score ties, broken by name), some full of peers, some at their pod-slot
    limit, some cordoned; services, batch pods and best-effort pods (the non-zero request defaults)."""
    r = random.Random(seed)
    now = 10_000.0
    nodes: list[Node] = []
    running: dict[str, str] = {}
    accounts: dict[str, Account] = {}
    priorities = seed % 2 == 0
    for n in range(r.randint(5, 40)):
        name = f"node{n:03d}" if n % 3 else f"a{n}"  # names out of node order: the tie-break is by name
        pods = []
        slots = r.choice((3, 110))
        for k in range(r.randint(0, min(slots, 5))):
            cls = r.choice(CLASSES)
            key = f"n{n}p{k}"
            batch = r.random() < 0.3
            pods.append(
                Pod(
                    key,
                    Resources.request(r.choice((0, 250, 500, 1000)), r.choice((0, 256, 512, 1024)) * 2**20, 1),
                    request_id=key,
                    class_name=cls,
                    node_name=name,
                    priority=PRIORITY[cls] if priorities else 0,
                    kind=WorkloadKind.BATCH if batch else WorkloadKind.SERVICE,
                    runtime_seconds=r.choice((60.0, 1300.0, 3000.0)) if batch else None,
                    started_at=now - 100.0,
                )
            )
            if r.random() < 0.85:
                running[f"default/{key}"] = key
                accounts[key] = Account(
                    r.uniform(0, 3000), r.uniform(0, 3000), RequestState.RUNNING, now, 0.0, cls, run_started=now - 600
                )
        nodes.append(
            Node(
                name,
                Resources(r.choice((2000, 4000)), r.choice((2048, 4096)) * 2**20, slots),
                labels={"zone": r.choice("ab")},
                pods=tuple(pods),
                unschedulable=r.random() < 0.05,
            )
        )
    gated = []
    for k in range(r.randint(1, 40)):
        cls = r.choice(CLASSES)
        key = f"g{k}"
        batch = r.random() < 0.3
        pod = Pod(
            key,
            Resources.request(r.choice((0, 250, 500, 1500)), r.choice((0, 256, 1024)) * 2**20, 1),
            request_id=key,
            class_name=cls,
            priority=PRIORITY[cls] if priorities else 0,
            kind=WorkloadKind.BATCH if batch else WorkloadKind.SERVICE,
            runtime_seconds=r.choice((30.0, 700.0, 4000.0)) if batch else None,
        )
        accounts[key] = Account(r.uniform(0, 2000), r.uniform(0, 4000), RequestState.PENDING, now, 0.0, cls)
        selector = {"zone": r.choice("ab")} if r.random() < 0.2 else {}
        gated.append(GatedPod(pod, key, now - r.uniform(0, 100), selector))
    return World(tuple(nodes), running, tuple(gated), accounts, now)


def _run(
    world: World, settings: Settings, seed: int, fast: bool, monkeypatch: pytest.MonkeyPatch
) -> tuple[Decision, object]:
    monkeypatch.setattr(decide_mod, "_FAST_HOSTS", fast)
    rng = random.Random(seed)
    decision = decide(world, qos.QosPolicy(classes=DEFAULT_CLASSES, alpha_seconds=2.0), settings, rng)
    return decision, rng.getstate()


def test_free_host_choice_from_columns_takes_the_per_node_scores_decisions_and_draws(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chosen = 0
    choose = decide_mod._Hosts.choose_free

    def counted(self: decide_mod._Hosts, *args: object) -> str | None:
        nonlocal chosen
        out = choose(self, *args)  # type: ignore[arg-type]
        chosen += out is not None
        return out

    monkeypatch.setattr(decide_mod._Hosts, "choose_free", counted)
    releases = 0
    for seed in range(80):
        world = _world(seed)
        for settings in SETTINGS:
            fast = _run(world, settings, seed, True, monkeypatch)
            slow = _run(world, settings, seed, False, monkeypatch)
            assert fast == slow, (seed, settings)
            releases += len(fast[0].releases)
    assert releases > 500
    assert chosen > 500  # the column choice fired (it is not the per-node path twice)


def test_least_allocated_scores_equal_the_scalar_score() -> None:
    r = random.Random(3)
    nodes = [
        Node(
            f"n{i}",
            Resources(r.choice((0, 2000, 4000)), r.choice((0, 4096 * 2**20)), 110),
            pods=tuple(
                Pod(f"n{i}p{k}", Resources.request(r.choice((0, 900)), r.choice((0, 2**30)), 1), node_name=f"n{i}")
                for k in range(r.randint(0, 6))
            ),
        )
        for i in range(200)
    ]
    alloc = np.array([[n.allocatable.cpu_milli for n in nodes], [n.allocatable.memory_bytes for n in nodes]])
    nz = np.array(
        [[sum(packing._non_zero(p.requests)[d] for p in n.pods) for n in nodes] for d in (0, 1)],
        dtype=np.int64,
    )
    for req in (Resources.request(0, 0, 1), Resources.request(500, 2**29, 1), Resources.request(9000, 2**33, 1)):
        pod = Pod("x", req)
        got = packing.least_allocated_scores(alloc.astype(np.int64), nz, pod).tolist()
        assert got == [packing.least_allocated_score(n, pod) for n in nodes]
