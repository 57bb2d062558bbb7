"""Simulator speed on the Alibaba 2017 trace: events/s, wall time, peak memory (a figure, not a test).

Each figure is also given as a ratio against a baseline measured in the same run on the same machine: the
bare event loop (heap push + pop of the same number of events, no decisions), so a noisy shared machine
moves both sides alike.

    python bench/sim_speed.py [--trace PATH] [--tasks N] [--policy htas --policy k8s]
"""

from __future__ import annotations

import argparse
import heapq
import os
import resource
import time
import tracemalloc

from extender.sim.engine import simulate
from extender.sim.workloads import alibaba2017


def bare_loop_seconds(n_events: int) -> float:
    heap: list[tuple[float, int]] = []
    t0 = time.perf_counter()
    for i in range(n_events):
        heapq.heappush(heap, (float((i * 7919) % 100_003), i))
    while heap:
        heapq.heappop(heap)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=os.environ.get("QOS_ALIBABA_TRACE", "../shared/data/alibaba2017/batch_task.csv"))
    ap.add_argument("--tasks", type=int, default=5000, help="first N completed tasks (0 = all)")
    ap.add_argument("--policy", action="append")
    args = ap.parse_args()
    t0 = time.perf_counter()
    workload = alibaba2017(args.trace, limit_tasks=args.tasks or None)
    load = time.perf_counter() - t0
    print(f"alibaba2017: {len(workload.requests)} requests from {args.tasks or 'all'} tasks, loaded in {load:.2f} s")
    for policy in args.policy or ["htas", "k8s"]:
        tracemalloc.start()
        res = simulate(workload, policy)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        events = res.counters.events
        base = bare_loop_seconds(events)
        eps = events / res.wall_seconds
        print(
            f"{policy:5s} events={events} wall={res.wall_seconds:.2f}s events/s={eps:,.0f} "
            f"per-event cost = {res.wall_seconds / base:,.0f} x bare heap loop ({base * 1e3:.1f} ms) "
            f"peak traced memory={peak / 2**20:.1f} MiB cost=${res.cost_usd:.2f} "
            f"cost/fluid={res.cost_usd / res.fluid_usd:.2f}"
        )
    print(f"max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
