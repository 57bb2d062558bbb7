"""Paper 004's workload characterisation (extender/core/characterise.py): hand-computed cases and properties.

The small cases use 6-hour intervals (4 per day) so every expected number can be checked by hand.
"""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from extender.core.characterise import (
    DAY_SECONDS,
    MODEL_FORMAT_VERSION,
    CharacteriseConfig,
    ModelFormatError,
    ServiceProfile,
    assign_class,
    class_peak,
    daily_profile,
    due_for_recluster,
    fit_classes,
    fit_model,
    idle_resources,
    is_complete,
    model_from_document,
    model_to_document,
    nearest_class,
    recluster,
    recluster_model,
    utilisation,
)
from extender.core.model import InvalidInputError

H6 = 21_600  # 6-hour intervals: 4 per day
NAN = float("nan")


def same(a: object, b: object) -> bool:
    return bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))


# ---------------------------------------------------------------------------------------------- profiles


def test_profile_takes_the_closest_sample_then_the_highest_day() -> None:
    # day 0: 00:00 -> 0.1 and 00:01:40 -> 0.5 (both nearest to 00:00; the closer one, 0.1, is kept even
    # though 0.5 is higher); 12:00 -> 0.9. day 1: 00:00:05 -> 0.3. Interval 00:00 = max(0.1, 0.3).
    p = daily_profile([0, 100, 43_200, DAY_SECONDS + 5], [0.1, 0.5, 0.9, 0.3], H6)
    assert same(p, [0.3, NAN, 0.9, NAN])


def test_profile_ties_go_to_the_earlier_grid_point_and_midnight_wraps() -> None:
    # 03:00 is as far from 00:00 as from 06:00 -> 00:00; 21:00 -> 18:00; 23:53:20 -> next day's 00:00.
    p = daily_profile([10_800, 75_600, 86_000], [0.7, 0.2, 0.4], H6)
    assert same(p, [0.7, NAN, NAN, 0.2])
    # the 23:53:20 sample belongs to the next midnight's interval 0: with it alone, only interval 0 is seen
    assert same(daily_profile([86_000], [0.4], H6), [0.4, NAN, NAN, NAN])


def test_profile_of_a_96_interval_day() -> None:
    # two days of 15-s samples, stopping short of the next midnight's half interval (a sample at 23:59:45
    # belongs to the next day's 00:00, the nearest grid point)
    times = np.arange(0, 2 * DAY_SECONDS - 450, 15.0)
    values = (times % DAY_SECONDS) / DAY_SECONDS  # a ramp over the day, the same both days
    p = daily_profile(times, values)
    assert p.shape == (96,)
    assert is_complete(p)
    assert p[0] == 0.0
    assert p[1] == pytest.approx(900 / DAY_SECONDS)
    assert not p.flags.writeable


def test_profile_bad_input_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="divid"):
        daily_profile([0], [0.1], 7)
    with pytest.raises(InvalidInputError, match="one length"):
        daily_profile([0, 1], [0.1], H6)
    with pytest.raises(InvalidInputError, match=">= 0"):
        daily_profile([0], [-0.1], H6)
    with pytest.raises(InvalidInputError, match="finite"):
        daily_profile([NAN], [0.1], H6)
    assert same(daily_profile([], [], H6), [NAN] * 4)


def test_utilisation_needs_a_request() -> None:
    assert utilisation(250, 1000) == 0.25
    with pytest.raises(InvalidInputError, match="request"):
        utilisation(1, 0)
    with pytest.raises(InvalidInputError, match="usage"):
        utilisation(-1, 10)


def _reference_profile(times: list[float], values: list[float], interval: int) -> list[float]:
    """The definition, slowly: per grid point the closest sample (earlier on a tie), per slot the max."""
    best: dict[int, tuple[float, float, float]] = {}
    for t, v in zip(times, values, strict=True):
        g = math.ceil(t / interval - 0.5)
        key = (abs(t - g * interval), t, v)
        if g not in best or key[:2] < best[g][:2]:
            best[g] = key
    slots = DAY_SECONDS // interval
    out = [NAN] * slots
    for g, (_, _, v) in best.items():
        s = g % slots
        out[s] = v if math.isnan(out[s]) else max(out[s], v)
    return out


