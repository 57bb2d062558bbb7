"""Fault injection against real CRIU and two real agent processes: 13 scenarios x 4 runs = 52 migrations.

Connection cut mid-transfer, corrupted archive, destination refusing (prepare / restore) or failing restore,
destination agent SIGKILLed (mid-transfer, before restore, after restore), source agent SIGKILLed (after the
pre-copy checkpoint, after the final dump). Dead agents are restarted by a supervisor, as a DaemonSet would.

Every run checks the invariant: exactly one copy of the counter runs afterwards, its output is exactly
1, 2, 3, ... (nothing lost, nothing done twice) and still growing; the outcome names a reason; no archive
is left on either side once the migration ended.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter as Tally
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from extender.agent.client import AgentClient, PeerError
from tests.test_agent_support import (
    AgentProc,
    Pki,
    assert_runs_once_and_progresses,
    free_port,
    kill_marker,
    make_pki,
    marker_pids,
    require_criu,
    start_counter,
    wait_ready,
)

REPEATS = 4


@dataclass(frozen=True)
class Scenario:
    name: str
    source_faults: dict[str, int]
    dest_faults: dict[str, int]
    outcomes: frozenset[str]  # acceptable final outcomes
    reason: str  # substring the outcome's reason must contain ("" = any non-empty)
    source_dies: bool = False
    dest_dies: bool = False


S = Scenario
SCENARIOS = [
    S("cut-once-retried", {"source.transfer.cut": 1}, {}, frozenset({"succeeded"}), ""),
    S("cut-always", {"source.transfer.cut": -1}, {}, frozenset({"rolled_back"}), "transfer-precopy failed"),
    S("corrupt-once-retried", {"source.transfer.corrupt": 1}, {}, frozenset({"succeeded"}), ""),
    S("corrupt-always", {"source.transfer.corrupt": -1}, {}, frozenset({"rolled_back"}), "sha256 mismatch"),
    S("dest-refuses-prepare", {}, {"destination.refuse.prepare": -1}, frozenset({"rolled_back"}), "refuses"),
    S("dest-refuses-restore", {}, {"destination.refuse.restore": -1}, frozenset({"rolled_back"}), "refuses restore"),
    S("dest-restore-fails-once", {}, {"destination.fail.restore": 1}, frozenset({"succeeded"}), ""),
    S("dest-restore-fails-always", {}, {"destination.fail.restore": -1}, frozenset({"rolled_back"}), "restore failed"),
    S(
        "dest-killed-mid-transfer",
        {},
        {"destination.kill.during-transfer": 1},
        frozenset({"rolled_back", "succeeded"}),
        "",
        dest_dies=True,
    ),
    S(
        "dest-killed-before-restore",
        {},
        {"destination.kill.before-restore": 1},
        frozenset({"rolled_back"}),
        "restore",
        dest_dies=True,
    ),
    S(
        "dest-killed-after-restore",
        {},
        {"destination.kill.after-restore": 1},
        frozenset({"succeeded"}),
        "",
        dest_dies=True,
    ),
    S(
        "source-killed-after-checkpoint",
        {"source.kill.after-checkpoint": 1},
        {},
        frozenset({"rolled_back"}),
        "source agent restarted during phase checkpointed",
        source_dies=True,
    ),
    S(
        "source-killed-after-final-dump",
        {"source.kill.after-final-dump": 1},
        {},
        frozenset({"rolled_back"}),
        "source agent restarted during phase final-dumped",
        source_dies=True,
    ),
    S(
        "source-killed-before-commit",
        {"source.kill.before-commit": 1},
        {},
        frozenset({"succeeded"}),
        "the destination had restored it",
        source_dies=True,
    ),
]
RESULTS: list[tuple[str, str, float, str]] = []


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(
        tmp_path_factory.mktemp("pki"),
        {"agent-a": "127.0.0.1", "agent-b": "127.0.0.2", "agent-c": "127.0.0.1", "agent-d": "127.0.0.2", "ctl": ""},
        {f"agent-{x}": f"qos-agent:node-{x}" for x in "abcd"},
    )


@pytest.fixture(scope="module")
def agents(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AgentProc, AgentProc]]:
    require_criu()
    d = tmp_path_factory.mktemp("agents")
    extra = ["--config", str(d / "agent.yaml")]
    (d / "agent.yaml").write_text("resolve_timeout_seconds: 20\n")
    a = AgentProc("node-a", "127.0.0.1", free_port("127.0.0.1"), d / "a", pki.tls("agent-a"), d / "a.log", extra=extra)
    b = AgentProc("node-b", "127.0.0.2", free_port("127.0.0.2"), d / "b", pki.tls("agent-b"), d / "b.log", extra=extra)
    a.start()
    b.start()
    yield a, b
    a.stop()
    b.stop()


async def _outcome(c: AgentClient, src: AgentProc, mid: str, timeout: float = 40.0) -> dict[str, Any]:
    """The source's recorded outcome (after a restart, once its reconciliation finished)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            rec = await c.request("GET", f"{src.url}/v1/migrations/{mid}?role=source", timeout=5)
            last = rec
            if rec.get("outcome"):
                return rec
        except PeerError as exc:
            last = exc.reason
        await asyncio.sleep(0.05)
    raise AssertionError(f"no outcome for {mid} after {timeout}s: {last}\n{src.log_tail()}")


