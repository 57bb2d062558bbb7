"""The prioritize/filter fast paths (issue 17: every verb <= 5x the JSON floor at 5,000 nodes) against the
per-node reference on crowded inputs, and the node table's row-index cache against every way it can go stale.

Crowded: many nodes of one flavour holding the same pods, so the memory left after the pod repeats and the
few best keys are shared by many nodes (the case the BFD rank cut-off must widen for).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.core import packing
from extender.core.model import InvalidInputError
from extender.kube.snapshot import Snapshot
from extender.settings.extender import ExtenderConfig
from extender.webhook import verbs
from tests.test_webhook_snapshot import node, pod

CONFIG = ExtenderConfig()
NOW = 1_800_000_000.0


def args(p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": p, "NodeNames": names, "Nodes": None}


def crowded(seed: int, n: int, flavours: int, pod_sizes: int) -> Snapshot:
    """n nodes of ``flavours`` shapes, each with 0..3 pods of ``pod_sizes`` sizes: heavy ties in memory left."""
    rng = random.Random(seed)
    shapes = [(str(2 ** rng.randrange(1, 4)), f"{2 ** rng.randrange(1, 5)}Gi") for _ in range(flavours)]
    sizes = [(f"{rng.choice([100, 250, 500])}m", f"{rng.choice([256, 512, 1024])}Mi") for _ in range(pod_sizes)]
    snap = Snapshot(CONFIG)
    nodes = []
    for i in range(n):
        cpu, mem = rng.choice(shapes)
        nd = node(f"n{i}", cpu=cpu, memory=mem)
        if rng.random() < 0.05:
            nd["spec"]["unschedulable"] = True
        nodes.append(nd)
    snap.replace_nodes(nodes, "1", now=NOW)
    pods = []
    for i in range(n):
        for j in range(rng.randrange(4)):
            cpu, mem = rng.choice(sizes)
            pods.append(pod(f"p{i}-{j}", cpu=cpu, memory=mem, node_name=f"n{i}"))
    snap.replace_pods(pods, "1", now=NOW)
    return snap


def slow_prioritize(body: dict[str, Any], snap: Snapshot, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        m.setattr(verbs, "_VECTOR_MIN_NODES", 10**9)  # the per-node path: node views + packing.score_nodes
        return verbs.prioritize(body, snap, CONFIG, NOW).body


@pytest.mark.parametrize("flavours,pod_sizes", [(1, 1), (1, 2), (2, 1), (3, 3)])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fast_prioritize_equals_the_per_node_path_on_crowded_clusters(
    seed: int, flavours: int, pod_sizes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = crowded(seed, 400, flavours, pod_sizes)
    names = [f"n{i}" for i in range(400)]
    random.Random(seed).shuffle(names)
    for cpu, mem in (("100m", "128Mi"), ("1", "1Gi"), ("3", "6Gi")):
        body = args(pod("pending", cpu=cpu, memory=mem), names)
        fast = verbs.prioritize(body, snap, CONFIG, NOW).body
        assert fast == slow_prioritize(body, snap, monkeypatch)
        assert verbs.prioritize(body, snap, CONFIG, NOW).body == fast  # second call: the cached row index


def reference_rank_scores(m: list[int], c: list[int], feasible: list[bool]) -> list[int]:
    """Dense rank of (memory left, cpu left) over the feasible nodes, 10 for the best, floored at 0."""
    keys = sorted({(m[i], c[i]) for i in range(len(m)) if feasible[i]})
    rank = {k: r for r, k in enumerate(keys)}
    return [max(0, packing.MAX_EXTENDER_SCORE - rank[(m[i], c[i])]) if feasible[i] else 0 for i in range(len(m))]


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    n=st.integers(0, 400),
    distinct=st.integers(1, 30),
)
def test_bfd_rank_scores_equal_the_dense_rank_with_many_ties(data: st.DataObject, n: int, distinct: int) -> None:
    values = st.integers(0, distinct - 1)
    m = data.draw(st.lists(values, min_size=n, max_size=n))
    c = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    feasible = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    got = packing.bfd_rank_scores(np.array(m, np.int64), np.array(c, np.int64), np.array(feasible, np.bool_))
    assert got.tolist() == reference_rank_scores(m, c, feasible)


def test_bfd_rank_scores_with_few_distinct_values_among_the_smallest() -> None:
    """The case the old cut-off gave up on (fewer than 11 distinct values among the 11 smallest): the 11th
    distinct value sits far down the order, after hundreds of ties."""
    m = [0] * 300 + [1] * 300 + list(range(2, 40)) * 5
    c = [i % 7 for i in range(len(m))]
    feasible = [i % 11 != 3 for i in range(len(m))]
    got = packing.bfd_rank_scores(np.array(m, np.int64), np.array(c, np.int64), np.array(feasible, np.bool_))
    assert got.tolist() == reference_rank_scores(m, c, feasible)
    assert 0 < np.count_nonzero(got) < len(m)


# ------------------------------------------------------------------------------------------ row-index cache


def scores(snap: Snapshot, names: list[str], cpu: str = "1") -> list[dict[str, Any]]:
    body: list[dict[str, Any]] = verbs.prioritize(args(pod("pending", cpu=cpu), names), snap, CONFIG, NOW).body
    return body


def passing(snap: Snapshot, names: list[str], cpu: str = "1") -> list[str]:
    got: list[str] = verbs.filter_nodes(args(pod("pending", cpu=cpu), names), snap, CONFIG, NOW).body["NodeNames"]
    return got


def test_repeated_list_hits_the_cache_and_a_changed_layout_misses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = crowded(5, 60, 3, 3)
    names = [f"n{i}" for i in range(60)] + ["later"]
    first = scores(snap, names)
    key = "\0".join(names)
    assert snap.table.cached_index(key) is not None
    assert scores(snap, list(names)) == first  # an equal list, other string objects
    # a node named in the list appears: the cached -1 for it must not survive
    snap.apply_node("ADDED", node("later", cpu="64", memory="1Gi"), now=NOW)  # the fullest fit in memory
    assert snap.table.cached_index(key) is None
    after = scores(snap, names)
    assert after == slow_prioritize(args(pod("pending", cpu="1"), names), snap, monkeypatch)
    assert any(h["Host"] == "later" for h in after)
    # a node deleted and its row reused by another name: the list must not map to the newcomer's row
    snap.apply_node("DELETED", node("n0"), now=NOW)
    snap.apply_node("ADDED", node("other", cpu="64", memory="1Gi"), now=NOW)
    assert scores(snap, names) == slow_prioritize(args(pod("pending", cpu="1"), names), snap, monkeypatch)
    assert passing(snap, names) == [n for n in passing(snap, names[1:])]  # n0 is unknown: filtered out


def test_pod_changes_keep_the_cached_index_and_are_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Binding pods changes the used_* columns, not the rows: the index stays, the scores follow the pods."""
    snap = crowded(6, 60, 1, 1)
    names = [f"n{i}" for i in range(60)]
    before = scores(snap, names, cpu="2")
    index = snap.table.cached_index("\0".join(names))
    best = max(before, key=lambda h: h["Score"])["Host"]
    snap.apply_pod("ADDED", pod("filler", cpu="1", memory="1Gi", node_name=best), now=NOW)
    after = scores(snap, names, cpu="2")
    assert snap.table.cached_index("\0".join(names)) is index
    assert after == slow_prioritize(args(pod("pending", cpu="2"), names), snap, monkeypatch)
    assert after != before