samples = st.lists(
    st.tuples(st.integers(-3 * DAY_SECONDS, 5 * DAY_SECONDS), st.floats(0, 3, allow_nan=False)),
    max_size=60,
    unique_by=lambda s: s[0],
)


@settings(max_examples=200, deadline=None)
@given(samples, st.sampled_from([H6, 3600, 900]))
def test_profile_matches_its_definition(pairs: list[tuple[int, float]], interval: int) -> None:
    times = [float(t) for t, _ in pairs]
    values = [v for _, v in pairs]
    assert same(daily_profile(times, values, interval), _reference_profile(times, values, interval))


@settings(max_examples=100, deadline=None)
@given(samples, st.integers(-5, 5), st.randoms(use_true_random=False))
def test_profile_ignores_whole_day_shifts_and_sample_order(pairs: list[tuple[int, float]], days: int, rnd) -> None:  # type: ignore[no-untyped-def]
    times = [float(t) for t, _ in pairs]
    values = [v for _, v in pairs]
    base = daily_profile(times, values, H6)
    shuffled = list(zip(times, values, strict=True))
    rnd.shuffle(shuffled)
    assert same(daily_profile([t + days * DAY_SECONDS for t, _ in shuffled], [v for _, v in shuffled], H6), base)
    observed = base[np.isfinite(base)]
    assert all(v in values for v in observed)


# ---------------------------------------------------------------------------------------------- clustering


def test_kmeans_hand_case() -> None:
    c = fit_classes([[0, 0], [0, 1], [10, 10], [10, 11]], k=2, seeds=(0, 1, 2))
    centres = sorted(map(tuple, c.centres.tolist()))
    assert centres == [(0.0, 0.5), (10.0, 10.5)]
    assert c.inertia == pytest.approx(1.0)  # four points, each 0.5 from its centre
    assert c.labels[0] == c.labels[1] != c.labels[2] == c.labels[3]
    assert c.seed == 0  # every seed finds the optimum; the first is kept


def test_k_is_capped_by_distinct_profiles() -> None:
    c = fit_classes([[1, 1], [1, 1], [2, 2]], k=20)
    assert c.centres.shape == (2, 2)
    assert c.inertia == 0.0


def test_clustering_bad_input() -> None:
    with pytest.raises(InvalidInputError, match="complete"):
        fit_classes([[0, NAN]], k=1)
    with pytest.raises(InvalidInputError, match="non-empty"):
        fit_classes(np.zeros((0, 4)), k=1)
    with pytest.raises(InvalidInputError, match="k must"):
        fit_classes([[0, 1]], k=0)
    with pytest.raises(InvalidInputError, match="seed"):
        fit_classes([[0, 1]], k=1, seeds=())
    with pytest.raises(InvalidInputError, match="existing centres"):
        recluster([[0, 1, 2]], [[0, 1]], k=1)


def test_recluster_starts_from_the_existing_centres() -> None:
    x = [[0, 0], [0, 1], [10, 10], [10, 11]]
    first = fit_classes(x, k=2)
    again = recluster(first.centres, x, k=2)
    # already converged: the same centres, in the same order (class indices stay stable across cycles)
    assert same(again.centres, first.centres)
    assert again.seed is None
    grown = recluster(first.centres, [*x, [30, 30]], k=3)
    assert same(grown.centres[:2], first.centres)  # old classes kept their index
    assert grown.centres[2].tolist() == [30.0, 30.0]
    shrunk = recluster(grown.centres, [[0, 0], [1, 1]], k=3)  # fewer distinct profiles than old classes
    assert shrunk.centres.shape == (2, 2)


matrices = st.integers(1, 12).flatmap(
    lambda n: st.lists(
        st.lists(st.floats(0, 2, allow_nan=False).map(lambda v: round(v, 3)), min_size=4, max_size=4),
        min_size=n,
        max_size=n,
    )
)