def _archive_files(agent: AgentProc, mid: str) -> list[Path]:
    return [p for p in (agent.state_dir / "archives").glob(f"*/{mid}/**/*") if p.is_file()]


@pytest.mark.parametrize("run", range(REPEATS))
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
async def test_fault(
    scenario: Scenario, run: int, agents: tuple[AgentProc, AgentProc], pki: Pki, tmp_path: Path
) -> None:
    src, dst = agents
    c = AgentClient(pki.tls("ctl"), timeout_seconds=60)
    counter = start_counter(tmp_path)
    mid = f"{scenario.name}-{run}"
    t0 = time.monotonic()
    restarts = (src.restarts, dst.restarts)
    try:
        await wait_ready(c, src)
        await wait_ready(c, dst)
        await c.request(
            "PUT", f"{src.url}/v1/test/faults", {"faults": scenario.source_faults, "cut_after_bytes": 65536}
        )
        await c.request("PUT", f"{dst.url}/v1/test/faults", {"faults": scenario.dest_faults, "cut_after_bytes": 65536})
        body = {"id": mid, "workload": {"pid": counter.pid}, "destination": {"url": dst.url, "node": dst.name}}
        try:
            answered: dict[str, Any] | None = await c.request("POST", f"{src.url}/v1/migrations", body, timeout=90)
        except PeerError as exc:
            # only a dying source leaves the controller without an answer; the outcome is then read back later
            assert scenario.source_dies, f"no answer from the source: {exc.reason}\n{src.log_tail()}"
            assert exc.kind.value == "transient"
            answered = None
        if scenario.source_dies:
            assert answered is None, "the source should have died before answering"
        rec = await _outcome(c, src, mid)
        if answered is not None:
            assert answered["outcome"] == rec["outcome"]

        assert rec["outcome"] in scenario.outcomes, (rec["outcome"], rec.get("reason"), rec.get("rollback"))
        assert rec["reason"] and scenario.reason in rec["reason"], rec["reason"]
        if scenario.source_dies:
            assert src.restarts == restarts[0] + 1
        if scenario.dest_dies:
            deadline = time.monotonic() + 10
            while dst.restarts == restarts[1] and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert dst.restarts == restarts[1] + 1

        # nothing lost, runs exactly once, keeps going from where it was
        vals = await assert_runs_once_and_progresses(counter, since=counter.values()[-1])
        assert (rec["outcome"] == "succeeded") == (rec.get("restored_workload") is not None)

        # archives are removed after success or rollback, on both sides
        await wait_ready(c, dst)
        assert _archive_files(src, mid) == [], "source archives left behind"
        deadline = time.monotonic() + 5
        while _archive_files(dst, mid) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert _archive_files(dst, mid) == [], "destination archives left behind"
        RESULTS.append((scenario.name, rec["outcome"], time.monotonic() - t0, rec["reason"]))
        del vals
    finally:
        kill_marker(counter.marker)
        deadline = time.monotonic() + 5
        while marker_pids(counter.marker) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await c.close()


