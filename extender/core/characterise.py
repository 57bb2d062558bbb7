"""Workload characterisation of long-running services (paper 004 §III "Workload characterization" /
"Behaviour identification", §V "Workload characterization") and the idle resources it predicts (Eq. 3).

Why: requests are not usage. A long-running service reserves far more than it uses, and batch pods can run on
the difference if we can say *in advance* how much of it the service will leave idle in the next interval.
Paper 004 does that by grouping services into classes of similar daily usage shape and predicting each service's
usage from its class, not from its own (short, noisy) history:

1. each service's usage trace is summarised as one value per interval of a day (96 x 15 min), the sample
   closest to the interval's start, the highest over the observed days (§V);
2. the summaries are clustered with k-means++ (k = 20 in the paper, 10 seeds, the best run kept) per
   resource, CPU and memory separately (Figs. 3 and 4);
3. the clustering is redone every cycle ``l`` (24 h) on the grown data set, starting from the existing
   centres (§III);
4. a new service is assigned to its nearest centre once it has been observed for ``p`` (12 h or 24 h, §V EOT);
5. its idle resources for the next interval are ``I_i = R_i - max_l(B_i)`` (Eq. 3).

Units. Profiles and centres are *utilisation rates*: usage divided by the service's request (1.0 = uses all
it requested), the unit the paper clusters and plots (Figs. 3-4 are in %). Clustering rates rather than
absolute amounts groups services by the *shape* of their day, whatever their size; ``B_i`` in Eq. 3 is then
the centre scaled by the service's own request ``R_i``.

Everything is pure: time is an argument (seconds; the time of day is ``t mod 86400``, i.e. UTC for epoch
seconds), arrays are returned read-only, and scikit-learn is only asked to cluster arrays with fixed seeds,
so the same input gives the same model. Persistence is split the same way: this module turns a model into a
versioned JSON-able document and back (refusing anything malformed with :class:`ModelFormatError`); the shell
that owns the file does the reading and writing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from sklearn.cluster import KMeans  # type: ignore[import-untyped]

from extender.core.model import InvalidInputError

__all__ = [
    "DAY_SECONDS",
    "MODEL_FORMAT",
    "MODEL_FORMAT_VERSION",
    "RESOURCES",
    "CharacteriseConfig",
    "Clustering",
    "ModelFormatError",
    "OwnLevel",
    "ResourceClasses",
    "ServiceProfile",
    "WorkloadModel",
    "assign_class",
    "class_peak",
    "classify_services",
    "daily_profile",
    "due_for_recluster",
    "fit_classes",
    "fit_model",
    "idle_resources",
    "is_complete",
    "model_from_document",
    "model_to_document",
    "nearest_class",
    "own_offset",
    "own_spread",
    "recluster",
    "recluster_model",
    "utilisation",
]

Array = npt.NDArray[np.float64]

DAY_SECONDS = 86_400
RESOURCES = ("cpu", "memory")
MODEL_FORMAT = "kube-qos-extender/workload-model"
MODEL_FORMAT_VERSION = 1


class ModelFormatError(InvalidInputError):
    """A persisted workload model that cannot be trusted (not JSON, wrong format or version, bad shapes).

    The owner of the file logs it and refits from the usage history: a restart must never run on half a model.
    """


# --------------------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------------------


def _finite_positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidInputError(f"{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class CharacteriseConfig:
    """The knobs of paper 004's characterisation, with the paper's values as defaults (§V, Table III).

    k: number of classes (the paper tried 10..30 and found 20 best); an upper bound: a cluster with fewer
       distinct services than k gets one class per distinct profile (k-means cannot make more).
    seeds: the k-means++ seeding runs; the lowest inertia wins (the paper: "10 different center seeds").
    interval_seconds: length of one interval of the day (15 min -> 96 intervals); must divide a day.
    observation_seconds: ``p``, how long a new service is watched before it is given a class (EOT; the paper's
       best case is 24 h, "20c-24h").
    recluster_seconds: ``l``, the re-clustering cycle (24 h: the traces follow a daily pattern).
    prediction_seconds: the "time interval in utilisation prediction" of Table III (15 min): the window
       ``l`` of Eq. 3's ``max_l``.
    max_iter: Lloyd iterations per k-means run (scikit-learn's default).
    """

    k: int = 20
    seeds: tuple[int, ...] = tuple(range(10))
    interval_seconds: int = 900
    observation_seconds: float = 24 * 3600.0
    recluster_seconds: float = 24 * 3600.0
    prediction_seconds: float = 900.0
    max_iter: int = 300

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise InvalidInputError(f"k must be an integer >= 1, got {self.k!r}")
        if not self.seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds):
            raise InvalidInputError(f"seeds must be a non-empty tuple of integers >= 0, got {self.seeds!r}")
        _check_interval(self.interval_seconds)
        _finite_positive("observation_seconds", self.observation_seconds)
        _finite_positive("recluster_seconds", self.recluster_seconds)
        _finite_positive("prediction_seconds", self.prediction_seconds)
        if isinstance(self.max_iter, bool) or not isinstance(self.max_iter, int) or self.max_iter < 1:
            raise InvalidInputError(f"max_iter must be an integer >= 1, got {self.max_iter!r}")

    @property
    def slots(self) -> int:
        """Intervals per day (96 for 15 min)."""
        return DAY_SECONDS // self.interval_seconds


def _check_interval(interval_seconds: int) -> None:
    if (
        isinstance(interval_seconds, bool)
        or not isinstance(interval_seconds, int)
        or interval_seconds <= 0
        or DAY_SECONDS % interval_seconds
    ):
        raise InvalidInputError(
            f"interval_seconds must be a positive integer dividing a day (86400 s), got {interval_seconds!r}"
        )


# --------------------------------------------------------------------------------------------------------
# 1. per-interval-of-day summary
# --------------------------------------------------------------------------------------------------------


def _frozen(a: Array) -> Array:
    a.setflags(write=False)
    return a


def utilisation(usage: float, request: float) -> float:
    """Usage as a fraction of the request, the unit profiles and centres are in.

    A service that requests nothing has no rate (and no reserved-but-idle capacity to lend): refused.
    """
    if not math.isfinite(usage) or usage < 0:
        raise InvalidInputError(f"usage must be a finite number >= 0, got {usage!r}")
    if not math.isfinite(request) or request <= 0:
        raise InvalidInputError(f"cannot characterise a service whose request is {request!r}: a rate needs > 0")
    return usage / request


def daily_profile(
    times: Sequence[float] | Array, values: Sequence[float] | Array, interval_seconds: int = 900
) -> Array:
    """One value per interval of the day: the sample closest to the interval's start, highest over the days.

    Paper 004 §V: "dividing each day into 96 uniform intervals ([0, 15min, ..., 1385min]), with the closest
    utilization rates regarded as those at that time. [...] every trace is summarized using 96 elements with
    each selected from the highest utilization in 8 days."

    Each sample is attached to its nearest grid point ``round(t / interval) * interval`` (a tie goes to the
    earlier grid point); a grid point keeps the sample closest to it (the earlier sample on a tie); an
    interval of the day is the maximum over the days of its grid points. Intervals no sample is within half
    an interval of, on any day, are NaN ("not observed"): a young service has a partial profile, which
    :func:`nearest_class` compares on the observed intervals only.

    Times are seconds (any origin whose multiples of 86400 are midnights: epoch seconds give UTC days);
    values are utilisation rates (:func:`utilisation`), finite and >= 0.
    """
    _check_interval(interval_seconds)
    t = np.asarray(times, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if t.ndim != 1 or v.ndim != 1 or t.shape != v.shape:
        raise InvalidInputError(f"times and values must be two sequences of one length, got {t.shape} and {v.shape}")
    if not np.all(np.isfinite(t)):
        raise InvalidInputError("times must be finite")
    if not np.all(np.isfinite(v)) or np.any(v < 0):
        raise InvalidInputError("values must be finite utilisation rates >= 0")
    slots = DAY_SECONDS // interval_seconds
    out = np.full(slots, np.nan)
    if t.size == 0:
        return _frozen(out)
    # Nearest grid point, ties to the earlier one: ceil(t/interval - 1/2).
    grid = np.ceil(t / interval_seconds - 0.5).astype(np.int64)
    distance = np.abs(t - grid * float(interval_seconds))
    # Per grid point the closest sample, then the earlier one: sort by (grid, distance, time), keep firsts.
    order = np.lexsort((t, distance, grid))
    g_sorted = grid[order]
    first = np.ones(g_sorted.size, dtype=bool)
    first[1:] = g_sorted[1:] != g_sorted[:-1]
    chosen_grid = g_sorted[first]
    chosen_value = v[order][first]
    slot = np.mod(chosen_grid, slots)
    np.fmax.at(out, slot, chosen_value)
    return _frozen(out)


def is_complete(profile: Array) -> bool:
    """Every interval of the day observed: only such profiles go into the clustering data set."""
    return bool(np.all(np.isfinite(profile)))


@dataclass(frozen=True, slots=True)
class ServiceProfile:
    """A service's two daily profiles (utilisation rates) and how long it has been observed.

    observed_seconds: span of its trace (last sample - first sample), compared with ``p`` before a new
    service is given a class.
    """

    cpu: Array
    memory: Array
    observed_seconds: float

    def __post_init__(self) -> None:
        for name in RESOURCES:
            a = getattr(self, name)
            if not isinstance(a, np.ndarray) or a.ndim != 1 or a.size == 0:
                raise InvalidInputError(f"{name} profile must be a non-empty 1-D array")
            if self.cpu.shape != a.shape:
                raise InvalidInputError("cpu and memory profiles must have the same number of intervals")
            if np.any(a[np.isfinite(a)] < 0) or np.any(np.isinf(a)):
                raise InvalidInputError(f"{name} profile must hold rates >= 0 or NaN (not observed)")
        if not math.isfinite(self.observed_seconds) or self.observed_seconds < 0:
            raise InvalidInputError(f"observed_seconds must be finite and >= 0, got {self.observed_seconds!r}")

    def of(self, resource: str) -> Array:
        if resource not in RESOURCES:
            raise InvalidInputError(f"unknown resource {resource!r} (expected one of {RESOURCES})")
        a: Array = getattr(self, resource)
        return a


# --------------------------------------------------------------------------------------------------------
# 2-3. k-means++ clustering and re-clustering
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Clustering:
    """One k-means result: centres (k x intervals), the label of each profile, its inertia.

    seed: the k-means++ seed of the winning run; None when the run started from given centres.
    """

    centres: Array
    labels: tuple[int, ...]
    inertia: float
    seed: int | None


def _check_dataset(profiles: Array | Sequence[Sequence[float]]) -> Array:
    x = np.array(profiles, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise InvalidInputError(f"the data set must be a non-empty (services x intervals) matrix, got {x.shape}")
    if not np.all(np.isfinite(x)):
        raise InvalidInputError("the data set must hold complete profiles (no NaN: every interval observed)")
    if np.any(x < 0):
        raise InvalidInputError("the data set must hold utilisation rates >= 0")
    return x


def _effective_k(x: Array, k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidInputError(f"k must be an integer >= 1, got {k!r}")
    distinct = int(np.unique(x, axis=0).shape[0])
    return min(k, distinct)


def _kmeans(
    x: Array, k: int, init: Array | str, seed: int, max_iter: int
) -> tuple[Array, npt.NDArray[np.int64], float]:
    km = KMeans(n_clusters=k, init=init, n_init=1, random_state=seed, max_iter=max_iter, algorithm="lloyd")
    km.fit(x)
    centres = np.asarray(km.cluster_centers_, dtype=np.float64)
    labels = np.asarray(km.labels_, dtype=np.int64)
    # Our own inertia of the final labels: the same definition for a fresh fit and a re-clustering.
    inertia = float(np.sum((x - centres[labels]) ** 2))
    return centres, labels, inertia


def fit_classes(
    profiles: Array | Sequence[Sequence[float]], k: int, seeds: Sequence[int] = tuple(range(10)), max_iter: int = 300
) -> Clustering:
    """k-means++ from scratch, one run per seed, the lowest inertia kept (paper 004 §V).

    The paper: "We run K-means++ with 10 different center seeds and select the best one in order to
    guarantee the stability of clustering". A tie keeps the earlier seed, so the result is deterministic.
    ``k`` is capped at the number of distinct profiles (see :class:`CharacteriseConfig`).
    """
    x = _check_dataset(profiles)
    if not seeds:
        raise InvalidInputError("at least one seed is needed")
    k_eff = _effective_k(x, k)
    best: Clustering | None = None
    for seed in seeds:
        centres, labels, inertia = _kmeans(x, k_eff, "k-means++", int(seed), max_iter)
        if best is None or inertia < best.inertia:
            best = Clustering(_frozen(centres), tuple(int(i) for i in labels), inertia, int(seed))
    assert best is not None
    return best


def _extend_centres(x: Array, centres: Array, k: int, seed: int) -> Array:
    """Add centres by k-means++ D² sampling, keeping the given ones (the data set grew past the old k)."""
    rng = np.random.default_rng(seed)
    out = [c for c in centres]
    while len(out) < k:
        c = np.asarray(out)
        d2 = np.min(((x[:, None, :] - c[None, :, :]) ** 2).sum(axis=2), axis=1)
        total = float(d2.sum())
        # k <= distinct profiles, so while len(out) < k some profile is off every centre: total > 0.
        idx = int(rng.choice(x.shape[0], p=d2 / total)) if total > 0 else int(np.argmax(d2))
        out.append(x[idx])
    return np.asarray(out, dtype=np.float64)


def recluster(
    centres: Array | Sequence[Sequence[float]],
    profiles: Array | Sequence[Sequence[float]],
    k: int,
    seed: int = 0,
    max_iter: int = 300,
) -> Clustering:
    """Re-cluster the grown data set starting from the existing centres (paper 004 §III: "The new task
    traces will be periodically integrated into the dataset for reclustering by K-means++ in a cycle l, with
    the existing centers as initial ones").

    When the data set now allows more classes than the old model had (up to ``k``), the extra initial centres
    are drawn by k-means++ D² sampling around the kept ones; when it allows fewer (services removed from the
    data set), the fit starts from scratch with ``seed``.
    """
    x = _check_dataset(profiles)
    c = np.array(centres, dtype=np.float64)
    if c.ndim != 2 or c.shape[1] != x.shape[1] or c.shape[0] == 0 or not np.all(np.isfinite(c)):
        raise InvalidInputError(f"existing centres must be a finite (k x {x.shape[1]}) matrix, got shape {c.shape}")
    k_eff = _effective_k(x, k)
    if c.shape[0] > k_eff:
        return fit_classes(x, k_eff, (seed,), max_iter)
    init = _extend_centres(x, c, k_eff, seed)
    new_centres, labels, inertia = _kmeans(x, k_eff, init, seed, max_iter)
    return Clustering(_frozen(new_centres), tuple(int(i) for i in labels), inertia, None)


# --------------------------------------------------------------------------------------------------------
# 4. behaviour identification
# --------------------------------------------------------------------------------------------------------


def nearest_class(centres: Array, profile: Array) -> int:
    """Index of the centre closest (Euclidean) to a profile over its *observed* intervals (paper 004 §III:
    "We calculate the distances between every center [...] and the new utilization trace of the underlying
    task in p, while the closest center is regarded as its class", O(dk)).

    A service observed for less than a day has NaN intervals: only the observed ones are compared, which is
    what "the trace in p" means. A tie goes to the lower index. A profile with nothing observed has no class.
    """
    c = np.asarray(centres, dtype=np.float64)
    p = np.asarray(profile, dtype=np.float64)
    if c.ndim != 2 or c.shape[0] == 0 or p.ndim != 1 or c.shape[1] != p.shape[0]:
        raise InvalidInputError(f"centres (k x n) and profile (n) do not match: {c.shape} vs {p.shape}")
    seen = np.isfinite(p)
    if not seen.any():
        raise InvalidInputError("the profile has no observed interval: no class can be assigned")
    d2 = ((c[:, seen] - p[seen]) ** 2).sum(axis=1)
    return int(np.argmin(d2))


def assign_class(centres: Array, profile: Array, observed_seconds: float, observation_seconds: float) -> int | None:
    """The class of a new service once it has been observed for ``p`` (paper 004 §III), else None.

    None means "no prediction yet": the service lends nothing (its idle resources count as 0 in Eq. 4), the
    safe side of "the shorter p is, the higher the chance of misestimation".
    """
    _finite_positive("observation_seconds", observation_seconds)
    if not math.isfinite(observed_seconds) or observed_seconds < 0:
        raise InvalidInputError(f"observed_seconds must be finite and >= 0, got {observed_seconds!r}")
    if observed_seconds < observation_seconds or not np.isfinite(np.asarray(profile, dtype=np.float64)).any():
        return None
    return nearest_class(centres, profile)


def classify_services(
    model: WorkloadModel, profiles: Mapping[str, ServiceProfile], observation_seconds: float
) -> dict[str, dict[str, int]]:
    """The classes of the services running now: a service in the model's data set keeps the class the last
    clustering gave it; any other is assigned by :func:`assign_class` per resource once observed for ``p``,
    and is left out (no prediction) before that or when its profile's intervals differ from the model's."""
    out: dict[str, dict[str, int]] = {}
    slots = DAY_SECONDS // model.interval_seconds
    for key, prof in profiles.items():
        known = model.assignments.get(key)
        if known is not None and set(known) == set(RESOURCES):
            out[key] = dict(known)
            continue
        if prof.cpu.shape != (slots,):
            continue
        got = {
            r: assign_class(model.centres(r), prof.of(r), prof.observed_seconds, observation_seconds) for r in RESOURCES
        }
        if all(v is not None for v in got.values()):
            out[key] = {r: int(v) for r, v in got.items() if v is not None}
    return out


# --------------------------------------------------------------------------------------------------------
# 5. prediction (Eq. 3)
# --------------------------------------------------------------------------------------------------------


def class_peak(centre: Array, at: float, horizon_seconds: float, interval_seconds: int = 900) -> float:
    """``max_l(B_i)`` of Eq. 3 as a rate: the highest value of the class centre over the intervals of the day
    that ``[at, at + horizon)`` overlaps (wrapping past midnight).

    With the paper's 15-min prediction window published at an interval's start this is one interval; a
    window that straddles a boundary takes the larger of the two, so the prediction never looks at less than
    the window it covers.
    """
    _check_interval(interval_seconds)
    _finite_positive("horizon_seconds", horizon_seconds)
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        raise InvalidInputError(f"at must be a finite number of seconds, got {at!r}")
    c = np.asarray(centre, dtype=np.float64)
    slots = DAY_SECONDS // interval_seconds
    if c.shape != (slots,) or not np.all(np.isfinite(c)):
        raise InvalidInputError(f"a centre must be {slots} finite rates, got shape {c.shape}")
    first = math.floor(at / interval_seconds)
    last = math.ceil((at + horizon_seconds) / interval_seconds) - 1
    count = min(last - first + 1, slots)
    idx = np.mod(np.arange(first, first + count), slots)
    return float(np.max(c[idx]))


def idle_resources(
    request: int,
    centre: Array,
    at: float,
    horizon_seconds: float,
    interval_seconds: int = 900,
    offset: float = 0.0,
) -> int:
    """Eq. 3 of paper 004: ``I_i = R_i - max_l(B_i)``, in the request's integer unit (millicores or bytes).

    ``B_i`` is the class centre (a rate) scaled by this service's request ``R_i``; the predicted usage is
    rounded *up*, so the idle amount is never over-stated by rounding. The result is signed, exactly as the
    equation: a class that uses more than it requested (rate > 1) predicts negative idle resources, which
    Eq. 4 then takes off the node's available amount (the service eats into what is left, too).

    ``offset``: a rate added to the class peak (the service's own level, :func:`own_offset`); the predicted
    rate is floored at 0, so no service is predicted to leave more idle than it requested.
    """
    if isinstance(request, bool) or not isinstance(request, int) or request < 0:
        raise InvalidInputError(f"request must be an integer >= 0, got {request!r}")
    if isinstance(offset, bool) or not isinstance(offset, (int, float)) or not math.isfinite(offset):
        raise InvalidInputError(f"offset must be a finite rate, got {offset!r}")
    rate = max(0.0, class_peak(centre, at, horizon_seconds, interval_seconds) + offset)
    return request - math.ceil(request * rate)


# --------------------------------------------------------------------------------------------------------
# 5b. the service's own level against its class (issue 33)
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OwnLevel:
    """How a service's own recent usage corrects its class prediction (:func:`own_offset`) and how much of
    its node's pooled spread is held back (:func:`own_spread`, :func:`extender.core.slack.pooled_margin`).

    Why: with one observed day (the paper has 8 and takes their highest) a class centre is the *mean* of its
    members' single days, so half the members sit above it; and the usage moves from one sample to the next
    (memory by a couple of percent) and from one day to the next. Eq. 3 alone then lends more than a service
    above its centre leaves idle, and the naive rule (the last sample's idle) lends exactly what one noisy
    sample left, so either is wrong about half of the time. The class keeps the *shape* of the day (a CPU
    ramp the last samples cannot foresee); the service's own residuals against that shape give its *level*
    today and how far its samples stray from it.

    window_seconds: how far back the residuals are read (the most recent intervals of the profile, so a
    day's drift is learnt within the window, not a day later).
    quantile: which quantile of those residuals is added to the class peak: 0.5 the service's typical level,
    higher a margin per service (1 = the highest residual seen in the window, the paper's "highest" rule on
    the recent intervals).
    node_sigmas: a node publishes its services' predicted idle minus this many standard deviations of their
    residuals, pooled (``sqrt(sum sd_i^2)``): batch pods are evicted when the *node's* real slack falls short,
    and the services' independent noise partly cancels in the node's sum, so a margin on the sum holds back
    less than the same margin on each service for the same risk. 0: no margin.
    """

    window_seconds: float = 7200.0
    quantile: float = 0.5
    node_sigmas: float = 1.0

    def __post_init__(self) -> None:
        _finite_positive("window_seconds", self.window_seconds)
        q = self.quantile
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 <= q <= 1:
            raise InvalidInputError(f"quantile must be a number in [0, 1], got {q!r}")
        z = self.node_sigmas
        if isinstance(z, bool) or not isinstance(z, (int, float)) or not math.isfinite(z) or z < 0:
            raise InvalidInputError(f"node_sigmas must be a finite number >= 0, got {z!r}")


def _recent_residuals(centre: Array, profile: Array, at: float, window_seconds: float, interval_seconds: int) -> Array:
    """``profile - centre`` over the intervals of the last ``window_seconds`` up to ``at`` that were observed.

    The profile is a daily profile (:func:`daily_profile`) of the last day, so interval ``j`` of the day holds
    the most recent sample near that time of day: the window is the interval nearest ``at`` (the grid point a
    sample at ``at`` is attached to) and the ``ceil(window / interval) - 1`` before it, wrapping past midnight.
    """
    _check_interval(interval_seconds)
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        raise InvalidInputError(f"at must be a finite number of seconds, got {at!r}")
    slots = DAY_SECONDS // interval_seconds
    c = np.asarray(centre, dtype=np.float64)
    p = np.asarray(profile, dtype=np.float64)
    if c.shape != (slots,) or not np.all(np.isfinite(c)):
        raise InvalidInputError(f"a centre must be {slots} finite rates, got shape {c.shape}")
    if p.shape != (slots,) or np.any(p[np.isfinite(p)] < 0) or np.any(np.isinf(p)):
        raise InvalidInputError(f"a profile must be {slots} rates >= 0 or NaN, got shape {p.shape}")
    last = math.ceil(at / interval_seconds - 0.5)
    count = min(slots, max(1, math.ceil(window_seconds / interval_seconds)))
    idx = np.mod(np.arange(last - count + 1, last + 1), slots)
    residuals = p[idx] - c[idx]
    return residuals[np.isfinite(residuals)]


def own_offset(
    centre: Array,
    profile: Array,
    at: float,
    own: OwnLevel,
    interval_seconds: int = 900,
) -> float | None:
    """The ``own.quantile`` of a service's residuals ``profile - centre`` (rates) over the intervals of the
    last ``own.window_seconds`` up to ``at`` (:func:`_recent_residuals`); None when none of them was observed
    (then there is nothing of its own to correct the class with). Signed: a service below its centre gets a
    negative offset (it leaves more idle than its class)."""
    residuals = _recent_residuals(centre, profile, at, own.window_seconds, interval_seconds)
    if residuals.size == 0:
        return None
    return float(np.quantile(residuals, own.quantile))


def own_spread(
    centre: Array,
    profile: Array,
    at: float,
    own: OwnLevel,
    interval_seconds: int = 900,
) -> float | None:
    """The standard deviation (rates) of the same residuals as :func:`own_offset`, with Bessel's correction;
    None with fewer than two observed intervals in the window (no spread can be estimated from one)."""
    residuals = _recent_residuals(centre, profile, at, own.window_seconds, interval_seconds)
    if residuals.size < 2:
        return None
    return float(np.std(residuals, ddof=1))


# --------------------------------------------------------------------------------------------------------
# the model: both resources' classes, the data set, persistence
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResourceClasses:
    """The classes of one resource: centres (k x intervals) and the k-means run they came from."""

    centres: Array
    inertia: float
    seed: int | None

    def __post_init__(self) -> None:
        c = self.centres
        if not isinstance(c, np.ndarray) or c.ndim != 2 or c.shape[0] == 0 or not np.all(np.isfinite(c)):
            raise InvalidInputError("centres must be a non-empty finite 2-D array")


@dataclass(frozen=True, slots=True)
class WorkloadModel:
    """A fitted characterisation: per resource the classes, the complete profiles they were fitted on (the
    data set the next re-clustering grows), each service's class, and when it was fitted.

    assignments: service key -> {resource: class index}, for the services in the data set.
    """

    interval_seconds: int
    k: int
    fitted_at: float
    classes: Mapping[str, ResourceClasses]
    dataset: Mapping[str, Mapping[str, tuple[float, ...]]]
    assignments: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_interval(self.interval_seconds)
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise InvalidInputError(f"k must be an integer >= 1, got {self.k!r}")
        if not math.isfinite(self.fitted_at):
            raise InvalidInputError(f"fitted_at must be finite, got {self.fitted_at!r}")
        slots = DAY_SECONDS // self.interval_seconds
        if set(self.classes) != set(RESOURCES):
            raise InvalidInputError(f"classes must be given for exactly {RESOURCES}, got {sorted(self.classes)}")
        for name, rc in self.classes.items():
            if rc.centres.shape[1] != slots:
                raise InvalidInputError(f"{name} centres have {rc.centres.shape[1]} intervals, expected {slots}")
        for key, rates in self.dataset.items():
            if set(rates) != set(RESOURCES) or any(len(rates[r]) != slots for r in RESOURCES):
                raise InvalidInputError(f"data set entry {key!r} must hold {slots} rates for each of {RESOURCES}")
        for key, labels in self.assignments.items():
            for r, i in labels.items():
                if r not in self.classes or not 0 <= i < self.classes[r].centres.shape[0]:
                    raise InvalidInputError(f"assignment of {key!r} to {r} class {i} does not exist")

    def centres(self, resource: str) -> Array:
        if resource not in self.classes:
            raise InvalidInputError(f"unknown resource {resource!r} (expected one of {RESOURCES})")
        return self.classes[resource].centres


def _dataset_matrix(dataset: Mapping[str, Mapping[str, Sequence[float]]], resource: str) -> tuple[list[str], Array]:
    keys = sorted(dataset)
    return keys, np.array([dataset[k][resource] for k in keys], dtype=np.float64)


def _complete_entries(profiles: Mapping[str, ServiceProfile]) -> dict[str, dict[str, tuple[float, ...]]]:
    out: dict[str, dict[str, tuple[float, ...]]] = {}
    for key, prof in profiles.items():
        if not all(is_complete(prof.of(r)) for r in RESOURCES):
            raise InvalidInputError(
                f"service {key!r} has intervals never observed: only complete profiles (>= 1 day) can be clustered"
            )
        out[key] = {r: tuple(float(x) for x in prof.of(r)) for r in RESOURCES}
    return out


def _build(
    config: CharacteriseConfig,
    dataset: dict[str, dict[str, tuple[float, ...]]],
    clusterings: Mapping[str, Clustering],
    keys: list[str],
    now: float,
) -> WorkloadModel:
    classes = {r: ResourceClasses(c.centres, c.inertia, c.seed) for r, c in clusterings.items()}
    assignments = {key: {r: clusterings[r].labels[i] for r in RESOURCES} for i, key in enumerate(keys)}
    return WorkloadModel(config.interval_seconds, config.k, float(now), classes, dataset, assignments)


def _check_profiles(config: CharacteriseConfig, profiles: Mapping[str, ServiceProfile]) -> None:
    for key, prof in profiles.items():
        if prof.cpu.shape != (config.slots,):
            raise InvalidInputError(
                f"service {key!r}: profile has {prof.cpu.shape[0]} intervals, expected {config.slots}"
            )


def fit_model(config: CharacteriseConfig, profiles: Mapping[str, ServiceProfile], now: float) -> WorkloadModel:
    """Fit both resources' classes from scratch on the complete profiles given (steps 1-2)."""
    _check_profiles(config, profiles)
    if not profiles:
        raise InvalidInputError("no service profiles to characterise")
    dataset = _complete_entries(profiles)
    keys = sorted(dataset)
    clusterings = {
        r: fit_classes(_dataset_matrix(dataset, r)[1], config.k, config.seeds, config.max_iter) for r in RESOURCES
    }
    return _build(config, dataset, clusterings, keys, now)


def recluster_model(
    config: CharacteriseConfig, model: WorkloadModel, new_profiles: Mapping[str, ServiceProfile], now: float
) -> WorkloadModel:
    """Step 3: integrate the new complete profiles into the data set (a service seen again replaces its old
    profile) and re-cluster each resource from the model's centres."""
    _check_profiles(config, new_profiles)
    if model.interval_seconds != config.interval_seconds:
        raise InvalidInputError(
            f"the model has {model.interval_seconds}-s intervals but the configuration {config.interval_seconds}-s:"
            " refit from scratch"
        )
    dataset = {k: dict(v) for k, v in model.dataset.items()}
    dataset.update(_complete_entries(new_profiles))
    keys = sorted(dataset)
    clusterings = {
        r: recluster(model.centres(r), _dataset_matrix(dataset, r)[1], config.k, config.seeds[0], config.max_iter)
        for r in RESOURCES
    }
    return _build(config, dataset, clusterings, keys, now)


def due_for_recluster(model: WorkloadModel, now: float, recluster_seconds: float) -> bool:
    """True once a cycle ``l`` has passed since the model was fitted."""
    _finite_positive("recluster_seconds", recluster_seconds)
    return now - model.fitted_at >= recluster_seconds


def model_to_document(model: WorkloadModel) -> dict[str, Any]:
    """A JSON-able, versioned document of the model (floats as JSON numbers, which round-trip exactly)."""
    return {
        "format": MODEL_FORMAT,
        "version": MODEL_FORMAT_VERSION,
        "interval_seconds": model.interval_seconds,
        "k": model.k,
        "fitted_at": model.fitted_at,
        "classes": {
            r: {"centres": rc.centres.tolist(), "inertia": rc.inertia, "seed": rc.seed}
            for r, rc in sorted(model.classes.items())
        },
        "dataset": {k: {r: list(v[r]) for r in RESOURCES} for k, v in sorted(model.dataset.items())},
        "assignments": {k: dict(sorted(v.items())) for k, v in sorted(model.assignments.items())},
    }


def _need(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str = "model") -> Any:
    if key not in doc:
        raise ModelFormatError(f"{where}: missing {key!r}")
    value = doc[key]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ModelFormatError(f"{where}.{key}: expected {kind}, got a boolean")
    if not isinstance(value, kind):
        raise ModelFormatError(f"{where}.{key}: expected {kind}, got {type(value).__name__}")
    return value


def _floats(values: Iterable[Any], where: str) -> tuple[float, ...]:
    out: list[float] = []
    for x in values:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise ModelFormatError(f"{where}: {x!r} is not a finite number")
        out.append(float(x))
    return tuple(out)


def model_from_document(doc: Any) -> WorkloadModel:
    """The model back from :func:`model_to_document`'s output; anything else raises :class:`ModelFormatError`.

    Every field is checked (format, version, shapes, finiteness, assignments within range), because a model
    that loads but is wrong would publish wrong slack with no error anywhere.
    """
    if not isinstance(doc, Mapping):
        raise ModelFormatError(f"model: expected a JSON object, got {type(doc).__name__}")
    if doc.get("format") != MODEL_FORMAT:
        raise ModelFormatError(f"model: format is {doc.get('format')!r}, expected {MODEL_FORMAT!r}")
    version = doc.get("version")
    if version != MODEL_FORMAT_VERSION or isinstance(version, bool):
        raise ModelFormatError(f"model: version {version!r} is not supported (this build reads {MODEL_FORMAT_VERSION})")
    interval = _need(doc, "interval_seconds", int)
    k = _need(doc, "k", int)
    fitted_at = _need(doc, "fitted_at", (int, float))
    if not math.isfinite(fitted_at):
        raise ModelFormatError("model.fitted_at: not finite")
    classes_doc = _need(doc, "classes", dict)
    classes: dict[str, ResourceClasses] = {}
    for r in RESOURCES:
        rc = _need(classes_doc, r, dict, "model.classes")
        rows = _need(rc, "centres", list, f"model.classes.{r}")
        if not rows or not all(isinstance(row, list) for row in rows):
            raise ModelFormatError(f"model.classes.{r}.centres: expected a non-empty list of lists")
        matrix = [_floats(row, f"model.classes.{r}.centres") for row in rows]
        if len({len(row) for row in matrix}) != 1:
            raise ModelFormatError(f"model.classes.{r}.centres: rows of different lengths")
        inertia = _need(rc, "inertia", (int, float), f"model.classes.{r}")
        seed = rc.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ModelFormatError(f"model.classes.{r}.seed: expected an integer or null, got {seed!r}")
        classes[r] = ResourceClasses(_frozen(np.array(matrix, dtype=np.float64)), float(inertia), seed)
    dataset_doc = _need(doc, "dataset", dict)
    dataset: dict[str, dict[str, tuple[float, ...]]] = {}
    for key, per in dataset_doc.items():
        if not isinstance(per, dict):
            raise ModelFormatError(f"model.dataset.{key}: expected an object")
        dataset[key] = {
            r: _floats(_need(per, r, list, f"model.dataset.{key}"), f"model.dataset.{key}.{r}") for r in RESOURCES
        }
    assignments_doc = _need(doc, "assignments", dict)
    assignments: dict[str, dict[str, int]] = {}
    for key, per in assignments_doc.items():
        if not isinstance(per, dict) or not all(isinstance(i, int) and not isinstance(i, bool) for i in per.values()):
            raise ModelFormatError(f"model.assignments.{key}: expected resource -> class index")
        assignments[key] = dict(per)
    try:
        return WorkloadModel(interval, k, float(fitted_at), classes, dataset, assignments)
    except InvalidInputError as exc:
        raise ModelFormatError(f"model: {exc}") from exc