@settings(max_examples=40, deadline=None)
@given(matrices, st.integers(1, 6))
def test_clustering_properties(x: list[list[float]], k: int) -> None:
    arr = np.array(x)
    c = fit_classes(arr, k, seeds=(0, 1, 2))
    distinct = np.unique(arr, axis=0).shape[0]
    assert c.centres.shape == (min(k, distinct), 4)
    assert len(c.labels) == len(x)
    d2 = ((arr[:, None, :] - c.centres[None, :, :]) ** 2).sum(axis=2)
    # a converged Lloyd run: each profile sits with (one of) its nearest centres
    for i, label in enumerate(c.labels):
        assert d2[i, label] <= d2[i].min() + 1e-9
    assert c.inertia == pytest.approx(float(sum(d2[i, label] for i, label in enumerate(c.labels))))
    # the best of the seeds is at least as good as each seed alone
    for seed in (0, 1, 2):
        assert c.inertia <= fit_classes(arr, k, seeds=(seed,)).inertia + 1e-12


# ---------------------------------------------------------------------------------------------- assignment


CENTRES = np.array([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])


def test_nearest_class_compares_observed_intervals_only() -> None:
    assert nearest_class(CENTRES, np.array([NAN, 0.9, NAN, NAN])) == 1
    assert nearest_class(CENTRES, np.array([0.4, NAN, NAN, NAN])) == 0
    assert nearest_class(CENTRES, np.array([0.5, NAN, NAN, NAN])) == 0  # tie -> lower index
    with pytest.raises(InvalidInputError, match="no observed"):
        nearest_class(CENTRES, np.array([NAN] * 4))
    with pytest.raises(InvalidInputError, match="do not match"):
        nearest_class(CENTRES, np.array([0.0, 1.0]))


def test_a_new_service_gets_a_class_only_after_the_observation_time() -> None:
    profile = np.array([0.9, 0.9, NAN, NAN])
    assert assign_class(CENTRES, profile, observed_seconds=11 * 3600, observation_seconds=12 * 3600) is None
    assert assign_class(CENTRES, profile, observed_seconds=12 * 3600, observation_seconds=12 * 3600) == 1
    with pytest.raises(InvalidInputError, match="observation_seconds"):
        assign_class(CENTRES, profile, 1.0, 0.0)


@settings(max_examples=100, deadline=None)
@given(matrices, st.lists(st.one_of(st.none(), st.floats(0, 2, allow_nan=False)), min_size=4, max_size=4))
def test_nearest_class_is_the_brute_force_argmin(centres: list[list[float]], raw: list[float | None]) -> None:
    assume(any(v is not None for v in raw))
    profile = np.array([NAN if v is None else v for v in raw])
    seen = [i for i, v in enumerate(raw) if v is not None]
    dist = [sum((c[i] - profile[i]) ** 2 for i in seen) for c in centres]
    got = nearest_class(np.array(centres), profile)
    assert dist[got] == min(dist)
    assert got == dist.index(min(dist))


# ---------------------------------------------------------------------------------------------- Eq. 3


PEAKY = np.array([0.25, 0.5, 0.75, 1.25])


def test_class_peak_is_the_max_over_the_window() -> None:
    assert class_peak(PEAKY, at=0, horizon_seconds=H6, interval_seconds=H6) == 0.25
    assert class_peak(PEAKY, at=100, horizon_seconds=H6, interval_seconds=H6) == 0.5  # straddles 2 intervals
    # 18:00 on day 3, 12 h: 18:00-24:00 and 00:00-06:00 of the next day (wraps)
    assert class_peak(PEAKY, at=3 * DAY_SECONDS + 64_800, horizon_seconds=43_200, interval_seconds=H6) == 1.25
    assert class_peak(PEAKY[::-1].copy(), at=64_800, horizon_seconds=43_200, interval_seconds=H6) == 1.25
    assert class_peak(PEAKY, at=0, horizon_seconds=10 * DAY_SECONDS, interval_seconds=H6) == 1.25
    with pytest.raises(InvalidInputError, match="centre must be 4"):
        class_peak(PEAKY[:3], at=0, horizon_seconds=H6, interval_seconds=H6)


