"""The guard rails' pure decision (extender/core/disruption.py, issue 32 part 4): budgets per node group and kind,
windows, dry-run; and their settings (the extender file's `disruption:` section)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.core.disruption import Action, Budget, Disruption, DisruptionKind, Window, decide, unlimited
from extender.settings import SettingsError, load_settings
from extender.settings.extender import ExtenderConfig

K = DisruptionKind
MON_2026_11_23 = 1795392000.0  # Monday 2026-11-23 00:00:00 UTC


def _mig(node: str, pod: str, group: str = "batch") -> Disruption:
    return Disruption(K.MIGRATION, node, group, pod)


def test_a_budget_of_one_node_lets_one_of_two_nodes_go_and_names_itself_for_the_other() -> None:
    b = Budget("one-node", group="batch", max_nodes=1)
    a, c = Disruption(K.CONSOLIDATION, "a", "batch"), Disruption(K.CONSOLIDATION, "c", "batch")
    v = decide([b], [], [a, c], 0.0)
    assert [x.action for x in v] == [Action.GO, Action.WAIT]
    assert v[1].budget == "one-node" and "1 node(s) of group batch in motion, at most 1" in v[1].reason
    # the node in motion may take more disruptions (its pods); another node still waits
    v = decide([b], [a], [_mig("a", "ns/p"), c], 0.0)
    assert [x.action for x in v] == [Action.GO, Action.WAIT]
    # once it is done, the other goes
    assert decide([b], [], [c], 0.0)[0].action is Action.GO


def test_groups_kinds_and_pods_are_counted_apart() -> None:
    b = Budget("pods", kinds=frozenset({K.PREEMPTION}), max_pods=1)  # every group, each counted apart
    moving = [Disruption(K.PREEMPTION, "n1", "batch", "ns/v1")]
    v = decide([b], moving, [Disruption(K.PREEMPTION, "n2", "batch", "ns/v2"),
                             Disruption(K.PREEMPTION, "s1", "service", "ns/v3"),
                             Disruption(K.SLACK_EVICTION, "n2", "batch", "ns/v4")], 0.0)  # fmt: skip
    assert [x.action for x in v] == [Action.WAIT, Action.GO, Action.GO]
    # the same pod again is not a second pod in motion
    assert decide([b], moving, [Disruption(K.PREEMPTION, "n1", "batch", "ns/v1")], 0.0)[0].action is Action.GO


def test_the_most_restrictive_budget_holds() -> None:
    loose, tight = Budget("loose", max_nodes=5), Budget("tight", group="batch", max_nodes=0)
    v = decide([loose, tight], [], [Disruption(K.CONSOLIDATION, "a", "batch")], 0.0)
    assert v[0].action is Action.WAIT and v[0].budget == "tight"


def test_a_budget_applies_only_inside_its_windows() -> None:
    # no disruption on weekdays 09:00-17:00 UTC
    office = Budget("office-hours", max_nodes=0, windows=(Window(9 * 60, 8 * 3600, frozenset(range(5))),))
    d = [Disruption(K.CONSOLIDATION, "a", "batch")]
    assert decide([office], [], d, MON_2026_11_23 + 10 * 3600)[0].action is Action.WAIT
    assert decide([office], [], d, MON_2026_11_23 + 8 * 3600)[0].action is Action.GO
    assert decide([office], [], d, MON_2026_11_23 + 17 * 3600)[0].action is Action.GO  # end is open
    assert decide([office], [], d, MON_2026_11_23 + 5 * 86400 + 10 * 3600)[0].action is Action.GO  # Saturday


def test_a_window_runs_past_midnight_into_the_next_day() -> None:
    w = Window(23 * 60, 2 * 3600, frozenset({6}))  # Sunday 23:00 for two hours
    sunday = MON_2026_11_23 - 86400
    assert w.contains(sunday + 23.5 * 3600) and w.contains(MON_2026_11_23 + 0.5 * 3600)
    assert not w.contains(MON_2026_11_23 + 1 * 3600) and not w.contains(MON_2026_11_23 + 23.5 * 3600)
    assert w.describe() == "sun 23:00 UTC for 7200s"


def test_bad_budgets_and_windows_are_refused() -> None:
    with pytest.raises(ValueError):
        Budget("x", max_nodes=-1)
    with pytest.raises(ValueError):
        Window(24 * 60, 60)
    with pytest.raises(ValueError):
        Window(0, 0)
    with pytest.raises(ValueError):
        Window(0, 60, frozenset({7}))
    assert unlimited([]) and unlimited([Budget("w", windows=())]) and not unlimited([Budget("n", max_pods=3)])


# ------------------------------------------------------------------------------------------ properties

_nodes = st.sampled_from(["n1", "n2", "n3", "n4", "s1"])
_disruptions = st.builds(
    lambda kind, node, pod: Disruption(kind, node, "service" if node == "s1" else "batch", pod),
    st.sampled_from(list(K)),
    _nodes,
    st.one_of(st.none(), st.sampled_from([f"ns/p{i}" for i in range(8)])),
)
_budgets = st.lists(
    st.builds(
        Budget,
        name=st.sampled_from(["a", "b", "c"]),
        group=st.sampled_from([None, "batch", "service"]),
        kinds=st.frozensets(st.sampled_from(list(K)), max_size=2),
        max_nodes=st.one_of(st.none(), st.integers(0, 3)),
        max_pods=st.one_of(st.none(), st.integers(0, 4)),
        windows=st.lists(
            st.builds(Window, st.integers(0, 1439), st.floats(60, 86400 * 2), st.frozensets(st.integers(0, 6))),
            max_size=2,
        ).map(tuple),
    ),
    max_size=3,
)
_now = st.floats(0, 3e9)


def _within(budgets: list[Budget], motion: list[Disruption], now: float) -> bool:
    """Every active budget holds for the whole motion, per group."""
    for b in budgets:
        if not b.active(now):
            continue
        for group in ("batch", "service"):
            covered = [m for m in motion if b.covers(m) and m.group == group]
            nodes = {m.node for m in covered}
            pods = {m.pod for m in covered if m.pod is not None}
            if b.max_nodes is not None and len(nodes) > b.max_nodes:
                return False
            if b.max_pods is not None and len(pods) > b.max_pods:
                return False
    return True


@settings(max_examples=300, deadline=None)
@given(_budgets, st.lists(_disruptions, max_size=6), _now)
def test_never_more_in_motion_than_the_budget(budgets: list[Budget], candidates: list[Disruption], now: float) -> None:
    """From a state within the budgets, what goes keeps it within them, whatever the candidates."""
    verdicts = decide(budgets, [], candidates, now)
    went = [v.disruption for v in verdicts if v.action is Action.GO]
    assert _within(budgets, went, now)
    assert [v.disruption for v in verdicts] == candidates
    for v in verdicts:
        assert (v.action is Action.WAIT) == (v.budget is not None)


@settings(max_examples=300, deadline=None)
@given(_budgets, st.lists(_disruptions, max_size=4), st.lists(_disruptions, max_size=6), _now)
def test_what_goes_adds_nothing_beyond_the_budget_even_on_a_state_already_over_it(
    budgets: list[Budget], motion: list[Disruption], candidates: list[Disruption], now: float
) -> None:
    """A budget lowered below what is in motion lets nothing new go that adds a node or a pod it counts."""
    verdicts = decide(budgets, motion, candidates, now)
    went: list[Disruption] = []
    for v in verdicts:
        if v.action is Action.GO:
            before = motion + went
            for b in budgets:
                if not (b.active(now) and b.covers(v.disruption)):
                    continue
                same = [m for m in before if b.covers(m) and m.group == v.disruption.group]
                nodes = {m.node for m in same}
                pods = {m.pod for m in same if m.pod is not None}
                if b.max_nodes is not None and v.disruption.node not in nodes:
                    assert len(nodes) < b.max_nodes
                if b.max_pods is not None and v.disruption.pod is not None and v.disruption.pod not in pods:
                    assert len(pods) < b.max_pods
            went.append(v.disruption)


@settings(max_examples=300, deadline=None)
@given(_budgets, st.lists(_disruptions, max_size=4), st.lists(_disruptions, max_size=6), _now)
def test_dry_run_changes_nothing_and_reports_what_would_go_on_its_own(
    budgets: list[Budget], motion: list[Disruption], candidates: list[Disruption], now: float
) -> None:
    """In dry-run nothing goes; each candidate that would go alone (nothing of the dry-run is in motion) is
    reported, each that would wait waits with the same budget."""
    dry = decide(budgets, motion, candidates, now, dry_run=True)
    assert all(v.action is not Action.GO for v in dry)
    for v in dry:
        alone = decide(budgets, motion, [v.disruption], now)[0]
        assert v.action is (Action.REPORT if alone.action is Action.GO else Action.WAIT)
        assert v.budget == alone.budget


@settings(max_examples=200, deadline=None)
@given(st.lists(_disruptions, max_size=6), st.lists(_disruptions, max_size=6), _now)
def test_without_budgets_everything_goes(motion: list[Disruption], candidates: list[Disruption], now: float) -> None:
    assert all(v.action is Action.GO for v in decide([], motion, candidates, now))


# ------------------------------------------------------------------------------------------ settings


def test_settings_default_to_nothing_capped_and_map_to_the_core() -> None:
    c = ExtenderConfig()
    assert c.disruption.budgets == () and not c.disruption.dry_run and c.disruption.honour_pdbs_for_migrations
    c = load_settings(
        ExtenderConfig,
        {"disruption": {"dry_run": True, "budgets": [
            {"name": "one-node", "group": "batch", "kinds": ["consolidation", "migration"], "max_nodes": 1},
            {"name": "nights", "max_pods": 0, "windows": [{"start": "22:30", "duration_seconds": 3600,
                                                           "weekdays": ["sat", "sun"]}]},
        ]}},
    )  # fmt: skip
    assert c.disruption.dry_run
    assert c.disruption.core_budgets == (
        Budget("one-node", "batch", frozenset({K.CONSOLIDATION, K.MIGRATION}), 1, None, ()),
        Budget("nights", None, frozenset(), None, 0, (Window(22 * 60 + 30, 3600.0, frozenset({5, 6})),)),
    )


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ({"budgets": [{"name": "a", "max_nodes": -1}]}, "disruption.budgets[0].max_nodes"),
        ({"budgets": [{"name": "a", "kinds": ["drain"]}]}, "disruption.budgets[0].kinds[0]"),
        ({"budgets": [{"name": "a", "windows": [{"start": "7:00", "duration_seconds": 60}]}]},
         "disruption.budgets[0].windows[0].start"),
        ({"budgets": [{"name": "a", "windows": [{"start": "07:00", "duration_seconds": 0}]}]},
         "disruption.budgets[0].windows[0].duration_seconds"),
        ({"budgets": [{"name": "a"}, {"name": "a"}]}, "disruption"),
        ({"dry_run": "yes"}, "disruption.dry_run"),
        ({"budget": []}, "disruption.budget"),
    ],
)  # fmt: skip
def test_settings_are_strict(raw: dict[str, object], path: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(ExtenderConfig, {"disruption": raw})
    assert path in str(err.value), str(err.value)
