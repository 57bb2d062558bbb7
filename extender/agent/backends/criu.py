"""The ``criu`` backend: real CRIU (CLI) on a process tree of this node.

- checkpoint: ``criu dump -t PID`` (``--leave-running`` for the pre-copy image), ``--shell-job`` when the
  process is not a session leader. With dirty-page tracking (``criu check --feature mem_dirty_track``) the
  pre-copy is a ``pre-dump --track-mem`` and the final dump is incremental (``--prev-images-dir``); without it
  (this kernel: no CONFIG_MEM_SOFT_DIRTY) both are full one-shot dumps.
- restore: ``criu restore -d --pidfile``. A restored process keeps its PID, so the PID must be free: the
  backend waits (``pid_free_timeout_seconds``) for the source's zombie to be reaped, then refuses. On one
  kernel this makes a second copy impossible (``fenced_by_pid``).
- the agent is a child subreaper: a restored tree is re-parented to it when criu detaches, and it reaps it
  the moment it dies (init here took ~1.6 s to reap, holding the PID that long).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extender.agent.backends.base import BackendError, CheckpointResult, WorkloadNotFoundError, WorkloadRef
from extender.agent.settings import CriuConfig

__all__ = ["ChildReaper", "CriuBackend", "ProcStat", "criu_check", "read_proc_stat"]

log = logging.getLogger("extender.agent.criu")

_PR_SET_CHILD_SUBREAPER = 36
_DUMP_OK = "Dumping finished successfully"
_PRE_DUMP_OK = "Pre-dumping finished successfully"


@dataclass(frozen=True, slots=True)
class ProcStat:
    pid: int
    comm: str
    state: str
    ppid: int
    session: int
    start_ticks: int


def read_proc_stat(pid: int) -> ProcStat | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None
    lpar, rpar = raw.find("("), raw.rfind(")")
    comm = raw[lpar + 1 : rpar]
    rest = raw[rpar + 2 :].split()
    # fields after comm: state(3) ppid(4) pgrp(5) session(6) ... starttime(22)
    return ProcStat(pid, comm, rest[0], int(rest[1]), int(rest[3]), int(rest[19]))


def _alive(st: ProcStat | None) -> bool:
    return st is not None and st.state not in ("Z", "X")


def _pids() -> list[int]:
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit()]


def _is_criu_on(pid: int, needle: bytes) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    args = cmd.split(b"\0")
    return bool(args) and os.path.basename(args[0]) == b"criu" and any(needle in a for a in args)


def process_age_seconds(st: ProcStat) -> float:
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - st.start_ticks / os.sysconf("SC_CLK_TCK"))


class ChildReaper:
    """Makes the agent a child subreaper and reaps zombies it adopts (never criu's, asyncio waits for those)."""

    def __init__(self) -> None:
        self.enabled = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
            self.enabled = True
        except OSError as exc:  # pragma: no cover - Linux always has it
            log.warning("cannot become a child subreaper; restored processes are reaped by init", exc_info=exc)
            return
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGCHLD, self.sweep)  # reap at once; the loop below is the fallback
        self._task = loop.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            self.sweep()
            await asyncio.sleep(0.5)

    def sweep(self) -> int:
        """Reap zombie children of this process that are not criu (asyncio's child watcher owns those)."""
        me = os.getpid()
        reaped = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            st = read_proc_stat(int(entry.name))
            if st is None or st.ppid != me or st.state != "Z" or st.comm == "criu":
                continue
            with contextlib.suppress(ChildProcessError):
                os.waitpid(st.pid, os.WNOHANG)
                reaped += 1
        return reaped

    async def close(self) -> None:
        if self.enabled:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGCHLD)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def _run(argv: list[str], timeout: float) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return -1, f"timed out after {timeout:.0f}s"
    return int(proc.returncode or 0), out.decode(errors="replace")


async def criu_check(criu: str) -> tuple[bool, str]:
    """``criu check``: (ok, last line of its output) — "Looks good." when this kernel can dump and restore."""
    rc, out = await _run([criu, "check"], 60)
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    return rc == 0, (lines[-1] if lines else f"exit {rc}")


def _log_errors(log_file: Path, out: str) -> str:
    try:
        lines = log_file.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    errors = [ln for ln in lines + out.splitlines() if "Error" in ln and "RLIMIT_NOFILE" not in ln]
    return "; ".join(e.strip() for e in errors[-3:]) or (out.strip()[-300:] if out.strip() else "no log")


