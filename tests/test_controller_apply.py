"""How the QoS controller applies a pass's releases: in the background, not awaited by the pass.

A real HTTP server (asyncio streams) stands in for the API server's pod PATCH endpoint and holds each PATCH
until the test answers it; the controller, its snapshot and its client are the real ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from prometheus_client import CollectorRegistry

from extender.controller.accounting import ACCOUNT_ANNOTATION, Account, RequestState
from extender.controller.loop import QosController
from extender.controller.metrics import ControllerMetrics
from extender.controller.patches import INSTANCE_ANNOTATION
from extender.controller.state import TrackingSnapshot
from extender.settings.extender import ExtenderConfig

CONFIG = ExtenderConfig()
CONFIG = CONFIG.model_copy(update=dict(controller=CONFIG.controller.model_copy(update=dict(persistence="memory"))))
C = CONFIG.controller.release_concurrency  # release PATCHes in flight at once


def node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {}},
        "spec": {},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}},
    }


def gated_pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "schedulerName": CONFIG.controller.scheduler_name,
            "schedulingGates": [{"name": CONFIG.controller.gate_name}],
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
        },
        "status": {"phase": "Pending"},
    }


async def _respond(writer: asyncio.StreamWriter, code: int, body: bytes) -> None:
    head = f"HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    writer.write(head.encode() + body)
    await writer.drain()


class HeldApi:
    """Takes each PATCH, records its method and path, and answers only when the test says which status (a GET
    is answered at once with an empty list)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.arrived = asyncio.Condition()
        self.answers: dict[str, asyncio.Future[int]] = {}
        self.auto: int | None = None  # answer every PATCH at once with this status

    def answer_all(self, code: int) -> None:
        """Answer every PATCH held and every later one with ``code``."""
        self.auto = code
        for fut in self.answers.values():
            if not fut.done():
                fut.set_result(code)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
                method, path = head.split(" ", 2)[:2]
                length = next(
                    (
                        int(line.split(":", 1)[1])
                        for line in head.split("\r\n")
                        if line.lower().startswith("content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                if method == "GET":  # the controller's namespace list: nothing routed elsewhere
                    body = b'{"kind": "NamespaceList", "items": [], "metadata": {}}'
                    await _respond(writer, 200, body)
                    continue
                name = path.split("?", 1)[0].rsplit("/", 1)[-1]
                answer = self.answers.setdefault(name, asyncio.get_running_loop().create_future())
                if self.auto is not None and not answer.done():
                    answer.set_result(self.auto)
                async with self.arrived:
                    self.requests.append((method, path))
                    self.arrived.notify_all()
                code = await answer
                body = json.dumps(
                    gated_pod(name) if code == 200 else {"kind": "Status", "code": code, "message": f"held {code}"}
                ).encode()
                await _respond(writer, code, body)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def wait_for(self, n: int) -> None:
        async with self.arrived:
            await self.arrived.wait_for(lambda: len(self.requests) >= n)

    def answer(self, name: str, code: int) -> None:
        self.answers.setdefault(name, asyncio.get_running_loop().create_future()).set_result(code)


@pytest.fixture
async def held() -> AsyncIterator[tuple[HeldApi, Any]]:
    api = HeldApi()
    server = await asyncio.start_server(api._serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    configuration = k8s.Configuration(host=f"http://127.0.0.1:{port}")
    configuration.connection_pool_maxsize = 128  # as new_api_client: room for release_concurrency PATCHes
    client = k8s.ApiClient(configuration=configuration)
    yield api, client
    for fut in api.answers.values():
        if not fut.done():
            fut.set_result(503)
    await client.close()
    server.close()


async def _until(check: Callable[[], bool]) -> None:
    while not check():
        await asyncio.sleep(0.01)


def controller(client: Any) -> tuple[QosController, TrackingSnapshot]:
    snap = TrackingSnapshot(CONFIG, ACCOUNT_ANNOTATION)
    snap.replace_nodes([node("n1")], "1", now=0.0)
    snap.replace_pods([gated_pod("a"), gated_pod("b")], "1", now=0.0)
    return QosController(client, snap, CONFIG, ControllerMetrics(CollectorRegistry()), clock=lambda: 100.0), snap


async def test_a_pass_does_not_wait_for_its_release_patches(held: tuple[HeldApi, Any]) -> None:
    """While the API server holds both release PATCHes, the pass has returned, and the next pass neither
    releases the two pods again nor offers their space: they count on the node they were pinned to."""
    api, client = held
    ctl, _ = controller(client)
    first = asyncio.create_task(ctl.reconcile())
    await api.wait_for(2)  # both PATCHes are at the server, unanswered
    for _ in range(5):
        await asyncio.sleep(0)
    assert first.done(), "the pass waited for its PATCHes"
    assert sorted(r.pod for r in first.result().releases) == ["default/a", "default/b"]
    assert {m for m, _ in api.requests} == {"PATCH"}

    second = await ctl.reconcile()
    assert second.releases == ()
    world = ctl.world(100.0)
    assert world.gated == []
    (n1,) = world.nodes
    assert sorted(p.key for p in n1.pods) == ["default/a", "default/b"]
    api.answer("a", 200)
    api.answer("b", 200)
    await ctl.settle()


async def test_a_refused_release_is_decided_again_and_an_applied_one_is_not(held: tuple[HeldApi, Any]) -> None:
    api, client = held
    ctl, _ = controller(client)
    await ctl.reconcile()
    await api.wait_for(2)
    api.answer("a", 200)
    api.answer("b", 422)
    await ctl.settle()
    # the watch has not shown a's PATCH yet (the snapshot still has both gated): a stays in flight, b is free
    again = await ctl.reconcile()
    assert [r.pod for r in again.releases] == ["default/b"]
    api.answers.pop("b")
    await api.wait_for(3)
    api.answer("b", 200)
    await ctl.settle()


async def test_a_stopped_controller_leaves_no_release_running(held: tuple[HeldApi, Any]) -> None:
    """Losing the lease cancels run(): PATCHes still queued or in flight are cancelled with it."""
    api, client = held
    ctl, snap = controller(client)
    n = C + 24  # more than go at a time
    snap.replace_pods([gated_pod(f"p{i}") for i in range(n)], "2", now=0.0)
    snap.replace_nodes([node(f"n{i}") for i in range(n // 4 + 1)], "2", now=0.0)
    runner = asyncio.create_task(ctl.run())
    await api.wait_for(C)
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner
    assert not ctl._applying
    sent = len(api.requests)
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(api.requests) == sent == C, api.requests


async def test_the_next_pass_waits_for_the_backlog_not_for_the_slowest_patch(held: tuple[HeldApi, Any]) -> None:
    """C + 24 releases, C PATCHes at a time: while more than C are still to be applied (and little is applied
    while a pass decides), a pod admitted meanwhile waits (deciding again would only queue it behind them); once
    the backlog is down to the C in flight, the next pass releases it although those C are still unanswered."""
    api, client = held
    ctl, snap = controller(client)
    n = C + 24
    snap.replace_nodes([node(f"n{i}") for i in range(n // 4 + 2)], "2", now=0.0)
    snap.replace_pods([gated_pod(f"p{i:02d}") for i in range(n)], "2", now=0.0)
    runner = asyncio.create_task(ctl.run())
    try:
        await api.wait_for(C)
        assert ctl.passes == 1
        snap.apply_pod("ADDED", gated_pod("late"))  # wakes the controller
        for i in range(24):  # answer the PATCHes one by one: the queued ones follow
            await api.wait_for(C + i)
            first_unanswered = next(n for n, f in api.answers.items() if not f.done())
            api.answer(first_unanswered, 200)
            for _ in range(5):
                await asyncio.sleep(0)
            assert ctl.passes == 1, "a pass ran while the backlog was above the PATCHes in flight"
        # 24 answered -> C in flight: the next pass runs and releases the late pod (a controller that waited for
        # all PATCHes never does: fail after 30 s instead of hanging)
        await asyncio.wait_for(_until(lambda: ctl.passes == 2), 30)
        assert len(api.requests) == n  # the late pod's PATCH waits for one of the C slots
        api.answer(next(n for n, f in api.answers.items() if not f.done()), 200)
        await api.wait_for(n + 1)
        assert api.requests[-1][1].endswith("/late")
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner


async def test_the_event_loop_keeps_serving_while_a_pass_decides(held: tuple[HeldApi, Any]) -> None:
    """decide takes seconds with a thousand gated pods on 500 nodes; on the event loop it froze the verbs (every
    bind in flight timed out behind it). It runs in a thread: other coroutines progress during a pass."""
    api, client = held
    ctl, snap = controller(client)
    snap.replace_nodes([node(f"n{i}") for i in range(20)], "2", now=0.0)
    snap.replace_pods([gated_pod(f"p{i:03d}") for i in range(200)], "2", now=0.0)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    background = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    decision = await ctl.reconcile()
    during = ticks - before
    background.cancel()
    assert len(decision.releases) == 80  # 20 nodes x 4 one-cpu pods
    assert during >= 1, "the pass held the event loop from start to end"
    api.answer_all(200)
    await ctl.settle()
    assert len(api.requests) == 80


async def test_the_next_pass_may_start_with_what_is_applied_while_it_decides(held: tuple[HeldApi, Any]) -> None:
    """100 releases applied in the last 5 s (20/s) and a 4 s decide: the next pass may start with 80 still queued
    (they are applied while it decides); releases from long ago do not count; never fewer than C."""
    _, client = held
    ctl, _ = controller(client)
    ctl._decide_seconds = 4.0
    now = 1000.0
    ctl._applied_at.extend([now - 60.0] * 50 + [now - 4.0 + i * 0.04 for i in range(100)])
    assert ctl._backlog_limit(now) == max(C, 80)
    ctl._decide_seconds = 0.01
    assert ctl._backlog_limit(now) == C


async def test_an_account_whose_owner_is_gone_is_forgotten_not_written_again(held: tuple[HeldApi, Any]) -> None:
    """A bare pod's account with history (preempted once: not derivable from the pod) is written to the pod.
    The pod was deleted (404): the account is dropped, so no later pass dirties it again. Kept, every pass for
    observe's absent grace re-sent it: 55,335 PATCH 404s in one 500-node bench run (issue 17). A bare pod the
    watch no longer has is not PATCHed at all."""
    api, client = held
    cfg = CONFIG.model_copy(update=dict(controller=CONFIG.controller.model_copy(update=dict(persistence="annotation"))))
    snap = TrackingSnapshot(cfg, ACCOUNT_ANNOTATION)
    snap.replace_nodes([node("n1")], "1", now=0.0)
    snap.replace_pods([gated_pod("a")], "1", now=0.0)
    ctl = QosController(client, snap, cfg, ControllerMetrics(CollectorRegistry()), clock=lambda: 100.0)
    history = Account.admit("bronze", 0.0).transition(RequestState.RUNNING, 1.0).preempted()
    ctl.accounts["default/a"] = history
    api.answer("a", 404)
    await ctl._write("default/a")
    assert [m for m, _ in api.requests] == ["PATCH"]
    assert "default/a" not in ctl.accounts
    # gone from the watch: never sent
    ctl.accounts["default/gone"] = history
    await ctl._write("default/gone")
    assert len(api.requests) == 1
    assert "default/gone" in ctl._written  # not due again before persist_interval_seconds


async def test_with_nothing_gated_watch_events_do_not_each_start_a_pass(held: tuple[HeldApi, Any]) -> None:
    """Pods binding and starting (nothing of ours gated) only change accounts: passes then run at most once per
    _ACCOUNTING_SECONDS instead of once per watch event (50 ms debounce), which took half the event loop the
    verbs run on. A gated pod still gets its pass at once."""
    api, client = held
    registry = CollectorRegistry()
    snap = TrackingSnapshot(CONFIG, ACCOUNT_ANNOTATION)
    snap.replace_nodes([node("n1")], "1", now=0.0)
    running = gated_pod("r")
    running["spec"].pop("schedulingGates")
    running["spec"]["nodeName"] = "n1"
    running["status"] = {"phase": "Running"}
    # admitted by our webhook (and released since): a pod without the annotation bypassed admission and gets a PATCH
    running["metadata"]["annotations"] = {INSTANCE_ANNOTATION: CONFIG.controller.instance}
    snap.replace_pods([running], "1", now=0.0)
    ctl = QosController(client, snap, CONFIG, ControllerMetrics(registry), clock=lambda: 100.0)
    runner = asyncio.create_task(ctl.run())

    def passes() -> float:
        return registry.get_sample_value("qos_extender_controller_pass_duration_seconds_count") or 0.0

    try:
        await _until(lambda: passes() >= 1)
        first = passes()
        for i in range(20):  # 20 watch events in ~0.4 s
            running["metadata"]["resourceVersion"] = str(10 + i)
            snap.apply_pod("MODIFIED", running)
            await asyncio.sleep(0.02)
        assert passes() - first <= 2
        api.answer_all(200)
        snap.apply_pod("ADDED", gated_pod("g"))
        await api.wait_for(1)  # released by a pass that did not wait for the accounting period
        assert [m for m, _ in api.requests] == ["PATCH"]
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