def test_eq3_idle_is_request_minus_the_class_peak() -> None:
    # R = 1000 m, class peak 0.5 in 06:00-12:00 -> I = 1000 - 500
    assert idle_resources(1000, PEAKY, at=H6, horizon_seconds=H6, interval_seconds=H6) == 500
    # a class using more than it requested: I < 0, exactly as Eq. 3
    assert idle_resources(1000, PEAKY, at=3 * H6, horizon_seconds=H6, interval_seconds=H6) == -250
    # predicted usage rounds up: 3 * 0.5 = 1.5 -> 2 used, 1 idle
    assert idle_resources(3, PEAKY, at=H6, horizon_seconds=H6, interval_seconds=H6) == 1
    with pytest.raises(InvalidInputError, match="request"):
        idle_resources(-1, PEAKY, at=0, horizon_seconds=H6, interval_seconds=H6)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 64 * 2**30),
    st.lists(st.floats(0, 3, allow_nan=False), min_size=4, max_size=4),
    st.floats(-1e7, 1e7, allow_nan=False),
    st.floats(1, 2 * DAY_SECONDS, allow_nan=False),
)
def test_eq3_properties(request: int, centre: list[float], at: float, horizon: float) -> None:
    c = np.array(centre)
    idle = idle_resources(request, c, at, horizon, H6)
    peak = class_peak(c, at, horizon, H6)
    assert idle == request - math.ceil(request * peak)
    assert idle <= request
    assert min(centre) <= peak <= max(centre)
    # a longer window can only raise the peak, so only lower the idle prediction
    assert idle_resources(request, c, at, horizon + H6, H6) <= idle


# ---------------------------------------------------------------------------------------------- the model


def _profile(cpu: list[float], mem: list[float], observed: float = DAY_SECONDS) -> ServiceProfile:
    return ServiceProfile(np.array(cpu), np.array(mem), observed)


CFG = CharacteriseConfig(k=2, seeds=(0, 1), interval_seconds=H6)
SERVICES = {
    "web-a": _profile([0.1, 0.8, 0.9, 0.2], [0.5, 0.5, 0.5, 0.5]),
    "web-b": _profile([0.1, 0.7, 0.9, 0.1], [0.6, 0.6, 0.6, 0.6]),
    "night": _profile([0.9, 0.1, 0.1, 0.8], [0.2, 0.2, 0.2, 0.2]),
}


def test_fit_model_groups_daytime_and_night_services() -> None:
    m = fit_model(CFG, SERVICES, now=1000.0)
    cpu = m.assignments
    assert cpu["web-a"]["cpu"] == cpu["web-b"]["cpu"] != cpu["night"]["cpu"]
    got = np.array(sorted(m.centres("cpu").tolist()))
    assert got == pytest.approx(np.array([[0.1, 0.75, 0.9, 0.15], [0.9, 0.1, 0.1, 0.8]]))
    assert m.fitted_at == 1000.0
    assert not due_for_recluster(m, now=1000.0 + DAY_SECONDS - 1, recluster_seconds=DAY_SECONDS)
    assert due_for_recluster(m, now=1000.0 + DAY_SECONDS, recluster_seconds=DAY_SECONDS)


def test_fit_model_refuses_incomplete_or_misshaped_profiles() -> None:
    with pytest.raises(InvalidInputError, match="never observed"):
        fit_model(CFG, {"young": _profile([0.1, NAN, 0.1, 0.1], [0.1] * 4)}, now=0)
    with pytest.raises(InvalidInputError, match="expected 4"):
        fit_model(CFG, {"x": _profile([0.1] * 3, [0.1] * 3)}, now=0)
    with pytest.raises(InvalidInputError, match="no service"):
        fit_model(CFG, {}, now=0)
    with pytest.raises(InvalidInputError, match="same number"):
        _profile([0.1] * 4, [0.1] * 3)