class CriuBackend:
    name = "criu"
    fenced_by_pid = True

    def __init__(self, criu: str, config: CriuConfig, reaper: ChildReaper | None = None) -> None:
        self.criu = criu
        self.config = config
        self.reaper = reaper
        self._features: dict[str, Any] | None = None

    async def features(self) -> dict[str, Any]:
        if self._features is None:
            rc, version = await _run([self.criu, "--version"], 30)
            ok, check = await criu_check(self.criu)
            rc_dirty, _ = await _run([self.criu, "check", "--feature", "mem_dirty_track"], 30)
            self._features = {
                "criu": self.criu,
                "version": version.strip().splitlines()[0] if rc == 0 and version.strip() else "unknown",
                "check_ok": ok,
                "check": check,
                "dirty_tracking": rc_dirty == 0,
            }
        return self._features

    def precopy_is_incremental(self) -> bool:
        return bool(self._features and self._features["dirty_tracking"])

    def validate(self, ref: WorkloadRef) -> None:
        if ref.pid is None:
            raise ValueError("the criu backend migrates processes: workload.pid is required")

    def _stat(self, ref: WorkloadRef) -> ProcStat:
        assert ref.pid is not None
        st = read_proc_stat(ref.pid)
        if not _alive(st):
            raise WorkloadNotFoundError(f"process {ref.pid} is not running")
        assert st is not None
        return st

    async def checkpoint(
        self, ref: WorkloadRef, image_dir: Path, *, leave_running: bool, parent_dir: Path | None = None
    ) -> CheckpointResult:
        self.validate(ref)
        st = self._stat(ref)
        image_dir.mkdir(parents=True, exist_ok=True)
        shell_job = st.session != st.pid
        incremental = self.precopy_is_incremental()
        pre_dump = leave_running and incremental
        argv = [self.criu, "pre-dump" if pre_dump else "dump", "-t", str(st.pid), "-D", str(image_dir)]
        argv += ["-o", "dump.log", "-v3"]
        if leave_running and not pre_dump:
            argv.append("--leave-running")
        if shell_job:
            argv.append("--shell-job")
        if incremental:
            argv.append("--track-mem")
            if parent_dir is not None and not leave_running:
                argv += ["--prev-images-dir", os.path.relpath(parent_dir, image_dir)]
        argv += list(self.config.extra_dump_args)
        rc, out = await _run(argv, self.config.command_timeout_seconds)
        if rc != 0:
            raise BackendError(
                f"criu {argv[1]} of pid {st.pid} failed (exit {rc}): {_log_errors(image_dir / 'dump.log', out)}"
            )
        meta = {
            "pid": st.pid,
            "identity": st.comm,
            # the original's start time: on one kernel a restored copy has the same PID and comm, not this
            "start_ticks": st.start_ticks,
            "shell_job": shell_job,
            "pre_dump": pre_dump,
            "parent": parent_dir.name if (incremental and parent_dir is not None and not leave_running) else None,
        }
        return CheckpointResult(image_dir, meta, process_age_seconds(st))

    def image_complete(self, image_dir: Path) -> bool:
        try:
            text = (image_dir / "dump.log").read_text(errors="replace")
        except OSError:
            return False
        return _DUMP_OK in text or _PRE_DUMP_OK in text

    async def prepare(self, meta: dict[str, Any]) -> None:
        f = await self.features()
        if not f["check_ok"]:
            raise BackendError(f"criu check fails on this node: {f['check']}")
        if meta.get("pre_dump") and not f["dirty_tracking"]:
            raise BackendError("the source pre-dumped with dirty-page tracking, which this node lacks")

    async def wait_pid_free(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            st = read_proc_stat(pid)
            if st is None:
                return True
            if st.state == "Z" and self.reaper is not None:
                self.reaper.sweep()
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)

    async def restore(self, image_dir: Path, meta: dict[str, Any], target: WorkloadRef | None) -> WorkloadRef:
        pid = meta.get("pid")
        if not isinstance(pid, int):
            raise BackendError("restore metadata has no pid")
        if meta.get("parent"):
            link = image_dir / "parent"
            if not link.exists():
                link.symlink_to(Path("..") / str(meta["parent"]))
        if not await self.wait_pid_free(pid, self.config.pid_free_timeout_seconds):
            st = read_proc_stat(pid)
            held = f"{st.comm!r} (state {st.state})" if st else "another process"
            raise BackendError(f"pid {pid} is still held by {held}: a restored process keeps its PID")
        pidfile = image_dir / "restore.pid"
        pidfile.unlink(missing_ok=True)
        argv = [self.criu, "restore", "-D", str(image_dir), "-d", "-o", "restore.log", "-v3"]
        argv += ["--pidfile", str(pidfile)]
        if meta.get("shell_job"):
            argv.append("--shell-job")
        argv += list(self.config.extra_restore_args)
        rc, out = await _run(argv, self.config.command_timeout_seconds)
        if rc != 0:
            raise BackendError(
                f"criu restore of pid {pid} failed (exit {rc}): {_log_errors(image_dir / 'restore.log', out)}"
            )
        try:
            restored = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            restored = pid
        if not await self.is_running(WorkloadRef(pid=restored), {"identity": meta.get("identity")}):
            raise BackendError(f"criu restore reported success but pid {restored} is not running")
        return WorkloadRef(pid=restored)

    async def is_running(self, ref: WorkloadRef, meta: dict[str, Any]) -> bool:
        """Alive with the checkpointed comm; with ``start_ticks`` in ``meta``: the very original process."""
        if ref.pid is None:
            return False
        st = read_proc_stat(ref.pid)
        if not _alive(st) or st is None:
            return False
        identity, start = meta.get("identity"), meta.get("start_ticks")
        return (identity is None or st.comm == identity) and (start is None or st.start_ticks == start)

    async def stop(self, ref: WorkloadRef, meta: dict[str, Any]) -> None:
        # The final dump (without leave-running) already killed the tree; this is a safety net that matches the
        # original by start time, never a restored copy that reuses its PID on the same kernel.
        if ref.pid is not None and await self.is_running(ref, meta):
            log.warning("source process still running after commit: killing it", extra={"decision": str(ref)})
            with contextlib.suppress(ProcessLookupError):
                os.kill(ref.pid, signal.SIGKILL)
            await self.wait_pid_free(ref.pid, self.config.pid_free_timeout_seconds)

    async def quiesce(self, state_dir: Path, timeout: float) -> None:
        needle = str(state_dir.resolve()).encode()
        deadline = time.monotonic() + timeout
        while True:
            busy = [pid for pid in _pids() if _is_criu_on(pid, needle)]
            if not busy:
                return
            if time.monotonic() >= deadline:
                log.warning("criu still running on our state dir after the timeout", extra={"decision": busy})
                return
            log.info("waiting for a criu left running by a previous agent", extra={"decision": busy})
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        return None
