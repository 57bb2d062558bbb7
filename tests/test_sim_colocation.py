"""The simulator's co-location (issue 16, deliverable 4): the layer is the slack controller's refresh on the
simulator's state, with the core's functions and no copy of them.

The workloads here are built in the test (services with SYNTHETIC usage from ``services_batch`` with no Alibaba
batch, plus batch pods of known size and time), so they need no data file and every expectation can be
reasoned about."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from extender.cli import main
from extender.colocation.controller import plan
from extender.core import characterise, slack
from extender.core.model import InvalidInputError, NodeGroup, Resources, WorkloadKind
from extender.sim import colocation
from extender.sim.colocation import Colocation, colocation_settings, simulate_colocation
from extender.sim.engine import Req, Simulator, State
from extender.sim.report import colocation_report
from extender.sim.usage_trace import ServiceUsage, ServiceUsageParams, services_batch
from extender.sim.workloads import GIB, MIB, RequestSpec, Workload

DAY = 86_400.0
SMALL = ServiceUsageParams(services=12, days=2, batch_per_day=0, seed=3)


def _with_batch(w: Workload, n_per_day: int, days: int, start_hour: float = 0.0, seconds: float = 1800.0) -> Workload:
    """``n_per_day`` batch pods (250m / 128 MiB, ``seconds`` long) spread evenly over each day from start_hour."""
    batch = []
    for day in range(days):
        for j in range(n_per_day):
            t = day * DAY + start_hour * 3600 + j * (DAY - start_hour * 3600) / n_per_day
            batch.append(RequestSpec(f"b{day}-{j}", t, 250, 128 * MIB, seconds, "bronze", WorkloadKind.BATCH))
    return dataclasses.replace(w, requests=tuple(sorted((*w.requests, *batch), key=lambda r: r.arrival)))


class CheckingColocation(Colocation):
    """After every refresh, recompute what was published from the record with the core and the live
    controller's own functions; any disagreement fails the run."""

    checked = 0
    lent = 0

    def refresh(self, sim: Simulator) -> None:
        super().refresh(sim)
        rec = self.last_refresh
        if rec is None or rec.at != sim.now or self.model is None:
            return
        cfg = self.settings.characterise
        # the profiles: core.characterise.daily_profile on the layer's history, as rates of the requests
        requests = {p.key: p.requests for n in rec.nodes for p in n.pods if p.kind is WorkloadKind.SERVICE}
        for key, prof in rec.profiles.items():
            times, cpu = self.history_cpu[key]
            sel = [i for i, t in enumerate(times) if t >= rec.at - self.settings.classify_seconds]
            want = characterise.daily_profile(
                [times[i] for i in sel], [cpu[i] / requests[key].cpu_milli for i in sel], cfg.interval_seconds
            )
            np.testing.assert_array_equal(prof.cpu, want)
        # the classes and Eq. 3 per service, then what the live controller would publish
        assert rec.classes == characterise.classify_services(self.model, rec.profiles, cfg.observation_seconds)
        # (Eq. 3 corrected by each service's own level, slack.own_level: the same function with the same inputs)
        own = self.settings.own_level.core() if self.predictor == "class" else None
        for key, cls in rec.classes.items():
            assert rec.idle[key] == slack.service_idle(
                self.model, cls, requests[key], rec.at, cfg.prediction_seconds, rec.profiles.get(key), own
            )
        assert rec.planned == plan(
            self.model, list(rec.nodes), rec.classes, rec.at, cfg.prediction_seconds, rec.profiles, own
        )
        # the safety check: a node without a miss publishes its plan; a missed one no more than its real slack
        for name, amount in rec.published.items():
            lent = {p.key: rec.idle[p.key] for n in rec.nodes if n.name == name for p in n.pods if p.key in rec.idle}
            real = slack.real_slack(lent, rec.measured)
            assert amount in (rec.planned[name], slack.lendable_after_miss(rec.planned[name], real))
        self.checked += 1
        self.lent += sum(a.cpu_milli for a in rec.published.values())


def _run(w: Workload, usage: ServiceUsage, cls: type[Colocation] = Colocation, predictor: str = "class") -> Colocation:
    sim = Simulator(w, "product")
    assert w.horizon is not None
    layer = cls(usage, w.horizon, colocation_settings(), sim.prod.classes, predictor)
    layer.attach(sim)
    result = sim.run()
    layer.result = result  # type: ignore[attr-defined]
    return layer