def test_reordered_and_shortened_lists_are_not_served_the_last_index() -> None:
    snap = crowded(7, 50, 2, 2)
    names = [f"n{i}" for i in range(50)]
    passing(snap, names, cpu="1500m")
    reordered = list(reversed(names))
    assert passing(snap, reordered, cpu="1500m") == list(reversed(passing(snap, names, cpu="1500m")))
    assert set(passing(snap, names[:40], cpu="1500m")) <= set(names[:40])


def test_names_holding_a_nul_are_not_cached_and_duplicates_always_raise() -> None:
    snap = crowded(8, 40, 1, 1)
    names = [f"n{i}" for i in range(40)]
    nul = [*names[:-2], "n38\0n39"]  # joins like names[:-1] + ["n38", "n39"] would with one name fewer
    assert passing(snap, nul) == passing(snap, names[:-2])
    assert snap.table.cached_index("\0".join(nul)) is None
    passing(snap, names)
    for _ in range(2):  # the first refusal must not leave a cached index that lets the second through
        with pytest.raises(InvalidInputError, match="duplicate node name 'n3'"):
            scores(snap, [*names, "n3"])
        with pytest.raises(InvalidInputError, match="duplicate node name 'ghost'"):
            passing(snap, [*names, "ghost", "ghost"])
