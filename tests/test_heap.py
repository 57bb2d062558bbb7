"""extender.heap: the collector's pauses are measured per generation, and the start-up heap is frozen once the
snapshot is listed (issue 34: full collections over the imports' and first lists' objects were ~15 % of the
extender's CPU in a 2,000-pod burst)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from extender.heap import GcPauses, freeze_start_up_heap, set_young_threshold
from extender.processes.webhook import _freeze_when_listed


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the test process keeps collecting everything, as before


def _count(registry: CollectorRegistry, generation: str) -> float:
    value = registry.get_sample_value("qos_extender_gc_pause_seconds_count", {"generation": generation})
    return value or 0.0


def test_each_collection_is_observed_under_its_generation_until_uninstalled() -> None:
    registry = CollectorRegistry()
    pauses = GcPauses(registry)
    pauses.install()
    try:
        gc.collect(2)
        gc.collect(0)
        assert _count(registry, "2") >= 1 and _count(registry, "0") >= 1
        total = registry.get_sample_value("qos_extender_gc_pause_seconds_sum", {"generation": "2"})
        assert total is not None and total > 0
    finally:
        pauses.uninstall()
    assert pauses._callback not in gc.callbacks
    before = _count(registry, "2")
    gc.collect(2)
    assert _count(registry, "2") == before  # nothing observed once uninstalled (a stopped extender in tests)


def test_freezing_takes_the_live_objects_out_of_later_collections(unfrozen: None) -> None:
    kept = [{"n": i} for i in range(1000)]  # long-lived state, as the snapshot's first lists
    assert gc.get_freeze_count() == 0
    frozen = freeze_start_up_heap()
    assert frozen == gc.get_freeze_count() and frozen >= len(kept)
    assert not any(o is kept for o in gc.get_objects())  # no generation holds it: full collections skip it
    assert kept[999]["n"] == 999


async def test_the_extender_freezes_only_once_nodes_and_pods_are_listed(unfrozen: None) -> None:
    class Listing:
        ready = False

    snapshot = Listing()
    task = asyncio.create_task(_freeze_when_listed(snapshot))  # type: ignore[arg-type]
    await asyncio.sleep(0.3)
    assert not task.done() and gc.get_freeze_count() == 0  # the long-lived state is not built yet
    snapshot.ready = True
    await asyncio.wait_for(task, 5)
    assert gc.get_freeze_count() > 0


def test_the_young_threshold_is_set_and_the_older_ratios_kept() -> None:
    before = gc.get_threshold()
    try:
        set_young_threshold(12_345)
        assert gc.get_threshold() == (12_345, before[1], before[2])
    finally:
        gc.set_threshold(*before)