@pytest.mark.parametrize("predictor", ["class", "class-eq3"])
def test_the_layer_publishes_what_the_core_computes(predictor: str) -> None:
    """``class`` (product-colocate: Eq. 3 corrected by each service's own level) and ``class-eq3``
    (product-colocate-eq3: the paper's Eq. 3 alone)."""
    w, usage = services_batch(SMALL)
    layer = _run(_with_batch(w, 200, 2), usage, CheckingColocation, predictor)
    assert isinstance(layer, CheckingColocation)
    # day 1 is the observation: the model comes once a service has a whole day, then 4 refreshes an hour
    assert layer.stats.fits == 1
    assert layer.checked >= 90, layer.checked
    assert layer.lent > 0  # something was lent, so the comparisons above were not all of zeros
    assert layer.stats.placed_on_slack > 0


def test_a_colocated_pod_requests_the_batch_resources_the_verbs_read() -> None:
    spec = RequestSpec("b", 0.0, 250, 128 * MIB, 60.0, "bronze", WorkloadKind.BATCH)
    res = colocation._batch_resources(Req(spec))
    assert (res.cpu_milli, res.memory_bytes) == (0, 0)  # the webhook's rewrite: no cpu/memory request
    assert slack.slack_demand(res) == Resources(250, 128 * MIB, 1)
    assert NodeGroup.SERVICE in slack.node_groups_for(WorkloadKind.BATCH, res)


def test_nothing_is_lent_during_the_observation_day() -> None:
    w, usage = services_batch(SMALL)
    batch = [RequestSpec(f"b-{j}", j * 720.0, 250, 128 * MIB, 1800.0, "bronze", WorkloadKind.BATCH) for j in range(100)]
    w = dataclasses.replace(w, requests=tuple(sorted((*w.requests, *batch), key=lambda r: r.arrival)))
    run = simulate_colocation(w, usage, "product-colocate")
    done = [r for r in run.result.reqs if r.spec.kind is WorkloadKind.BATCH]
    assert len(done) == 100 and all(r.done_at is not None and r.done_at < DAY for r in done)
    # every batch pod ran during the observation day: none of them went onto the slack, though a model came
    assert run.stats.placed_on_slack == 0
    assert run.stats.fits == 1


