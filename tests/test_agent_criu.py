"""Real CRIU on this machine: the criu backend alone, then a counter migrated between two agent processes.

The agents listen on 127.0.0.1 and 127.0.0.2 with mTLS and share this kernel, so the cutover protocol's
one-host case is exercised for real: the restored process takes the original's PID, which the final dump
has freed (and the agent, a child subreaper, reaped at once).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extender.agent.backends.base import BackendError, WorkloadRef
from extender.agent.backends.criu import ChildReaper, CriuBackend
from extender.agent.client import AgentClient, PeerError
from extender.agent.settings import CriuConfig
from tests.test_agent_support import (
    AgentProc,
    Pki,
    assert_runs_once_and_progresses,
    check_consecutive,
    free_port,
    kill_marker,
    make_pki,
    marker_pids,
    require_criu,
    start_counter,
    wait_ready,
)

TIMINGS: list[dict[str, Any]] = []


@pytest.fixture(scope="module")
def criu() -> str:
    return require_criu()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(
        tmp_path_factory.mktemp("pki"),
        {"agent-a": "127.0.0.1", "agent-b": "127.0.0.2", "ctl": "", "prom": ""},
        {"agent-a": "qos-agent:node-a", "agent-b": "qos-agent:node-b"},
    )


@pytest.fixture(scope="module")
def agents(criu: str, pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AgentProc, AgentProc]]:
    d = tmp_path_factory.mktemp("agents")
    a = AgentProc("node-a", "127.0.0.1", free_port("127.0.0.1"), d / "a", pki.tls("agent-a"), d / "a.log")
    b = AgentProc("node-b", "127.0.0.2", free_port("127.0.0.2"), d / "b", pki.tls("agent-b"), d / "b.log")
    a.start()
    b.start()

    async def ready() -> None:
        c = AgentClient(pki.tls("ctl"))
        try:
            await wait_ready(c, a)
            await wait_ready(c, b)
        finally:
            await c.close()

    asyncio.run(ready())
    yield a, b
    a.stop()
    b.stop()


def test_criu_check_looks_good(criu: str) -> None:
    out = subprocess.run([criu, "check"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "Looks good." in out.stdout + out.stderr


async def test_backend_dump_leave_running_then_final_dump_and_restore_same_pid(criu: str, tmp_path: Path) -> None:
    counter = start_counter(tmp_path)
    reaper = ChildReaper()
    backend = CriuBackend(criu, CriuConfig(), reaper)
    try:
        ref = WorkloadRef(pid=counter.pid)
        pre = await backend.checkpoint(ref, tmp_path / "pre", leave_running=True)
        assert backend.image_complete(pre.image_dir)
        assert pre.meta["pid"] == counter.pid and not pre.meta["shell_job"]
        at_pre = counter.values()[-1]
        await asyncio.sleep(0.1)
        assert counter.values()[-1] > at_pre, "leave-running: the source keeps running"
        assert await backend.is_running(ref, pre.meta)

        final = await backend.checkpoint(ref, tmp_path / "final", leave_running=False, parent_dir=pre.image_dir)
        assert not await backend.is_running(ref, final.meta), "the final dump stops the source"
        stopped_at = counter.values()[-1]
        await asyncio.sleep(0.1)
        assert counter.values()[-1] == stopped_at
        assert marker_pids(counter.marker) == []

        restored = await backend.restore(final.image_dir, final.meta, None)
        assert restored.pid == counter.pid, "CRIU restores the original PID"
        assert not await backend.is_running(ref, final.meta), "a restored copy is not the original (start time)"
        assert await backend.is_running(restored, {"identity": final.meta["identity"]})
        await assert_runs_once_and_progresses(counter, since=stopped_at)

        with pytest.raises(BackendError, match="still held"):  # the PID is taken: a second copy is refused
            await backend.restore(final.image_dir, final.meta | {"pid": counter.pid}, None)
        assert len(marker_pids(counter.marker)) == 1
    finally:
        kill_marker(counter.marker)
        await reaper.close()


async def test_checkpoint_of_a_missing_process_is_reported(criu: str, tmp_path: Path) -> None:
    backend = CriuBackend(criu, CriuConfig())
    with pytest.raises(BackendError, match="not running"):
        await backend.checkpoint(WorkloadRef(pid=4_000_000), tmp_path / "x", leave_running=True)


async def _migrate(c: AgentClient, src: AgentProc, dst: AgentProc, pid: int, mid: str) -> dict[str, Any]:
    body = {"id": mid, "workload": {"pid": pid}, "destination": {"url": dst.url, "node": dst.name}}
    return await c.request("POST", f"{src.url}/v1/migrations", body, timeout=120)


def _archive_files(agent: AgentProc, mid: str) -> list[Path]:
    return [p for p in (agent.state_dir / "archives").glob(f"*/{mid}/**/*") if p.is_file()]


async def test_counter_migrates_back_and_forth_without_losing_or_repeating_work(
    agents: tuple[AgentProc, AgentProc], pki: Pki, tmp_path: Path
) -> None:
    a, b = agents
    c = AgentClient(pki.tls("ctl"))
    counter = start_counter(tmp_path)
    try:
        hops = [(a, b), (b, a), (a, b), (b, a), (a, b)]
        for i, (src, dst) in enumerate(hops):
            before = counter.values()[-1]
            t0 = time.monotonic()
            rec = await _migrate(c, src, dst, counter.pid, f"pingpong-{i}")
            wall = time.monotonic() - t0
            assert rec["outcome"] == "succeeded", rec
            assert rec["restored_workload"] == {"pid": counter.pid}
            assert rec["destination_node"] == dst.name and rec["same_kernel"] is True
            assert rec["bytes"] > 0 and set(rec["archives"]) == {"precopy", "final"}
            TIMINGS.append(rec["timings"] | {"wall": round(wall, 4), "bytes": rec["bytes"]})
            await assert_runs_once_and_progresses(counter, since=before)
            # archives are removed on both sides after success
            assert _archive_files(src, rec["id"]) == [] and _archive_files(dst, rec["id"]) == []
            dest_rec = await c.request("GET", f"{dst.url}/v1/migrations/{rec['id']}?role=destination")
            assert dest_rec["state"] == "committed"
        check_consecutive(counter.values())

        metrics_a = await _metrics(pki, a)
        assert 'qos_extender_migrations_total{outcome="succeeded"} 3.0' in metrics_a
        assert "qos_extender_checkpoint_seconds_bucket" in metrics_a
        assert "qos_extender_transfer_seconds_count" in metrics_a
        assert "qos_extender_migration_bytes_total" in metrics_a
        assert "qos_extender_work_preserved_seconds_total" in metrics_a
        metrics_b = await _metrics(pki, b)
        assert 'qos_extender_restore_seconds_count{where="destination"} 3.0' in metrics_b
    finally:
        kill_marker(counter.marker)
        await c.close()
    _print_timings()


async def _metrics(pki: Pki, agent: AgentProc) -> str:
    """/metrics as Prometheus reads it: with the scraper's certificate (the controller's is refused there)."""
    import aiohttp

    ssl_ctx = AgentClient(pki.tls("prom")).ssl_context
    assert ssl_ctx is not None
    async with aiohttp.ClientSession() as s, s.get(f"{agent.url}/metrics", ssl=ssl_ctx) as r:
        assert r.status == 200, await r.text()
        return await r.text()


def _print_timings() -> None:
    keys = ["checkpoint_precopy", "transfer_precopy", "checkpoint_final", "transfer_final", "restore_at_destination",
            "total", "wall"]  # fmt: skip
    print("\nmeasured per migration (s), real CRIU, counter process:")
    for k in keys:
        vals = sorted(float(t[k]) for t in TIMINGS if t.get(k) is not None)
        if vals:
            print(f"  {k:24s} min {vals[0]:.4f}  median {vals[len(vals) // 2]:.4f}  max {vals[-1]:.4f}")
    if TIMINGS:
        print(f"  bytes per migration      {TIMINGS[0]['bytes']}")


async def test_bad_requests_are_refused_with_a_reason(agents: tuple[AgentProc, AgentProc], pki: Pki) -> None:
    a, b = agents
    c = AgentClient(pki.tls("ctl"))
    try:
        with pytest.raises(PeerError, match=r"404.*not running"):
            await _migrate(c, a, b, 4_000_000, "missing-pid")
        for body in (
            {"workload": {"pid": 1234}},
            {"workload": {"pod": "x"}, "destination": {"url": b.url}},
            {"workload": {"pid": "1"}, "destination": {"url": b.url}},
            {"id": "../../etc", "workload": {"pid": 1234}, "destination": {"url": b.url}},
        ):
            with pytest.raises(PeerError, match="400") as err:
                await c.request("POST", f"{a.url}/v1/migrations", body)
            assert err.value.kind.value == "refused"
        with pytest.raises(PeerError, match="404"):
            await c.request("GET", f"{a.url}/v1/migrations/never-heard-of-it")
    finally:
        await c.close()
