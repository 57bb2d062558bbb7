"""The garbage collector's share of a long-running shell: its pauses measured, the start-up heap frozen.

Why this exists (issue 34). CPython's cyclic collector runs a full (generation 2) collection whenever the
objects that survived younger collections exceed a quarter of the long-lived heap, and a full collection walks
every tracked object. The extender's heap is mostly things that never die: the ~160,000 objects the imports
alone leave (kubernetes_asyncio's generated models, pydantic, aiohttp, numpy) plus the first list of nodes and
pods. Under a 2,000-pod burst every watch event, verb body and PATCH leaves survivors, so full collections came
every 2-3 s and took 0.18-0.36 s each: ~15 % of the extender's CPU in the qos phase and a stall of the event
loop (kube-scheduler's serial filter call waits for it) each time (bench/e2e_throughput.py, a gc.callbacks
probe, 2026-11-27).

``gc.freeze()`` moves every object alive at that moment into a permanent generation that collections never
walk. Called once the snapshot has been listed, it takes the start-up heap out of every later collection;
what the process allocates afterwards is collected exactly as before. What freezing costs: cyclic garbage among
the frozen objects is never reclaimed. Objects freed by reference counting (nearly all of them: the snapshot
replaces plain dicts and slotted dataclasses) are freed as usual.

Freezing alone left six full collections per burst (~80 ms each: the pods listed since are not frozen), driven
by the young generation's threshold of 700 allocations; ``set_young_threshold`` raises it
(``server.gc_young_threshold``), so the older generations are reached that many times less often.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

from prometheus_client import CollectorRegistry, Histogram

__all__ = ["GcPauses", "freeze_start_up_heap", "set_young_threshold"]

log = logging.getLogger("extender.heap")

# from a young collection (~0.1 ms) to a full one over a large heap (~0.5 s)
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class GcPauses:
    """``qos_extender_gc_pause_seconds{generation}``: how long each collection held the interpreter. The
    process stops for that long, verbs included, so a slow filter with a quiet CPU points here."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.pauses = Histogram(
            "qos_extender_gc_pause_seconds",
            "Time one cyclic garbage collection held the interpreter, by the oldest generation it collected.",
            ["generation"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self._by_generation = [self.pauses.labels(str(g)) for g in range(3)]
        self._started = 0.0
        self._installed = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = info.get("generation", 2)
        if 0 <= generation < len(self._by_generation) and self._started:
            self._by_generation[generation].observe(time.perf_counter() - self._started)

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            gc.callbacks.remove(self._callback)
            self._installed = False


def freeze_start_up_heap() -> int:
    """Collect once, then freeze everything alive; returns how many objects are frozen in all. Call it when the
    long-lived state is built (imports done, first lists applied), not before: what is allocated later is
    collected as usual, so freezing early only leaves the start-up heap in every collection."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info(
        "start-up heap frozen",
        extra={"decision": {"frozen_objects": frozen, "seconds": round(time.perf_counter() - started, 3)}},
    )
    return frozen


def set_young_threshold(threshold: int) -> None:
    """Generation 0's threshold (``server.gc_young_threshold``); the older generations keep their ratios."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(threshold, middle, old)
