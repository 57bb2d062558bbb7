"""The class prediction corrected by each service's own level (issue 33 part 4): ``core.characterise.own_offset``
(the quantile of a service's recent residuals against its class centre), ``core.slack.service_idle`` with it,
the ``slack.own_level`` setting and the controller's plan. The live controller publishing it through the real
API server and Prometheus is e2e/test_slack_kwok.py's."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.colocation.controller import plan, settings_from_config
from extender.core.characterise import (
    DAY_SECONDS,
    CharacteriseConfig,
    OwnLevel,
    ServiceProfile,
    fit_model,
    idle_resources,
    own_offset,
    own_spread,
)
from extender.core.model import DEFAULT_CLASSES, InvalidInputError, Node, Pod, Resources, WorkloadKind
from extender.core.slack import Amount, batch_capacity, pooled_margin, service_idle, service_spread
from extender.settings.sections import OwnLevelSettings, PodDefaults, SlackConfig

SLOTS = 96
GI = 2**30
HOUR = 3600.0
CFG = CharacteriseConfig(k=2, seeds=(0,), observation_seconds=20.0)


def _flat(v: float) -> np.ndarray:
    return np.full(SLOTS, v)


def _model(now: float = 0.0) -> Any:
    """Two classes, flat at a quarter and three quarters of the request all day, both resources."""
    return fit_model(
        CFG,
        {
            "fixture/quarter": ServiceProfile(_flat(0.25), _flat(0.25), DAY_SECONDS),
            "fixture/three-quarters": ServiceProfile(_flat(0.75), _flat(0.75), DAY_SECONDS),
        },
        now=now,
    )


# ------------------------------------------------------------------------------------------------ own_offset


def test_a_service_above_its_centre_gets_the_difference_whatever_the_quantile() -> None:
    for q in (0.0, 0.5, 0.9, 1.0):
        assert own_offset(_flat(0.25), _flat(0.3), 12 * HOUR, OwnLevel(7200.0, q)) == pytest.approx(0.05)
        assert own_offset(_flat(0.25), _flat(0.2), 12 * HOUR, OwnLevel(7200.0, q)) == pytest.approx(-0.05)


def test_the_window_is_the_latest_intervals_up_to_now_wrapping_past_midnight() -> None:
    centre = _flat(0.5)
    profile = _flat(0.5)
    profile[[94, 95, 0]] = [0.6, 0.7, 0.8]  # 23:30, 23:45 and 00:00
    profile[1] = 5.0  # 00:15: yesterday's sample when it is 00:00 now, outside the window
    own = OwnLevel(3 * 900.0, 1.0)
    assert own_offset(centre, profile, 0.0, own) == pytest.approx(0.3)  # max of 0.1, 0.2, 0.3
    assert own_offset(centre, profile, DAY_SECONDS * 5.0, own) == pytest.approx(0.3)  # any day, same time
    assert own_offset(centre, profile, 300.0, own) == pytest.approx(0.3)  # 00:05: the nearest interval is 00:00
    assert own_offset(centre, profile, 500.0, own) == pytest.approx(4.5)  # 00:08:20: 00:15 is the latest now
    assert own_offset(centre, profile, 0.0, OwnLevel(3 * 900.0, 0.5)) == pytest.approx(0.2)  # the median
    assert own_offset(centre, profile, 0.0, OwnLevel(3 * 900.0, 0.0)) == pytest.approx(0.1)  # the least


def test_unobserved_intervals_are_skipped_and_none_observed_is_no_offset() -> None:
    centre = _flat(0.5)
    profile = np.full(SLOTS, np.nan)
    assert own_offset(centre, profile, 12 * HOUR, OwnLevel()) is None
    profile[47] = 0.6  # 11:45, in the two hours before noon
    assert own_offset(centre, profile, 12 * HOUR, OwnLevel()) == pytest.approx(0.1)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="quantile"):
        OwnLevel(7200.0, 1.5)
    with pytest.raises(InvalidInputError, match="window_seconds"):
        OwnLevel(0.0, 0.9)
    with pytest.raises(InvalidInputError, match="profile"):
        own_offset(_flat(0.5), np.full(48, 0.5), 0.0, OwnLevel())
    with pytest.raises(InvalidInputError, match="centre"):
        own_offset(np.full(48, 0.5), _flat(0.5), 0.0, OwnLevel())
    with pytest.raises(InvalidInputError, match="offset"):
        idle_resources(1000, _flat(0.5), 0.0, 900.0, 900, math.nan)


rates = st.floats(min_value=0.0, max_value=1.5, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(
    centre=st.lists(rates, min_size=SLOTS, max_size=SLOTS),
    profile=st.lists(rates, min_size=SLOTS, max_size=SLOTS),
    at=st.floats(min_value=0.0, max_value=10 * DAY_SECONDS),
    window=st.floats(min_value=1.0, max_value=DAY_SECONDS),
    q=st.floats(min_value=0.0, max_value=1.0),
    shift=st.floats(min_value=0.0, max_value=0.5),
)
def test_offset_properties(
    centre: list[float], profile: list[float], at: float, window: float, q: float, shift: float
) -> None:
    c, p = np.array(centre), np.array(profile)
    got = own_offset(c, p, at, OwnLevel(window, q))
    assert got is not None
    # between the least and the highest residual in the window, and never below a lower quantile's
    last = math.ceil(at / 900 - 0.5)
    count = min(SLOTS, max(1, math.ceil(window / 900)))
    idx = np.mod(np.arange(last - count + 1, last + 1), SLOTS)
    r = p[idx] - c[idx]
    assert r.min() - 1e-12 <= got <= r.max() + 1e-12
    assert own_offset(c, p, at, OwnLevel(window, q / 2)) <= got + 1e-12  # type: ignore[operator]
    # a service using ``shift`` more everywhere gets ``shift`` more offset (its level, learnt)
    assert own_offset(c, p + shift, at, OwnLevel(window, q)) == pytest.approx(got + shift, abs=1e-9)


# ------------------------------------------------------------------------------------------------ service_idle


def test_service_idle_without_own_level_is_eq3_and_with_it_follows_the_service() -> None:
    m = _model()
    cls = m.assignments["fixture/quarter"]
    req = Resources(2000, 4 * GI)
    eq3 = service_idle(m, cls, req, 12 * HOUR, 900.0)
    assert eq3 == Amount(1500, 3 * GI)
    on_centre = ServiceProfile(_flat(0.25), _flat(0.25), DAY_SECONDS)
    assert service_idle(m, cls, req, 12 * HOUR, 900.0, on_centre, OwnLevel()) == eq3  # residual 0: Eq. 3
    assert service_idle(m, cls, req, 12 * HOUR, 900.0, None, OwnLevel()) == eq3  # no profile: Eq. 3
    above = ServiceProfile(_flat(0.3), _flat(0.35), DAY_SECONDS)
    assert service_idle(m, cls, req, 12 * HOUR, 900.0, above, None) == eq3  # own level off: Eq. 3
    got = service_idle(m, cls, req, 12 * HOUR, 900.0, above, OwnLevel())
    assert got == Amount(2000 - math.ceil(2000 * (0.25 + (0.3 - 0.25))), 4 * GI - math.ceil(4 * GI * 0.35))
    below = ServiceProfile(_flat(0.1), _flat(0.2), DAY_SECONDS)  # below its centre: lends more than Eq. 3
    more = service_idle(m, cls, req, 12 * HOUR, 900.0, below, OwnLevel())
    assert more.cpu_milli > eq3.cpu_milli and more.memory_bytes > eq3.memory_bytes
    idle_all = service_idle(m, m.assignments["fixture/three-quarters"], req, 0.0, 900.0, ServiceProfile(
        _flat(0.0), _flat(0.0), DAY_SECONDS), OwnLevel())  # fmt: skip
    assert idle_all == Amount(2000, 4 * GI)  # the predicted rate is floored at 0: never more than the request


@settings(max_examples=60, deadline=None)
@given(
    noise=st.lists(st.floats(min_value=-0.1, max_value=0.1), min_size=SLOTS, max_size=SLOTS),
    at=st.floats(min_value=0.0, max_value=DAY_SECONDS),
)
def test_with_the_highest_residual_a_flat_class_never_lends_more_than_any_recent_interval_left(
    noise: list[float], at: float
) -> None:
    """Quantile 1 on a flat centre: the lent amount is at most what the service left idle at every interval
    of the window (the paper's "highest" rule, on the service's own recent intervals)."""
    m = _model()
    cls = m.assignments["fixture/three-quarters"]
    req = Resources(1000, 2 * GI)
    profile = np.clip(0.75 + np.array(noise), 0.0, None)
    prof = ServiceProfile(profile, profile, DAY_SECONDS)
    own = OwnLevel(7200.0, 1.0)
    got = service_idle(m, cls, req, at, 900.0, prof, own)
    last = math.ceil(at / 900 - 0.5)
    for j in np.mod(np.arange(last - 7, last + 1), SLOTS):
        assert got.cpu_milli <= req.cpu_milli - req.cpu_milli * profile[j] + 1e-6
        assert got.memory_bytes <= req.memory_bytes - req.memory_bytes * profile[j] + 1e-3


def test_plan_passes_each_pods_profile() -> None:
    m = _model()
    req = Resources.request(2000, 4 * GI)
    pods = [Pod(n, req, namespace="ns", kind=WorkloadKind.SERVICE) for n in ("a", "b")]
    node = Node("n1", Resources(8000, 16 * GI, 110), pods=tuple(pods))
    classes = {p.key: m.assignments["fixture/quarter"] for p in pods}
    profiles = {"ns/a": ServiceProfile(_flat(0.3), _flat(0.3), DAY_SECONDS)}  # b has none: Eq. 3
    got = plan(m, [node], classes, 12 * HOUR, 900.0, profiles, OwnLevel())
    a = service_idle(m, classes["ns/a"], req, 12 * HOUR, 900.0, profiles["ns/a"], OwnLevel())
    assert got == {"n1": a + Amount(1500, 3 * GI)}
    assert plan(m, [node], classes, 12 * HOUR, 900.0) == {"n1": Amount(3000, 6 * GI)}
    # a's memory strays: the node holds back node_sigmas of it (b has no profile: no spread)
    noisy = _flat(0.3)
    noisy[47] = 0.4
    profiles = {"ns/a": ServiceProfile(_flat(0.3), noisy, DAY_SECONDS)}
    own = OwnLevel(7200.0, 0.5, 2.0)
    a = service_idle(m, classes["ns/a"], req, 12 * HOUR, 900.0, profiles["ns/a"], own)
    margin = service_spread(m, classes["ns/a"], req, 12 * HOUR, profiles["ns/a"], own)
    assert margin.memory_bytes > 0
    want = a + Amount(1500, 3 * GI)
    got = plan(m, [node], classes, 12 * HOUR, 900.0, profiles, own)
    assert got == {"n1": Amount(want.cpu_milli, want.memory_bytes - math.ceil(2.0 * margin.memory_bytes))}


# ------------------------------------------------------------------------------------------------ settings


def test_the_setting_reaches_the_controller() -> None:
    on = SlackConfig()
    assert on.own_level.core() == OwnLevel(7200.0, 0.5, 1.0) == OwnLevel()
    params = settings_from_config(on, DEFAULT_CLASSES, PodDefaults())
    assert params.own_level == OwnLevel()
    off = SlackConfig(own_level=OwnLevelSettings(enabled=False))
    assert settings_from_config(off, DEFAULT_CLASSES, PodDefaults()).own_level is None
    custom = SlackConfig.model_validate({"own_level": {"window_seconds": 3600, "quantile": 1, "node_sigmas": 0}})
    assert custom.own_level.core() == OwnLevel(3600.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="quantile"):
        SlackConfig.model_validate({"own_level": {"quantile": 1.5}})
    with pytest.raises(ValueError, match="node_sigmas"):
        SlackConfig.model_validate({"own_level": {"node_sigmas": -1}})


# ------------------------------------------------------------------------------------------------ the node's margin


def test_spread_is_the_sample_standard_deviation_of_the_windows_residuals() -> None:
    centre = _flat(0.5)
    profile = _flat(0.5)
    profile[[45, 46, 47]] = [0.4, 0.6, 0.5]  # 11:15, 11:30, 11:45; noon is 0.5 too
    own = OwnLevel(4 * 900.0)
    assert own_spread(centre, profile, 12 * HOUR, own) == pytest.approx(np.std([-0.1, 0.1, 0.0, 0.0], ddof=1))
    one = np.full(SLOTS, np.nan)
    one[48] = 0.7
    assert own_spread(centre, one, 12 * HOUR, own) is None  # one interval: no spread
    assert own_spread(centre, _flat(0.9), 12 * HOUR, own) == 0.0  # a constant offset is a level, not a spread


def test_the_pooled_margin_is_sigmas_times_the_root_of_the_summed_squares() -> None:
    assert pooled_margin([Amount(30, 3), Amount(40, 4)], 1.0) == Amount(50, 5)
    assert pooled_margin([Amount(30, 3), Amount(40, 4)], 2.0) == Amount(100, 10)
    assert pooled_margin([Amount(10, 1)] * 4, 1.0) == Amount(20, 2)  # 4 alike: 2 sd, not 4
    assert pooled_margin([], 3.0) == Amount(0, 0)
    assert pooled_margin([Amount(1, 1)], 0.5) == Amount(1, 1)  # rounded up: never hold back less
    with pytest.raises(InvalidInputError, match="sigmas"):
        pooled_margin([Amount(1, 1)], -1.0)
    with pytest.raises(InvalidInputError, match="negative"):
        pooled_margin([Amount(-1, 1)], 1.0)


@settings(max_examples=60, deadline=None)
@given(sds=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**9)), max_size=12), z=st.floats(0.0, 5.0))
def test_pooling_never_holds_back_more_than_the_per_service_margins(sds: list[tuple[int, int]], z: float) -> None:
    spreads = [Amount(c, m) for c, m in sds]
    got = pooled_margin(spreads, z)
    assert got.cpu_milli <= math.ceil(z * sum(a.cpu_milli for a in spreads)) + 1
    assert got.memory_bytes <= math.ceil(z * sum(a.memory_bytes for a in spreads)) + 1
    assert got.cpu_milli >= z * max((a.cpu_milli for a in spreads), default=0) - 1e-6


def test_a_node_publishes_its_predicted_idle_less_the_pooled_margin() -> None:
    req = Resources.request(1000, GI)
    pods = [Pod(n, req, namespace="ns", kind=WorkloadKind.SERVICE) for n in ("a", "b", "c")]
    node = Node("n1", Resources(8000, 16 * GI, 110), pods=tuple(pods))
    idle = {"ns/a": Amount(500, GI // 2), "ns/b": Amount(500, GI // 2)}  # c has no prediction: lends nothing
    spread = {"ns/a": Amount(30, 3 * 2**20), "ns/b": Amount(40, 4 * 2**20), "ns/c": Amount(10**6, GI)}
    assert batch_capacity([node], idle) == {"n1": Amount(1000, GI)}
    assert batch_capacity([node], idle, spread, 2.0) == {"n1": Amount(1000 - 100, GI - 10 * 2**20)}
    assert batch_capacity([node], idle, spread, 1000.0) == {"n1": Amount(0, 0)}  # floored at 0


def test_service_spread_is_the_residual_spread_times_the_request() -> None:
    m = _model()
    cls = m.assignments["fixture/quarter"]
    profile = _flat(0.25)
    profile[[46, 47]] = [0.2, 0.3]
    prof = ServiceProfile(profile, _flat(0.25), DAY_SECONDS)
    own = OwnLevel(4 * 900.0)
    sd = float(np.std([-0.05, 0.05, 0.0, 0.0], ddof=1))
    assert service_spread(m, cls, Resources.request(2000, 4 * GI), 12 * HOUR, prof, own) == Amount(
        math.ceil(2000 * sd), 0
    )
    assert service_spread(m, cls, Resources.request(2000, 4 * GI), 12 * HOUR, None, own) == Amount(0, 0)
