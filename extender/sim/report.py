"""Turn simulator runs into the report schema (JSON), a terminal table and plots.

The JSON keys are a contract (the e2e benchmark of the QoS controller writes the same schema), so they
are built in one place from plain per-request availabilities.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from extender.core import qos
from extender.core.model import ServiceClass
from extender.sim.engine import SimResult, State


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), without pulling numpy into the report path."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def class_stats(availabilities: Sequence[float], cls: ServiceClass) -> dict[str, float | int]:
    """Per-class SLI summary; fulfilment compares with the SLO at 1e-9 so float noise never flips it."""
    return {
        "requests": len(availabilities),
        "availability_mean": sum(availabilities) / len(availabilities),
        "availability_min": min(availabilities),
        "availability_p10": percentile(availabilities, 0.10),
        "availability_median": percentile(availabilities, 0.5),
        "slo_fulfillment": sum(a >= cls.slo - 1e-9 for a in availabilities) / len(availabilities),
        "gini": qos.gini(availabilities),
    }


def summarize_classes(
    per_request: Sequence[tuple[str, float, float]], classes: Mapping[str, ServiceClass]
) -> tuple[dict[str, dict[str, float | int]], float]:
    """(class -> stats, total penalty) from (class name, availability, charge) triples; penalty per
    paper 002 Eqs. 10-11, the charge being what the request paid (cpu-seconds it asked for)."""
    grouped: dict[str, list[float]] = {}
    penalty = 0.0
    for name, a, charge in per_request:
        grouped.setdefault(name, []).append(a)
        penalty += qos.request_penalty(a, classes[name], charge)
    return {name: class_stats(vals, classes[name]) for name, vals in sorted(grouped.items())}, penalty


def run_json(res: SimResult) -> dict[str, Any]:
    classes: Mapping[str, ServiceClass] = res.classes  # type: ignore[assignment]
    pairs = [
        (r.spec.class_name, qos.availability(r.e, r.p), (r.e + r.p) * r.spec.cpu_milli / 1000)
        for r in res.reqs
        if r.state is not State.WAITING
    ]
    stats, penalty = summarize_classes(pairs, classes)
    c = res.counters
    incomplete = sum(r.state is not State.DONE for r in res.reqs)
    return {
        "policy": res.policy,
        "classes": stats,
        "penalty": penalty,
        "cost_usd": res.cost_usd,
        "fluid_lower_bound_usd": res.fluid_usd,
        "cost_over_fluid": res.cost_usd / res.fluid_usd if res.fluid_usd > 0 else None,
        "node_seconds": res.node_seconds,
        "preemptions": c.preemptions,
        "evictions": c.evictions,
        "migrations": c.migrations,
        "lost_work_seconds": c.lost_work,
        "mean_utilization": {"cpu": res.util_cpu, "memory": res.util_mem},
        "wall_seconds": res.wall_seconds,
        "simulated_seconds": res.end,
        "events": c.events,
        "events_per_second": c.events / res.wall_seconds if res.wall_seconds > 0 else None,
        "requests_completed": len(res.reqs) - incomplete,
        "requests_incomplete": incomplete,
        "nodes_added": c.nodes_added,
        "nodes_removed": c.nodes_removed,
        "completed_work_seconds": sum(r.spec.duration for r in res.reqs if r.state is State.DONE),
    }


def report_json(workload: str, results: Sequence[SimResult]) -> dict[str, Any]:
    return {"workload": workload, "runs": [run_json(r) for r in results]}


def format_table(report: Mapping[str, Any]) -> str:
    lines = [f"workload: {report['workload']}"]
    head = (
        f"{'policy':<11} {'class':<7} {'n':>4} {'mean':>7} {'min':>7} {'p10':>7} {'median':>7} "
        f"{'SLO ok':>7} {'gini':>6}"
    )
    lines.append(head)
    for run in report["runs"]:
        for name, s in run["classes"].items():
            lines.append(
                f"{run['policy']:<11} {name:<7} {s['requests']:>4} {s['availability_mean']:>7.4f} "
                f"{s['availability_min']:>7.4f} {s['availability_p10']:>7.4f} {s['availability_median']:>7.4f} "
                f"{s['slo_fulfillment']:>7.3f} {s['gini']:>6.4f}"
            )
    lines.append(
        f"{'policy':<11} {'cost $':>9} {'fluid $':>9} {'ratio':>6} {'preempt':>8} {'evict':>6} {'migr':>5} "
        f"{'lost s':>8} {'util c/m':>11} {'done':>6} {'wall s':>7}"
    )
    for run in report["runs"]:
        ratio = run["cost_over_fluid"]
        lines.append(
            f"{run['policy']:<11} {run['cost_usd']:>9.4f} {run['fluid_lower_bound_usd']:>9.4f} "
            f"{(ratio if ratio is not None else math.nan):>6.2f} {run['preemptions']:>8} {run['evictions']:>6} "
            f"{run['migrations']:>5} {run['lost_work_seconds']:>8.0f} "
            f"{run['mean_utilization']['cpu']:>5.2f}/{run['mean_utilization']['memory']:<5.2f} "
            f"{run['requests_completed']:>6} {run['wall_seconds']:>7.2f}"
        )
    return "\n".join(lines)


def write_plots(report: Mapping[str, Any], results: Sequence[SimResult], out_dir: str | Path) -> list[Path]:
    """Availability per class side by side, nodes by flavour over time, and cost rate over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []

    fig, ax = plt.subplots(figsize=(8, 4))
    class_names = sorted({c for run in report["runs"] for c in run["classes"]})
    width = 0.8 / max(1, len(results))
    for i, res in enumerate(results):
        data = [
            [qos.availability(r.e, r.p) for r in res.reqs if r.spec.class_name == c and r.state is not State.WAITING]
            for c in class_names
        ]
        pos = [k + i * width for k in range(len(class_names))]
        ax.boxplot(data, positions=pos, widths=width * 0.9, tick_labels=[""] * len(pos))
        ax.plot([], [], label=res.policy)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(class_names))], class_names)
    ax.set_ylabel("availability")
    ax.set_title(f"{report['workload']}: availability per class ({', '.join(r.policy for r in results)})")
    fig.tight_layout()
    paths.append(out / "availability.png")
    fig.savefig(paths[-1])
    plt.close(fig)

    fig, axes = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for res in results:
        if not res.timeline:
            continue
        ts = [t / 60 for t, _, _ in res.timeline]
        axes[0].step(ts, [sum(c.values()) for _, c, _ in res.timeline], where="post", label=res.policy)
        axes[1].step(ts, [rate for _, _, rate in res.timeline], where="post", label=res.policy)
    axes[0].set_ylabel("nodes")
    axes[1].set_ylabel("cost rate ($/h)")
    axes[1].set_xlabel("minutes")
    axes[0].legend()
    fig.tight_layout()
    paths.append(out / "nodes_cost.png")
    fig.savefig(paths[-1])
    plt.close(fig)

    for res in results:
        flavours = sorted({f for _, c, _ in res.timeline for f in c})
        if not flavours:
            continue
        fig, ax = plt.subplots(figsize=(8, 3))
        ts = [t / 60 for t, _, _ in res.timeline]
        ax.stackplot(ts, [[c.get(f, 0) for _, c, _ in res.timeline] for f in flavours], labels=flavours, step="post")
        ax.set_title(f"{res.policy}: nodes by flavour")
        ax.set_xlabel("minutes")
        ax.legend(loc="upper left", fontsize="small")
        fig.tight_layout()
        paths.append(out / f"flavours_{res.policy}.png")
        fig.savefig(paths[-1])
        plt.close(fig)
    return paths