def test_fault_summary() -> None:
    """Runs last in this module: every scenario ran REPEATS times (>= 50 runs) and each had an outcome."""
    tally = Tally(name for name, _, _, _ in RESULTS)
    assert len(RESULTS) == len(SCENARIOS) * REPEATS >= 50, tally
    outcomes = Tally(outcome for _, outcome, _, _ in RESULTS)
    print(f"\nfault runs: {len(RESULTS)}, outcomes {dict(outcomes)}, "
          f"total {sum(t for _, _, t, _ in RESULTS):.1f}s")  # fmt: skip
    for scenario in SCENARIOS:
        runs = [r for r in RESULTS if r[0] == scenario.name]
        print(
            f"  {scenario.name:32s} {dict(Tally(r[1] for r in runs))}  max {max(r[2] for r in runs):.2f}s  "
            f"reason: {runs[0][3]}"
        )


@pytest.fixture(scope="module")
def lonely_agents(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AgentProc, AgentProc]]:
    """A pair whose destination is NOT restarted when it dies, and whose source gives up resolving after 2 s."""
    d = tmp_path_factory.mktemp("lonely")
    (d / "agent.yaml").write_text("resolve_timeout_seconds: 2\n")
    extra = ["--config", str(d / "agent.yaml")]
    a = AgentProc("node-c", "127.0.0.1", free_port("127.0.0.1"), d / "a", pki.tls("agent-c"), d / "a.log", extra=extra)
    b = AgentProc("node-d", "127.0.0.2", free_port("127.0.0.2"), d / "b", pki.tls("agent-d"), d / "b.log", extra=extra)
    b.supervise = False
    a.start()
    b.start()
    yield a, b
    a.stop()
    b.stop()


@pytest.mark.parametrize(
    ("fault", "outcome", "reason"),
    [
        ("destination.kill.before-restore", "rolled_back", "restored at the source from the final image"),
        ("destination.kill.after-restore", "in_doubt", "most likely the destination's restored copy"),
    ],
)
async def test_destination_gone_for_good(
    fault: str, outcome: str, reason: str, lonely_agents: tuple[AgentProc, AgentProc], pki: Pki, tmp_path: Path
) -> None:
    """The destination dies after the restore request and never comes back: on one kernel the PID fences a
    second copy, so the source restores locally when the PID is free and reports in_doubt when it is taken."""
    src, dst = lonely_agents
    if dst.proc is not None and dst.proc.poll() is not None:  # the previous case killed it: start a fresh one
        dst._stop = False
        dst.start()
    c = AgentClient(pki.tls("ctl"), timeout_seconds=60)
    counter = start_counter(tmp_path)
    try:
        await wait_ready(c, src)
        await wait_ready(c, dst)
        await c.request("PUT", f"{dst.url}/v1/test/faults", {"faults": {fault: 1}})
        mid = f"gone-{fault.rsplit('.', 1)[-1]}"
        body = {
            "id": mid,
            "workload": {"pid": counter.pid},
            "destination": {"url": dst.url, "node": dst.name},
        }
        rec = await c.request("POST", f"{src.url}/v1/migrations", body, timeout=90)
        assert rec["outcome"] == outcome, rec
        assert reason in rec["reason"], rec["reason"]
        assert rec["rollback"]["resolved"] == "restore-local"
        assert dst.proc is not None and dst.proc.poll() is not None, "the destination stays dead"
        await assert_runs_once_and_progresses(counter, since=counter.values()[-1])
        kept = outcome == "in_doubt"
        assert (rec["archives_kept"] is not None) == kept
        assert bool(_archive_files(src, mid)) == kept, "archives kept only when in doubt"
    finally:
        kill_marker(counter.marker)
        await c.close()
