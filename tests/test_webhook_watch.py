"""Reflector and binder failure paths that need no cluster: nothing listens on the port, so every request
fails with a real connection error (no fake API server involved)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from extender.kube.binder import KubeBinder
from extender.kube.binding import BindArgs, BindError
from extender.kube.snapshot import Snapshot
from extender.kube.watch import Reflector, node_reflector, pod_reflector
from extender.settings.extender import BindConfig, ExtenderConfig, KubernetesConfig


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def dead_api() -> AsyncIterator[Any]:
    configuration = k8s.Configuration(host=f"http://127.0.0.1:{_closed_port()}")
    api = k8s.ApiClient(configuration=configuration)
    yield api
    await api.close()


async def test_reflector_restarts_with_backoff_and_never_syncs(dead_api: Any) -> None:
    snap = Snapshot(ExtenderConfig())
    restarts: list[tuple[str, str]] = []
    config = KubernetesConfig(backoff_initial_seconds=0.05, backoff_max_seconds=0.2, request_timeout_seconds=1)
    reflector = node_reflector(dead_api, snap, config, on_restart=lambda r, why: restarts.append((r, why)))
    task = asyncio.create_task(reflector.run())
    await asyncio.sleep(1.0)
    assert not task.done(), "the reflector must keep retrying, not die"
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert 3 <= len(restarts) <= 20, restarts  # retried, but with backoff (not a hot loop)
    assert set(restarts) == {("nodes", "error")}
    assert not snap.ready and not reflector.synced.is_set() and reflector.lists == 0


async def test_pod_reflector_uses_the_scheduler_field_selector(dead_api: Any) -> None:
    reflector = pod_reflector(dead_api, Snapshot(ExtenderConfig()), KubernetesConfig())
    assert reflector._kwargs()["field_selector"] == "status.phase!=Succeeded,status.phase!=Failed"
    with pytest.raises(ValueError, match="unknown resource"):
        Reflector("services", reflector._list_fn, Snapshot(ExtenderConfig()), KubernetesConfig())


async def test_binder_gives_up_within_its_budget(dead_api: Any) -> None:
    binder = KubeBinder(
        dead_api, BindConfig(timeout_seconds=0.6, attempt_timeout_seconds=0.2, backoff_initial_seconds=0.02)
    )
    start = time.monotonic()
    with pytest.raises(BindError) as info:
        await binder.bind(BindArgs("default", "p", "uid-1", "node-1"))
    elapsed = time.monotonic() - start
    assert elapsed < 1.5, elapsed  # total budget 0.6 s + one attempt: well under the scheduler's 5 s
    assert info.value.retries >= 2
    assert "could not bind default/p to node-1 within 0.6 s" in str(info.value)
    assert not info.value.in_doubt  # connection refused: no POST ever left, the space may be offered again


async def test_binder_reports_a_timed_out_post_in_doubt() -> None:
    """An API server that takes the request and never answers: the Binding may exist, so the failure is
    in doubt (verbs.bind keeps the pod assumed)."""
    received = asyncio.Event()

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)
        received.set()
        await asyncio.sleep(30)
        writer.close()

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    api = k8s.ApiClient(configuration=k8s.Configuration(host=f"http://127.0.0.1:{port}"))
    try:
        binder = KubeBinder(
            api, BindConfig(timeout_seconds=0.4, attempt_timeout_seconds=0.15, backoff_initial_seconds=0.02)
        )
        with pytest.raises(BindError) as info:
            await binder.bind(BindArgs("default", "p", "uid-1", "node-1"))
        assert received.is_set()
        assert info.value.in_doubt
    finally:
        await api.close()
        server.close()