def test_recluster_model_grows_the_data_set() -> None:
    m = fit_model(CFG, SERVICES, now=0.0)
    new = {"web-c": _profile([0.2, 0.8, 0.8, 0.2], [0.5] * 4), "night": _profile([1.0, 0.1, 0.1, 0.9], [0.2] * 4)}
    m2 = recluster_model(CFG, m, new, now=DAY_SECONDS)
    assert sorted(m2.dataset) == ["night", "web-a", "web-b", "web-c"]
    assert m2.dataset["night"]["cpu"] == (1.0, 0.1, 0.1, 0.9)  # replaced, not duplicated
    assert m2.assignments["web-c"]["cpu"] == m2.assignments["web-a"]["cpu"]
    with pytest.raises(InvalidInputError, match="refit"):
        recluster_model(CharacteriseConfig(k=2, interval_seconds=3600), m, {}, now=0)


def test_config_is_checked() -> None:
    assert CharacteriseConfig().slots == 96  # the paper's 96 x 15 min
    bads: list[dict[str, Any]] = [
        {"k": 0},
        {"seeds": ()},
        {"interval_seconds": 1000},
        {"observation_seconds": 0},
        {"max_iter": 0},
    ]
    for bad in bads:
        with pytest.raises(InvalidInputError):
            CharacteriseConfig(**bad)


# ---------------------------------------------------------------------------------------------- persistence


def test_model_document_round_trips_through_json() -> None:
    m = fit_model(CFG, SERVICES, now=123.5)
    doc = json.loads(json.dumps(model_to_document(m)))
    assert doc["version"] == MODEL_FORMAT_VERSION
    back = model_from_document(doc)
    for r in ("cpu", "memory"):
        assert same(back.centres(r), m.centres(r))
        assert back.classes[r].inertia == m.classes[r].inertia
        assert back.classes[r].seed == m.classes[r].seed
    assert back.dataset == m.dataset
    assert back.assignments == m.assignments
    assert (back.fitted_at, back.k, back.interval_seconds) == (123.5, 2, H6)


def _doc() -> dict:  # type: ignore[type-arg]
    return json.loads(json.dumps(model_to_document(fit_model(CFG, SERVICES, now=0.0))))  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(version=2), "version 2"),
        (lambda d: d.update(version=True), "version True"),
        (lambda d: d.update(format="other"), "format"),
        (lambda d: d.pop("classes"), "missing 'classes'"),
        (lambda d: d["classes"].pop("memory"), "missing 'memory'"),
        (lambda d: d["classes"]["cpu"].update(centres=[]), "non-empty"),
        (lambda d: d["classes"]["cpu"]["centres"][0].__setitem__(0, "x"), "not a finite number"),
        (lambda d: d["classes"]["cpu"]["centres"][0].append(0.5), "different lengths"),
        (lambda d: d["classes"]["cpu"].update(centres=[[0.1] * 5] * 2), "intervals"),
        (lambda d: d["assignments"]["web-a"].update(cpu=7), "class 7"),
        (lambda d: d["dataset"]["web-a"].update(cpu=[0.1]), "4 rates"),
        (lambda d: d.update(interval_seconds=1000), "divid"),
        (lambda d: d.update(fitted_at="now"), "fitted_at"),
        (lambda d: d.update(k=0), "k must be"),
    ],
)
def test_bad_model_documents_are_refused_clearly(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    doc = _doc()
    mutate(doc)
    with pytest.raises(ModelFormatError, match=message):
        model_from_document(doc)


def test_nan_in_a_document_is_refused() -> None:
    doc = json.loads(json.dumps(model_to_document(fit_model(CFG, SERVICES, now=0.0))).replace("0.75", "NaN", 1))
    with pytest.raises(ModelFormatError, match="finite"):
        model_from_document(doc)
    not_a_model: object
    for not_a_model in (None, [], "model", 3):
        with pytest.raises(ModelFormatError, match="JSON object"):
            model_from_document(not_a_model)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["format", "version", "interval_seconds", "k", "fitted_at", "classes", "dataset", "assignments"]),
    json_values,
)
def test_any_damaged_field_is_a_model_format_error(key: str, value: object) -> None:
    doc = _doc()
    doc[key] = value
    # the one acceptable failure; anything else (TypeError, KeyError...) fails the test
    with contextlib.suppress(ModelFormatError):
        model_from_document(doc)