def _grown(usage: ServiceUsage, from_seconds: float) -> ServiceUsage:
    """The same services, but from ``from_seconds`` on they use all they requested (the day-1 class said less)."""
    step = usage.sample_seconds
    cpu, mem = {}, {}
    for sid in usage.cpu:
        c, m = usage.cpu[sid].copy(), usage.memory[sid].copy()
        c[int(from_seconds // step) :] = 1.0
        m[int(from_seconds // step) :] = 1.0
        cpu[sid], mem[sid] = c, m
    return ServiceUsage(step, cpu, mem)


def test_a_wrong_prediction_evicts_the_batch_pods_and_the_report_counts_them() -> None:
    w, usage = services_batch(SMALL)
    # long batch pods from day 2, 06:00 (after the observation day), while the services grow at 12:00
    w = _with_batch(w, 0, 0)
    batch = [
        RequestSpec(f"long-{j}", DAY + 6 * 3600 + j, 250, 128 * MIB, 8 * 3600.0, "bronze", WorkloadKind.BATCH)
        for j in range(10)
    ]
    w = dataclasses.replace(w, requests=(*w.requests, *batch))
    grown = _grown(usage, DAY + 12 * 3600)
    run = simulate_colocation(w, grown, "product-colocate")
    s = run.stats
    assert s.placed_on_slack >= 10  # they all went onto the slack in the morning
    assert s.prediction_misses > 0
    assert s.evictions >= 10  # and all left it at noon, when the services used everything they requested
    assert s.lost_work_seconds > 0
    # evicted pods ran again (on batch nodes, or on slack once the published capacity allowed) and finished
    done = {r.spec.request_id for r in run.result.reqs if r.state is State.DONE}
    assert {b.request_id for b in batch} <= done
    report = colocation_report("t", "", [(run.result, s.to_json())], {})
    counted = report["runs"][0]["slack"]
    assert counted["evictions_wrong_prediction"] == s.evictions
    assert counted["pods_evicted_wrong_prediction"] == 10
    # same usage without the growth: the same pods stay on the slack
    calm = simulate_colocation(w, usage, "product-colocate")
    assert calm.stats.evictions < s.evictions


def test_colocation_raises_utilisation_on_the_generated_trace() -> None:
    params = dataclasses.replace(SMALL, services=16, seed=5)
    w, usage = services_batch(params)
    w = _with_batch(w, 600, 2)
    with_slack = simulate_colocation(w, usage, "product-colocate").stats.to_json()
    without = simulate_colocation(w, usage, "product").stats.to_json()
    a, b = with_slack["usage_utilization_after_observation"], without["usage_utilization_after_observation"]
    assert with_slack["slack"]["placements_on_slack"] > 0
    assert a["cpu"] > b["cpu"]
    assert a["memory"] > b["memory"]
    assert without["slack"]["placements_on_slack"] == 0  # the meter alone places nothing


def test_the_naive_predictor_goes_through_the_same_safety_check() -> None:
    w, usage = services_batch(SMALL)
    w = _with_batch(w, 0, 0)
    batch = [
        RequestSpec(f"long-{j}", DAY + 6 * 3600 + j, 250, 128 * MIB, 8 * 3600.0, "bronze", WorkloadKind.BATCH)
        for j in range(10)
    ]
    w = dataclasses.replace(w, requests=(*w.requests, *batch))
    run = simulate_colocation(w, _grown(usage, DAY + 12 * 3600), "product-colocate-last")
    assert run.stats.placed_on_slack >= 10
    assert run.stats.evictions >= 10


def test_generated_usage_follows_the_cited_means_and_is_deterministic() -> None:
    p = ServiceUsageParams(services=200, days=2, batch_per_day=0, seed=9)
    _, u1 = services_batch(p)
    _, u2 = services_batch(p)
    cpu = np.concatenate(list(u1.cpu.values()))
    mem = np.concatenate(list(u1.memory.values()))
    assert abs(cpu.mean() - p.cpu_mean_rate) < 0.015  # paper 004 §V-A: 9.5 %
    assert abs(mem.mean() - p.memory_mean_rate) < 0.03  # paper 004 §V-A: 80.6 %
    steps = 86_400 // p.sample_seconds
    day = np.stack([u1.cpu[s][:steps] for s in u1.cpu]).mean(axis=0)
    t = np.arange(steps) * p.sample_seconds / 3600
    assert day[(t >= 10) & (t < 20)].mean() > day[(t < 8) | (t >= 22)].mean()  # Fig. 3: higher 9:00-21:00
    for s in u1.cpu:
        np.testing.assert_array_equal(u1.cpu[s], u2.cpu[s])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"days": 1}, "days must be an integer >= 2"),
        ({"services": 0}, "services must be an integer >= 1"),
        ({"sample_seconds": 7}, "must divide a day"),
        ({"cpu_mean_rate": 0.0}, "cpu_mean_rate must be a finite number > 0"),
        ({"memory_mean_rate": 1.5}, "memory_mean_rate"),
        ({"day_hours": (21.0, 9.0)}, "day_hours"),
        ({"day_night_ratios": (0.5,)}, "day_night_ratios"),
        ({"sizes": ((0, GIB),)}, "sizes"),
        ({"batch_per_day": -1}, "batch_per_day"),
        ({"spike_factor": 0.5}, "spike_factor"),
        ({"cpu_noise": float("nan")}, "cpu_noise"),
    ],
)
def test_bad_workload_parameters_are_refused_with_the_name(change: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        ServiceUsageParams(**change)  # type: ignore[arg-type]


def test_missing_alibaba_file_unknown_policy_and_misplaced_flags_are_clear_errors(tmp_path: object) -> None:
    with pytest.raises(InvalidInputError, match="does not exist"):
        services_batch(ServiceUsageParams(batch_per_day=10, alibaba_path="/nonexistent/batch_task.csv"))
    w, usage = services_batch(SMALL)
    with pytest.raises(InvalidInputError, match="unknown policy"):
        simulate_colocation(w, usage, "colocate-everything")
    short = ServiceUsage(usage.sample_seconds, {}, {})
    with pytest.raises(InvalidInputError, match="no usage trace for services"):
        simulate_colocation(w, short, "product-colocate")
    settings = colocation_settings().model_copy(update={"refresh_seconds": 450.0})
    with pytest.raises(InvalidInputError, match="multiple of the usage sample step"):
        simulate_colocation(w, usage, "product-colocate", settings=settings)
    assert main(["simulate", "--workload", "htas-stable", "--days", "3"]) == 2
    assert main(["simulate", "--workload", "services-batch", "--days", "1"]) == 2
    assert main(["simulate", "--workload", "services-batch", "--policy", "nope"]) == 2


def test_cli_reads_the_batch_trace_from_the_environment(monkeypatch: pytest.MonkeyPatch, capsys: object) -> None:
    monkeypatch.setenv("QOS_ALIBABA_TRACE", "/nonexistent/batch_task.csv")
    assert main(["simulate", "--workload", "services-batch", "--batch-per-day", "5"]) == 2
    assert "/nonexistent/batch_task.csv does not exist" in capsys.readouterr().err  # type: ignore[attr-defined]
