"""SYNTHETIC service-usage traces and the `services-batch` workload (issue 16, deliverable 4).

Why synthetic: the only traces in /work/shared/data are the Alibaba 2017 ``batch_task.csv`` (batch requests,
no usage of long-running services) and paper 002's validation set. Co-location lends what services reserve
and do not use, so the simulator needs *service usage over days*; we generate it from what paper 004
(Zhong et al., CTCL) publishes about its Alibaba 2018 services, and say where each number comes from:

* CPU usage is low: "the actual CPU utilization of these tasks is very low (9.5% on average)" (§V-A, Fig. 1)
  -> ``cpu_mean_rate = 0.095`` of the request;
* memory usage is high: "average memory usage of 80.6%" (§V-A, Fig. 1) -> ``memory_mean_rate = 0.806``;
* CPU follows a diurnal pattern, "obviously higher during daytime (9:00 - 21:00)" (§V-C, Fig. 3)
  -> ``day_hours = (9, 21)``;
* memory "is relatively stable without dramatic fluctuation over time" (§V-C, Fig. 4) -> a flat memory day
  with a small noise.

Everything else is ASSUMED (the paper gives no number for it; its Figs. 1-4 are images, absent from the text
copy in /work/shared/seeds, so nothing could be digitised): how much higher the day is than the night per
service family, the per-service spread around the paper's means, the sample noise, the day-to-day drift, the
rare spikes, and the services' request sizes. Each such field says ASSUMED below; every generated number is
SYNTHETIC and the JSON report, README and sim README say so.

Batch: the Alibaba 2017 batch tasks (``batch_task.csv``, one pod per Terminated task, its request and
runtime), their time of day taken as ``task_create_time mod 86400`` (the trace's clock has no known origin),
drawn ``batch_per_day`` a day for every simulated day.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from extender.core.characterise import DAY_SECONDS
from extender.core.model import InvalidInputError, NodeGroup, WorkloadKind
from extender.sim.workloads import (
    ALIBABA_DEFAULT_PATH,
    GIB,
    HTAS_FLAVOURS,
    MIB,
    RequestSpec,
    Workload,
    load_alibaba2017,
)

__all__ = ["SERVICES_BATCH", "ServiceUsage", "ServiceUsageParams", "services_batch"]

Array = npt.NDArray[np.float64]
SERVICES_BATCH = "services-batch"


@dataclass(frozen=True, slots=True)
class ServiceUsageParams:
    """The SYNTHETIC generator's knobs. Cited fields name paper 004's section/figure; ASSUMED ones have none."""

    services: int = 48  # ASSUMED: enough services for k = 20 classes to mean something
    days: int = 3  # day 1 = the observation period (slack.classify_seconds = 1 day), then 2 days of co-location
    sample_seconds: int = 300  # ASSUMED: a usage sample every 5 min (the controller refreshes every 15 min)
    cpu_mean_rate: float = 0.095  # paper 004 §V-A, Fig. 1: services' CPU utilisation 9.5 % on average
    memory_mean_rate: float = 0.806  # paper 004 §V-A, Fig. 1: average memory usage 80.6 %
    day_hours: tuple[float, float] = (9.0, 21.0)  # paper 004 §V-C, Fig. 3: CPU higher during 9:00 - 21:00
    day_night_ratios: tuple[float, ...] = (1.0, 2.0, 4.0)  # ASSUMED: service families, day level / night level
    ramp_seconds: float = 3600.0  # ASSUMED: an hour to go from the night level to the day level
    service_spread: float = 0.5  # ASSUMED: a service's mean is the paper's mean x U(1 - s, 1 + s)
    cpu_noise: float = 0.15  # ASSUMED: per-sample lognormal sigma of CPU
    memory_noise: float = 0.02  # ASSUMED: per-sample lognormal sigma of memory (Fig. 4: "relatively stable")
    day_drift: float = 0.10  # ASSUMED: per-day level lognormal sigma (each day differs a little)
    spike_probability: float = 0.002  # ASSUMED: chance a CPU sample is a spike
    spike_factor: float = 3.0  # ASSUMED: a spike multiplies the CPU sample by this
    # ASSUMED: request sizes (cpu millicores, memory bytes), drawn uniformly; memory-heavy as §V-A describes
    sizes: tuple[tuple[int, int], ...] = ((250, 512 * MIB), (500, 1 * GIB), (1000, 2 * GIB))
    service_class: str = "silver"
    batch_per_day: int = 6000  # Alibaba 2017 batch tasks drawn per simulated day
    batch_class: str = "bronze"
    seed: int = 1
    alibaba_path: str = ALIBABA_DEFAULT_PATH
    horizon_extra_seconds: float = 0.0  # run past the last day (0: stop at the end of the last day)
    flavours: tuple[str, ...] = field(default_factory=lambda: tuple(f.name for f in HTAS_FLAVOURS))

    def __post_init__(self) -> None:
        def positive_int(name: str, minimum: int = 1) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
                raise InvalidInputError(f"services-batch: {name} must be an integer >= {minimum}, got {v!r}")

        def number(name: str, lo: float, hi: float = math.inf, lo_open: bool = False) -> None:
            v = getattr(self, name)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or v > hi or v < lo or (lo_open and v == lo):
                bound = f"{'>' if lo_open else '>='} {lo}" + (f" and <= {hi}" if math.isfinite(hi) else "")
                raise InvalidInputError(f"services-batch: {name} must be a finite number {bound}, got {v!r}")

        positive_int("services")
        positive_int("days", 2)  # one day is only the observation: nothing would ever be co-located
        positive_int("batch_per_day", 0)
        positive_int("sample_seconds")
        if DAY_SECONDS % self.sample_seconds:
            raise InvalidInputError(
                f"services-batch: sample_seconds must divide a day (86400 s), got {self.sample_seconds}"
            )
        number("cpu_mean_rate", 0.0, 1.0, lo_open=True)
        number("memory_mean_rate", 0.0, 1.0, lo_open=True)
        number("ramp_seconds", 0.0)
        number("service_spread", 0.0, 0.99)
        for name in ("cpu_noise", "memory_noise", "day_drift"):
            number(name, 0.0, 2.0)
        number("spike_probability", 0.0, 1.0)
        number("spike_factor", 1.0)
        number("horizon_extra_seconds", 0.0)
        start, end = self.day_hours
        if not 0 <= start < end <= 24:
            raise InvalidInputError(f"services-batch: day_hours must be 0 <= start < end <= 24, got {self.day_hours}")
        if not self.day_night_ratios or any(
            not isinstance(r, (int, float)) or not math.isfinite(r) or r < 1 for r in self.day_night_ratios
        ):
            raise InvalidInputError(
                f"services-batch: day_night_ratios must be numbers >= 1, got {self.day_night_ratios}"
            )
        if not self.sizes or any(c <= 0 or m <= 0 for c, m in self.sizes):
            raise InvalidInputError(
                f"services-batch: sizes must be (cpu_milli > 0, memory_bytes > 0), got {self.sizes}"
            )


@dataclass(frozen=True, slots=True)
class ServiceUsage:
    """Per service (request id): its usage as rates of its request, one sample per ``sample_seconds`` from 0.

    ``rate_at`` answers for any time (the sample whose step holds it; the last one past the end)."""

    sample_seconds: int
    cpu: dict[str, Array]
    memory: dict[str, Array]

    def rate_at(self, service: str, t: float) -> tuple[float, float]:
        cpu = self.cpu.get(service)
        if cpu is None:
            raise InvalidInputError(f"no usage trace for service {service!r}")
        i = min(max(0, int(t // self.sample_seconds)), cpu.size - 1)
        return float(cpu[i]), float(self.memory[service][i])


def _diurnal(tod: Array, ratio: float, day_hours: tuple[float, float], ramp: float) -> Array:
    """Night level 1, day level ``ratio`` between ``day_hours``, linear ramps of ``ramp`` seconds centred on the
    day's edges; normalised to a daily mean of 1 (the service's mean is then what scales it)."""
    start, end = day_hours[0] * 3600.0, day_hours[1] * 3600.0
    if ramp > 0:
        up = np.clip((tod - (start - ramp / 2)) / ramp, 0.0, 1.0)
        down = np.clip(((end + ramp / 2) - tod) / ramp, 0.0, 1.0)
        level = np.minimum(up, down)
    else:
        level = ((tod >= start) & (tod < end)).astype(np.float64)
    shape = 1.0 + (ratio - 1.0) * level
    return shape / float(shape.mean())


def _service_usage(p: ServiceUsageParams, ids: list[str], rng: np.random.Generator) -> ServiceUsage:
    steps_per_day = DAY_SECONDS // p.sample_seconds
    tod = np.arange(steps_per_day, dtype=np.float64) * p.sample_seconds
    n = steps_per_day * p.days
    cpu: dict[str, Array] = {}
    mem: dict[str, Array] = {}
    for sid in ids:
        ratio = p.day_night_ratios[int(rng.integers(len(p.day_night_ratios)))]
        shape = np.tile(_diurnal(tod, ratio, p.day_hours, p.ramp_seconds), p.days)
        cpu_mean = p.cpu_mean_rate * rng.uniform(1 - p.service_spread, 1 + p.service_spread)
        mem_mean = p.memory_mean_rate * rng.uniform(1 - p.service_spread / 4, 1 + p.service_spread / 4)
        drift = np.repeat(rng.lognormal(0.0, p.day_drift, p.days), steps_per_day) if p.day_drift else np.ones(n)
        c = cpu_mean * shape * drift * (rng.lognormal(0.0, p.cpu_noise, n) if p.cpu_noise else 1.0)
        c = np.where(rng.random(n) < p.spike_probability, c * p.spike_factor, c)
        m = mem_mean * drift**0.25 * (rng.lognormal(0.0, p.memory_noise, n) if p.memory_noise else 1.0)
        # A service may use more than it requested (no limits) but not without bound.
        cpu[sid] = np.clip(c, 0.0, 2.0)
        mem[sid] = np.clip(m, 0.0, 1.2)
    return ServiceUsage(p.sample_seconds, cpu, mem)


def services_batch(params: ServiceUsageParams | None = None) -> tuple[Workload, ServiceUsage]:
    """The `services-batch` workload: long-running services from t = 0 for the whole run, with their
    SYNTHETIC usage, and Alibaba 2017 batch pods every day. Deterministic for a given ``params``."""
    p = params or ServiceUsageParams()
    path = Path(p.alibaba_path)
    if p.batch_per_day and not path.exists():
        raise InvalidInputError(f"services-batch: the Alibaba 2017 batch trace {path} does not exist")
    rng = random.Random(f"services-batch-{p.seed}")
    horizon = float(p.days * DAY_SECONDS) + p.horizon_extra_seconds
    reqs: list[RequestSpec] = []
    ids = [f"svc-{i}" for i in range(p.services)]
    for i, sid in enumerate(ids):
        cpu, mem = p.sizes[rng.randrange(len(p.sizes))]
        # arrivals 1 s apart (not all in one instant), each running to the end of the run
        reqs.append(RequestSpec(sid, float(i), cpu, mem, horizon - i, p.service_class, WorkloadKind.SERVICE))
    if p.batch_per_day:
        pool = load_alibaba2017(path, max_instances_per_task=1)
        if len(pool) < p.batch_per_day:
            raise InvalidInputError(f"services-batch: batch_per_day {p.batch_per_day} > {len(pool)} tasks in {path}")
        for day in range(p.days):
            for j, t in enumerate(rng.sample(pool, p.batch_per_day)):
                arrival = day * DAY_SECONDS + (t.arrival % DAY_SECONDS)
                if arrival >= horizon:
                    continue
                reqs.append(
                    RequestSpec(
                        f"b{day}-{j}-{t.request_id}",
                        arrival,
                        t.cpu_milli,
                        t.memory_bytes,
                        t.duration,
                        p.batch_class,
                        WorkloadKind.BATCH,
                    )
                )
    reqs.sort(key=lambda r: (r.arrival, r.request_id))
    usage = _service_usage(p, ids, np.random.default_rng(p.seed))
    flavours = tuple(f for f in HTAS_FLAVOURS if f.name in p.flavours)
    if not flavours:
        raise InvalidInputError(f"services-batch: no known flavour among {p.flavours}")
    return (
        Workload(
            name=SERVICES_BATCH,
            requests=tuple(reqs),
            flavours=flavours,
            initial=(("m1.large", NodeGroup.SERVICE), ("m1.large", NodeGroup.BATCH)),
            horizon=horizon,
            origin=(
                f"{p.services} long-running services with SYNTHETIC usage (paper 004 §V-A Fig. 1 means, §V-C Figs. 3-4"
                f" shapes; the rest ASSUMED, extender/sim/usage_trace.py) + {p.batch_per_day} Alibaba 2017 batch"
                f" tasks a day for {p.days} days ({path}); Table 7 flavours of paper 000; seed {p.seed}"
            ),
        ),
        usage,
    )
